"""Errors of the runtime: the runtime's part of the one hierarchy (`npu_compiler.errors`), under their old import
path. Each message names the tensor, the expected and the given."""

from __future__ import annotations

from npu_compiler.errors import (
    BackendUnavailable,
    InputError,
    InternalError,
    NPURuntimeError,
    NPUSimError,
    OutputError,
    ResourceError,
    WeightError,
)

__all__ = ["NPUSimError", "NPURuntimeError", "InputError", "WeightError", "BackendUnavailable", "OutputError",
           "ResourceError", "InternalError"]
