"""View ops as pure functions on strided references: they cost no kernel when the result is a strided view."""

from __future__ import annotations

import math

from ..program import TensorRef, contiguous_strides
from ..tensor import slice_bounds


def norm_dim(dim: int, rank: int) -> int:
    """ATen's maybe_wrap_dim: dims -rank..rank-1, and for a 0-d tensor 0 and -1 (its one element; a lowering over
    a dim of a 0-d operand sees it as [1]: `Lowering._lower_scalar_as_vector`)."""
    n = max(rank, 1)
    if not -n <= dim < n:
        raise IndexError(f"dim {dim} out of range for rank {rank}")
    return dim % n


def reshape(ref: TensorRef, shape: tuple[int, ...]) -> TensorRef | None:
    """Strides for `shape` over the same elements without a copy, or None when the layout does not allow it.
    Dims are walked from the innermost; each run of old dims that is contiguous within itself ("chunk") must be
    covered exactly by a run of new dims."""
    if math.prod(shape) != ref.numel:
        raise ValueError(f"cannot view {ref.shape} as {shape}")
    if ref.numel == 0 or ref.is_contiguous() or not ref.shape:
        return TensorRef(ref.buffer, shape, contiguous_strides(shape), ref.offset)
    old, old_st = ref.shape, ref.strides
    new_st = [0] * len(shape)
    view_d = len(shape) - 1
    base = old_st[-1]
    tensor_numel = view_numel = 1
    for d in range(len(old) - 1, -1, -1):
        tensor_numel *= old[d]
        if d == 0 or (old[d - 1] != 1 and old_st[d - 1] != tensor_numel * base):
            while view_d >= 0 and (view_numel < tensor_numel or shape[view_d] == 1):
                new_st[view_d] = view_numel * base
                view_numel *= shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                base, tensor_numel, view_numel = old_st[d - 1], 1, 1
    if view_d != -1:
        return None
    return TensorRef(ref.buffer, tuple(shape), tuple(new_st), ref.offset)


def permute(ref: TensorRef, dims: list[int]) -> TensorRef:
    r = len(ref.shape)
    dims = [norm_dim(d, r) for d in dims]
    return TensorRef(ref.buffer, tuple(ref.shape[d] for d in dims), tuple(ref.strides[d] for d in dims), ref.offset)


def transpose(ref: TensorRef, d0: int, d1: int) -> TensorRef:
    r = len(ref.shape)
    if r == 0:
        return ref
    dims = list(range(r))
    a, b = norm_dim(d0, r), norm_dim(d1, r)
    dims[a], dims[b] = dims[b], dims[a]
    return permute(ref, dims)


def expand(ref: TensorRef, shape: tuple[int, ...]) -> TensorRef:
    """Broadcast `ref` to `shape` (right-aligned; size-1 and missing dims get stride 0)."""
    lead = len(shape) - len(ref.shape)
    if lead < 0:
        raise ValueError(f"cannot expand {ref.shape} to {shape}")
    strides = [0] * lead
    for i, (d, s) in enumerate(zip(ref.shape, ref.strides)):
        target = shape[lead + i]
        if d == target:
            strides.append(s if d != 1 else 0)
        elif d == 1:
            strides.append(0)
        else:
            raise ValueError(f"cannot expand {ref.shape} to {shape}")
    return TensorRef(ref.buffer, tuple(shape), tuple(strides), ref.offset)


def slice_(ref: TensorRef, dim: int, start: int | None, end: int | None, step: int) -> TensorRef:
    d = norm_dim(dim, len(ref.shape))
    start, end = slice_bounds(start, end, ref.shape[d])
    n = -(-(end - start) // step)
    shape = list(ref.shape)
    strides = list(ref.strides)
    shape[d] = n
    offset = ref.offset + start * ref.strides[d]
    strides[d] = ref.strides[d] * step
    return TensorRef(ref.buffer, tuple(shape), tuple(strides), offset)


def select(ref: TensorRef, dim: int, index: int) -> TensorRef:
    d = norm_dim(dim, len(ref.shape))
    if index < 0:
        index += ref.shape[d]
    shape = ref.shape[:d] + ref.shape[d + 1:]
    strides = ref.strides[:d] + ref.strides[d + 1:]
    return TensorRef(ref.buffer, shape, strides, ref.offset + index * ref.strides[d])


def diagonal(ref: TensorRef, offset: int, dim1: int, dim2: int) -> TensorRef:
    """The diagonal of dims (dim1, dim2) shifted by `offset` (above the main one when positive), as the last dim."""
    r = len(ref.shape)
    a, b = norm_dim(dim1, r), norm_dim(dim2, r)
    if a == b:
        raise ValueError(f"diagonal of dims {dim1} and {dim2}: they must differ")
    start = ref.offset + (offset * ref.strides[b] if offset >= 0 else -offset * ref.strides[a])
    n = max(0, min(ref.shape[a] - max(-offset, 0), ref.shape[b] - max(offset, 0)))
    keep = [d for d in range(r) if d not in (a, b)]
    shape = tuple(ref.shape[d] for d in keep) + (n,)
    strides = tuple(ref.strides[d] for d in keep) + (ref.strides[a] + ref.strides[b],)
    return TensorRef(ref.buffer, shape, strides, start if n else ref.offset)


def with_shape(ref: TensorRef, shape: tuple[int, ...]) -> TensorRef | None:
    """unsqueeze/squeeze/flatten/view: the same elements under another shape."""
    return reshape(ref, tuple(shape))
