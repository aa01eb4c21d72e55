"""Numeric comparison of a result with its reference, and the model-level tolerance policy of `npusim verify`
(per compute dtype, docs/tolerances.md; the tests' op-level policy is tests/tolerances.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

# Model-level acceptance per compute dtype: Pearson r at least `min_r` and max |err| / max |ref| at most `max_rel`.
# fp32 differs from PyTorch only by summation order; half dtypes round every op (and fp16 a 10-bit mantissa,
# bf16 a 7-bit one), so the bounds follow the mantissa widths with room for ~100 layers of accumulation.
MODEL_TOLERANCE: dict[str, dict[str, float]] = {
    "float32": {"min_r": 0.99999, "max_rel": 1e-3},
    "float16": {"min_r": 0.999, "max_rel": 3e-2},
    "bfloat16": {"min_r": 0.995, "max_rel": 1e-1},
    # a program with integer kernels (docs/tolerances.md, "Integer programs"): its reference dequantizes, computes in
    # float and rounds half to even where the kernels requantize in fixed point; results differ by a unit here and
    # there, and a unit is 1/127 of a tensor's range
    "int8": {"min_r": 0.999, "max_rel": 5e-2},
}


@dataclass(frozen=True)
class Tolerance:
    """What an output must meet: Pearson r >= min_pearson, and max |err| / max |ref| <= max_rel (None: no bound);
    with `atol` or `rtol`, also every element |out - ref| <= atol + rtol * |ref| (NumPy's isclose). Non-finite
    values must match the reference exactly; integer and bool outputs must be equal."""

    min_pearson: float
    max_rel: float | None
    atol: float | None = None
    rtol: float | None = None
    source: str = ""  # where it comes from, e.g. "float16 default"

    @property
    def elementwise(self) -> bool:
        return self.atol is not None or self.rtol is not None

    def describe(self) -> str:
        parts = [f"pearson >= {self.min_pearson:g}"]
        if self.max_rel is not None:
            parts.append(f"max|err|/max|ref| <= {self.max_rel:g}")
        if self.elementwise:
            parts.append(f"every element |err| <= {self.atol or 0:g} + {self.rtol or 0:g}*|ref|")
        return ", ".join(parts) + (f" ({self.source})" if self.source else "")

    def to_dict(self) -> dict:
        return asdict(self)


def model_tolerance(compute_dtype: str, *, min_pearson: float | None = None, max_rel: float | None = None,
                    atol: float | None = None, rtol: float | None = None) -> Tolerance:
    """The default tolerance of `compute_dtype`, with any bound the user gives in its place. An elementwise bound
    (atol/rtol) replaces the max_rel bound unless max_rel is given too."""
    row = MODEL_TOLERANCE.get(compute_dtype, MODEL_TOLERANCE["float32"])
    base = Tolerance(row["min_r"], row["max_rel"], source=f"{compute_dtype} default")
    given = {k: v for k, v in (("min_pearson", min_pearson), ("max_rel", max_rel), ("atol", atol), ("rtol", rtol))
             if v is not None}
    if not given:
        return base
    source = f"{compute_dtype} default, with " + ", ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in given.items())
    if ("atol" in given or "rtol" in given) and "max_rel" not in given:
        given["max_rel"] = None
    return replace(base, **given, source=source)


@dataclass
class Comparison:
    name: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float  # max |err| / max |ref|
    pearson: float
    top1_equal: float | None = None  # share of rows whose argmax agrees (logits-like outputs)
    top5_overlap: float | None = None
    exact: bool | None = None  # integer/bool outputs
    mismatched: int | None = None  # elements outside an elementwise (atol/rtol) bound, when one applies
    passed: bool = False

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson r; NaN when a side is not finite (an overflow), which fails every bound."""
    with np.errstate(invalid="ignore", over="ignore"):
        return _pearson(a, b)


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a = a.astype(np.float64).ravel()
    b = b.astype(np.float64).ravel()
    if a.size < 2:
        return 1.0 if np.allclose(a, b) else 0.0
    a = a - a.mean()
    b = b - b.mean()
    den = np.sqrt((a * a).sum() * (b * b).sum())
    if den == 0:
        return 1.0 if np.allclose(a, b) else 0.0
    return float((a * b).sum() / den)


def topk_agreement(out: np.ndarray, ref: np.ndarray, k: int) -> float:
    """Mean share of the reference's top-k (along the last axis) that the result's top-k contains."""
    o = out.reshape(-1, out.shape[-1]).astype(np.float32)
    r = ref.reshape(-1, ref.shape[-1]).astype(np.float32)
    k = min(k, o.shape[-1])
    ot = np.argsort(-o, axis=-1)[:, :k]
    rt = np.argsort(-r, axis=-1)[:, :k]
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(ot, rt)]))


def compare(name: str, out: np.ndarray, ref: np.ndarray, compute_dtype: str, tol: Tolerance | None = None
            ) -> Comparison:
    """`out` against `ref` under `tol` (default: the model tolerance of `compute_dtype`)."""
    out, ref = np.asarray(out), np.asarray(ref)
    if out.shape != ref.shape:
        return Comparison(name, tuple(ref.shape), float("inf"), float("inf"), 0.0, passed=False)
    if ref.dtype.kind in "iub":
        exact = bool(np.array_equal(out, ref))
        diff = float(np.abs(out.astype(np.int64) - ref.astype(np.int64)).max()) if out.size else 0.0
        return Comparison(name, tuple(ref.shape), diff, 0.0 if exact else float("inf"), 1.0 if exact else 0.0,
                          exact=exact, passed=exact)
    o, r = out.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(r)
    same_nonfinite = bool(np.array_equal(np.isfinite(o), finite)) and bool(
        np.all(np.where(finite, True, (o == r) | (np.isnan(o) & np.isnan(r)))))
    err = np.abs(np.where(finite, o - r, 0.0))
    max_abs = float(err.max()) if err.size else 0.0
    scale = float(np.abs(np.where(finite, r, 0.0)).max()) if r.size else 0.0
    max_rel = max_abs / scale if scale > 0 else max_abs
    pr = pearson(np.where(finite, o, 0.0), np.where(finite, r, 0.0))
    c = Comparison(name, tuple(ref.shape), max_abs, max_rel, pr)
    if ref.ndim >= 1 and ref.shape[-1] >= 5:
        o2, r2 = o.reshape(-1, o.shape[-1]), r.reshape(-1, r.shape[-1])
        c.top1_equal = float(np.mean(o2.argmax(-1) == r2.argmax(-1)))
        c.top5_overlap = topk_agreement(o, r, 5)
    tol = tol or model_tolerance(compute_dtype)
    c.passed = same_nonfinite and pr >= tol.min_pearson and (tol.max_rel is None or max_rel <= tol.max_rel)
    if tol.elementwise:
        bound = (tol.atol or 0.0) + (tol.rtol or 0.0) * np.abs(np.where(finite, r, 0.0))
        c.mismatched = int(np.count_nonzero(err > bound))
        c.passed = c.passed and c.mismatched == 0
    return c
