"""GEMMs that absorb the elementwise kernel after them where it combines columns of their result: SiLU(gate) * up
over a gate/up projection that `concat_linears` made one GEMM (SwiGLU; GeGLU, ReGLU and any other such expression
alike).

The kernel after a GEMM reads the GEMM's result at the same row and at columns that are a whole number of its own
output widths apart (column j and column j + H of a result of G * H columns). Written apart, the GEMM stores G * H
values a row and the next kernel reads them back; where the target runs it (`CodegenTarget.gemm_column_groups`: a
decode step's GEMV computes column j of every group in one warp) the GEMM takes that kernel as an epilogue over
column groups (`GemmKernel.acc_groups`; a weight-only `wgemm` alike, where `CodegenTarget.wgemm_column_groups`):
each of its loads of the result becomes `Acc(group)`, and the GEMM writes the kernel's output. A launch a layer less
in a decode step, and nothing changes in what is computed: the epilogue reads the same rounded values the kernel read
from memory.

It applies to a pair of consecutive kernels only (so nothing between them can write what the epilogue reads), where
the result is an intermediate that no other kernel touches, and the elementwise kernel reads it through plain loads
in its own index space (no gathers, reductions or index arithmetic, which would need the result elsewhere).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..errors import InternalError
from ..expr import nodes as X
from ..kernels import GemmKernel, GeneratedKernel, KernelCall, WGemmKernel
from ..program import BufferSpec, contiguous_strides
from ..targets.codegen import CodegenTarget
from . import views as V


def fold_column_epilogues(kernels: list[KernelCall], buffers: Sequence[BufferSpec], target: CodegenTarget) -> int:
    """Fold, in place, every GEMM + elementwise pair that can be one GEMM with a column-group epilogue; returns how
    many were folded."""
    touched: dict[int, int] = {}  # buffer -> how many kernels read or write it
    for k in kernels:
        for b in {r.buffer for r in (*k.args, *k.writes)}:
            touched[b] = touched.get(b, 0) + 1
    out: list[KernelCall] = []
    count = 0
    i = 0
    while i < len(kernels):
        fused = _fold(kernels[i], kernels[i + 1], buffers, touched, target) if i + 1 < len(kernels) else None
        if fused is None:
            out.append(kernels[i])
            i += 1
        else:
            out.append(fused)
            count += 1
            i += 2
    kernels[:] = out
    if count:  # names stay each kernel's position, as the lowering gave them (profiles list kernels by it)
        for i, k in enumerate(kernels):
            k.name = f"k{i}_{k.kind}"
    return count


def _squeezed(shape: Sequence[int]) -> list[int]:
    return [d for d, n in enumerate(shape) if n != 1]


def _fold(k1: KernelCall, k2: KernelCall, buffers: Sequence[BufferSpec], touched: dict[int, int],
          target: CodegenTarget) -> KernelCall | None:
    g1, g2 = k1.spec, k2.spec
    if not (isinstance(g1, GemmKernel | WGemmKernel) and g1.acc_groups == 1 and g1.epilogue is None):
        return None
    if not (isinstance(g2, GeneratedKernel) and not g2.reduce_shape and not g2.row_dims and g2.scatter is None):
        return None
    res, out2 = k1.outs[0], k2.outs[0]
    rb = buffers[res.buffer]
    if (rb.kind != "arena" or touched.get(res.buffer) != 2 or res.offset != 0 or not res.is_contiguous()
            or not res.is_whole(rb.numel) or out2.buffer == res.buffer
            or any(r.buffer == res.buffer for r in k1.args)):
        return None
    if buffers[out2.buffer].dtype != rb.dtype:  # `Acc` is the product rounded to the output dtype
        return None
    s1 = tuple(res.shape)  # (*batch, m, n)
    s2 = tuple(out2.shape)
    h = s2[-1] if s2 else 0
    if h < 1 or g1.n % h or g1.n // h < 2:
        return None
    groups = g1.n // h
    so = (*s1[:-1], h)  # the folded GEMM's output
    d1, d2 = _squeezed(so), _squeezed(s2)
    if [so[d] for d in d1] != [s2[d] for d in d2] or (d2 and d2[-1] != len(s2) - 1) or (d1 and d1[-1] != len(so) - 1):
        return None
    out = V.reshape(out2, so)
    if out is None:
        return None
    cs = contiguous_strides(s1)
    nargs = len(k1.args)
    extra = [j for j, r in enumerate(k2.args) if r.buffer != res.buffer]
    arg_of = {j: nargs + p for p, j in enumerate(extra)}
    failed = False

    def strides_in_so(st: Sequence[int]) -> tuple[int, ...]:
        new = [0] * len(so)
        for a, b in zip(d1, d2):
            new[a] = st[b]
        return tuple(new)

    def rebind(e: X.Expr) -> X.Expr | None:
        nonlocal failed
        if isinstance(e, X.Index | X.RIndex | X.Gather | X.Reduce | X.Acc):
            failed = True
            return e
        if not isinstance(e, X.Load):
            return None
        if e.rstrides:
            failed = True
            return e
        st = strides_in_so(e.strides)
        if e.arg in arg_of:
            return X.Load(e.dtype, arg_of[e.arg], st, e.offset)
        # a read of the result: at this output element's row, a whole number of output widths to the right
        if any(st[d] != cs[d] for d in d1) or e.offset % h or not 0 <= e.offset // h < groups:
            failed = True
            return e
        return X.Acc(e.dtype, e.offset // h)

    expr = X.substitute(g2.expr, rebind)
    if failed or not any(isinstance(n, X.Acc) for n in X.walk(expr)):
        return None
    spec = dataclasses.replace(g1, epilogue=expr, acc_groups=groups)
    call = KernelCall(k1.name, spec, [*k1.args, *(k2.args[j] for j in extra)], [out],
                      list(dict.fromkeys([*k1.nodes, *k2.nodes])), k1.group, list(k2.out_values),
                      list(k2.out_rows))
    try:
        spec.check(call, buffers)
    except ValueError as e:
        raise InternalError("folding a column epilogue", f"kernels {k1.name} and {k2.name} made an invalid gemm: "
                                                         f"{e}") from e
    if isinstance(spec, WGemmKernel):
        return call if target.wgemm_column_groups(call, buffers) else None
    return call if target.gemm_column_groups(call, buffers) else None


__all__ = ["fold_column_epilogues"]
