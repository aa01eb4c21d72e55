"""The tolerance policy: how close a backend's result must be to the reference, per dtype, kind of op and backend.

Every test that compares numbers takes its tolerance from here (docs/tolerances.md explains each row). The
reference is PyTorch eager on the CPU, run in the same dtype as the compiled program's output.

Kinds of op:
- "exact": results that must be bit-identical: data movement (views, cat, copies), casts, comparisons, selection
  (where, masked_fill, relu, clamp, max/min), integer arithmetic and the correctly rounded IEEE operations
  (+, -, *, /, sqrt on the same operands). A division by a scalar must be a real division: x / 3 and x * (1/3)
  differ in the last bit for a third of all fp32 values.
- "elementwise": transcendental functions (exp, log, tanh, erf, pow, sin, ...) and fused chains of elementwise
  ops; both sides compute in fp32 and round once to the output dtype, so they differ by the libm's error (a few
  fp32 ulps) plus at most one ulp of the output dtype where that error flips a rounding.
- "accumulate": GEMM, conv, reductions, softmax, attention, pooling, normalisation: sums over many terms in fp32
  whose order differs between implementations (blocked GEMM, pairwise sums), so the error grows with the length
  of the sum and with cancellation.

Integer and bool outputs are always exact, whatever the kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("exact", "elementwise", "accumulate")


@dataclass(frozen=True)
class Tolerance:
    """`|got - ref| <= atol + rtol * |ref|`, elementwise (numpy.isclose's rule); NaN must match NaN and an infinity
    must match the same infinity."""

    atol: float
    rtol: float

    def __str__(self) -> str:
        return f"atol={self.atol:g}, rtol={self.rtol:g}"


EXACT = Tolerance(0.0, 0.0)

# (dtype, kind) -> Tolerance, for every backend unless BACKEND_OVERRIDES has a row.
# float32: ulp = 2^-23 ~ 1.2e-7 relative; 1e-5 leaves room for libm differences of a few tens of ulps.
# float16: ulp = 2^-10 ~ 9.8e-4 relative at the bottom of a binade; rtol 1e-3 is one ulp, 2e-3 two.
# bfloat16: ulp = 2^-7 ~ 7.8e-3 relative at the bottom of a binade; rtol 1e-2 is one ulp, 2e-2 two.
# atol covers results near zero, where a relative bound is meaningless (a sum that cancels): it is one ulp of
# the dtype at 1 for accumulations (inputs are O(1) in the tests) and the size of a subnormal-free tiny value for
# elementwise ops.
DEFAULT: dict[tuple[str, str], Tolerance] = {
    ("float32", "exact"): EXACT,
    ("float32", "elementwise"): Tolerance(1e-5, 1e-5),
    ("float32", "accumulate"): Tolerance(1e-4, 1e-4),
    ("float16", "exact"): EXACT,
    ("float16", "elementwise"): Tolerance(1e-5, 1e-3),
    ("float16", "accumulate"): Tolerance(1e-3, 2e-3),
    ("bfloat16", "exact"): EXACT,
    ("bfloat16", "elementwise"): Tolerance(1e-5, 1e-2),
    ("bfloat16", "accumulate"): Tolerance(1e-2, 2e-2),
}

# (backend, dtype, kind) -> Tolerance where a backend may legitimately differ more from the reference (a GPU's
# fast division or fused multiply-add). Today every backend is held to DEFAULT.
BACKEND_OVERRIDES: dict[tuple[str, str, str], Tolerance] = {}

INTEGER_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint8", "bool"})


def tolerance(dtype: str, kind: str = "elementwise", backend: str = "cpu") -> Tolerance:
    """The tolerance for an output of `dtype` computed by an op of `kind` on `backend`."""
    if kind not in KINDS:
        raise ValueError(f"unknown tolerance kind {kind!r} (known: {', '.join(KINDS)})")
    if dtype in INTEGER_DTYPES:
        return EXACT
    override = BACKEND_OVERRIDES.get((backend, dtype, kind))
    if override is not None:
        return override
    try:
        return DEFAULT[(dtype, kind)]
    except KeyError:
        raise KeyError(f"no tolerance for dtype {dtype} ({kind}); add a row to tests/tolerances.py") from None


def assert_close(got: np.ndarray, ref: np.ndarray, dtype: str, kind: str = "elementwise", backend: str = "cpu",
                 what: str = "output") -> None:
    """Assert `got` matches `ref` within the policy's tolerance; the message names the worst element."""
    tol = tolerance(dtype, kind, backend)
    got = np.asarray(got)
    ref = np.asarray(ref)
    if got.shape != ref.shape:
        raise AssertionError(f"{what}: shape {list(got.shape)} != reference {list(ref.shape)}")
    if dtype in INTEGER_DTYPES:
        bad = got.astype(np.int64) != ref.astype(np.int64)
        if bad.any():
            i = np.unravel_index(int(np.argmax(bad)), bad.shape) if bad.ndim else ()
            raise AssertionError(f"{what} ({dtype}, exact): {int(bad.sum())} of {bad.size} element(s) differ; "
                                 f"first at {tuple(map(int, i))}: got {got[i]}, reference {ref[i]}")
        return
    g = got.astype(np.float64)
    r = ref.astype(np.float64)
    nan_g, nan_r = np.isnan(g), np.isnan(r)
    with np.errstate(invalid="ignore"):
        same_inf = np.isinf(r) & (g == r)
        err = np.abs(g - r)
        bad = (err > tol.atol + tol.rtol * np.abs(r)) & ~same_inf
    bad = (bad & ~(nan_g & nan_r)) | (nan_g != nan_r)
    if bad.any():
        flat = np.where(bad, np.nan_to_num(err, nan=np.inf, posinf=np.inf), -1.0)
        i = np.unravel_index(int(np.argmax(flat)), flat.shape) if flat.ndim else ()
        raise AssertionError(
            f"{what} ({dtype}, {kind}: {tol}): {int(bad.sum())} of {bad.size} element(s) out of tolerance; worst "
            f"at {tuple(map(int, i))}: got {g[i]!r}, reference {r[i]!r}, |diff| {err[i]:.3g}")
