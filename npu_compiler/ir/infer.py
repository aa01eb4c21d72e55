"""Shape and dtype inference per ATen op: what each node must produce, given its operands and attributes, so that
an IR whose declared outputs disagree with what the op produces (a `linear` declared int64, an `add` whose broadcast
shape is wrong) is refused with a message naming the node, instead of being lowered on the IR's word.

One rule per op, registered with `@infers(op, ...)`. A rule gets the node (operands bound, attributes checked and
defaulted by the reader) and returns the output types; it raises `InferError` when the operands themselves are
invalid for the op (a dim outside the rank, shapes that do not broadcast). The rules follow ATen's own semantics
(type promotion of `c10::promoteTypes` with tensor/zero-dim/scalar priorities, the output size formulas of
convolution and pooling, the view and split rules); `tests/test_infer.py` checks them against PyTorch's meta
tensors, and fails for an op in `SUPPORTED_OPS` that has no rule. An op without a rule is not checked here (the
compiler does not fail on it; that test does).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ..dtypes import FLOAT_DTYPES, INT_DTYPES, ITEMSIZE
from ..errors import IRFormatError
from .graph import Node, TensorType, Value

Rule = Callable[[Node], list[TensorType]]
RULES: dict[str, Rule] = {}

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
    for i, (e, g) in enumerate(zip(expected, got)):
        if e != g:
            what = "shape" if e.dtype == g.dtype else "dtype" if e.shape == g.shape else "shape and dtype"
            raise IRFormatError(f"{where}: output #{i} '{node.outputs[i].name}' is declared {g}, but the op "
                                f"produces {e} (wrong {what})")


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


# ---- operands ---------------------------------------------------------------------------------------------------


Operand = Value | bool | int | float | None


def operand(node: Node, i: int, name: str) -> Operand:
    """The i-th Tensor argument: the i-th input when the node lists one, else the scalar the IR put in attrs under
    the argument's name (`add.Tensor {"other": 0.5}`), else None."""
    if i < len(node.inputs):
        return node.inputs[i]
    v = node.attrs.get(name)
    return v if isinstance(v, bool | int | float) else None


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


# ---- type promotion (c10::promoteTypes and TensorIterator's result type) ----------------------------------------

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


# ---- elementwise ------------------------------------------------------------------------------------------------


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


def _scalar_fits(node: Node, names: tuple[str, ...], dtype: str) -> None:
    """ATen converts these Scalar arguments to the op's dtype with an overflow check (alpha, clamp bounds, ...)."""
    for name in names:
        v = node.attrs.get(name)
        if v is not None and not representable(v, dtype):
            raise InferError(f"{name}={v!r} cannot be converted to {dtype} without overflow")


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


@infers("div.Tensor")
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


@infers("abs.default", "relu.default")
def _same_non_bool(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if x.dtype == "bool":
        raise InferError(f"{node.op} of a bool tensor is not supported")
    return _same(x)


@infers("rsqrt.default", "sqrt.default", "exp.default", "log.default", "sin.default", "cos.default", "tanh.default",
        "sigmoid.default", "erf.default", "reciprocal.default", "log1p.default", "expm1.default", "log2.default",
        "log10.default")
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


# ---- casts and identities -----------------------------------------------------------------------------------------


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


@infers("clone.default", "alias.default", "detach.default", "contiguous.default", "lift_fresh_copy.default",
        "dropout.default")
def _identity(node: Node) -> list[TensorType]:
    return _same(tensor(node, 0))


@infers("_assert_tensor_metadata.default")
def _assert_metadata(node: Node) -> list[TensorType]:
    x = tensor(node, 0, "a")
    a = node.attrs
    if a.get("dtype") is not None and a["dtype"] != x.dtype:
        raise InferError(f"asserts dtype {a['dtype']} of a {x.dtype} tensor")
    if a.get("size") is not None and tuple(a["size"]) != x.shape:
        raise InferError(f"asserts size {list(a['size'])} of a tensor of shape {list(x.shape)}")
    return []


# ---- batch norm -----------------------------------------------------------------------------------------------------


def _batch_norm_check(node: Node) -> Value:
    x = tensor(node, 0)
    _need_float(x)
    if len(x.shape) < 2:
        raise InferError(f"input of shape {list(x.shape)}: batch norm needs a batch and a channel dim")
    if len(node.inputs) not in (3, 5):
        raise InferError(f"takes (input, running_mean, running_var) or (input, weight, bias, running_mean, "
                         f"running_var), got {len(node.inputs)} inputs")
    c = x.shape[1]
    for v in node.inputs[1:]:
        if v.shape != (c,):
            raise InferError(f"'{v.name}' has shape {list(v.shape)}; per-channel parameters of {c} channels "
                             f"have shape [{c}]")
        _need_float(v, f"'{v.name}'")
    return x


@infers("batch_norm.default")
def _batch_norm(node: Node) -> list[TensorType]:
    return _same(_batch_norm_check(node))


@infers("_native_batch_norm_legit_no_training.default")
def _native_batch_norm(node: Node) -> list[TensorType]:
    x = _batch_norm_check(node)
    # The saved statistics (unused in eval) are empty on CPU and [C] on the meta device torch.export traces on;
    # they are kept in the accumulation dtype (fp32 for half inputs)
    stats = "float32" if x.dtype in ("float16", "bfloat16") else x.dtype
    declared = [v.shape for v in node.outputs[1:3]]
    shapes = [s if s in ((0,), (x.shape[1],)) else (0,) for s in declared] + [(0,)] * (2 - len(declared))
    return [x.type, TensorType(shapes[0], stats), TensorType(shapes[1], stats)]


@infers("layer_norm.default")
def _layer_norm(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    _need_float(x)
    ns = tuple(node.attrs["normalized_shape"])
    if not ns or len(ns) > len(x.shape) or x.shape[len(x.shape) - len(ns):] != ns:
        raise InferError(f"normalized_shape {list(ns)} is not the trailing shape of the input {list(x.shape)}")
    for v in node.inputs[1:]:
        if v.shape != ns:
            raise InferError(f"'{v.name}' has shape {list(v.shape)}, normalized_shape is {list(ns)}")
    return _same(x)


# ---- views ----------------------------------------------------------------------------------------------------------


def _infer_size(size: Sequence[int], numel: int) -> tuple[int, ...]:
    """A view's size with at most one -1, resolved against `numel` elements."""
    if list(size).count(-1) > 1:
        raise InferError(f"size {list(size)} has more than one -1")
    known = math.prod(d for d in size if d != -1)
    if -1 in size:
        if known == 0 or numel % known:
            raise InferError(f"size {list(size)} cannot hold {numel} elements")
        size = [numel // known if d == -1 else d for d in size]
    if math.prod(size) != numel:
        raise InferError(f"size {list(size)} holds {math.prod(size)} elements, the input has {numel}")
    return tuple(size)


@infers("view.default", "reshape.default", "_unsafe_view.default")
def _view(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    size = node.attrs["shape" if node.op == "reshape.default" else "size"]
    return _same_shape(x, _infer_size(size, x.type.numel))


def _same_shape(x: Value, shape: Sequence[int]) -> list[TensorType]:
    return [TensorType(tuple(shape), x.dtype)]


@infers("flatten.using_ints")
def _flatten(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if not x.shape:
        return _same_shape(x, (1,))
    r = len(x.shape)
    s, e = norm_dim(node.attrs["start_dim"], r, "start_dim"), norm_dim(node.attrs["end_dim"], r, "end_dim")
    if s > e:
        raise InferError(f"start_dim {node.attrs['start_dim']} comes after end_dim {node.attrs['end_dim']}")
    return _same_shape(x, x.shape[:s] + (math.prod(x.shape[s:e + 1]),) + x.shape[e + 1:])


@infers("unsqueeze.default")
def _unsqueeze(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    d = norm_dim(node.attrs["dim"], len(x.shape) + 1)
    return _same_shape(x, x.shape[:d] + (1,) + x.shape[d:])


@infers("squeeze.default", "squeeze.dim", "squeeze.dims")
def _squeeze(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    r = len(x.shape)
    if node.op == "squeeze.default":
        dims = set(range(r))
    else:
        raw = node.attrs["dim"]
        listed = [norm_dim(d, r) for d in (raw if isinstance(raw, list) else [raw])]
        dims = set(listed)
        if len(dims) != len(listed):
            raise InferError(f"dim {raw} names a dim twice")
    return _same_shape(x, tuple(n for i, n in enumerate(x.shape) if not (i in dims and n == 1)))


@infers("transpose.int")
def _transpose(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    r = len(x.shape)
    a, b = norm_dim(node.attrs["dim0"], r, "dim0"), norm_dim(node.attrs["dim1"], r, "dim1")
    shape = list(x.shape)
    if shape:
        shape[a], shape[b] = shape[b], shape[a]
    return _same_shape(x, shape)


@infers("t.default")
def _t(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if len(x.shape) > 2:
        raise InferError(f"t() takes a tensor of rank <= 2, got {list(x.shape)}")
    return _same_shape(x, x.shape[::-1])


@infers("permute.default")
def _permute(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    r = len(x.shape)
    dims = [norm_dim(d, r, "dims entry") for d in node.attrs["dims"]]
    if sorted(dims) != list(range(r)):
        raise InferError(f"dims {node.attrs['dims']} is not a permutation of the {r} dims")
    return _same_shape(x, tuple(x.shape[d] for d in dims))


@infers("expand.default")
def _expand(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    size = list(node.attrs["size"])
    lead = len(size) - len(x.shape)
    if lead < 0:
        raise InferError(f"cannot expand shape {list(x.shape)} to the shorter size {size}")
    out = []
    for i, s in enumerate(size):
        if i < lead:
            if s < 0:
                raise InferError(f"size {size}: a new leading dim cannot be {s}")
            out.append(s)
            continue
        d = x.shape[i - lead]
        if s == -1:
            s = d
        if d != s and d != 1:
            raise InferError(f"cannot expand shape {list(x.shape)} to {size}")
        out.append(s)
    return _same_shape(x, out)


@infers("slice.Tensor")
def _slice(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    a = node.attrs
    d = norm_dim(a["dim"], len(x.shape))
    if not x.shape:
        raise InferError("cannot slice a 0-d tensor")
    step = a["step"]
    if step <= 0:
        raise InferError(f"step {step} must be positive")
    n = x.shape[d]
    start = 0 if a["start"] is None else a["start"]
    end = n if a["end"] is None else a["end"]
    start, end = (start + n if start < 0 else start), (end + n if end < 0 else end)
    start, end = min(max(start, 0), n), min(max(end, start, 0), n)
    shape = list(x.shape)
    shape[d] = (end - start + step - 1) // step
    return _same_shape(x, shape)


@infers("select.int")
def _select(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if not x.shape:
        raise InferError("select() cannot be applied to a 0-d tensor")
    d = norm_dim(node.attrs["dim"], len(x.shape))
    i, n = node.attrs["index"], x.shape[d]
    if not -n <= i < n:
        raise InferError(f"index {i} is out of range for dim {d} of size {n}")
    return _same_shape(x, x.shape[:d] + x.shape[d + 1:])


def _split_shapes(x: Value, dim: int, sizes: Sequence[int]) -> list[TensorType]:
    out = []
    for s in sizes:
        shape = list(x.shape)
        shape[dim] = s
        out.append(TensorType(tuple(shape), x.dtype))
    return out


@infers("split.Tensor")
def _split(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if not x.shape:
        raise InferError("split() cannot be applied to a 0-d tensor")
    d = norm_dim(node.attrs["dim"], len(x.shape))
    size, n = node.attrs["split_size"], x.shape[d]
    if size == 0 and n != 0:
        raise InferError(f"split_size 0 cannot split a dim of size {n}")
    count = max(-(-n // size), 1) if size else 1
    return _split_shapes(x, d, [size] * (count - 1) + [n - size * (count - 1)])


@infers("split_with_sizes.default")
def _split_with_sizes(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if not x.shape:
        raise InferError("split() cannot be applied to a 0-d tensor")
    d = norm_dim(node.attrs["dim"], len(x.shape))
    sizes = node.attrs["split_sizes"]
    if sum(sizes) != x.shape[d]:
        raise InferError(f"split_sizes {sizes} sum to {sum(sizes)}, dim {d} has size {x.shape[d]}")
    return _split_shapes(x, d, sizes)


@infers("chunk.default")
def _chunk(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if not x.shape:
        raise InferError("chunk() cannot be applied to a 0-d tensor")
    d = norm_dim(node.attrs["dim"], len(x.shape))
    chunks, n = node.attrs["chunks"], x.shape[d]
    size = -(-n // chunks)
    if size == 0:
        return _split_shapes(x, d, [0] * chunks)
    count = -(-n // size)
    return _split_shapes(x, d, [size] * (count - 1) + [n - size * (count - 1)])


@infers("cat.default")
def _cat(node: Node) -> list[TensorType]:
    if not node.inputs:
        raise InferError("cat needs at least one tensor")
    sizes = node.attrs.get("_tensor_list_sizes")
    if sizes is not None and sizes != [len(node.inputs)]:
        raise InferError(f"_tensor_list_sizes {sizes} does not match the {len(node.inputs)} inputs")
    # ATen skips legacy empty 1-D tensors ([0]) when the others have another rank
    shaped = [v for v in node.inputs if v.shape != (0,)] or [node.inputs[0]]
    ref = shaped[0].shape
    if not ref:
        raise InferError("cat cannot join 0-d tensors")
    d = norm_dim(node.attrs["dim"], len(ref))
    total = 0
    for v in shaped:
        if len(v.shape) != len(ref) or any(a != b for i, (a, b) in enumerate(zip(v.shape, ref)) if i != d):
            raise InferError(f"cannot join shapes {list(ref)} and {list(v.shape)} along dim {d}")
        total += v.shape[d]
    shape = list(ref)
    shape[d] = total
    return [TensorType(tuple(shape), result_type(*node.inputs))]


# ---- contractions -------------------------------------------------------------------------------------------------


def _matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if not a or not b:
        raise InferError(f"matmul needs tensors of rank >= 1, got {list(a)} and {list(b)}")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise InferError(f"cannot multiply {list(a)} by {list(b)} (inner dims {a2[-1]} and {b2[-2]})")
    out = broadcast(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


@infers("matmul.default")
def _matmul(node: Node) -> list[TensorType]:
    a, b = tensor(node, 0), tensor(node, 1)
    _same_dtypes([a, b], "both operands")
    return [TensorType(_matmul_shape(a.shape, b.shape), a.dtype)]


@infers("mm.default")
def _mm(node: Node) -> list[TensorType]:
    a, b = tensor(node, 0), tensor(node, 1)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise InferError(f"mm takes two matrices, got {list(a.shape)} and {list(b.shape)}")
    _same_dtypes([a, b], "both operands")
    return [TensorType(_matmul_shape(a.shape, b.shape), a.dtype)]


@infers("bmm.default")
def _bmm(node: Node) -> list[TensorType]:
    a, b = tensor(node, 0), tensor(node, 1)
    if len(a.shape) != 3 or len(b.shape) != 3 or a.shape[0] != b.shape[0]:
        raise InferError(f"bmm takes two batches of matrices of one batch size, got {list(a.shape)} and "
                         f"{list(b.shape)}")
    _same_dtypes([a, b], "both operands")
    return [TensorType(_matmul_shape(a.shape, b.shape), a.dtype)]


@infers("addmm.default")
def _addmm(node: Node) -> list[TensorType]:
    bias, a, b = tensor(node, 0), tensor(node, 1), tensor(node, 2)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise InferError(f"addmm multiplies two matrices, got {list(a.shape)} and {list(b.shape)}")
    _same_dtypes([bias, a, b], "all operands")
    out = _matmul_shape(a.shape, b.shape)
    if broadcast(bias.shape, out) != out:
        raise InferError(f"the added tensor {list(bias.shape)} does not broadcast to the product {list(out)}")
    _scalar_fits(node, ("alpha", "beta"), "float32" if a.dtype in ("float16", "bfloat16") else a.dtype)  # opmath
    return [TensorType(out, a.dtype)]


@infers("linear.default")
def _linear(node: Node) -> list[TensorType]:
    x, w = tensor(node, 0, "input"), tensor(node, 1, "weight")
    if len(w.shape) not in (1, 2) or not x.shape:
        raise InferError(f"linear takes an input of rank >= 1 and a weight of rank 1 or 2, got {list(x.shape)} "
                         f"and {list(w.shape)}")
    if x.shape[-1] != w.shape[-1]:
        raise InferError(f"input features {x.shape[-1]} do not match the weight {list(w.shape)}")
    out = x.shape[:-1] + w.shape[:-1]
    _same_dtypes(node.inputs, "input, weight and bias")
    if len(node.inputs) > 3:
        raise InferError(f"takes (input, weight[, bias]), got {len(node.inputs)} inputs")
    if len(node.inputs) == 3 and broadcast(node.inputs[2].shape, out) != out:
        raise InferError(f"bias {list(node.inputs[2].shape)} does not broadcast to the output {list(out)}")
    return [TensorType(out, x.dtype)]


def _window_out(size: int, kernel: int, stride: int, pad: int, dilation: int, ceil: bool) -> int:
    """ATen's pooling_output_shape (and, with ceil=False, the convolution's)."""
    span = dilation * (kernel - 1) + 1
    num = size + 2 * pad - span + ((stride - 1) if ceil else 0)
    out = num // stride + 1
    if ceil and (out - 1) * stride >= size + pad:
        out -= 1
    return out


@infers("conv2d.default", "conv2d.padding", "conv1d.default", "conv1d.padding")
def _conv(node: Node) -> list[TensorType]:
    """ATen's convolution shape check and output size, for 1-d and 2-d convs with numeric or string padding (an
    unbatched input [C, *spatial] gives an unbatched output)."""
    nd = 1 if node.op.startswith("conv1d") else 2
    x, w = tensor(node, 0, "input"), tensor(node, 1, "weight")
    a = node.attrs
    if len(x.shape) not in (nd + 1, nd + 2) or len(w.shape) != nd + 2:
        raise InferError(f"conv{nd}d takes an input of rank {nd + 1} or {nd + 2} and a weight of rank {nd + 2}, got "
                         f"{list(x.shape)} and {list(w.shape)}")
    _same_dtypes(node.inputs, "input, weight and bias")
    g = a["groups"]
    c = x.shape[-nd - 1]
    o, cg, ks = w.shape[0], w.shape[1], w.shape[2:]
    if g < 1 or o % g or cg * g != c:
        raise InferError(f"weight {list(w.shape)} with groups={g} does not fit an input of {c} channels")
    if len(node.inputs) > 3:
        raise InferError(f"takes (input, weight[, bias]), got {len(node.inputs)} inputs")
    if len(node.inputs) == 3 and node.inputs[2].shape != (o,):
        raise InferError(f"bias has shape {list(node.inputs[2].shape)}, expected [{o}]")
    stride, dilation = _per_dim(a, "stride", nd), _per_dim(a, "dilation", nd)
    pad = a["padding"] if isinstance(a["padding"], str) else _per_dim(a, "padding", nd)
    if isinstance(pad, str):
        if pad not in ("same", "valid"):
            raise InferError(f"padding {pad!r} is neither 'same' nor 'valid'")
        if pad == "same" and any(s != 1 for s in stride):
            raise InferError(f"padding 'same' needs stride 1, got {stride}")
    spatial = []
    for i, k in enumerate(ks):
        size = x.shape[-nd + i]
        if pad == "same":
            n = size
        else:
            n = _window_out(size, k, stride[i], 0 if pad == "valid" else pad[i], dilation[i], False)
        if n <= 0 or (pad == "same" and size < 1):
            raise InferError(f"input {list(x.shape)} is smaller than the kernel {list(ks)} (dilated, padded)")
        spatial.append(n)
    return [TensorType(x.shape[:-nd - 1] + (o, *spatial), x.dtype)]


def _per_dim(attrs: dict, name: str, nd: int, empty_ok: bool = False) -> list[int]:
    """An `int[nd]` attribute as nd values: ATen repeats a single value (`int[1]` lists are not length-checked by the
    reader, which reads `int[1]` as "one or more")."""
    v = list(attrs[name])
    if empty_ok and not v:
        return v
    if len(v) == 1:
        v = v * nd
    if len(v) != nd:
        raise InferError(f"{name} {attrs[name]} must have {nd} entries")
    return v


def _pool_params(node: Node) -> tuple[Value, list[int], list[int], list[int], list[int]]:
    x = tensor(node, 0)
    a = node.attrs
    if len(x.shape) not in (3, 4):
        raise InferError(f"2-d pooling takes an input of rank 3 or 4, got {list(x.shape)}")
    ks = list(a["kernel_size"])
    stride = list(a["stride"]) or ks
    pad = list(a["padding"])
    dil = list(a.get("dilation", [1, 1]))
    for k, p in zip(ks, pad):
        if p > k // 2:
            raise InferError(f"padding {pad} is more than half the kernel {ks}")
    return x, ks, stride, pad, dil


def _pool_shape(node: Node, x: Value, ks, stride, pad, dil) -> tuple[int, ...]:
    hw = []
    for i in range(2):
        n = _window_out(x.shape[-2 + i], ks[i], stride[i], pad[i], dil[i], bool(node.attrs["ceil_mode"]))
        if n <= 0:
            raise InferError(f"input {list(x.shape)} is smaller than the pooling window {ks}")
        hw.append(n)
    return x.shape[:-2] + tuple(hw)


@infers("max_pool2d.default")
def _max_pool2d(node: Node) -> list[TensorType]:
    x, ks, stride, pad, dil = _pool_params(node)
    if x.dtype == "bool":
        raise InferError("max_pool2d of a bool tensor is not supported")
    return [TensorType(_pool_shape(node, x, ks, stride, pad, dil), x.dtype)]


@infers("avg_pool2d.default")
def _avg_pool2d(node: Node) -> list[TensorType]:
    x, ks, stride, pad, _ = _pool_params(node)
    _need_float(x)
    return [TensorType(_pool_shape(node, x, ks, stride, pad, [1, 1]), x.dtype)]


@infers("adaptive_avg_pool2d.default", "_adaptive_avg_pool2d.default")
def _adaptive_avg_pool2d(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if len(x.shape) not in (3, 4) or any(d == 0 for d in x.shape[-2:]):
        raise InferError(f"adaptive pooling takes an input of rank 3 or 4 with a non-empty image, got "
                         f"{list(x.shape)}")
    _need_float(x)
    return [TensorType(x.shape[:-2] + tuple(node.attrs["output_size"]), x.dtype)]


@infers("scaled_dot_product_attention.default")
def _sdpa(node: Node) -> list[TensorType]:
    if len(node.inputs) not in (3, 4):
        raise InferError(f"takes (query, key, value[, attn_mask]), got {len(node.inputs)} inputs")
    q, k, v = node.inputs[:3]
    for t in (q, k, v):
        if len(t.shape) < 2:
            raise InferError(f"'{t.name}' has shape {list(t.shape)}; attention needs [..., length, dim]")
    _need_float(q, "the query")
    _same_dtypes([q, k, v], "query, key and value")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise InferError(f"query {list(q.shape)}, key {list(k.shape)} and value {list(v.shape)} do not fit")
    if not (len(q.shape) == len(k.shape) == len(v.shape)):
        raise InferError("query, key and value must have one rank")
    kb = k.shape[:-2]
    if node.attrs.get("enable_gqa") and len(q.shape) >= 3 and k.shape[-3] and q.shape[-3] % k.shape[-3] == 0:
        kb = kb[:-1] + (q.shape[-3],)
    if broadcast(q.shape[:-2], kb) != q.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise InferError(f"the batch and head dims of query {list(q.shape)} and key {list(k.shape)} do not match")
    if len(node.inputs) == 4:
        m = node.inputs[3]
        target = q.shape[:-1] + (k.shape[-2],)
        if broadcast(m.shape, target) != target:
            raise InferError(f"attn_mask {list(m.shape)} does not broadcast to {list(target)}")
        if m.dtype != "bool" and m.dtype != q.dtype:
            raise InferError(f"attn_mask is {m.dtype}; it must be bool or the query's dtype {q.dtype}")
    if node.attrs.get("is_causal") and len(node.inputs) == 4:
        raise InferError("is_causal and an explicit attn_mask cannot be given together")
    return [TensorType(q.shape[:-1] + (v.shape[-1],), q.dtype)]


# ---- reductions and row ops ---------------------------------------------------------------------------------------


def _reduced(x: Value, dims: Any, keepdim: bool) -> tuple[int, ...]:
    r = len(x.shape)
    if dims is None or dims == []:
        axes = set(range(r))
    else:
        listed = dims if isinstance(dims, list) else [dims]
        axes = {norm_dim(d, r) for d in listed}
        if len(axes) != len(listed):
            raise InferError(f"dim {dims} names a dim twice")
    if keepdim:
        return tuple(1 if i in axes else n for i, n in enumerate(x.shape))
    return tuple(n for i, n in enumerate(x.shape) if i not in axes)


@infers("mean.default", "mean.dim")
def _mean(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    dt = node.attrs.get("dtype") or x.dtype
    if dt not in FLOAT_DTYPES:
        raise InferError(f"mean of a {dt} tensor: give a floating dtype")
    if node.op == "mean.default":
        return [TensorType((), dt)]
    return [TensorType(_reduced(x, node.attrs["dim"], node.attrs["keepdim"]), dt)]


@infers("sum.default", "sum.dim_IntList")
def _sum(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    dt = node.attrs.get("dtype") or ("int64" if x.dtype in INT_DTYPES | {"bool"} else x.dtype)
    if node.op == "sum.default":
        return [TensorType((), dt)]
    return [TensorType(_reduced(x, node.attrs["dim"], node.attrs["keepdim"]), dt)]


@infers("amax.default", "amin.default")
def _amax(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if any(d == 0 for i, d in enumerate(x.shape) if not node.attrs["dim"] or i in
           {norm_dim(a, len(x.shape)) for a in node.attrs["dim"]}):
        raise InferError(f"{node.op.partition('.')[0]} over an empty dim of shape {list(x.shape)} has no identity")
    return [TensorType(_reduced(x, node.attrs["dim"], node.attrs["keepdim"]), x.dtype)]


@infers("softmax.int", "log_softmax.int")
def _softmax(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    norm_dim(node.attrs["dim"], len(x.shape))
    dt = node.attrs.get("dtype") or x.dtype
    if dt not in FLOAT_DTYPES:
        raise InferError(f"softmax of a {dt} tensor: give a floating dtype")
    return _same(x, dt)


@infers("_softmax.default", "_log_softmax.default")
def _softmax_internal(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    norm_dim(node.attrs["dim"], len(x.shape))
    _need_float(x)
    if node.attrs["half_to_float"]:
        if x.dtype not in ("float16", "bfloat16"):
            raise InferError("half_to_float needs a half-precision input")
        return _same(x, "float32")
    return _same(x)


# ---- gathers, scatters, factories -----------------------------------------------------------------------------------


@infers("embedding.default")
def _embedding(node: Node) -> list[TensorType]:
    w, ids = tensor(node, 0, "weight"), tensor(node, 1, "indices")
    if len(w.shape) != 2:
        raise InferError(f"the embedding table must have rank 2, got {list(w.shape)}")
    if ids.dtype not in ("int64", "int32"):
        raise InferError(f"indices must be int64 or int32, got {ids.dtype}")
    return [TensorType(ids.shape + (w.shape[1],), w.dtype)]


@infers("index_copy.default")
def _index_copy(node: Node) -> list[TensorType]:
    x, index, src = tensor(node, 0, "self"), tensor(node, 1, "index"), tensor(node, 2, "source")
    r = len(x.shape)
    d = norm_dim(node.attrs["dim"], r)
    if index.dtype != "int64":
        raise InferError(f"index must be int64, got {index.dtype}")
    if len(index.shape) > 1:
        raise InferError(f"index must be a vector, got shape {list(index.shape)}")
    if src.dtype != x.dtype:
        raise InferError(f"source is {src.dtype}, self is {x.dtype}: they must match")
    n = index.shape[0] if index.shape else 1
    want = list(x.shape)
    if want:
        want[d] = n
    if list(src.shape) != want and not (not src.shape and n == 1 and r <= 1):
        raise InferError(f"source has shape {list(src.shape)}; {n} index entries along dim {d} of {list(x.shape)} "
                         f"need {want}")
    return _same(x)


def _factory_size(node: Node) -> tuple[int, ...]:
    size = node.attrs["size"]
    if any(d < 0 for d in size):
        raise InferError(f"size {size} has a negative dim")
    return tuple(size)


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


@infers("full.default")
def _full(node: Node) -> list[TensorType]:
    v = node.attrs["fill_value"]
    dt = node.attrs.get("dtype") or _scalar_dtype(v)
    size = _factory_size(node)
    _fill_fits(v, dt, math.prod(size), "fill_value")
    return [TensorType(size, dt)]


@infers("zeros.default", "ones.default")
def _zeros(node: Node) -> list[TensorType]:
    return [TensorType(_factory_size(node), node.attrs.get("dtype") or DEFAULT_FLOAT)]


@infers("arange.default", "arange.start", "arange.start_step")
def _arange(node: Node) -> list[TensorType]:
    a = node.attrs
    start, end, step = a.get("start", 0), a["end"], a.get("step", 1)
    floaty = any(isinstance(v, float) for v in (start, end, step))
    dt = a.get("dtype") or (DEFAULT_FLOAT if floaty else "int64")
    if step == 0 or (dt == "int64" and int(step) == 0):
        raise InferError("step must not be 0")
    # the direction is checked on the bounds as given, before an int64 arange truncates them
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise InferError(f"arange from {start} to {end} with step {step} goes the wrong way")
    if dt == "int64":
        # ATen converts the bounds to int64 (truncating) and counts in integers
        start, end, step = int(start), int(end), int(step)
    if dt == "int64":
        n = abs(end - start + step - (1 if step > 0 else -1)) // abs(step)
    else:
        n = max(math.ceil((end - start) / step), 0)
    if n > INT64_MAX:
        raise InferError(f"arange of {n} elements")
    return [TensorType((n,), dt)]


# ---- the model zoo's ops: elementwise -------------------------------------------------------------------------------


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
        "__xor__.Tensor")
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


@infers("copy.default")
def _copy(node: Node) -> list[TensorType]:
    x, src = tensor(node, 0, "self"), tensor(node, 1, "src")
    if broadcast(x.shape, src.shape) != x.shape:
        raise InferError(f"src of shape {list(src.shape)} does not broadcast to self's shape {list(x.shape)}")
    return _same(x)


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


# ---- the model zoo's ops: factories ---------------------------------------------------------------------------------


@infers("full_like.default", "zeros_like.default", "ones_like.default")
def _like(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    dt = node.attrs.get("dtype") or x.dtype
    if node.op == "full_like.default":
        _fill_fits(node.attrs["fill_value"], dt, x.type.numel, "fill_value")
    return _same(x, dt)


@infers("new_ones.default", "new_zeros.default", "new_full.default")
def _new(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    dt = node.attrs.get("dtype") or x.dtype
    size = _factory_size(node)
    if node.op == "new_full.default":
        _fill_fits(node.attrs["fill_value"], dt, math.prod(size), "fill_value")
    return [TensorType(size, dt)]


@infers("scalar_tensor.default")
def _scalar_tensor(node: Node) -> list[TensorType]:
    dt = node.attrs.get("dtype") or DEFAULT_FLOAT
    _wrapped_scalar_fits(node.attrs["s"], dt, "s")
    return [TensorType((), dt)]


# ---- the model zoo's ops: gathers and layout ------------------------------------------------------------------------


@infers("gather.default")
def _gather(node: Node) -> list[TensorType]:
    x, index = tensor(node, 0, "self"), tensor(node, 1, "index")
    d = norm_dim(node.attrs["dim"], len(x.shape))
    if index.dtype not in ("int64", "int32"):
        raise InferError(f"index must be int64 or int32, got {index.dtype}")
    xs, ix = x.shape or (1,), index.shape or (1,)
    if index.type.numel and len(xs) != len(ix):
        raise InferError(f"index of shape {list(index.shape)} must have the rank of self {list(x.shape)}")
    if index.type.numel and any(i != d and n > xs[i] for i, n in enumerate(ix)):
        raise InferError(f"index of shape {list(index.shape)} is larger than self {list(x.shape)} outside dim {d}")
    return [TensorType(index.shape, x.dtype)]


@infers("index_select.default")
def _index_select(node: Node) -> list[TensorType]:
    x, index = tensor(node, 0, "self"), tensor(node, 1, "index")
    d = norm_dim(node.attrs["dim"], len(x.shape))
    if index.dtype not in ("int64", "int32"):
        raise InferError(f"index must be int64 or int32, got {index.dtype}")
    if len(index.shape) > 1:
        raise InferError(f"index must be a vector, got shape {list(index.shape)}")
    if not x.shape:
        if index.type.numel != 1:
            raise InferError(f"a 0-d tensor takes an index of one element, got shape {list(index.shape)}")
        return _same(x)
    shape = list(x.shape)
    shape[d] = index.type.numel
    return _same_shape(x, shape)


@infers("index.Tensor")
def _index(node: Node) -> list[TensorType]:
    """Advanced indexing: the index tensors (integer, or bool masks standing for the positions they select) broadcast
    to B; B replaces the indexed dims when they are adjacent, otherwise it comes first."""
    x = tensor(node, 0, "self")
    idx = node.inputs[1:]
    masks = node.attrs.get("_tensor_list_none_masks")
    none = list(masks[0]) if masks else [False] * len(idx)
    if masks and len(masks) != 1:
        raise InferError(f"_tensor_list_none_masks {masks} must hold one list")
    if sum(not m for m in none) != len(idx):
        raise InferError(f"the index list {none} has {sum(not m for m in none)} tensors, the node lists {len(idx)}")
    if not idx:
        raise InferError("needs at least one index tensor")
    # each entry of the list consumes one dim of self (a mask of rank k consumes k)
    dims: list[int] = []  # self's dims the tensors index
    shapes: list[tuple[int, ...]] = []
    mask_at: list[int] = []  # which of `shapes` stand for a mask's selected count
    d, k = 0, 0
    for is_none in none:
        if is_none:
            d += 1
            continue
        v = idx[k]
        k += 1
        if v.dtype in ("bool", "uint8"):
            r = max(len(v.shape), 1) if v.shape else 0
            if x.shape[d:d + len(v.shape)] != v.shape:
                raise InferError(f"the mask of shape {list(v.shape)} does not match self {list(x.shape)} at dim {d}")
            mask_at.append(len(shapes))
            shapes.append((v.type.numel,))
            dims.extend(range(d, d + r))
            d += len(v.shape)
        elif v.dtype in INT_DTYPES:
            if v.dtype != "int64" and v.dtype != "int32":
                raise InferError(f"index tensors must be int64, int32 or bool, got {v.dtype}")
            shapes.append(v.shape)
            dims.append(d)
            d += 1
        else:
            raise InferError(f"index tensors must be integers or bools, got {v.dtype}")
    if d > len(x.shape):
        raise InferError(f"too many indices for a tensor of rank {len(x.shape)}")
    if mask_at:
        # a mask's selected count depends on its data: take the declared output's, bounded by the mask's size
        shapes = _mask_counts(node, x, shapes, mask_at, dims)
    b = broadcast(*shapes)
    indexed = set(dims)
    rest_before = [n for i, n in enumerate(x.shape) if i not in indexed and (not dims or i < min(dims))]
    rest_after = [n for i, n in enumerate(x.shape) if i not in indexed and dims and i > min(dims)]
    adjacent = not dims or sorted(indexed) == list(range(min(dims), max(dims) + 1))
    if adjacent:
        shape = tuple(rest_before) + b + tuple(rest_after)
    else:
        shape = b + tuple(n for i, n in enumerate(x.shape) if i not in indexed)
    return [TensorType(shape, x.dtype)]


def _mask_counts(node: Node, x: Value, shapes: list[tuple[int, ...]], mask_at: list[int], dims: list[int]
                 ) -> list[tuple[int, ...]]:
    """Where a bool mask indexes, the result's length there is the number of true entries: the declared output gives
    it, and it must be at most the mask's size."""
    lead = [n for i, n in enumerate(x.shape) if i not in set(dims) and i < min(dims)]
    adjacent = sorted(set(dims)) == list(range(min(dims), max(dims) + 1))
    rank_b = max(len(s) for s in shapes)
    declared = node.outputs[0].shape if node.outputs else ()
    start = len(lead) if adjacent else 0
    out = list(shapes)
    for j in mask_at:
        pos = start + rank_b - 1  # a mask stands for a 1-d index: its count is B's last dim
        top = shapes[j][0]
        n = declared[pos] if pos < len(declared) else top
        if not 0 <= n <= top:
            raise InferError(f"a mask of {top} elements selects {n}")
        out[j] = (n,)
    return out


@infers("repeat.default")
def _repeat(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    reps = list(node.attrs["repeats"])
    if len(reps) < len(x.shape):
        raise InferError(f"repeats {reps} has fewer entries than the tensor's rank {len(x.shape)}")
    if any(n < 0 for n in reps):
        raise InferError(f"repeats {reps} has a negative entry")
    shape = (1,) * (len(reps) - len(x.shape)) + x.shape
    return _same_shape(x, tuple(s * n for s, n in zip(shape, reps)))


@infers("repeat_interleave.self_int")
def _repeat_interleave(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    n, dim = node.attrs["repeats"], node.attrs.get("dim")
    if n < 0:
        raise InferError(f"repeats {n} is negative")
    if dim is None:
        shape = (x.type.numel * n,)
    else:
        if not x.shape:
            raise InferError(f"dim {dim} given for a 0-d tensor")
        d = norm_dim(dim, len(x.shape))
        shape = tuple(s * n if i == d else s for i, s in enumerate(x.shape))
    size = node.attrs.get("output_size")
    if size is not None and size != shape[0 if dim is None else norm_dim(dim, len(shape))]:
        raise InferError(f"output_size {size} is not the repeated size {list(shape)}")
    return _same_shape(x, shape)


@infers("stack.default")
def _stack(node: Node) -> list[TensorType]:
    if not node.inputs:
        raise InferError("stack needs at least one tensor")
    sizes = node.attrs.get("_tensor_list_sizes")
    if sizes is not None and sizes != [len(node.inputs)]:
        raise InferError(f"_tensor_list_sizes {sizes} does not match the {len(node.inputs)} inputs")
    ref = node.inputs[0].shape
    if any(v.shape != ref for v in node.inputs):
        raise InferError(f"stack takes tensors of one shape, got {', '.join(str(list(v.shape)) for v in node.inputs)}")
    d = norm_dim(node.attrs["dim"], len(ref) + 1)
    return [TensorType(ref[:d] + (len(node.inputs),) + ref[d:], result_type(*node.inputs))]


def _pad_pairs(x: Value, pad: Sequence[int]) -> list[tuple[int, int, int]]:
    """(dim, before, after) per padded dim: the pairs run from the last dim backwards."""
    if len(pad) % 2:
        raise InferError(f"pad {list(pad)} must have an even number of entries")
    if len(pad) // 2 > len(x.shape):
        raise InferError(f"pad {list(pad)} pads {len(pad) // 2} dims of a tensor of rank {len(x.shape)}")
    return [(len(x.shape) - 1 - i, pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)]


def _constant_pad(x: Value, pad: Sequence[int]) -> list[TensorType]:
    shape = list(x.shape)
    for d, lo, hi in _pad_pairs(x, pad):
        # negative pads cut first (ATen narrows the input), then positive ones add
        if shape[d] + min(lo, 0) + min(hi, 0) < 0:
            raise InferError(f"pad {list(pad)} cuts more than dim {d} of {list(x.shape)} holds")
        shape[d] += lo + hi
    return _same_shape(x, shape)


def _edge_pad(x: Value, pad: Sequence[int], mode: str) -> list[TensorType]:
    """reflect / replicate / circular padding: ATen's rank rule (k padded dims of a rank k+1 or k+2 input) and
    that reflection reads inside the tensor (a pad smaller than the dim) and circular wraps once at most."""
    k = len(pad) // 2
    if len(pad) % 2 or k not in (1, 2, 3) or len(x.shape) not in (k + 1, k + 2):
        raise InferError(f"{mode} padding of {len(pad) // 2} dims takes an input of rank {k + 1} or {k + 2}, got "
                         f"{list(x.shape)} with pad {list(pad)}")
    if any(n == 0 for n in x.shape[1:]):
        raise InferError(f"{mode} padding of an empty tensor {list(x.shape)}")
    shape = list(x.shape)
    for d, lo, hi in _pad_pairs(x, pad):
        n = x.shape[d]
        if mode == "reflect" and (lo >= n or hi >= n):
            raise InferError(f"reflection pad {list(pad)} must be smaller than dim {d} of {list(x.shape)}")
        if mode == "circular" and (lo > n or hi > n):
            raise InferError(f"circular pad {list(pad)} must be at most dim {d} of {list(x.shape)}")
        shape[d] = n + lo + hi
        if shape[d] < (0 if mode == "circular" else 1):  # circular padding may crop a dim away; ATen allows that
            raise InferError(f"pad {list(pad)} leaves dim {d} of {list(x.shape)} empty")
    return _same_shape(x, shape)


@infers("pad.default")
def _pad(node: Node) -> list[TensorType]:
    x, mode = tensor(node, 0), node.attrs["mode"]
    if mode == "constant":
        if any(p > 0 for p in node.attrs["pad"]):  # as constant_pad_nd: a pad that only narrows converts no value
            _representable(node.attrs.get("value") or 0, x.dtype, "value")
        return _constant_pad(x, node.attrs["pad"])
    if mode not in ("reflect", "replicate", "circular"):
        raise InferError(f"mode {mode!r} is not one of 'constant', 'reflect', 'replicate', 'circular'")
    if node.attrs.get("value") is not None:
        raise InferError(f"padding mode {mode!r} takes no value")
    return _edge_pad(x, node.attrs["pad"], mode)


@infers("constant_pad_nd.default")
def _constant_pad_nd(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if any(p > 0 for p in node.attrs["pad"]):  # ATen only narrows, never converting the value, when no pad grows
        _representable(node.attrs["value"], x.dtype, "value")
    return _constant_pad(x, node.attrs["pad"])


@infers("reflection_pad1d.default", "reflection_pad2d.default", "reflection_pad3d.default",
        "replication_pad2d.default", "replication_pad3d.default")
def _reflection_pad(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if x.dtype == "bool":
        raise InferError(f"{node.op.partition('.')[0]} of a bool tensor is not supported")
    return _edge_pad(x, node.attrs["padding"], "reflect" if node.op.startswith("reflection") else "replicate")


@infers("roll.default")
def _roll(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    shifts, dims = node.attrs["shifts"], node.attrs["dims"]
    if not shifts:
        raise InferError("shifts must not be empty")
    if dims:
        if not x.shape:
            raise InferError("a 0-d tensor has no dims to roll along")
        if len(shifts) != len(dims):
            raise InferError(f"shifts {shifts} and dims {dims} must have one entry each")
        for d in dims:
            norm_dim(d, len(x.shape))
    elif len(shifts) != 1:
        raise InferError(f"shifts {shifts} without dims must be a single shift (of the flattened tensor)")
    return _same(x)


@infers("flip.default")
def _flip(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    dims = [norm_dim(d, len(x.shape)) for d in node.attrs["dims"]]
    if len(set(dims)) != len(dims):
        raise InferError(f"dims {node.attrs['dims']} names a dim twice")
    return _same(x)


@infers("diff.default")
def _diff(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if not x.shape:
        raise InferError("diff needs a tensor of rank >= 1")
    n = node.attrs["n"]
    if n < 0:
        raise InferError(f"order n={n} must be non-negative")
    if len(node.inputs) > 3:
        raise InferError(f"takes (self[, prepend][, append]), got {len(node.inputs)} inputs")
    if n == 0 and len(node.inputs) == 1:  # ATen returns the input itself, its dim unread
        return _same(x)
    d = norm_dim(node.attrs["dim"], len(x.shape))
    if n == 0:  # ATen joins prepend and append along dim (checking it), then returns the input itself
        return _same(x)
    total = 0
    for v in node.inputs:
        if len(v.shape) != len(x.shape) or any(a != b for i, (a, b) in enumerate(zip(v.shape, x.shape)) if i != d):
            raise InferError(f"'{v.name}' of shape {list(v.shape)} cannot be joined to {list(x.shape)} along dim {d}")
        total += v.shape[d]
    dt = result_type(*node.inputs)  # the joined tensor's (bool differences are xor)
    shape = list(x.shape)
    shape[d] = max(total - n, 0)
    return [TensorType(tuple(shape), dt)]


@infers("diagonal.default")
def _diagonal(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    r = len(x.shape)
    if r < 2:
        raise InferError(f"diagonal needs a tensor of rank >= 2, got {list(x.shape)}")
    a, b = norm_dim(node.attrs["dim1"], r, "dim1"), norm_dim(node.attrs["dim2"], r, "dim2")
    if a == b:
        raise InferError(f"dim1 and dim2 are both dim {a}")
    off = node.attrs["offset"]
    n = min(x.shape[a], x.shape[b] - off) if off >= 0 else min(x.shape[a] + off, x.shape[b])
    return _same_shape(x, tuple(s for i, s in enumerate(x.shape) if i not in (a, b)) + (max(n, 0),))


# ---- the model zoo's ops: reductions, scans, norms ------------------------------------------------------------------


@infers("cumsum.default")
def _cumsum(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    norm_dim(node.attrs["dim"], len(x.shape))
    dt = node.attrs.get("dtype") or ("int64" if x.dtype in INT_DTYPES | {"bool"} else x.dtype)
    if dt == "bool" and x.shape:  # (a 0-d input is copied, no kernel runs)
        raise InferError("cumsum into a bool tensor is not supported")
    return _same(x, dt)


@infers("topk.default")
def _topk(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if x.dtype == "bool":
        raise InferError("topk of a bool tensor is not supported")
    d = norm_dim(node.attrs["dim"], len(x.shape))
    k, n = node.attrs["k"], (x.shape[d] if x.shape else 1)
    if not 0 <= k <= n:
        raise InferError(f"k={k} is out of range for dim {d} of size {n}")
    shape = tuple(k if i == d else s for i, s in enumerate(x.shape))
    return [TensorType(shape, x.dtype), TensorType(shape, "int64")]


@infers("any.default", "any.dim", "any.dims")
def _any(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    dt = "uint8" if x.dtype == "uint8" else "bool"
    if node.op == "any.default":
        return [TensorType((), dt)]
    dim = node.attrs["dim"]
    if node.op == "any.dims" and dim == []:  # an empty list reduces nothing here (unlike sum's)
        return _same(x, dt)
    return [TensorType(_reduced(x, dim, node.attrs["keepdim"]), dt)]


@infers("var.correction", "var.dim")
def _var(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if x.dtype not in FLOAT_DTYPES:
        raise InferError(f"var of a {x.dtype} tensor is not supported (it takes floating-point tensors)")
    return [TensorType(_reduced(x, node.attrs["dim"], node.attrs["keepdim"]), x.dtype)]


@infers("argmax.default", "argmin.default")
def _argmax(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if x.dtype == "bool":
        raise InferError(f"{node.op.partition('.')[0]} of a bool tensor is not supported")
    dim, keep = node.attrs["dim"], node.attrs["keepdim"]
    if dim is None:
        if x.type.numel == 0:
            raise InferError(f"{node.op.partition('.')[0]} of an empty tensor without a dim")
        return [TensorType((1,) * len(x.shape) if keep else (), "int64")]
    d = norm_dim(dim, len(x.shape))
    if x.shape and x.shape[d] == 0:
        raise InferError(f"{node.op.partition('.')[0]} over the empty dim {d} of {list(x.shape)}")
    return [TensorType(_reduced(x, dim, keep), "int64")]


@infers("max.dim", "min.dim")
def _max_dim(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    d = norm_dim(node.attrs["dim"], len(x.shape))
    if x.shape and x.shape[d] == 0:
        raise InferError(f"{node.op.partition('.')[0]} over the empty dim {d} of {list(x.shape)}")
    shape = _reduced(x, node.attrs["dim"], node.attrs["keepdim"])
    return [TensorType(shape, x.dtype), TensorType(shape, "int64")]


@infers("group_norm.default")
def _group_norm(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    _need_float(x)
    if len(x.shape) < 2:
        raise InferError(f"input of shape {list(x.shape)}: group norm needs a batch and a channel dim")
    g, c = node.attrs["num_groups"], x.shape[1]
    if g < 1 or c % g:
        raise InferError(f"num_groups={g} does not divide the {c} channels")
    if len(node.inputs) > 3:
        raise InferError(f"takes (input[, weight][, bias]), got {len(node.inputs)} inputs")
    for v in node.inputs[1:]:
        if v.shape != (c,):
            raise InferError(f"'{v.name}' has shape {list(v.shape)}; per-channel parameters of {c} channels have "
                             f"shape [{c}]")
    return _same(x)


# ---- the model zoo's ops: contractions, resampling, pooling ---------------------------------------------------------


@infers("baddbmm.default")
def _baddbmm(node: Node) -> list[TensorType]:
    x, a, b = tensor(node, 0, "self"), tensor(node, 1, "batch1"), tensor(node, 2, "batch2")
    if len(a.shape) != 3 or len(b.shape) != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise InferError(f"baddbmm multiplies batches [B, M, K] and [B, K, N], got {list(a.shape)} and "
                         f"{list(b.shape)}")
    _same_dtypes([x, a, b], "all operands")
    out = (a.shape[0], a.shape[1], b.shape[2])
    if broadcast(x.shape, out) != out:
        raise InferError(f"the added tensor {list(x.shape)} does not broadcast to the product {list(out)}")
    return [TensorType(out, a.dtype)]


@infers("upsample_bilinear2d.vec", "upsample_nearest2d.vec", "upsample_bilinear2d.default",
        "upsample_nearest2d.default")
def _upsample(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if len(x.shape) != 4:
        raise InferError(f"2-d upsampling takes an input of rank 4, got {list(x.shape)}")
    if x.dtype not in FLOAT_DTYPES and x.dtype != "uint8":
        raise InferError(f"upsampling of a {x.dtype} tensor is not supported (it takes floats and uint8)")
    size, scales = node.attrs["output_size"], node.attrs.get("scale_factors")
    if node.op.endswith(".vec"):
        if (size is None) == (scales is None):
            raise InferError("give exactly one of output_size and scale_factors")
        if size is None:
            if len(scales) != 2:
                raise InferError(f"scale_factors {scales} must have 2 entries")
            size = [math.floor(n * s) if math.isfinite(n * s) else -1 for n, s in zip(x.shape[2:], scales)]
    if len(size) != 2:
        raise InferError(f"output_size {size} must have 2 entries")
    if any(n <= 0 for n in list(size) + list(x.shape[1:])):
        raise InferError(f"input {list(x.shape)} and output size {list(size)} must be greater than 0")
    return _same_shape(x, x.shape[:2] + tuple(size))


@infers("adaptive_avg_pool1d.default")
def _adaptive_avg_pool1d(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if len(x.shape) not in (2, 3) or any(d == 0 for d in x.shape[1:]):
        raise InferError(f"1-d adaptive pooling takes an input of rank 2 or 3 with non-empty dims, got "
                         f"{list(x.shape)}")
    _need_float(x)
    if len(node.attrs["output_size"]) != 1:
        raise InferError(f"output_size {node.attrs['output_size']} must have one entry")
    return _same_shape(x, x.shape[:-1] + tuple(node.attrs["output_size"]))


@infers("avg_pool1d.default")
def _avg_pool1d(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    a = node.attrs
    if len(x.shape) not in (2, 3):
        raise InferError(f"1-d pooling takes an input of rank 2 or 3, got {list(x.shape)}")
    _need_float(x)
    k, pad = _per_dim(a, "kernel_size", 1)[0], _per_dim(a, "padding", 1)[0]
    stride = (_per_dim(a, "stride", 1, empty_ok=True) or [k])[0]
    if pad > k // 2:
        raise InferError(f"padding {pad} is more than half the kernel {k}")
    n = _window_out(x.shape[-1], k, stride, pad, 1, bool(a["ceil_mode"]))
    if n <= 0:
        raise InferError(f"input {list(x.shape)} is smaller than the pooling window {k}")
    return _same_shape(x, x.shape[:-1] + (n,))


__all__ = ["RULES", "infers", "has_rule", "check_node", "result_type", "promote", "broadcast", "InferError"]
