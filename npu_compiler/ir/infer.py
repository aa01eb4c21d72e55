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
        "pow.Tensor_Tensor")
def _arith(node: Node) -> list[TensorType]:
    ops = _binary_ops(node, ("self", "exponent") if node.op == "pow.Tensor_Tensor" else ("self", "other"))
    dt = result_type(*ops)
    if node.op in ("sub.Tensor", "rsub.Tensor"):
        _no_bool_subtraction(ops)
    if node.op == "pow.Tensor_Tensor" and dt == "bool":
        raise InferError("pow of bool tensors is not supported")
    alpha = node.attrs.get("alpha", 1)
    if alpha != 1 and dt not in FLOAT_DTYPES and isinstance(alpha, float):
        raise InferError(f"alpha {alpha!r} is a float, but the result is {dt}")
    _scalar_fits(node, ("alpha",), dt)
    return [TensorType(_shape_of(*ops), dt)]


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
    return [TensorType(_shape_of(*ops), dt)]


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
        "sigmoid.default", "erf.default", "reciprocal.default")
def _floating_unary(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    return _same(x, _float_of(x.dtype))


@infers("silu.default", "gelu.default", "hardtanh.default", "leaky_relu.default")
def _float_only_unary(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if node.op != "hardtanh.default":
        _need_float(x)
    elif x.dtype == "bool":
        raise InferError("hardtanh of a bool tensor is not supported")
    elif x.dtype == "uint8" and any(math.trunc(node.attrs[k]) < 0 for k in ("min_val", "max_val")):
        raise InferError("hardtanh of an unsigned tensor with negative limits is not supported")
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


@infers("conv2d.default")
def _conv2d(node: Node) -> list[TensorType]:
    x, w = tensor(node, 0, "input"), tensor(node, 1, "weight")
    a = node.attrs
    if len(x.shape) not in (3, 4) or len(w.shape) != 4:
        raise InferError(f"conv2d takes an input of rank 3 or 4 and a weight of rank 4, got {list(x.shape)} and "
                         f"{list(w.shape)}")
    if isinstance(a["padding"], str):
        raise InferError(f"string padding {a['padding']!r} is not supported")
    _same_dtypes(node.inputs, "input, weight and bias")
    g = a["groups"]
    c = x.shape[-3]
    o, cg, kh, kw = w.shape
    if o % g or cg * g != c:
        raise InferError(f"weight {list(w.shape)} with groups={g} does not fit an input of {c} channels")
    if len(node.inputs) > 3:
        raise InferError(f"takes (input, weight[, bias]), got {len(node.inputs)} inputs")
    if len(node.inputs) == 3 and node.inputs[2].shape != (o,):
        raise InferError(f"bias has shape {list(node.inputs[2].shape)}, expected [{o}]")
    hw = []
    for i, k in enumerate((kh, kw)):
        n = _window_out(x.shape[-2 + i], k, a["stride"][i], a["padding"][i], a["dilation"][i], False)
        if n <= 0:
            raise InferError(f"input {list(x.shape)} is smaller than the kernel {[kh, kw]} (dilated, padded)")
        hw.append(n)
    return [TensorType(x.shape[:-3] + (o, *hw), x.dtype)]


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


@infers("adaptive_avg_pool2d.default")
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


@infers("amax.default")
def _amax(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if any(d == 0 for i, d in enumerate(x.shape) if not node.attrs["dim"] or i in
           {norm_dim(a, len(x.shape)) for a in node.attrs["dim"]}):
        raise InferError(f"amax over an empty dim of shape {list(x.shape)} has no identity")
    return [TensorType(_reduced(x, node.attrs["dim"], node.attrs["keepdim"]), x.dtype)]


@infers("softmax.int", "log_softmax.int")
def _softmax(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    norm_dim(node.attrs["dim"], len(x.shape))
    dt = node.attrs.get("dtype") or x.dtype
    if dt not in FLOAT_DTYPES:
        raise InferError(f"softmax of a {dt} tensor: give a floating dtype")
    return _same(x, dt)


@infers("_softmax.default")
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
    # c10's overflow check lets an unsigned type take negatives down to -max (they wrap, as in C)
    lo, hi = (-(2**bits - 1), 2**bits - 1) if dtype == "uint8" else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return lo <= v <= hi


@infers("full.default")
def _full(node: Node) -> list[TensorType]:
    v = node.attrs["fill_value"]
    dt = node.attrs.get("dtype") or _scalar_dtype(v)
    if not representable(v, dt):
        raise InferError(f"fill_value {v!r} cannot be stored in {dt} without overflow")
    return [TensorType(_factory_size(node), dt)]


@infers("zeros.default", "ones.default")
def _zeros(node: Node) -> list[TensorType]:
    return [TensorType(_factory_size(node), node.attrs.get("dtype") or DEFAULT_FLOAT)]


@infers("arange.default", "arange.start", "arange.start_step")
def _arange(node: Node) -> list[TensorType]:
    a = node.attrs
    start, end, step = a.get("start", 0), a["end"], a.get("step", 1)
    floaty = any(isinstance(v, float) for v in (start, end, step))
    dt = a.get("dtype") or (DEFAULT_FLOAT if floaty else "int64")
    if dt == "int64":
        # ATen converts the bounds to int64 first (truncating) and counts in integers
        start, end, step = int(start), int(end), int(step)
    if step == 0:
        raise InferError("step must not be 0")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise InferError(f"arange from {start} to {end} with step {step} goes the wrong way")
    if dt == "int64":
        n = abs(end - start + step - (1 if step > 0 else -1)) // abs(step)
    else:
        n = max(math.ceil((end - start) / step), 0)
    if n > INT64_MAX:
        raise InferError(f"arange of {n} elements")
    return [TensorType((n,), dt)]


__all__ = ["RULES", "infers", "has_rule", "check_node", "result_type", "promote", "broadcast", "InferError"]
