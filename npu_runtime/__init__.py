"""NPU Simulation runtime: runs CompiledPrograms on a backend (cpu, cuda, ...)."""

from .backend import Backend, DeviceBuffer, available_backends, get_backend, registered_backends
from .errors import BackendUnavailable, InputError, NPURuntimeError, ResourceError, WeightError
from .executor import Executor
from .weights import WeightReport, WeightSet, load_weights

__all__ = [
    "Backend", "DeviceBuffer", "Executor", "get_backend", "available_backends", "registered_backends",
    "load_weights", "WeightSet", "WeightReport", "NPURuntimeError", "InputError", "WeightError",
    "BackendUnavailable", "ResourceError",
]
