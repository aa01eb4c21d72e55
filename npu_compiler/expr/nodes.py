"""The expression language of generated kernels.

A generated kernel computes one output tensor; each output element is an expression over reads of input tensors.
A `Load` reads through an index map that is affine in the output index (strides per output dim plus an offset, so
broadcasting, transposes and slices are strides) and, inside a reduction, in the reduction index. A `Gather` reads
at an index computed by expressions (embedding rows, rotated halves, pooling windows with padding): each of its
per-dim indices is an integer expression, and a guard says where the read yields its fill value instead.

Values are typed by their logical ATen dtype. Renderers compute floating values in fp32 registers and round
to the logical dtype wherever a `Cast` says so: every ATen op's result is rounded to its dtype, so a fused
chain gives the same bits as the op-by-op program.

A `Reduce` reduces its body over the kernel's reduction space. In a row kernel (the kernel's `row_dims` > 0) a
reduction's body does not depend on the last `row_dims` output dims, so it is computed once per row and shared by
the row's elements (norms, softmax). `Acc` stands for the result of a GEMM or convolution in their epilogues.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Container
from dataclasses import dataclass

UNARY_OPS = ("neg", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "erf", "abs", "not", "floor", "trunc")
BINARY_OPS = ("add", "sub", "mul", "div", "max", "min", "pow", "eq", "ne", "lt", "le", "gt", "ge", "and", "or")
COMPARE_OPS = ("eq", "ne", "lt", "le", "gt", "ge")
LOGIC_OPS = ("and", "or")
REDUCE_OPS = ("sum", "max")

MAX_DEPTH = 256  # deeper trees are refused when read: every walk over a tree may recurse this far


@dataclass(frozen=True)
class Expr:
    dtype: str


@dataclass(frozen=True)
class Load(Expr):
    arg: int  # which kernel argument (buffer) to read
    strides: tuple[int, ...]  # per output dim, in elements
    offset: int = 0
    rstrides: tuple[int, ...] = ()  # per reduction dim (only inside a Reduce)


@dataclass(frozen=True)
class Gather(Expr):
    """`arg[offset + sum(indices[d] * strides[d])]` for a logical tensor of `shape` inside the argument's buffer.
    Where `guard` is false the value is `fill` (padding); where it holds, every index must lie in [0, shape[d]):
    the reference refuses an index outside, a GPU renderer yields `fill` there (memory safety)."""

    arg: int
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    indices: tuple[Expr, ...]
    guard: Expr | None = None
    fill: float | int | bool = 0


@dataclass(frozen=True)
class Const(Expr):
    value: float | int | bool


@dataclass(frozen=True)
class Index(Expr):
    """The output index along one dim (int64): for iota-like ops (arange), masks and gather indices."""

    dim: int


@dataclass(frozen=True)
class RIndex(Expr):
    """The reduction index along one reduction dim (int64); only inside a Reduce."""

    dim: int


@dataclass(frozen=True)
class Acc(Expr):
    """The value a GEMM or convolution computed for this output element (in its epilogue only). A GEMM whose product's
    columns are `acc_groups` groups (a gate and an up projection side by side) gives its epilogue one value per group
    at the output's column: `group` picks one."""

    group: int = 0


@dataclass(frozen=True)
class Unary(Expr):
    op: str
    x: Expr


@dataclass(frozen=True)
class Binary(Expr):
    op: str
    a: Expr
    b: Expr


@dataclass(frozen=True)
class Where(Expr):
    cond: Expr
    a: Expr
    b: Expr


@dataclass(frozen=True)
class Cast(Expr):
    """Convert (and for a half dtype, round) to `dtype`."""

    x: Expr


@dataclass(frozen=True)
class Reduce(Expr):
    """Reduce `body` over the kernel's reduction space (its `reduce_shape`), accumulating in fp32 (or int64)."""

    op: str
    body: Expr


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Unary | Cast):
        return (e.x,)
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, Where):
        return (e.cond, e.a, e.b)
    if isinstance(e, Reduce):
        return (e.body,)
    if isinstance(e, Gather):
        return e.indices + ((e.guard,) if e.guard is not None else ())
    return ()


def walk(e: Expr, known: Container[int] = ()):
    """Post-order walk (children first), each distinct node object once; without the nodes whose id is in `known`
    and without walking below them (a caller that asks about every subtree of a tree walks only what is new)."""
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(e, False)]
    while stack:
        node, done = stack.pop()
        if done:
            yield node
            continue
        if id(node) in seen or id(node) in known:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for c in reversed(children(node)):
            stack.append((c, False))


def fingerprint(e: Expr) -> bytes:
    """A digest of the tree's structure and values (two trees that render alike digest alike), each distinct node
    object digested once, so a tree that shares subtrees costs its distinct nodes, not its paths (hashing the
    dataclasses themselves recurses through every path)."""
    memo: dict[int, bytes] = {}
    for node in walk(e):
        parts = [type(node).__name__]
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            if isinstance(value, Expr):
                parts.append(memo[id(value)].hex())
            elif isinstance(value, tuple) and value and all(isinstance(v, Expr) for v in value):
                parts.append(",".join(memo[id(v)].hex() for v in value))
            else:
                parts.append(repr(value))
        memo[id(node)] = hashlib.blake2b("|".join(parts).encode(), digest_size=16).digest()
    return memo[id(e)]


def rebuild(e: Expr, fn) -> Expr:
    """`e` with every child `c` replaced by `fn(c)` (fields that hold expressions or tuples of them)."""
    if not children(e):
        return e
    fields = {}
    for f in dataclasses.fields(e):
        value = getattr(e, f.name)
        if isinstance(value, Expr):
            value = fn(value)
        elif isinstance(value, tuple) and value and all(isinstance(v, Expr) for v in value):
            value = tuple(fn(v) for v in value)
        fields[f.name] = value
    return type(e)(**fields)


def map_loads(e: Expr, fn, _memo: dict | None = None) -> Expr:
    """`e` with every Load replaced by `fn(load)` (the rest of the tree rebuilt around it). A subtree the tree shares
    is rebuilt once and stays shared (rebuilding every path of a tree that shares subtrees, a quantize's rounding
    reads its operand five times, grows it exponentially)."""
    memo: dict[int, tuple[Expr, Expr]] = {} if _memo is None else _memo
    hit = memo.get(id(e))
    if hit is not None:
        return hit[1]
    out = fn(e) if isinstance(e, Load) else rebuild(e, lambda c: map_loads(c, fn, memo))
    memo[id(e)] = (e, out)  # the key's object is kept alive, so its id is not reused while the memo lives
    return out


def substitute(e: Expr, fn, _memo: dict | None = None) -> Expr:
    """`e` with every node for which `fn(node)` returns an expression replaced by it (top-down); shared subtrees
    stay shared, as in `map_loads`."""
    memo: dict[int, tuple[Expr, Expr]] = {} if _memo is None else _memo
    hit = memo.get(id(e))
    if hit is not None:
        return hit[1]
    new = fn(e)
    out = new if new is not None else rebuild(e, lambda c: substitute(c, fn, memo))
    memo[id(e)] = (e, out)
    return out


def loads(e: Expr) -> list[Load]:
    return [n for n in walk(e) if isinstance(n, Load)]


def reads(e: Expr) -> list[Load | Gather]:
    """Every memory read of the tree (Loads and Gathers)."""
    return [n for n in walk(e) if isinstance(n, Load | Gather)]


def depth(e: Expr) -> int:
    """Height of the tree (a leaf is 1), without recursion."""
    heights: dict[int, int] = {}
    for n in walk(e):
        heights[id(n)] = 1 + max((heights[id(c)] for c in children(n)), default=0)
    return heights[id(e)]


# ---- serialisation (msgpack-friendly nested lists) -------------------------------------------------------


def to_data(e: Expr) -> list:
    if isinstance(e, Load):
        return ["load", e.dtype, e.arg, list(e.strides), e.offset, list(e.rstrides)]
    if isinstance(e, Gather):
        return ["gather", e.dtype, e.arg, e.offset, list(e.shape), list(e.strides), [to_data(i) for i in e.indices],
                to_data(e.guard) if e.guard is not None else None, e.fill]
    if isinstance(e, Const):
        return ["const", e.dtype, e.value]
    if isinstance(e, Index):
        return ["index", e.dtype, e.dim]
    if isinstance(e, RIndex):
        return ["rindex", e.dtype, e.dim]
    if isinstance(e, Acc):
        return ["acc", e.dtype, e.group]
    if isinstance(e, Unary):
        return ["unary", e.dtype, e.op, to_data(e.x)]
    if isinstance(e, Binary):
        return ["binary", e.dtype, e.op, to_data(e.a), to_data(e.b)]
    if isinstance(e, Where):
        return ["where", e.dtype, to_data(e.cond), to_data(e.a), to_data(e.b)]
    if isinstance(e, Cast):
        return ["cast", e.dtype, to_data(e.x)]
    if isinstance(e, Reduce):
        return ["reduce", e.dtype, e.op, to_data(e.body)]
    raise TypeError(f"not an expression: {e!r}")


_ARITY = {"load": 6, "gather": 9, "const": 3, "index": 3, "rindex": 3, "acc": 3, "unary": 4, "binary": 5,
          "where": 5, "cast": 3, "reduce": 4}


def from_data(d: object, _depth: int = 0) -> Expr:
    """An expression from its data form. Only the shape of the data is checked here (a clear ValueError for anything
    malformed, never a deep recursion); `check.check_expr` checks what it means for a kernel."""
    if _depth > MAX_DEPTH:
        raise ValueError(f"expression deeper than {MAX_DEPTH} levels")
    if not isinstance(d, list | tuple) or len(d) < 2 or not isinstance(d[0], str):
        raise ValueError(f"an expression node must be a list [kind, dtype, ...], got {_short(d)}")
    kind, dtype = d[0], d[1]
    if kind not in _ARITY:
        raise ValueError(f"unknown expression kind {kind!r}")
    if len(d) != _ARITY[kind]:
        raise ValueError(f"expression node {kind!r} has {len(d)} fields, expected {_ARITY[kind]}")
    if not isinstance(dtype, str):
        raise ValueError(f"expression node {kind!r}: dtype must be a string, got {_short(dtype)}")
    sub = lambda x: from_data(x, _depth + 1)  # noqa: E731
    if kind == "load":
        return Load(dtype, _int(d[2], "arg"), _ints(d[3], "strides"), _int(d[4], "offset"), _ints(d[5], "rstrides"))
    if kind == "gather":
        if not isinstance(d[6], list | tuple):
            raise ValueError("gather: indices must be a list")
        return Gather(dtype, _int(d[2], "arg"), _int(d[3], "offset"), _ints(d[4], "shape"), _ints(d[5], "strides"),
                      tuple(sub(i) for i in d[6]), sub(d[7]) if d[7] is not None else None, _scalar(d[8], "fill"))
    if kind == "const":
        return Const(dtype, _scalar(d[2], "value"))
    if kind == "index":
        return Index(dtype, _int(d[2], "dim"))
    if kind == "rindex":
        return RIndex(dtype, _int(d[2], "dim"))
    if kind == "acc":
        return Acc(dtype, _int(d[2], "group"))
    if kind == "unary":
        return Unary(dtype, _str(d[2], "op"), sub(d[3]))
    if kind == "binary":
        return Binary(dtype, _str(d[2], "op"), sub(d[3]), sub(d[4]))
    if kind == "where":
        return Where(dtype, sub(d[2]), sub(d[3]), sub(d[4]))
    if kind == "cast":
        return Cast(dtype, sub(d[2]))
    return Reduce(dtype, _str(d[2], "op"), sub(d[3]))


def _short(x: object) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def _int(x: object, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise ValueError(f"{what} must be an integer, got {_short(x)}")
    return x


def _ints(x: object, what: str) -> tuple[int, ...]:
    if not isinstance(x, list | tuple):
        raise ValueError(f"{what} must be a list of integers, got {_short(x)}")
    return tuple(_int(v, what) for v in x)


def _str(x: object, what: str) -> str:
    if not isinstance(x, str):
        raise ValueError(f"{what} must be a string, got {_short(x)}")
    return x


def _scalar(x: object, what: str) -> float | int | bool:
    if not isinstance(x, bool | int | float):
        raise ValueError(f"{what} must be a number, got {_short(x)}")
    return x
