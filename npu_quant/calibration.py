"""Activation statistics and the quantization parameters each calibration method picks from them.

Every observed tensor keeps its running min and max and a histogram of |x| (TensorRT's calibrator: 2048 bins of a
width fixed by the first batch's largest magnitude, more bins added as later batches reach further). From them:

- `minmax`: the whole observed range.
- `percentile`: |x| clipped at the given percentile of the histogram (99.99 by default).
- `mse`: the clipping threshold whose quantize-dequantize error is least: for each candidate threshold T (the upper
  edge of bin i, i from 128 to the last), the range [max(min, -T), min(max, T)] gives a scale and zero point (below),
  and the error is the sum over the bins of count x (centre - dequantize(quantize(centre)))^2, the negative values'
  bins at their negative centres (the histogram keeps which counts were negative, so an asymmetric range is scored
  on the values it really quantizes). That is pytorch-quantization's MSE calibrator (bins from 128, centres as the
  values), with signs; it weighs the clipped outliers against the bulk's rounding by measured error, where
  `percentile` clips a fixed share and `entropy` matches a distribution's shape.
- `entropy`: the clipping threshold that minimises the KL divergence between the reference distribution P (the
  histogram up to a candidate bin i, the counts beyond it added to bin i - 1) and its quantized candidate Q (those i
  bins merged into 128 levels, each level's count spread evenly over its nonzero bins), for i from 128 to the last
  bin; the threshold is the upper edge of the best i's last bin. That is TensorRT's entropy calibrator (Migacz,
  "8-bit Inference with TensorRT", GTC 2017), as NVIDIA's pytorch-quantization implements it.

The entropy method needs a filled histogram: over few values (fewer than `ENTROPY_MIN_VALUES`, 16 a bin) most bins
are empty, every candidate Q then matches P almost exactly and the minimum is noise, so such a tensor (a classifier's
pooled features over a few calibration images) takes the min-max range instead; `method_used` says which.

The threshold clips the observed range ([max(min, -T), min(max, T)]); scale and zero point follow as PyTorch's
observers compute them (`torch.ao.quantization.observer`): symmetric, zero point 0 (uint8: 128) and scale
max(|lo|, |hi|) / ((qmax - qmin) / 2); asymmetric, scale (hi - lo) / (qmax - qmin) over a range that includes 0, and
the zero point that maps 0 exactly.
"""

from __future__ import annotations

import math

import numpy as np

from npu_compiler.quant.fold import QParams  # the compiler's reading of a quantize op's parameters

NUM_BINS = 2048
ENTROPY_LEVELS = 128  # the positive half of int8: a symmetric threshold's levels
METHODS = ("minmax", "percentile", "entropy", "mse")
EPS = float(np.finfo(np.float32).eps)
ENTROPY_MIN_VALUES = 16 * NUM_BINS


class TensorStats:
    """Running min, max and |x| histogram of one tensor over the calibration batches."""

    def __init__(self, bins: int = NUM_BINS) -> None:
        self.min = math.inf
        self.max = -math.inf
        self.bins = bins
        self.hist: np.ndarray | None = None  # counts of |x|
        self.neg: np.ndarray | None = None  # the counts of the same bins that were negative values
        self.width = 0.0
        self.count = 0

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        x = x[np.isfinite(x)]
        if not x.size:
            return
        self.count += x.size
        self.min = min(self.min, float(x.min()))
        self.max = max(self.max, float(x.max()))
        a = np.abs(x)
        top = float(a.max())
        if self.hist is None:
            self.width = top / self.bins if top > 0 else 1.0
            self.hist = np.zeros(self.bins, np.int64)
            self.neg = np.zeros(self.bins, np.int64)
        need = int(math.floor(top / self.width)) + 1
        if need > self.hist.size:  # a later batch reaches further: more bins of the same width
            grow = np.zeros(need - self.hist.size, np.int64)
            self.hist, self.neg = np.concatenate([self.hist, grow]), np.concatenate([self.neg, grow])
        idx = np.minimum((a / self.width).astype(np.int64), self.hist.size - 1)
        self.hist += np.bincount(idx, minlength=self.hist.size)
        self.neg += np.bincount(idx[x < 0], minlength=self.hist.size)

    # ---- thresholds on |x| ---------------------------------------------------------------------------------------
    def percentile(self, p: float) -> float:
        """The upper edge of the bin holding the p-th percentile of |x|."""
        if self.hist is None:
            return 0.0
        cdf = np.cumsum(self.hist) / self.hist.sum()
        i = int(np.searchsorted(cdf, p / 100.0))
        return min((i + 1) * self.width, max(abs(self.min), abs(self.max)))

    def entropy(self) -> float:
        """TensorRT's KL-divergence threshold on |x| (see the module's docstring)."""
        if self.hist is None:
            return 0.0
        return entropy_threshold(self.hist, self.width)


def mse_range(stats: TensorStats, symmetric: bool, dtype: str = "int8", first: int = ENTROPY_LEVELS
              ) -> tuple[float, float]:
    """The clipped range [lo, hi] of least quantization error over the histogram (see the module's docstring)."""
    if stats.hist is None or stats.neg is None:
        return 0.0, 0.0
    pos = (stats.hist - stats.neg).astype(np.float64)
    neg = stats.neg.astype(np.float64)
    centres = (np.arange(stats.hist.size) + 0.5) * stats.width
    values = np.concatenate([np.minimum(centres, max(stats.max, 0.0)), -np.minimum(centres, max(-stats.min, 0.0))])
    counts = np.concatenate([pos, neg])
    keep = counts > 0
    values, counts = values[keep], counts[keep]
    ranges = [(max(stats.min, -i * stats.width), min(stats.max, i * stats.width))
              for i in range(min(first, stats.hist.size), stats.hist.size + 1)]
    params = [choose_qparams(lo, hi, symmetric, dtype) for lo, hi in ranges]
    errors = np.concatenate([_errors(values, counts, params[i:i + 64]) for i in range(0, len(params), 64)])
    return ranges[int(np.argmin(errors))]


def _errors(values: np.ndarray, counts: np.ndarray, params: list[QParams]) -> np.ndarray:
    """sum(counts x (values - dequantize(quantize(values)))^2) for each parameter set, as the quantize op computes
    (a float32 reciprocal of the scale, half to even)."""
    inv = (np.float32(1.0) / np.array([q.scale for q in params], np.float32))[:, None]
    zp = np.array([q.zero_point for q in params], np.float64)[:, None]
    scale = np.array([q.scale for q in params], np.float64)[:, None]
    lo, hi = params[0].qmin, params[0].qmax
    codes = np.clip(np.rint(values.astype(np.float32)[None, :] * inv) + zp, lo, hi)
    return np.sum(counts * (values - (codes - zp) * scale) ** 2, axis=1)


def entropy_threshold(hist: np.ndarray, width: float, levels: int = ENTROPY_LEVELS) -> float:
    """The threshold minimising KL(P || Q) over candidate bins i in [levels, len(hist)]: bin k of the first i goes to
    level floor(k * levels / i) (pytorch-quantization's `np.digitize` over `linspace(0, i, levels + 1)`)."""
    hist = np.asarray(hist, dtype=np.float64)
    n = hist.size
    if n <= levels:
        return n * width
    tail = np.concatenate([np.cumsum(hist[::-1])[::-1], [0.0]])  # tail[i] = sum(hist[i:])
    best_i, best_kl = n, math.inf
    for i in range(levels, n + 1):
        h = hist[:i]
        p = h.copy()
        p[i - 1] += tail[i]
        nonzero = (h != 0).astype(np.float64)
        level = (np.arange(i) * levels) // i
        sums = np.bincount(level, weights=h, minlength=levels)
        counts = np.bincount(level, weights=nonzero, minlength=levels)
        q = nonzero * (sums / np.maximum(counts, 1.0))[level]
        kl = _kl(p, q)
        if kl < best_kl:
            best_i, best_kl = i, kl
    return best_i * width


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    ps, qs = p.sum(), q.sum()
    if ps == 0 or qs == 0:
        return math.inf
    p, q = p / ps, q / qs
    m = p > 0
    if (q[m] == 0).any():
        return math.inf
    return float(np.sum(p[m] * np.log(p[m] / q[m])))


def choose_qparams(lo: float, hi: float, symmetric: bool, dtype: str = "int8") -> QParams:
    """Scale and zero point for the range [lo, hi] (PyTorch's MinMaxObserver arithmetic, scale at least eps)."""
    qmin, qmax = (-128, 127) if dtype == "int8" else (0, 255)
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = 0.0, 0.0
    if symmetric:
        amax = max(-lo, hi)
        scale = max(amax / ((qmax - qmin) / 2), EPS)
        zp = 0 if dtype == "int8" else 128
    else:
        scale = max((hi - lo) / (qmax - qmin), EPS)
        zp = int(min(max(qmin - round(lo / scale), qmin), qmax))
    return QParams(float(np.float32(scale)), zp, qmin, qmax, dtype)


def method_used(stats: TensorStats, method: str) -> str:
    """The method asked for, or min-max where the entropy method has too few values (see the module's docstring)."""
    return "minmax" if method == "entropy" and stats.count < ENTROPY_MIN_VALUES else method


def qparams_for(stats: TensorStats, method: str, symmetric: bool, percentile: float = 99.99,
                dtype: str = "int8") -> QParams:
    """The parameters `method` picks for one tensor's statistics."""
    if method not in METHODS:
        raise ValueError(f"calibration method {method!r} is not one of {', '.join(METHODS)}")
    method = method_used(stats, method)
    lo, hi = stats.min, stats.max
    if method == "mse":
        lo, hi = mse_range(stats, symmetric, dtype)
    elif method != "minmax":
        t = stats.percentile(percentile) if method == "percentile" else stats.entropy()
        lo, hi = max(lo, -t), min(hi, t)
    return choose_qparams(lo, hi, symmetric, dtype)
