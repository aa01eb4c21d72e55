"""`grid_sampler_2d` (F.grid_sample on images): bilinear, nearest and bicubic sampling with zeros, border and
reflection padding, as ATen's CPU kernel computes them (aten/src/ATen/native/GridSampler.h): the grid's [-1, 1]
coordinates unnormalised to pixels (align_corners or not), padding applied to the coordinate (bilinear, nearest) or
to each bicubic tap, and every tap read by one gather over the image's flattened pixels, zero where it falls
outside. Computed in fp32 for a half input.
"""

from __future__ import annotations

from ..dtypes import HALF_DTYPES
from ..ir.graph import Node, Value
from .registry import Rewriter, decomposes

F32 = "float32"
_A = -0.75  # ATen's bicubic convolution coefficient
_EMITS = ("to.dtype", "select.int", "mul.Tensor", "add.Tensor", "sub.Tensor", "div.Tensor", "rsub.Scalar",
          "floor.default", "round.default", "abs.default", "fmod.Scalar", "remainder.Scalar", "eq.Scalar",
          "clamp.default", "ge.Scalar", "lt.Scalar", "logical_and.default", "where.self", "where.ScalarOther",
          "reshape.default", "unsqueeze.default", "expand.default", "gather.default", "grid_sampler_2d.default",
          "maximum.default", "minimum.default")


class _Sampler:
    def __init__(self, rw: Rewriter, x: Value, padding: int, align: bool) -> None:
        self.rw, self.padding, self.align = rw, padding, align
        self.n, self.c, self.h, self.w = x.shape
        self.flat = rw.op("reshape.default", x, shape=[self.n, self.c, self.h * self.w])

    def op(self, name: str, *args, **kw) -> Value:
        return self.rw.op(name, *args, **kw)

    def unnormalize(self, coord: Value, size: int) -> Value:
        if self.align:  # ((coord + 1) / 2) * (size - 1)
            return self.op("mul.Tensor", self.op("div.Tensor", self.op("add.Tensor", coord, other=1.0), other=2.0),
                           other=float(size - 1))
        return self.op("div.Tensor", self.op("sub.Tensor", self.op("mul.Tensor", self.op("add.Tensor", coord,
                                                                                        other=1.0),
                                                                   other=float(size)), other=1.0), other=2.0)

    def clip(self, v: Value, size: int) -> Value:
        return self.op("clamp.default", v, min=0.0, max=float(size - 1))

    def reflect(self, v: Value, twice_low: int, twice_high: int) -> Value:
        if twice_low == twice_high:
            return self.op("mul.Tensor", v, other=0.0)
        low, span = twice_low / 2, (twice_high - twice_low) / 2
        v = self.op("abs.default", self.op("sub.Tensor", v, other=low))
        extra = self.op("fmod.Scalar", v, other=span)
        flips = self.op("floor.default", self.op("div.Tensor", v, other=span))
        even = self.op("eq.Scalar", self.op("remainder.Scalar", flips, other=2.0), other=0)
        return self.op("where.self", even, self.op("add.Tensor", extra, other=low),
                       self.op("add.Tensor", self.op("rsub.Scalar", extra, other=span), other=low))

    def pad(self, v: Value, size: int) -> Value:
        """ATen's compute_coordinates: border clips, reflection reflects then clips, zeros leaves it."""
        if self.padding == 1:
            return self.clip(v, size)
        if self.padding == 2:
            v = self.reflect(v, 0, 2 * (size - 1)) if self.align else self.reflect(v, -1, 2 * size - 1)
            return self.clip(v, size)
        return v

    def tap(self, ix: Value, iy: Value, weight: Value | None) -> Value:
        """The image at integer pixel coordinates (float tensors [N, Ho, Wo]), times `weight`, zero outside."""
        inside = self.op("logical_and.default",
                         self.op("logical_and.default", self.op("ge.Scalar", ix, other=0),
                                 self.op("lt.Scalar", ix, other=self.w)),
                         self.op("logical_and.default", self.op("ge.Scalar", iy, other=0),
                                 self.op("lt.Scalar", iy, other=self.h)))
        xi = self.op("to.dtype", self.clip(ix, self.w), dtype="int64")
        yi = self.op("to.dtype", self.clip(iy, self.h), dtype="int64")
        lin = self.op("add.Tensor", self.op("mul.Tensor", yi, other=self.w), xi)
        ho, wo = lin.shape[1:]
        lin = self.op("expand.default", self.op("reshape.default", lin, shape=[self.n, 1, ho * wo]),
                      size=[self.n, self.c, ho * wo])
        v = self.op("reshape.default", self.op("gather.default", self.flat, lin, dim=2),
                    shape=[self.n, self.c, ho, wo])
        if weight is not None:
            v = self.op("mul.Tensor", v, self.op("unsqueeze.default", weight, dim=1))
        return self.op("where.ScalarOther", self.op("unsqueeze.default", inside, dim=1), v, other=0.0)


def _cubic(rw: Rewriter, t: Value) -> list[Value]:
    """The four bicubic convolution coefficients at fractional offset t (ATen's get_cubic_upsample_coefficients)."""

    def conv1(x: Value) -> Value:  # ((A + 2) x - (A + 3)) x x + 1
        p = rw.op("sub.Tensor", rw.op("mul.Tensor", x, other=_A + 2), other=_A + 3)
        return rw.op("add.Tensor", rw.op("mul.Tensor", rw.op("mul.Tensor", p, x), x), other=1.0)

    def conv2(x: Value) -> Value:  # ((A x - 5 A) x + 8 A) x - 4 A
        p = rw.op("sub.Tensor", rw.op("mul.Tensor", x, other=_A), other=5 * _A)
        p = rw.op("add.Tensor", rw.op("mul.Tensor", p, x), other=8 * _A)
        return rw.op("sub.Tensor", rw.op("mul.Tensor", p, x), other=4 * _A)

    return [conv2(rw.op("add.Tensor", t, other=1.0)), conv1(t), conv1(rw.op("rsub.Scalar", t, other=1.0)),
            conv2(rw.op("rsub.Scalar", t, other=2.0))]


@decomposes("grid_sampler_2d.default", "grid_sampler.default", emits=_EMITS)
def _grid_sampler(rw: Rewriter, node: Node) -> Value:
    x, grid = node.inputs
    out = node.outputs[0]
    a = node.attrs
    mode = int(a["interpolation_mode"])
    acc = F32 if x.dtype in HALF_DTYPES else x.dtype
    if x.dtype != acc:
        x, grid = rw.op("to.dtype", x, dtype=acc), rw.op("to.dtype", grid, dtype=acc)
    s = _Sampler(rw, x, int(a["padding_mode"]), bool(a["align_corners"]))
    ix = s.unnormalize(rw.op("select.int", grid, dim=-1, index=0), s.w)
    iy = s.unnormalize(rw.op("select.int", grid, dim=-1, index=1), s.h)
    if mode == 2:  # bicubic: the padding is applied to each tap's coordinate
        x0, y0 = rw.op("floor.default", ix), rw.op("floor.default", iy)
        cx, cy = _cubic(rw, rw.op("sub.Tensor", ix, x0)), _cubic(rw, rw.op("sub.Tensor", iy, y0))
        total = None
        for j in range(4):
            row = None
            yj = s.pad(rw.op("add.Tensor", y0, other=float(j - 1)), s.h)
            for i in range(4):
                xi = s.pad(rw.op("add.Tensor", x0, other=float(i - 1)), s.w)
                v = s.tap(xi, yj, cx[i])
                row = v if row is None else rw.op("add.Tensor", row, v)
            row = rw.op("mul.Tensor", row, rw.op("unsqueeze.default", cy[j], dim=1))
            total = row if total is None else rw.op("add.Tensor", total, row)
    else:
        ix, iy = s.pad(ix, s.w), s.pad(iy, s.h)
        if mode == 1:  # nearest: C's nearbyint, ties to even
            total = s.tap(rw.op("round.default", ix), rw.op("round.default", iy), None)
        else:
            x0, y0 = rw.op("floor.default", ix), rw.op("floor.default", iy)
            x1, y1 = rw.op("add.Tensor", x0, other=1.0), rw.op("add.Tensor", y0, other=1.0)
            tx, ty = rw.op("sub.Tensor", ix, x0), rw.op("sub.Tensor", iy, y0)
            ux, uy = rw.op("rsub.Scalar", tx, other=1.0), rw.op("rsub.Scalar", ty, other=1.0)
            total = None
            for cx_, cy_, wx, wy in ((x0, y0, ux, uy), (x1, y0, tx, uy), (x0, y1, ux, ty), (x1, y1, tx, ty)):
                v = s.tap(cx_, cy_, rw.op("mul.Tensor", wx, wy))
                total = v if total is None else rw.op("add.Tensor", total, v)
    return total if total.dtype == out.dtype else rw.op("to.dtype", total, dtype=out.dtype)
