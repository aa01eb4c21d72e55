"""ATen's resampling arithmetic (`aten/src/ATen/native/UpSample.h`) that both the decompositions (nearest
resampling as gathers) and the lowering (2-D upsampling) follow: values rounded to float32 where ATen computes in
float, and the scale of one dimension."""

from __future__ import annotations

import struct


def f32(v: float) -> float:
    """`v` rounded to the nearest float32."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def scale_value(scale: float | None, n_in: int, n_out: int) -> float:
    """ATen's compute_scales_value<float>: 1/scale when given (computed in double), else in / out (in float)."""
    if scale is not None and scale > 0:
        return f32(1.0 / scale)
    return f32(f32(float(n_in)) / n_out)
