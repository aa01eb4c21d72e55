"""Index ops as gathers: `gather`, `index_select`, `index.Tensor` (advanced indexing with integer index tensors). Each
is one generated kernel whose read position along the indexed dims is an index tensor's value (for `index.Tensor`
a negative value counts from the end, as in Python; `gather` and `index_select` refuse negative indices, as ATen
does). An index outside the tensor is refused by the reference and reads the fill on a GPU."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import UnsupportedOpError
from ..expr import nodes as X
from ..expr.aten_table import cast, const
from ..ir.graph import Node
from ..program import TensorRef
from . import views as V
from .registry import lowers

if TYPE_CHECKING:
    from .lower import Lowering

I64 = "int64"


def wrap_index(i: X.Expr, n: int) -> X.Expr:
    """An index value as a position along a dim of size n: negative values count from the end."""
    i = cast(i, I64)
    return X.Where(I64, X.Binary("bool", "lt", i, X.Const(I64, 0)), X.Binary(I64, "add", i, X.Const(I64, n)), i)


def _index_read(load, ref: TensorRef, out_rank: int, dims: list[int]) -> X.Expr:
    """`ref` (an index tensor) read at the output index: its dims line up with the output dims `dims` (broadcast
    where its size is 1), every other output dim ignored."""
    strides = [0] * out_rank
    for d, n, s in zip(dims, ref.shape, ref.strides):
        strides[d] = s if n != 1 else 0
    return load(ref, strides=tuple(strides))


@lowers("gather.default")
def gather(L: Lowering, node: Node) -> None:
    """out[p] = self[p with p[dim] = index[p]]."""
    self_v, index_v = node.inputs[:2]
    out_v = node.outputs[0]
    rank = len(self_v.shape)
    if index_v.type.numel == 0:  # ATen takes an empty index of any rank: nothing is read
        L.generated(L.fresh(out_v), lambda load: const(0, out_v.dtype))
        return
    if rank == 0:
        L.generated(L.fresh(out_v), lambda load: cast(load(L.ref(self_v, pending_ok=True)), out_v.dtype))
        return
    dim = V.norm_dim(node.attrs["dim"], rank)
    src = L.ref(self_v)
    idx = L.ref(index_v, pending_ok=True)
    out = L.fresh(out_v)

    def build(load) -> X.Expr:
        pos = cast(_index_read(load, idx, rank, list(range(rank))), I64)
        at = tuple(pos if d == dim else X.Index(I64, d) for d in range(rank))
        return cast(L.gather(src, at), out_v.dtype)

    L.generated(out, build)


@lowers("index_select.default")
def index_select(L: Lowering, node: Node) -> None:
    """out[..., j, ...] = self[..., index[j], ...] along `dim`."""
    self_v, index_v = node.inputs[:2]
    out_v = node.outputs[0]
    rank = len(self_v.shape)
    dim = V.norm_dim(node.attrs["dim"], rank) if rank else 0
    src = L.ref(self_v)
    idx = L.ref(index_v, pending_ok=True)
    idx1 = V.reshape(idx, (idx.numel,)) or V.reshape(L.contiguous(idx), (idx.numel,))
    out = L.fresh(out_v)

    def build(load) -> X.Expr:
        if rank == 0:
            return cast(L.gather(src, ()), out_v.dtype)
        pos = cast(_index_read(load, idx1, rank, [dim]), I64)
        return cast(L.gather(src, tuple(pos if d == dim else X.Index(I64, d) for d in range(rank))), out_v.dtype)

    L.generated(out, build)


@lowers("index.Tensor")
def index_tensor(L: Lowering, node: Node) -> None:
    """Advanced indexing `self[i0, :, i2]` with integer index tensors (None for a full slice). The index tensors
    broadcast to one shape B; when the indexed dims are adjacent B takes their place in the result, otherwise B comes
    first (NumPy's and ATen's rule)."""
    self_v = node.inputs[0]
    idx_vs = node.inputs[1:]
    out_v = node.outputs[0]
    rank = len(self_v.shape)
    masks = node.attrs.get("_tensor_list_none_masks") or []
    none_mask = list(masks[0]) if masks else [False] * len(idx_vs)
    if sum(not m for m in none_mask) != len(idx_vs) or len(none_mask) > rank:
        raise UnsupportedOpError(node.name, "aten.index.Tensor", L.target.name,
                                 f"{len(idx_vs)} index tensors for the index list {none_mask} of a rank-{rank} tensor")
    for v in idx_vs:
        if v.dtype in ("bool", "uint8"):
            raise UnsupportedOpError(node.name, "aten.index.Tensor", L.target.name,
                                     f"a {v.dtype} mask as an index (its result's size depends on the data)")
    indexed = [d for d, is_none in enumerate(none_mask) if not is_none]
    bshape = _broadcast_shapes([v.shape for v in idx_vs])
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1)) if indexed else True
    rest = [d for d in range(rank) if d not in indexed]
    # Where each output dim comes from: ("b", k) for the k-th broadcast dim, ("s", d) for self's dim d.
    if adjacent and indexed:
        layout = ([("s", d) for d in rest if d < indexed[0]] + [("b", k) for k in range(len(bshape))]
                  + [("s", d) for d in rest if d > indexed[-1]])
    else:
        layout = [("b", k) for k in range(len(bshape))] + [("s", d) for d in rest]
    shape = tuple(bshape[i] if kind == "b" else self_v.shape[i] for kind, i in layout)
    if shape != tuple(out_v.shape):
        raise UnsupportedOpError(node.name, "aten.index.Tensor", L.target.name,
                                 f"indexing gives shape {list(shape)}, the IR says {list(out_v.shape)}")
    b_dims = [o for o, (kind, _) in enumerate(layout) if kind == "b"]
    src = L.ref(self_v)
    idx_refs = [L.ref(v, pending_ok=True) for v in idx_vs]
    out = L.fresh(out_v)
    out_rank = len(shape)

    def build(load) -> X.Expr:
        at: list[X.Expr] = []
        k = 0
        for d in range(rank):
            if d in indexed:
                ref = idx_refs[k]
                k += 1
                lead = len(bshape) - len(ref.shape)  # broadcasting aligns the index tensor's dims on the right
                at.append(wrap_index(_index_read(load, ref, out_rank, b_dims[lead:]), self_v.shape[d]))
            else:
                at.append(X.Index(I64, next(o for o, (kind, i) in enumerate(layout) if kind == "s" and i == d)))
        return cast(L.gather(src, tuple(at)), out_v.dtype)

    L.generated(out, build)


def _broadcast_shapes(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    n = max((len(s) for s in shapes), default=0)
    out = [1] * n
    for s in shapes:
        for i, d in enumerate((1,) * (n - len(s)) + tuple(s)):
            if d != 1:
                if out[i] not in (1, d):
                    raise ValueError(f"index tensors of shapes {[list(x) for x in shapes]} do not broadcast")
                out[i] = d
    return tuple(out)
