"""What an expression must satisfy to be run by a kernel: every node known, every read inside its argument's buffer,
reductions where the kernel has a reduction space, row kernels' reductions independent of the row.

The lowering checks the expressions it builds, and an artifact's expressions are checked again when it is read, so
that no renderer or interpreter ever meets an index outside a buffer or a node it does not know.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..dtypes import ITEMSIZE, is_float
from . import nodes as X

MAX_NODES = 8192
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class ExprContext:
    """What a kernel offers its expression: its arguments' buffers (elements, dtype), its iteration space, its
    reduction space, how many trailing output dims form a row, and the dtype of `Acc` in an epilogue and how many
    groups of it there are."""

    arg_numels: tuple[int, ...]
    arg_dtypes: tuple[str, ...]
    out_shape: tuple[int, ...]
    reduce_shape: tuple[int, ...] = ()
    row_dims: int = 0
    acc_dtype: str | None = None
    acc_groups: int = 1


def extent(shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> int:
    """One past the largest element offset a strided map reaches (`offset` when it reaches nothing)."""
    if any(n == 0 for n in shape):
        return offset
    return offset + sum((n - 1) * s for n, s in zip(shape, strides)) + 1


def check_expr(e: X.Expr, ctx: ExprContext) -> None:
    """Raise ValueError naming the first problem of `e` in `ctx`."""
    out_rank, red_rank = len(ctx.out_shape), len(ctx.reduce_shape)
    outer_rank = out_rank - ctx.row_dims
    if not 0 <= ctx.row_dims <= out_rank:
        raise ValueError(f"row_dims {ctx.row_dims} outside 0..{out_rank}")
    count = 0
    stack: list[tuple[X.Expr, bool, int]] = [(e, False, 1)]
    while stack:
        node, in_reduce, level = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ValueError(f"expression has more than {MAX_NODES} nodes")
        if level > X.MAX_DEPTH:
            raise ValueError(f"expression deeper than {X.MAX_DEPTH} levels")
        if node.dtype not in ITEMSIZE:
            raise ValueError(f"{type(node).__name__.lower()} node of unknown dtype {node.dtype!r}")
        if isinstance(node, X.Load):
            _check_load(node, ctx, in_reduce, outer_rank)
        elif isinstance(node, X.Gather):
            _check_gather(node, ctx)
        elif isinstance(node, X.Const):
            _check_const(node)
        elif isinstance(node, X.Index):
            if node.dtype != "int64" or not 0 <= node.dim < out_rank:
                raise ValueError(f"index of dim {node.dim} ({node.dtype}) for an output of rank {out_rank}")
            if in_reduce and node.dim >= outer_rank:
                raise ValueError(f"a reduction of a row kernel reads the row index (dim {node.dim})")
        elif isinstance(node, X.RIndex):
            if node.dtype != "int64" or not in_reduce or not 0 <= node.dim < red_rank:
                raise ValueError(f"reduction index of dim {node.dim} outside a reduction of rank {red_rank}")
        elif isinstance(node, X.Acc):
            if ctx.acc_dtype is None:
                raise ValueError("'acc' outside a GEMM or convolution epilogue")
            if node.dtype != ctx.acc_dtype:
                raise ValueError(f"'acc' of dtype {node.dtype}, the epilogue's result is {ctx.acc_dtype}")
            if not 0 <= node.group < ctx.acc_groups:
                raise ValueError(f"'acc' of group {node.group} in an epilogue of {ctx.acc_groups} group(s)")
        elif isinstance(node, X.Unary):
            if node.op not in X.UNARY_OPS:
                raise ValueError(f"unknown unary op {node.op!r}")
            _typed(node, node.x.dtype == node.dtype and (node.op != "not" or node.dtype == "bool"))
        elif isinstance(node, X.Binary):
            if node.op not in X.BINARY_OPS:
                raise ValueError(f"unknown binary op {node.op!r}")
            same = node.a.dtype == node.b.dtype
            if node.op in X.COMPARE_OPS:
                _typed(node, same and node.dtype == "bool")
            elif node.op in X.LOGIC_OPS:
                _typed(node, node.a.dtype == node.b.dtype == node.dtype == "bool")
            else:
                _typed(node, same and node.a.dtype == node.dtype)
        elif isinstance(node, X.Reduce):
            if node.op not in X.REDUCE_OPS:
                raise ValueError(f"unknown reduction {node.op!r}")
            if not ctx.reduce_shape:
                raise ValueError("a reduction in a kernel without a reduction space")
            if node.dtype not in ("float32", "float64", "int64"):
                raise ValueError(f"a reduction accumulating in {node.dtype}")
            _typed(node, node.body.dtype == node.dtype)
        elif isinstance(node, X.Where):
            _typed(node, node.cond.dtype == "bool" and node.a.dtype == node.b.dtype == node.dtype)
        elif not isinstance(node, X.Cast):
            raise ValueError(f"unknown expression node {type(node).__name__}")
        # A reduction's body runs over the reduction space; a reduction met inside it is a value of its own (once
        # per row), computed before it.
        inner = in_reduce or isinstance(node, X.Reduce)
        for c in X.children(node):
            stack.append((c, inner, level + 1))


MAX_STRIDE = 2**40  # elements; far above any buffer the artifact reader admits, far below int64's bytes


def _typed(node: X.Expr, ok: bool) -> None:
    """Operands carry the dtypes their node computes in (the lowering casts explicitly; nothing converts silently):
    arithmetic and `where` in the node's dtype, comparisons of two operands of one dtype into bool, logic on bools."""
    if not ok:
        operands = ", ".join(c.dtype for c in X.children(node))
        what = getattr(node, "op", type(node).__name__.lower())
        raise ValueError(f"{what} node of dtype {node.dtype} over operands of dtype {operands}")


def _nonneg(values: tuple[int, ...], what: str) -> None:
    if any(v < 0 for v in values):
        raise ValueError(f"{what} {list(values)} has a negative entry")
    if any(v > MAX_STRIDE for v in values):
        raise ValueError(f"{what} {list(values)} has an entry above {MAX_STRIDE}")


def _check_arg(arg: int, dtype: str, ctx: ExprContext, what: str) -> int:
    if not 0 <= arg < len(ctx.arg_numels):
        raise ValueError(f"{what} of argument {arg}; the kernel has {len(ctx.arg_numels)}")
    if dtype != ctx.arg_dtypes[arg]:
        raise ValueError(f"{what} of argument {arg} as {dtype}; the buffer holds {ctx.arg_dtypes[arg]}")
    return ctx.arg_numels[arg]


def _check_load(ld: X.Load, ctx: ExprContext, in_reduce: bool, outer_rank: int) -> None:
    numel = _check_arg(ld.arg, ld.dtype, ctx, "load")
    if len(ld.strides) != len(ctx.out_shape):
        raise ValueError(f"load with {len(ld.strides)} strides for an output of rank {len(ctx.out_shape)}")
    _nonneg(ld.strides, "load strides")
    _nonneg(ld.rstrides, "load reduction strides")
    if not 0 <= ld.offset <= MAX_STRIDE:
        raise ValueError(f"load at offset {ld.offset}, outside [0, {MAX_STRIDE}]")
    shape, strides = tuple(ctx.out_shape), tuple(ld.strides)
    if ld.rstrides:
        if not in_reduce or len(ld.rstrides) != len(ctx.reduce_shape):
            raise ValueError(f"load with reduction strides {list(ld.rstrides)} outside a reduction of rank "
                             f"{len(ctx.reduce_shape)}")
        shape, strides = shape + tuple(ctx.reduce_shape), strides + tuple(ld.rstrides)
    if in_reduce and any(s for s in ld.strides[outer_rank:]):
        raise ValueError("a reduction of a row kernel loads through the row index")
    end = extent(shape, strides, ld.offset)
    if end > numel and all(shape):  # a load over an empty range reads nothing, wherever its offset points
        raise ValueError(f"load reaches element {end - 1} of argument {ld.arg}, whose buffer has {numel}")


def _check_gather(g: X.Gather, ctx: ExprContext) -> None:
    numel = _check_arg(g.arg, g.dtype, ctx, "gather")
    if not len(g.shape) == len(g.strides) == len(g.indices):
        raise ValueError(f"gather with shape {list(g.shape)}, strides {list(g.strides)} and {len(g.indices)} "
                         "indices")
    _nonneg(g.shape, "gather shape")
    _nonneg(g.strides, "gather strides")
    if not 0 <= g.offset <= MAX_STRIDE:
        raise ValueError(f"gather at offset {g.offset}, outside [0, {MAX_STRIDE}]")
    end = extent(tuple(g.shape), tuple(g.strides), g.offset)
    if end > numel:
        raise ValueError(f"gather view reaches element {end - 1} of argument {g.arg}, whose buffer has {numel}")
    for i in g.indices:
        if is_float(i.dtype) or i.dtype == "bool":
            raise ValueError(f"gather index of dtype {i.dtype}")
    if g.guard is not None and g.guard.dtype != "bool":
        raise ValueError(f"gather guard of dtype {g.guard.dtype}")
    _check_scalar(g.fill, g.dtype, "gather fill")


def _check_const(c: X.Const) -> None:
    _check_scalar(c.value, c.dtype, "constant")


def _check_scalar(v: object, dtype: str, what: str) -> None:
    if dtype == "bool":
        if not isinstance(v, bool | int):
            raise ValueError(f"{what} {v!r} of dtype bool")
        return
    if is_float(dtype):
        if not isinstance(v, bool | int | float):
            raise ValueError(f"{what} {v!r} of dtype {dtype}")
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 2**1023:
            raise ValueError(f"{what} {v} too large for {dtype}")
        return
    if isinstance(v, float) and not (math.isfinite(v) and INT64_MIN <= v <= INT64_MAX):
        raise ValueError(f"{what} {v!r} of dtype {dtype}")
    if not isinstance(v, bool | int | float) or (isinstance(v, int) and not INT64_MIN <= v <= INT64_MAX):
        raise ValueError(f"{what} {v!r} out of range for {dtype}")
