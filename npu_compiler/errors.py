"""The one hierarchy of errors of the project (compiler, artifact, runtime, weights, inputs, outputs). Every message
names what is wrong and where (node, op, attribute, tensor, field, file) and, where there is one, the fix.

    NPUSimError                   anything npusim refuses, on purpose, with a message for the user
      NPUCompileError             the IR cannot be compiled
        IRFormatError             ... it is malformed or inconsistent (types, shapes, attributes, references)
        UnsupportedOpError        ... an op has no lowering for the target (the partition path runs it on the CPU)
        ConstraintError           ... it breaks a constraint of the simulated accelerator or a size limit
      ArtifactError               a .npubin file is truncated, corrupted, crafted or of another format version
      NPURuntimeError             a program cannot run as asked
        InputError                ... an input (array, file, option) is missing or unusable
        WeightError               ... the weights are missing, mis-shaped, of an unusable dtype or unreadable
        BackendUnavailable        ... the backend cannot run on this machine
      OutputError                 a result cannot be written where asked (no such folder, permission)
      ResourceError               the machine ran out of memory for work within the configured limits
      InternalError               a bug in npusim (never the user's input): reported with a request to report it

The module lives at the bottom of the compiler because every layer imports it; `npu_runtime.errors` re-exports the
runtime's part under its old name. `entry_point` marks a public function: an exception that is not one of these
escapes it as an `InternalError` (with the original as its cause), never as a raw `KeyError` mislabelled as the
user's fault, and never as bad input either.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

REPORT_HINT = ("this is a bug in npusim, not a problem with your input: please report it with the command and the "
               "file that caused it (rerun with --traceback or NPUSIM_TRACEBACK=1 for the full trace)")


class NPUSimError(Exception):
    """Base of every error npusim raises on purpose."""


class NPUCompileError(NPUSimError):
    """Base class of every error the compiler raises on bad input."""


class IRFormatError(NPUCompileError):
    """The IR JSON is malformed or inconsistent (dangling producer, wrong shape, missing key)."""


class UnsupportedOpError(NPUCompileError):
    """An op has no lowering for the target. `compile_artifact` (the partition path) runs such ops on the CPU."""

    def __init__(self, node: str, op: str, target: str, detail: str = "") -> None:
        self.node, self.op, self.target = node, op, target
        msg = (
            f"node '{node}': op '{op}' is not supported by target '{target}'"
            + (f" ({detail})" if detail else "")
            + ". `npusim compile` (npu_compiler.compile_artifact) runs such ops on the CPU in segments of the same "
            "artifact, and `npusim run` / `verify` on the IR do so by themselves (`npusim partition` shows the plan)."
        )
        super().__init__(msg)

    def __reduce__(self):  # picklable with its own arguments (the fuzz workers send errors between processes)
        return (type(self), (self.node, self.op, self.target))


class ConstraintError(NPUCompileError):
    """The graph violates a constraint of the simulated accelerator (TargetConfig) or a size limit."""


class ArtifactError(NPUSimError):
    """A .npubin artifact is truncated, corrupted, crafted or of another format version."""


class NPURuntimeError(NPUSimError):
    """Base class of runtime errors on bad input."""


class InputError(NPURuntimeError):
    """A run input is missing, unexpected, or of the wrong shape or dtype; an input file or option is unusable."""


class WeightError(NPURuntimeError):
    """Weights are missing, mis-shaped, of a dtype the program cannot take, or cannot be read."""

    def __init__(self, message: str, report: object = None) -> None:
        super().__init__(message)
        self.report = report


class BackendUnavailable(NPURuntimeError):
    """The requested backend cannot run on this machine."""


class OutputError(NPUSimError):
    """A result cannot be written where asked (the folder does not exist, no permission, the disk is full)."""


class ResourceError(NPUSimError):
    """The machine cannot provide the memory for work that is within the configured size limits."""


class InternalError(NPUSimError):
    """A bug in npusim: an exception no check anticipated. Never the user's fault; the original is `__cause__`."""

    def __init__(self, during: str, error: BaseException | str) -> None:
        self.during = during
        what = error if isinstance(error, str) else describe_exception(error)
        super().__init__(f"internal error while {during}: {what}; {REPORT_HINT}")

    def __reduce__(self):
        return (_rebuild_internal, (str(self),))


def _rebuild_internal(message: str) -> InternalError:
    e = InternalError.__new__(InternalError)
    Exception.__init__(e, message)
    e.during = ""
    return e


class NPUSimWarning(UserWarning):
    """Something the user should know that does not stop the work (a weight converted, an infinity in a weight);
    the CLI prints it as one line."""


class KernelFault(Exception):
    """A kernel's reference semantics met data it cannot process (an index out of range). The runtime reports it
    with the kernel's name and IR nodes (as an NPURuntimeError)."""


def describe_exception(e: BaseException) -> str:
    """`TypeName: first line of the message` (a one-line summary of an exception from anywhere)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:300]}" if lines else type(e).__name__


def as_npusim_error(e: BaseException, during: str) -> NPUSimError:
    """`e` as an error of the hierarchy: itself when it is one; out of memory as a ResourceError; anything else as
    an InternalError (a bug: a check is missing somewhere)."""
    if isinstance(e, NPUSimError):
        return e
    if isinstance(e, MemoryError):
        return ResourceError(f"out of memory while {during}: the machine cannot hold what the work needs (the size "
                             "limits allow it; lower them with NPUSIM_MAX_BYTES to be refused before allocating)")
    return InternalError(during, e)


F = TypeVar("F", bound=Callable[..., Any])


def entry_point(during: str) -> Callable[[F], F]:
    """Decorate a public function: any exception that is not an NPUSimError (KeyboardInterrupt and SystemExit
    aside) leaves it converted by `as_npusim_error`, with the original chained as its cause. `during` says what the
    function was doing ("compiling the IR"); it may name the function's first argument with {0}."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except NPUSimError:
                raise
            except Exception as e:
                raise as_npusim_error(e, during) from e

        guarded.__wrapped_entry_point__ = True  # type: ignore[attr-defined]
        return guarded  # type: ignore[return-value]

    return wrap
