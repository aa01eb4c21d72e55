"""The one error of the export side: a model, an option or an input the exporter cannot use (one line, no
traceback in the CLI)."""

from __future__ import annotations


class ExportError(Exception):
    """A model cannot be exported as asked: what is wrong and, where there is one, the fix."""


class UnknownConfigError(ExportError, KeyError):
    """A built-in config name that does not exist (a KeyError too, for callers that look names up)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def first_line(e: BaseException) -> str:
    """`TypeName: first line of the message`: what a one-line error can say of an exception from a library."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
