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
