"""The hip codegen target (HIP C++ rendered from kernel records for AMD GPUs; compile-only: no HIP runtime)."""

from .language import KERNEL_NAME, HipLanguage
from .target import TARGET, Blas, HipTarget, RenderedProgram, SourceLaunch

__all__ = ["Blas", "HipLanguage", "HipTarget", "KERNEL_NAME", "RenderedProgram", "SourceLaunch", "TARGET"]
