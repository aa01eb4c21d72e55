"""On-chip residency per tensor: which activations stay in the NPU's activation buffer between the kernels that use
them, and the DRAM traffic that follows, decided from the program's liveness and the buffers' sizes as an NPU
compiler's memory allocator does.

The unit of decision is a *segment*: the stretch of a tensor's life between two kernels that touch it (its producer
and first consumer, two consecutive consumers, ...). A resident segment holds the whole tensor in the activation
buffer from the first kernel to the second, inclusive; the second kernel then reads it on chip (and the first writes
it only on chip when it produced it). Segments are chosen greedily, shortest reuse distance first (the most DRAM
bytes saved per byte-kernel of buffer they occupy: Belady's insight for a cache whose future is known), as long as at
every kernel of the segment

    resident bytes + the kernel's staging  <=  activation buffer

where a kernel's staging is the room its streamed operands (those read from or written to DRAM) need to be
double-buffered: their bytes, but at most a share of the buffer (the GEMM tiling works with what is left: smaller
tiles can mean more passes over an operand). The estimate plans with shares of 1/2, 1/4, 1/8 and 1/16 and keeps the
fastest program, as a compiler tries tilings. A tensor whose segment is not resident after one that was is
*spilled*: the kernel after which it leaves the buffer writes it to DRAM (once; a copy already in DRAM is not written
again), and its next consumer reads it back. Graph inputs start in DRAM; graph outputs are written to DRAM by the
kernel that produces them (and may also stay on chip for later consumers); weights and constants stream from DRAM
every time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..program import CompiledProgram

ACTIVATIONS = ("input", "output", "arena")
STAGING_SHARES = (1 / 2, 1 / 4, 1 / 8, 1 / 16)  # tried by the estimate, which keeps the fastest plan


@dataclass(frozen=True)
class Placement:
    """Where one kernel's activations are: the buffers it reads from and writes to the activation buffer (every
    other operand is DRAM traffic), the DRAM bytes it writes besides its outputs (spills of tensors that leave the
    buffer after it), and the bytes of resident tensors held while it runs (the rest of the buffer is its
    staging)."""

    reads_on_chip: frozenset[int] = frozenset()
    writes_on_chip: frozenset[int] = frozenset()
    spill_bytes: int = 0
    resident_bytes: int = 0
    spilled: tuple[int, ...] = ()  # the buffers it spills
    staging_bytes: float | None = None  # the buffer's bytes its streamed tiles may use (None: all of it)


@dataclass
class ResidencyPlan:
    capacity: int  # bytes of the activation buffer
    kernels: list[Placement]
    policy: str  # "plan", "all" (every activation on chip, ignoring capacity), "none" (every operand in DRAM)
    resident_tensors: int = 0  # tensors with at least one resident segment
    spilled_tensors: int = 0
    peak_bytes: int = 0  # the largest resident bytes at any kernel
    staging_share: float = 1 / 2  # the most of the buffer a kernel's streamed operands were left
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if self.policy == "all":
            return "every intermediate stays on chip (forced)"
        if self.policy == "none":
            return "every operand streams from DRAM (forced)"
        return (f"residency: {self.resident_tensors} tensors kept in the {_size(self.capacity)} activation buffer for "
                f"some of their life, {self.spilled_tensors} spilled, peak {_size(self.peak_bytes)} held, staging at "
                f"most 1/{round(1 / self.staging_share)} of it")


def _size(n: float) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


@dataclass
class _Event:
    kernel: int
    read: int = 0  # bytes read
    written: int = 0  # bytes written


def plan_residency(program: CompiledProgram, capacity: int, *, context_len: int | None = None,
                   policy: str = "plan", staging_share: float = 1 / 2) -> ResidencyPlan:
    """The residency of every activation of `program` in an activation buffer of `capacity` bytes, leaving each
    kernel that streams operands at most `staging_share` of the buffer for them. `policy`: "plan" (the allocator
    above), "all" (every intermediate on chip whatever its size: an upper bound) or "none"."""
    n = len(program.kernels)
    events = _events(program, context_len)
    size = {b: program.buffers[b].nbytes for b in events}
    kind = {b: program.buffers[b].kind for b in events}
    # resident[b][j]: segment j of buffer b (between events j and j + 1) stays on chip
    resident = {b: [policy == "all" and kind[b] == "arena"] * (len(ev) - 1) for b, ev in events.items()}
    if policy == "plan":
        _choose(events, size, kind, resident, capacity, n, int(capacity * staging_share))
    plan = _simulate(events, size, kind, resident, capacity, n, policy)
    plan.staging_share = staging_share
    return plan


def _events(program: CompiledProgram, context_len: int | None) -> dict[int, list[_Event]]:
    """Per activation buffer, the kernels that touch it in order, with the bytes each reads and writes there."""
    events: dict[int, list[_Event]] = {}
    for i, k in enumerate(program.kernels):
        cost = k.spec.cost(k, program.buffers, context_len=context_len)
        for traffic, attr in ((cost.reads, "read"), (cost.writes, "written")):
            for t in traffic:
                if program.buffers[t.buffer].kind not in ACTIVATIONS:
                    continue
                ev = events.setdefault(t.buffer, [])
                if not ev or ev[-1].kernel != i:
                    ev.append(_Event(i))
                setattr(ev[-1], attr, getattr(ev[-1], attr) + t.bytes)
    return events


def _choose(events, size, kind, resident, capacity: int, n: int, staging: int) -> None:
    held = [0] * n  # resident bytes at each kernel
    holders: list[set[int]] = [set() for _ in range(n)]
    streamed = [0] * n  # bytes each kernel moves to or from DRAM (with the segments chosen so far)
    for ev in events.values():
        for e in ev:
            streamed[e.kernel] += e.read + e.written
    candidates = []
    for b, ev in events.items():
        for j in range(len(ev) - 1):
            first, second = ev[j], ev[j + 1]
            saved = second.read + (first.written if kind[b] != "output" else 0)
            span = second.kernel - first.kernel + 1
            if saved and size[b] <= capacity:
                candidates.append((-saved / (size[b] * span), first.kernel, b, j))
    candidates.sort()
    for _, _, b, j in candidates:
        first, second = events[b][j], events[b][j + 1]
        relief = {second.kernel: second.read}
        if kind[b] != "output":
            relief[first.kernel] = relief.get(first.kernel, 0) + first.written
        span = range(first.kernel, second.kernel + 1)
        if all(held[k] + (0 if b in holders[k] else size[b])
               + min(staging, streamed[k] - relief.get(k, 0)) <= capacity for k in span):
            resident[b][j] = True
            for k in span:
                if b not in holders[k]:
                    holders[k].add(b)
                    held[k] += size[b]
            for k, r in relief.items():
                streamed[k] -= r


def _simulate(events, size, kind, resident, capacity: int, n: int, policy: str) -> ResidencyPlan:
    """Walk every tensor's events with the chosen segments: which accesses are on chip, where spills go."""
    reads = [set() for _ in range(n)]
    writes = [set() for _ in range(n)]
    spill = [0] * n
    spilled: list[list[int]] = [[] for _ in range(n)]
    held = [0] * n
    kept, spilled_any = 0, set()
    for b, ev in events.items():
        segs = resident[b]
        on_chip, in_dram = False, kind[b] == "input"
        kept += any(segs)
        for j, e in enumerate(ev):
            before = j > 0 and segs[j - 1]
            after = j < len(segs) and segs[j]
            if e.read:
                if before and on_chip:
                    reads[e.kernel].add(b)
                in_dram = in_dram or not on_chip  # read from DRAM: the copy there is current
            if e.written:
                if kind[b] == "output" or not after:
                    in_dram, on_chip = True, after
                else:
                    writes[e.kernel].add(b)
                    in_dram, on_chip = False, True
            elif e.read and after:
                on_chip = True  # kept after it was used (or loaded)
            if not after and on_chip and not in_dram and j < len(ev) - 1:
                spill[e.kernel] += size[b]  # it leaves the buffer but is read again: written to DRAM first
                spilled[e.kernel].append(b)
                spilled_any.add(b)
                in_dram = True
            if not after:
                on_chip = False
            if after:
                for k in range(e.kernel, ev[j + 1].kernel + 1):
                    held[k] += size[b] if k != e.kernel or not before else 0
    placements = [Placement(frozenset(reads[i]), frozenset(writes[i]), spill[i], held[i], tuple(spilled[i]),
                            max(0, capacity - held[i]) if policy == "plan" else None) for i in range(n)]
    return ResidencyPlan(capacity, placements, policy, kept, len(spilled_any), max(held, default=0))
