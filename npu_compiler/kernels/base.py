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

if TYPE_CHECKING:
    from ..buffers import BufferSpec
    from ..tensor import TensorRef


@dataclass(frozen=True)
class KernelCost:
    """What one launch costs: floating-point (or integer) operations, a multiply-add counting 2, and the bytes it
    must move at least once (each distinct element read or written)."""

    flops: int
    bytes_read: int
    bytes_written: int

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written


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

    def cost(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> KernelCost:
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


def expr_flops(e: X.Expr | None, points: int, reduce_points: int = 0) -> int:
    """Operations of an expression evaluated at `points` output points; nodes inside a reduction (and its combine
    step) run at `reduce_points` points (rows times the reduction extent)."""
    if e is None:
        return 0
    total = 0
    stack: list[tuple[X.Expr, bool]] = [(e, False)]
    seen: set[int] = set()
    while stack:
        node, inside = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, X.Unary | X.Binary | X.Where | X.Reduce):
            total += reduce_points if inside or isinstance(node, X.Reduce) else points
        for c in X.children(node):
            stack.append((c, inside or isinstance(node, X.Reduce)))
    return total


def epilogue_reads(e: X.Expr | None, call: KernelCall, buffers: Sequence[BufferSpec], out_shape: tuple[int, ...],
                   reduce_shape: tuple[int, ...] = ()) -> int:
    """Bytes an expression reads: per Load the distinct elements its map reaches, per Gather at most one element per
    evaluation (capped by the gathered view)."""
    if e is None:
        return 0
    total = 0
    red = 1
    for n in reduce_shape:
        red *= n
    points = 1
    for n in out_shape:
        points *= n
    for r in X.reads(e):
        buf = buffers[call.args[r.arg].buffer]
        size = itemsize(buf.dtype)
        if isinstance(r, X.Load):
            count = 1
            for n, s in zip(out_shape, r.strides):
                count *= n if s else 1
            for n, s in zip(reduce_shape, r.rstrides):
                count *= n if s else 1
        else:
            view = 1
            for n in r.shape:
                view *= n
            count = min(view, points * red)
        total += min(count, buf.numel) * size
    return total


@dataclass
class KernelCall:
    """One kernel of the program: its typed record (`spec`, which says what it computes), the views it reads
    (`args`) and writes (`outs`), the IR nodes it came from, and the fusion pattern (or single op) it stands for."""

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

    @property
    def kind(self) -> str:
        return self.spec.kind

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "spec": self.spec.to_data(),
                "args": [dataclasses.asdict(r) for r in self.args], "outs": [dataclasses.asdict(r) for r in self.outs],
                "nodes": list(self.nodes), "group": self.group, "out_values": list(self.out_values),
                "out_rows": list(self.out_rows)}
