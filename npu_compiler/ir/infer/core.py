"""The rule registry, `check_node`, operand access, broadcasting, ATen's type promotion, and the helpers that more
than one family of rules uses."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ...dtypes import FLOAT_DTYPES, ITEMSIZE
from ...errors import IRFormatError
from ..graph import Node, TensorType, Value

Rule = Callable[[Node], list[TensorType]]


RULES: dict[str, Rule] = {}


# ops whose outputs from this index on may be declared with unit dims added to (or dropped from) the shape their rule
# infers: torch's export declares some recurrent layers' final states [L*D, 1, B, H] where eager gives [L*D, B, H].
# The IR's later nodes were traced against the declared shape, so that shape stands (the decomposition views its
# result as it); a different element count or order is still refused.
UNIT_DIM_OUTPUTS: dict[str, int] = {}


DEFAULT_FLOAT = "float32"  # torch's default dtype: what an int op promoted to float gives, and arange(0.5)


INT64_MAX = 2**63 - 1


class InferError(Exception):
    """The operands of a node are invalid for its op (the reader names the node)."""


def infers(*ops: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for op in ops:
            if op in RULES:
                raise RuntimeError(f"two inference rules for {op}")  # a bug in this module, at import
            RULES[op] = fn
        return fn

    return register


def has_rule(op: str) -> bool:
    return _rule(op) is not None


def _rule(op: str) -> Rule | None:
    hit = RULES.get(op)
    if hit is None:  # an in-place overload (relu_.default) computes what its out-of-place form does
        base, dot, overload = op.partition(".")
        if base.endswith("_") and not base.startswith("_"):
            hit = RULES.get(f"{base[:-1]}{dot}{overload}")
    return hit


def check_node(node: Node, where: str) -> None:
    """The node's declared outputs against what its op produces; IRFormatError naming the node otherwise. Ops
    without a rule are left to the lowering (or the partition path)."""
    rule = _rule(node.op)
    if rule is None:
        return
    try:
        expected = rule(node)
        if _in_place(node.op) and node.inputs and expected:
            expected = [_in_place_result(node.inputs[0], expected[0])] + expected[1:]
    except InferError as e:
        raise IRFormatError(f"{where}: {e}") from None
    got = [v.type for v in node.outputs]
    if len(expected) != len(got):
        raise IRFormatError(f"{where}: the op produces {len(expected)} output(s), the IR lists {len(got)}")
    loose = UNIT_DIM_OUTPUTS.get(_base_op(node.op), len(got))
    for i, (e, g) in enumerate(zip(expected, got)):
        if e != g and not (i >= loose and e.dtype == g.dtype and same_but_unit_dims(e.shape, g.shape)):
            what = "shape" if e.dtype == g.dtype else "dtype" if e.shape == g.shape else "shape and dtype"
            raise IRFormatError(f"{where}: output #{i} '{node.outputs[i].name}' is declared {g}, but the op "
                                f"produces {e} (wrong {what})")


def same_but_unit_dims(a: Sequence[int], b: Sequence[int]) -> bool:
    """The same elements in the same order: equal once their dims of size 1 are dropped (a view of each other)."""
    return [n for n in a if n != 1] == [n for n in b if n != 1]


def _base_op(op: str) -> str:
    """An in-place overload's out-of-place form (relu_.default -> relu.default), other ops as they are."""
    base, dot, overload = op.partition(".")
    return f"{base[:-1]}{dot}{overload}" if _in_place(op) else op


def _in_place(op: str) -> bool:
    base = op.partition(".")[0]
    return base.endswith("_") and not base.startswith("_")


def can_cast(src: str, dst: str) -> bool:
    """ATen's canCast: what an in-place op may write into its input (no float into an integer, nothing but bool
    into a bool)."""
    if _KIND[src] == 2 and _KIND[dst] < 2:
        return False
    return not (dst == "bool" and src != "bool")


def _in_place_result(x: Value, result: TensorType) -> TensorType:
    """An in-place op writes its result into its first input: of the input's shape and dtype."""
    if result.shape != x.shape:
        raise InferError(f"the result's shape {list(result.shape)} is not the shape {list(x.shape)} of the input it "
                         "is written into (an in-place op cannot broadcast its input)")
    if not can_cast(result.dtype, x.dtype):
        raise InferError(f"the result ({result.dtype}) cannot be written into the {x.dtype} input in place")
    return x.type


Operand = Value | bool | int | float | None


def operand(node: Node, i: int, name: str) -> Operand:
    """The i-th Tensor argument: the i-th input when the node lists one, else the scalar the IR put in attrs under
    the argument's name (`add.Tensor {"other": 0.5}`), else None."""
    if i < len(node.inputs):
        return node.inputs[i]
    v = node.attrs.get(name)
    return v if isinstance(v, bool | int | float) else None


def tensor_list(node: Node, what: str) -> list[Value]:
    """The inputs of an op whose only tensor argument is a list (cat, stack, einsum, meshgrid): at least one, as many
    as `_tensor_list_sizes` says where the IR gives it."""
    if not node.inputs:
        raise InferError(f"{what} needs at least one tensor")
    sizes = node.attrs.get("_tensor_list_sizes")
    if sizes is not None and sizes != [len(node.inputs)]:
        raise InferError(f"_tensor_list_sizes {sizes} does not match the {len(node.inputs)} inputs")
    return list(node.inputs)


def tensor(node: Node, i: int, what: str = "") -> Value:
    if i >= len(node.inputs):
        raise InferError(f"needs a tensor input #{i}{f' ({what})' if what else ''}")
    return node.inputs[i]


def norm_dim(dim: Any, rank: int, what: str = "dim") -> int:
    """ATen's maybe_wrap_dim: a 0-d tensor takes dim 0 and -1."""
    n = max(rank, 1)
    if not isinstance(dim, int) or isinstance(dim, bool) or not -n <= dim < n:
        raise InferError(f"{what} {dim!r} is out of range for a tensor of rank {rank}")
    return dim % n


def broadcast(*shapes: Sequence[int]) -> tuple[int, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        size = 1
        for s in shapes:
            j = len(s) - rank + i
            d = s[j] if j >= 0 else 1
            if d == size or d == 1:
                continue
            if size != 1:
                raise InferError(f"shapes {' and '.join(str(list(s)) for s in shapes)} do not broadcast")
            size = d
        out.append(size)
    return tuple(out)


_KIND = {"bool": 0, "uint8": 1, "int8": 1, "int16": 1, "int32": 1, "int64": 1, "float16": 2, "bfloat16": 2,
         "float32": 2, "float64": 2}


_INT_ORDER = ("int8", "int16", "int32", "int64")


_FLOAT_RANK = {"float16": 0, "bfloat16": 0, "float32": 1, "float64": 2}


def promote(a: str, b: str) -> str:
    """c10::promoteTypes for the dtypes the IR has."""
    if a == b:
        return a
    if a == "bool":
        return b
    if b == "bool":
        return a
    ka, kb = _KIND[a], _KIND[b]
    if ka != kb:
        return a if ka > kb else b
    if ka == 1:
        if "uint8" in (a, b):
            other = b if a == "uint8" else a
            return "int16" if other == "int8" else other
        return max(a, b, key=_INT_ORDER.index)
    if {a, b} == {"float16", "bfloat16"}:
        return "float32"
    return a if _FLOAT_RANK[a] > _FLOAT_RANK[b] else b


def _scalar_dtype(v: bool | int | float) -> str:
    return "bool" if isinstance(v, bool) else "int64" if isinstance(v, int) else DEFAULT_FLOAT


def result_type(*operands: Operand) -> str:
    """ATen's result type of an elementwise op: tensors of rank > 0 first, then 0-d tensors, then Python scalars;
    a lower class matters only when its category (bool < integer < float) is higher."""
    classes: list[str | None] = [None, None, None]
    for x in operands:
        if x is None:
            continue
        if isinstance(x, Value):
            cls, dt = (0 if x.shape else 1), x.dtype
        else:
            cls, dt = 2, _scalar_dtype(x)
        classes[cls] = dt if classes[cls] is None else promote(classes[cls], dt)
    out = _combine(classes[0], _combine(classes[1], classes[2]))
    if out is None:
        raise InferError("has no operands")
    return out


def _combine(higher: str | None, lower: str | None) -> str | None:
    """TensorIterator's combine_categories: a lower-priority class changes the result only from a lower category."""
    if higher is None or lower is None:
        return higher or lower
    if _KIND[higher] == 2:
        return higher
    if higher == "bool" or _KIND[lower] == 2:
        return promote(higher, lower)
    return higher


def _float_of(dtype: str) -> str:
    """Integer and bool inputs of a floating op compute in the default float dtype."""
    return dtype if dtype in FLOAT_DTYPES else DEFAULT_FLOAT


def _same(v: Value, dtype: str | None = None) -> list[TensorType]:
    return [TensorType(v.shape, dtype or v.dtype)]


def _need_float(v: Value, what: str = "input") -> None:
    if v.dtype not in FLOAT_DTYPES:
        raise InferError(f"{what} is {v.dtype}; the op takes a floating-point tensor")


def _same_dtypes(vals: Sequence[Value], what: str) -> None:
    dts = {v.dtype for v in vals}
    if len(dts) > 1:
        raise InferError(f"{what} must share one dtype, got {', '.join(v.dtype for v in vals)}")


def _scalar_fits(node: Node, names: tuple[str, ...], dtype: str) -> None:
    """ATen converts these Scalar arguments to the op's dtype with an overflow check (alpha, clamp bounds, ...)."""
    for name in names:
        v = node.attrs.get(name)
        if v is not None and not representable(v, dtype):
            raise InferError(f"{name}={v!r} cannot be converted to {dtype} without overflow")


def _same_shape(x: Value, shape: Sequence[int]) -> list[TensorType]:
    return [TensorType(tuple(shape), x.dtype)]


def representable(v: bool | int | float, dtype: str) -> bool:
    """Can ATen store the number `v` in `dtype` without overflow (its checked scalar conversion)?"""
    if dtype == "bool" or isinstance(v, bool):
        return True
    if dtype in FLOAT_DTYPES:
        top = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38}.get(dtype)
        return top is None or not math.isfinite(v) or abs(v) <= top
    if not math.isfinite(v):
        return False
    bits = ITEMSIZE[dtype] * 8
    if dtype == "uint8":
        # c10's overflow check lets a negative integer wrap into an unsigned type (two's complement), not a float
        return (-255 if isinstance(v, int) else 0) <= v <= 255
    return -(2 ** (bits - 1)) <= v <= 2 ** (bits - 1) - 1


def _representable(v: bool | int | float, dtype: str, what: str) -> None:
    if not representable(v, dtype):
        raise InferError(f"{what} {v!r} cannot be stored in {dtype} without overflow")


def _fill_fits(v: bool | int | float, dtype: str, numel: int, what: str) -> None:
    """ATen's fill converts the value with the overflow check, except a one-element half-precision fill (its CPU fast
    path converts unchecked: a large value becomes inf)."""
    if not (dtype in ("float16", "bfloat16") and numel == 1):
        _representable(v, dtype, what)


def _wrapped_scalar_fits(v: bool | int | float, dtype: str, what: str) -> None:
    """A number ATen wraps into a 0-d tensor of `dtype`: checked for overflow, except into a half type (ATen
    converts those unchecked: a large number becomes inf)."""
    if dtype not in ("float16", "bfloat16"):
        _representable(v, dtype, what)



def _alias_rule(alias: str) -> Rule:
    from ..aliases import ALIASES, renamed

    target, names = ALIASES[alias]

    def rule(node: Node) -> list[TensorType]:
        as_target = Node(node.name, target, list(node.inputs), list(node.outputs), renamed(node.attrs, names))
        fn = _rule(target)
        if fn is None:
            raise InferError(f"{alias} stands for {target}, which has no rule")
        return fn(as_target)

    return rule


def register_aliases() -> None:
    """Each alias op checked by its target's rule (under the target's argument names)."""
    from ..aliases import ALIASES

    for alias in ALIASES:
        infers(alias)(_alias_rule(alias))
