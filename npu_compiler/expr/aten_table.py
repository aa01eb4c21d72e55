"""Every ATen elementwise op, defined once as an expression over the primitives of `nodes`.

Type promotion is read from the IR, not re-derived: an arithmetic op casts its operands to the output dtype the
IR records and rounds its result to it (that is what ATen does on every device).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..dtypes import is_float
from .nodes import Binary, Cast, Const, Expr, Unary, Where

Operands = list[Expr]
Builder = Callable[[Operands, dict, str], Expr]


def const(value: float | int | bool, dtype: str) -> Const:
    if dtype == "bool":
        return Const(dtype, bool(value))
    if is_float(dtype):
        return Const(dtype, float(value))
    return Const(dtype, int(value))


def cast(x: Expr, dtype: str) -> Expr:
    if x.dtype == dtype:
        return x
    if isinstance(x, Const):
        return const(x.value, dtype)
    return Cast(dtype, x)


def _bin(op: str, a: Expr, b: Expr, dtype: str) -> Expr:
    return Binary(dtype, op, a, b)


def _un(op: str, x: Expr) -> Expr:
    return Unary(x.dtype, op, x)


def _operand(ops: Operands, attrs: dict, i: int, name: str, dtype: str) -> Expr:
    """The i-th tensor operand, or the scalar the IR put in attrs under the arg's name."""
    if name in attrs and attrs[name] is not None and not isinstance(attrs[name], list | dict):
        return const(attrs[name], dtype)
    return cast(ops[i], dtype)


def _binary(op: str, scalar_alpha: bool = False, reverse: bool = False) -> Builder:
    def build(ops: Operands, attrs: dict, out: str) -> Expr:
        a = cast(ops[0], out)
        b = _operand(ops, attrs, 1, "other", out)
        if scalar_alpha and attrs.get("alpha", 1) != 1:
            b = _bin("mul", b, const(attrs["alpha"], out), out)
        if reverse:
            a, b = b, a
        return _bin(op, a, b, out)

    return build


def _div_mode(ops: Operands, attrs: dict, out: str) -> Expr:
    a = cast(ops[0], "float32") if not is_float(out) else cast(ops[0], out)
    b = _operand(ops, attrs, 1, "other", a.dtype)
    q = _bin("div", a, b, a.dtype)
    mode = attrs.get("rounding_mode")
    if mode == "trunc":
        q = _un("trunc", q)
    elif mode == "floor":
        q = _un("floor", q)
    return cast(q, out)


def _unary(op: str) -> Builder:
    return lambda ops, attrs, out: _un(op, cast(ops[0], out))


def _sigmoid(x: Expr) -> Expr:
    one = const(1.0, x.dtype)
    return _bin("div", one, _bin("add", one, _un("exp", _un("neg", x)), x.dtype), x.dtype)


def _silu(ops: Operands, attrs: dict, out: str) -> Expr:
    x = cast(ops[0], out)
    return _bin("mul", x, _sigmoid(x), out)


def _gelu(ops: Operands, attrs: dict, out: str) -> Expr:
    x = cast(ops[0], out)
    half, one = const(0.5, out), const(1.0, out)
    if attrs.get("approximate", "none") == "tanh":
        inner = _bin("mul", const(math.sqrt(2 / math.pi), out),
                     _bin("add", x, _bin("mul", const(0.044715, out), _bin("mul", x, _bin("mul", x, x, out), out),
                                         out), out), out)
        return _bin("mul", _bin("mul", half, x, out), _bin("add", one, _un("tanh", inner), out), out)
    erf = _un("erf", _bin("mul", x, const(1 / math.sqrt(2), out), out))
    return _bin("mul", _bin("mul", half, x, out), _bin("add", one, erf, out), out)


def _pow_scalar(ops: Operands, attrs: dict, out: str) -> Expr:
    x = cast(ops[0], out)
    e = attrs["exponent"]
    # Exact rewrites ATen itself uses for these exponents (x*x is also what the CPU and CUDA kernels compute).
    if e == 2:
        return _bin("mul", x, x, out)
    if e == 1:
        return x
    if e == 0.5:
        return _un("sqrt", x)
    if e == -0.5:
        return _un("rsqrt", x)
    if e == -1:
        return _bin("div", const(1, out), x, out)
    if e == 3:
        return _bin("mul", _bin("mul", x, x, out), x, out)
    return _bin("pow", x, const(e, out), out)


def _relu(ops: Operands, attrs: dict, out: str) -> Expr:
    x = cast(ops[0], out)
    return _bin("max", x, const(0, out), out)


def _clamp(lo_key: str, hi_key: str) -> Builder:
    def build(ops: Operands, attrs: dict, out: str) -> Expr:
        x = cast(ops[0], out)
        if attrs.get(lo_key) is not None:
            x = _bin("max", x, const(attrs[lo_key], out), out)
        if attrs.get(hi_key) is not None:
            x = _bin("min", x, const(attrs[hi_key], out), out)
        return x

    return build


def _compare(op: str) -> Builder:
    def build(ops: Operands, attrs: dict, out: str) -> Expr:
        a = ops[0]
        b = _operand(ops, attrs, 1, "other", a.dtype)
        if is_float(a.dtype) != is_float(b.dtype):
            ft = a.dtype if is_float(a.dtype) else b.dtype
            a, b = cast(a, ft), cast(b, ft)
        return _bin(op, a, b, "bool")

    return build


def _where(ops: Operands, attrs: dict, out: str) -> Expr:
    return Where(out, cast(ops[0], "bool"), cast(ops[1], out), _operand(ops, attrs, 2, "other", out))


def _masked_fill(ops: Operands, attrs: dict, out: str) -> Expr:
    return Where(out, cast(ops[1], "bool"), const(attrs["value"], out), cast(ops[0], out))


def _to(ops: Operands, attrs: dict, out: str) -> Expr:
    return cast(ops[0], out)


def _batch_norm_eval(ops: Operands, attrs: dict, out: str) -> Expr:
    """(x - mean) * rsqrt(var + eps) * w + b, with fp32 statistics as ATen keeps them."""
    x, w, b, mean, var = ops
    f = "float32"
    inv = _un("rsqrt", _bin("add", cast(var, f), const(attrs["eps"], f), f))
    y = _bin("mul", _bin("sub", cast(x, f), cast(mean, f), f), inv, f)
    y = _bin("add", _bin("mul", y, cast(w, f), f), cast(b, f), f)
    return cast(y, out)


ELEMENTWISE: dict[str, Builder] = {
    "add.Tensor": _binary("add", scalar_alpha=True),
    "sub.Tensor": _binary("sub", scalar_alpha=True),
    "rsub.Scalar": _binary("sub", scalar_alpha=True, reverse=True),
    "rsub.Tensor": _binary("sub", scalar_alpha=True, reverse=True),
    "mul.Tensor": _binary("mul"),
    "div.Tensor": _binary("div"),
    "div.Tensor_mode": _div_mode,
    "maximum.default": _binary("max"),
    "minimum.default": _binary("min"),
    "pow.Tensor_Scalar": _pow_scalar,
    "pow.Tensor_Tensor": lambda ops, attrs, out: _bin("pow", cast(ops[0], out), cast(ops[1], out), out),
    "neg.default": _unary("neg"),
    "rsqrt.default": _unary("rsqrt"),
    "sqrt.default": _unary("sqrt"),
    "exp.default": _unary("exp"),
    "log.default": _unary("log"),
    "sin.default": _unary("sin"),
    "cos.default": _unary("cos"),
    "tanh.default": _unary("tanh"),
    "erf.default": _unary("erf"),
    "abs.default": _unary("abs"),
    "reciprocal.default": lambda ops, attrs, out: _bin("div", const(1, out), cast(ops[0], out), out),
    "sigmoid.default": lambda ops, attrs, out: _sigmoid(cast(ops[0], out)),
    "silu.default": _silu,
    "gelu.default": _gelu,
    "relu.default": _relu,
    "hardtanh.default": _clamp("min_val", "max_val"),
    "clamp.default": _clamp("min", "max"),
    "where.self": _where,
    "masked_fill.Scalar": _masked_fill,
    "eq.Scalar": _compare("eq"),
    "eq.Tensor": _compare("eq"),
    "ne.Scalar": _compare("ne"),
    "lt.Scalar": _compare("lt"),
    "lt.Tensor": _compare("lt"),
    "le.Scalar": _compare("le"),
    "gt.Scalar": _compare("gt"),
    "gt.Tensor": _compare("gt"),
    "ge.Scalar": _compare("ge"),
    "logical_not.default": lambda ops, attrs, out: Unary("bool", "not", cast(ops[0], "bool")),
    "to.dtype": _to,
    "to.device": _to,
    "to.dtype_layout": _to,
    "_to_copy.default": _to,
    "type_as.default": _to,
    "clone.default": _to,
    "batch_norm.default": _batch_norm_eval,
    "_native_batch_norm_legit_no_training.default": _batch_norm_eval,
}


def build_elementwise(op: str, operands: Operands, attrs: dict, out_dtype: str) -> Expr:
    """The expression of one ATen op, its result rounded to the IR's output dtype."""
    return cast(ELEMENTWISE[op](operands, attrs, out_dtype), out_dtype)
