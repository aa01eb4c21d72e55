"""Slice hoisting: rows that no one reads are not computed.

A program often keeps a few rows of a long computation: an LLM's prefill keeps the last token's logits
(`hidden[:, -1:]`), a classifier the [CLS] token (`hidden[:, 0]`). Everything between the last op that mixes rows and
that slice is computed per row, so the slice can move up to that op: `slice(linear(x, W), 1, -1)` becomes
`linear(slice(x, 1, -1), W)`. In Qwen2's prefill at 2048 tokens that is the last layer's attention queries, output
projection and MLP: on the H100 that layer takes about 100 us instead of 470 (its first RMSNorm, keys and values stay
whole: they go to the cache for every token), the whole prefill 12.88 -> 12.54 ms.

The pass walks the graph from its outputs up. A value whose readers all take rows of one dim (`slice.Tensor` with
step 1, `select.int`) and whose producer computes each row of that dim from the same rows of its operands (the
rules below) is recomputed over the hull of those rows: the producer runs on sliced operands, and each reader takes
its rows of the smaller result. The new slices are readers of the operands in turn, so the walk carries them up
until a value someone reads whole (the residual stream, the keys and values) or an op that mixes rows (attention's
keys, a reduction over the dim, a cumsum).

The rules, for output dim `d` of the producer: elementwise ops (broadcast operands are left whole), casts, views
whose `d` is one of their input's dims, transposes, permutes, (un)squeezes, expands, slices, selects and cats along
other dims, linear (rows of its input), matmul / bmm / mm (rows of the left operand, or batch dims), reductions and
softmaxes over other dims, layer norm over trailing dims, embedding (rows of the indices), and
scaled_dot_product_attention (query rows, with the mask's rows, when not `is_causal`: a causal mask is aligned to
the first query). Each rewrite is checked by the op's shape rule (`ir/infer`); one that gives another shape is not
made. The semantics are exact: each kept row is computed from the same operands by the same op.
"""

from __future__ import annotations

from collections.abc import Callable

from ..expr.aten_table import ELEMENTWISE
from ..ir.graph import HOISTED_ROWS, Graph, Node, TensorType, Value
from ..ir.infer import RULES
from ..ir.infer.core import norm_dim
from ..tensor import slice_bounds

_ROW_OPS = {"slice.Tensor", "select.int"}
# elementwise by the table, except those whose operands are not broadcast against the output
_NOT_BROADCAST = {"type_as.default", "batch_norm.default", "_native_batch_norm_legit_no_training.default"}
_REDUCTIONS = {"mean.dim", "sum.dim_IntList", "amax.default", "amin.default"}
_SOFTMAXES = {"softmax.int", "_softmax.default", "log_softmax.int", "_log_softmax.default"}
_RESHAPES = {"view.default": "size", "reshape.default": "shape", "_unsafe_view.default": "size"}

# A rule gets the producer and its output dim d; it returns, per input, the input dim to slice (None: left whole)
# and the producer's attributes for the smaller result; or None where the rows do not come through.
Plan = tuple[list[int | None], dict]
Rule = Callable[[Node, int], Plan | None]


def _interval(node: Node) -> tuple[int, int, int] | None:
    """(dim, start, stop) of the rows a slice or select reads from its input, or None (a strided slice)."""
    x = node.inputs[0]
    dim = node.attrs.get("dim", 0)
    if not isinstance(dim, int) or not -x.type.rank <= dim < x.type.rank:
        return None
    dim = norm_dim(dim, x.type.rank)
    size = x.shape[dim]
    if node.op == "select.int":
        i = node.attrs.get("index")
        if not isinstance(i, int) or not -size <= i < size:
            return None
        i = i + size if i < 0 else i
        return dim, i, i + 1
    if node.attrs.get("step", 1) != 1:
        return None
    start, end = node.attrs.get("start"), node.attrs.get("end")
    if not all(v is None or isinstance(v, int) for v in (start, end)):
        return None
    return dim, *slice_bounds(start, end, size)


def _aligned(node: Node, d: int) -> list[int | None] | None:
    """Broadcast operands: each input's dim aligned with output dim d from the right, None where it is broadcast
    (size 1 or absent); None for the whole when an input's dim is neither the output's size nor 1."""
    out = node.output.type
    dims: list[int | None] = []
    for x in node.inputs:
        k = d - (out.rank - x.type.rank)
        if k < 0 or x.shape[k] == 1:
            dims.append(None)
        elif x.shape[k] == out.shape[d]:
            dims.append(k)
        else:
            return None
    return dims


def _elementwise(node: Node, d: int) -> Plan | None:
    dims = _aligned(node, d)
    return (dims, dict(node.attrs)) if dims is not None else None


def _first_only(node: Node, di: int | None, attrs: dict | None = None) -> Plan | None:
    if di is None:
        return None
    return [di] + [None] * (len(node.inputs) - 1), dict(node.attrs) if attrs is None else attrs


def _slice_other(node: Node, d: int) -> Plan | None:
    iv = _interval(node)
    if iv is None:
        return None
    sdim = iv[0]
    if node.op == "slice.Tensor":
        return _first_only(node, None if d == sdim else d)
    return _first_only(node, d if d < sdim else d + 1)


def _cat(node: Node, d: int) -> Plan | None:
    out = node.output.type
    cdim = node.attrs.get("dim", 0)
    if not isinstance(cdim, int) or norm_dim(cdim, out.rank) == d or any(x.type.rank != out.rank for x in node.inputs):
        return None
    return [d] * len(node.inputs), dict(node.attrs)


def _reshape(node: Node, d: int) -> Plan | None:
    src, out = node.inputs[0].shape, node.output.shape
    before = 1
    for s in out[:d]:
        before *= s
    prefix = 1
    for k, s in enumerate(src):
        if prefix == before and s == out[d]:
            return _first_only(node, k)
        prefix *= s
        if prefix > before:
            break
    return None


def _transpose(node: Node, d: int) -> Plan | None:
    rank = node.output.type.rank
    a, b = norm_dim(node.attrs["dim0"], rank), norm_dim(node.attrs["dim1"], rank)
    return _first_only(node, b if d == a else a if d == b else d)


def _permute(node: Node, d: int) -> Plan | None:
    rank = node.output.type.rank
    return _first_only(node, norm_dim(node.attrs["dims"][d], rank))


def _unsqueeze(node: Node, d: int) -> Plan | None:
    u = norm_dim(node.attrs["dim"], node.output.type.rank)
    return _first_only(node, None if d == u else d if d < u else d - 1)


def _squeeze(node: Node, d: int) -> Plan | None:
    src = node.inputs[0].shape
    out_rank = node.output.type.rank
    kept = [k for k in range(len(src)) if not _squeezed(node, k, src)]
    return _first_only(node, kept[d]) if len(kept) == out_rank else None


def _squeezed(node: Node, k: int, src: tuple[int, ...]) -> bool:
    if src[k] != 1:
        return False
    if node.op == "squeeze.default":
        return True
    dims = node.attrs["dim"]
    dims = dims if isinstance(dims, list | tuple) else [dims]
    return k in {norm_dim(x, len(src)) for x in dims}


def _linear(node: Node, d: int) -> Plan | None:
    return _first_only(node, d if d < node.output.type.rank - 1 else None)


def _matmul(node: Node, d: int) -> Plan | None:
    a, b = node.inputs[0].type, node.inputs[1].type
    rank = node.output.type.rank
    if a.rank < 2 or b.rank < 2:
        return None
    if d == rank - 2:
        return [a.rank - 2, None], dict(node.attrs)
    if d == rank - 1:
        return None
    dims = []
    for x in (a, b):  # batch dims broadcast like elementwise operands
        k = d - (rank - x.rank)
        dims.append(None if k < 0 or x.shape[k] == 1 else k)
    return dims, dict(node.attrs)


def _reduction(node: Node, d: int) -> Plan | None:
    rank = node.inputs[0].type.rank
    dims = node.attrs.get("dim")
    if not dims:
        return None
    reduced = {norm_dim(x, rank) for x in dims}
    kept = list(range(rank)) if node.attrs.get("keepdim") else [k for k in range(rank) if k not in reduced]
    di = kept[d]
    return _first_only(node, None if di in reduced else di)


def _softmax(node: Node, d: int) -> Plan | None:
    return _first_only(node, None if norm_dim(node.attrs["dim"], node.output.type.rank) == d else d)


def _layer_norm(node: Node, d: int) -> Plan | None:
    trailing = len(node.attrs["normalized_shape"])
    return _first_only(node, d if d < node.output.type.rank - trailing else None)


def _embedding(node: Node, d: int) -> Plan | None:
    indices = node.inputs[1].type
    return ([None, d], dict(node.attrs)) if d < indices.rank else None


def _attention(node: Node, d: int) -> Plan | None:
    q = node.inputs[0].type
    if node.attrs.get("is_causal") or d != q.rank - 2 or node.output.type.rank != q.rank:
        return None
    dims: list[int | None] = [d, None, None]
    for mask in node.inputs[3:4]:
        k = d - (q.rank - mask.type.rank)
        dims.append(None if k < 0 or mask.shape[k] == 1 else k)
    return dims, dict(node.attrs)


RULES_BY_OP: dict[str, Rule] = {
    **{op: _elementwise for op in ELEMENTWISE if op not in _NOT_BROADCAST},
    **{op: _reshape for op in _RESHAPES},
    **{op: _reduction for op in _REDUCTIONS},
    **{op: _softmax for op in _SOFTMAXES},
    "slice.Tensor": _slice_other, "select.int": _slice_other, "cat.default": _cat,
    "transpose.int": _transpose, "permute.default": _permute, "unsqueeze.default": _unsqueeze,
    "squeeze.default": _squeeze, "squeeze.dim": _squeeze, "squeeze.dims": _squeeze,
    "expand.default": _elementwise,  # (its size attribute is set to the smaller shape where the rule is applied)
    "linear.default": _linear, "matmul.default": _matmul, "bmm.default": _matmul, "mm.default": _matmul,
    "layer_norm.default": _layer_norm, "embedding.default": _embedding,
    "scaled_dot_product_attention.default": _attention,
}


class _Hoister:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.readers: dict[int, list[Node]] = {}
        for n in graph.nodes:
            for v in n.inputs:
                self.readers.setdefault(id(v), []).append(n)
        self.kept = {id(v) for v in graph.outputs}
        self.before: dict[int, list[Node]] = {}  # id(node) -> new nodes placed right before it
        self.touched: set[int] = set()  # the slices and selects the pass made or moved
        self.taken = {v.name for n in graph.nodes for v in n.outputs} | {n.name for n in graph.nodes}
        self.taken |= {v.name for v in graph.inputs} | set(graph.weights) | set(graph.constants)

    def _name(self, base: str) -> str:
        i = 0
        while f"{base}_rows{i}" in self.taken:
            i += 1
        name = f"{base}_rows{i}"
        self.taken.add(name)
        return name

    def _typed(self, node: Node) -> TensorType | None:
        rule = RULES.get(node.op)
        if rule is None:
            return None
        try:
            types = rule(node)
        except Exception:  # noqa: BLE001  (a rewrite the op's own rule refuses is simply not made)
            return None
        return types[0] if len(types) == 1 else None

    def _node(self, base: str, op: str, inputs: list[Value], attrs: dict, origin: list[str],
              expect: TensorType) -> Node | None:
        """A new node, typed by its op's rule; None where that type is not `expect` (the rewrite is then not made)."""
        name = self._name(base)
        node = Node(name, op, inputs, [], attrs, list(origin))
        t = self._typed(node)
        if t != expect:
            return None
        node.outputs = [Value(name, t, "node", node, 0)]
        return node

    def hoist(self, node: Node) -> bool:
        """Recompute `node` over the rows its readers take; False where that is not possible or gains nothing."""
        if len(node.outputs) != 1 or node.attrs.get("_side_effect") or id(node.output) in self.kept:
            return False
        out = node.output
        readers = self.readers.get(id(out), [])
        if not readers or any(r.op not in _ROW_OPS or r.inputs[0] is not out for r in readers):
            return False
        intervals = [_interval(r) for r in readers]
        if any(iv is None for iv in intervals) or len({iv[0] for iv in intervals}) != 1:
            return False
        d = intervals[0][0]
        lo, hi = min(iv[1] for iv in intervals), max(iv[2] for iv in intervals)
        if hi - lo >= out.shape[d] or hi <= lo:
            return False
        rule = RULES_BY_OP.get(node.op)
        plan = rule(node, d) if rule else None
        if plan is None:
            return False
        dims, attrs = plan
        shape = out.shape[:d] + (hi - lo,) + out.shape[d + 1:]
        if node.op in _RESHAPES:
            attrs[_RESHAPES[node.op]] = list(shape)
        elif node.op == "expand.default":
            attrs["size"] = list(shape)
        new: list[Node] = []
        inputs: list[Value] = []
        for x, k in zip(node.inputs, dims):
            if k is None:
                inputs.append(x)
                continue
            s = self._node(x.name, "slice.Tensor", [x], {"dim": k, "start": lo, "end": hi, "step": 1},
                           node.origin, TensorType(x.shape[:k] + (hi - lo,) + x.shape[k + 1:], x.dtype))
            if s is None:
                return False
            new.append(s)
            inputs.append(s.output)
        smaller = self._node(node.name, node.op, inputs, attrs, node.origin, TensorType(shape, out.dtype))
        if smaller is None:
            return False
        new.append(smaller)
        # the rows of the IR's value this one holds: per-node verify compares them with those of the reference
        self.graph.meta.setdefault(HOISTED_ROWS, {})[smaller.output.name] = [d, lo, hi]
        for x, k in zip(node.inputs, dims):
            if k is not None:
                self.readers[id(x)].remove(node)
        for s, x in zip(new[:-1], [x for x, k in zip(node.inputs, dims) if k is not None]):
            self.readers.setdefault(id(x), []).append(s)
        for x, k in zip(node.inputs, dims):
            if k is None:
                self.readers[id(x)] = [smaller if r is node else r for r in self.readers[id(x)]]
        self.before[id(node)] = new
        self.touched.update(id(r) for r in readers)
        self.touched.update(id(n) for n in new[:-1])
        self.readers[id(smaller.output)] = []
        for r, (_, a, b) in zip(readers, intervals):
            r.inputs = [smaller.output] + r.inputs[1:]
            self.readers[id(smaller.output)].append(r)
            if r.op == "select.int":
                r.attrs = {**r.attrs, "dim": d, "index": a - lo}
            else:
                r.attrs = {**r.attrs, "dim": d, "start": a - lo, "end": b - lo, "step": 1}
        self.readers[id(out)] = []
        return True


def hoist_slices(graph: Graph) -> int:
    """Move row slices up through the ops that compute row by row (module docstring); returns how many ops now
    compute fewer rows. Slices left reading a whole value (start 0, its full size) stay as views: they cost nothing."""
    h = _Hoister(graph)
    count = 0
    for node in reversed(graph.nodes):
        count += h.hoist(node)
    if not count:
        return 0
    nodes: list[Node] = []
    for n in graph.nodes:
        nodes.extend(h.before.get(id(n), ()))
        nodes.append(n)
    graph.nodes = nodes
    _tidy(graph, h.touched)
    graph.remove_dead()
    return count


def _tidy(graph: Graph, touched: set[int]) -> None:
    """The pass's slices that now read all of their input go, and equal ones become one, so that the patterns of
    the fusion passes (RMSNorm, RoPE: one value read by several ops) see one value where the IR had one."""
    new_for: dict[int, Value] = {}
    seen: dict[tuple, Value] = {}
    outputs = {id(v) for v in graph.outputs}
    kept: list[Node] = []
    for n in graph.nodes:
        n.inputs = [new_for.get(id(v), v) for v in n.inputs]
        iv = _interval(n) if id(n) in touched and n.op == "slice.Tensor" and id(n.output) not in outputs else None
        if iv is not None:
            x = n.inputs[0]
            dim, start, stop = iv
            if (start, stop) == (0, x.shape[dim]):
                new_for[id(n.output)] = x
                continue
            key = (id(x), dim, start, stop)
            if key in seen:
                new_for[id(n.output)] = seen[key]
                continue
            seen[key] = n.output
        kept.append(n)
    graph.nodes = kept
    graph.outputs = [new_for.get(id(v), v) for v in graph.outputs]
