"""`Backend` and `DeviceBuffer`: what every execution backend provides, and the registry that finds them."""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

from npu_compiler.collector import collector_paused
from npu_compiler.errors import entry_point
from npu_compiler.program import CompiledProgram, TensorSpec

from .errors import BackendUnavailable


class DeviceBuffer(ABC):
    """Memory on a backend's device holding one tensor."""

    shape: tuple[int, ...]
    dtype: str  # dtype on the device

    @property
    def nbytes(self) -> int:
        from npu_compiler.dtypes import itemsize

        n = 1
        for d in self.shape:
            n *= d
        return n * itemsize(self.dtype)

    @property
    @abstractmethod
    def native_handle(self) -> Any:
        """The backend's own object (a NumPy array, a CuPy array, a wgpu buffer)."""

    def memory_span(self) -> tuple[Any, int, int]:
        """(the allocation, its first byte, one past its last) this buffer occupies, for telling whether two
        buffers overlap. A backend that cannot tell says each buffer is alone."""
        return (id(self), 0, self.nbytes)

    @abstractmethod
    def to_numpy(self, spec: TensorSpec | None = None) -> np.ndarray:
        """A host copy; with a spec, converted to the user-facing dtype the spec names."""

    def read_later(self) -> Callable[[], np.ndarray]:
        """Start copying to the host behind the work already queued; the function returned waits for that copy and
        gives the array. Work queued after this call may overwrite the buffer without changing what is read. A
        backend whose copies are synchronous copies now."""
        host = self.to_numpy()
        return lambda: host


class Backend(ABC):
    name: str = ""
    capabilities: frozenset[str] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # what a caller reaches with its own program and arrays: anything not of the error hierarchy is a bug
        # (building an executor renders and loads a program: the collector pauses as it does for compile and load)
        for name, during, paused in (("create_executor", "preparing the program to run", True),
                                     ("upload", "uploading an array", False)):
            fn = cls.__dict__.get(name)
            if fn is not None and not getattr(fn, "__wrapped_entry_point__", False):
                setattr(cls, name, entry_point(during)(collector_paused()(fn) if paused else fn))

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this backend cannot run on this machine and what fixes it (None: it can)."""
        return None

    @classmethod
    def is_available(cls) -> bool:
        return cls.unavailable_reason() is None

    @classmethod
    def default_skip_reason(cls) -> str | None:
        """Why this backend, though available, is not picked when none is named (None: it may be the default)."""
        return None

    def describe(self) -> str | None:
        """The device this backend runs on, in one line (None: nothing worth saying)."""
        return None

    @abstractmethod
    def allocate(self, shape: tuple[int, ...], dtype: str) -> DeviceBuffer: ...

    @abstractmethod
    def upload(self, array: np.ndarray, dtype: str | None = None) -> DeviceBuffer: ...

    def zeros(self, shape: tuple[int, ...], dtype: str) -> DeviceBuffer:
        return self.upload(np.zeros(shape, dtype=_np(dtype)), dtype)

    @abstractmethod
    def create_executor(self, program: CompiledProgram, **kwargs: Any) -> Any: ...

    def synchronize(self) -> None:
        return None

    def compile_target(self) -> str:
        """The compiler target whose programs this backend runs."""
        return self.name

    def device_profile(self) -> Any:
        """The device this backend runs on as a profile (npu_compiler.devices.DeviceProfile: what its
        programs are planned for), filled from what the device reports; None where it renders for no GPU."""
        return None


def _np(dtype: str):
    from .dtypes import np_dtype

    return np_dtype(dtype)


# ---- registry --------------------------------------------------------------------------------------------------
# Backends by name, best first, each the module that defines it (as `BACKEND`), imported only when asked for. Adding a
# backend adds a folder and a line here; it edits no other backend.
BACKEND_MODULES: dict[str, str] = {
    "cuda": "npu_runtime.cuda.backend",
    "webgpu": "npu_runtime.webgpu.backend",
    "cpu": "npu_runtime.cpu.backend",
    "hip": "npu_runtime.hip.backend",  # compile-only: never available, it says why
}
ENV_VAR = "NPUSIM_BACKEND"


def _backend_class(name: str) -> type[Backend] | None:
    module = BACKEND_MODULES.get(name)
    if module is None:
        return None
    return importlib.import_module(module).BACKEND


def registered_backends() -> list[str]:
    return list(BACKEND_MODULES)


def unavailable_reason(name: str) -> str | None:
    """Why backend `name` cannot run here (None: it can)."""
    cls = _backend_class(name)
    if cls is None:
        return f"unknown backend '{name}' (registered: {', '.join(BACKEND_MODULES)})"
    return cls.unavailable_reason()


def available_backends() -> list[str]:
    return [n for n in BACKEND_MODULES if unavailable_reason(n) is None]


def default_backend_name() -> str:
    """$NPUSIM_BACKEND, else the best available backend that does not decline being the default (a software
    WebGPU adapter is slower than the NumPy backend on the same CPU)."""
    forced = os.environ.get(ENV_VAR)
    if forced:
        return forced
    # in order, so that the first usable backend ends the search (probing an adapter costs time)
    return next(n for n in BACKEND_MODULES if unavailable_reason(n) is None
                and _backend_class(n).default_skip_reason() is None)


def present_device(target: str) -> Any:
    """The profile of the device present here for compiler target `target` (its backend's device), or None: no such
    backend is available, or only a software one (a software WebGPU adapter is not what a program is planned for)."""
    name = next((n for n in BACKEND_MODULES if n == target), None)
    if name is None or unavailable_reason(name) is not None or _backend_class(name).default_skip_reason() is not None:
        return None
    return get_backend(name).device_profile()


def get_backend(name: str | None = None) -> Backend:
    """A backend by name; None picks the best available one (or $NPUSIM_BACKEND)."""
    if name is None:
        name = default_backend_name()
    if not isinstance(name, str) or name not in BACKEND_MODULES:
        raise BackendUnavailable(f"unknown backend '{name}' (registered: {', '.join(BACKEND_MODULES)})")
    why = unavailable_reason(name)
    if why is not None:
        raise BackendUnavailable(f"backend '{name}' is not available on this machine: {why} "
                                 f"(available: {', '.join(available_backends())})")
    return _backend_class(name)()
