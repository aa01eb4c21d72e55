"""The webgpu target: WGSL compute shaders rendered from kernel records, for wgpu (Metal, Vulkan, D3D12).

As on cuda, nothing is rendered at compile time: the runtime renders a program's kernels when it loads it, for the
device it runs on (`DeviceCaps`: the largest storage binding, bindings per stage, whether `shader-f16` is there).
Every kernel renders to one dispatch: a WGSL module (its entry point `npu_kernel`), the workgroup grid, and the
storage bindings it takes (`bindings.py`). A program is the list of its kernels' dispatches, recorded by the runtime
into one compute pass and submitted once.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ...devices import DeviceProfile, get_profile
from ...errors import NPUCompileError
from ...kernels import (
    AttentionKernel,
    AttentionPlan,
    Conv2dKernel,
    Conv2dPlan,
    GemmKernel,
    GemmPlan,
    GeneratedKernel,
    GeneratedPlan,
)
from ...program import CompiledProgram, KernelCall
from ..clike import Store, render_expression
from ..codegen import CodegenTarget
from ..planning import decode_splits
from .bindings import Binding, DeviceCaps, bind, finish_source, generated_params, params_of
from .gemv import gemv, gemv_fits, prologue_fits
from .int8_kernels import INTEGER_KERNELS, render_integer
from .intervals import narrow_int64
from .language import WGSL, reg
from .library import attention, conv2d, conv_splits, gemm, names_of, skinny_groups_fit
from .staging import passes


@dataclass
class Dispatch:
    """One dispatch of a kernel: the source it runs (a name in `RenderedProgram.sources`), its workgroup grid
    (each dim at most 65,535) and its bindings."""

    source: str
    grid: tuple[int, int, int]
    bindings: list[Binding]

    @property
    def uses_status(self) -> bool:
        return any(b.ptr[0] == "status" for b in self.bindings)


@dataclass
class RenderedProgram:
    sources: dict[str, str] = field(default_factory=dict)
    steps: list[list[Dispatch]] = field(default_factory=list)


def render_generated(k: KernelCall, program: CompiledProgram) -> tuple[str, object, list]:
    spec: GeneratedKernel = k.spec
    out = k.outs[0]
    od = program.dtype_of(out)
    shape, reduce_shape = spec.iteration_shape(k), tuple(spec.reduce_shape)
    store = Store(tuple(out.shape), tuple(out.strides), out.offset, od)
    if spec.scatter is not None:
        store.scatter_dim = spec.scatter.dim
        store.scatter_index = narrow_int64(spec.scatter.index, shape)
        store.scatter_size = out.shape[spec.scatter.dim]
    dts = [program.dtype_of(a) for a in k.args]
    extents = [program.buffers[a.buffer].numel for a in k.args]
    ptrs = [("out", 0)] + [("arg", i) for i in range(len(k.args))]
    src, launch = render_expression(WGSL, narrow_int64(spec.expr, shape, reduce_shape), dts, extents, store, shape,
                                    reduce_shape, spec.row_dims, ptrs)
    return src, launch, generated_params(ptrs)


def _needs_scratch(k: KernelCall, program: CompiledProgram, storage: int) -> bool:
    """A folded record the target runs in passes that hand a value on through scratch (a GEMM whose prologue the
    GEMV does not compute, a conv with a side conv)."""
    spec = k.spec
    return ((isinstance(spec, GemmKernel) and spec.prologue is not None
             and not gemv_fits(k, program.buffers, storage))
            or (isinstance(spec, Conv2dKernel) and bool(spec.side_stride)))


class WebGPUTarget(CodegenTarget):
    name = "webgpu"
    default_device = "webgpu"
    library_kernels = frozenset({"gemm", "conv2d", "attention"}) | INTEGER_KERNELS
    # Decode's norms stay kernels of their own: every workgroup of a GEMV with a norm prologue computes the rows for
    # itself, which cost more than the norm's one kernel (Qwen2.5-1.5B decode at KV 1024 on the H200 through Vulkan:
    # 6.39 ms folded, 5.00 ms apart). The GEMV still computes a prologue a record carries (gemm_prologue says which
    # it can), where a subclass or an artifact asks for one.
    gemm_prologue_rows = 0
    plans_convs = True  # a conv of too few tiles splits its K (conv_splits)

    def __init__(self, device: DeviceProfile | str | None = None, caps: DeviceCaps | None = None) -> None:
        self.caps = caps or DeviceCaps()
        # the device the dispatches are sized for (its compute units: wgpu reports none, so a known product's or the
        # `webgpu` row's); the caps say what the adapter allows
        self.profile = device if isinstance(device, DeviceProfile) else get_profile(device or self.default_device)

    @property
    def workgroup_storage(self) -> int:
        """Workgroup memory a kernel may plan on: the profile's, within the adapter's (a record folded at compile
        time, on the `webgpu` row's 16 KiB, also fits when rendered for the adapter, which has at least as much)."""
        return min(self.profile.shared_memory_per_block, self.caps.max_workgroup_storage)

    def plan(self, call, buffers):
        """An attention of few query rows: its keys split across workgroups until about two a compute unit run; a
        conv of too few tiles for the device: its K split likewise (`conv_splits`). A folded record (a GEMM's
        prologue the GEMV does not compute, a conv's side conv, a row kernel's side output): in passes
        (staging.py)."""
        spec = call.spec
        if isinstance(spec, AttentionKernel):
            return AttentionPlan(decode_splits(spec, self.profile))
        if isinstance(spec, GemmKernel) and spec.prologue is not None:
            return None if gemv_fits(call, buffers, self.workgroup_storage) else GemmPlan(prologue_apart=True)
        if isinstance(spec, Conv2dKernel) and spec.side_stride:
            return Conv2dPlan(side_apart=True)
        if isinstance(spec, Conv2dKernel) and reg(buffers[call.outs[0].buffer].dtype) == "f32":
            w, out = call.args[1], call.outs[0]
            splits = self.conv_splits(out.shape[0] * out.shape[2] * out.shape[3], w.shape[0] // spec.groups,
                                      math.prod(w.shape[1:]), spec.groups)
            return Conv2dPlan(splits=splits) if splits > 1 else None
        if isinstance(spec, GeneratedKernel) and spec.side is not None:
            return GeneratedPlan(side_apart=True)
        return None

    def conv_splits(self, pixels: int, out_channels: int, k: int, groups: int) -> int:
        return conv_splits(pixels, out_channels, k, groups, self.profile)

    def gemm_column_groups(self, call, buffers) -> bool:
        # the GEMV or skinny GEMM of a decode step, each workgroup with every group of its columns
        return (gemv_fits(call, buffers, self.workgroup_storage)
                or skinny_groups_fit(call.spec, buffers[call.outs[0].buffer].dtype))

    def wgemm_column_groups(self, call, buffers) -> bool:
        # the wgemm's workgroup sums every group's row of its column (int8_kernels.wgemm); its norms stay kernels
        return not call.spec.batch

    def gemm_prologue(self, m, k, batch, a_dtype, b, b_dtype, reduces) -> bool:
        # norms only, as cuda: every workgroup computes the rows for itself, which only a reduction's saved launch
        # and round trip through memory pays for
        return reduces and prologue_fits(m, k, batch, a_dtype, b, b_dtype, self.workgroup_storage)

    def render_kernel(self, index: int, k: KernelCall, program: CompiledProgram) -> list[tuple[str, Dispatch]]:
        """The WGSL modules of kernel `index` and their dispatches, in order (their `source` still unnamed): one,
        or three for split decode attention."""
        where = f"kernel {k.name} ({k.kind}, nodes {', '.join(k.nodes[:4])})"
        plan = k.plan
        apart = bool(k.scratch) and (getattr(plan, "side_apart", False) or getattr(plan, "prologue_apart", False))
        if _needs_scratch(k, program, self.workgroup_storage) and not apart:
            raise NPUCompileError(f"{where}: the webgpu target runs this {k.kind} in passes, which need the scratch "
                                  f"of a webgpu plan computing it apart; this call has none (compile it for webgpu)")
        parts = [part for call in passes(k) for part in self._parts(call, program, where)]
        # every pass's buffers are the call's own: its bindings name them by an output or argument of the call
        of_buffer: dict[int, tuple[str, int]] = {}
        for tag, refs in (("arg", k.args), ("out", k.writes)):
            for i, r in enumerate(refs):
                of_buffer[r.buffer] = (tag, i)
        out = []
        for src, launch, params, call in parts:
            decls, bindings = bind(params, call, program, self.caps)
            bindings = [dataclasses.replace(b, ptr=of_buffer[(call.writes if b.ptr[0] == "out" else call.args)
                                                              [b.ptr[1]].buffer]) if b.ptr[0] in ("out", "arg") else b
                        for b in bindings]
            text = finish_source(src, decls, bindings, index, self.caps.division, self.caps.products)
            if len(bindings) > self.caps.max_bindings:
                raise NPUCompileError(f"{where}: needs {len(bindings)} storage bindings, the device allows "
                                      f"{self.caps.max_bindings} per shader stage")
            out.append((text, Dispatch("", tuple(int(g) for g in launch.grid), bindings)))
        return out

    def _parts(self, k: KernelCall, program: CompiledProgram, where: str) -> list[tuple]:
        """The (source, launch, parameters, call) of each launch of one call whose record the target runs whole."""
        spec = k.spec
        if isinstance(spec, GeneratedKernel):
            src, launch, params = render_generated(k, program)
            return [(src, launch, params, k)]
        if isinstance(spec, GemmKernel) and gemv_fits(k, program.buffers, self.workgroup_storage):
            src, launch, wide = gemv(k, program, self.profile, self.caps)
            return [(src, launch, params_of(launch.ptrs, names_of(k), wide), k)]
        if isinstance(spec, GemmKernel):
            src, launch = gemm(k, program)
            return [(src, launch, params_of(launch.ptrs, names_of(k)), k)]
        if isinstance(spec, Conv2dKernel):
            return [(src, launch, params_of(launch.ptrs, names_of(k)), k) for src, launch in conv2d(k, program)]
        if spec.kind in INTEGER_KERNELS:
            src, launch = render_integer(k, program, self.caps.packed_dot, self.caps.max_binding_bytes)
            return [(src, launch, params_of(launch.ptrs, names_of(k)), k)]
        if isinstance(spec, AttentionKernel):
            return [(src, launch, params_of(launch.ptrs, names_of(k), wide), k)
                    for src, launch, wide in attention(k, program, self.profile)]
        raise NPUCompileError(f"{where}: the webgpu target has no '{spec.kind}' kernel")

    def render_program(self, program: CompiledProgram) -> RenderedProgram:
        self.check_target(program)
        out = RenderedProgram()
        by_text: dict[str, str] = {}
        for i, k in enumerate(program.kernels):
            with self.rendering(k):
                rendered = self.render_kernel(i, k, program)
            steps = []
            for text, dispatch in rendered:
                name = by_text.get(text)
                if name is None:
                    name = by_text[text] = f"src{len(by_text)}"
                    out.sources[name] = text
                dispatch.source = name
                steps.append(dispatch)
            out.steps.append(steps)
        return out

    def kernel_sources(self, k: KernelCall, program: CompiledProgram) -> list[str]:
        """The WGSL of one kernel (for inspection), for the default device limits."""
        return [text for text, _ in self.render_kernel(program.kernels.index(k), k, program)]


TARGET = WebGPUTarget

__all__ = ["WebGPUTarget", "RenderedProgram", "Dispatch", "DeviceCaps", "TARGET"]
