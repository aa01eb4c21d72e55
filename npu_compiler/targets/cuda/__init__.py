"""The cuda codegen target (CUDA C rendered at compile time; no GPU, CuPy or torch needed to compile)."""

from .common import KERNEL_NAME
from .target import CudaTarget

__all__ = ["CudaTarget", "KERNEL_NAME"]
