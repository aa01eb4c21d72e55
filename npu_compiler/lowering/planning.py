"""Plans beside the records the lowering built: the scratch a plan asks for, and the plans of folded records.

The lowering asks the target for a record's plan where it builds the record (`Lowering.plan`: attention, convs on
matrix units); the records the folding passes make after lowering (a shortcut conv computed by the conv that adds it)
and those a target runs in passes (a GEMM's prologue, a row kernel's side output, on a target without kernels that
compute them) are planned here, once the kernel list is final and before the memory plan places every buffer."""

from __future__ import annotations

from ..kernels import Conv2dKernel, GemmKernel, GeneratedKernel, KernelCall
from ..program import BufferSpec, full_ref


def attach(k: KernelCall, plan, buffers: list[BufferSpec], shared: dict, prefix: str) -> None:
    """Give `k` its plan and the scratch the plan asks for: a new arena buffer each (named `prefix`.name), or the one
    an earlier call's plan made under the same `shared` key."""
    for s in plan.scratch(k, buffers):
        ref = shared.get(s.shared) if s.shared is not None else None
        if ref is None:
            b = BufferSpec(len(buffers), f"{prefix}.{s.name}", "arena", s.dtype, s.numel)
            buffers.append(b)
            ref = full_ref(b, (s.numel,))
            if s.shared is not None:
                shared[s.shared] = ref
        k.scratch.append(ref)
    k.plan = plan


def _folded(k: KernelCall) -> bool:
    spec = k.spec
    return ((isinstance(spec, GemmKernel) and spec.prologue is not None)
            or (isinstance(spec, GeneratedKernel) and spec.side is not None)
            or (isinstance(spec, Conv2dKernel) and bool(spec.side_stride)))


def plan_folded(kernels: list[KernelCall], buffers: list[BufferSpec], target) -> int:
    """Ask the target for the plan of every folded record that has none yet; returns how many it planned."""
    shared: dict = {}
    n = 0
    for k in kernels:
        if k.plan is None and _folded(k):
            plan = target.plan(k, buffers)
            if plan is not None:
                attach(k, plan, buffers, shared, k.name)
                n += 1
    return n


__all__ = ["attach", "plan_folded"]
