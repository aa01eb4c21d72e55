"""The CUDA backend on CuPy: device buffers, one stream for everything, executors that launch NVRTC-built kernels
and cuBLAS GEMMs. CuPy is imported lazily, so this module imports (and reports the backend unavailable) on a
machine without it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from npu_compiler.devices import DeviceProfile, nvidia_profile
from npu_compiler.program import CompiledProgram, TensorSpec

from ..backend import Backend, DeviceBuffer
from ..dtypes import convert, dtype_name, np_dtype
from ..errors import BackendUnavailable

# CuPy has no bfloat16: such buffers are held as uint16 arrays and reinterpreted on the host.
_STORAGE = {"bfloat16": np.dtype(np.uint16)}


def storage_dtype(dtype: str) -> np.dtype:
    return _STORAGE.get(dtype, np_dtype(dtype))


INSTALL_HINT = 'pip install -e ".[cuda]"'


@functools.cache
def unavailable_reason() -> str | None:
    """Why the cuda backend cannot run here (None: CuPy imports and a CUDA device is visible)."""
    try:
        import cupy  # noqa: PLC0415
    except ImportError:
        return f"CuPy is not installed (install the project's cuda extra: {INSTALL_HINT})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001  (CUDARuntimeError without a driver or device)
        return f"no usable NVIDIA GPU or driver ({type(e).__name__}: {e})"
    return None if count > 0 else "no NVIDIA GPU is visible"


def is_available() -> bool:
    return unavailable_reason() is None


class _Device:
    """Per-process state of one device: the stream every backend operation runs on, and the cuBLAS handle."""

    def __init__(self, index: int) -> None:
        import cupy  # noqa: PLC0415

        self.index = index
        self.device = cupy.cuda.Device(index)
        with self.device:
            # Non-blocking: a stream that can be captured into a CUDA graph. All uploads, copies and launches go on
            # it, so they are ordered without device-wide synchronisation.
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.arch = self.device.compute_capability  # "90"
        self._cublas = None
        self._workspace = None

    @functools.cached_property
    def profile(self) -> DeviceProfile:
        """The device's profile (devices.py), filled from its CUDA device properties: what the kernels are
        planned and rendered for on it."""
        import cupy  # noqa: PLC0415

        return nvidia_profile(cupy.cuda.runtime.getDeviceProperties(self.index))

    @property
    def cublas(self):
        """The cuBLAS handle (created on first use) on this stream, with its own workspace so that GEMMs can be
        captured into a CUDA graph."""
        if self._cublas is None:
            import cupy  # noqa: PLC0415

            from .cublas import WORKSPACE_BYTES, Handle  # noqa: PLC0415

            with self.device:
                self._workspace = cupy.empty(WORKSPACE_BYTES, dtype=np.uint8)
                self._cublas = Handle(self.stream.ptr, int(self._workspace.data.ptr), WORKSPACE_BYTES,
                                      keep=self._workspace)
        return self._cublas

    @property
    def workspace_ptr(self) -> int:
        """The cuBLAS workspace (made with the handle): cuBLASLt's calls on the same stream share it."""
        self.cublas  # noqa: B018
        return int(self._workspace.data.ptr)

    @property
    def workspace_bytes(self) -> int:
        from .cublas import WORKSPACE_BYTES  # noqa: PLC0415

        return WORKSPACE_BYTES


@functools.cache
def device_state(index: int = 0) -> _Device:
    return _Device(index)


class CudaBuffer(DeviceBuffer):
    """A CuPy array holding one tensor (bf16 as raw uint16)."""

    def __init__(self, array: Any, dtype: str, state: _Device) -> None:
        self.array = array
        self.shape = tuple(array.shape)
        self.dtype = dtype
        self._state = state

    @property
    def native_handle(self) -> Any:
        return self.array

    @property
    def ptr(self) -> int:
        return int(self.array.data.ptr)

    def memory_span(self) -> tuple[str, int, int]:
        return (f"cuda:{self._state.index}", self.ptr, self.ptr + int(self.array.nbytes))

    def to_numpy(self, spec: TensorSpec | None = None) -> np.ndarray:
        stream = self._state.stream
        with self._state.device:
            host = self.array.get(stream=stream)
            stream.synchronize()
        if self.dtype == "bfloat16":
            host = host.view(np_dtype("bfloat16"))
        host = host.reshape(self.shape)
        return convert(host, spec.dtype) if spec is not None else host

    def read_later(self) -> Callable[[], np.ndarray]:
        """An asynchronous copy into pinned host memory, ordered on the stream after the work queued so far; the
        function returned waits for that copy only (not for work queued after it)."""
        import cupy  # noqa: PLC0415

        stream = self._state.stream
        nbytes = int(self.array.nbytes)
        with self._state.device:
            mem = cupy.cuda.alloc_pinned_memory(max(nbytes, 1))
            host = np.frombuffer(mem, self.array.dtype, self.array.size)
            if nbytes:
                cupy.cuda.runtime.memcpyAsync(host.ctypes.data, self.ptr, nbytes,
                                              cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)
            done = cupy.cuda.Event(disable_timing=True)
            done.record(stream)
        shape, dtype = self.shape, self.dtype

        def read(mem=mem) -> np.ndarray:  # (mem: the pinned block stays allocated until read)
            done.synchronize()
            out = host.copy()
            return (out.view(np_dtype("bfloat16")) if dtype == "bfloat16" else out).reshape(shape)

        return read

    def __repr__(self) -> str:
        return f"CudaBuffer({self.dtype}{list(self.shape)})"


class CudaBackend(Backend):
    name = "cuda"
    capabilities = frozenset({"float32", "float16", "bfloat16", "int64", "library:all", "cublas", "cuda_graph"})

    def __init__(self, device: int = 0) -> None:
        why = unavailable_reason()
        if why is not None:
            raise BackendUnavailable(f"the cuda backend cannot run: {why}")
        self.state = device_state(device)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return unavailable_reason()

    def allocate(self, shape: tuple[int, ...], dtype: str) -> CudaBuffer:
        import cupy  # noqa: PLC0415

        with self.state.device:
            arr = cupy.empty(tuple(shape), dtype=storage_dtype(dtype))
        return CudaBuffer(arr, dtype, self.state)

    def upload(self, array: np.ndarray, dtype: str | None = None) -> CudaBuffer:
        import cupy  # noqa: PLC0415

        array = np.asarray(array)
        dtype = dtype or dtype_name(array.dtype)
        host = np.require(convert(array, dtype), requirements="C")
        buf = self.allocate(host.shape, dtype)
        if host.nbytes:
            with self.state.device:
                cupy.cuda.runtime.memcpyAsync(buf.ptr, host.ctypes.data, host.nbytes,
                                              cupy.cuda.runtime.memcpyHostToDevice, self.state.stream.ptr)
                # pageable source: make sure the copy has finished before `host` can be freed
                self.state.stream.synchronize()
        return buf

    def zeros(self, shape: tuple[int, ...], dtype: str) -> CudaBuffer:
        import cupy  # noqa: PLC0415

        buf = self.allocate(shape, dtype)
        if buf.nbytes:
            with self.state.device:
                cupy.cuda.runtime.memsetAsync(buf.ptr, 0, buf.nbytes, self.state.stream.ptr)
        return buf

    def create_executor(self, program: CompiledProgram, **kwargs: Any):
        from .executor import CudaExecutor  # noqa: PLC0415

        return CudaExecutor(program, self, **kwargs)

    def synchronize(self) -> None:
        self.state.stream.synchronize()

    def device_profile(self) -> DeviceProfile:
        return self.state.profile

    def compile_target(self) -> str:
        return "cuda"


BACKEND = CudaBackend
