"""The cuda target: generated kernels and library kernels as CUDA C, GEMMs as cuBLAS plans.

What the runtime reads, per kernel, is `params["cuda"]["steps"]`, run in order, each either
- `{"launch": {source, grid, block, smem, ptrs}}`: launch `npu_kernel` of `program.sources[source]` with the base
  pointers of the buffers of `ptrs` (("out", i) or ("arg", i)) as its arguments, or
- `{"cublas": plan}`: the cuBLAS call(s) of a GEMM (see `gemm.py`).
A GEMM is [bias fill] -> cuBLAS -> [residual add]; every other kernel is one launch. `KernelCall.source` names the
first launched source.
"""

from __future__ import annotations

from typing import Any

from ...errors import NPUCompileError
from ...program import CompiledProgram, KernelCall
from ..codegen import CodegenTarget, register_target
from .common import Launch
from .expr_render import render_generated
from .gemm import SUPPORTED, gemm_plan
from .library import LIBRARY, attention_split, gemm_bias_fill, gemm_direct, gemm_residual

Step = tuple[str, Any]  # ("launch", (source text, Launch)) or ("cublas", plan)


def _cublas_can(k: KernelCall, program: CompiledProgram) -> bool:
    ad, bd, od = (program.buffers[r.buffer].dtype for r in (k.args[0], k.args[1], k.outs[0]))
    return ad == bd and (ad, od) in SUPPORTED


@register_target
class CudaTarget(CodegenTarget):
    name = "cuda"
    library_kernels = frozenset({*LIBRARY, "gemm"})

    def render_generated(self, kernel: KernelCall, program: CompiledProgram) -> str:
        return render_generated(kernel, program)[0]

    def render_kernel(self, kernel: KernelCall, program: CompiledProgram) -> list[Step]:
        """The steps of one kernel."""
        if kernel.kind == "generated":
            return [("launch", render_generated(kernel, program))]
        if kernel.kind == "gemm":
            if not _cublas_can(kernel, program):
                return [("launch", gemm_direct(kernel, program))]
            steps: list[Step] = []
            fill = gemm_bias_fill(kernel, program)
            if fill:
                steps.append(("launch", fill))
            steps.append(("cublas", gemm_plan(kernel, program)))
            post = gemm_residual(kernel, program)
            if post:
                steps.append(("launch", post))
            return steps
        if kernel.kind == "attention" and kernel.params.get("splits") and len(kernel.outs) > 1:
            return [("launch", launch) for launch in attention_split(kernel, program)]
        fn = LIBRARY.get(kernel.kind)
        if fn is None:
            raise NPUCompileError(f"kernel {kernel.name} (nodes {kernel.nodes}): library kernel '{kernel.kind}' is "
                                  f"not provided by target '{self.name}'")
        return [("launch", fn(kernel, program))]

    def render(self, program: CompiledProgram) -> None:
        """Every kernel's sources (deduplicated by text) into `program.sources`, its steps into
        `params["cuda"]`."""
        by_text: dict[str, str] = {}
        for k in program.kernels:
            try:
                steps = self.render_kernel(k, program)
            except NPUCompileError:
                raise
            except (KeyError, ValueError, IndexError, TypeError) as e:
                raise NPUCompileError(f"kernel {k.name} ({k.kind}, nodes {k.nodes[:4]}): cannot render for cuda: "
                                      f"{type(e).__name__}: {e}") from e
            out: list[dict] = []
            k.source = None
            for kind, what in steps:
                if kind == "cublas":
                    out.append({"cublas": what})
                    continue
                src, launch = what
                assert isinstance(launch, Launch)
                name = by_text.get(src)
                if name is None:
                    name = f"src{len(by_text)}"
                    by_text[src] = name
                    program.sources[name] = src
                if k.source is None:
                    k.source = name
                out.append({"launch": {"source": name, **launch.to_params()}})
            k.params = {**k.params, "cuda": {"steps": out}}
