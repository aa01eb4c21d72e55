"""IR JSON (pytorch-ir / torch_ir) -> validated `Graph` with every ATen default filled in.

Every error names where the problem is: the node, its op, the operand and what was expected.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from ..dtypes import normalize_dtype
from ..errors import IRFormatError
from .graph import Graph, Node, TensorType, Value
from .schema import lookup, short_op

_TOP_KEYS = {"model_name", "pytorch_version", "graph_inputs", "graph_outputs", "weights", "weight_name_mapping",
             "nodes", "constants"}
# Attr values that name a dtype (stringified by the exporter as "torch.bfloat16").
_DTYPE_ATTRS = {"dtype"}


def load_ir_dict(source: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    """Read IR JSON from a path, a JSON string or an already parsed dict."""
    if isinstance(source, Mapping):
        return dict(source)
    text: str
    where: str
    if isinstance(source, os.PathLike) or (isinstance(source, str) and not source.lstrip().startswith("{")):
        where = os.fspath(source)
        try:
            with open(where, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError as e:
            raise IRFormatError(f"IR file not found: {where}") from e
        except (OSError, UnicodeDecodeError) as e:
            raise IRFormatError(f"cannot read IR file {where}: {e}") from e
    else:
        where, text = "<string>", source
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise IRFormatError(f"{where}: malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e
    if not isinstance(data, dict):
        raise IRFormatError(f"{where}: the IR must be a JSON object, got {type(data).__name__}")
    return data


def _tensor_type(t: Any, where: str) -> TensorType:
    if not isinstance(t, Mapping) or "shape" not in t or "dtype" not in t:
        raise IRFormatError(f"{where}: a tensor needs 'shape' and 'dtype', got {t!r}")
    shape = t["shape"]
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise IRFormatError(f"{where}: shape must be a list of static integers, got {shape!r} "
                            "(the compiler needs static shapes)")
    if any(d < 0 for d in shape):
        raise IRFormatError(f"{where}: negative dimension in shape {shape}")
    return TensorType(tuple(shape), normalize_dtype(t["dtype"], where))


def _normalize_attr(key: str, value: Any, where: str) -> Any:
    if key in _DTYPE_ATTRS and isinstance(value, str):
        return normalize_dtype(value, f"{where} attr '{key}'")
    return value


def read_ir(source: str | os.PathLike | Mapping[str, Any]) -> Graph:
    """Parse and validate IR JSON into a Graph."""
    data = load_ir_dict(source)
    missing = [k for k in ("graph_inputs", "graph_outputs", "nodes") if k not in data]
    if missing:
        raise IRFormatError(f"IR is missing required key(s) {missing}; is this a pytorch-ir JSON file?")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise IRFormatError(f"IR has unknown top-level key(s) {sorted(unknown)}")
    for key in ("graph_inputs", "graph_outputs", "nodes"):
        if not isinstance(data[key], list):
            raise IRFormatError(f"IR key '{key}' must be a list")

    mapping: dict[str, str] = dict(data.get("weight_name_mapping") or {})
    weight_meta = {w["name"]: w for w in data.get("weights") or [] if isinstance(w, Mapping) and "name" in w}
    const_meta: dict[str, Any] = dict(data.get("constants") or {})

    inputs: list[Value] = []
    by_producer: dict[tuple[str, int], Value] = {}
    for i, t in enumerate(data["graph_inputs"]):
        where = f"graph input #{i}"
        if not isinstance(t, Mapping) or not isinstance(t.get("name"), str):
            raise IRFormatError(f"{where}: needs a 'name'")
        v = Value(t["name"], _tensor_type(t, f"graph input '{t['name']}'"), "input")
        inputs.append(v)
        by_producer[(v.name, 0)] = v

    weights: dict[str, Value] = {}
    constants: dict[str, Value] = {}
    nodes: list[Node] = []
    seen_names: set[str] = set()

    for ni, nd in enumerate(data["nodes"]):
        if not isinstance(nd, Mapping):
            raise IRFormatError(f"node #{ni}: must be an object")
        for k in ("name", "op_type", "inputs", "outputs"):
            if k not in nd:
                raise IRFormatError(f"node #{ni} ({nd.get('name', '?')}): missing key '{k}'")
        name, op_type = nd["name"], nd["op_type"]
        if not isinstance(name, str) or not isinstance(op_type, str):
            raise IRFormatError(f"node #{ni}: 'name' and 'op_type' must be strings")
        if name in seen_names:
            raise IRFormatError(f"node '{name}' ({op_type}): duplicate node name")
        seen_names.add(name)
        op = short_op(op_type)
        where = f"node '{name}' ({op_type})"

        ins: list[Value] = []
        for ii, t in enumerate(nd["inputs"]):
            iw = f"{where} input #{ii}"
            if not isinstance(t, Mapping) or "name" not in t:
                raise IRFormatError(f"{iw}: needs a 'name'")
            ttype = _tensor_type(t, f"{iw} '{t['name']}'")
            producer = t.get("producer_node")
            if producer is not None:
                key = (producer, int(t.get("producer_output_idx", 0)))
                src = by_producer.get(key)
                if src is None:
                    raise IRFormatError(f"{iw} '{t['name']}': producer '{producer}' output {key[1]} does not exist "
                                        "before this node (dangling producer or nodes not in topological order)")
                if src.type.shape != ttype.shape or src.type.dtype != ttype.dtype:
                    raise IRFormatError(f"{iw} '{t['name']}': declared {ttype} but its producer '{producer}' "
                                        f"gives {src.type}")
                ins.append(src)
                continue
            pname = t["name"]
            key = mapping.get(pname, pname)
            if key in const_meta or pname in const_meta:
                cname = key if key in const_meta else pname
                if cname not in constants:
                    c = const_meta[cname]
                    constants[cname] = Value(cname, ttype, "constant", data=c.get("data"))
                ins.append(constants[cname])
                continue
            if pname not in mapping and pname not in weight_meta:
                raise IRFormatError(f"{iw} '{pname}': neither a producer, a weight placeholder "
                                    "(weight_name_mapping) nor a constant")
            wv = weights.get(pname)
            if wv is None:
                wm = weight_meta.get(key)
                if wm is not None:
                    declared = _tensor_type(wm, f"weight '{key}'")
                    if declared.shape != ttype.shape:
                        raise IRFormatError(f"{iw}: weight '{key}' is declared {declared} but used as {ttype}")
                wv = Value(pname, ttype, "weight")
                weights[pname] = wv
            elif wv.type != ttype:
                raise IRFormatError(f"{iw}: weight '{pname}' used as {ttype} here but as {wv.type} elsewhere")
            ins.append(wv)

        raw_outs = nd["outputs"]
        if not isinstance(raw_outs, list):
            raise IRFormatError(f"{where}: 'outputs' must be a list")
        attrs = dict(nd.get("attrs") or {})
        attrs = {k: _normalize_attr(k, v, where) for k, v in attrs.items()}
        node = Node(name, op, ins, [], attrs)
        for oi, t in enumerate(raw_outs):
            ow = f"{where} output #{oi}"
            if not isinstance(t, Mapping) or "name" not in t:
                raise IRFormatError(f"{ow}: needs a 'name'")
            v = Value(t["name"], _tensor_type(t, f"{ow} '{t['name']}'"), "node", producer=node, index=oi)
            node.outputs.append(v)
            by_producer[(name, oi)] = v

        if op == "getitem":
            idx = attrs.get("index")
            if not isinstance(idx, int) or not 0 <= idx < len(ins):
                raise IRFormatError(f"{where}: getitem index {idx!r} out of range for {len(ins)} producer outputs")
            node.inputs = [ins[idx]]
            if len(node.outputs) != 1 or node.outputs[0].type != ins[idx].type:
                raise IRFormatError(f"{where}: getitem output must be one tensor of type {ins[idx].type}")
        else:
            _fill_defaults(node, where)
        nodes.append(node)

    outputs: list[Value] = []
    names = {v.name: v for n in nodes for v in n.outputs}
    names.update({v.name: v for v in inputs})
    for i, t in enumerate(data["graph_outputs"]):
        if not isinstance(t, Mapping) or t.get("name") not in names:
            raise IRFormatError(f"graph output #{i} {t.get('name') if isinstance(t, Mapping) else t!r}: "
                                "not produced by any node")
        v = names[t["name"]]
        declared = _tensor_type(t, f"graph output '{t['name']}'")
        if declared != v.type:
            raise IRFormatError(f"graph output '{t['name']}': declared {declared} but produced as {v.type}")
        outputs.append(v)

    keys = {p: mapping.get(p, p) for p in weights}
    return Graph(
        name=str(data.get("model_name") or "model"),
        inputs=inputs,
        outputs=outputs,
        weights=weights,
        weight_keys=keys,
        nodes=nodes,
        constants=constants,
        output_names=[v.name for v in outputs],
        meta={
            "pytorch_version": data.get("pytorch_version", ""),
            "ir_node_count": len(nodes),
            "ir_weights": {k: list(w.get("shape", [])) for k, w in weight_meta.items()},
        },
    )


def _fill_defaults(node: Node, where: str) -> None:
    schema = lookup(node.op)
    if schema is None:
        return  # unknown op: kept as is; lowering (or the partition path) decides what happens to it
    for k, v in schema.defaults().items():
        node.attrs.setdefault(k, v)
    tensor_args = schema.tensor_args
    if any(a.is_tensor_list for a in tensor_args):
        return
    # A scalar operand of a Tensor arg sits in attrs under the arg's name (`add.Tensor {"other": 0.5}`).
    as_scalar = [a for a in tensor_args if a.name in node.attrs]
    required = [a for a in tensor_args if not a.optional and a not in as_scalar]
    if not len(required) <= len(node.inputs) <= len(tensor_args) - len(as_scalar):
        raise IRFormatError(f"{where}: expected {len(required)}..{len(tensor_args)} tensor inputs "
                            f"({', '.join(a.name for a in tensor_args)}), got {len(node.inputs)}")
    if schema.num_outputs and len(node.outputs) != schema.num_outputs:
        raise IRFormatError(f"{where}: expected {schema.num_outputs} output(s), got {len(node.outputs)}")
