"""The runtime side of the CPU target's generated kernels: the helpers their NumPy source calls."""

from __future__ import annotations

import numpy as np

from ..dtypes import np_dtype

_HALF = {np.dtype(np.float16), np_dtype("bfloat16")}


def _up(a: np.ndarray) -> np.ndarray:
    """Load into registers: halves compute in fp32, integers in int64."""
    if a.dtype in _HALF:
        return a.astype(np.float32)
    if a.dtype.kind in "iu" and a.dtype != np.int64:
        return a.astype(np.int64)
    return a


def _cast(x, dtype: str):
    x = np.asarray(x)
    if dtype in ("float16", "bfloat16"):
        return x.astype(np.float32).astype(np_dtype(dtype)).astype(np.float32)
    if dtype == "float32":
        return x.astype(np.float32)
    if dtype == "float64":
        return x.astype(np.float64)
    if dtype == "bool":
        return x.astype(np.bool_)
    if x.dtype.kind == "f":
        x = np.trunc(x)
    return x.astype(np.int64)


def _as(x, t):
    x = np.asarray(x)
    return x if x.dtype == t else x.astype(t)


def _div(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        # Integer division truncates (C semantics, as on the other targets), exactly over all of int64: a float
        # detour would round quotients above 2^53.
        q = np.floor_divide(a, b)
        return q + ((q * b != a) & ((a < 0) != (b < 0)))
    return np.true_divide(a, b)


def _maximum(a, b):
    return np.maximum(a, b)


def _minimum(a, b):
    return np.minimum(a, b)


def _erf(x):
    """erf in fp32 accuracy (|error| < 1.2e-7): Numerical Recipes' erfc Chebyshev fit, vectorised."""
    x = np.asarray(x, dtype=np.float64)
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    erfc = t * np.exp(poly)
    return np.where(x >= 0, 1.0 - erfc, erfc - 1.0).astype(np.float32)


def _store(out: np.ndarray, r) -> None:
    r = np.asarray(r)
    if out.dtype in _HALF and r.dtype != np.float32:
        r = r.astype(np.float32)
    np.copyto(out, r.astype(out.dtype, copy=False), casting="unsafe")


NAMESPACE = {"np": np, "_up": _up, "_cast": _cast, "_as": _as, "_div": _div, "_maximum": _maximum,
             "_minimum": _minimum, "_erf": _erf, "_store": _store}


def compile_source(text: str):
    ns = dict(NAMESPACE)
    exec(compile(text, "<npusim-generated>", "exec"), ns)  # noqa: S102 - our own rendered source
    return ns["kernel"]
