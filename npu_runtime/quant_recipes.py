"""The load-time recipes of an integer program (`npu_compiler/quant/fold.py` writes them): an int8 weight quantized
from a float one, an int32 bias in the accumulator's scale, and the requantization (multiplier, shift) rows. Each is
computed once, on the host, in float64 where it divides, so every backend gets the same integers."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npu_compiler.program import WeightSpec
from npu_compiler.quant.fixed_point import quantize_multipliers

from .errors import WeightError

Fetch = Callable[..., "np.ndarray | None"]
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def _weight_scales(spec: WeightSpec, fetch: Fetch, channels: int) -> np.ndarray | None:
    """The weight's scales as float64 [channels] (a per-tensor one repeated), with zero points checked to be 0."""
    s, p = spec.recipe.sources, spec.recipe.params
    if "weight_scale" not in s:
        return np.full(channels, float(p["weight_scale"]))
    scales = fetch(s["weight_scale"], (channels,))
    if scales is None:
        return None
    scales = scales.astype(np.float64)
    if not np.isfinite(scales).all() or (scales < 0).any():
        raise WeightError(f"weight {spec.name}: the weight scales ({s['weight_scale']}) must be finite and >= 0")
    if "weight_zero_point" in s:
        zp = fetch(s["weight_zero_point"], (channels,), dtype="int64")
        if zp is None:
            return None
        if zp.any():
            raise WeightError(f"weight {spec.name}: the weight zero points ({s['weight_zero_point']}) are not all 0; "
                              "an integer kernel takes symmetric weights")
    return scales


def weight_only(w: np.ndarray, bits: int, group: int) -> dict[str, np.ndarray]:
    """A float [N, K] weight as weight-only codes (npu_compiler/kernels/wgemm.py): int8 per row, symmetric; or int4
    per group of K, asymmetric (min-max: scale (max - min) / 15, zero round(-min / scale) in [0, 15]), two codes a
    byte (k even in the low nibble). Rounding half to even, as torch.round."""
    w = np.asarray(w, dtype=np.float32)
    eps = np.float32(np.finfo(np.float32).eps)
    if bits == 8:
        scale = np.maximum(np.abs(w).max(axis=1) / np.float32(127), eps).astype(np.float32)
        q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
        return {"qweight": q, "scale": scale}
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    lo, hi = g.min(axis=2), g.max(axis=2)
    scale = np.maximum((hi - lo) / np.float32(15), eps).astype(np.float32)
    zero = np.clip(np.rint(-lo / scale), 0, 15)
    codes = np.clip(np.rint(g / scale[..., None]) + zero[..., None], 0, 15).astype(np.uint8).reshape(n, k)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return {"qweight": packed, "scale": scale, "zero": zero.astype(np.uint8)}


def _wo_weight(r, fetch) -> np.ndarray | None:
    """A wo_quantize recipe's float weight: its checkpoint tensor, or its parts ("weight", "weight1", ...: linears that
    read one input) concatenated along the rows, each [rows[i], K]."""
    if "rows" not in r.params:
        return fetch(r.sources["weight"], None, r.fallback_keys)
    parts = []
    for i, rows in enumerate(r.params["rows"]):
        a = fetch(r.sources["weight" if i == 0 else f"weight{i}"], None)
        if a is None:
            return None
        k = parts[0].shape[1] if parts else None
        if a.ndim != 2 or a.shape[0] != rows or (k is not None and a.shape[1] != k):
            raise WeightError(f"weight part {r.sources['weight' if i == 0 else f'weight{i}']} is {list(a.shape)}, "
                              f"not {rows} rows of the first part's K")
        parts.append(a)
    return np.concatenate(parts, axis=0)


def make_quant_weight(spec: WeightSpec, fetch: Fetch) -> np.ndarray | None:
    r = spec.recipe
    p = r.params
    if r.kind == "wo_quantize":
        w = _wo_weight(r, fetch)
        if w is None:
            return None
        bits, group = int(p["bits"]), int(p["group"])
        if w.ndim != 2 or (bits == 4 and w.shape[1] % group):
            raise WeightError(f"weight {spec.name}: a {list(w.shape)} weight cannot be quantized to int{bits} in "
                              f"groups of {group}")
        out = weight_only(w, bits, group)[str(p["part"])]
        if tuple(out.shape) != tuple(spec.shape):
            raise WeightError(f"weight {spec.name}: {r.sources['weight']} is {list(w.shape)}, which gives "
                              f"{list(out.shape)}, not {list(spec.shape)}")
        return out
    if r.kind == "quantize_weight":
        channels = spec.shape[0]
        scales = fetch(r.sources["weight_scale"], (channels,))
        w = fetch(r.sources["weight"], spec.shape)
        if scales is None or w is None:
            return None
        # as quantized_decomposed.quantize_per_channel: input * (1.0 / scales) in float32, rounded half to even
        with np.errstate(divide="ignore"):
            inv = (np.float32(1.0) / scales.astype(np.float32)).reshape(-1, *([1] * (w.ndim - 1)))
        if not np.isfinite(inv).all():
            raise WeightError(f"weight {spec.name}: a weight scale of 0 in {r.sources['weight_scale']}")
        q = np.clip(np.rint(w.astype(np.float32) * inv), int(p["quant_min"]), int(p["quant_max"]))
        return q.astype(np.int8)
    if r.kind == "quant_bias":
        channels = spec.shape[0]
        scales = _weight_scales(spec, fetch, channels)
        bias = fetch(r.sources["bias"], (channels,))
        if scales is None or bias is None:
            return None
        step = float(p["input_scale"]) * scales
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(step > 0, np.rint(bias.astype(np.float64) / np.where(step > 0, step, 1.0)), 0.0)
        if (bias[step == 0] != 0).any():
            raise WeightError(f"weight {spec.name}: a bias on a channel whose weight scale is 0")
        return np.clip(q, INT32_MIN, INT32_MAX).astype(np.int32)
    scales = _weight_scales(spec, fetch, spec.shape[0])
    if scales is None:
        return None
    if r.kind == "dequant_scale":  # input scale * weight scale per channel: a dequantizing kernel's float scale
        return (float(p["input_scale"]) * scales).astype(np.float32)
    # requant_scale: (input scale * weight scale) / output scale per channel, as (multiplier, shift) rows
    real = float(p["input_scale"]) * scales / float(p["output_scale"])
    try:
        return quantize_multipliers(real)
    except ValueError as e:
        raise WeightError(f"weight {spec.name}: {e}") from None
