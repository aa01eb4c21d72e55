"""`TensorRef`: a strided view (in elements) of one planned buffer: what every kernel reads and writes."""

from __future__ import annotations

import math
from dataclasses import dataclass


def slice_bounds(start: int | None, end: int | None, size: int) -> tuple[int, int]:
    """ATen's `slice` bounds over a dim of `size`: None for the ends, negative counted from the end, both clamped into
    the dim, `end` at least `start`."""
    start = 0 if start is None else start
    end = size if end is None else end
    start, end = (start + size if start < 0 else start), (end + size if end < 0 else end)
    start = min(max(start, 0), size)
    return start, min(max(end, start), size)


def contiguous_strides(shape: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


def memory_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> list[int] | None:
    """The dims of a dense view (its elements fill one run of memory) whose dims are not in row-major order,
    outermost first by stride (a channels-last [N, C, H, W] view: [0, 2, 3, 1]); None for any other view (row-major,
    or with holes or overlaps)."""
    dims = [d for d, n in enumerate(shape) if n != 1]
    by = sorted(dims, key=lambda d: strides[d], reverse=True)
    expect = 1
    for d in reversed(by):
        if strides[d] != expect:
            return None
        expect *= shape[d]
    return None if by == dims else by


@dataclass
class TensorRef:
    """A strided view (in elements) of one planned buffer."""

    buffer: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        return all(s == c for d, s, c in zip(self.shape, self.strides, contiguous_strides(self.shape)) if d != 1)

    def extent(self) -> int:
        """One past the largest element offset the view reaches (its offset when it reaches nothing)."""
        if any(n == 0 for n in self.shape):
            return self.offset
        return self.offset + sum((n - 1) * s for n, s in zip(self.shape, self.strides)) + 1

    def is_whole(self, numel: int) -> bool:
        """Does the view cover its buffer of `numel` elements exactly, in order?"""
        return self.offset == 0 and self.numel == numel and self.is_contiguous()
