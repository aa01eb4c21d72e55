"""The webgpu codegen target (WGSL rendered from kernel records; no wgpu, GPU or torch needed to render)."""

from .bindings import DeviceCaps
from .target import TARGET, Dispatch, RenderedProgram, WebGPUTarget

__all__ = ["DeviceCaps", "Dispatch", "RenderedProgram", "TARGET", "WebGPUTarget"]
