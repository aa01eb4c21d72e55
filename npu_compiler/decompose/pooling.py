"""Pooling that core ATen has and the lowering does not: max pooling with the indices of the maxima (2-d and 3-d),
3-d average pooling and 3-d adaptive average pooling.

A window position is a strided slice of the input padded for it (ceil_mode's extra row included), so a pool is an
elementwise chain over the kernel's positions, which the greedy fusion makes one kernel. Max pooling follows ATen's
CPU kernel exactly (which position wins among equal values and NaNs). Adaptive averaging is separable: one GEMM with
a constant averaging matrix per dim.
"""

from __future__ import annotations

import itertools
import math

from ..dtypes import HALF_DTYPES
from ..ir.graph import Node, Value
from ..ir.infer.contractions import _window_out
from ..resample_scales import f32, scale_value
from .registry import Rewriter, decomposes

F32 = "float32"
_EMITS = ("constant_pad_nd.default", "slice.Tensor", "gt.Tensor", "isnan.default", "logical_or.default",
          "logical_and.default", "logical_not.default", "where.self", "expand.default", "arange.default",
          "ge.Scalar", "lt.Scalar", "add.Tensor", "mul.Tensor", "div.Tensor", "to.dtype", "matmul.default",
          "reshape.default")


def _params(node: Node, nd: int) -> tuple[list[int], list[int], list[int], list[int]]:
    a = node.attrs

    def per_dim(v: list[int]) -> list[int]:
        return v * nd if len(v) == 1 else list(v)

    k = per_dim(list(a["kernel_size"]))
    s = per_dim(list(a["stride"]) or k)
    return k, s, per_dim(list(a["padding"])), per_dim(list(a.get("dilation", [1])))


class _Windows:
    """The input padded with `fill` so that every window position of every output element lies inside it."""

    def __init__(self, rw: Rewriter, x: Value, k: list[int], s: list[int], p: list[int], d: list[int], ceil: bool,
                 fill: float) -> None:
        self.rw, self.k, self.s, self.p, self.d = rw, k, s, p, d
        self.nd = len(k)
        self.size = list(x.shape[-self.nd:])
        self.out = [_window_out(n, ki, si, pi, di, ceil) for n, ki, si, pi, di in zip(self.size, k, s, p, d)]
        right = [max(0, (o - 1) * si + (ki - 1) * di + 1 - n - pi)
                 for o, n, ki, si, pi, di in zip(self.out, self.size, k, s, p, d)]
        pads = [v for i in reversed(range(self.nd)) for v in (p[i], right[i])]
        self.x = rw.op("constant_pad_nd.default", x, pad=pads, value=fill) if any(pads) else x
        self._bases: dict[int, Value] = {}

    def positions(self) -> list[tuple[int, ...]]:
        return list(itertools.product(*[range(ki) for ki in self.k]))

    def at(self, pos: tuple[int, ...]) -> Value:
        """The element at window position `pos` for every output element."""
        v = self.x
        rank = len(v.shape)
        for i, off in enumerate(pos):
            start = off * self.d[i]
            v = self.rw.op("slice.Tensor", v, dim=rank - self.nd + i, start=start,
                           end=start + (self.out[i] - 1) * self.s[i] + 1, step=self.s[i])
        return v

    def coord(self, i: int, off: int, rank: int) -> Value:
        """The input coordinate along spatial dim i of window position `off`, per output position (broadcast over the
        output; one arange per dim serves every position, so that a fused kernel reads few buffers)."""
        base = self._bases.get(i)
        if base is None:
            shape = [1] * (rank - self.nd + i) + [self.out[i]] + [1] * (self.nd - 1 - i)
            base = self.rw.op("reshape.default", self.rw.op("arange.default", end=self.out[i], dtype="int64"),
                              shape=shape)
            base = self._bases[i] = self.rw.op("mul.Tensor", base, other=self.s[i])
        return self.rw.op("add.Tensor", base, other=off * self.d[i] - self.p[i])

    def index_and_inside(self, pos: tuple[int, ...], rank: int) -> tuple[Value, Value]:
        """The flat index into the input's spatial dims of window position `pos`, and whether it lies inside."""
        index = inside = None
        for i, off in enumerate(pos):
            c = self.coord(i, off, rank)
            term = self.rw.op("mul.Tensor", c, other=math.prod(self.size[i + 1:]))
            ok = self.rw.op("logical_and.default", self.rw.op("ge.Scalar", c, other=0),
                            self.rw.op("lt.Scalar", c, other=self.size[i]))
            index = term if index is None else self.rw.op("add.Tensor", index, term)
            inside = ok if inside is None else self.rw.op("logical_and.default", inside, ok)
        return index, inside


@decomposes("max_pool2d_with_indices.default", "max_pool3d_with_indices.default", emits=_EMITS)
def _max_pool_with_indices(rw: Rewriter, node: Node) -> list[Value]:
    """ATen's CPU kernel: over the window's positions inside the input, in order, a position wins where its value is
    greater than the best so far or is NaN; the first one inside always does (ATen starts from -inf at the window's
    first position inside). Positions outside the input never count, whatever the padding holds."""
    nd = 3 if node.op.startswith("max_pool3d") else 2
    x = node.inputs[0]
    w = _Windows(rw, x, *_params(node, nd), bool(node.attrs["ceil_mode"]), 0)
    rank = len(node.outputs[0].shape)
    best = arg = seen = None
    for pos in w.positions():
        v = w.at(pos)
        idx, inside = w.index_and_inside(pos, rank)
        if best is None:
            best, arg, seen = v, idx, inside
            continue
        better = rw.op("logical_or.default", rw.op("gt.Tensor", v, best), rw.op("isnan.default", v))
        take = rw.op("logical_and.default", inside, rw.op("logical_or.default", rw.op("logical_not.default", seen),
                                                          better))
        best, arg = rw.op("where.self", take, v, best), rw.op("where.self", take, idx, arg)
        seen = rw.op("logical_or.default", seen, inside)
    return [_full(rw, best, node.outputs[0]), _full(rw, arg, node.outputs[1])]


def _full(rw: Rewriter, v: Value, out: Value) -> Value:
    """`v` broadcast to the output (a window of one position leaves the index a broadcast table)."""
    return v if v.shape == out.shape else rw.op("expand.default", v, size=list(out.shape))


def _count(w: _Windows, i: int, include_pad: bool) -> list[int]:
    """ATen's avg_pool divisor along dim i: the window clipped to the padded input, or to the input itself."""
    out = []
    for o in range(w.out[i]):
        start = o * w.s[i] - w.p[i]
        end = min(start + w.k[i], w.size[i] + w.p[i])
        out.append(end - start if include_pad else min(end, w.size[i]) - max(start, 0))
    return out


@decomposes("avg_pool3d.default", emits=_EMITS)
def _avg_pool3d(rw: Rewriter, node: Node) -> Value:
    x, out_v = node.inputs[0], node.outputs[0]
    a = node.attrs
    acc = F32 if x.dtype in HALF_DTYPES else x.dtype
    xf = x if x.dtype == acc else rw.op("to.dtype", x, dtype=acc)
    k, s, p, _ = _params(node, 3)
    w = _Windows(rw, xf, k, s, p, [1, 1, 1], bool(a["ceil_mode"]), 0.0)
    total = None
    for pos in w.positions():
        v = w.at(pos)
        total = v if total is None else rw.op("add.Tensor", total, v)
    rank = len(out_v.shape)
    if a.get("divisor_override"):
        mean = rw.op("div.Tensor", total, other=float(a["divisor_override"]))
    else:
        div = None
        for i in range(3):
            c = _count(w, i, bool(a["count_include_pad"]))
            shape = [1] * (rank - 3 + i) + [len(c)] + [1] * (2 - i)
            v = rw.op("reshape.default", rw.constant([float(n) for n in c], acc, (len(c),)), shape=shape)
            div = v if div is None else rw.op("mul.Tensor", div, v)
        mean = rw.op("div.Tensor", total, div)
    return mean if mean.dtype == out_v.dtype else rw.op("to.dtype", mean, dtype=out_v.dtype)


def _averaging(n: int, out: int) -> list[list[float]]:
    """The [out, n] matrix of adaptive average pooling along one dim: row i averages [floor(i n / out),
    ceil((i + 1) n / out))."""
    rows = []
    for i in range(out):
        lo, hi = (i * n) // out, -(-((i + 1) * n) // out)
        rows.append([1.0 / (hi - lo) if lo <= j < hi else 0.0 for j in range(n)])
    return rows


@decomposes("_adaptive_avg_pool3d.default", "adaptive_avg_pool3d.default", emits=_EMITS)
def _adaptive_avg_pool3d(rw: Rewriter, node: Node) -> Value:
    x, out_v = node.inputs[0], node.outputs[0]
    (d, h, wd), (od, oh, ow) = x.shape[-3:], out_v.shape[-3:]
    lead = list(x.shape[:-3])
    y = x if x.dtype == F32 else rw.op("to.dtype", x, dtype=F32)
    mw = rw.constant([list(r) for r in zip(*_averaging(wd, ow))], F32, (wd, ow))  # [W, OW]
    y = rw.op("matmul.default", y, mw)  # [.., D, H, OW]
    y = rw.op("matmul.default", rw.constant(_averaging(h, oh), F32, (oh, h)), y)  # [.., D, OH, OW]
    y = rw.op("reshape.default", y, shape=lead + [d, oh * ow])
    y = rw.op("matmul.default", rw.constant(_averaging(d, od), F32, (od, d)), y)  # [.., OD, OH * OW]
    y = rw.op("reshape.default", y, shape=list(out_v.shape[:-3]) + [od, oh, ow])
    return y if y.dtype == out_v.dtype else rw.op("to.dtype", y, dtype=out_v.dtype)


# ---- 1-d max pooling and adaptive max pooling ----------------------------------------------------------------------


@decomposes("max_pool1d.default", emits=("unsqueeze.default", "max_pool2d.default", "squeeze.dim"))
def _max_pool1d(rw: Rewriter, node: Node) -> Value:
    """A 2-d max pooling over a height of one."""
    x, a = node.inputs[0], node.attrs
    k, s, p, d = _params(node, 1)
    y = rw.op("max_pool2d.default", rw.op("unsqueeze.default", x, dim=-2), kernel_size=[1, k[0]], stride=[1, s[0]],
              padding=[0, p[0]], dilation=[1, d[0]], ceil_mode=bool(a["ceil_mode"]))
    return rw.op("squeeze.dim", y, dim=-2)


def _adaptive_max_dim(rw: Rewriter, x: Value, d: int, out: int) -> tuple[Value, Value]:
    """Adaptive max pooling along dim d: (values, the index along d of each maximum). Cell i covers
    [floor(i n / out), ceil((i + 1) n / out)); equal cells are one reshaped `max`, unequal ones a `max` per cell."""
    n = x.shape[d]
    if n % out == 0:
        k = n // out
        shape = list(x.shape[:d]) + [out, k] + list(x.shape[d + 1:])
        v, i = rw.ops("max.dim", rw.op("reshape.default", x, shape=shape), dim=d + 1, keepdim=False)
        if k == 1:
            return v, i
        base = rw.op("mul.Tensor", rw.op("arange.default", end=out, dtype="int64"), other=k)
        base = rw.op("reshape.default", base, shape=[out] + [1] * (len(x.shape) - d - 1))
        return v, rw.op("add.Tensor", i, base)
    values, indices = [], []
    for c in range(out):
        lo, hi = (c * n) // out, -(-((c + 1) * n) // out)
        v, i = rw.ops("max.dim", rw.op("slice.Tensor", x, dim=d, start=lo, end=hi, step=1), dim=d, keepdim=True)
        values.append(v)
        indices.append(rw.op("add.Tensor", i, other=lo) if lo else i)
    return rw.op("cat.default", *values, dim=d), rw.op("cat.default", *indices, dim=d)


@decomposes("adaptive_max_pool1d.default", "adaptive_max_pool2d.default",
            emits=("reshape.default", "max.dim", "arange.default", "mul.Tensor", "add.Tensor", "slice.Tensor",
                   "cat.default", "gather.default", "zeros.default"))
def _adaptive_max_pool(rw: Rewriter, node: Node) -> list[Value]:
    """Separable: the maximum over each cell's rows, then over its columns, and the flat index of the winner (row *
    W + column). Among equal maxima the first column wins, then the first row in it (ATen's kernel takes the first in
    row-major order: the two differ only on ties)."""
    x, (out_v, out_i) = node.inputs[0], node.outputs
    if out_v.type.numel == 0:
        return [rw.op("zeros.default", size=list(t.shape), dtype=t.dtype) for t in (out_v, out_i)]
    rank = len(x.shape)
    if node.op.startswith("adaptive_max_pool1d"):
        return list(_adaptive_max_dim(rw, x, rank - 1, out_v.shape[-1]))
    oh, ow = out_v.shape[-2:]
    rows_v, rows_i = _adaptive_max_dim(rw, x, rank - 2, oh)  # [.., OH, W]
    v, col = _adaptive_max_dim(rw, rows_v, rank - 1, ow)  # [.., OH, OW]
    row = rw.op("gather.default", rows_i, col, dim=rank - 1)
    return [v, rw.op("add.Tensor", rw.op("mul.Tensor", row, other=x.shape[-1]), col)]


# ---- resampling: nearest in 1 and 3 dims, "nearest-exact", 1-d linear -----------------------------------------------

_NEAREST = {"upsample_nearest1d.vec": (1, False), "upsample_nearest3d.vec": (3, False),
            "_upsample_nearest_exact1d.vec": (1, True), "_upsample_nearest_exact2d.vec": (2, True),
            "_upsample_nearest_exact3d.vec": (3, True)}


def _nearest_sources(n_in: int, n_out: int, scale: float | None, exact: bool) -> list[int]:
    """ATen's nearest_idx / nearest_exact_idx (UpSample.h): the scale and the product in fp32."""
    if not exact and n_out == n_in:
        return list(range(n_out))
    if not exact and n_out == 2 * n_in:
        return [i >> 1 for i in range(n_out)]
    s = scale_value(scale, n_in, n_out)
    return [min(math.floor(f32(f32(i + 0.5 if exact else float(i)) * s)), n_in - 1) for i in range(n_out)]


@decomposes(*_NEAREST, emits=("index_select.default",))
def _upsample_nearest(rw: Rewriter, node: Node) -> Value:
    """One gather per spatial dim, at the source indices ATen computes (a constant table)."""
    nd, exact = _NEAREST[node.op]
    x, out = node.inputs[0], node.outputs[0]
    scales = node.attrs.get("scale_factors") or [None] * nd
    for i in range(nd):
        d = 2 + i
        src = _nearest_sources(x.shape[d], out.shape[d], scales[i], exact)
        if src != list(range(x.shape[d])):
            x = rw.op("index_select.default", x, rw.constant(src, "int64", (len(src),)), dim=d)
    return x


@decomposes("upsample_linear1d.vec", emits=("unsqueeze.default", "upsample_bilinear2d.vec", "squeeze.dim"))
def _upsample_linear1d(rw: Rewriter, node: Node) -> Value:
    """Bilinear upsampling over a height of one (its vertical weights are 1 and 0)."""
    x, a = node.inputs[0], node.attrs
    sf = a.get("scale_factors")
    y = rw.op("upsample_bilinear2d.vec", rw.op("unsqueeze.default", x, dim=2),
              output_size=None if sf else [1, node.outputs[0].shape[-1]], align_corners=bool(a["align_corners"]),
              scale_factors=[1.0, sf[0]] if sf else None)
    return rw.op("squeeze.dim", y, dim=2)
