"""The hip target: generated kernels and library kernels as HIP C++ for an AMD CDNA GPU, GEMMs as hipBLAS plans.

Compile-only: no AMD GPU is reachable here, so npusim has no HIP runtime. A program compiled for hip is rendered
in full when it is compiled (`check_program`: every kernel renders for the device profile, or the compile fails
naming the kernel), `npusim describe --source K` shows a kernel's HIP source, and CI compiles the sources with
`hipcc` for gfx90a (`hipcc.py`). What a HIP runtime would do with a rendered program, kernel by kernel, in order:
- `SourceLaunch`: compile the source (its one `extern "C" __global__ npu_kernel`) to a code object and launch it
  on the grid with the base pointers of the buffers of its `ptrs`;
- `Blas`: call hipBLAS as its plan says (`blas.py`).
Kernels: generated ones through the renderer base in `HipLanguage` (cuda/merge.py's `part_text`, which renders a
kernel a model repeats once); conv2d as the portable implicit GEMM (cuda/library.py's `conv2d`, which needs no
warp-level operation); GEMMs hipBLAS can type as [bias fill] -> hipBLAS -> [epilogue], the rest as the plain kernel
(`gemm_direct`); attention as `attention.py`'s kernel. Sizes
come from the device profile (wavefront width, LDS, compute units, threads a block); no kernel uses MFMA, cp.async,
TMA, warpgroup MMA or programmatic dependent launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...devices import DeviceProfile, get_profile
from ...errors import NPUCompileError
from ...kernels import AttentionKernel, Conv2dKernel, GemmKernel, GeneratedKernel
from ...program import CompiledProgram, KernelCall
from ..codegen import CodegenTarget
from ..cuda.gemm import SUPPORTED
from ..cuda.library import conv2d, gemm_bias_fill, gemm_direct, gemm_epilogue
from ..cuda.merge import part_text
from ..cuda.target import RenderedProgram, SourceLaunch
from .attention import attention
from .blas import blas_can, call_text, hipblas_plan
from .language import HipLanguage


@dataclass
class Blas:
    """A hipBLAS call (`blas.py`'s plan); the rest of a rendered program is the cuda target's shape of data:
    `RenderedProgram` (its sources by name, each kernel's steps; nothing merged) of `SourceLaunch`es."""

    plan: dict[str, Any]


class HipTarget(CodegenTarget):
    name = "hip"
    default_device = "mi250x"
    library_kernels = frozenset({"gemm", "conv2d", "attention"})
    # k x k convolutions as im2col + a hipBLAS GEMM (rocBLAS multiplies on the matrix cores; the portable direct
    # conv, on the vector units, keeps the grouped convs)
    gemm_im2col = True
    # prefill's attention over many query rows as two hipBLAS GEMMs around a row softmax
    attention_gemm_min_rows = 64
    # a norm stores the residual sum it reads (the renderer base's side output), where a GEMM's epilogue is a
    # launch of its own after hipBLAS anyway (`gemm_epilogue_apart`)
    row_side_outputs = True

    def __init__(self, device: DeviceProfile | str | None = None) -> None:
        # the device the kernels are rendered for (a DeviceProfile, or a row of the chip table by name); default:
        # the target's default chip (the MI250X's gfx90a, which Debian's hipcc compiles for)
        profile = device if isinstance(device, DeviceProfile) else get_profile(device or self.default_device)
        if profile.vendor != "amd":
            raise NPUCompileError(f"the hip target renders for AMD GPUs, not {profile.title} ({profile.arch})")
        self.profile = profile
        self.lang = HipLanguage(profile)

    def gemm_epilogue_apart(self, m, batch, a_dtype, out_dtype) -> bool:
        return (a_dtype, out_dtype) in SUPPORTED

    def check_program(self, program: CompiledProgram) -> None:
        """Every kernel renders for the profile (a compile-only target: the artifact it writes is known to render)."""
        self.render_program(program)

    def render_kernel(self, k: KernelCall, program: CompiledProgram) -> list[tuple[str, Any]]:
        """The steps of one kernel: ("launch", (source, Launch)) or ("blas", plan)."""
        spec, lang = k.spec, self.lang
        where = f"kernel {k.name} ({k.kind}, nodes {', '.join(k.nodes[:4])})"
        if isinstance(spec, GeneratedKernel):
            text, launch = part_text(k, program, self.profile, lang=lang)
            return [("launch", (lang.kernel(text), launch))]
        if isinstance(spec, GemmKernel):
            if spec.prologue is not None:
                raise NPUCompileError(f"{where}: the hip target has no gemm that computes its operand in a prologue "
                                      "(compile the model for hip: its lowering makes none)")
            if spec.acc_groups != 1 or not blas_can(k, program):
                return [("launch", gemm_direct(k, program, lang))]
            fill = gemm_bias_fill(k, program, self.profile, lang)
            post = gemm_epilogue(k, program, self.profile, lang)
            return ([("launch", fill)] if fill else []) + [("blas", hipblas_plan(k, program))] + (
                [("launch", post)] if post else [])
        if isinstance(spec, AttentionKernel):
            return [("launch", attention(k, program, lang))]
        if isinstance(spec, Conv2dKernel):
            return [("launch", conv2d(k, program, lang))]
        raise NPUCompileError(f"{where}: the hip target has no '{spec.kind}' kernel")

    def render_program(self, program: CompiledProgram) -> RenderedProgram:
        self.check_target(program)
        out = RenderedProgram()
        by_text: dict[str, str] = {}
        for k in program.kernels:
            with self.rendering(k):
                rendered = self.render_kernel(k, program)
            steps: list[SourceLaunch | Blas] = []
            for kind, what in rendered:
                if kind == "blas":
                    steps.append(Blas(what))
                    continue
                src, launch = what
                name = by_text.setdefault(src, f"src{len(by_text)}")
                out.sources.setdefault(name, src)
                steps.append(SourceLaunch(name, launch))
            out.steps.append(steps)
        return out

    def kernel_sources(self, k: KernelCall, program: CompiledProgram) -> list[str]:
        """The HIP C++ of one kernel's steps (for inspection): each launch's source, and for a hipBLAS call the host
        code that would make it."""
        return [what[0] if kind == "launch" else call_text(what) for kind, what in self.render_kernel(k, program)]


TARGET = HipTarget

__all__ = ["Blas", "HipTarget", "RenderedProgram", "SourceLaunch", "TARGET"]
