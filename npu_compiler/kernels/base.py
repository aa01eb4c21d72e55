"""What every kernel kind defines once: its typed record, how the record is checked against the tensors it is given,
its cost, and its reference semantics (what the CPU backend runs and every other backend is measured against)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from ..dtypes import itemsize
from ..expr import nodes as X
from ..expr.check import ExprContext, check_expr
from . import fields
from .counting import KernelCost

if TYPE_CHECKING:
    from ..buffers import BufferSpec
    from ..tensor import TensorRef


class Arrays(Protocol):
    """How a backend hands arrays to reference semantics: a strided view of a TensorRef, or a buffer whole."""

    def view(self, ref: TensorRef) -> np.ndarray: ...

    def buffer(self, ref: TensorRef) -> np.ndarray: ...


Step = Callable[[], None]


@dataclass(frozen=True)
class KernelSpec:
    """Base of every kernel record. `kind` names the kind in artifacts; `library_reason` is empty for kernels the
    expression language describes and says, for a library kernel, why it is one."""

    kind: ClassVar[str] = ""
    library_reason: ClassVar[str] = ""

    # ---- data ------------------------------------------------------------------------------------------------------
    def to_data(self) -> dict[str, Any]:
        return fields.to_data(self)

    @classmethod
    def from_data(cls, d: Any, where: str) -> KernelSpec:
        return fields.from_data(cls, d, where)

    # ---- contract --------------------------------------------------------------------------------------------------
    def check(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> None:
        """Raise ValueError when the record does not fit the call's tensors (counts, shapes, dtypes)."""
        raise NotImplementedError

    def cost(self, call: KernelCall, buffers: Sequence[BufferSpec], *, context_len: int | None = None) -> KernelCost:
        """What one launch does (`counting.KernelCost`: MACs, vector operations, bytes per argument): the one count
        that the profiler and the NPU model read. `context_len`: cached tokens a decode attention reads (its kind
        alone uses it; None: the whole static cache)."""
        raise NotImplementedError

    def reference(self, call: KernelCall, arrays: Arrays) -> Step:
        """A closure that runs the kernel on NumPy arrays (views resolved once, here)."""
        raise NotImplementedError

    def replace(self, **changes: Any) -> KernelSpec:
        return dataclasses.replace(self, **changes)

    def describe(self) -> list[str]:
        """The record as readable lines (expressions as formulas)."""
        from ..expr.text import format_expr

        lines = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, X.Expr):
                v = format_expr(v)
            elif dataclasses.is_dataclass(v):
                v = ", ".join(f"{g.name}={format_expr(w) if isinstance(w, X.Expr) else w}"
                              for g in dataclasses.fields(v) for w in [getattr(v, g.name)])
            lines.append(f"{f.name}: {v}")
        return lines


# ---- helpers the kinds share ---------------------------------------------------------------------------------------


def dtype_of(buffers: Sequence[BufferSpec], ref: TensorRef) -> str:
    return buffers[ref.buffer].dtype


def ref_bytes(buffers: Sequence[BufferSpec], ref: TensorRef) -> int:
    return ref.numel * itemsize(buffers[ref.buffer].dtype)


def expect(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def expect_shape(ref: TensorRef, shape: tuple[int, ...], what: str) -> None:
    expect(tuple(ref.shape) == tuple(shape), f"{what} has shape {list(ref.shape)}, expected {list(shape)}")


def arg_context(call: KernelCall, buffers: Sequence[BufferSpec], out_shape: tuple[int, ...],
                reduce_shape: tuple[int, ...] = (), row_dims: int = 0, acc_dtype: str | None = None,
                acc_groups: int = 1) -> ExprContext:
    """What an expression of this call may read: the whole buffer of each argument."""
    return ExprContext(tuple(buffers[a.buffer].numel for a in call.args),
                       tuple(buffers[a.buffer].dtype for a in call.args), tuple(out_shape), tuple(reduce_shape),
                       row_dims, acc_dtype, acc_groups)


def check_epilogue(epilogue: X.Expr | None, call: KernelCall, buffers: Sequence[BufferSpec], out: TensorRef,
                   acc_groups: int = 1) -> None:
    """An epilogue maps `Acc` (the result, rounded to the output dtype; one per column group) and loads of argument
    buffers at the output index to the stored value."""
    if epilogue is not None:
        check_expr(epilogue, arg_context(call, buffers, tuple(out.shape), acc_dtype=dtype_of(buffers, out),
                                         acc_groups=acc_groups))


@dataclass
class KernelCall:
    """One kernel of the program: its typed record (`spec`, which says what it computes), the views it reads
    (`args`) and writes (`outs`), the IR nodes it came from, and the fusion pattern (or single op) it stands for;
    beside them its `plan` (how the target computes the record on the program's device: `plans.py`; None where
    there is none) and the `scratch` buffers that plan works in."""

    name: str
    spec: KernelSpec
    args: list[TensorRef]
    outs: list[TensorRef]
    nodes: list[str] = field(default_factory=list)
    group: str = ""
    # IR value names of the node being lowered when this kernel was emitted (per-node verify maps the kernel's
    # output back to the reference with it).
    out_values: list[str] = field(default_factory=list)
    # [dim, start, stop] where the first output holds only those rows of that value (slice hoisting computed no
    # others); empty: all of it
    out_rows: list[int] = field(default_factory=list)
    plan: Any = None  # a plans.Plan of this kind, or None
    scratch: list[TensorRef] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def writes(self) -> list[TensorRef]:
        """Everything the kernel writes: its outputs, then its plan's scratch (the order of a launch's pointers)."""
        return [*self.outs, *self.scratch] if self.scratch else self.outs

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "spec": self.spec.to_data(),
                "args": [dataclasses.asdict(r) for r in self.args], "outs": [dataclasses.asdict(r) for r in self.outs],
                "nodes": list(self.nodes), "group": self.group, "out_values": list(self.out_values),
                "out_rows": list(self.out_rows), "plan": self.plan.to_data() if self.plan is not None else None,
                "scratch": [dataclasses.asdict(r) for r in self.scratch]}
