"""The expression language of generated kernels.

A generated kernel computes one output tensor; each output element is an expression over loads of input
tensors through index maps. A load's index map is affine in the output index (strides per output dim plus an
offset, so broadcasting, transposes and slices are strides) and, inside a reduction, in the reduction index.

Values are typed by their logical ATen dtype. Renderers compute floating values in fp32 registers and round
to the logical dtype wherever a `Cast` says so: every ATen op's result is rounded to its dtype, so a fused
chain gives the same bits as the op-by-op program.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

UNARY_OPS = ("neg", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "erf", "abs", "not", "floor", "trunc")
BINARY_OPS = ("add", "sub", "mul", "div", "max", "min", "pow", "eq", "ne", "lt", "le", "gt", "ge", "and", "or")
COMPARE_OPS = ("eq", "ne", "lt", "le", "gt", "ge")
REDUCE_OPS = ("sum", "max")


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
class Const(Expr):
    value: float | int | bool


@dataclass(frozen=True)
class Index(Expr):
    """The output index along one dim (int64): for iota-like ops (arange) and masks."""

    dim: int


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
    return ()


def walk(e: Expr):
    """Post-order walk (children first), each distinct node once."""
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(e, False)]
    while stack:
        node, done = stack.pop()
        if done:
            yield node
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for c in reversed(children(node)):
            stack.append((c, False))


def map_loads(e: Expr, fn) -> Expr:
    """`e` with every Load replaced by `fn(load)` (the rest of the tree rebuilt around it)."""
    if isinstance(e, Load):
        return fn(e)
    if not children(e):
        return e
    fields = {f.name: getattr(e, f.name) for f in dataclasses.fields(e)}
    for name, value in fields.items():
        if isinstance(value, Expr):
            fields[name] = map_loads(value, fn)
    return type(e)(**fields)


def loads(e: Expr) -> list[Load]:
    return [n for n in walk(e) if isinstance(n, Load)]


# ---- serialisation (msgpack-friendly nested lists) -------------------------------------------------------


def to_data(e: Expr) -> list:
    if isinstance(e, Load):
        return ["load", e.dtype, e.arg, list(e.strides), e.offset, list(e.rstrides)]
    if isinstance(e, Const):
        return ["const", e.dtype, e.value]
    if isinstance(e, Index):
        return ["index", e.dtype, e.dim]
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


def from_data(d: list) -> Expr:
    kind, dtype = d[0], d[1]
    if kind == "load":
        return Load(dtype, d[2], tuple(d[3]), d[4], tuple(d[5]))
    if kind == "const":
        return Const(dtype, d[2])
    if kind == "index":
        return Index(dtype, d[2])
    if kind == "unary":
        return Unary(dtype, d[2], from_data(d[3]))
    if kind == "binary":
        return Binary(dtype, d[2], from_data(d[3]), from_data(d[4]))
    if kind == "where":
        return Where(dtype, from_data(d[2]), from_data(d[3]), from_data(d[4]))
    if kind == "cast":
        return Cast(dtype, from_data(d[2]))
    if kind == "reduce":
        return Reduce(dtype, d[2], from_data(d[3]))
    raise ValueError(f"unknown expression kind {kind!r}")
