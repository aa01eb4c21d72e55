"""Rules of elementwise ops: arithmetic, comparisons, activations, casts and identities."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ...dtypes import FLOAT_DTYPES, INT_DTYPES, ITEMSIZE
from ..graph import Node, TensorType, Value
from .core import (
    InferError,
    Operand,
    _fill_fits,
    _float_of,
    _need_float,
    _same,
    _scalar_dtype,
    _scalar_fits,
    _wrapped_scalar_fits,
    broadcast,
    infers,
    operand,
    representable,
    result_type,
    tensor,
)


def _shape_of(*ops: Operand) -> tuple[int, ...]:
    return broadcast(*[x.shape for x in ops if isinstance(x, Value)])


def _binary_ops(node: Node, names: tuple[str, ...] = ("self", "other")) -> list[Operand]:
    ops = [operand(node, i, n) for i, n in enumerate(names)]
    missing = [n for n, x in zip(names, ops) if x is None]
    if missing:
        raise InferError(f"operand '{missing[0]}' is neither an input nor a scalar attribute")
    if len(node.inputs) > len(names):
        raise InferError(f"takes {len(names)} operands, got {len(node.inputs)} inputs")
    return ops


@infers("add.Tensor", "sub.Tensor", "mul.Tensor", "maximum.default", "minimum.default", "rsub.Tensor",
        "pow.Tensor_Tensor", "max.other", "min.other")
def _arith(node: Node) -> list[TensorType]:
    ops = _binary_ops(node, ("self", "exponent") if node.op == "pow.Tensor_Tensor" else ("self", "other"))
    dt = result_type(*ops)
    if node.op in ("sub.Tensor", "rsub.Tensor"):
        _no_bool_subtraction(ops)
    if node.op == "pow.Tensor_Tensor" and dt == "bool":
        raise InferError("pow of bool tensors is not supported")
    _check_alpha(node, dt)
    return [TensorType(_shape_of(*ops), dt)]


def _check_alpha(node: Node, dt: str) -> None:
    alpha = node.attrs.get("alpha", 1)
    if alpha != 1 and dt not in FLOAT_DTYPES and isinstance(alpha, float):
        raise InferError(f"alpha {alpha!r} is a float, but the result is {dt}")
    _scalar_fits(node, ("alpha",), dt)


def _no_bool_subtraction(ops: Sequence[Operand]) -> None:
    """ATen's sub_check: no operand of a subtraction may be bool (a tensor or a number)."""
    if any((x.dtype if isinstance(x, Value) else _scalar_dtype(x)) == "bool" for x in ops if x is not None):
        raise InferError("subtraction with a bool operand is not supported (use logical_not or logical_xor)")


@infers("rsub.Scalar")
def _rsub_scalar(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    _no_bool_subtraction([x, node.attrs["other"]])
    dt = result_type(x, node.attrs["other"])
    _scalar_fits(node, ("alpha",), dt)
    return _same(x, dt)


@infers("div.Tensor", "atan2.default")
def _div(node: Node) -> list[TensorType]:
    ops = _binary_ops(node)
    return [TensorType(_shape_of(*ops), _float_of(result_type(*ops)))]


@infers("div.Tensor_mode")
def _div_mode(node: Node) -> list[TensorType]:
    ops = _binary_ops(node)
    dt = result_type(*ops)
    if node.attrs.get("rounding_mode") is None:
        dt = _float_of(dt)
    elif dt == "bool":
        raise InferError("integer division of bool tensors is not supported")
    elif dt not in FLOAT_DTYPES and not isinstance(ops[1], Value) and isinstance(ops[0], Value) and ops[0].type.numel:
        _integer_divisor(ops[1], dt)
    return [TensorType(_shape_of(*ops), dt)]


def _integer_divisor(other: bool | int, dt: str) -> None:
    """ATen converts a number divisor into the integer dtype unchecked: one that wraps to 0 (2**40 into int32)
    divides by zero."""
    if int(other) % (1 << 8 * ITEMSIZE[dt]) == 0:
        wraps = "" if other == 0 else f", which wraps to 0 in {dt}"
        raise InferError(f"integer division by zero ({dt} divided by {other!r}{wraps})")


@infers("pow.Tensor_Scalar")
def _pow_scalar(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    e = node.attrs["exponent"]
    dt = result_type(x, e)
    if dt not in ("float32", "float64"):  # ATen keeps the exponent in double for fp32/fp64, else in the dtype
        _scalar_fits(node, ("exponent",), dt)
    if dt in INT_DTYPES and isinstance(e, int) and e < 0:
        raise InferError(f"integers cannot be raised to the negative power {e}")
    return _same(x, dt)


@infers("neg.default")
def _neg(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if x.dtype == "bool":
        raise InferError("negating a bool tensor is not supported (use logical_not)")
    return _same(x)


@infers("abs.default", "relu.default", "positive.default")
def _same_non_bool(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if x.dtype == "bool":
        raise InferError(f"{node.op} of a bool tensor is not supported")
    return _same(x)


@infers("rsqrt.default", "sqrt.default", "exp.default", "log.default", "sin.default", "cos.default", "tanh.default",
        "sigmoid.default", "erf.default", "reciprocal.default", "log1p.default", "expm1.default", "log2.default",
        "log10.default", "atan.default", "asin.default", "acos.default", "tan.default", "sinh.default", "cosh.default",
        "asinh.default", "acosh.default", "atanh.default", "logit.default", "exp2.default")
def _floating_unary(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    return _same(x, _float_of(x.dtype))


@infers("silu.default", "gelu.default", "hardtanh.default", "leaky_relu.default", "softplus.default", "elu.default",
        "round.decimals")
def _float_only_unary(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if node.op != "hardtanh.default":
        _need_float(x)
    elif x.dtype == "bool":
        raise InferError("hardtanh of a bool tensor is not supported")
    elif x.dtype == "uint8" and any(math.trunc(node.attrs[k]) < 0 for k in ("min_val", "max_val")):
        raise InferError("hardtanh of an unsigned tensor with negative limits is not supported")
    if node.op == "hardtanh.default" and x.dtype in INT_DTYPES:
        # ATen truncates an integral tensor's bounds to int64 first, then converts them with the overflow check
        for k in ("min_val", "max_val"):
            if not representable(math.trunc(node.attrs[k]), x.dtype):
                raise InferError(f"{k}={node.attrs[k]!r} cannot be converted to {x.dtype} without overflow")
    else:
        _scalar_fits(node, ("min_val", "max_val"), x.dtype)
    # leaky_relu computes in the accumulation type: fp32 for halves and fp32, fp64 for fp64
    _scalar_fits(node, ("negative_slope",), "float64" if x.dtype == "float64" else "float32")
    return _same(x)


@infers("hardswish.default", "hardsigmoid.default", "mish.default", "selu.default", "celu.default",
        "log_sigmoid.default", "hardshrink.default", "softshrink.default")
def _activation(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    _need_float(x)
    return _same(x)


@infers("relu6.default", "threshold.default")
def _threshold(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if x.dtype == "bool":
        raise InferError(f"{node.op} of a bool tensor is not supported")
    _scalar_fits(node, ("threshold", "value"), x.dtype)
    return _same(x)


@infers("square.default")
def _square(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    return _same(x, "int64" if x.dtype == "bool" else x.dtype)


@infers("nan_to_num.default")
def _nan_to_num(node: Node) -> list[TensorType]:
    return _same(tensor(node, 0))


@infers("addcmul.default", "addcdiv.default")
def _addc(node: Node) -> list[TensorType]:
    ops = [tensor(node, i, n) for i, n in enumerate(("self", "tensor1", "tensor2"))]
    dt = result_type(*ops)
    if dt == "bool":
        raise InferError(f"{node.op} of bool tensors is not supported")
    if node.op == "addcdiv.default" and not (set(v.dtype for v in ops[1:]) & FLOAT_DTYPES):
        raise InferError("addcdiv of integer tensors is not supported (ATen no longer divides integers here)")
    _scalar_fits(node, ("value",), dt)
    return [TensorType(_shape_of(*ops), dt)]


@infers("lerp.Scalar", "lerp.Tensor")
def _lerp(node: Node) -> list[TensorType]:
    names = ("self", "end", "weight") if node.op == "lerp.Tensor" else ("self", "end")
    ops = [tensor(node, i, n) for i, n in enumerate(names)]
    for v, n in zip(ops[1:], names[1:]):
        if v.dtype != ops[0].dtype:
            raise InferError(f"self is {ops[0].dtype} and {n} {v.dtype}; lerp takes one dtype")
    _need_float(ops[0])
    return [TensorType(_shape_of(*ops), ops[0].dtype)]


@infers("hypot.default", "xlogy.Tensor")
def _float_binary(node: Node) -> list[TensorType]:
    ops = _binary_ops(node)
    dt = result_type(*ops)
    if node.op == "hypot.default":
        if dt not in FLOAT_DTYPES:
            raise InferError(f"hypot of {dt} tensors is not supported")
    else:
        dt = _float_of(dt)
    return [TensorType(_shape_of(*ops), dt)]


@infers("clamp.default")
def _clamp(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    lo, hi = node.attrs.get("min"), node.attrs.get("max")
    if lo is None and hi is None:
        raise InferError("clamp needs at least one of 'min' and 'max'")
    dt = result_type(x, lo, hi)
    if dt == "bool":
        raise InferError("clamp of a bool tensor is not supported")
    _scalar_fits(node, ("min", "max"), dt)
    return _same(x, dt)


@infers("fmod.Tensor", "fmod.Scalar", "remainder.Tensor", "remainder.Scalar", "remainder.Scalar_Tensor",
        "floor_divide.default", "floor_divide.Scalar")
def _modulo(node: Node) -> list[TensorType]:
    if node.op == "remainder.Scalar_Tensor":
        ops: list[Operand] = [node.attrs["self"], tensor(node, 0, "other")]
    else:
        ops = _binary_ops(node)
    dt = result_type(*ops)
    if dt == "bool":
        raise InferError(f"{node.op.partition('.')[0]} of bool tensors is not supported")
    divisor = ops[1]
    if not isinstance(divisor, Value) and dt not in FLOAT_DTYPES:
        if divisor == 0:
            raise InferError("divides an integer tensor by zero")
        if dt != "int64" and not -(2**31) <= divisor < 2**31:  # ATen's kernel takes the divisor as a C int
            raise InferError(f"other {divisor!r} does not fit the {dt} kernel's int")
    return [TensorType(_shape_of(*ops), dt)]


@infers("clamp_min.default", "clamp_max.default")
def _clamp_one(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    name = "min" if node.op == "clamp_min.default" else "max"
    dt = result_type(x, node.attrs[name])
    if dt == "bool":
        raise InferError("clamp of a bool tensor is not supported")
    _scalar_fits(node, (name,), dt)
    return _same(x, dt)


@infers("clamp_min.Tensor", "clamp_max.Tensor", "clamp.Tensor")
def _clamp_tensor(node: Node) -> list[TensorType]:
    if node.op == "clamp.Tensor" and len(node.inputs) == 2:
        # torch_ir drops the absent bound and shifts the other: `clamp(x, max=t)` and `clamp(x, min=t)` read alike
        raise InferError("clamp.Tensor with one tensor bound: the IR does not say whether it is min or max (the "
                         "absent one is dropped); use torch.clamp_min / torch.clamp_max (or give both bounds)")
    x = tensor(node, 0)
    bounds = node.inputs[1:]
    if not bounds:
        raise InferError("needs at least one tensor bound")
    dt = result_type(x, *bounds)
    if dt == "bool" and node.op == "clamp.Tensor":
        raise InferError("clamp of bool tensors is not supported")
    return [TensorType(broadcast(x.shape, *[b.shape for b in bounds]), dt)]


@infers("prelu.default")
def _prelu(node: Node) -> list[TensorType]:
    x, w = tensor(node, 0, "self"), tensor(node, 1, "weight")
    if x.dtype != w.dtype:
        raise InferError(f"self is {x.dtype} and weight {w.dtype}; prelu takes one dtype")
    _need_float(x)
    if len(w.shape) > 1:
        raise InferError(f"weight must be a scalar or a vector, got shape {list(w.shape)}")
    if w.type.numel != 1:
        channels = x.shape[1] if len(x.shape) >= 2 else 1
        if not x.shape or w.type.numel != channels:
            raise InferError(f"{w.type.numel} weights for an input of shape {list(x.shape)} ({channels} channel(s) "
                             "along dim 1)")
    return _same(x)


@infers("eq.Scalar", "ne.Scalar", "lt.Scalar", "le.Scalar", "gt.Scalar", "ge.Scalar")
def _compare_scalar(node: Node) -> list[TensorType]:
    return _same(tensor(node, 0), "bool")


@infers("eq.Tensor", "ne.Tensor", "lt.Tensor", "le.Tensor", "gt.Tensor", "ge.Tensor")
def _compare(node: Node) -> list[TensorType]:
    ops = _binary_ops(node)
    result_type(*ops)
    return [TensorType(_shape_of(*ops), "bool")]


@infers("logical_not.default")
def _logical_not(node: Node) -> list[TensorType]:
    return _same(tensor(node, 0), "bool")


@infers("where.self")
def _where(node: Node) -> list[TensorType]:
    ops = _binary_ops(node, ("condition", "self", "other"))
    cond = ops[0]
    if not isinstance(cond, Value) or cond.dtype not in ("bool", "uint8"):
        raise InferError(f"the condition must be a bool tensor, got {getattr(cond, 'dtype', cond)!r}")
    return [TensorType(_shape_of(*ops), result_type(*ops[1:]))]


@infers("masked_fill.Scalar")
def _masked_fill(node: Node) -> list[TensorType]:
    x, mask = tensor(node, 0, "self"), tensor(node, 1, "mask")
    if mask.dtype != "bool":
        raise InferError(f"the mask must be a bool tensor, got {mask.dtype}")
    if not representable(node.attrs["value"], x.dtype):
        raise InferError(f"value {node.attrs['value']!r} cannot be stored in {x.dtype} without overflow")
    return [TensorType(broadcast(x.shape, mask.shape), x.dtype)]


@infers("to.dtype", "to.device")
def _to(node: Node) -> list[TensorType]:
    return _same(tensor(node, 0), node.attrs["dtype"])


@infers("to.dtype_layout", "_to_copy.default")
def _to_copy(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    return _same(x, node.attrs.get("dtype") or x.dtype)


@infers("type_as.default")
def _type_as(node: Node) -> list[TensorType]:
    return _same(tensor(node, 0), tensor(node, 1, "other").dtype)


@infers("clone.default", "alias.default", "detach.default", "detach_copy.default", "contiguous.default", "zero.default",
        "lift_fresh_copy.default", "dropout.default", "feature_dropout.default", "alpha_dropout.default",
        "feature_alpha_dropout.default")
def _identity(node: Node) -> list[TensorType]:
    return _same(tensor(node, 0))


@infers("native_dropout.default")
def _native_dropout(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    # the mask is bool, except for an empty input (ATen returns an empty tensor of the input's dtype)
    return [x.type, TensorType(x.shape, "bool" if x.type.numel else x.dtype)]


def _static_assertion(node: Node) -> None:
    """An assertion of a number: a static program asserts a constant, and a false one fails now."""
    if "self" in node.attrs and not node.attrs["self"]:
        raise InferError(f"the graph asserts {node.attrs['self']!r}: {node.attrs.get('assert_msg') or 'it fails'}")


@infers("_assert_async.default", "_assert_async.msg", "_assert_scalar.default")
def _assertion(node: Node) -> list[TensorType]:
    _static_assertion(node)
    if node.op.startswith("_assert_async"):
        x = tensor(node, 0)
        if x.type.numel != 1:
            raise InferError(f"asserts a tensor of {x.type.numel} elements; it takes one")
    return []


@infers("_functional_assert_async.msg", "_functional_assert_scalar.default")
def _functional_assertion(node: Node) -> list[TensorType]:
    _static_assertion(node)
    token = tensor(node, len(node.inputs) - 1, "dep_token")
    if node.op.startswith("_functional_assert_async") and tensor(node, 0).type.numel != 1:
        raise InferError("asserts a tensor of more than one element")
    return _same(token)


@infers("_assert_tensor_metadata.default")
def _assert_metadata(node: Node) -> list[TensorType]:
    x = tensor(node, 0, "a")
    a = node.attrs
    if a.get("dtype") is not None and a["dtype"] != x.dtype:
        raise InferError(f"asserts dtype {a['dtype']} of a {x.dtype} tensor")
    if a.get("size") is not None and tuple(a["size"]) != x.shape:
        raise InferError(f"asserts size {list(a['size'])} of a tensor of shape {list(x.shape)}")
    return []


@infers("floor.default", "ceil.default", "trunc.default", "round.default")
def _rounding(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if x.dtype == "bool":
        raise InferError(f"{node.op.partition('.')[0]} of a bool tensor is not supported")
    return _same(x)


@infers("sign.default")
def _sign(node: Node) -> list[TensorType]:
    return _same(tensor(node, 0))


@infers("bitwise_not.default")
def _bitwise_not(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if x.dtype in FLOAT_DTYPES:
        raise InferError(f"bitwise_not of a {x.dtype} tensor is not supported (it takes integers and bools)")
    return _same(x)


@infers("isnan.default", "isinf.default")
def _float_class(node: Node) -> list[TensorType]:
    return _same(tensor(node, 0), "bool")


@infers("logical_and.default", "logical_or.default", "logical_xor.default")
def _logical(node: Node) -> list[TensorType]:
    ops = _binary_ops(node)
    return [TensorType(_shape_of(*ops), "bool")]


@infers("bitwise_and.Tensor", "bitwise_or.Tensor", "bitwise_xor.Tensor", "__and__.Tensor", "__or__.Tensor",
        "__xor__.Tensor", "bitwise_and.Scalar", "bitwise_or.Scalar", "bitwise_xor.Scalar", "__and__.Scalar",
        "__or__.Scalar", "__xor__.Scalar")
def _bitwise(node: Node) -> list[TensorType]:
    ops = _binary_ops(node)
    dt = result_type(*ops)
    if dt in FLOAT_DTYPES:
        raise InferError(f"bitwise operations on {dt} are not supported (they take integers and bools)")
    return [TensorType(_shape_of(*ops), dt)]


@infers("add.Scalar", "sub.Scalar", "mul.Scalar")
def _arith_scalar(node: Node) -> list[TensorType]:
    x, other = tensor(node, 0), node.attrs["other"]
    if node.op == "sub.Scalar":
        _no_bool_subtraction([x, other])
    dt = result_type(x, other)
    _check_alpha(node, dt)
    return _same(x, dt)


@infers("div.Scalar")
def _div_scalar(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    return _same(x, _float_of(result_type(x, node.attrs["other"])))


@infers("div.Scalar_mode")
def _div_scalar_mode(node: Node) -> list[TensorType]:
    x, other, mode = tensor(node, 0), node.attrs["other"], node.attrs["rounding_mode"]
    dt = result_type(x, other)
    if mode is None:
        return _same(x, _float_of(dt))
    if dt == "bool" or (mode == "floor" and x.dtype == "bool" and not isinstance(other, float)):
        raise InferError("floor division of a bool tensor is not supported")
    if dt not in FLOAT_DTYPES and x.type.numel:
        _integer_divisor(other, dt)
    return _same(x, dt)


@infers("pow.Scalar")
def _pow_scalar_base(node: Node) -> list[TensorType]:
    e = tensor(node, 0, "exponent")
    dt = result_type(node.attrs["self"], e)
    if dt == "bool":
        raise InferError("pow of bool values is not supported")
    return _same(e, dt)


def _condition(cond: Value) -> None:
    if cond.dtype not in ("bool", "uint8"):
        raise InferError(f"the condition must be a bool tensor, got {cond.dtype}")


@infers("where.ScalarOther", "where.ScalarSelf", "where.Scalar")
def _where_scalars(node: Node) -> list[TensorType]:
    cond = tensor(node, 0, "condition")
    _condition(cond)
    names = {"where.ScalarOther": ("self",), "where.ScalarSelf": ("other",), "where.Scalar": ()}[node.op]
    if len(node.inputs) != 1 + len(names):
        raise InferError(f"takes {1 + len(names)} tensor input(s), got {len(node.inputs)}")
    values = [node.inputs[1] if n in names else node.attrs[n] for n in ("self", "other")]
    dt = result_type(*values)
    for n in ("self", "other"):
        if n not in names:
            _wrapped_scalar_fits(node.attrs[n], dt, n)
    return [TensorType(_shape_of(cond, *values), dt)]


@infers("masked_fill.Tensor")
def _masked_fill_tensor(node: Node) -> list[TensorType]:
    x, mask, value = tensor(node, 0, "self"), tensor(node, 1, "mask"), tensor(node, 2, "value")
    if mask.dtype != "bool":
        raise InferError(f"the mask must be a bool tensor, got {mask.dtype}")
    if value.shape:
        raise InferError(f"the value must be a 0-d tensor, got shape {list(value.shape)}")
    return [TensorType(broadcast(x.shape, mask.shape), x.dtype)]


@infers("fill.Scalar")
def _fill(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    _fill_fits(node.attrs["value"], x.dtype, x.type.numel, "value")
    return _same(x)


@infers("fill.Tensor")
def _fill_tensor(node: Node) -> list[TensorType]:
    x, value = tensor(node, 0, "self"), tensor(node, 1, "value")
    if value.shape:
        raise InferError(f"the value must be a 0-d tensor, got shape {list(value.shape)}")
    return _same(x)


@infers("copy.default")
def _copy(node: Node) -> list[TensorType]:
    x, src = tensor(node, 0, "self"), tensor(node, 1, "src")
    if broadcast(x.shape, src.shape) != x.shape:
        raise InferError(f"src of shape {list(src.shape)} does not broadcast to self's shape {list(x.shape)}")
    return _same(x)

