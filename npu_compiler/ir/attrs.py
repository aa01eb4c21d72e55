"""Checking a node's attributes against its op's ATen schema, before anything reads them: every attribute is an
argument of the schema, of its type (an int is an integer in int64's range, `int[2]` two of them, a `ScalarType` a
dtype name, ...) and in its range (a stride is positive, an eps finite, a dropout probability in [0, 1]). Ranges
that depend on the operands' shapes (a dim inside the rank, a split that sums to the size) are checked by the
shape inference (`infer/`).

The ranges are written per argument *name*: ATen uses the same names for the same meanings across ops, so an op
added to the schema table gets its arguments checked without an entry here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..dtypes import normalize_dtype
from ..errors import IRFormatError
from .schema import MISSING, Arg, OpSchema

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_LIST = 64  # an int[] attribute (a shape, a permutation) is at most this long (ranks are far smaller)
MAX_STR = 256

# Attributes torch_ir adds beside the schema's own (how a Tensor[] argument's flat inputs split into lists).
EXTRA_ATTRS = {"_tensor_list_sizes", "_tensor_list_none_masks"}

# Number-valued arguments whose value is data (what to add, fill, compare with, clamp to): any number, infinities
# and NaN included, as ATen computes with them. Every other float argument is structural and must be finite.
VALUE_ARGS = {"other", "value", "fill_value", "min", "max", "min_val", "max_val", "exponent", "self", "s", "ord"}
# Number-valued arguments that take a bool as well (ATen's `Scalar`: `x == True`, `masked_fill(m, False)`).
BOOL_OK = VALUE_ARGS | {"negative_slope"}

Check = Callable[[Any], str | None]  # returns what is wrong, or None


def _each(pred: Callable[[int], bool], what: str) -> Check:
    def check(v: Any) -> str | None:
        items = v if isinstance(v, list) else [v]
        # a conv's padding may be a mode ("same"): the shape inference checks strings
        bad = [x for x in items if isinstance(x, int | float) and not pred(x)]
        return f"{what}, got {v!r}" if bad else None

    return check


_POSITIVE = _each(lambda x: x > 0, "must be positive")
_NON_NEGATIVE = _each(lambda x: x >= 0, "must be >= 0")

# Ranges by argument name (after the type check, so values are of the declared type).
RANGES: dict[str, Check] = {
    "stride": _POSITIVE,
    "dilation": _POSITIVE,
    "kernel_size": _POSITIVE,
    "padding": _NON_NEGATIVE,
    "groups": _POSITIVE,
    "chunks": _POSITIVE,
    "split_size": _NON_NEGATIVE,
    "split_sizes": _NON_NEGATIVE,
    "output_size": _NON_NEGATIVE,
    "normalized_shape": _NON_NEGATIVE,
    "divisor_override": _each(lambda x: x != 0, "must not be 0"),
    "p": lambda v: None if 0.0 <= v <= 1.0 else f"is a probability in [0, 1], got {v!r}",
    "dropout_p": lambda v: None if 0.0 <= v <= 1.0 else f"is a probability in [0, 1], got {v!r}",
    "eps": lambda v: None if v >= 0 else f"must be >= 0, got {v!r}",
    "approximate": lambda v: None if v in ("none", "tanh") else f"is 'none' or 'tanh', got {v!r}",
    "rounding_mode": lambda v: None if v in (None, "trunc", "floor") else f"is None, 'trunc' or 'floor', got {v!r}",
    "size": _each(lambda x: x >= -1, "holds sizes >= 0 (or -1 for 'infer')"),
    "shape": _each(lambda x: x >= -1, "holds sizes >= 0 (or -1 for 'infer')"),
}
# Where an op gives a name another meaning: (op, name) -> its range, in place of RANGES[name].
OP_RANGES: dict[tuple[str, str], Check] = {
    **{(op, "p"): lambda v: None if v >= 0 else f"is a norm's order >= 0, got {v!r}"
       for op in ("_cdist_forward.default", "cdist.default", "_pdist_forward.default", "pdist.default",
                  "pairwise_distance.default")},
    ("as_strided.default", "stride"): _NON_NEGATIVE,  # (a stride of 0 repeats an element)
}


def _bad(where: str, name: str, what: str) -> IRFormatError:
    return IRFormatError(f"{where}: attribute '{name}' {what}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(v: Any, where: str, name: str) -> int:
    if not _is_int(v):
        raise _bad(where, name, f"must be an integer, got {_short(v)}")
    if not INT64_MIN <= v <= INT64_MAX:
        raise _bad(where, name, f"is outside the range of int64: {_short(v)}")
    return v


def _number(v: Any, where: str, name: str) -> int | float | bool:
    if isinstance(v, bool):
        if name in BOOL_OK:
            return v
        raise _bad(where, name, f"must be a number, got {v!r}")
    if _is_int(v):
        return _int(v, where, name)
    if not isinstance(v, float):
        raise _bad(where, name, f"must be a number, got {_short(v)}")
    if not math.isfinite(v) and name not in VALUE_ARGS:
        raise _bad(where, name, f"must be finite, got {v!r}")
    return v


def _int_list(v: Any, where: str, name: str, n: int | None, empty_ok: bool, bare_ok: bool = True) -> list[int]:
    """`int[N]`: a list of N ints, or one int (or a list of one) that ATen repeats N times; `int[1]`: any list, or
    one int; `int[]`: any list (`bare_ok` False: ATen's schema refuses a bare int there)."""
    if _is_int(v):
        if not bare_ok:
            raise _bad(where, name, f"must be a list of integers, got {_short(v)}")
        return [_int(v, where, name)] * (n or 1)
    if not isinstance(v, list | tuple):
        raise _bad(where, name, f"must be a list of integers, got {_short(v)}")
    if len(v) > MAX_LIST:
        raise _bad(where, name, f"has {len(v)} entries (at most {MAX_LIST})")
    out = [_int(x, where, f"{name}[{i}]") for i, x in enumerate(v)]
    if n is not None and not out and not empty_ok:
        raise _bad(where, name, f"must have {n} entries, got none")
    if n is not None and out and len(out) not in (1, n):
        raise _bad(where, name, f"must have {n} entries, got {len(out)}")
    if n is not None and len(out) == 1:
        out = out * n
    return out


# The members of ATen's Layout and MemoryFormat enums the compiler honours, by the name the IR stringifies and by
# ATen's int: strided tensors only (a sparse or mkldnn layout is another kind of tensor), and every memory format
# (it picks strides, never values).
ENUM_MEMBERS = {
    "Layout": {"torch.strided": 0},
    "MemoryFormat": {"torch.contiguous_format": 0, "torch.preserve_format": 1, "torch.channels_last": 2,
                     "torch.channels_last_3d": 3},
}


def _opaque_name(v: Any, where: str, name: str, base: str) -> str | int:
    """Device, Layout, MemoryFormat: strings the IR stringifies (`"cpu"`, `"torch.strided"`), or ATen's enum ints;
    a layout or memory format must name a member the compiler honours (ENUM_MEMBERS)."""
    if isinstance(v, str):
        if len(v) > MAX_STR:
            raise _bad(where, name, f"is a string of {len(v)} characters (at most {MAX_STR})")
    elif _is_int(v):
        v = _int(v, where, name)
    else:
        raise _bad(where, name, f"must be a string, got {_short(v)}")
    members = ENUM_MEMBERS.get(base)
    if members is not None:
        key = f"torch.{v}" if isinstance(v, str) and not v.startswith("torch.") else v
        if key not in members and key not in members.values():
            raise _bad(where, name, f"{v!r} is not supported (the compiler takes {', '.join(members)})")
    return v


# `int[N]` arguments ATen does not expand from a single value (its kernel checks the length itself).
NO_REPEAT = {"output_size"}


def check_value(arg: Arg, value: Any, where: str, op: str = "") -> Any:
    """One attribute against its argument's type and range; returns it normalised (an `int[2]` given as one int
    becomes two, a dtype name becomes its canonical name)."""
    name, typ = arg.name, arg.type
    if value is None:
        if arg.optional or arg.default is None:
            return None
        raise _bad(where, name, f"is not optional ({typ}), got None")
    base = typ.rstrip("?").replace("SymInt", "int")  # a symbolic int is an int in a static-shape IR
    if arg.is_tensor and not arg.is_tensor_list:
        out: Any = _number(value, where, name)  # a scalar standing for a Tensor operand (`add.Tensor other=0.5`)
    elif base == "int":
        out = _int(value, where, name)
    elif base.startswith("int["):
        inner = base[4:-1]
        # `int[1]` (a reduction's dims) takes any number of ints, one of them given bare
        n = int(inner) if inner and inner != "1" else None
        if n is not None and name in NO_REPEAT and (not isinstance(value, list | tuple) or len(value) != n):
            raise _bad(where, name, f"must have {n} entries, got {_short(value)}")
        out = _int_list(value, where, name, n, arg.default == [], bare_ok=bool(inner))
    elif base in ("float", "Scalar"):
        out = _number(value, where, name)
    elif base == "float[]":
        if not isinstance(value, list | tuple) or len(value) > MAX_LIST:
            raise _bad(where, name, f"must be a list of at most {MAX_LIST} numbers, got {_short(value)}")
        out = [_number(x, where, f"{name}[{i}]") for i, x in enumerate(value)]
    elif base == "bool":
        if not isinstance(value, bool):
            raise _bad(where, name, f"must be true or false, got {_short(value)}")
        out = value
    elif base == "str":
        if not isinstance(value, str) or len(value) > MAX_STR:
            raise _bad(where, name, f"must be a short string, got {_short(value)}")
        out = value
    elif base == "ScalarType":
        out = normalize_dtype(value, f"{where} attribute '{name}'")
    elif base in ("Device", "Layout", "MemoryFormat"):
        out = _opaque_name(value, where, name, base)
    else:  # a type the table does not use yet: refuse rather than pass something unchecked on
        raise _bad(where, name, f"has ATen type {typ}, which the reader cannot check")
    rng = OP_RANGES.get((op, name), RANGES.get(name))
    if rng is not None and out is not None:
        problem = rng(out)
        if problem:
            raise _bad(where, name, problem)
    return out


def check_attrs(schema: OpSchema, attrs: dict[str, Any], n_inputs: int, where: str) -> dict[str, Any]:
    """Every attribute of a node of `schema`'s op: known, typed, in range; the defaults the IR leaves out filled in;
    the required ones present. `n_inputs` is the number of tensor inputs the node lists (a Tensor argument that has
    no input may sit in attrs as a scalar)."""
    args = {a.name: a for a in schema.args}
    out: dict[str, Any] = {}
    for key, value in attrs.items():
        if key in EXTRA_ATTRS:
            out[key] = _extra(key, value, where)
            continue
        arg = args.get(key)
        if arg is None:
            raise IRFormatError(f"{where}: unknown attribute '{_short_text(key)}' (the op's arguments: "
                                f"{', '.join(a.name for a in schema.args)})")
        if arg.is_tensor_list:
            raise _bad(where, key, "is a list of tensors; they belong in the node's inputs")
        out[key] = check_value(arg, value, where, schema.op)
    for arg in schema.attr_args:
        if arg.name in out:
            continue
        if arg.default is not MISSING:
            out[arg.name] = list(arg.default) if isinstance(arg.default, list) else arg.default
        else:
            # no default: ATen needs it passed (`int[1]? dim` of mean.dim may be None, but must be there), and
            # torch_ir writes every argument that is not at its default
            raise IRFormatError(f"{where}: required attribute '{arg.name}' ({arg.type}) is missing")
    return out


def _extra(key: str, value: Any, where: str) -> list:
    if not isinstance(value, list) or len(value) > MAX_LIST:
        raise _bad(where, key, f"must be a short list, got {_short(value)}")
    if key == "_tensor_list_sizes":
        return [_int(x, where, key) for x in value]
    for row in value:
        if not isinstance(row, list) or len(row) > 4096 or not all(isinstance(b, bool) for b in row):
            raise _bad(where, key, f"must be a list of lists of booleans, got {_short(value)}")
    return value


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _short_text(s: str) -> str:
    return s if len(s) <= 60 else s[:57] + "..."

