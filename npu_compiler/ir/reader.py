"""IR JSON (pytorch-ir / torch_ir) -> validated `Graph` with every ATen default filled in.

Nothing else reads the IR before this module has checked it: the JSON itself (size, nesting, integer literals),
every field's type and range (names, shapes within the size limits, dtypes, producer references), every attribute
against its op's ATen schema (`attrs.py`), and every node's declared outputs against what its op produces
(`infer/`). Every error names where the problem is: the node, its op, the operand or attribute and what was
expected.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from ..atomic import note_input
from ..dtypes import FLOAT_DTYPES, INT_DTYPES, ITEMSIZE, normalize_dtype
from ..errors import ConstraintError, IRFormatError, entry_point
from ..limits import MAX_JSON_DEPTH, MAX_NAME_CHARS, Limits, format_bytes
from ..text import shown, unsafe_char
from .attrs import check_attrs
from .graph import Graph, Node, TensorType, Value
from .infer import check_node
from .schema import OpSchema, lookup, scalar_operands, short_op

_TOP_KEYS = {"model_name", "pytorch_version", "graph_inputs", "graph_outputs", "weights", "weight_name_mapping",
             "nodes", "constants"}
_TENSOR_KEYS = {"name", "shape", "dtype"}
_REF_KEYS = _TENSOR_KEYS | {"producer_node", "producer_output_idx"}
_NODE_KEYS = {"name", "op_type", "inputs", "outputs", "attrs"}
_CONSTANT_KEYS = {"data", "dtype", "shape"}
MAX_DIGITS = 20  # an int64 has at most 19 digits; longer integer literals are refused before Python parses them
MAX_OUTPUTS = 4096  # outputs of one node (a split into many chunks)


# ---- JSON ---------------------------------------------------------------------------------------------------------


def load_ir_dict(source: str | os.PathLike | Mapping[str, Any], limits: Limits | None = None) -> dict[str, Any]:
    """Read IR JSON from a path, a JSON string or an already parsed dict: within the size limit, nested at most
    MAX_JSON_DEPTH deep, with JSON values only. Nothing about its meaning is checked here (see `read_ir`)."""
    lim = limits or Limits()
    if isinstance(source, Mapping):
        data: Any = source
        where = "<dict>"
    else:
        where, text = _read_text(source, lim)
        data = _parse(text, where)
    if isinstance(source, Mapping):
        _check_json(data, where)
    else:  # json.loads made only JSON types with string keys: the nesting and the integers are what is left
        _check_parsed(data, where)
    if not isinstance(data, Mapping):
        raise IRFormatError(f"{where}: the IR must be a JSON object, got {type(data).__name__}")
    return dict(data)


def _read_text(source: str | os.PathLike, lim: Limits) -> tuple[str, str]:
    if isinstance(source, os.PathLike) or (isinstance(source, str) and not source.lstrip().startswith("{")):
        where = os.fspath(source)
        try:
            size = os.path.getsize(where)
            if size > lim.max_ir_bytes:
                raise ConstraintError(f"{where}: an IR file of {format_bytes(size)} is above the limit of "
                                      f"{format_bytes(lim.max_ir_bytes)} ($NPUSIM_MAX_IR_BYTES)")
            with open(where, "rb") as f:
                note_input(where)
                raw = f.read(lim.max_ir_bytes + 1)
        except FileNotFoundError as e:
            raise IRFormatError(f"IR file not found: {where}") from e
        except IsADirectoryError as e:
            raise IRFormatError(f"{where} is a folder, not an IR JSON file") from e
        except (OSError, ValueError) as e:
            raise IRFormatError(f"cannot read IR file {where}: {getattr(e, 'strerror', None) or e}") from e
        if len(raw) > lim.max_ir_bytes:
            raise ConstraintError(f"{where}: the IR is above the limit of {format_bytes(lim.max_ir_bytes)}")
        try:
            return where, raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise IRFormatError(f"{where}: not UTF-8 text (byte {e.start}); is this an IR JSON file?") from e
    text = str(source)
    if len(text) > lim.max_ir_bytes:
        raise ConstraintError(f"an IR string of {len(text)} characters is above the limit of "
                              f"{format_bytes(lim.max_ir_bytes)}")
    return "<string>", text


_INT_LIMIT = 10**MAX_DIGITS


def _digits_bounded() -> bool:
    """Whether Python refuses to convert long integer strings (3.11's default: 4,300 digits), so that json.loads
    cannot be made to spend quadratic time on one literal."""
    limit = sys.get_int_max_str_digits()
    return 0 < limit <= 10_000


def _parse(text: str, where: str) -> Any:
    def parse_int(s: str) -> int:
        if len(s.lstrip("-")) > MAX_DIGITS:
            raise IRFormatError(f"{where}: integer literal {s[:12]}... of {len(s)} digits (at most {MAX_DIGITS})")
        return int(s)

    try:
        # A hook per integer costs a Python call for each of a model's tens of thousands: where Python bounds the
        # digits it converts, parse without it (`_check_parsed` refuses literals longer than an int64 afterwards)
        # and use it only to name a literal Python refused.
        if _digits_bounded():
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                raise
            except ValueError:
                pass
        return json.loads(text, parse_int=parse_int)
    except json.JSONDecodeError as e:
        raise IRFormatError(f"{where}: malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise IRFormatError(f"{where}: the JSON nests deeper than any IR (at most {MAX_JSON_DEPTH} levels)") from None
    except ValueError as e:  # a number Python refuses to convert
        raise IRFormatError(f"{where}: malformed JSON: {e}") from None


_JSON_SCALARS = frozenset({str, int, float, bool, type(None)})


def _check_json(data: Any, where: str) -> None:
    """Iteratively (no recursion on hostile nesting): JSON types only, string keys, at most MAX_JSON_DEPTH deep.
    (Exact types are tested first: a model's IR holds a few hundred thousand values.)"""
    scalars = _JSON_SCALARS
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, Mapping):
            if depth >= MAX_JSON_DEPTH:
                raise IRFormatError(f"{where}: the JSON nests deeper than {MAX_JSON_DEPTH} levels")
            for k, x in v.items():
                if type(k) is not str and not isinstance(k, str):
                    raise IRFormatError(f"{where}: object key {_short(k)} is not a string")
                if type(x) in scalars:
                    continue
                if isinstance(x, Mapping | list | tuple):
                    stack.append((x, depth + 1))
                elif not _is_scalar(x):
                    raise IRFormatError(f"{where}: value of '{_short_text(k)}' is a {type(x).__name__}, not JSON")
        elif isinstance(v, list | tuple):
            if depth >= MAX_JSON_DEPTH:
                raise IRFormatError(f"{where}: the JSON nests deeper than {MAX_JSON_DEPTH} levels")
            for x in v:
                if type(x) in scalars:
                    continue
                if isinstance(x, Mapping | list | tuple):
                    stack.append((x, depth + 1))
                elif not _is_scalar(x):
                    raise IRFormatError(f"{where}: a list holds a {type(x).__name__}, not JSON")


def _check_parsed(data: Any, where: str) -> None:
    """Of what json.loads made, iteratively: at most MAX_JSON_DEPTH levels of objects and arrays, and no integer
    longer than MAX_DIGITS digits."""
    if type(data) is int and not -_INT_LIMIT < data < _INT_LIMIT:
        _refuse_long_int(data, where)
    stack: list[tuple[Any, int]] = [(data, 0)] if type(data) is dict or type(data) is list else []
    while stack:
        v, depth = stack.pop()
        if depth >= MAX_JSON_DEPTH:
            raise IRFormatError(f"{where}: the JSON nests deeper than {MAX_JSON_DEPTH} levels")
        for x in v.values() if type(v) is dict else v:
            t = type(x)
            if t is dict or t is list:
                stack.append((x, depth + 1))
            elif t is int and not -_INT_LIMIT < x < _INT_LIMIT:
                _refuse_long_int(x, where)


def _refuse_long_int(x: int, where: str) -> None:
    s = str(x)
    raise IRFormatError(f"{where}: integer literal {s[:12]}... of {len(s)} digits (at most {MAX_DIGITS})")


def _is_scalar(x: Any) -> bool:
    return x is None or isinstance(x, str | bool | int | float)


# ---- fields ---------------------------------------------------------------------------------------------------------


def _name(v: Any, where: str, what: str = "name") -> str:
    if not isinstance(v, str) or not v:
        raise IRFormatError(f"{where}: '{what}' must be a non-empty string, got {_short(v)}")
    if len(v) > MAX_NAME_CHARS:
        raise IRFormatError(f"{where}: '{what}' has {len(v)} characters (at most {MAX_NAME_CHARS})")
    bad = unsafe_char(v)
    if bad is not None:
        raise IRFormatError(f"{where}: '{what}' '{shown(v)}' holds the control character {bad} (names are printed: a "
                            "newline, a terminal escape or a direction override in one would forge or hide output)")
    return v


def _keys(d: Any, allowed: set[str], required: tuple[str, ...], where: str, what: str) -> Mapping[str, Any]:
    if not isinstance(d, Mapping):
        raise IRFormatError(f"{where}: {what} must be an object, got {_short(d)}")
    unknown = set(d) - allowed
    if unknown:
        raise IRFormatError(f"{where}: unknown key(s) {sorted(_short_text(k) for k in unknown)} in {what} "
                            f"(known: {', '.join(sorted(allowed))})")
    for k in required:
        if k not in d:
            raise IRFormatError(f"{where}: {what} is missing '{k}'")
    return d


def _shape(v: Any, where: str, dtype: str, lim: Limits) -> tuple[int, ...]:
    if not isinstance(v, list | tuple) or not all(isinstance(d, int) and not isinstance(d, bool) for d in v):
        raise IRFormatError(f"{where}: shape must be a list of static integers, got {_short(v)} "
                            "(the compiler needs static shapes)")
    if any(d < 0 for d in v):
        raise IRFormatError(f"{where}: negative dimension in shape {list(v)}")
    problem = lim.tensor_problem(v, ITEMSIZE[dtype])
    if problem:
        raise ConstraintError(f"{where}: {problem}")
    return tuple(v)


def _tensor_type(t: Mapping[str, Any], where: str, lim: Limits) -> TensorType:
    dtype = normalize_dtype(t["dtype"], where)
    return TensorType(_shape(t["shape"], where, dtype, lim), dtype)


def _int_field(v: Any, where: str, what: str, hi: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= hi:
        raise IRFormatError(f"{where}: '{what}' must be an integer in [0, {hi}], got {_short(v)}")
    return v


# ---- the graph ------------------------------------------------------------------------------------------------------


class _GraphReader:
    def __init__(self, data: dict[str, Any], lim: Limits) -> None:
        self.data = data
        self.lim = lim
        self.values: dict[str, Value] = {}  # every value name: graph inputs, node outputs, weights, constants
        self.by_producer: dict[tuple[str, int], Value] = {}
        self.node_names: set[str] = set()

    def top(self) -> None:
        d = self.data
        missing = [k for k in ("graph_inputs", "graph_outputs", "nodes") if k not in d]
        if missing:
            raise IRFormatError(f"IR is missing required key(s) {missing}; is this a pytorch-ir JSON file?")
        unknown = set(d) - _TOP_KEYS
        if unknown:
            raise IRFormatError(f"IR has unknown top-level key(s) {sorted(_short_text(k) for k in unknown)}")
        for key in ("graph_inputs", "graph_outputs", "nodes"):
            if not isinstance(d[key], list):
                raise IRFormatError(f"IR key '{key}' must be a list, got {_short(d[key])}")
        if not d["graph_outputs"]:
            raise IRFormatError("IR key 'graph_outputs' is empty: a model without outputs computes nothing (is the "
                                "export complete?)")
        # An optional key is absent or of its type: a null is refused like any other wrong type, never read as the
        # default (a node's "attrs": null is not its op's defaults).
        for key, types, what in (("model_name", str, "a string"), ("pytorch_version", str, "a string"),
                                 ("weight_name_mapping", Mapping, "an object"), ("weights", list, "a list"),
                                 ("constants", Mapping, "an object")):
            if key in d and not isinstance(d[key], types):
                raise IRFormatError(f"IR key '{key}' must be {what}, got {_short(d[key])}")
        for key in ("model_name", "pytorch_version"):
            if d.get(key):
                _name(d[key], "IR", key)
        mapping = d.get("weight_name_mapping", {})
        if not all(isinstance(v, str) for v in mapping.values()):
            raise IRFormatError(f"IR key 'weight_name_mapping' must map placeholder names to state-dict keys, got "
                                f"{_short(mapping)}")
        self.mapping: dict[str, str] = {_name(k, "weight_name_mapping", "placeholder"): _name(v, f"weight_name_"
                                        f"mapping['{_short_text(k)}']", "key") for k, v in mapping.items()}
        weights = d.get("weights", [])
        self.weight_meta: dict[str, TensorType] = {}
        for i, w in enumerate(weights):
            where = f"weights[{i}]"
            _keys(w, _TENSOR_KEYS, ("name", "shape", "dtype"), where, "a weight")
            name = _name(w["name"], where)
            if name in self.weight_meta:
                raise IRFormatError(f"weight '{name}' is declared twice")
            self.weight_meta[name] = _tensor_type(w, f"weight '{name}'", self.lim)
        constants = d.get("constants", {})
        for k, c in constants.items():
            where = f"constant '{_short_text(k)}'"
            _keys(c, _CONSTANT_KEYS, ("data", "dtype"), where, "a constant")
            _name(k, "constants", "constant name")
            dtype = normalize_dtype(c["dtype"], where)
            if "shape" in c:
                _shape(c["shape"], where, dtype, self.lim)
            if not isinstance(c["data"], list) and not _is_scalar(c["data"]) or c["data"] is None:
                raise IRFormatError(f"{where}: 'data' must be a number or a nested list, got {_short(c['data'])}")
        self.const_meta: Mapping[str, Any] = constants

    def inputs(self) -> list[Value]:
        out = []
        for i, t in enumerate(self.data["graph_inputs"]):
            where = f"graph input #{i}"
            _keys(t, _TENSOR_KEYS, ("name", "shape", "dtype"), where, "a graph input")
            name = _name(t["name"], where)
            v = Value(name, _tensor_type(t, f"graph input '{name}'", self.lim), "input")
            self._define(v, f"graph input '{name}'")
            self.by_producer[(name, 0)] = v
            out.append(v)
        return out

    def _define(self, v: Value, where: str) -> None:
        if v.name in self.values:
            raise IRFormatError(f"{where}: the name '{v.name}' is given to two values")
        self.values[v.name] = v

    def node(self, ni: int, nd: Any) -> Node:
        _keys(nd, _NODE_KEYS, ("name", "op_type", "inputs", "outputs"), f"node #{ni}", "a node")
        name = _name(nd["name"], f"node #{ni}")
        op_type = nd["op_type"]
        if not isinstance(op_type, str) or not op_type or len(op_type) > 256 or unsafe_char(op_type):
            raise IRFormatError(f"node '{name}': 'op_type' must be a short string without control characters, got "
                                f"{_short(op_type)}")
        if name in self.node_names:
            raise IRFormatError(f"node '{name}' ({op_type}): duplicate node name")
        self.node_names.add(name)
        op = short_op(op_type)
        where = f"node '{name}' ({op_type})"
        if not isinstance(nd["inputs"], list) or not isinstance(nd["outputs"], list):
            raise IRFormatError(f"{where}: 'inputs' and 'outputs' must be lists")
        if len(nd["outputs"]) > MAX_OUTPUTS:
            raise IRFormatError(f"{where}: {len(nd['outputs'])} outputs (at most {MAX_OUTPUTS})")
        attrs = nd.get("attrs", {})
        if not isinstance(attrs, Mapping):
            raise IRFormatError(f"{where}: 'attrs' must be an object (omit it for the op's defaults), got "
                                f"{_short(attrs)}")

        ins = [self._input(t, f"{where} input #{ii}") for ii, t in enumerate(nd["inputs"])]
        schema = lookup(op) if op != "getitem" else None
        if schema is not None:
            attrs = check_attrs(schema, dict(attrs), len(ins), where)
            _bind_check(schema, ins, attrs, where)
        else:
            attrs = dict(attrs)
        node = Node(name, op, ins, [], attrs)
        for oi, t in enumerate(nd["outputs"]):
            ow = f"{where} output #{oi}"
            _keys(t, _REF_KEYS, ("name", "shape", "dtype"), ow, "an output")
            oname = _name(t["name"], ow)
            _self_reference(t, name, oi, ow)
            v = Value(oname, _tensor_type(t, f"{ow} '{oname}'", self.lim), "node", producer=node, index=oi)
            self._define(v, ow)
            node.outputs.append(v)
            self.by_producer[(name, oi)] = v

        if op == "getitem":
            self._getitem(node, where)
        elif schema is not None:
            if schema.num_outputs and len(node.outputs) != schema.num_outputs:
                raise IRFormatError(f"{where}: expected {schema.num_outputs} output(s), got {len(node.outputs)}")
            check_node(node, where)
        return node

    def _getitem(self, node: Node, where: str) -> None:
        idx = node.attrs.get("index")
        ins = node.inputs
        if set(node.attrs) - {"index"}:
            raise IRFormatError(f"{where}: getitem takes only the attribute 'index'")
        if not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < len(ins):
            raise IRFormatError(f"{where}: getitem index {_short(idx)} out of range for {len(ins)} producer outputs")
        node.inputs = [ins[idx]]
        if len(node.outputs) != 1 or node.outputs[0].type != ins[idx].type:
            raise IRFormatError(f"{where}: getitem output must be one tensor of type {ins[idx].type}")

    def _input(self, t: Any, where: str) -> Value:
        _keys(t, _REF_KEYS, ("name", "shape", "dtype"), where, "an input")
        name = _name(t["name"], where)
        ttype = _tensor_type(t, f"{where} '{name}'", self.lim)
        producer = t.get("producer_node")
        if "producer_node" in t:
            _name(producer, where, "producer_node")
            idx = _int_field(t.get("producer_output_idx", 0), where, "producer_output_idx", MAX_OUTPUTS)
            src = self.by_producer.get((producer, idx))
            if src is None:
                raise IRFormatError(f"{where} '{name}': producer '{producer}' output {idx} does not exist before this "
                                    "node (dangling producer or nodes not in topological order)")
            if src.name != name:
                raise IRFormatError(f"{where}: names '{name}', but producer '{producer}' output {idx} is "
                                    f"'{src.name}'")
            if src.type != ttype:
                raise IRFormatError(f"{where} '{name}': declared {ttype} but its producer '{producer}' gives "
                                    f"{src.type}")
            return src
        if "producer_output_idx" in t:
            raise IRFormatError(f"{where} '{name}': 'producer_output_idx' without a 'producer_node'")
        return self._weight_or_constant(name, ttype, where)

    def _weight_or_constant(self, pname: str, ttype: TensorType, where: str) -> Value:
        key = self.mapping.get(pname, pname)
        is_const = key in self.const_meta or pname in self.const_meta
        cname = (key if key in self.const_meta else pname) if is_const else pname
        known = self.values.get(cname)
        if known is not None:
            if known.kind not in ("weight", "constant"):
                raise IRFormatError(f"{where} '{pname}': names a {'graph input' if known.kind == 'input' else 'node'}"
                                    " output but has no 'producer_node'")
            if known.type != ttype:
                raise IRFormatError(f"{where}: {known.kind} '{pname}' used as {ttype} here but as {known.type} "
                                    "elsewhere")
            return known
        if is_const:
            data = _constant_data(self.const_meta[cname], ttype, f"constant '{cname}' (used by {where})")
            v = Value(cname, ttype, "constant", data=data)
        elif pname in self.mapping or pname in self.weight_meta:
            declared = self.weight_meta.get(key)
            if declared is None and self.weight_meta:
                raise IRFormatError(f"{where} '{pname}': weight_name_mapping names state-dict key '{key}', which the "
                                    "IR's 'weights' do not declare")
            if declared is not None and declared != ttype:
                raise IRFormatError(f"{where}: weight '{key}' is declared {declared} but used as {ttype}")
            v = Value(pname, ttype, "weight")
        else:
            raise IRFormatError(f"{where} '{pname}': neither a producer, a weight placeholder "
                                "(weight_name_mapping) nor a constant")
        self._define(v, where)
        return v

    def outputs(self) -> list[Value]:
        out = []
        for i, t in enumerate(self.data["graph_outputs"]):
            where = f"graph output #{i}"
            _keys(t, _REF_KEYS, ("name", "shape", "dtype"), where, "a graph output")
            name = _name(t["name"], where)
            v = self.values.get(name)
            if v is None or v.kind not in ("node", "input"):
                raise IRFormatError(f"graph output '{name}': not produced by any node")
            _self_reference(t, v.producer.name if v.producer is not None else v.name, v.index or 0,
                            f"graph output '{name}'")
            declared = _tensor_type(t, f"graph output '{name}'", self.lim)
            if declared != v.type:
                raise IRFormatError(f"graph output '{name}': declared {declared} but produced as {v.type}")
            out.append(v)
        return out


def _self_reference(t: Mapping[str, Any], producer: str, index: int, where: str) -> None:
    """A tensor that names its producer (optional on outputs) names the one that makes it."""
    if "producer_node" in t and _name(t["producer_node"], where, "producer_node") != producer:
        raise IRFormatError(f"{where}: 'producer_node' is '{_short_text(t['producer_node'])}', but '{producer}' "
                            "produces it")
    if "producer_output_idx" in t and _int_field(t["producer_output_idx"], where, "producer_output_idx",
                                                 MAX_OUTPUTS) != index:
        raise IRFormatError(f"{where}: 'producer_output_idx' is {t['producer_output_idx']}, but it is output "
                            f"{index} of '{producer}'")


def _bind_check(schema: OpSchema, ins: list[Value], attrs: dict[str, Any], where: str) -> None:
    """The inputs fill the schema's Tensor arguments in order (a None optional is dropped, later ones shift); a
    Tensor argument after the last input may be a scalar in attrs. A scalar for an argument an input already fills
    is ambiguous (the reference takes the input, a lowering might take the scalar): refused."""
    tensor_args = schema.tensor_args
    if any(a.is_tensor_list for a in tensor_args):
        return  # cat: the list takes every input (its count is checked by the op's inference rule)
    as_scalar = [a for a in tensor_args if a.name in attrs and attrs[a.name] is not None]
    for a in as_scalar:
        if a.name not in scalar_operands(schema.op):
            raise IRFormatError(f"{where}: attribute '{a.name}' gives a number for a tensor argument that must be an "
                                "input (ATen takes a number there only for add, sub, mul and div)")
        if tensor_args.index(a) < len(ins):
            raise IRFormatError(f"{where}: attribute '{a.name}' gives a scalar for a tensor argument that input "
                                f"#{tensor_args.index(a)} already fills")
    required = [a for a in tensor_args if not a.optional and a not in as_scalar]
    if not len(required) <= len(ins) <= len(tensor_args) - len(as_scalar):
        raise IRFormatError(f"{where}: expected {len(required)}..{len(tensor_args) - len(as_scalar)} tensor inputs "
                            f"({', '.join(a.name for a in tensor_args)}), got {len(ins)}")


def _constant_data(c: Mapping[str, Any], ttype: TensorType, where: str) -> Any:
    """A constant's data: nested lists of the use's shape (or one scalar for a 0-d tensor), numbers of its dtype."""
    dtype = normalize_dtype(c["dtype"], where)
    if dtype != ttype.dtype:
        raise IRFormatError(f"{where}: is {dtype} but used as {ttype}")
    if "shape" in c and (not isinstance(c["shape"], list) or tuple(c["shape"]) != ttype.shape):
        raise IRFormatError(f"{where}: declared shape {_short(c['shape'])} but used as {ttype}")
    data = c["data"]
    level = [data]
    for depth, n in enumerate(ttype.shape):
        nxt = []
        for x in level:
            if not isinstance(x, list) or len(x) != n:
                raise IRFormatError(f"{where}: data is not a nested list of shape {list(ttype.shape)} (level {depth})")
            nxt.extend(x)
        level = nxt
    for x in level:
        if not _number_of(x, dtype):
            raise IRFormatError(f"{where}: data holds {_short(x)}, not a {dtype} value")
    return data


def _number_of(x: Any, dtype: str) -> bool:
    if dtype == "bool":
        return isinstance(x, bool) or x in (0, 1)
    if isinstance(x, bool):
        return True
    if dtype in INT_DTYPES:
        if not isinstance(x, int):
            return False
        bits = ITEMSIZE[dtype] * 8
        lo, hi = (0, 2**bits - 1) if dtype == "uint8" else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        return lo <= x <= hi
    if dtype in FLOAT_DTYPES:
        return isinstance(x, int | float) and (not isinstance(x, int) or abs(x) < 2**1000)
    return False


@entry_point("reading the IR")
def read_ir(source: str | os.PathLike | Mapping[str, Any], limits: Limits | None = None) -> Graph:
    """Parse and validate IR JSON into a Graph."""
    lim = limits or Limits()
    data = load_ir_dict(source, lim)
    r = _GraphReader(data, lim)
    r.top()
    inputs = r.inputs()
    nodes = []
    for ni, nd in enumerate(data["nodes"]):
        nodes.append(r.node(ni, nd))
    outputs = r.outputs()
    weights = {n: v for n, v in r.values.items() if v.kind == "weight"}
    constants = {n: v for n, v in r.values.items() if v.kind == "constant"}
    return Graph(
        name=str(data.get("model_name") or "model"),
        inputs=inputs,
        outputs=outputs,
        weights=weights,
        weight_keys={p: r.mapping.get(p, p) for p in weights},
        nodes=nodes,
        constants=constants,
        output_names=[v.name for v in outputs],
        meta={
            "pytorch_version": data.get("pytorch_version") or "",
            "ir_node_count": len(nodes),
            "ir_weights": {k: list(t.shape) for k, t in r.weight_meta.items()},
        },
    )


@entry_point("reading the IR")
def checked_ir_dict(source: str | os.PathLike | Mapping[str, Any], limits: Limits | None = None) -> dict[str, Any]:
    """The IR as a dict, after `read_ir` has checked all of it: for the code that works on the JSON form (the
    partition path, which hands sub-graphs to torch_ir)."""
    data = load_ir_dict(source, limits)
    read_ir(data, limits)
    return data


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _short_text(s: Any) -> str:
    s = str(s)
    return s if len(s) <= 60 else s[:57] + "..."


__all__ = ["read_ir", "load_ir_dict", "checked_ir_dict"]
