"""Upsampling (`upsample_nearest2d`, `upsample_bilinear2d`) as gathers at source positions computed the way ATen
computes them (`aten/src/ATen/native/UpSample.h`): the scale in fp32, the source coordinate in fp32 arithmetic,
then the nearest index, or the two neighbours and their weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import UnsupportedOpError
from ..expr import nodes as X
from ..expr.aten_table import cast
from ..ir.graph import Node
from ..resample_scales import f32, scale_value
from .registry import lowers

if TYPE_CHECKING:
    from .lower import Lowering

I64, F32 = "int64", "float32"


def _scales(node: Node) -> list[float | None]:
    """The per-dim scale factor the op was given (None: derive it from the sizes)."""
    a = node.attrs
    if node.op.endswith(".vec"):
        sf = a.get("scale_factors")
        return list(sf) if sf else [None, None]
    return [a.get("scales_h"), a.get("scales_w")]


def _check_size(L: Lowering, node: Node) -> None:
    x_v, out_v = node.inputs[0], node.outputs[0]
    if len(x_v.shape) != 4 or len(out_v.shape) != 4:
        raise UnsupportedOpError(node.name, f"aten.{node.op}", L.target.name,
                                 f"input {list(x_v.shape)} and output {list(out_v.shape)}: 2-D upsampling needs 4-D")


@lowers("upsample_nearest2d.vec", "upsample_nearest2d.default")
def upsample_nearest2d(L: Lowering, node: Node) -> None:
    """src = min(floor(dst * scale), in - 1), with ATen's exact shortcuts for the same size and for twice it."""
    _check_size(L, node)
    x_v, out_v = node.inputs[0], node.outputs[0]
    src = L.ref(x_v)
    scales = _scales(node)

    def source(d: int) -> X.Expr:
        i = X.Index(I64, d)
        n_in, n_out = x_v.shape[d], out_v.shape[d]
        if n_out == n_in:
            return i
        if n_out == 2 * n_in:
            return X.Binary(I64, "div", i, X.Const(I64, 2))
        s = scale_value(scales[d - 2], n_in, n_out)
        pos = cast(X.Unary(F32, "floor", X.Binary(F32, "mul", cast(i, F32), X.Const(F32, s))), I64)
        return X.Binary(I64, "min", pos, X.Const(I64, n_in - 1))

    def build(load) -> X.Expr:
        return cast(L.gather(src, (X.Index(I64, 0), X.Index(I64, 1), source(2), source(3))), out_v.dtype)

    L.generated(L.fresh(out_v), build)


@lowers("upsample_bilinear2d.vec", "upsample_bilinear2d.default")
def upsample_bilinear2d(L: Lowering, node: Node) -> None:
    """out = w0h * (w0w * x00 + w1w * x01) + w1h * (w0w * x10 + w1w * x11) in fp32, with ATen's source coordinate
    (align_corners: scale * dst; else scale * (dst + 0.5) - 0.5, clamped at 0) and neighbours."""
    _check_size(L, node)
    x_v, out_v = node.inputs[0], node.outputs[0]
    src = L.ref(x_v)
    align = bool(node.attrs.get("align_corners"))
    scales = _scales(node)

    def axis(d: int) -> tuple[X.Expr, X.Expr, X.Expr, X.Expr]:
        """(index0, index1, weight0, weight1) along output dim d."""
        n_in, n_out = x_v.shape[d], out_v.shape[d]
        if align:
            s = f32(f32(float(n_in - 1)) / (n_out - 1)) if n_out > 1 else 0.0
        else:
            s = scale_value(scales[d - 2], n_in, n_out)
        i = cast(X.Index(I64, d), F32)
        if align:
            real: X.Expr = X.Binary(F32, "mul", X.Const(F32, s), i)
        else:
            real = X.Binary(F32, "sub", X.Binary(F32, "mul", X.Const(F32, s),
                                                  X.Binary(F32, "add", i, X.Const(F32, 0.5))), X.Const(F32, 0.5))
            real = X.Where(F32, X.Binary("bool", "lt", real, X.Const(F32, 0.0)), X.Const(F32, 0.0), real)
        i0 = X.Binary(I64, "min", cast(X.Unary(F32, "floor", real), I64), X.Const(I64, n_in - 1))
        lam = X.Binary(F32, "sub", real, cast(i0, F32))
        lam = X.Binary(F32, "min", X.Binary(F32, "max", lam, X.Const(F32, 0.0)), X.Const(F32, 1.0))
        i1 = X.Where(I64, X.Binary("bool", "lt", i0, X.Const(I64, n_in - 1)),
                     X.Binary(I64, "add", i0, X.Const(I64, 1)), i0)
        return i0, i1, X.Binary(F32, "sub", X.Const(F32, 1.0), lam), lam

    def build(load) -> X.Expr:
        h0, h1, wh0, wh1 = axis(2)
        w0, w1, ww0, ww1 = axis(3)
        n, c = X.Index(I64, 0), X.Index(I64, 1)

        def at(h: X.Expr, w: X.Expr) -> X.Expr:
            return cast(L.gather(src, (n, c, h, w)), F32)

        def row(h: X.Expr) -> X.Expr:
            return X.Binary(F32, "add", X.Binary(F32, "mul", at(h, w0), ww0), X.Binary(F32, "mul", at(h, w1), ww1))

        out = X.Binary(F32, "add", X.Binary(F32, "mul", row(h0), wh0), X.Binary(F32, "mul", row(h1), wh1))
        return cast(out, out_v.dtype)

    L.generated(L.fresh(out_v), build)
