"""The cuda codegen target (CUDA C rendered from kernel records; no GPU, CuPy or torch needed to render)."""

from .common import KERNEL_NAME
from .target import TARGET, CudaTarget, RenderedProgram

__all__ = ["CudaTarget", "KERNEL_NAME", "TARGET", "RenderedProgram"]
