"""The reference semantics of expressions: an interpreter that turns an expression tree into closures over NumPy
arrays (no source text, nothing executed but the closures built here).

Registers follow the renderers: every float computes in fp32 (fp64 stays fp64), every integer in int64, bools as
bool; a `Cast` to a half dtype rounds through it and back. All values live in one rank: the output dims followed
by the reduction dims, each value sized 1 along the dims it does not depend on, so NumPy broadcasting lines them up
and a reduction is a sum or max over the trailing dims.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..dtypes import HALF_DTYPES
from ..errors import KernelFault
from . import nodes as X

_REG = {"float32": np.float32, "float16": np.float32, "bfloat16": np.float32, "float64": np.float64,
        "bool": np.bool_}


def reg(dtype: str) -> type:
    """The NumPy register type a value of `dtype` computes in."""
    return _REG.get(dtype, np.int64)


def np_storage(dtype: str) -> np.dtype:
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


_HALF_NP = {np.dtype(np.float16), np_storage("bfloat16")}


def up(a: np.ndarray) -> np.ndarray:
    """A stored array in its register type: halves compute in fp32, integers in int64."""
    if a.dtype in _HALF_NP:
        return a.astype(np.float32)
    if a.dtype.kind in "iu" and a.dtype != np.int64:
        return a.astype(np.int64)
    return a


def cast(x, dtype: str):
    """`Cast` semantics: halves round through their storage type; floats to integers truncate."""
    x = np.asarray(x)
    if dtype in HALF_DTYPES:
        return x.astype(np.float32).astype(np_storage(dtype)).astype(np.float32)
    if dtype == "float32":
        return x.astype(np.float32)
    if dtype == "float64":
        return x.astype(np.float64)
    if dtype == "bool":
        return x.astype(np.bool_)
    if x.dtype.kind == "f":
        x = np.trunc(x)
    return x.astype(np.int64)


def store(out: np.ndarray, r) -> None:
    """Write register values to a stored array, rounding to its dtype (halves from fp32)."""
    r = np.asarray(r)
    if out.dtype in _HALF_NP and r.dtype != np.float32:
        r = r.astype(np.float32)
    np.copyto(out, r.astype(out.dtype, copy=False), casting="unsafe")


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


def _pow(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        # NumPy refuses negative integer exponents; C integer powers give 1, -1 or 0 there.
        neg = b < 0
        safe = np.power(a, np.where(neg, 0, b))
        frac = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0))
        return np.where(neg, frac, safe)
    return np.power(a, b)


def erf(x):
    """erf in fp32 accuracy (|error| < 1.2e-7): Numerical Recipes' erfc Chebyshev fit, vectorised."""
    x = np.asarray(x, dtype=np.float64)
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    erfc = t * np.exp(poly)
    return np.where(x >= 0, 1.0 - erfc, erfc - 1.0).astype(np.float32)


def _int_identity(a):
    return a


UNARY: dict[str, Callable] = {
    "neg": np.negative, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda a: 1.0 / np.sqrt(a),
    "sin": np.sin, "cos": np.cos, "tanh": np.tanh, "erf": erf, "abs": np.abs, "not": np.logical_not,
    "floor": np.floor, "trunc": np.trunc,
}
ARITH: dict[str, Callable] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _div, "max": np.maximum, "min": np.minimum,
    "pow": _pow,
}
COMPARE: dict[str, Callable] = {
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "and": np.logical_and, "or": np.logical_or,
}


class Evaluator:
    """One expression bound to the arrays it reads: `evaluate(acc)` returns its value for every output element
    (shaped `out_shape`); `acc` is the GEMM/conv result in an epilogue (a sequence of them, one per group, where the
    epilogue reads `Acc` groups)."""

    def __init__(self, expr: X.Expr, out_shape: Sequence[int], reduce_shape: Sequence[int],
                 args: Sequence[np.ndarray]) -> None:
        self.out_shape = tuple(out_shape)
        self.reduce_shape = tuple(reduce_shape)
        self.rank = len(self.out_shape) + len(self.reduce_shape)
        self.red_axes = tuple(range(len(self.out_shape), self.rank))
        self.args = list(args)
        self.steps: list[tuple[Callable, tuple[int, ...]]] = []
        self.acc_slots: dict[int, int] = {}  # slot -> Acc group
        slots: dict[int, int] = {}
        keys: dict[tuple, int] = {}
        for node in X.walk(expr):
            kids = tuple(slots[id(c)] for c in X.children(node))
            key = _key(node, kids)
            if key in keys:
                slots[id(node)] = keys[key]
                continue
            slot = len(self.steps)
            self.steps.append((self._build(node), kids))
            keys[key] = slot
            slots[id(node)] = slot
            if isinstance(node, X.Acc):
                self.acc_slots[slot] = node.group
        self.result = slots[id(expr)]

    # ---- building ------------------------------------------------------------------------------------------------
    def _shape_at(self, dim: int, n: int) -> tuple[int, ...]:
        return tuple(n if d == dim else 1 for d in range(self.rank))

    def _build(self, e: X.Expr) -> Callable:
        if isinstance(e, X.Load):
            return self._load(e)
        if isinstance(e, X.Gather):
            return self._gather(e)
        if isinstance(e, X.Const):
            value = reg(e.dtype)(e.value)
            return lambda: value
        if isinstance(e, X.Index):
            n = self.out_shape[e.dim]
            iota = np.arange(n, dtype=np.int64).reshape(self._shape_at(e.dim, n))
            return lambda: iota
        if isinstance(e, X.RIndex):
            n = self.reduce_shape[e.dim]
            iota = np.arange(n, dtype=np.int64).reshape(self._shape_at(len(self.out_shape) + e.dim, n))
            return lambda: iota
        if isinstance(e, X.Acc):
            return lambda: None  # bound per evaluation
        if isinstance(e, X.Unary):
            fn = UNARY[e.op]
            if e.op in ("floor", "trunc") and reg(e.dtype) is np.int64:
                fn = _int_identity
            return fn
        if isinstance(e, X.Binary):
            if e.op in COMPARE:
                return COMPARE[e.op]
            fn, t = ARITH[e.op], reg(e.dtype)
            return lambda a, b: _as(fn(a, b), t)
        if isinstance(e, X.Where):
            return lambda c, a, b: np.where(c, a, b)
        if isinstance(e, X.Cast):
            dt = e.dtype
            return lambda x: cast(x, dt)
        if isinstance(e, X.Reduce):
            return self._reduce(e)
        raise TypeError(f"not an expression node: {e!r}")

    def _load(self, e: X.Load) -> Callable:
        flat = self.args[e.arg]
        sizes = list(self.out_shape) + (list(self.reduce_shape) if e.rstrides else [1] * len(self.reduce_shape))
        strides = list(e.strides) + (list(e.rstrides) if e.rstrides else [0] * len(self.reduce_shape))
        if any(n == 0 for n in sizes):
            view = np.zeros(tuple(0 if n == 0 else 1 for n in sizes), flat.dtype)
        else:
            # A dim the load does not move along is size 1: broadcasting stands in for the repeat.
            shape = tuple(n if s else 1 for n, s in zip(sizes, strides))
            view = as_strided(flat[e.offset:], shape=shape, strides=tuple(s * flat.itemsize for s in strides),
                              writeable=False)
        return lambda: up(view)

    def _gather(self, e: X.Gather) -> Callable:
        flat = self.args[e.arg]
        shape, strides, offset = tuple(e.shape), tuple(e.strides), e.offset
        nd = len(shape)
        has_guard = e.guard is not None
        fill = reg(e.dtype)(e.fill)

        def gather(*vals):
            idx = [np.asarray(v) for v in vals[:nd]]
            ok = np.ones((), bool)
            for d, i in enumerate(idx):
                ok = ok & (i >= 0) & (i < shape[d])
            take = ok & vals[nd] if has_guard else ok
            bad = ~ok & vals[nd] if has_guard else ~ok
            if np.any(bad):
                shp = np.broadcast(*idx, bad).shape
                where_bad = np.broadcast_to(bad, shp)
                for d, i in enumerate(idx):
                    seen = np.broadcast_to(i, shp)[where_bad]
                    wrong = seen[(seen < 0) | (seen >= shape[d])]
                    if wrong.size:
                        raise KernelFault(f"index {int(wrong.flat[0])} out of range [0, {shape[d]}) along dim {d} "
                                          "of a gather")
            addr = offset
            for d, i in enumerate(idx):
                addr = addr + np.where(take, i, 0) * strides[d]
            v = up(flat[np.asarray(addr)])
            return np.where(take, v, fill)

        return gather

    def _reduce(self, e: X.Reduce) -> Callable:
        axes, red, n_out = self.red_axes, self.reduce_shape, len(self.out_shape)
        t = reg(e.dtype)
        rank = self.rank

        def full(b):
            b = np.asarray(b)
            if b.ndim < rank:
                b = b.reshape((1,) * (rank - b.ndim) + b.shape)
            return np.broadcast_to(b, b.shape[:n_out] + red)

        if e.op == "sum":
            return lambda b: np.sum(full(b), axis=axes, dtype=t, keepdims=True)
        return lambda b: np.max(full(b), axis=axes, keepdims=True)

    # ---- running --------------------------------------------------------------------------------------------------
    def evaluate(self, acc: np.ndarray | Sequence[np.ndarray] | None = None):
        groups = acc if isinstance(acc, list | tuple) else [acc]
        vals: list = [None] * len(self.steps)
        for i, (fn, kids) in enumerate(self.steps):
            if i in self.acc_slots:
                vals[i] = groups[self.acc_slots[i]]
            else:
                vals[i] = fn(*[vals[k] for k in kids])
        return self.shaped(vals[self.result])

    def shaped(self, value) -> np.ndarray:
        """A value of the common rank as an array of `out_shape` (a broadcast view where it repeats)."""
        v = np.asarray(value)
        if v.ndim < self.rank:
            v = v.reshape((1,) * (self.rank - v.ndim) + v.shape)
        v = np.broadcast_to(v, self.out_shape + v.shape[len(self.out_shape):])
        return v.reshape(self.out_shape) if self.reduce_shape else v


def _key(node: X.Expr, kids: tuple[int, ...]) -> tuple:
    """A structural key: equal keys compute equal values (constants keyed by their repr, so 0.0 and -0.0 differ)."""
    fields = []
    for name in node.__dataclass_fields__:
        v = getattr(node, name)
        if isinstance(v, X.Expr) or (isinstance(v, tuple) and v and all(isinstance(x, X.Expr) for x in v)):
            continue
        fields.append(repr(v) if isinstance(v, float) else v)
    return (type(node).__name__, *fields, kids)


def dtype_name(dt: np.dtype) -> str:
    """The IR's name of a NumPy storage dtype (bf16 through ml_dtypes)."""
    dt = np.dtype(dt)
    if dt == np_storage("bfloat16"):
        return "bfloat16"
    return "bool" if dt == np.bool_ else dt.name


def round_to(x: np.ndarray, dtype: str | None) -> np.ndarray:
    """fp32 values rounded to a half dtype and back (where the IR stores an intermediate in that dtype); other
    dtypes leave them as they are."""
    if dtype not in HALF_DTYPES:
        return x
    return x.astype(np_storage(dtype)).astype(np.float32)
