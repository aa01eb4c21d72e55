"""Errors of the runtime; each names the tensor, the expected and the given."""

from __future__ import annotations


class NPURuntimeError(Exception):
    """Base class of runtime errors on bad input."""


class InputError(NPURuntimeError):
    """A run input is missing, unexpected, or of the wrong shape or dtype."""


class WeightError(NPURuntimeError):
    """Weights are missing, mis-shaped, or cannot be read."""

    def __init__(self, message: str, report: object = None) -> None:
        super().__init__(message)
        self.report = report


class BackendUnavailable(NPURuntimeError):
    """The requested backend cannot run on this machine."""
