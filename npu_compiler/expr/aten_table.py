"""Every ATen elementwise op, defined once as an expression over the primitives of `nodes`.

Type promotion is read from the IR, not re-derived: an arithmetic op casts its operands to the output dtype the
IR records and rounds its result to it (that is what ATen does on every device).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

from ..dtypes import HALF_DTYPES, is_float
from .nodes import Binary, Cast, Const, Expr, Load, Unary, Where

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


def round_scalar(value: float | int | bool, dtype: str) -> float | int | bool:
    """A Python scalar as ATen's TensorIterator uses it beside a tensor of `dtype`: converted to that dtype first
    (through fp32, as c10::Half and c10::BFloat16 are built from a float). `x_fp16 + 0.1` adds fp16(0.1), and
    `x_fp16 < 0.1` is True for x = fp16(0.1)."""
    if dtype not in HALF_DTYPES or not isinstance(value, float) or not math.isfinite(value):
        return value
    try:
        f = struct.unpack("<f", struct.pack("<f", value))[0]
        if dtype == "float16":
            return struct.unpack("<e", struct.pack("<e", f))[0]
    except OverflowError:
        return math.copysign(math.inf, value)
    bits = struct.unpack("<I", struct.pack("<f", f))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even on the upper 16 bits
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _bin(op: str, a: Expr, b: Expr, dtype: str) -> Expr:
    return Binary(dtype, op, a, b)


def _un(op: str, x: Expr) -> Expr:
    return Unary(x.dtype, op, x)


def _scalar(attrs: dict, name: str) -> float | int | bool | None:
    """The scalar the IR put in attrs under a Tensor arg's name (`add.Tensor {"other": 0.5}`), else None."""
    v = attrs.get(name)
    return v if isinstance(v, bool | int | float) else None


def _operand(ops: Operands, attrs: dict, i: int, name: str, dtype: str, round_to_dtype: bool = False) -> Expr:
    """The i-th tensor operand, or the scalar the IR put in attrs under the arg's name (rounded to `dtype` first
    where ATen does that: see `round_scalar`)."""
    v = _scalar(attrs, name)
    if v is not None:
        return const(round_scalar(v, dtype) if round_to_dtype else v, dtype)
    return cast(ops[i], dtype)


def _binary(op: str, scalar_alpha: bool = False, reverse: bool = False, round_scalars: bool = False) -> Builder:
    """`self op other` (reverse: `other op self`, rsub); with alpha, the operand that is not `self` in ATen's
    formula is scaled: add/sub compute self op alpha*other, rsub computes other - alpha*self.
    round_scalars: a scalar operand and alpha are rounded to the output dtype first, as ATen's CPU add/sub do (its
    mul and div keep the scalar's full value: they read the original scalar)."""

    def build(ops: Operands, attrs: dict, out: str) -> Expr:
        a = cast(ops[0], out)
        b = _operand(ops, attrs, 1, "other", out, round_scalars)
        alpha = attrs.get("alpha", 1)
        if reverse:
            a, b = b, a
        if scalar_alpha and alpha != 1:
            alpha_c = const(round_scalar(alpha, out) if round_scalars else alpha, out)
            b = _bin("mul", b, alpha_c, out)
        return _bin(op, a, b, out)

    return build


def _div_mode(ops: Operands, attrs: dict, out: str) -> Expr:
    mode = attrs.get("rounding_mode")
    if not is_float(out) and mode in ("trunc", "floor"):
        # Integer division in integer arithmetic (exact for all of int64; a float detour is not above 2^24):
        # `div` of integers truncates, floor steps down where the remainder is nonzero and the signs differ.
        a, b = cast(ops[0], "int64"), _operand(ops, attrs, 1, "other", "int64")
        q = _bin("div", a, b, "int64")
        if mode == "floor":
            r = _bin("sub", a, _bin("mul", q, b, "int64"), "int64")
            zero = const(0, "int64")
            step = _bin("and", _bin("ne", r, zero, "bool"),
                        _bin("ne", _bin("lt", r, zero, "bool"), _bin("lt", b, zero, "bool"), "bool"), "bool")
            q = Where("int64", step, _bin("sub", q, const(1, "int64"), "int64"), q)
        return cast(q, out)
    a = cast(ops[0], "float32") if not is_float(out) else cast(ops[0], out)
    b = _operand(ops, attrs, 1, "other", a.dtype)
    q = _bin("div", a, b, a.dtype)
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
    e = round_scalar(attrs["exponent"], out)  # ATen's pow rounds the exponent to a half dtype too
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
        # ATen's CPU kernel multiplies bf16 in bf16 (the square is rounded before the second product) and fp16 in
        # fp32 (one rounding): measured on every bf16/fp16 value pair, and what the conformance suite checks.
        sq = _bin("mul", x, x, out)
        return _bin("mul", Cast(out, sq) if out == "bfloat16" else sq, x, out)
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


def _category(dtype: str) -> int:
    return 0 if dtype == "bool" else 2 if is_float(dtype) else 1


def _compare(op: str) -> Builder:
    """Comparisons compute in the operands' common dtype (ATen's promotion): an integer tensor against 2.5 or
    against a float tensor compares as float, a bool mask against 2 as an integer; a scalar beside a half tensor
    is rounded to it first."""

    def build(ops: Operands, attrs: dict, out: str) -> Expr:
        a = ops[0]
        v = _scalar(attrs, "other")
        if v is not None:
            kind = 0 if isinstance(v, bool) else 2 if isinstance(v, float) else 1
            if kind > _category(a.dtype):
                a = cast(a, "float32" if kind == 2 else "int64")
            return _bin(op, a, const(round_scalar(v, a.dtype), a.dtype), "bool")
        b = ops[1]
        if _category(a.dtype) != _category(b.dtype):
            common = a.dtype if _category(a.dtype) > _category(b.dtype) else b.dtype
            a, b = cast(a, common), cast(b, common)
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
    "add.Tensor": _binary("add", scalar_alpha=True, round_scalars=True),
    "sub.Tensor": _binary("sub", scalar_alpha=True, round_scalars=True),
    "rsub.Scalar": _binary("sub", scalar_alpha=True, reverse=True, round_scalars=True),
    "rsub.Tensor": _binary("sub", scalar_alpha=True, reverse=True, round_scalars=True),
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
    "ne.Tensor": _compare("ne"),
    "lt.Tensor": _compare("lt"),
    "le.Scalar": _compare("le"),
    "le.Tensor": _compare("le"),
    "gt.Scalar": _compare("gt"),
    "gt.Tensor": _compare("gt"),
    "ge.Scalar": _compare("ge"),
    "ge.Tensor": _compare("ge"),
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


# Ops declared with their ATen schema next to their expression: adding an elementwise op is this one entry (the reader
# takes the schema from here to fill the defaults the IR leaves out; the lowering, op support and every backend's
# renderer follow from the expression).
ELEMENTWISE_SCHEMAS: dict[str, str] = {}


def _op(schema: str, builder: Builder) -> None:
    name = schema.split("(", 1)[0]
    ELEMENTWISE[name] = builder
    ELEMENTWISE_SCHEMAS[name] = schema


_op("leaky_relu.default(Tensor self, Scalar negative_slope=0.01) -> Tensor",
    lambda ops, attrs, out: Where(out, _bin("gt", cast(ops[0], out), const(0, out), "bool"), cast(ops[0], out),
                                  _bin("mul", cast(ops[0], out), const(attrs["negative_slope"], out), out)))


# Selection with scalar operands (transformers' mask building: `torch.where(mask, 0.0, min_value)`).
_op("where.ScalarOther(Tensor condition, Tensor self, Scalar other) -> Tensor", _where)
_op("where.ScalarSelf(Tensor condition, Scalar self, Tensor other) -> Tensor",
    lambda ops, attrs, out: Where(out, cast(ops[0], "bool"), const(attrs["self"], out), cast(ops[1], out)))
_op("where.Scalar(Tensor condition, Scalar self, Scalar other) -> Tensor",
    lambda ops, attrs, out: Where(out, cast(ops[0], "bool"), const(attrs["self"], out), const(attrs["other"], out)))
_op("masked_fill.Tensor(Tensor self, Tensor mask, Tensor value) -> Tensor",
    lambda ops, attrs, out: Where(out, cast(ops[1], "bool"), cast(ops[2], out), cast(ops[0], out)))


def _logic(op: str) -> Builder:
    """Logical and/or/xor: the operands as truth values (nonzero is true), a bool result."""

    def build(ops: Operands, attrs: dict, out: str) -> Expr:
        a, b = cast(ops[0], "bool"), cast(ops[1], "bool")
        return cast(_bin("ne" if op == "xor" else op, a, b, "bool"), out)

    return build


def _bitwise(op: str) -> Builder:
    """Bitwise and/or/xor of bool tensors (the masks transformers builds). Integer bitwise arithmetic has no primitive
    in the expression language: op support refuses integer operands (`op_support.unsupported_reason`), so those run
    on the CPU through the partition path."""

    def build(ops: Operands, attrs: dict, out: str) -> Expr:
        if out != "bool":
            raise ValueError(f"bitwise {op} of {out} tensors has no primitive (only bool operands lower)")
        return _logic(op)(ops, attrs, out)

    return build


def _bitwise_scalar(op: str) -> Builder:
    """A bool mask with a bool number (`mask & True`); integers have no bitwise primitive, as for `_bitwise`."""

    def build(ops: Operands, attrs: dict, out: str) -> Expr:
        if out != "bool":
            raise ValueError(f"bitwise {op} of {out} tensors has no primitive (only bool operands lower)")
        return _bin("ne" if op == "xor" else op, cast(ops[0], "bool"), const(bool(attrs["other"]), "bool"), "bool")

    return build


for _name, _logic_op in (("and", "and"), ("or", "or"), ("xor", "xor")):
    _op(f"logical_{_name}.default(Tensor self, Tensor other) -> Tensor", _logic(_logic_op))
    _op(f"bitwise_{_name}.Tensor(Tensor self, Tensor other) -> Tensor", _bitwise(_logic_op))
    _op(f"__{_name}__.Tensor(Tensor self, Tensor other) -> Tensor", _bitwise(_logic_op))
    _op(f"bitwise_{_name}.Scalar(Tensor self, Scalar other) -> Tensor", _bitwise_scalar(_logic_op))
    _op(f"__{_name}__.Scalar(Tensor self, Scalar other) -> Tensor", _bitwise_scalar(_logic_op))


def _bitwise_not(ops: Operands, attrs: dict, out: str) -> Expr:
    if out == "bool":
        return Unary("bool", "not", cast(ops[0], "bool"))
    if is_float(out):
        raise ValueError(f"bitwise_not of a {out} tensor (ATen refuses it too)")
    x = cast(ops[0], out)
    return _bin("sub", _un("neg", x), const(1, out), out)  # ~x == -x - 1 in two's complement, exactly


_op("bitwise_not.default(Tensor self) -> Tensor", _bitwise_not)


# Clamps with one bound, or with tensor bounds (max(x, lo) then min(., hi), as ATen's clamp kernels).
def _clamp_tensors(ops: Operands, attrs: dict, out: str) -> Expr:
    x = _bin("max", cast(ops[0], out), cast(ops[1], out), out)
    return _bin("min", x, cast(ops[2], out), out)


_op("clamp_min.default(Tensor self, Scalar min) -> Tensor", _clamp("min", "max"))
_op("clamp_max.default(Tensor self, Scalar max) -> Tensor", _clamp("min", "max"))
_op("clamp_min.Tensor(Tensor self, Tensor min) -> Tensor", _binary("max"))
_op("clamp_max.Tensor(Tensor self, Tensor max) -> Tensor", _binary("min"))
_op("clamp.Tensor(Tensor self, Tensor? min=None, Tensor? max=None) -> Tensor", _clamp_tensors)
_op("min.other(Tensor self, Tensor other) -> Tensor", _binary("min"))
_op("max.other(Tensor self, Tensor other) -> Tensor", _binary("max"))


# Rounding. floor and trunc are primitives; the rest are exact compositions (no rounding happens in them).
def _integral(build: Callable[[Expr], Expr]) -> Builder:
    """Rounding ops are the identity on integer tensors."""
    return lambda ops, attrs, out: cast(ops[0], out) if not is_float(out) else build(cast(ops[0], out))


def _round_half_even(x: Expr) -> Expr:
    """Round to the nearest integer, ties to even (C's nearbyint, which ATen uses). x - floor(x) is exact in binary
    floating point, so the comparisons with 0.5 are exact too."""
    dt = x.dtype
    f = _un("floor", x)
    d = _bin("sub", x, f, dt)
    one, half = const(1, dt), const(0.5, dt)
    up = _bin("add", f, one, dt)
    odd = _bin("ne", _bin("sub", f, _bin("mul", const(2, dt), _un("floor", _bin("mul", f, half, dt)), dt), dt),
               const(0, dt), "bool")
    tie = Where(dt, odd, up, f)
    return Where(dt, _bin("gt", d, half, "bool"), up, Where(dt, _bin("lt", d, half, "bool"), f, tie))


def _round_decimals(ops: Operands, attrs: dict, out: str) -> Expr:
    """ATen: nearbyint(x * 10^n) / 10^n, or nearbyint(x / 10^-n) * 10^-n for negative n, in fp32 for a half dtype
    (its opmath type; the result is rounded once)."""
    if not is_float(out):
        return cast(ops[0], out)
    f = "float32" if out in HALF_DTYPES else out
    x = cast(ops[0], f)
    n = int(attrs.get("decimals", 0))
    if n == 0:
        return _round_half_even(x)
    p = const(float(10 ** abs(n)), f)
    if n > 0:
        return _bin("div", _round_half_even(_bin("mul", x, p, f)), p, f)
    return _bin("mul", _round_half_even(_bin("div", x, p, f)), p, f)


_op("floor.default(Tensor self) -> Tensor", _integral(lambda x: _un("floor", x)))
_op("ceil.default(Tensor self) -> Tensor", _integral(lambda x: _un("neg", _un("floor", _un("neg", x)))))
_op("trunc.default(Tensor self) -> Tensor", _integral(lambda x: _un("trunc", x)))
_op("round.default(Tensor self) -> Tensor", _integral(_round_half_even))
_op("round.decimals(Tensor self, *, int decimals) -> Tensor", _round_decimals)


def _sign(ops: Operands, attrs: dict, out: str) -> Expr:
    """(0 < x) - (x < 0), as ATen computes it: 0 for zeros and for NaN."""
    x = cast(ops[0], out)
    if out == "bool":
        return x
    zero = const(0, out)
    return _bin("sub", cast(_bin("lt", zero, x, "bool"), out), cast(_bin("lt", x, zero, "bool"), out), out)


_op("sign.default(Tensor self) -> Tensor", _sign)


def _log1p(y: Expr) -> Expr:
    """log(1 + y) to a few ulps also where 1 + y rounds (Goldberg's correction: log(u) * y / (u - 1) with u = 1 + y);
    log1p is not a primitive of the expression language."""
    dt = y.dtype
    u = _bin("add", const(1, dt), y, dt)
    # (u = inf: log1p(inf) is inf, where the correction would divide inf by inf)
    return Where(dt, _bin("eq", u, const(1, dt), "bool"), y,
                 Where(dt, _bin("eq", u, const(math.inf, dt), "bool"), u,
                       _bin("div", _bin("mul", _un("log", u), y, dt), _bin("sub", u, const(1, dt), dt), dt)))


def _softplus(ops: Operands, attrs: dict, out: str) -> Expr:
    """x where x * beta > threshold, else log1p(exp(x * beta)) / beta, in fp32 for a half dtype (ATen's opmath)."""
    f = "float32" if out in HALF_DTYPES else out
    x = cast(ops[0], f)
    beta = const(attrs.get("beta", 1), f)
    bx = _bin("mul", x, beta, f)
    soft = _bin("div", _log1p(_un("exp", bx)), beta, f)
    return Where(f, _bin("gt", bx, const(attrs.get("threshold", 20), f), "bool"), x, soft)


_op("softplus.default(Tensor self, Scalar beta=1, Scalar threshold=20) -> Tensor", _softplus)


# Arithmetic with a Scalar `other` (the decomposed forms; `add.Tensor` takes a scalar in attrs the same way).
_op("add.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",
    _binary("add", scalar_alpha=True, round_scalars=True))
_op("sub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",
    _binary("sub", scalar_alpha=True, round_scalars=True))
_op("mul.Scalar(Tensor self, Scalar other) -> Tensor", _binary("mul"))
_op("div.Scalar(Tensor self, Scalar other) -> Tensor", _binary("div"))
_op("div.Scalar_mode(Tensor self, Scalar other, *, str? rounding_mode) -> Tensor", _div_mode)
_op("pow.Scalar(Scalar self, Tensor exponent) -> Tensor",
    lambda ops, attrs, out: _bin("pow", const(round_scalar(attrs["self"], out), out), cast(ops[0], out), out))
_op("copy.default(Tensor self, Tensor src, bool non_blocking=False) -> Tensor",
    lambda ops, attrs, out: cast(ops[1], out))


def _isnan(ops: Operands, attrs: dict, out: str) -> Expr:
    x = ops[0]
    return _bin("ne", x, x, "bool") if is_float(x.dtype) else const(False, "bool")


def _isinf(ops: Operands, attrs: dict, out: str) -> Expr:
    x = ops[0]
    return _bin("eq", _un("abs", x), const(math.inf, x.dtype), "bool") if is_float(x.dtype) else const(False, "bool")


_op("isnan.default(Tensor self) -> Tensor", _isnan)
_op("isinf.default(Tensor self) -> Tensor", _isinf)


def _opmath(out: str) -> str:
    """The dtype ATen computes a half op's math in (its opmath type)."""
    return "float32" if out in HALF_DTYPES else out


def _expm1(x: Expr) -> Expr:
    """exp(x) - 1 to a few ulps near 0 too (Kahan's correction: (u - 1) * x / log(u) with u = exp(x))."""
    dt = x.dtype
    u = _un("exp", x)
    um1 = _bin("sub", u, const(1, dt), dt)
    exact = Where(dt, _bin("eq", um1, const(-1, dt), "bool"), const(-1, dt),
                  _bin("div", _bin("mul", um1, x, dt), _un("log", u), dt))
    return Where(dt, _bin("eq", u, const(1, dt), "bool"), x, Where(dt, _bin("eq", u, const(math.inf, dt), "bool"), u,
                                                                   exact))


def _float_unary(fn: Callable[[Expr], Expr]) -> Builder:
    def build(ops: Operands, attrs: dict, out: str) -> Expr:
        f = _opmath(out)
        return fn(cast(ops[0], f))

    return build


_op("log1p.default(Tensor self) -> Tensor", _float_unary(lambda x: _log1p(x)))
_op("expm1.default(Tensor self) -> Tensor", _float_unary(_expm1))
_op("log2.default(Tensor self) -> Tensor",
    _float_unary(lambda x: _bin("mul", _un("log", x), const(1 / math.log(2), x.dtype), x.dtype)))
_op("log10.default(Tensor self) -> Tensor",
    _float_unary(lambda x: _bin("mul", _un("log", x), const(1 / math.log(10), x.dtype), x.dtype)))


def _elu(ops: Operands, attrs: dict, out: str) -> Expr:
    """x > 0 ? x * scale : expm1(x * input_scale) * alpha * scale (ATen's coefficients)."""
    f = _opmath(out)
    x = cast(ops[0], f)
    neg = _bin("mul", _expm1(_bin("mul", x, const(attrs.get("input_scale", 1), f), f)),
               const(float(attrs.get("alpha", 1)) * float(attrs.get("scale", 1)), f), f)
    return Where(f, _bin("le", x, const(0, f), "bool"), neg, _bin("mul", x, const(attrs.get("scale", 1), f), f))


_op("elu.default(Tensor self, Scalar alpha=1, Scalar scale=1, Scalar input_scale=1) -> Tensor", _elu)


# ---- trigonometric and hyperbolic functions ----------------------------------------------------------------------
# Compositions of the primitives in the opmath dtype (fp32 for halves), each within a few fp32 ulps: atan has no
# primitive, so it is Cephes' atanf (range reduction to |x| <= tan(pi/8), a degree-9 odd polynomial: 2e-7
# relative), and asin, acos and atan2 follow from it; sinh and cosh come from expm1 and exp with the large range
# taken as exp(|x| - ln 2), where exp(|x|) alone would overflow first.

_LN2 = math.log(2.0)


def _c(v: float, x: Expr) -> Expr:
    return const(v, x.dtype)


def _atan(x: Expr) -> Expr:
    dt = x.dtype
    a = _un("abs", x)
    big = _bin("gt", a, _c(2.414213562373095, x), "bool")  # tan(3 pi / 8)
    mid = _bin("gt", a, _c(0.4142135623730950, x), "bool")  # tan(pi / 8)
    r = Where(dt, big, _bin("div", _c(-1.0, x), a, dt),
              Where(dt, mid, _bin("div", _bin("sub", a, _c(1.0, x), dt), _bin("add", a, _c(1.0, x), dt), dt), a))
    y0 = Where(dt, big, _c(math.pi / 2, x), Where(dt, mid, _c(math.pi / 4, x), _c(0.0, x)))
    z = _bin("mul", r, r, dt)
    p = _c(8.05374449538e-2, x)
    for k in (-1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1):
        p = _bin("add", _bin("mul", p, z, dt), _c(k, x), dt)
    y = _bin("add", y0, _bin("add", _bin("mul", _bin("mul", p, z, dt), r, dt), r, dt), dt)
    return Where(dt, _bin("lt", x, _c(0.0, x), "bool"), _un("neg", y), y)


def _negative(x: Expr) -> Expr:
    """x < 0, or x is -0 (1 / -0 is -inf)."""
    zero = _c(0.0, x)
    return _bin("or", _bin("lt", x, zero, "bool"), _bin("and", _bin("eq", x, zero, "bool"),
                                                         _bin("lt", _bin("div", _c(1.0, x), x, x.dtype), zero, "bool"),
                                                         "bool"), "bool")


def _atan2(y: Expr, x: Expr) -> Expr:
    """atan(y / x) moved into x's half plane; the zeros and infinities as C's atan2 has them."""
    dt = y.dtype
    pi = _c(math.pi, y)
    y_neg, x_neg = _negative(y), _negative(x)
    q = _atan(_bin("div", y, x, dt))
    r = Where(dt, x_neg, Where(dt, y_neg, _bin("sub", q, pi, dt), _bin("add", q, pi, dt)), q)
    signed = lambda v: Where(dt, y_neg, _un("neg", v), v)  # noqa: E731
    zero = _c(0.0, y)
    inf = _c(math.inf, y)
    both_zero = _bin("and", _bin("eq", y, zero, "bool"), _bin("eq", x, zero, "bool"), "bool")
    both_inf = _bin("and", _bin("eq", _un("abs", y), inf, "bool"), _bin("eq", _un("abs", x), inf, "bool"), "bool")
    r = Where(dt, both_zero, Where(dt, x_neg, signed(pi), y), r)
    return Where(dt, both_inf, signed(Where(dt, x_neg, _c(3 * math.pi / 4, y), _c(math.pi / 4, y))), r)


def _one_minus_square_root(x: Expr) -> Expr:
    """sqrt(1 - x^2) as sqrt((1 - x)(1 + x)): no cancellation near |x| = 1."""
    one = _c(1.0, x)
    return _un("sqrt", _bin("mul", _bin("sub", one, x, x.dtype), _bin("add", one, x, x.dtype), x.dtype))


def _sinh(x: Expr) -> Expr:
    dt = x.dtype
    a = _un("abs", x)
    u = _expm1(a)
    small = _bin("mul", _c(0.5, x), _bin("add", u, _bin("div", u, _bin("add", u, _c(1.0, x), dt), dt), dt), dt)
    s = Where(dt, _bin("gt", a, _c(20.0, x), "bool"), _un("exp", _bin("sub", a, _c(_LN2, x), dt)), small)
    return Where(dt, _bin("lt", x, _c(0.0, x), "bool"), _un("neg", s), s)


def _cosh(x: Expr) -> Expr:
    dt = x.dtype
    a = _un("abs", x)
    e = _un("exp", a)
    small = _bin("mul", _c(0.5, x), _bin("add", e, _bin("div", _c(1.0, x), e, dt), dt), dt)
    return Where(dt, _bin("gt", a, _c(20.0, x), "bool"), _un("exp", _bin("sub", a, _c(_LN2, x), dt)), small)


def _asinh(x: Expr) -> Expr:
    """log1p(a + a^2 / (1 + sqrt(1 + a^2))) for a = |x| (log(a) + ln 2 where a^2 would overflow), signed."""
    dt = x.dtype
    a = _un("abs", x)
    one = _c(1.0, x)
    a2 = _bin("mul", a, a, dt)
    near = _log1p(_bin("add", a, _bin("div", a2, _bin("add", one, _un("sqrt", _bin("add", one, a2, dt)), dt), dt),
                       dt))
    r = Where(dt, _bin("gt", a, _c(2.0 ** 12, x), "bool"), _bin("add", _un("log", a), _c(_LN2, x), dt), near)
    return Where(dt, _bin("lt", x, _c(0.0, x), "bool"), _un("neg", r), r)


def _acosh(x: Expr) -> Expr:
    """log1p(t + sqrt(t (t + 2))) for t = x - 1 (NaN below 1), log(x) + ln 2 for large x."""
    dt = x.dtype
    t = _bin("sub", x, _c(1.0, x), dt)
    near = _log1p(_bin("add", t, _un("sqrt", _bin("mul", t, _bin("add", t, _c(2.0, x), dt), dt)), dt))
    return Where(dt, _bin("gt", x, _c(2.0 ** 12, x), "bool"), _bin("add", _un("log", x), _c(_LN2, x), dt), near)


def _atanh(x: Expr) -> Expr:
    dt = x.dtype
    return _bin("mul", _c(0.5, x), _log1p(_bin("div", _bin("mul", _c(2.0, x), x, dt),
                                                _bin("sub", _c(1.0, x), x, dt), dt)), dt)


_op("atan.default(Tensor self) -> Tensor", _float_unary(_atan))
_op("asin.default(Tensor self) -> Tensor", _float_unary(lambda x: _atan2(x, _one_minus_square_root(x))))
_op("acos.default(Tensor self) -> Tensor", _float_unary(lambda x: _atan2(_one_minus_square_root(x), x)))
_op("tan.default(Tensor self) -> Tensor",
    _float_unary(lambda x: _bin("div", _un("sin", x), _un("cos", x), x.dtype)))
_op("sinh.default(Tensor self) -> Tensor", _float_unary(_sinh))
_op("cosh.default(Tensor self) -> Tensor", _float_unary(_cosh))
_op("asinh.default(Tensor self) -> Tensor", _float_unary(_asinh))
_op("acosh.default(Tensor self) -> Tensor", _float_unary(_acosh))
_op("atanh.default(Tensor self) -> Tensor", _float_unary(_atanh))
_op("atan2.default(Tensor self, Tensor other) -> Tensor",
    lambda ops, attrs, out: _atan2(cast(ops[0], _opmath(out)), cast(ops[1], _opmath(out))))


# ---- activations and small arithmetic composites ------------------------------------------------------------------
# ATen's own formulas (aten/src/ATen/native/cpu/Activation.cpp, PointwiseOpsKernel.cpp), in the opmath dtype.


def _opmath_build(fn: Callable[..., Expr], n: int = 1) -> Builder:
    """`fn(*operands, attrs)` on the first n operands cast to the opmath dtype, rounded to the result."""

    def build(ops: Operands, attrs: dict, out: str) -> Expr:
        f = _opmath(out) if is_float(out) else out
        return fn(*[cast(ops[i], f) for i in range(n)], attrs)

    return build


def _relu_n(x: Expr, lo: float, hi: float) -> Expr:
    return _bin("min", _bin("max", x, _c(lo, x), x.dtype), _c(hi, x), x.dtype)


def _hardswish(x: Expr, attrs: dict) -> Expr:
    return _bin("div", _bin("mul", x, _relu_n(_bin("add", x, _c(3.0, x), x.dtype), 0.0, 6.0), x.dtype),
                _c(6.0, x), x.dtype)


def _mish(x: Expr, attrs: dict) -> Expr:
    return _bin("mul", x, _un("tanh", _log1p(_un("exp", x))), x.dtype)


def _log_sigmoid(x: Expr, attrs: dict) -> Expr:
    """min(x, 0) - log1p(exp(-|x|)): no overflow either way."""
    dt = x.dtype
    return _bin("sub", _bin("min", x, _c(0.0, x), dt), _log1p(_un("exp", _un("neg", _un("abs", x)))), dt)


def _shrink(hard: bool) -> Builder:
    """hardshrink takes lambda in the input's dtype (a half input's 0.6 is 0.60009765625), softshrink in fp32."""

    def build(ops: Operands, attrs: dict, out: str) -> Expr:
        f = _opmath(out)
        lam = float(attrs.get("lambd", 0.5))
        x, lam = cast(ops[0], f), float(round_scalar(lam, out)) if hard else lam
        low, high = _bin("lt", x, _c(-lam, x), "bool"), _bin("gt", x, _c(lam, x), "bool")
        if hard:
            return Where(f, _bin("or", low, high, "bool"), x, _c(0.0, x))
        return Where(f, high, _bin("sub", x, _c(lam, x), f), Where(f, low, _bin("add", x, _c(lam, x), f),
                                                                 _c(0.0, x)))
    return build


def _hypot(a: Expr, b: Expr, attrs: dict) -> Expr:
    """max * sqrt(1 + (min / max)^2), as C's hypot avoids overflow; inf where either is infinite."""
    dt = a.dtype
    aa, bb = _un("abs", a), _un("abs", b)
    hi, lo = _bin("max", aa, bb, dt), _bin("min", aa, bb, dt)
    r = _bin("div", lo, hi, dt)
    v = Where(dt, _bin("eq", hi, _c(0.0, a), "bool"), _c(0.0, a),
              _bin("mul", hi, _un("sqrt", _bin("add", _c(1.0, a), _bin("mul", r, r, dt), dt)), dt))
    inf = _bin("or", _bin("eq", aa, _c(math.inf, a), "bool"), _bin("eq", bb, _c(math.inf, a), "bool"), "bool")
    return Where(dt, inf, _c(math.inf, a), v)


def _xlogy(x: Expr, y: Expr, attrs: dict) -> Expr:
    dt = x.dtype
    return Where(dt, _bin("ne", y, y, "bool"), y, Where(dt, _bin("eq", x, _c(0.0, x), "bool"), _c(0.0, x),
                                                        _bin("mul", x, _un("log", y), dt)))


def _lerp(self: Expr, end: Expr, w: Expr, attrs: dict) -> Expr:
    """ATen's lerp: from self for a weight below 0.5, from end otherwise (exact at both ends)."""
    dt = self.dtype
    diff = _bin("sub", end, self, dt)
    return Where(dt, _bin("lt", _un("abs", w), _c(0.5, w), "bool"), _bin("add", self, _bin("mul", w, diff, dt), dt),
                 _bin("sub", end, _bin("mul", diff, _bin("sub", _c(1.0, w), w, dt), dt), dt))


def _finite_max(dtype: str) -> float:
    return {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}.get(dtype, 3.4028234663852886e38)


def _nan_to_num(ops: Operands, attrs: dict, out: str) -> Expr:
    x = cast(ops[0], out)
    if not is_float(out):
        return x
    big = _finite_max(out)
    nan = attrs.get("nan") if attrs.get("nan") is not None else 0.0
    pos = attrs.get("posinf") if attrs.get("posinf") is not None else big
    neg = attrs.get("neginf") if attrs.get("neginf") is not None else -big
    v = Where(out, _bin("eq", x, const(math.inf, out), "bool"), const(pos, out), x)
    v = Where(out, _bin("eq", x, const(-math.inf, out), "bool"), const(neg, out), v)
    return Where(out, _bin("ne", x, x, "bool"), const(nan, out), v)


def _logit(ops: Operands, attrs: dict, out: str) -> Expr:
    """ATen's kernel computes in the input's dtype, each step rounded to it: log(x / (1 - x)), x clamped to
    [eps, 1 - eps] first where eps is given."""
    f = _opmath(out)

    def step(op: str, a: Expr, b: Expr | None = None) -> Expr:
        v = _un(op, cast(a, f)) if b is None else _bin(op, cast(a, f), cast(b, f), f)
        return cast(v, out)

    x, one = cast(ops[0], out), const(1.0, out)
    eps = attrs.get("eps")
    if eps is not None:
        lo = const(round_scalar(float(eps), out), out)
        hi = step("sub", one, lo)
        x = Where(out, _bin("lt", x, lo, "bool"), lo, Where(out, _bin("gt", x, hi, "bool"), hi, x))
    return step("log", step("div", x, step("sub", one, x)))


def _addc(op: str) -> Builder:
    """self + value * t1 * t2 (addcmul) or self + value * (t1 / t2) (addcdiv)."""

    def build(ops: Operands, attrs: dict, out: str) -> Expr:
        f = _opmath(out) if is_float(out) else out
        s, a, b = (cast(ops[i], f) for i in range(3))
        v = const(attrs.get("value", 1), f)
        term = _bin("mul", _bin("mul", v, a, f), b, f) if op == "mul" else _bin("mul", v, _bin("div", a, b, f), f)
        return _bin("add", s, term, f)

    return build


_SELU = (1.6732632423543772848170429916717, 1.0507009873554804934193349852946)
_op("hardswish.default(Tensor self) -> Tensor", _opmath_build(_hardswish))
_op("hardsigmoid.default(Tensor self) -> Tensor",
    _opmath_build(lambda x, a: _bin("div", _relu_n(_bin("add", x, _c(3.0, x), x.dtype), 0.0, 6.0), _c(6.0, x),
                                    x.dtype)))
_op("relu6.default(Tensor self) -> Tensor", _opmath_build(lambda x, a: _relu_n(x, 0.0, 6.0)))
_op("mish.default(Tensor self) -> Tensor", _opmath_build(_mish))
_op("selu.default(Tensor self) -> Tensor",
    lambda ops, attrs, out: _elu(ops, {"alpha": _SELU[0], "scale": _SELU[1], "input_scale": 1}, out))
_op("celu.default(Tensor self, Scalar alpha=1.) -> Tensor",
    lambda ops, attrs, out: _elu(ops, {"alpha": attrs.get("alpha", 1.0), "scale": 1,
                                       "input_scale": 1.0 / float(attrs.get("alpha", 1.0))}, out))
_op("log_sigmoid.default(Tensor self) -> Tensor", _opmath_build(_log_sigmoid))
_op("hardshrink.default(Tensor self, Scalar lambd=0.5) -> Tensor", _shrink(True))
_op("softshrink.default(Tensor self, Scalar lambd=0.5) -> Tensor", _shrink(False))
_op("threshold.default(Tensor self, Scalar threshold, Scalar value) -> Tensor",
    lambda ops, attrs, out: Where(out, _bin("le", cast(ops[0], out), const(attrs["threshold"], out), "bool"),
                                  const(attrs["value"], out), cast(ops[0], out)))
_op("nan_to_num.default(Tensor self, float? nan=None, float? posinf=None, float? neginf=None) -> Tensor", _nan_to_num)
_op("addcmul.default(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor", _addc("mul"))
_op("addcdiv.default(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor", _addc("div"))
_op("lerp.Scalar(Tensor self, Tensor end, Scalar weight) -> Tensor",
    lambda ops, attrs, out: _lerp(cast(ops[0], _opmath(out)), cast(ops[1], _opmath(out)),
                                  const(attrs["weight"], _opmath(out)), attrs))
_op("lerp.Tensor(Tensor self, Tensor end, Tensor weight) -> Tensor", _opmath_build(_lerp, 3))
_op("logit.default(Tensor self, float? eps=None) -> Tensor", _logit)
_op("hypot.default(Tensor self, Tensor other) -> Tensor", _opmath_build(_hypot, 2))
_op("xlogy.Tensor(Tensor self, Tensor other) -> Tensor", _opmath_build(_xlogy, 2))
_op("exp2.default(Tensor self) -> Tensor",
    _opmath_build(lambda x, a: _bin("pow", _c(2.0, x), x, x.dtype)))


def _fmod_parts(ops: Operands, attrs: dict, out: str, scalar_self: bool = False) -> tuple[Expr, Expr, Expr, str]:
    """(a, b, fmod(a, b), the dtype computed in): C's fmod, the remainder of a division truncated toward zero, in
    integer arithmetic for integers (exact) and in fp32 for floats (one rounding of the product, well inside the
    elementwise tolerance while |a / b| stays far below 2^24)."""
    f = _opmath(out) if is_float(out) else "int64"
    a = const(round_scalar(attrs["self"], out), f) if scalar_self else cast(ops[0], f)
    b = _operand(ops, attrs, 0 if scalar_self else 1, "other", f, round_to_dtype=is_float(out))
    if not is_float(out):
        return a, b, _bin("sub", a, _bin("mul", _bin("div", a, b, f), b, f), f), f
    return a, b, _bin("sub", a, _bin("mul", _un("trunc", _bin("div", a, b, f)), b, f), f), f


def _fmod(ops: Operands, attrs: dict, out: str) -> Expr:
    return cast(_fmod_parts(ops, attrs, out)[2], out)


def _remainder(scalar_self: bool = False) -> Builder:
    """Python's %: fmod moved by b where it is nonzero and its sign differs from b's."""

    def build(ops: Operands, attrs: dict, out: str) -> Expr:
        a, b, r, f = _fmod_parts(ops, attrs, out, scalar_self)
        zero = const(0, f)
        move = _bin("and", _bin("ne", r, zero, "bool"), _bin("ne", _bin("lt", r, zero, "bool"),
                                                              _bin("lt", b, zero, "bool"), "bool"), "bool")
        return cast(Where(f, move, _bin("add", r, b, f), r), out)

    return build


_op("fmod.Tensor(Tensor self, Tensor other) -> Tensor", _fmod)
_op("fmod.Scalar(Tensor self, Scalar other) -> Tensor", _fmod)
_op("remainder.Tensor(Tensor self, Tensor other) -> Tensor", _remainder())
_op("remainder.Scalar(Tensor self, Scalar other) -> Tensor", _remainder())
_op("remainder.Scalar_Tensor(Scalar self, Tensor other) -> Tensor", _remainder(scalar_self=True))
_op("floor_divide.default(Tensor self, Tensor other) -> Tensor",
    lambda ops, attrs, out: _div_mode(ops, {**attrs, "rounding_mode": "floor"}, out))
_op("floor_divide.Scalar(Tensor self, Scalar other) -> Tensor",
    lambda ops, attrs, out: _div_mode(ops, {**attrs, "rounding_mode": "floor"}, out))


def build_elementwise(op: str, operands: Operands, attrs: dict, out_dtype: str) -> Expr:
    """The expression of one ATen op, its result rounded to the IR's output dtype."""
    e = cast(ELEMENTWISE[op](operands, attrs, out_dtype), out_dtype)
    if out_dtype in HALF_DTYPES and not isinstance(e, Load | Cast):
        # A half-typed expression lives in an fp32 register; only a store or a Cast rounds it. When a consumer
        # inlines this op (fusion) there is no store, so round here: the fused chain then gives the op-by-op bits.
        e = Cast(out_dtype, e)
    return e
