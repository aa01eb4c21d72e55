"""Static memory plan: intermediate buffers share one arena by liveness (greedy by size, first fit in time)."""

from __future__ import annotations

from dataclasses import dataclass

from ..program import BufferSpec, KernelCall

ALIGN = 256  # bytes; what cudaMalloc guarantees and what vectorised loads want


@dataclass
class Interval:
    buffer: BufferSpec
    start: int
    end: int


def liveness(buffers: list[BufferSpec], kernels: list[KernelCall]) -> list[Interval]:
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, k in enumerate(kernels):
        for r in [*k.args, *k.writes]:
            first.setdefault(r.buffer, i)
            last[r.buffer] = i
    return [Interval(b, first[b.id], last[b.id]) for b in buffers if b.kind == "arena" and b.id in first]


def plan_memory(buffers: list[BufferSpec], kernels: list[KernelCall]) -> int:
    """Assign arena offsets; returns the arena size in bytes. Two buffers share bytes only if their lifetimes
    (first to last kernel touching them) do not overlap."""
    intervals = sorted(liveness(buffers, kernels), key=lambda iv: (-iv.buffer.nbytes, iv.start))
    placed: list[tuple[int, int, Interval]] = []  # (offset, size, interval)
    arena = 0
    for iv in intervals:
        size = -(-max(iv.buffer.nbytes, 1) // ALIGN) * ALIGN
        busy = sorted((off, off + sz) for off, sz, other in placed
                      if not (other.end < iv.start or iv.end < other.start))
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        iv.buffer.offset = offset
        placed.append((offset, size, iv))
        arena = max(arena, offset + size)
    for b in buffers:
        if b.kind == "arena" and b.offset < 0:
            b.offset = 0  # never touched by a kernel (a dead view source): needs no bytes of its own
            b.numel = 0
    return arena


def check_plan(buffers: list[BufferSpec], kernels: list[KernelCall]) -> None:
    """No two simultaneously live buffers overlap (used by tests and by `compile(..., verify_plan=True)`)."""
    ivs = liveness(buffers, kernels)
    for i, a in enumerate(ivs):
        for b in ivs[i + 1:]:
            if a.end < b.start or b.end < a.start:
                continue
            a0, a1 = a.buffer.offset, a.buffer.offset + a.buffer.nbytes
            b0, b1 = b.buffer.offset, b.buffer.offset + b.buffer.nbytes
            if a0 < b1 and b0 < a1:
                raise AssertionError(f"memory plan overlap: {a.buffer.name} and {b.buffer.name}")
