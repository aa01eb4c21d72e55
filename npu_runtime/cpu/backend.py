"""The CPU backend (NumPy + ml_dtypes): always present, the reference."""

from __future__ import annotations

from typing import Any

import numpy as np

from npu_compiler.program import CompiledProgram, TensorSpec

from ..backend import Backend, DeviceBuffer
from ..dtypes import convert, np_dtype


class CpuBuffer(DeviceBuffer):
    def __init__(self, array: np.ndarray, dtype: str) -> None:
        self.array = array
        self.shape = tuple(array.shape)
        self.dtype = dtype

    @property
    def native_handle(self) -> np.ndarray:
        return self.array

    def memory_span(self) -> tuple[str, int, int]:
        a = self.array  # (what np.lib.array_utils.byte_bounds gives, on NumPy 1 as on 2)
        lo = hi = a.__array_interface__["data"][0]
        if a.size:
            for n, st in zip(a.shape, a.strides, strict=True):
                lo, hi = lo + min(0, (n - 1) * st), hi + max(0, (n - 1) * st)
            hi += a.itemsize
        return ("host", lo, hi)

    def to_numpy(self, spec: TensorSpec | None = None) -> np.ndarray:
        out = self.array.copy()
        return convert(out, spec.dtype) if spec is not None else out


class CpuBackend(Backend):
    name = "cpu"
    capabilities = frozenset({"float32", "float16", "bfloat16", "int64", "library:all"})

    def __init__(self) -> None:
        from .threads import configure_threads

        self.threads = configure_threads()  # BLAS/OpenMP pools sized to the cores this process may use

    def describe(self) -> str | None:
        return f"the host CPU, {self.threads.describe()}"

    def allocate(self, shape: tuple[int, ...], dtype: str) -> CpuBuffer:
        return CpuBuffer(np.empty(shape, np_dtype(dtype)), dtype)

    def upload(self, array: np.ndarray, dtype: str | None = None) -> CpuBuffer:
        dtype = dtype or _name(array.dtype)
        return CpuBuffer(np.require(convert(np.asarray(array), dtype), requirements="C"), dtype)

    def create_executor(self, program: CompiledProgram, **kwargs: Any):
        from .executor import CpuExecutor

        return CpuExecutor(program, self, **kwargs)


def _name(dt) -> str:
    from ..dtypes import dtype_name

    return dtype_name(dt)


BACKEND = CpuBackend
