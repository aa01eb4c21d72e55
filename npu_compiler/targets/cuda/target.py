"""The cuda target: generated kernels and library kernels as CUDA C, GEMMs as cuBLAS plans.

Nothing here runs at compile time: the runtime renders a program's kernels when it loads it (so an artifact carries
kernel records, never source), and a compile on a machine without a GPU can still check every source with NVRTC.
A kernel renders to steps, run in order, each either
- `Launch`: launch `npu_kernel` of a source with the base pointers of the buffers of its `ptrs` as arguments (and,
  for a kernel on the tensor memory accelerator, the address of the tensor maps the runtime encodes over them), or
- `Cublas`: the cuBLAS call(s) of a GEMM (see `gemm.py`).
A cuBLAS GEMM is [bias fill] -> cuBLAS -> [epilogue] (the runtime runs the fill and the GEMM as one cuBLASLt call
with the bias in its epilogue where the plan allows it: `gemm._bias_epilogue`); every other kernel is one launch, or
three for split decode attention.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...devices import DeviceProfile, get_profile, profile_for_arch
from ...errors import NPUCompileError
from ...kernels import (
    AttentionKernel,
    AttentionPlan,
    Conv2dKernel,
    GemmKernel,
    GeneratedKernel,
    QConv2dKernel,
    QGemmKernel,
    plan_of,
)
from ...program import CompiledProgram, KernelCall
from ..clike import Launch
from ..codegen import CodegenTarget
from ..planning import decode_splits
from . import int8_conv
from .common import CUDA, EARLY_WAIT, WAIT, mma_sync_ok
from .conv_tc import applies as conv_tc_applies
from .conv_tc import convs_on_tensor_cores, plan_conv, side_fits
from .decode_attention import scores_scratch
from .flash_attention import applies as tiles_fit
from .flash_attention import plan_tiled_attention, tiles_apply, tiles_fit_call
from .gemm import SUPPORTED, gemm_plan
from .gemv import GEMV_MAX_M, gemv, gemv_applies, gemv_fits, prologue_applies, prologue_bytes
from .grouped_gemm import grouped_fits, grouped_gemm
from .int8_kernels import INTEGER_KERNELS, render_integer
from .library import (
    attention,
    attention_split,
    attention_tiles,
    conv2d,
    conv2d_tensor_cores,
    gemm_bias_fill,
    gemm_direct,
    gemm_epilogue,
    render_epilogue,
)
from .merge import groups as merge_groups
from .merge import merged, part_text
from .wgemv import wgemv_fits, wgemv_shape_fits


@dataclass
class Cublas:
    plan: dict[str, Any]


@dataclass
class SourceLaunch:
    source: str  # name in RenderedProgram.sources
    launch: Launch


Step = SourceLaunch | Cublas


@dataclass
class RenderedProgram:
    """Every kernel's steps, and the sources they launch (deduplicated by text)."""

    sources: dict[str, str] = field(default_factory=dict)
    steps: list[list[Step]] = field(default_factory=list)
    merged_into: dict[int, int] = field(default_factory=dict)  # kernel -> the kernel whose launch runs it


def render_generated(k: KernelCall, program: CompiledProgram, dev: DeviceProfile) -> tuple[str, Launch]:
    text, launch = part_text(k, program, dev)
    return CUDA.kernel(text), launch


def _cublas_can(k: KernelCall, program: CompiledProgram) -> bool:
    ad, bd, od = (program.dtype_of(r) for r in (k.args[0], k.args[1], k.outs[0]))
    return ad == bd and (ad, od) in SUPPORTED


class CudaTarget(CodegenTarget):
    name = "cuda"
    default_device = "h100"
    library_kernels = frozenset({"gemm", "conv2d", "attention"}) | INTEGER_KERNELS
    gemm_im2col = True
    attention_gemm_min_rows = 64  # prefill without tiled attention: QK^T and PV on tensor cores (cuBLAS)
    gemm_prologue_rows = GEMV_MAX_M  # decode's norms computed by the GEMV that reads them
    row_side_outputs = True
    qconv_residual = True  # the skip tensor read and added in the conv's epilogue (int8_kernels.requant_store)

    def __init__(self, device: DeviceProfile | str | int | None = None) -> None:
        # the device the kernels are planned and rendered for (a DeviceProfile, a row of the chip table by name, or
        # a compute capability: the table's row of it); default: the target's default chip. A compile plans for the
        # device it is given; the runtime renders for the device present.
        if device is None or isinstance(device, str):
            device = get_profile(device or self.default_device)
        elif isinstance(device, int):
            device = profile_for_arch(device)
        if device.vendor != "nvidia":
            raise NPUCompileError(f"the cuda target renders for NVIDIA GPUs, not {device.title} ({device.arch})")
        self.profile = device
        self.arch = device.compute_capability  # which tensor-core instructions the kernels may use


    def gemm_epilogue_apart(self, m, batch, a_dtype, out_dtype) -> bool:
        # more rows than a GEMV takes: cuBLAS, then the epilogue as a launch of its own (`render_kernel`)
        return m > GEMV_MAX_M and (a_dtype, out_dtype) in SUPPORTED

    def attention_on_tensor_cores(self, dtypes, probs_dtype, q_len, head_dim, v_dim, refs) -> bool:
        return tiles_apply(dtypes, probs_dtype, q_len, head_dim, v_dim, refs, self.profile)

    def plan(self, call, buffers):
        """Attention: the tiled kernel's key splits, the flags they keep and the mask's tile table where it applies
        (flash_attention.plan), else decode's key splits and the scores its second launch reads; a conv on the
        implicit GEMM: its K splits (conv_tc.plan_conv)."""
        spec, dev = call.spec, self.profile
        if isinstance(spec, AttentionKernel):
            if tiles_fit_call(call, buffers, dev):
                return plan_tiled_attention(spec, dev)
            splits = decode_splits(spec, dev)
            extra = scores_scratch(spec.batch, spec.heads, spec.q_len, spec.kv_len, spec.online) if splits else 0
            return AttentionPlan(splits, extra)
        if isinstance(spec, Conv2dKernel):
            return plan_conv(call, buffers, dev)
        if isinstance(spec, (QConv2dKernel, QGemmKernel)) and mma_sync_ok(dev):
            return int8_conv.plan(call, dev, buffers[call.args[0].buffer].dtype)
        return None

    def convs_on_tensor_cores(self, convs: list[tuple]) -> list[int]:
        # the integer convs (int8_conv.py) each where the device has int8 matrix units; the float ones together
        integer = [c[0][0] in ("int8", "uint8") for c in convs]
        floats = iter(convs_on_tensor_cores([c for c, i in zip(convs, integer, strict=True) if not i], self.profile))
        return [int8_conv.channels_last_ok(c, self.profile) if i else next(floats)
                for c, i in zip(convs, integer, strict=True)]

    def gemm_prologue(self, m, k, batch, a_dtype, b, b_dtype, reduces) -> bool:
        # Norms only: every block computes the prologue for itself, and an elementwise producer then costs all
        # blocks together more than its own small kernel (measured on the H100: SiLU-times-up in the down
        # projection's prologue made it 31 us against about 12 us plus a 3 us kernel)
        return reduces and prologue_applies(m, k, batch, a_dtype, b, b_dtype, self.profile)

    def conv_side(self, call, buffers) -> bool:
        # on tensor cores only (the direct kernel runs a side conv too, on a GPU without them: slower, not wrong)
        return mma_sync_ok(self.profile) and side_fits(call, buffers, self.profile)

    def wgemm_prologue(self, m, k, bits, group, a_dtype, reduces) -> bool:
        # norms only, as a float GEMV's (gemm_prologue), where the weight-only GEMV runs it
        return reduces and wgemv_shape_fits(m, k, bits, group, a_dtype, self.profile, prologue=True)

    def wgemm_column_groups(self, call, buffers) -> bool:
        return wgemv_fits(call, buffers, self.profile)

    def gemm_column_groups(self, call, buffers) -> bool:
        # a decode step's gate/up projection with SiLU(gate) * up as its epilogue on the GEMV; a prefill's on the
        # tensor memory accelerator and warpgroup MMA (Hopper: grouped_gemm.py)
        dev = self.profile
        return gemv_fits(call, buffers, dev) or (call.spec.m > GEMV_MAX_M and grouped_fits(call, buffers, dev))

    def render_kernel(self, k: KernelCall, program: CompiledProgram) -> list[tuple[str, Any]]:
        """The steps of one kernel: ("launch", (source, Launch)) or ("cublas", plan)."""
        spec, dev = k.spec, self.profile
        if isinstance(spec, GeneratedKernel):
            return [("launch", render_generated(k, program, dev))]
        if isinstance(spec, GemmKernel):
            if gemv_applies(k, program, dev):
                return [("launch", gemv(k, program, render_epilogue, dev))]
            if spec.acc_groups != 1:
                if grouped_fits(k, program.buffers, dev):
                    return [("launch", grouped_gemm(k, program, render_epilogue, dev))]
                if spec.prologue is None:
                    # (a program compiled for a newer GPU than this one: correct, not fast)
                    return [("launch", gemm_direct(k, program))]
                raise NPUCompileError(f"kernel {k.name}: a gemm whose epilogue combines {spec.acc_groups} column "
                                      f"groups and computes its operand in a prologue runs on the cuda target only "
                                      f"as a GEMV (at most {GEMV_MAX_M} rows, one batch, float operands of one "
                                      f"dtype); this one is {spec.m} x {spec.k} x {spec.n}")
            if spec.prologue is not None:
                raise NPUCompileError(f"kernel {k.name}: a gemm that computes its operand in a prologue runs on the "
                                      f"cuda target only as a GEMV (at most {GEMV_MAX_M} rows, one batch, a weight "
                                      f"of the operand's float dtype read along k, rows of at most "
                                      f"{prologue_bytes(dev)} bytes); this one is {spec.m} x {spec.k} x {spec.n}")
            if not _cublas_can(k, program):
                return [("launch", gemm_direct(k, program))]
            steps: list[tuple[str, Any]] = []
            fill = gemm_bias_fill(k, program, dev)
            if fill:
                steps.append(("launch", fill))
            steps.append(("cublas", gemm_plan(k, program)))
            post = gemm_epilogue(k, program, dev)
            if post:
                steps.append(("launch", post))
            return steps
        if isinstance(spec, AttentionKernel):
            if tiles_fit(k, program, dev):
                return [("launch", launch) for launch in attention_tiles(k, program, dev)]
            if plan_of(k).splits and k.scratch:
                return [("launch", launch) for launch in attention_split(k, program)]
            return [("launch", attention(k, program, dev))]
        if spec.kind in INTEGER_KERNELS:
            return [("launch", launch) for launch in render_integer(k, program, dev)]
        if spec.kind == "conv2d":
            if conv_tc_applies(k, program, dev):
                return [("launch", launch) for launch in conv2d_tensor_cores(k, program, dev)]
            return [("launch", conv2d(k, program))]
        raise NPUCompileError(f"kernel {k.name}: the cuda target has no '{spec.kind}' kernel")

    def render_program(self, program: CompiledProgram) -> RenderedProgram:
        self.check_target(program)
        out = RenderedProgram()
        by_text: dict[str, str] = {}

        def source(src: str) -> str:
            name = by_text.get(src)
            if name is None:
                name = f"src{len(by_text)}"
                by_text[src] = name
                out.sources[name] = src
            return name

        alone: dict[int, Launch] = {}  # each generated kernel's launch, rendered alone
        for index, k in enumerate(program.kernels):
            with self.rendering(k):
                rendered = self.render_kernel(k, program)
            steps: list[Step] = []
            for kind, what in rendered:
                if kind == "cublas":
                    steps.append(Cublas(what))
                    continue
                src, launch = what
                steps.append(SourceLaunch(source(src), launch))
                if isinstance(k.spec, GeneratedKernel):
                    alone[index] = launch
            out.steps.append(steps)
        for run in merge_groups(program, alone):
            src, launch = merged(program, run, alone, self.profile)
            out.steps[run[0]] = [SourceLaunch(source(src), launch)]
            for i in run[1:]:
                out.steps[i] = []
                out.merged_into[i] = run[0]
        _early_triggers(out, source)
        # drop the sources of kernels that now run only inside a merged launch
        used = {s.source for steps in out.steps for s in steps if isinstance(s, SourceLaunch)}
        out.sources = {n: t for n, t in out.sources.items() if n in used}
        return out

    def kernel_sources(self, k: KernelCall, program: CompiledProgram) -> list[str]:
        """The CUDA C of one kernel (for inspection)."""
        return [what[0] for kind, what in self.render_kernel(k, program) if kind == "launch"]


def _early_triggers(out: RenderedProgram, source) -> None:
    """A launch followed by one that works before its wait (`Launch.early`: a GEMV loading its first weights and
    prefetching its rows into L2, a split decode attention prefetching its keys and values) lets that one launch
    before it waits itself (common.EARLY_WAIT), so that the work overlaps the kernel this launch waits for; the
    successor's own wait still returns only once this launch has finished. Measured on the H100 (Qwen2.5-1.5B decode
    step, graph replay): 1.63 -> 1.57 ms at KV position 1024, 1.83 -> 1.71 ms at 8192. Convolutions load their
    weights before the wait too but do not ask: launched early beside the conv before them, ResNet-50 at batch 1 went
    from 0.40 to 0.48 ms."""
    flat = [(i, j) for i, steps in enumerate(out.steps) for j in range(len(steps))]
    for (i, j), (i2, j2) in zip(flat, flat[1:], strict=False):
        a, b = out.steps[i][j], out.steps[i2][j2]
        if isinstance(a, SourceLaunch) and isinstance(b, SourceLaunch) and b.launch.early:
            text = out.sources[a.source]
            if WAIT in text:
                out.steps[i][j] = SourceLaunch(source(text.replace(WAIT, EARLY_WAIT, 1)), a.launch)


TARGET = CudaTarget

__all__ = ["CudaTarget", "RenderedProgram", "SourceLaunch", "Cublas", "render_generated", "TARGET"]
