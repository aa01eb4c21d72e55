"""Weight rounding and bias correction after calibration: the int8 weights of each convolution and linear chosen
for the outputs they compute on the calibration inputs, not for the weights alone.

Both read the layer's input as the float model computes it on the calibration samples (`LayerInputs`): the mean of
the input each weight tap multiplies (over every output position, zero padding included) and, for GPTQ, the Gram
matrix of those input columns, H = E[x x^T] (the im2col columns of a convolution, the rows of a linear).

- `gptq` rounding (Frantar et al., "GPTQ", 2023; the OBQ update of Frantar and Alistarh 2022): the columns of the
  weight [O, K] are rounded one at a time in order, and each one's rounding error is spread over the columns not
  yet rounded through the inverse of H, so that the layer's output on the calibration inputs, W x, moves least. The
  per-channel scales stay max|w| / 127 of the float weight (as nearest rounding's). H is damped by 1% of its mean
  diagonal (GPTQ's default), so a column whose input is constant or rare is not trusted to absorb error. With H
  the identity (inputs uncorrelated, of equal power) it is rounding to nearest. A layer with more than
  `GPTQ_MAX_K` columns (its H would not fit in memory worth spending) rounds to nearest; so does a grouped
  convolution.
- bias correction (Nagel et al., "Data-Free Quantization Through Weight Equalization and Bias Correction", 2019, as
  Qualcomm's AIMET applies it): the rounding error of the weights, dW = W_int8 - W, shifts each output channel's
  mean by dW E[x]; that shift, computed from the calibration inputs, is subtracted from the bias (a layer without
  one gets one). Per output channel c of a convolution: sum over its input channels and taps of dW[c, i, k] times
  the mean input seen at (i, k).

Imports NumPy only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

WEIGHT_ROUNDINGS = ("nearest", "gptq")
GPTQ_MAX_K = 4096  # H is K x K float64: 128 MiB at 4096
GPTQ_DAMP = 0.01
WEIGHT_RANGE = (-127, 127)


def _conv_geometry(attrs: Mapping[str, Any], kernel: tuple[int, int]) -> tuple[list[int], list[int], list[int]]:
    """stride, padding (top/left = bottom/right) and dilation of a conv2d node, 'valid' and 'same' resolved."""
    stride = [int(s) for s in attrs.get("stride", [1, 1])]
    dilation = [int(d) for d in attrs.get("dilation", [1, 1])]
    pad = attrs.get("padding", [0, 0])
    if pad == "valid":
        pad = [0, 0]
    elif pad == "same":
        pad = [d * (k - 1) // 2 for d, k in zip(dilation, kernel)]
    pad = [int(p) for p in (pad if isinstance(pad, list | tuple) else [pad])]
    if len(pad) == 1:
        pad = pad * 2
    return stride, pad, dilation


class LayerInputs:
    """Running sums over the calibration samples of one conv2d's or linear's input: per weight tap the sum of the
    input values it multiplies, the number of output positions, and (when `gram`) the Gram matrix of the columns."""

    def __init__(self, op: str, attrs: Mapping[str, Any], weight_shape: tuple[int, ...], gram: bool,
                 input_shape: tuple[int, ...] | None = None) -> None:
        self.conv = op == "conv2d.default"
        self.weight_shape = tuple(weight_shape)
        self.input_shape = None if input_shape is None else tuple(input_shape)
        # False where the values observed are not the input's own layout (a permuted view's root): nothing is read
        self.same_layout = True
        self.valid = True
        self.groups = int(attrs.get("groups", 1)) if self.conv else 1
        k = int(np.prod(self.weight_shape[1:]))
        self.gram: np.ndarray | None = np.zeros((k, k), np.float64) if gram and self.groups == 1 and \
            k <= GPTQ_MAX_K else None
        if self.conv:
            self.stride, self.pad, self.dilation = _conv_geometry(attrs, self.weight_shape[2:])
        cin = self.weight_shape[1] * self.groups
        self.tap_sum = np.zeros((cin, *self.weight_shape[2:]), np.float64)
        self.positions = 0

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float32)
        if self.input_shape is not None and x.shape != self.input_shape:
            if not self.same_layout or x.size != int(np.prod(self.input_shape)):
                self.valid = False
                return
            x = x.reshape(self.input_shape)
        if not self.valid:
            return
        if not self.conv:
            rows = x.reshape(-1, x.shape[-1])
            self.tap_sum += rows.sum(0, dtype=np.float64)
            self.positions += rows.shape[0]
            if self.gram is not None:
                self.gram += (rows.T @ rows).astype(np.float64)
            return
        kh, kw = self.weight_shape[2:]
        (sh, sw), (ph, pw), (dh, dw) = self.stride, self.pad, self.dilation
        xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        oh = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
        ow = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
        taps = [xp[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
                for i in range(kh) for j in range(kw)]
        for t, tap in enumerate(taps):
            self.tap_sum[:, t // kw, t % kw] += tap.sum((0, 2, 3), dtype=np.float64)
        self.positions += x.shape[0] * oh * ow
        if self.gram is not None:
            # columns ordered as the weight's [C, KH, KW] flattening
            cols = np.stack(taps, axis=2).transpose(1, 2, 0, 3, 4).reshape(len(self.tap_sum) * kh * kw, -1)
            self.gram += (cols @ cols.T).astype(np.float64)

    def mean(self) -> np.ndarray:
        return self.tap_sum / max(self.positions, 1)

    def hessian(self) -> np.ndarray | None:
        return None if self.gram is None else self.gram / max(self.positions, 1)


def weight_scales(w: np.ndarray) -> np.ndarray:
    """Per output channel, symmetric: max|w| / 127 (at least float32 eps), float32."""
    amax = np.abs(w.reshape(w.shape[0], -1)).max(axis=1) if w.size else np.zeros(w.shape[0], np.float32)
    return np.maximum(amax / np.float32(127), np.float32(np.finfo(np.float32).eps)).astype(np.float32)


def round_nearest(w: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """As quantize_per_channel computes it: w * (1 / s) in float32, rounded half to even, clamped."""
    inv = (np.float32(1.0) / scales).reshape(-1, *([1] * (w.ndim - 1)))
    return np.clip(np.rint(np.asarray(w, np.float32) * inv), *WEIGHT_RANGE).astype(np.int8)


def round_gptq(w: np.ndarray, scales: np.ndarray, h: np.ndarray, damp: float = GPTQ_DAMP, block: int = 128
               ) -> np.ndarray:
    """GPTQ's codes of `w` [O, ...] (flattened to [O, K]) for inputs of second moment `h` [K, K] (see the module's
    docstring): column i rounded, its error e_i = (w_i - q_i s) / U[i, i] taken off the later columns as
    e_i U[i, i+1:], U the upper Cholesky factor of H^-1. As GPTQ does, in blocks of columns: within a block column by
    column, the later blocks once per block (one product)."""
    shape = w.shape
    wt = np.asarray(w, np.float64).reshape(shape[0], -1).T.copy()  # [K, O]: a weight column is a row here
    k = wt.shape[0]
    h = np.array(h, np.float64)
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0  # an input never seen: no information to spread error by
    h[np.diag_indices(k)] += damp * float(np.mean(np.diag(h)))
    u = np.linalg.cholesky(np.linalg.inv(h)).T  # upper: H^-1 = U^T U
    s = scales.astype(np.float64)
    codes = np.empty_like(wt)
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        part = wt[b0:b1]
        err = np.empty_like(part)
        for i in range(b1 - b0):
            c = b0 + i
            q = np.clip(np.rint(part[i] / s), *WEIGHT_RANGE)
            codes[c] = q
            err[i] = (part[i] - q * s) / u[c, c]
            part[i + 1:] -= np.outer(u[c, c + 1:b1], err[i])
        wt[b1:] -= u[b0:b1, b1:].T @ err
    return codes.T.reshape(shape).astype(np.int8)


def bias_shift(dw: np.ndarray, mean: np.ndarray, groups: int = 1) -> np.ndarray:
    """The mean output shift dW E[x] per output channel: `dw` [O, C/g, ...], `mean` [C, ...] (the input each tap
    multiplies, averaged)."""
    o = dw.shape[0]
    per_group = mean.reshape(groups, -1, *mean.shape[1:])
    owner = np.arange(o) // (o // groups)
    return np.sum(dw.astype(np.float64).reshape(o, -1) * per_group[owner].reshape(o, -1), axis=1)


@dataclass
class LayerWeights:
    codes: np.ndarray  # int8, the weight's shape
    scales: np.ndarray  # float32 [O]
    bias: np.ndarray | None  # float32 [O]: the corrected bias, or None to keep the layer's own
    rounding: str  # how the codes were rounded (nearest where gptq does not apply)
    bias_correction: float = 0.0  # the largest |shift| subtracted, in output units


def quantize_layer(w: np.ndarray, b: np.ndarray | None, inputs: LayerInputs | None, rounding: str,
                   correct_bias: bool) -> LayerWeights:
    """One layer's int8 weight (and corrected bias) from its float weight and bias and its calibration inputs."""
    if rounding not in WEIGHT_ROUNDINGS:
        raise ValueError(f"weight rounding {rounding!r} is not one of {', '.join(WEIGHT_ROUNDINGS)}")
    w = np.asarray(w, np.float32)
    scales = weight_scales(w)
    if inputs is not None and (not inputs.valid or inputs.positions == 0):
        inputs = None  # the layer's input was not seen in its own layout: rounded to nearest, uncorrected
    h = inputs.hessian() if inputs is not None and rounding == "gptq" else None
    codes = round_gptq(w, scales, h) if h is not None else round_nearest(w, scales)
    used = "gptq" if h is not None else "nearest"
    if not correct_bias or inputs is None:
        return LayerWeights(codes, scales, None, used)
    dw = codes.astype(np.float64) * scales.reshape(-1, *([1] * (w.ndim - 1))) - w
    shift = bias_shift(dw, inputs.mean(), inputs.groups)
    base = np.zeros(w.shape[0], np.float64) if b is None else np.asarray(b, np.float64)
    return LayerWeights(codes, scales, (base - shift).astype(np.float32), used, float(np.max(np.abs(shift), initial=0)))
