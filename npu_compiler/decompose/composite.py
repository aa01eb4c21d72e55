"""Decompositions of the composite ops `torch_ir` leaves in real models: views spelled another way, PReLU, norms and
weight norm, index_add, meshgrid, fill with a tensor, eval-mode native dropout.

Each follows ATen's own kernel where the rounding is visible: the dtype it computes in (fp32 for a half input where
ATen's kernel accumulates in its opmath type) and the order of its operations.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..dtypes import HALF_DTYPES
from ..ir.graph import Node, Value
from ..ir.infer.core import norm_dim
from .registry import Rewriter, decomposes

F32 = "float32"


# ---- views under other names --------------------------------------------------------------------------------------


@decomposes("unflatten.int", emits=("reshape.default",))
def _unflatten(rw: Rewriter, node: Node) -> Value:
    return rw.op("reshape.default", node.inputs[0], shape=list(node.outputs[0].shape))


@decomposes("expand_as.default", emits=("expand.default",))
def _expand_as(rw: Rewriter, node: Node) -> Value:
    return rw.op("expand.default", node.inputs[0], size=list(node.inputs[1].shape))


@decomposes("unbind.int", emits=("select.int",))
def _unbind(rw: Rewriter, node: Node) -> list[Value]:
    x = node.inputs[0]
    return [rw.op("select.int", x, dim=node.attrs["dim"], index=i) for i in range(len(node.outputs))]


@decomposes("numpy_T.default", emits=("permute.default",))
def _numpy_t(rw: Rewriter, node: Node) -> Value:
    x = node.inputs[0]
    if len(x.shape) < 2:  # ATen's x.T of a 0-d or 1-d tensor is the tensor itself
        return x
    return rw.op("permute.default", x, dims=list(range(len(x.shape)))[::-1])


# real tensors: the conjugate transposes are transposes
@decomposes("mT.default", "mH.default", "adjoint.default", emits=("transpose.int",))
def _matrix_t(rw: Rewriter, node: Node) -> Value:
    x = node.inputs[0]
    return rw.op("transpose.int", x, dim0=-2, dim1=-1) if x.shape else x


@decomposes("matrix_H.default", emits=("transpose.int",))
def _matrix_h(rw: Rewriter, node: Node) -> Value:
    x = node.inputs[0]
    return rw.op("transpose.int", x, dim0=0, dim1=1) if x.shape else x


@decomposes("meshgrid.default", "meshgrid.indexing", emits=("reshape.default", "expand.default"))
def _meshgrid(rw: Rewriter, node: Node) -> list[Value]:
    """Tensor i (a vector, or a 0-d tensor as one of one) varies along output dim i; "xy" swaps the first two."""
    xs = node.inputs
    shape = list(node.outputs[0].shape)
    n = len(xs)
    order = list(range(n))
    if node.attrs.get("indexing", "ij") == "xy" and n >= 2:
        order[0], order[1] = 1, 0
    outs = []
    for i, x in enumerate(xs):
        view = [1] * n
        view[order[i]] = shape[order[i]]
        outs.append(rw.op("expand.default", rw.op("reshape.default", x, shape=view), size=shape))
    return outs


# ---- fills and copies -----------------------------------------------------------------------------------------------


@decomposes("fill.Tensor", emits=("to.dtype", "expand.default"))
def _fill_tensor(rw: Rewriter, node: Node) -> Value:
    x, value = node.inputs
    if value.dtype != x.dtype:
        value = rw.op("to.dtype", value, dtype=x.dtype)
    return rw.op("expand.default", value, size=list(x.shape))


def _native_dropout_refuses(attrs: Mapping[str, Any]) -> str | None:
    if attrs.get("train") is False or float(attrs.get("p") or 0.0) == 0.0:
        return None
    return (f"native_dropout with train={attrs.get('train')} and p={attrs.get('p')} is random: export the model in "
            "eval mode")


@decomposes("native_dropout.default", emits=("ones_like.default",), refuses=_native_dropout_refuses)
def _native_dropout(rw: Rewriter, node: Node) -> list[Value]:
    """In eval mode (or with p = 0): the input, and a mask that keeps everything."""
    x = node.inputs[0]
    return [x, rw.op("ones_like.default", x, dtype=node.outputs[1].dtype)]


# ---- PReLU ----------------------------------------------------------------------------------------------------------


@decomposes("prelu.default", emits=("reshape.default", "gt.Scalar", "mul.Tensor", "where.self"))
def _prelu(rw: Rewriter, node: Node) -> Value:
    """ATen's `_prelu_kernel`: x > 0 ? x : w * x, one weight per channel (dim 1), or one for all."""
    x, w = node.inputs
    if w.type.numel != 1 and len(x.shape) > 2:
        w = rw.op("reshape.default", w, shape=[w.type.numel] + [1] * (len(x.shape) - 2))
    elif w.shape and w.type.numel == 1:
        w = rw.op("reshape.default", w, shape=[])
    return rw.op("where.self", rw.op("gt.Scalar", x, other=0), x, rw.op("mul.Tensor", w, x))


# ---- norms ----------------------------------------------------------------------------------------------------------

_NORM_OPS = ("to.dtype", "abs.default", "pow.Tensor_Scalar", "sum.dim_IntList", "amax.default", "amin.default",
             "ne.Scalar", "reshape.default")


def _reduced_dims(x: Value, dim: Any) -> list[int]:
    rank = len(x.shape)
    if dim is None or dim == []:
        return list(range(rank))
    return sorted({norm_dim(d, rank) for d in (dim if isinstance(dim, list) else [dim])})


def _vector_norm(rw: Rewriter, x: Value, ord_: float, dim: Any, keepdim: bool, out_dtype: str) -> Value:
    """torch._refs.linalg.vector_norm: in fp32 for a half result (ATen's opmath type), rounded once at the end."""
    dims = _reduced_dims(x, dim)
    if x.dtype != out_dtype:
        x = rw.op("to.dtype", x, dtype=out_dtype)
    comp = F32 if out_dtype in HALF_DTYPES else out_dtype

    def result(v: Value) -> Value:
        return v if v.dtype == out_dtype else rw.op("to.dtype", v, dtype=out_dtype)

    if ord_ == 0:
        return rw.op("sum.dim_IntList", rw.op("ne.Scalar", x, other=0), dim=dims, keepdim=keepdim, dtype=out_dtype)
    if math.isinf(ord_):
        op = "amax.default" if ord_ > 0 else "amin.default"
        return result(rw.op(op, rw.op("abs.default", x), dim=dims, keepdim=keepdim))
    x = x if x.dtype == comp else rw.op("to.dtype", x, dtype=comp)
    if all(x.shape[d] == 1 for d in dims) and (x.shape or not dims):
        # one element per result: its absolute value (no pow round trip)
        a = rw.op("abs.default", x)
        if not keepdim:
            a = rw.op("reshape.default", a, shape=[n for i, n in enumerate(x.shape) if i not in dims])
        return result(a)
    if not (ord_ % 2 == 0):
        x = rw.op("abs.default", x)
    powered = x if ord_ == 1 else rw.op("pow.Tensor_Scalar", x, exponent=ord_)
    s = rw.op("sum.dim_IntList", powered, dim=dims, keepdim=keepdim)
    return result(s if ord_ == 1 else rw.op("pow.Tensor_Scalar", s, exponent=1.0 / ord_))


@decomposes("linalg_vector_norm.default", emits=_NORM_OPS)
def _linalg_vector_norm(rw: Rewriter, node: Node) -> Value:
    a = node.attrs
    return _vector_norm(rw, node.inputs[0], float(a["ord"]), a["dim"], bool(a["keepdim"]), node.outputs[0].dtype)


def _norm_except(rw: Rewriter, v: Value, p: float, dim: int, dtype: str) -> Value:
    """ATen's norm_except_dim: over every dim but `dim`, kept as size 1 (dim -1: over all of v, a 0-d result)."""
    if dim == -1:
        return _vector_norm(rw, v, p, None, False, dtype)
    keep = norm_dim(dim, len(v.shape))
    return _vector_norm(rw, v, p, [d for d in range(len(v.shape)) if d != keep], True, dtype)


@decomposes("norm_except_dim.default", emits=_NORM_OPS)
def _norm_except_dim(rw: Rewriter, node: Node) -> Value:
    return _norm_except(rw, node.inputs[0], float(node.attrs["pow"]), int(node.attrs["dim"]), node.outputs[0].dtype)


@decomposes("_weight_norm_interface.default", emits=(*_NORM_OPS, "div.Tensor", "mul.Tensor"))
def _weight_norm_interface(rw: Rewriter, node: Node) -> list[Value]:
    """ATen's fused CPU kernel: the norm over every dim but `dim` and w = v * (g / norm), both in the accumulation
    dtype (fp32 for a half v), w rounded once; the norm is returned in that dtype."""
    v, g = node.inputs
    acc = node.outputs[1].dtype
    vf = v if v.dtype == acc else rw.op("to.dtype", v, dtype=acc)
    gf = g if g.dtype == acc else rw.op("to.dtype", g, dtype=acc)
    norm = _norm_except(rw, vf, 2.0, int(node.attrs["dim"]), acc)
    w = rw.op("mul.Tensor", vf, rw.op("div.Tensor", gf, norm))
    return [w if w.dtype == v.dtype else rw.op("to.dtype", w, dtype=v.dtype), norm]


@decomposes("_weight_norm.default", emits=(*_NORM_OPS, "div.Tensor", "mul.Tensor", "_weight_norm_interface.default"))
def _weight_norm(rw: Rewriter, node: Node) -> Value:
    """ATen's `_weight_norm` on the CPU: the fused kernel where dim is the first or the last, else
    v * (g / norm_except_dim(v, 2, dim)) op by op, with its type promotion."""
    v, g = node.inputs
    dim = int(node.attrs["dim"])
    if dim in (0, len(v.shape) - 1):  # (the rule checked that v and g then share a dtype)
        return rw.ops("_weight_norm_interface.default", v, g, dim=dim)[0]
    norm = _norm_except(rw, v, 2.0, dim, v.dtype)
    return rw.op("mul.Tensor", v, rw.op("div.Tensor", g, norm))


# ---- index_add ------------------------------------------------------------------------------------------------------


@decomposes("index_add.default", emits=("reshape.default", "arange.default", "eq.Tensor", "unsqueeze.default",
                                        "mul.Tensor", "where.ScalarOther", "sum.dim_IntList", "to.dtype",
                                        "add.Tensor"))
def _index_add(rw: Rewriter, node: Node) -> Value:
    """out[.., i, ..] = self[.., i, ..] + alpha * sum of source[.., j, ..] over the j with index[j] == i: a reduction
    over the index positions (repeated indices add up, in a fixed order, on every backend), fused by the lowering
    into one kernel that never writes the [.., N, J, ..] selection."""
    x, index, src = node.inputs
    out = node.outputs[0]
    rank0 = not x.shape
    if rank0:
        x = rw.op("reshape.default", x, shape=[1])
    d = norm_dim(node.attrs["dim"], len(x.shape))
    n, j = x.shape[d], index.type.numel
    index = rw.op("reshape.default", index, shape=[1, j])
    want = list(x.shape)
    want[d] = j
    if list(src.shape) != want:
        src = rw.op("reshape.default", src, shape=want)
    alpha = node.attrs.get("alpha", 1)
    if alpha != 1:
        src = rw.op("mul.Tensor", src, other=alpha)
    rows = rw.op("reshape.default", rw.op("arange.default", end=n, dtype="int64"), shape=[n, 1])
    mask = rw.op("eq.Tensor", rows, index)  # [N, J]
    if len(x.shape) - d - 1:
        mask = rw.op("reshape.default", mask, shape=[n, j] + [1] * (len(x.shape) - d - 1))
    picked = rw.op("where.ScalarOther", mask, rw.op("unsqueeze.default", src, dim=d), other=0)
    summed = rw.op("sum.dim_IntList", picked, dim=[d + 1], keepdim=False)
    if summed.dtype != x.dtype:
        summed = rw.op("to.dtype", summed, dtype=x.dtype)
    result = rw.op("add.Tensor", x, summed)
    return rw.op("reshape.default", result, shape=list(out.shape)) if rank0 else result


# ---- as_strided, distances, embedding bags --------------------------------------------------------------------------


@decomposes("as_strided.default", emits=("reshape.default", "arange.default", "mul.Tensor", "add.Tensor",
                                         "index_select.default", "full.default"))
def _as_strided(rw: Rewriter, node: Node) -> Value:
    """The input's elements (as its own contiguous storage) at offset + sum(i_k * stride_k): one gather."""
    x, out = node.inputs[0], node.outputs[0]
    size, stride = list(node.attrs["size"]), list(node.attrs["stride"])
    offset = node.attrs.get("storage_offset") or 0
    if out.type.numel == 0:
        return rw.op("full.default", size=size, fill_value=0, dtype=x.dtype)
    index = None
    for k, (n, s) in enumerate(zip(size, stride)):
        term = rw.op("mul.Tensor", rw.op("reshape.default", rw.op("arange.default", end=n, dtype="int64"),
                                         shape=[n if i == k else 1 for i in range(len(size))]), other=s)
        index = term if index is None else rw.op("add.Tensor", index, term)
    if index is None:  # a 0-d result
        index = rw.op("full.default", size=[], fill_value=0, dtype="int64")
    if offset:
        index = rw.op("add.Tensor", index, other=offset)
    flat = rw.op("reshape.default", x, shape=[x.type.numel])
    taken = rw.op("index_select.default", flat, rw.op("reshape.default", index, shape=[out.type.numel]), dim=0)
    return rw.op("reshape.default", taken, shape=size)


_DIST = (*_NORM_OPS, "unsqueeze.default", "sub.Tensor", "index_select.default", "linalg_vector_norm.default",
         "full.default")


@decomposes("_cdist_forward.default", "cdist.default", emits=_DIST)
def _cdist(rw: Rewriter, node: Node) -> Value:
    """The p-norm of every difference x1[.., i, :] - x2[.., j, :] (broadcast over the batch), fused into the norm's
    reduction: exact differences, where ATen's matmul form for large p = 2 inputs loses digits to cancellation."""
    x1, x2 = node.inputs
    diff = rw.op("sub.Tensor", rw.op("unsqueeze.default", x1, dim=-2), rw.op("unsqueeze.default", x2, dim=-3))
    return rw.op("linalg_vector_norm.default", diff, ord=float(node.attrs["p"]), dim=[-1], keepdim=False)


@decomposes("_pdist_forward.default", "pdist.default", emits=_DIST)
def _pdist(rw: Rewriter, node: Node) -> Value:
    """The p-norm of x[i] - x[j] for every pair i < j, in row-major order of the pairs."""
    x, out = node.inputs[0], node.outputs[0]
    n = x.shape[0]
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    if not pairs:
        return rw.op("full.default", size=list(out.shape), fill_value=0, dtype=out.dtype)
    first = rw.constant([i for i, _ in pairs], "int64", (len(pairs),))
    second = rw.constant([j for _, j in pairs], "int64", (len(pairs),))
    diff = rw.op("sub.Tensor", rw.op("index_select.default", x, first, dim=0),
                 rw.op("index_select.default", x, second, dim=0))
    return rw.op("linalg_vector_norm.default", diff, ord=float(node.attrs["p"]), dim=[-1], keepdim=False)


_BAG = ("embedding.default", "reshape.default", "arange.default", "ge.Tensor", "lt.Tensor", "ne.Scalar",
        "logical_and.default", "unsqueeze.default", "where.ScalarOther", "sum.dim_IntList", "amax.default",
        "amin.default", "mul.Tensor", "div.Tensor", "clamp.default", "gt.Scalar", "eq.Tensor", "where.self",
        "index_select.default", "cat.default", "full.default", "zeros.default", "to.dtype", "slice.Tensor",
        "sub.Scalar", "expand.default")


@decomposes("_embedding_bag.default", "embedding_bag.default", "embedding_bag.padding_idx", emits=_BAG)
def _embedding_bag(rw: Rewriter, node: Node) -> list[Value]:
    """Bag b sums (mode 0), averages (1) or takes the max (2) of the weight rows its indices pick, indices[offsets[b] :
    offsets[b + 1]], without the padding row; an empty bag gives zeros. Over a [bags, indices] membership the
    lowering fuses into the reduction. The other outputs are ATen's CPU kernel's (bag of each index, bag sizes, the
    rows that gave the maxima), in the shapes the IR declares."""
    w, idx, offsets = node.inputs[:3]
    psw = node.inputs[3] if len(node.inputs) > 3 else None
    a = node.attrs
    mode = int(a["mode"])
    pad = -1 if a.get("padding_idx") is None else int(a["padding_idx"])
    n, d = idx.type.numel, w.shape[1]
    bags = offsets.shape[0] - (1 if a["include_last_offset"] else 0)
    out_v = node.outputs[0]
    acc = F32 if w.dtype in HALF_DTYPES else w.dtype
    idx = rw.op("reshape.default", idx, shape=[n])
    off = rw.op("to.dtype", offsets, dtype="int64") if offsets.dtype != "int64" else offsets
    start = rw.op("slice.Tensor", off, dim=0, start=0, end=bags, step=1)
    end = rw.op("cat.default", rw.op("slice.Tensor", off, dim=0, start=1, end=bags, step=1),
                rw.op("full.default", size=[1], fill_value=n, dtype="int64"), dim=0) \
        if not a["include_last_offset"] else rw.op("slice.Tensor", off, dim=0, start=1, end=bags + 1, step=1)
    pos = rw.op("reshape.default", rw.op("arange.default", end=n, dtype="int64"), shape=[1, n])
    member = rw.op("logical_and.default", rw.op("ge.Tensor", pos, rw.op("unsqueeze.default", start, dim=1)),
                   rw.op("lt.Tensor", pos, rw.op("unsqueeze.default", end, dim=1)))  # [B, N]
    if pad >= 0:
        member = rw.op("logical_and.default", member,
                       rw.op("unsqueeze.default", rw.op("ne.Scalar", idx, other=pad), dim=0))
    count = rw.op("sum.dim_IntList", member, dim=[1], keepdim=False)  # [B] int64
    rows = rw.op("embedding.default", w, idx)  # [N, D]
    rows = rows if rows.dtype == acc else rw.op("to.dtype", rows, dtype=acc)
    if psw is not None:
        rows = rw.op("mul.Tensor", rows, rw.op("unsqueeze.default", rw.op("to.dtype", psw, dtype=acc)
                                                if psw.dtype != acc else psw, dim=1))
    m3 = rw.op("unsqueeze.default", member, dim=2)  # [B, N, 1]
    r3 = rw.op("unsqueeze.default", rows, dim=0)  # [1, N, D]
    some = rw.op("unsqueeze.default", rw.op("gt.Scalar", count, other=0), dim=1)  # [B, 1]
    max_rows = None
    if mode == 2:
        best = rw.op("amax.default", rw.op("where.ScalarOther", m3, r3, other=-math.inf), dim=[1], keepdim=False)
        out = rw.op("where.ScalarOther", some, best, other=0)
        # the first index in the bag that holds the maximum: its weight row
        hit = rw.op("logical_and.default", m3, rw.op("eq.Tensor", r3, rw.op("unsqueeze.default", best, dim=1)))
        at = rw.op("reshape.default", rw.op("arange.default", end=n, dtype="int64"), shape=[1, n, 1])
        first = rw.op("amin.default", rw.op("where.ScalarOther", hit, at, other=n), dim=[1], keepdim=False)
        picked = rw.op("index_select.default", idx, rw.op("reshape.default", rw.op("clamp.default", first, min=0,
                                                                                   max=max(n - 1, 0)),
                                                          shape=[bags * d]), dim=0)
        max_rows = rw.op("where.ScalarOther", some, rw.op("reshape.default", picked, shape=[bags, d]), other=0)
    else:
        out = rw.op("sum.dim_IntList", rw.op("where.ScalarOther", m3, r3, other=0), dim=[1], keepdim=False)
        if mode == 1:
            out = rw.op("div.Tensor", out, rw.op("unsqueeze.default", rw.op("clamp.default", count, min=1), dim=1))
    out = out if out.dtype == out_v.dtype else rw.op("to.dtype", out, dtype=out_v.dtype)
    started = rw.op("ge.Tensor", rw.op("reshape.default", pos, shape=[n, 1]), rw.op("unsqueeze.default", start, dim=0))
    bag_of = rw.op("sub.Scalar", rw.op("sum.dim_IntList", started, dim=[1], keepdim=False), other=1)
    sizes = count if mode else rw.op("zeros.default", size=[bags], dtype="int64")
    extra = {0: sizes, 1: sizes, 2: max_rows}[mode]
    return [out] + [v if v.shape == o.shape else rw.op("zeros.default", size=list(o.shape), dtype=o.dtype)
                    for v, o in zip((bag_of, sizes, extra), node.outputs[1:])]
