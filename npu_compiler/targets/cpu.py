"""The cpu target: the reference. Its backend runs every kernel's reference semantics (NumPy), so nothing is
rendered; it runs every kernel kind."""

from __future__ import annotations

from ..kernels import LIBRARY_KINDS
from .codegen import CodegenTarget


class CpuTarget(CodegenTarget):
    name = "cpu"
    materializes_iteration_space = True
    library_kernels = LIBRARY_KINDS
    row_side_outputs = True

    def gemm_column_groups(self, call, buffers) -> bool:
        return True  # the reference runs any GEMM

    def wgemm_column_groups(self, call, buffers) -> bool:
        return True

    def conv_side(self, call, buffers) -> bool:
        return True  # and any conv with a side conv


TARGET = CpuTarget
