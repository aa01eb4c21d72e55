"""`Backend` and `DeviceBuffer`: what every execution backend provides, and the registry that finds them."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

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

    @abstractmethod
    def to_numpy(self, spec: TensorSpec | None = None) -> np.ndarray:
        """A host copy; with a spec, converted to the user-facing dtype the spec names."""


class Backend(ABC):
    name: str = ""
    capabilities: frozenset[str] = frozenset()

    @classmethod
    def is_available(cls) -> bool:
        return True

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


def _np(dtype: str):
    from .dtypes import np_dtype

    return np_dtype(dtype)


# ---- registry --------------------------------------------------------------------------------------------------
_REGISTRY: dict[str, Callable[[], Backend]] = {}
_PREFERENCE: list[str] = []  # best first
ENV_VAR = "NPUSIM_BACKEND"


def register_backend(name: str, factory: Callable[[], Backend], available: Callable[[], bool], rank: int) -> None:
    _REGISTRY[name] = factory
    _AVAILABLE[name] = available
    _RANK[name] = rank


_AVAILABLE: dict[str, Callable[[], bool]] = {}
_RANK: dict[str, int] = {}


def _load_builtin() -> None:
    if "cpu" in _REGISTRY:
        return
    from .cpu import backend as _cpu  # noqa: F401

    for mod in ("npu_runtime.cuda.backend",):
        try:
            __import__(mod)
        except ImportError:
            pass


def registered_backends() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY, key=lambda n: _RANK[n])


def available_backends() -> list[str]:
    return [n for n in registered_backends() if _AVAILABLE[n]()]


def default_backend_name() -> str:
    forced = os.environ.get(ENV_VAR)
    if forced:
        return forced
    return available_backends()[0]


def get_backend(name: str | None = None) -> Backend:
    """A backend by name; None picks the best available one (or $NPUSIM_BACKEND)."""
    _load_builtin()
    name = name or default_backend_name()
    if name not in _REGISTRY:
        raise BackendUnavailable(f"unknown backend '{name}' (registered: {', '.join(registered_backends())})")
    if not _AVAILABLE[name]():
        raise BackendUnavailable(f"backend '{name}' is not available on this machine "
                                 f"(available: {', '.join(available_backends())})")
    return _REGISTRY[name]()
