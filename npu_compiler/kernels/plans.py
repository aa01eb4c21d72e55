"""Plans: how a target computes one kernel record on one device, beside the record that says what it computes.

A record (`KernelSpec`) is the computation: the CPU reference runs it and every target must give its results. A plan
is a schedule the target chose for it on the device profile the program was planned for (`CodegenTarget.plan`):
how many blocks split a reduction, and the scratch those blocks leave their parts in. A plan never changes what is
computed; a backend that cannot honour one makes its own. Its scratch buffers are the call's `scratch` (after its
outputs in the pointers a launch takes: `KernelCall.writes`), sized by the plan, placed by the memory plan like
every intermediate, and shared between calls where the plan says so (one table of a mask's tiles for every
attention over that mask).

A plan is data like a record: frozen fields read and written by `fields.py`, checked on load against its record and
its scratch (`check`), so that a crafted plan is an ArtifactError naming what is wrong.

Kinds with a plan: `attention` (key splits), `conv2d` (K splits; a side conv computed apart), `gemm` (a prologue
computed apart), `generated` (a side output stored by a kernel of its own) and the integer GEMMs `qconv2d` and
`qgemm` (their tiles and pipeline depth on the device's int8 matrix units). A target that runs a folded record
(a GEMM computing its operand, a conv computing a shortcut, a row kernel storing a second value) in one kernel plans
nothing for it; one that does not plans it in passes, each of which computes exactly what the record says, through
scratch where one pass hands a value to the next (the webgpu target). Other launch shapes follow from the record and
the device when they are rendered.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from .base import dtype_of, expect
from .fields import bounded, from_data, to_data

if TYPE_CHECKING:
    from ..buffers import BufferSpec
    from .base import KernelCall


@dataclass(frozen=True)
class Scratch:
    """A scratch buffer a plan needs: its name (after the kernel's node), dtype and elements; calls whose plans give
    the same `shared` key (not None) share one buffer, alive from the first to the last of them."""

    name: str
    dtype: str
    numel: int
    shared: tuple | None = None


@dataclass(frozen=True)
class Plan:
    kind: ClassVar[str] = ""

    def scratch(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> list[Scratch]:
        """The scratch buffers this plan needs for `call` (over `buffers`), in order (what `call.scratch` holds)."""
        return []

    def check(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> None:
        """The plan against its record and its scratch: ValueError naming what is wrong."""
        want = self.scratch(call, buffers)
        expect(len(call.scratch) == len(want), f"a {self.kind} plan with {len(call.scratch)} scratch buffers, "
                                               f"expected {len(want)}")
        for ref, s in zip(call.scratch, want, strict=True):
            got = dtype_of(buffers, ref)
            expect(got == s.dtype and ref.numel == s.numel and buffers[ref.buffer].kind == "arena",
                   f"{self.kind} scratch '{s.name}' of {got}[{ref.numel}] ({buffers[ref.buffer].kind}), expected "
                   f"{s.dtype}[{s.numel}] in the arena")

    def describe(self) -> list[str]:
        return [f"plan: {', '.join(f'{f.name} {getattr(self, f.name)}' for f in dataclasses.fields(self))}"]

    def to_data(self) -> dict[str, Any]:
        return to_data(self)


@dataclass(frozen=True)
class AttentionPlan(Plan):
    kind = "attention"
    # > 0: the keys split across blocks; scratch[0] holds each (query row, split)'s max, sum and partial output
    splits: int = bounded(0, 65535, default=0)
    # float32 entries of scratch[0] after that [rows, splits, 2 + v_dim] record (the target's bookkeeping: which
    # blocks of a tiled split attention computed something, or the scores a decode attention keeps)
    scratch_extra: int = bounded(0, default=0)
    # > 0: scratch[-1] holds this many bytes, the target's table of the mask's key tiles (a tiled split attention:
    # which tiles some query row sees, which hold mask values to add). Every call over the same mask and positions
    # shares it, so that the target may classify the mask once and later calls read the table it left.
    tile_table: int = bounded(0, default=0)

    def scratch(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> list[Scratch]:
        spec = call.spec
        out: list[Scratch] = []
        if self.splits:
            out.append(Scratch("split_scratch", "float32",
                               spec.rows * self.splits * (2 + spec.v_dim) + self.scratch_extra))
        if self.tile_table:
            shared = ("tile_table", tuple(dataclasses.astuple(r) for r in call.args[3:]),
                      (spec.batch, spec.heads, spec.q_len, spec.kv_len, self.tile_table))
            out.append(Scratch("tile_table", "uint8", self.tile_table, shared))
        return out

    def check(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> None:
        spec = call.spec
        expect(self.splits or not self.scratch_extra, "attention scratch entries without key splits")
        expect(not self.tile_table or (self.splits and spec.online and spec.mask != "none"),
               "an attention tile table without key splits, an online softmax and a mask")
        super().check(call, buffers)


@dataclass(frozen=True)
class Conv2dPlan(Plan):
    kind = "conv2d"
    # > 1: the K of each output tile split across this many blocks, their float32 parts in scratch[0] (where the
    # target sums them in a second launch; inside a thread-block cluster it needs no scratch but keeps it)
    splits: int = bounded(1, 1024, default=1)
    # a side conv (Conv2dKernel.side_stride) computed by a pass of its own into scratch[0] (rounded to the output
    # dtype, as the record's Acc(1) is), which the conv's epilogue then reads
    side_apart: bool = False

    def scratch(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> list[Scratch]:
        out = call.outs[0]
        if self.side_apart:
            return [Scratch("side_conv", dtype_of(buffers, out), out.numel)]
        if self.splits <= 1:
            return []
        return [Scratch("split_k", "float32", self.splits * out.numel)]

    def check(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> None:
        spec = call.spec
        expect(self.splits == 1 or (spec.groups == 1 and not spec.side_stride),
               f"a conv2d of {spec.groups} groups{' with a side conv' if spec.side_stride else ''} split "
               f"{self.splits} ways (a split conv has one group and no side conv)")
        expect(not self.side_apart or (spec.side_stride and self.splits == 1),
               "a side conv computed apart by a conv2d without a side conv, or split")
        super().check(call, buffers)


@dataclass(frozen=True)
class GemmPlan(Plan):
    kind = "gemm"
    # the prologue (GemmKernel.prologue) computed by a pass of its own into scratch[0], operand a as [batch..., m, k]
    # in the prologue's dtype, which the GEMM then reads
    prologue_apart: bool = False

    def scratch(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> list[Scratch]:
        spec = call.spec
        if not self.prologue_apart:
            return []
        return [Scratch("prologue", spec.prologue.dtype, math.prod(spec.a_shape))]

    def check(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> None:
        expect(not self.prologue_apart or call.spec.prologue is not None,
               "a gemm plan computes apart a prologue its record does not have")
        super().check(call, buffers)


@dataclass(frozen=True)
class GeneratedPlan(Plan):
    kind = "generated"
    # the side output (GeneratedKernel.side) stored by an elementwise kernel of its own after the row kernel
    side_apart: bool = False

    def check(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> None:
        expect(not self.side_apart or call.spec.side is not None,
               "a generated kernel's plan stores apart a side output its record does not have")
        super().check(call, buffers)


@dataclass(frozen=True)
class Int8TilePlan(Plan):
    """The tiling of an integer implicit GEMM (`qconv2d`, `qgemm`) on int8 matrix units: BM rows (output pixels) x
    BN columns (output channels) a block, each warp WM x WN of them, and the shared-memory stages its K steps go
    through (1: a kernel that gathers its tiles element by element, one stage). All zero: none chosen (a program
    planned for a target without one); the target then picks its own."""

    bm: int = bounded(0, 1024, default=0)
    bn: int = bounded(0, 1024, default=0)
    warp_m: int = bounded(0, 1024, default=0)
    warp_n: int = bounded(0, 1024, default=0)
    stages: int = bounded(0, 16, default=0)
    # > 1: K split across this many blocks, each leaving its int32 sums (wrapping: any order gives the same bits) in
    # scratch[0], [splits, M, N], which a second launch adds up and requantizes
    splits: int = bounded(0, 64, default=0)

    @property
    def chosen(self) -> bool:
        return self.bm > 0

    def scratch(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> list[Scratch]:
        if self.splits <= 1:
            return []
        spec = call.spec
        m, n = ((spec.m, spec.n) if call.kind == "qgemm" else
                (call.outs[0].numel // call.outs[0].shape[1], call.outs[0].shape[1]))
        return [Scratch("split_k", "int32", self.splits * m * n)]

    def check(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> None:
        if self.chosen:
            expect(self.warp_m > 0 and self.warp_n > 0 and self.bm % self.warp_m == 0 and self.bn % self.warp_n == 0
                   and self.warp_m % 16 == 0 and self.warp_n % 16 == 0 and self.stages >= 1,
                   f"an int8 tile of {self.bm} x {self.bn} in warp tiles of {self.warp_m} x {self.warp_n} over "
                   f"{self.stages} stages (warp tiles of whole 16 x 16 steps that divide the tile, a stage or more)")
        else:
            expect(self.bn == self.warp_m == self.warp_n == self.stages == self.splits == 0,
                   "an int8 plan without its tile rows")
        expect(self.splits <= 1 or not call.spec.dequantize, "a dequantizing int8 GEMM split along K")
        super().check(call, buffers)


@dataclass(frozen=True)
class QConv2dPlan(Int8TilePlan):
    kind = "qconv2d"


@dataclass(frozen=True)
class QGemmPlan(Int8TilePlan):
    kind = "qgemm"


PLANS: dict[str, type[Plan]] = {p.kind: p for p in (AttentionPlan, Conv2dPlan, GemmPlan, GeneratedPlan, QConv2dPlan,
                                                     QGemmPlan)}


def plan_from_data(kind: str, d: Any, where: str) -> Plan | None:
    """A plan of record kind `kind` from its data (None: the call has none), or ValueError naming the field."""
    if d is None:
        return None
    cls = PLANS.get(kind)
    if cls is None:
        raise ValueError(f"{where}: a {kind} kernel has no plan")
    return from_data(cls, d, where)


def plan_of(call: KernelCall) -> Plan | None:
    """The call's plan, or its kind's plan of no splits where it has none (a program for a target that plans
    nothing, such as the cpu reference)."""
    if call.plan is not None:
        return call.plan
    cls = PLANS.get(call.kind)
    return cls() if cls is not None else None


__all__ = ["AttentionPlan", "Conv2dPlan", "GemmPlan", "GeneratedPlan", "Int8TilePlan", "PLANS", "Plan", "QConv2dPlan",
           "QGemmPlan", "Scratch", "plan_from_data", "plan_of"]
