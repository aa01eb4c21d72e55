"""Convs that absorb the 1x1 conv whose result their epilogue adds: a ResNet block's projection shortcut
(`downsample`: a 1x1 conv, often of stride 2, with its folded BatchNorm) added to the block's last conv.

Written apart, the shortcut conv stores its full-size result and the last conv's epilogue reads it back: at ResNet-50's
first stage and batch 64, 103 MB written and read again around two kernels. Where the target runs it
(`CodegenTarget.conv_side`), the last conv computes the shortcut itself as a side conv (`Conv2dKernel.side_stride`):
it reads the shortcut's input, and its epilogue's load of the shortcut's result becomes `Acc(1)`, that result as the
shortcut stored it (its sum plus its bias, rounded to the output dtype). Nothing changes in what is computed.

It applies where the shortcut is a 1x1 conv with no padding, one group, no K split and no epilogue of its own, its
result an intermediate that only the epilogue reads, at the output element itself, and no kernel between the two
writes what the shortcut reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..errors import InternalError
from ..expr import nodes as X
from ..kernels import Conv2dKernel, KernelCall, plan_of
from ..program import BufferSpec
from ..targets.codegen import CodegenTarget


def fold_side_convs(kernels: list[KernelCall], buffers: Sequence[BufferSpec], target: CodegenTarget) -> int:
    """Fold, in place, every shortcut conv into the conv whose epilogue adds it; returns how many were folded."""
    touched: dict[int, int] = {}  # buffer -> how many kernels read or write it
    writers: dict[int, list[int]] = {}  # buffer -> the kernels that write it, in order
    for i, k in enumerate(kernels):
        for b in {r.buffer for r in (*k.args, *k.writes)}:
            touched[b] = touched.get(b, 0) + 1
        for r in k.writes:
            writers.setdefault(r.buffer, []).append(i)
    gone: set[int] = set()
    for j, k in enumerate(kernels):
        if not _may_take(k):
            continue
        for i in _shortcuts(k, writers, j):
            if i in gone or not isinstance(kernels[i].spec, Conv2dKernel):
                continue
            if any(i < w < j for r in _side_args(kernels[i]) for w in writers.get(r.buffer, ())):
                continue  # its inputs are overwritten before the conv runs
            fused = _fold(kernels[i], k, buffers, touched)
            if fused is not None and target.conv_side(fused, buffers):
                kernels[j] = fused
                gone.add(i)
                break
    if gone:
        kernels[:] = [k for i, k in enumerate(kernels) if i not in gone]
        for i, k in enumerate(kernels):  # names stay each kernel's position, as the lowering gave them
            k.name = f"k{i}_{k.kind}"
    return len(gone)


def _unsplit(k: KernelCall) -> bool:
    return getattr(plan_of(k), "splits", 1) == 1 and not k.scratch


def _may_take(k: KernelCall) -> bool:
    spec = k.spec
    return (isinstance(spec, Conv2dKernel) and not spec.side_stride and _unsplit(k) and spec.groups == 1
            and spec.epilogue is not None)


def _shortcuts(k: KernelCall, writers: dict[int, list[int]], j: int) -> list[int]:
    """The kernels before `j` that last wrote a buffer `k`'s epilogue loads."""
    spec: Conv2dKernel = k.spec
    out = []
    for e in X.walk(spec.epilogue):
        if isinstance(e, X.Load) and e.arg >= spec.first_epilogue_arg:
            before = [w for w in writers.get(k.args[e.arg].buffer, ()) if w < j]
            if before and before[-1] not in out:
                out.append(before[-1])
    return out


def _side_args(k: KernelCall) -> list:
    spec: Conv2dKernel = k.spec
    return k.args[:spec.first_epilogue_arg]


def _fold(side: KernelCall, main: KernelCall, buffers: Sequence[BufferSpec],
          touched: dict[int, int]) -> KernelCall | None:
    s, m = side.spec, main.spec
    if not (isinstance(s, Conv2dKernel) and s.epilogue is None and not s.side_stride and _unsplit(side)
            and s.groups == 1 and tuple(s.padding) == (0, 0) and tuple(s.dilation) == (1, 1)
            and len(side.outs) == 1 and len(main.outs) == 1):
        return None
    w2 = side.args[1]
    res, out = side.outs[0], main.outs[0]
    rb = buffers[res.buffer]
    if (tuple(w2.shape[2:]) != (1, 1) or rb.kind != "arena" or touched.get(res.buffer) != 2
            or tuple(res.shape) != tuple(out.shape) or rb.dtype != buffers[out.buffer].dtype
            or any(r.buffer == res.buffer for r in (*side.args, *main.args[:m.first_epilogue_arg]))):
        return None
    first = m.first_epilogue_arg
    kept = [a for a in range(first, len(main.args)) if main.args[a].buffer != res.buffer]
    side_args = _side_args(side)
    arg_of = {a: first + len(side_args) + n for n, a in enumerate(kept)}
    failed = False

    def rebind(e: X.Expr) -> X.Expr | None:
        nonlocal failed
        if (isinstance(e, X.Acc) and e.group != 0) or isinstance(e, X.Gather):
            failed = True  # (a gather's indices may load too: not renumbered here)
            return e
        if not isinstance(e, X.Load) or e.arg < first:
            return None
        if e.arg in arg_of:
            return dataclasses.replace(e, arg=arg_of[e.arg])
        # a read of the shortcut's result: only at the output element itself
        same = all(a == b or n == 1 for a, b, n in zip(e.strides, res.strides, res.shape, strict=True))
        if e.rstrides or len(e.strides) != len(res.shape) or not same or e.offset != res.offset or e.dtype != rb.dtype:
            failed = True
            return e
        return X.Acc(e.dtype, 1)

    expr = X.substitute(m.epilogue, rebind)
    if failed or not any(isinstance(n, X.Acc) and n.group == 1 for n in X.walk(expr)):
        return None
    spec = dataclasses.replace(m, epilogue=expr, side_stride=tuple(s.stride), side_bias=s.bias)
    args = [*main.args[:first], *side_args, *(main.args[a] for a in kept)]
    call = KernelCall(main.name, spec, args, list(main.outs), list(dict.fromkeys([*side.nodes, *main.nodes])),
                      main.group, list(main.out_values), list(main.out_rows), main.plan)
    try:
        spec.check(call, buffers)
    except ValueError as e:
        raise InternalError("folding a side conv", f"kernels {side.name} and {main.name} made an invalid conv2d: "
                                                   f"{e}") from e
    return call


__all__ = ["fold_side_convs"]
