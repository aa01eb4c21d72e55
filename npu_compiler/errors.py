"""Errors of the compiler. Every message names where the problem is (node, op, tensor, shape)."""

from __future__ import annotations


class NPUCompileError(Exception):
    """Base class of every error the compiler raises on bad input."""


class IRFormatError(NPUCompileError):
    """The IR JSON is malformed or inconsistent (dangling producer, wrong shape, missing key)."""


class UnsupportedOpError(NPUCompileError):
    """An op has no lowering for the target. The partition path runs such ops on the CPU instead."""

    def __init__(self, node: str, op: str, target: str, detail: str = "") -> None:
        self.node, self.op, self.target = node, op, target
        msg = (
            f"node '{node}': op '{op}' is not supported by target '{target}'"
            + (f" ({detail})" if detail else "")
            + ". Use the partition path (`npusim partition` / `npusim verify`, or npu_runtime.DAGExecutor) "
            "to run unsupported ops on the CPU."
        )
        super().__init__(msg)


class ConstraintError(NPUCompileError):
    """The graph violates a constraint of the simulated accelerator (TargetConfig)."""


class ArtifactError(NPUCompileError):
    """A .npubin artifact is truncated, corrupted or of another format version."""


class KernelFault(Exception):
    """A kernel's reference semantics met data it cannot process (an index out of range). The runtime reports it
    with the kernel's name and IR nodes."""
