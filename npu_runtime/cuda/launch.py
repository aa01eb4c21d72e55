"""Kernel launches with programmatic dependent launch (PDL, Hopper and later): through the driver API, each launch
carries the attribute that lets it start while the kernel before it is still finishing. Every kernel of the cuda
target waits for its predecessor's writes before reading anything it wrote (`npu_wait_prior` in the prelude; a GEMV
prefetches its weights into L2 before that), so the overlap is the
launch latency and the grid ramp, never a read of unfinished data. CuPy's launcher has no launch attributes."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any


def pdl_launcher(stream_ptr: int, arch: str) -> Callable[..., None] | None:
    """A function (fn, grid, block, args, smem) -> None that launches `fn` (a CuPy RawKernel) with PDL on the
    stream, or None where PDL is unavailable (an older GPU, no cuda-bindings)."""
    if int(arch) < 90:
        return None
    try:
        from cuda.bindings import driver as cu  # noqa: PLC0415
    except ImportError:
        return None
    stream = cu.CUstream(stream_ptr)
    attr = cu.CUlaunchAttribute()
    attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    functions: dict[int, Any] = {}

    def launch(fn, grid: tuple[int, int, int], block: tuple[int, int, int], args: tuple[int, ...], smem: int
               ) -> None:
        key = id(fn)
        f = functions.get(key)
        if f is None:
            f = functions[key] = cu.CUfunction(int(fn.kernel.ptr))
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
        cfg.sharedMemBytes = smem
        cfg.hStream = stream
        cfg.attrs = [attr]
        cfg.numAttrs = 1
        params = (tuple(int(a) for a in args), tuple(ctypes.c_void_p for _ in args))
        (err,) = cu.cuLaunchKernelEx(cfg, f, params, 0)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuLaunchKernelEx failed: {err}")

    return launch
