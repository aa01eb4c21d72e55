"""Expressions as readable text (for `npusim describe --source` and error messages)."""

from __future__ import annotations

from . import nodes as X

_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int64": "i64", "int32": "i32",
          "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "bool"}
_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">",
          "ge": ">=", "and": "&&", "or": "||"}


def _map(strides, offset: int, index: str) -> str:
    terms = [f"{index}{d}*{s}" if s != 1 else f"{index}{d}" for d, s in enumerate(strides) if s]
    if offset:
        terms.append(str(offset))
    return " + ".join(terms) or "0"


def format_expr(e: X.Expr) -> str:
    """One line per tree, nested calls: `bf16(a0[o0*64 + o1] + 1.0)`."""
    if isinstance(e, X.Load):
        where = _map(e.strides, e.offset, "o")
        if e.rstrides:
            where = " + ".join(p for p in (where if where != "0" else "", _map(e.rstrides, 0, "r")) if p) or "0"
        return f"a{e.arg}[{where}]"
    if isinstance(e, X.Gather):
        idx = ", ".join(format_expr(i) for i in e.indices)
        text = f"a{e.arg}<{'x'.join(map(str, e.shape))}>[{idx}]"
        return f"({format_expr(e.guard)} ? {text} : {e.fill!r})" if e.guard is not None else text
    if isinstance(e, X.Const):
        return repr(e.value)
    if isinstance(e, X.Index):
        return f"o{e.dim}"
    if isinstance(e, X.RIndex):
        return f"r{e.dim}"
    if isinstance(e, X.Acc):
        return f"acc{e.group}" if e.group else "acc"
    if isinstance(e, X.Unary):
        return f"{e.op}({format_expr(e.x)})"
    if isinstance(e, X.Binary):
        if e.op in _INFIX:
            return f"({format_expr(e.a)} {_INFIX[e.op]} {format_expr(e.b)})"
        return f"{e.op}({format_expr(e.a)}, {format_expr(e.b)})"
    if isinstance(e, X.Where):
        return f"({format_expr(e.cond)} ? {format_expr(e.a)} : {format_expr(e.b)})"
    if isinstance(e, X.Cast):
        return f"{_SHORT.get(e.dtype, e.dtype)}({format_expr(e.x)})"
    if isinstance(e, X.Reduce):
        return f"{e.op}_r({format_expr(e.body)})"
    return repr(e)
