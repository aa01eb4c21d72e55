"""Numeric comparison of a result with its reference, and the model-level tolerance policy of `npusim verify`
(per compute dtype, docs/tolerances.md; the tests' op-level policy is tests/tolerances.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

# Model-level acceptance per compute dtype: Pearson r at least `min_r` and max |err| / max |ref| at most `max_rel`.
# fp32 differs from PyTorch only by summation order; half dtypes round every op (and fp16 a 10-bit mantissa,
# bf16 a 7-bit one), so the bounds follow the mantissa widths with room for ~100 layers of accumulation. `atol` is
# the absolute error below which a difference does not count where Pearson r says nothing (an output of fewer than
# MIN_PEARSON_ELEMENTS values, or a constant reference): about ten units in the last place of a value near 1.
MODEL_TOLERANCE: dict[str, dict[str, float]] = {
    "float32": {"min_r": 0.99999, "max_rel": 1e-3, "atol": 1e-6},
    "float16": {"min_r": 0.999, "max_rel": 3e-2, "atol": 1e-3},
    "bfloat16": {"min_r": 0.995, "max_rel": 1e-1, "atol": 8e-3},
    # a program with integer kernels (docs/tolerances.md, "Integer programs"): its reference dequantizes, computes in
    # float and rounds half to even where the kernels requantize in fixed point; results differ by a unit here and
    # there, and a unit is 1/127 of a tensor's range
    "int8": {"min_r": 0.999, "max_rel": 5e-2, "atol": 1e-2},
}
# Integer codes (docs/tolerances.md, "Integer programs"): a kernel given the reference's own inputs is within one unit
# of its output's scale (the reference rounds y / scale half to even in float, the kernel requantizes in fixed point);
# given the whole model's drifted inputs, within three (two measured on PT2E's CNN and encoder block).
ONE_UNIT = 1
WHOLE_MODEL_UNITS = 3
# Pearson r of fewer values is no evidence (of two values it is always +-1, of one undefined): such an output is
# judged element by element, |err| <= atol + max_rel * |ref|.
MIN_PEARSON_ELEMENTS = 4
# Top-1/top-5 agreement is reported for class-like outputs only (`npu_compiler.output_roles`): a last axis of
# classes, at least this many for top-1 and more than 5 for top-5.
MIN_CLASSES = 2


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
    few_atol: float = 1e-6  # the absolute floor for outputs Pearson r cannot judge (MODEL_TOLERANCE's atol)

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
    base = Tolerance(row["min_r"], row["max_rel"], source=f"{compute_dtype} default", few_atol=row["atol"])
    given = {k: v for k, v in (("min_pearson", min_pearson), ("max_rel", max_rel), ("atol", atol), ("rtol", rtol))
             if v is not None}
    if not given:
        return base
    source = f"{compute_dtype} default, with " + ", ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in given.items())
    if ("atol" in given or "rtol" in given) and "max_rel" not in given:
        given["max_rel"] = None
    return replace(base, **given, source=source)


@dataclass(frozen=True)
class NonFinite:
    """The NaN and infinities of an array: how many of each, and where the first one is (in C order)."""

    nan: int
    posinf: int
    neginf: int
    size: int
    first: tuple[int, ...]

    @property
    def count(self) -> int:
        return self.nan + self.posinf + self.neginf

    def describe(self) -> str:
        """"2 NaN and 1 -inf value(s) of 16 (the first at [0, 3])"."""
        parts = [f"{n} {label}" for label, n in (("NaN", self.nan), ("+inf", self.posinf), ("-inf", self.neginf))
                 if n]
        return f"{' and '.join(parts)} value(s) of {self.size} (the first at {list(self.first)})"

    def to_dict(self) -> dict:
        return {"count": self.count, "nan": self.nan, "posinf": self.posinf, "neginf": self.neginf,
                "first": list(self.first)}


def nonfinite(a: np.ndarray) -> NonFinite | None:
    """None when every value is finite (always for integer and bool arrays); else what `NonFinite` says."""
    a = np.asarray(a)
    if a.size == 0 or a.dtype.kind in "biu":
        return None
    f = a if a.dtype.kind == "f" and a.dtype.itemsize >= 4 else a.astype(np.float32)
    finite = np.isfinite(f)
    if finite.all():
        return None
    first = np.unravel_index(int(np.argmin(finite.reshape(-1))), a.shape) if a.ndim else ()
    return NonFinite(int(np.count_nonzero(np.isnan(f))), int(np.count_nonzero(np.isposinf(f))),
                     int(np.count_nonzero(np.isneginf(f))), int(a.size), tuple(int(i) for i in first))


@dataclass
class Comparison:
    name: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float  # max |err| / max |ref|
    pearson: float | None  # None where it says nothing: fewer than MIN_PEARSON_ELEMENTS values, a constant reference
    top1_equal: float | None = None  # share of rows whose argmax agrees (class-like outputs only)
    top5_overlap: float | None = None
    exact: bool | None = None  # integer/bool outputs
    mismatched: int | None = None  # elements outside an elementwise bound, when one applies
    passed: bool = False
    nonfinite: dict | None = None  # the output's NaN and infinities (NonFinite.to_dict), which fail it
    ref_nonfinite: dict | None = None  # the reference's
    why: str = ""  # what failed, in words (empty when passed)

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


def compare(name: str, out: np.ndarray, ref: np.ndarray, compute_dtype: str, tol: Tolerance | None = None,
            class_axis: bool = False) -> Comparison:
    """`out` against `ref` under `tol` (default: the model tolerance of `compute_dtype`). An output that holds NaN or
    an infinity fails (so does a reference that does: no comparison of non-finite values proves anything). Pearson r
    judges outputs of at least MIN_PEARSON_ELEMENTS values whose reference varies; the others are judged element by
    element (|err| <= tol.few_atol + max_rel * |ref|). With `class_axis` (the last axis holds classes: a classifier's
    [batch, classes] logits, an LM's [batch, tokens, vocab]), top-1 and top-5 agreement are reported too."""
    out, ref = np.asarray(out), np.asarray(ref)
    tol = tol or model_tolerance(compute_dtype)
    if out.shape != ref.shape:
        return Comparison(name, tuple(ref.shape), float("inf"), float("inf"), None, passed=False,
                          why=f"shape {list(out.shape)} instead of {list(ref.shape)}")
    if ref.dtype.kind in "iub":
        exact = bool(np.array_equal(out, ref))
        diff = float(np.abs(out.astype(np.int64) - ref.astype(np.int64)).max()) if out.size else 0.0
        return Comparison(name, tuple(ref.shape), diff, 0.0 if exact else float("inf"), None, exact=exact,
                          passed=exact, why="" if exact else "integer values differ")
    o, r = out.astype(np.float64), ref.astype(np.float64)
    ours, theirs = nonfinite(out), nonfinite(ref)
    finite = np.isfinite(r) & np.isfinite(o)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(np.where(finite, o - r, 0.0))
    max_abs = float(err.max()) if err.size else 0.0
    scale = float(np.abs(np.where(finite, r, 0.0)).max()) if r.size else 0.0
    max_rel = max_abs / scale if scale > 0 else max_abs
    with np.errstate(invalid="ignore"):
        same_nonfinite = bool(np.all(finite | (o == r) | (np.isnan(o) & np.isnan(r))))
    if not same_nonfinite:  # NaN or an infinity where the other side has something else: the error is unbounded
        max_abs = max_rel = float("inf")
    r_finite = np.where(finite, r, 0.0)
    judged_by_r = r.size >= MIN_PEARSON_ELEMENTS and float(np.ptp(r_finite)) > 0
    pr = pearson(np.where(finite, o, 0.0), r_finite) if judged_by_r else None
    c = Comparison(name, tuple(ref.shape), max_abs, max_rel, pr,
                   nonfinite=ours.to_dict() if ours else None, ref_nonfinite=theirs.to_dict() if theirs else None)
    if class_axis and ref.ndim >= 2 and ref.shape[-1] >= MIN_CLASSES and not (ours or theirs):
        o2, r2 = o.reshape(-1, o.shape[-1]), r.reshape(-1, r.shape[-1])
        c.top1_equal = float(np.mean(o2.argmax(-1) == r2.argmax(-1)))
        c.top5_overlap = topk_agreement(o, r, 5) if ref.shape[-1] > 5 else None
    fails = []
    if ours:
        fails.append(f"the output holds {ours.describe()}")
    if theirs:
        fails.append(f"the reference holds {theirs.describe()}")
    if pr is not None and not pr >= tol.min_pearson:
        fails.append(f"pearson {pr:.6f} < {tol.min_pearson:g}")
    if tol.max_rel is not None and max_rel > tol.max_rel:
        fails.append(f"max|err|/max|ref| {max_rel:.3g} > {tol.max_rel:g}")
    if pr is None and tol.max_rel is not None:  # what Pearson r cannot judge, judged element by element
        missed = int(np.count_nonzero(err > tol.few_atol + tol.max_rel * np.abs(r_finite)))
        if missed:
            fails.append(f"{missed} element(s) beyond |err| <= {tol.few_atol:g} + {tol.max_rel:g}*|ref| (too few "
                         "values, or too constant a reference, for Pearson r)")
    if tol.elementwise:
        c.mismatched = int(np.count_nonzero(err > (tol.atol or 0.0) + (tol.rtol or 0.0) * np.abs(r_finite)))
        if c.mismatched:
            fails.append(f"{c.mismatched} element(s) beyond |err| <= {tol.atol or 0:g} + {tol.rtol or 0:g}*|ref|")
    c.passed = not fails
    c.why = "; ".join(fails)
    return c


def compare_codes(name: str, out: np.ndarray, ref: np.ndarray, units: int, given: str) -> Comparison:
    """Integer codes (a quantized tensor) against the reference's: every |out - ref| at most `units` units of the
    tensor's scale. `max_abs` is the largest difference in units, `max_rel` it over the reference's largest |code|,
    `mismatched` how many codes differ at all; `given` says which inputs the kernel ran on (for the failure's text)."""
    out, ref = np.asarray(out), np.asarray(ref)
    if out.shape != ref.shape:
        return Comparison(name, tuple(ref.shape), float("inf"), float("inf"), None, passed=False,
                          why=f"shape {list(out.shape)} instead of {list(ref.shape)}")
    diff = np.abs(out.astype(np.int64) - ref.astype(np.int64))
    worst = int(diff.max()) if diff.size else 0
    top = int(np.abs(ref.astype(np.int64)).max()) if ref.size else 0
    passed = worst <= units
    return Comparison(name, tuple(ref.shape), float(worst), worst / top if top else float(worst), None,
                      exact=worst == 0, mismatched=int(np.count_nonzero(diff)), passed=passed,
                      why="" if passed else f"codes differ by up to {worst} units (at most {units}, {given})")
