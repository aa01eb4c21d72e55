"""The one error of the export side: a model, an option or an input the exporter cannot use (one line, no
traceback in the CLI)."""

from __future__ import annotations

from npu_compiler.errors import NPUSimError, describe_exception


class ExportError(NPUSimError):
    """A model cannot be exported as asked: what is wrong and, where there is one, the fix."""


class UnknownConfigError(ExportError, KeyError):
    """A built-in config name that does not exist (a KeyError too, for callers that look names up)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


first_line = describe_exception  # `TypeName: first line of the message`, one place for it
