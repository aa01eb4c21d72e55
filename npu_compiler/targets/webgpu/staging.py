"""Folded records in passes: how the webgpu target runs a record it has no one kernel for (its plan says which).

- A GEMM that computes its operand in a prologue (`GemmPlan.prologue_apart`): a generated kernel computes the
  prologue's rows into the plan's scratch ([batch..., m, k] in the prologue's dtype), then the GEMM reads them.
- A conv that computes a side conv (`Conv2dPlan.side_apart`): the side conv (with its bias, no epilogue) writes its
  result rounded to the output dtype into the plan's scratch, then the conv runs with its epilogue reading that
  result where the record reads `Acc(1)`.
- A row kernel that also stores a side value (`GeneratedPlan.side_apart`): the row kernel, then an elementwise
  kernel storing the side value.

Each pass is a call of its own over the record's views and the plan's scratch (buffers of the original call), so
that the target renders it as any record of its kind; the values handed from one pass to the next are those the
record's computation defines, rounded where it rounds them, so the passes give the record's results."""

from __future__ import annotations

import dataclasses

from ...expr import nodes as X
from ...kernels import Conv2dKernel, GemmKernel, GeneratedKernel, KernelCall, plan_of
from ...program import TensorRef
from ...tensor import contiguous_strides


def _view(ref: TensorRef, shape: tuple[int, ...]) -> TensorRef:
    """A contiguous view of a scratch buffer as `shape`."""
    return TensorRef(ref.buffer, tuple(shape), contiguous_strides(tuple(shape)), ref.offset)


def _shift_args(e: X.Expr | None, by: dict[int, int]) -> X.Expr | None:
    """`e` with its loads' and gathers' arguments renumbered by `by` (old index -> new)."""
    if e is None:
        return None

    def renumber(n: X.Expr) -> X.Expr | None:
        if isinstance(n, X.Load):
            return dataclasses.replace(n, arg=by[n.arg])
        if isinstance(n, X.Gather):
            return dataclasses.replace(n, arg=by[n.arg], indices=tuple(X.substitute(i, renumber) for i in n.indices),
                                       guard=X.substitute(n.guard, renumber) if n.guard is not None else None)
        return None

    return X.substitute(e, renumber)


def _prologue_passes(k: KernelCall) -> list[KernelCall]:
    spec: GemmKernel = k.spec
    a = _view(k.scratch[0], spec.a_shape)
    rows = GeneratedKernel(spec.prologue, tuple(spec.prologue_reduce), 1 if spec.prologue_reduce else 0)
    first = KernelCall(f"{k.name}.prologue", rows, list(k.args), [a], k.nodes, k.group)
    # the GEMM reading the rows: a comes first, every other argument one later
    gemm = dataclasses.replace(spec, prologue=None, prologue_reduce=(),
                               epilogue=_shift_args(spec.epilogue, {i: i + 1 for i in range(len(k.args))}))
    second = KernelCall(k.name, gemm, [a, *k.args], list(k.outs), k.nodes, k.group)
    return [first, second]


def _side_conv_passes(k: KernelCall) -> list[KernelCall]:
    spec: Conv2dKernel = k.spec
    out = k.outs[0]
    side_out = _view(k.scratch[0], tuple(out.shape))
    s0, n_side = spec.side_first_arg, 2 + int(spec.side_bias)
    side = Conv2dKernel(tuple(spec.side_stride), (0, 0), (1, 1), 1, spec.side_bias)
    first = KernelCall(f"{k.name}.side", side, k.args[s0:s0 + n_side], [side_out], k.nodes, k.group)
    # the conv without its side: its epilogue's arguments close the gap, the side's result is read as the last one
    kept = [i for i in range(len(k.args)) if not s0 <= i < s0 + n_side]
    renumber = {old: new for new, old in enumerate(kept)}
    last = len(kept)
    dtype = next(n.dtype for n in X.walk(spec.epilogue) if isinstance(n, X.Acc) and n.group == 1)

    def side_load(n: X.Expr) -> X.Expr | None:
        if isinstance(n, X.Acc) and n.group == 1:
            return X.Load(dtype, last, tuple(side_out.strides), 0)
        return None

    epilogue = X.substitute(_shift_args(spec.epilogue, {**renumber, **{i: i for i in range(s0, s0 + n_side)}}),
                            side_load)
    conv = dataclasses.replace(spec, epilogue=epilogue, side_stride=(), side_bias=False)
    second = KernelCall(k.name, conv, [*(k.args[i] for i in kept), side_out], list(k.outs), k.nodes, k.group)
    return [first, second]


def _side_output_passes(k: KernelCall) -> list[KernelCall]:
    spec: GeneratedKernel = k.spec
    rows = dataclasses.replace(spec, side=None)
    first = KernelCall(k.name, rows, list(k.args), [k.outs[0]], k.nodes, k.group)
    store = GeneratedKernel(spec.side)
    second = KernelCall(f"{k.name}.side", store, list(k.args), [k.outs[1]], k.nodes, k.group)
    return [first, second]


def passes(k: KernelCall) -> list[KernelCall]:
    """The calls the webgpu target runs for `k`, in order: `k` itself, or its plan's passes."""
    plan = plan_of(k)
    if getattr(plan, "prologue_apart", False):
        return _prologue_passes(k)
    if getattr(plan, "side_apart", False) and isinstance(k.spec, Conv2dKernel):
        return _side_conv_passes(k)
    if isinstance(k.spec, GeneratedKernel) and k.spec.side is not None:
        return _side_output_passes(k)  # (no scratch: a row kernel's side output is stored apart with or without a plan)
    return [k]


__all__ = ["passes"]
