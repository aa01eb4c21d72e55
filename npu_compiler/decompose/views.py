"""Layout ops under other names and the composite layout ops models use: `movedim`, `narrow`, `view_as`,
`reshape_as`, `ravel`, pixel (un)shuffle, channel shuffle, and the triangles (`tril`, `triu`: the causal masks)."""

from __future__ import annotations

from ..ir.graph import Node, Value
from ..ir.infer.core import norm_dim
from .registry import Rewriter, decomposes


@decomposes("movedim.int", emits=("permute.default",))
def _movedim(rw: Rewriter, node: Node) -> Value:
    x = node.inputs[0]
    r = len(x.shape)
    if r == 0:
        return x
    src, dst = norm_dim(node.attrs["source"], r), norm_dim(node.attrs["destination"], r)
    order = [d for d in range(r) if d != src]
    order.insert(dst, src)
    return rw.op("permute.default", x, dims=order)


@decomposes("narrow.default", emits=("slice.Tensor",))
def _narrow(rw: Rewriter, node: Node) -> Value:
    x = node.inputs[0]
    d = norm_dim(node.attrs["dim"], len(x.shape))
    start = node.attrs["start"]
    start += x.shape[d] if start < 0 else 0
    return rw.op("slice.Tensor", x, dim=d, start=start, end=start + node.attrs["length"], step=1)


@decomposes("view_as.default", "reshape_as.default", "ravel.default", emits=("reshape.default",))
def _reshape_like(rw: Rewriter, node: Node) -> Value:
    return rw.op("reshape.default", node.inputs[0], shape=list(node.outputs[0].shape))


@decomposes("positive.default", emits=())
def _positive(rw: Rewriter, node: Node) -> Value:
    return node.inputs[0]


_SHUFFLE = ("reshape.default", "permute.default")


@decomposes("pixel_shuffle.default", emits=_SHUFFLE)
def _pixel_shuffle(rw: Rewriter, node: Node) -> Value:
    """[*, C r^2, H, W] -> [*, C, r, r, H, W] -> [*, C, H, r, W, r] -> [*, C, H r, W r]."""
    x, f = node.inputs[0], node.attrs["upscale_factor"]
    *lead, c, h, w = x.shape
    n = len(lead)
    v = rw.op("reshape.default", x, shape=[*lead, c // (f * f), f, f, h, w])
    v = rw.op("permute.default", v, dims=[*range(n), n, n + 3, n + 1, n + 4, n + 2])
    return rw.op("reshape.default", v, shape=list(node.outputs[0].shape))


@decomposes("pixel_unshuffle.default", emits=_SHUFFLE)
def _pixel_unshuffle(rw: Rewriter, node: Node) -> Value:
    """[*, C, H r, W r] -> [*, C, H, r, W, r] -> [*, C, r, r, H, W] -> [*, C r^2, H, W]."""
    x, f = node.inputs[0], node.attrs["downscale_factor"]
    *lead, c, h, w = x.shape
    n = len(lead)
    v = rw.op("reshape.default", x, shape=[*lead, c, h // f, f, w // f, f])
    v = rw.op("permute.default", v, dims=[*range(n), n, n + 2, n + 4, n + 1, n + 3])
    return rw.op("reshape.default", v, shape=list(node.outputs[0].shape))


@decomposes("channel_shuffle.default", emits=_SHUFFLE)
def _channel_shuffle(rw: Rewriter, node: Node) -> Value:
    """[N, C, *] -> [N, g, C / g, *] -> [N, C / g, g, *] -> [N, C, *]."""
    x, g = node.inputs[0], node.attrs["groups"]
    n, c, *rest = x.shape
    v = rw.op("reshape.default", x, shape=[n, g, c // g, *rest])
    dims = list(range(len(v.shape)))
    dims[1], dims[2] = 2, 1
    v = rw.op("permute.default", v, dims=dims)
    return rw.op("reshape.default", v, shape=list(x.shape))


@decomposes("tril.default", "triu.default", emits=("arange.default", "reshape.default", "sub.Tensor", "le.Scalar",
                                                   "ge.Scalar", "where.ScalarOther"))
def _triangle(rw: Rewriter, node: Node) -> Value:
    """Elements with column - row <= diagonal (tril) or >= diagonal (triu) kept, the others zero: a mask from two
    aranges, which the fusion computes in the kernel that applies it."""
    x = node.inputs[0]
    h, w = x.shape[-2:]
    rows = rw.op("reshape.default", rw.op("arange.default", end=h, dtype="int64"), shape=[h, 1])
    cols = rw.op("arange.default", end=w, dtype="int64")
    offset = rw.op("sub.Tensor", cols, rows)
    k = node.attrs["diagonal"]
    keep = rw.op("le.Scalar" if node.op == "tril.default" else "ge.Scalar", offset, other=k)
    return rw.op("where.ScalarOther", keep, x, other=False if x.dtype == "bool" else 0)
