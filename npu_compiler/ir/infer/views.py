"""Rules of views and layout ops (reshape, transpose, slice, split, cat, pad, roll, ...) and gathers."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ...dtypes import INT_DTYPES
from ...tensor import slice_bounds
from ..graph import Node, TensorType, Value
from .core import (
    InferError,
    _representable,
    _same,
    _same_shape,
    broadcast,
    infers,
    norm_dim,
    result_type,
    tensor,
    tensor_list,
)


def _infer_size(size: Sequence[int], numel: int) -> tuple[int, ...]:
    """A view's size with at most one -1, resolved against `numel` elements."""
    if list(size).count(-1) > 1:
        raise InferError(f"size {list(size)} has more than one -1")
    known = math.prod(d for d in size if d != -1)
    if -1 in size:
        if known == 0 or numel % known:
            raise InferError(f"size {list(size)} cannot hold {numel} elements")
        size = [numel // known if d == -1 else d for d in size]
    if math.prod(size) != numel:
        raise InferError(f"size {list(size)} holds {math.prod(size)} elements, the input has {numel}")
    return tuple(size)


@infers("view.default", "reshape.default", "_unsafe_view.default")
def _view(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    size = node.attrs["shape" if node.op == "reshape.default" else "size"]
    return _same_shape(x, _infer_size(size, x.type.numel))


@infers("flatten.using_ints")
def _flatten(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if not x.shape:
        return _same_shape(x, (1,))
    r = len(x.shape)
    s, e = norm_dim(node.attrs["start_dim"], r, "start_dim"), norm_dim(node.attrs["end_dim"], r, "end_dim")
    if s > e:
        raise InferError(f"start_dim {node.attrs['start_dim']} comes after end_dim {node.attrs['end_dim']}")
    return _same_shape(x, x.shape[:s] + (math.prod(x.shape[s:e + 1]),) + x.shape[e + 1:])


@infers("unsqueeze.default")
def _unsqueeze(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    d = norm_dim(node.attrs["dim"], len(x.shape) + 1)
    return _same_shape(x, x.shape[:d] + (1,) + x.shape[d:])


@infers("squeeze.default", "squeeze.dim", "squeeze.dims")
def _squeeze(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    r = len(x.shape)
    if node.op == "squeeze.default":
        dims = set(range(r))
    else:
        raw = node.attrs["dim"]
        listed = [norm_dim(d, r) for d in (raw if isinstance(raw, list) else [raw])]
        dims = set(listed)
        if len(dims) != len(listed):
            raise InferError(f"dim {raw} names a dim twice")
    return _same_shape(x, tuple(n for i, n in enumerate(x.shape) if not (i in dims and n == 1)))


@infers("transpose.int")
def _transpose(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    r = len(x.shape)
    a, b = norm_dim(node.attrs["dim0"], r, "dim0"), norm_dim(node.attrs["dim1"], r, "dim1")
    shape = list(x.shape)
    if shape:
        shape[a], shape[b] = shape[b], shape[a]
    return _same_shape(x, shape)


@infers("t.default")
def _t(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if len(x.shape) > 2:
        raise InferError(f"t() takes a tensor of rank <= 2, got {list(x.shape)}")
    return _same_shape(x, x.shape[::-1])


@infers("permute.default")
def _permute(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    r = len(x.shape)
    dims = [norm_dim(d, r, "dims entry") for d in node.attrs["dims"]]
    if sorted(dims) != list(range(r)):
        raise InferError(f"dims {node.attrs['dims']} is not a permutation of the {r} dims")
    return _same_shape(x, tuple(x.shape[d] for d in dims))


@infers("expand.default")
def _expand(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    size = list(node.attrs["size"])
    lead = len(size) - len(x.shape)
    if lead < 0:
        raise InferError(f"cannot expand shape {list(x.shape)} to the shorter size {size}")
    out = []
    for i, s in enumerate(size):
        if i < lead:
            if s < 0:
                raise InferError(f"size {size}: a new leading dim cannot be {s}")
            out.append(s)
            continue
        d = x.shape[i - lead]
        if s == -1:
            s = d
        if d != s and d != 1:
            raise InferError(f"cannot expand shape {list(x.shape)} to {size}")
        out.append(s)
    return _same_shape(x, out)


@infers("slice.Tensor")
def _slice(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    a = node.attrs
    d = norm_dim(a["dim"], len(x.shape))
    if not x.shape:
        raise InferError("cannot slice a 0-d tensor")
    step = a["step"]
    if step <= 0:
        raise InferError(f"step {step} must be positive")
    start, end = slice_bounds(a["start"], a["end"], x.shape[d])
    shape = list(x.shape)
    shape[d] = (end - start + step - 1) // step
    return _same_shape(x, shape)


def _input_and_dim(node: Node, fn: str) -> tuple[Value, int]:
    """The input and its `dim` attribute normalised; `fn` (as ATen names it) cannot take a 0-d tensor."""
    x = tensor(node, 0)
    if not x.shape:
        raise InferError(f"{fn}() cannot be applied to a 0-d tensor")
    return x, norm_dim(node.attrs["dim"], len(x.shape))


@infers("select.int")
def _select(node: Node) -> list[TensorType]:
    x, d = _input_and_dim(node, "select")
    i, n = node.attrs["index"], x.shape[d]
    if not -n <= i < n:
        raise InferError(f"index {i} is out of range for dim {d} of size {n}")
    return _same_shape(x, x.shape[:d] + x.shape[d + 1:])


def _split_shapes(x: Value, dim: int, sizes: Sequence[int]) -> list[TensorType]:
    out = []
    for s in sizes:
        shape = list(x.shape)
        shape[dim] = s
        out.append(TensorType(tuple(shape), x.dtype))
    return out


@infers("split.Tensor")
def _split(node: Node) -> list[TensorType]:
    x, d = _input_and_dim(node, "split")
    size, n = node.attrs["split_size"], x.shape[d]
    if size == 0 and n != 0:
        raise InferError(f"split_size 0 cannot split a dim of size {n}")
    count = max(-(-n // size), 1) if size else 1
    return _split_shapes(x, d, [size] * (count - 1) + [n - size * (count - 1)])


@infers("split_with_sizes.default")
def _split_with_sizes(node: Node) -> list[TensorType]:
    x, d = _input_and_dim(node, "split")
    sizes = node.attrs["split_sizes"]
    if sum(sizes) != x.shape[d]:
        raise InferError(f"split_sizes {sizes} sum to {sum(sizes)}, dim {d} has size {x.shape[d]}")
    return _split_shapes(x, d, sizes)


@infers("chunk.default")
def _chunk(node: Node) -> list[TensorType]:
    x, d = _input_and_dim(node, "chunk")
    chunks, n = node.attrs["chunks"], x.shape[d]
    size = -(-n // chunks)
    if size == 0:
        return _split_shapes(x, d, [0] * chunks)
    count = -(-n // size)
    return _split_shapes(x, d, [size] * (count - 1) + [n - size * (count - 1)])


@infers("cat.default")
def _cat(node: Node) -> list[TensorType]:
    tensor_list(node, "cat")
    # ATen skips legacy empty 1-D tensors ([0]) when the others have another rank
    shaped = [v for v in node.inputs if v.shape != (0,)] or [node.inputs[0]]
    ref = shaped[0].shape
    if not ref:
        raise InferError("cat cannot join 0-d tensors")
    d = norm_dim(node.attrs["dim"], len(ref))
    total = 0
    for v in shaped:
        if len(v.shape) != len(ref) or any(a != b for i, (a, b) in enumerate(zip(v.shape, ref)) if i != d):
            raise InferError(f"cannot join shapes {list(ref)} and {list(v.shape)} along dim {d}")
        total += v.shape[d]
    shape = list(ref)
    shape[d] = total
    return [TensorType(tuple(shape), result_type(*node.inputs))]


@infers("gather.default")
def _gather(node: Node) -> list[TensorType]:
    x, index = tensor(node, 0, "self"), tensor(node, 1, "index")
    d = norm_dim(node.attrs["dim"], len(x.shape))
    if index.dtype not in ("int64", "int32"):
        raise InferError(f"index must be int64 or int32, got {index.dtype}")
    xs, ix = x.shape or (1,), index.shape or (1,)
    if index.type.numel and len(xs) != len(ix):
        raise InferError(f"index of shape {list(index.shape)} must have the rank of self {list(x.shape)}")
    if index.type.numel and any(i != d and n > xs[i] for i, n in enumerate(ix)):
        raise InferError(f"index of shape {list(index.shape)} is larger than self {list(x.shape)} outside dim {d}")
    return [TensorType(index.shape, x.dtype)]


@infers("index_select.default")
def _index_select(node: Node) -> list[TensorType]:
    x, index = tensor(node, 0, "self"), tensor(node, 1, "index")
    d = norm_dim(node.attrs["dim"], len(x.shape))
    if index.dtype not in ("int64", "int32"):
        raise InferError(f"index must be int64 or int32, got {index.dtype}")
    if len(index.shape) > 1:
        raise InferError(f"index must be a vector, got shape {list(index.shape)}")
    if not x.shape:
        if index.type.numel != 1:
            raise InferError(f"a 0-d tensor takes an index of one element, got shape {list(index.shape)}")
        return _same(x)
    shape = list(x.shape)
    shape[d] = index.type.numel
    return _same_shape(x, shape)


@infers("index.Tensor")
def _index(node: Node) -> list[TensorType]:
    """Advanced indexing: the index tensors (integer, or bool masks standing for the positions they select) broadcast
    to B; B replaces the indexed dims when they are adjacent, otherwise it comes first."""
    x = tensor(node, 0, "self")
    idx = node.inputs[1:]
    masks = node.attrs.get("_tensor_list_none_masks")
    none = list(masks[0]) if masks else [False] * len(idx)
    if masks and len(masks) != 1:
        raise InferError(f"_tensor_list_none_masks {masks} must hold one list")
    if sum(not m for m in none) != len(idx):
        raise InferError(f"the index list {none} has {sum(not m for m in none)} tensors, the node lists {len(idx)}")
    if not idx:
        raise InferError("needs at least one index tensor")
    # each entry of the list consumes one dim of self (a mask of rank k consumes k)
    dims: list[int] = []  # self's dims the tensors index
    shapes: list[tuple[int, ...]] = []
    mask_at: list[int] = []  # which of `shapes` stand for a mask's selected count
    d, k = 0, 0
    for is_none in none:
        if is_none:
            d += 1
            continue
        v = idx[k]
        k += 1
        if v.dtype in ("bool", "uint8"):
            r = max(len(v.shape), 1) if v.shape else 0
            if x.shape[d:d + len(v.shape)] != v.shape:
                raise InferError(f"the mask of shape {list(v.shape)} does not match self {list(x.shape)} at dim {d}")
            mask_at.append(len(shapes))
            shapes.append((v.type.numel,))
            dims.extend(range(d, d + r))
            d += len(v.shape)
        elif v.dtype in INT_DTYPES:
            if v.dtype != "int64" and v.dtype != "int32":
                raise InferError(f"index tensors must be int64, int32 or bool, got {v.dtype}")
            shapes.append(v.shape)
            dims.append(d)
            d += 1
        else:
            raise InferError(f"index tensors must be integers or bools, got {v.dtype}")
    if d > len(x.shape):
        raise InferError(f"too many indices for a tensor of rank {len(x.shape)}")
    if mask_at:
        # a mask's selected count depends on its data: take the declared output's, bounded by the mask's size
        shapes = _mask_counts(node, x, shapes, mask_at, dims)
    b = broadcast(*shapes)
    indexed = set(dims)
    rest_before = [n for i, n in enumerate(x.shape) if i not in indexed and (not dims or i < min(dims))]
    rest_after = [n for i, n in enumerate(x.shape) if i not in indexed and dims and i > min(dims)]
    adjacent = not dims or sorted(indexed) == list(range(min(dims), max(dims) + 1))
    if adjacent:
        shape = tuple(rest_before) + b + tuple(rest_after)
    else:
        shape = b + tuple(n for i, n in enumerate(x.shape) if i not in indexed)
    return [TensorType(shape, x.dtype)]


def _mask_counts(node: Node, x: Value, shapes: list[tuple[int, ...]], mask_at: list[int], dims: list[int]
                 ) -> list[tuple[int, ...]]:
    """Where a bool mask indexes, the result's length there is the number of true entries: the declared output gives
    it, and it must be at most the mask's size."""
    lead = [n for i, n in enumerate(x.shape) if i not in set(dims) and i < min(dims)]
    adjacent = sorted(set(dims)) == list(range(min(dims), max(dims) + 1))
    rank_b = max(len(s) for s in shapes)
    declared = node.outputs[0].shape if node.outputs else ()
    start = len(lead) if adjacent else 0
    out = list(shapes)
    for j in mask_at:
        pos = start + rank_b - 1  # a mask stands for a 1-d index: its count is B's last dim
        top = shapes[j][0]
        n = declared[pos] if pos < len(declared) else top
        if not 0 <= n <= top:
            raise InferError(f"a mask of {top} elements selects {n}")
        out[j] = (n,)
    return out


@infers("repeat.default")
def _repeat(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    reps = list(node.attrs["repeats"])
    if len(reps) < len(x.shape):
        raise InferError(f"repeats {reps} has fewer entries than the tensor's rank {len(x.shape)}")
    if any(n < 0 for n in reps):
        raise InferError(f"repeats {reps} has a negative entry")
    shape = (1,) * (len(reps) - len(x.shape)) + x.shape
    return _same_shape(x, tuple(s * n for s, n in zip(shape, reps)))


@infers("repeat_interleave.self_int")
def _repeat_interleave(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    n, dim = node.attrs["repeats"], node.attrs.get("dim")
    if n < 0:
        raise InferError(f"repeats {n} is negative")
    if dim is None:
        shape = (x.type.numel * n,)
    else:
        if not x.shape:
            raise InferError(f"dim {dim} given for a 0-d tensor")
        d = norm_dim(dim, len(x.shape))
        shape = tuple(s * n if i == d else s for i, s in enumerate(x.shape))
    size = node.attrs.get("output_size")
    if size is not None and size != shape[0 if dim is None else norm_dim(dim, len(shape))]:
        raise InferError(f"output_size {size} is not the repeated size {list(shape)}")
    return _same_shape(x, shape)


@infers("stack.default")
def _stack(node: Node) -> list[TensorType]:
    tensor_list(node, "stack")
    ref = node.inputs[0].shape
    if any(v.shape != ref for v in node.inputs):
        raise InferError(f"stack takes tensors of one shape, got {', '.join(str(list(v.shape)) for v in node.inputs)}")
    d = norm_dim(node.attrs["dim"], len(ref) + 1)
    return [TensorType(ref[:d] + (len(node.inputs),) + ref[d:], result_type(*node.inputs))]


def _pad_pairs(x: Value, pad: Sequence[int]) -> list[tuple[int, int, int]]:
    """(dim, before, after) per padded dim: the pairs run from the last dim backwards."""
    if len(pad) % 2:
        raise InferError(f"pad {list(pad)} must have an even number of entries")
    if len(pad) // 2 > len(x.shape):
        raise InferError(f"pad {list(pad)} pads {len(pad) // 2} dims of a tensor of rank {len(x.shape)}")
    return [(len(x.shape) - 1 - i, pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)]


def _constant_pad(x: Value, pad: Sequence[int]) -> list[TensorType]:
    shape = list(x.shape)
    for d, lo, hi in _pad_pairs(x, pad):
        # negative pads cut first (ATen narrows the input), then positive ones add
        if shape[d] + min(lo, 0) + min(hi, 0) < 0:
            raise InferError(f"pad {list(pad)} cuts more than dim {d} of {list(x.shape)} holds")
        shape[d] += lo + hi
    return _same_shape(x, shape)


def _edge_pad(x: Value, pad: Sequence[int], mode: str) -> list[TensorType]:
    """reflect / replicate / circular padding: ATen's rank rule (k padded dims of a rank k+1 or k+2 input) and
    that reflection reads inside the tensor (a pad smaller than the dim) and circular wraps once at most."""
    k = len(pad) // 2
    if len(pad) % 2 or k not in (1, 2, 3) or len(x.shape) not in (k + 1, k + 2):
        raise InferError(f"{mode} padding of {len(pad) // 2} dims takes an input of rank {k + 1} or {k + 2}, got "
                         f"{list(x.shape)} with pad {list(pad)}")
    if any(n == 0 for n in x.shape[1:]):
        raise InferError(f"{mode} padding of an empty tensor {list(x.shape)}")
    shape = list(x.shape)
    for d, lo, hi in _pad_pairs(x, pad):
        n = x.shape[d]
        if mode == "reflect" and (lo >= n or hi >= n):
            raise InferError(f"reflection pad {list(pad)} must be smaller than dim {d} of {list(x.shape)}")
        if mode == "circular" and (lo > n or hi > n):
            raise InferError(f"circular pad {list(pad)} must be at most dim {d} of {list(x.shape)}")
        shape[d] = n + lo + hi
        if shape[d] < (0 if mode == "circular" else 1):  # circular padding may crop a dim away; ATen allows that
            raise InferError(f"pad {list(pad)} leaves dim {d} of {list(x.shape)} empty")
    return _same_shape(x, shape)


@infers("pad.default")
def _pad(node: Node) -> list[TensorType]:
    x, mode = tensor(node, 0), node.attrs["mode"]
    if mode == "constant":
        if any(p > 0 for p in node.attrs["pad"]):  # as constant_pad_nd: a pad that only narrows converts no value
            _representable(node.attrs.get("value") or 0, x.dtype, "value")
        return _constant_pad(x, node.attrs["pad"])
    if mode not in ("reflect", "replicate", "circular"):
        raise InferError(f"mode {mode!r} is not one of 'constant', 'reflect', 'replicate', 'circular'")
    if node.attrs.get("value") is not None:
        raise InferError(f"padding mode {mode!r} takes no value")
    return _edge_pad(x, node.attrs["pad"], mode)


@infers("constant_pad_nd.default")
def _constant_pad_nd(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if any(p > 0 for p in node.attrs["pad"]):  # ATen only narrows, never converting the value, when no pad grows
        _representable(node.attrs["value"], x.dtype, "value")
    return _constant_pad(x, node.attrs["pad"])


@infers("reflection_pad1d.default", "reflection_pad2d.default", "reflection_pad3d.default",
        "replication_pad2d.default", "replication_pad3d.default")
def _reflection_pad(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if x.dtype == "bool":
        raise InferError(f"{node.op.partition('.')[0]} of a bool tensor is not supported")
    return _edge_pad(x, node.attrs["padding"], "reflect" if node.op.startswith("reflection") else "replicate")


@infers("roll.default")
def _roll(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    shifts, dims = node.attrs["shifts"], node.attrs["dims"]
    if not shifts:
        raise InferError("shifts must not be empty")
    if dims:
        if not x.shape:
            raise InferError("a 0-d tensor has no dims to roll along")
        if len(shifts) != len(dims):
            raise InferError(f"shifts {shifts} and dims {dims} must have one entry each")
        for d in dims:
            norm_dim(d, len(x.shape))
    elif len(shifts) != 1:
        raise InferError(f"shifts {shifts} without dims must be a single shift (of the flattened tensor)")
    return _same(x)


@infers("flip.default")
def _flip(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    dims = [norm_dim(d, len(x.shape)) for d in node.attrs["dims"]]
    if len(set(dims)) != len(dims):
        raise InferError(f"dims {node.attrs['dims']} names a dim twice")
    return _same(x)


@infers("diff.default")
def _diff(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if not x.shape:
        raise InferError("diff needs a tensor of rank >= 1")
    n = node.attrs["n"]
    if n < 0:
        raise InferError(f"order n={n} must be non-negative")
    if len(node.inputs) > 3:
        raise InferError(f"takes (self[, prepend][, append]), got {len(node.inputs)} inputs")
    if n == 0 and len(node.inputs) == 1:  # ATen returns the input itself, its dim unread
        return _same(x)
    d = norm_dim(node.attrs["dim"], len(x.shape))
    if n == 0:  # ATen joins prepend and append along dim (checking it), then returns the input itself
        return _same(x)
    total = 0
    for v in node.inputs:
        if len(v.shape) != len(x.shape) or any(a != b for i, (a, b) in enumerate(zip(v.shape, x.shape)) if i != d):
            raise InferError(f"'{v.name}' of shape {list(v.shape)} cannot be joined to {list(x.shape)} along dim {d}")
        total += v.shape[d]
    dt = result_type(*node.inputs)  # the joined tensor's (bool differences are xor)
    shape = list(x.shape)
    shape[d] = max(total - n, 0)
    return [TensorType(tuple(shape), dt)]


def _diagonal_shape(node: Node, x: Value) -> tuple[int, ...]:
    r = len(x.shape)
    if r < 2:
        raise InferError(f"diagonal needs a tensor of rank >= 2, got {list(x.shape)}")
    a, b = norm_dim(node.attrs["dim1"], r, "dim1"), norm_dim(node.attrs["dim2"], r, "dim2")
    if a == b:
        raise InferError(f"dim1 and dim2 are both dim {a}")
    off = node.attrs["offset"]
    n = min(x.shape[a], x.shape[b] - off) if off >= 0 else min(x.shape[a] + off, x.shape[b])
    return tuple(s for i, s in enumerate(x.shape) if i not in (a, b)) + (max(n, 0),)


@infers("diagonal.default")
def _diagonal(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    return _same_shape(x, _diagonal_shape(node, x))



@infers("unflatten.int")
def _unflatten(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    sizes = list(node.attrs["sizes"])
    if not sizes:
        raise InferError("sizes must not be empty")
    d = norm_dim(node.attrs["dim"], len(x.shape))
    if not x.shape:
        raise InferError("cannot unflatten a 0-d tensor")
    inner = _infer_size(sizes, x.shape[d])
    return _same_shape(x, x.shape[:d] + inner + x.shape[d + 1:])


@infers("expand_as.default")
def _expand_as(node: Node) -> list[TensorType]:
    x, other = tensor(node, 0, "self"), tensor(node, 1, "other")
    if broadcast(x.shape, other.shape) != other.shape:
        raise InferError(f"cannot expand shape {list(x.shape)} to {list(other.shape)}")
    return _same_shape(x, other.shape)


@infers("unbind.int")
def _unbind(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if not x.shape:
        raise InferError("cannot unbind a 0-d tensor")
    d = norm_dim(node.attrs["dim"], len(x.shape))
    return [TensorType(x.shape[:d] + x.shape[d + 1:], x.dtype)] * x.shape[d]


@infers("numpy_T.default")
def _numpy_t(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    return _same_shape(x, x.shape[::-1])


@infers("mT.default", "mH.default", "adjoint.default")
def _matrix_transpose(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if not x.shape:
        return _same(x)  # the identity on a 0-d tensor (deprecated in ATen)
    if len(x.shape) < 2:
        raise InferError(f"a matrix transpose needs a tensor of rank >= 2, got {list(x.shape)}")
    return _same_shape(x, x.shape[:-2] + (x.shape[-1], x.shape[-2]))


@infers("matrix_H.default")
def _matrix_h(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if not x.shape:
        return _same(x)  # the identity on a 0-d tensor (deprecated in ATen)
    if len(x.shape) != 2:
        raise InferError(f"matrix_H takes a matrix (rank 2), got {list(x.shape)}")
    return _same_shape(x, x.shape[::-1])


@infers("meshgrid.default", "meshgrid.indexing")
def _meshgrid(node: Node) -> list[TensorType]:
    xs = tensor_list(node, "meshgrid")
    if any(len(v.shape) > 1 for v in xs):
        raise InferError(f"meshgrid takes 0-d or 1-d tensors, got {', '.join(str(list(v.shape)) for v in xs)}")
    if len({v.dtype for v in xs}) > 1:
        raise InferError(f"meshgrid takes tensors of one dtype, got {', '.join(v.dtype for v in xs)}")
    indexing = node.attrs.get("indexing", "ij")
    if indexing not in ("ij", "xy"):
        raise InferError(f"indexing must be 'ij' or 'xy', got {indexing!r}")
    shape = [v.type.numel for v in xs]
    if indexing == "xy" and len(shape) >= 2:
        shape[0], shape[1] = shape[1], shape[0]
    return [TensorType(tuple(shape), v.dtype) for v in xs]


def _scatter_source(node: Node, view: Sequence[int]) -> TensorType:
    x, src = tensor(node, 0, "self"), tensor(node, 1, "src")
    if src.shape != tuple(view):
        raise InferError(f"src has shape {list(src.shape)}; the elements it replaces have shape {list(view)}")
    return x.type


@infers("select_scatter.default")
def _select_scatter(node: Node) -> list[TensorType]:
    x = tensor(node, 0, "self")
    if not x.shape:
        raise InferError("cannot select from a 0-d tensor")
    d = norm_dim(node.attrs["dim"], len(x.shape))
    i = node.attrs["index"]
    if not -x.shape[d] <= i < x.shape[d]:
        raise InferError(f"index {i} is out of range for dim {d} of size {x.shape[d]}")
    return [_scatter_source(node, x.shape[:d] + x.shape[d + 1:])]


@infers("slice_scatter.default")
def _slice_scatter(node: Node) -> list[TensorType]:
    x = tensor(node, 0, "self")
    a = node.attrs
    if not x.shape:
        raise InferError("cannot slice a 0-d tensor")
    d = norm_dim(a["dim"], len(x.shape))
    if a["step"] <= 0:
        raise InferError(f"step {a['step']} must be positive")
    start, end = slice_bounds(a["start"], a["end"], x.shape[d])
    n = -(-(end - start) // a["step"])
    return [_scatter_source(node, x.shape[:d] + (n,) + x.shape[d + 1:])]


@infers("diagonal_scatter.default")
def _diagonal_scatter(node: Node) -> list[TensorType]:
    return [_scatter_source(node, _diagonal_shape(node, tensor(node, 0, "self")))]


@infers("as_strided.default")
def _as_strided(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    size, stride = list(node.attrs["size"]), list(node.attrs["stride"])
    offset = node.attrs.get("storage_offset") or 0
    if len(size) != len(stride) or any(n < 0 for n in size) or any(s < 0 for s in stride) or offset < 0:
        raise InferError(f"size {size}, stride {stride} and storage_offset {offset} must be non-negative, one stride "
                         "per dim")
    if math.prod(size) and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= x.type.numel:
        raise InferError(f"size {size} with stride {stride} from offset {offset} reaches past the {x.type.numel} "
                         "elements of the input")
    return _same_shape(x, size)


@infers("movedim.int")
def _movedim(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    r = len(x.shape)
    src, dst = norm_dim(node.attrs["source"], r, "source"), norm_dim(node.attrs["destination"], r, "destination")
    order = [d for d in range(r) if d != src]
    order.insert(dst, src)
    return _same_shape(x, tuple(x.shape[d] for d in order[:r]))


@infers("narrow.default")
def _narrow(node: Node) -> list[TensorType]:
    x, d = _input_and_dim(node, "narrow")
    n, start, length = x.shape[d], node.attrs["start"], node.attrs["length"]
    if not -n <= start <= n:
        raise InferError(f"start {start} is out of range for dim {d} of size {n}")
    start += n if start < 0 else 0
    if length < 0 or start + length > n:
        raise InferError(f"start {start} + length {length} exceeds dim {d} of size {n}")
    return _same_shape(x, x.shape[:d] + (length,) + x.shape[d + 1:])


@infers("view_as.default", "reshape_as.default")
def _view_as(node: Node) -> list[TensorType]:
    x, other = tensor(node, 0, "self"), tensor(node, 1, "other")
    if x.type.numel != other.type.numel:
        raise InferError(f"shape {list(other.shape)} is invalid for an input of {x.type.numel} elements")
    return _same_shape(x, other.shape)


@infers("ravel.default")
def _ravel(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    return _same_shape(x, (x.type.numel,))


def _image_like(node: Node, fn: str) -> Value:
    x = tensor(node, 0)
    if len(x.shape) < 3:
        raise InferError(f"{fn} needs an input of rank >= 3, got {list(x.shape)}")
    return x


@infers("pixel_shuffle.default")
def _pixel_shuffle(node: Node) -> list[TensorType]:
    x, f = _image_like(node, "pixel_shuffle"), node.attrs["upscale_factor"]
    *lead, c, h, w = x.shape
    if f <= 0 or c % (f * f):
        raise InferError(f"upscale_factor {f}: its square must divide the {c} channels")
    return _same_shape(x, (*lead, c // (f * f), h * f, w * f))


@infers("pixel_unshuffle.default")
def _pixel_unshuffle(node: Node) -> list[TensorType]:
    x, f = _image_like(node, "pixel_unshuffle"), node.attrs["downscale_factor"]
    *lead, c, h, w = x.shape
    if f <= 0 or h % f or w % f:
        raise InferError(f"downscale_factor {f} must divide the height {h} and width {w}")
    return _same_shape(x, (*lead, c * f * f, h // f, w // f))


@infers("channel_shuffle.default")
def _channel_shuffle(node: Node) -> list[TensorType]:
    x, g = _image_like(node, "channel_shuffle"), node.attrs["groups"]
    if g <= 0 or x.shape[1] % g:
        raise InferError(f"groups {g} must divide the {x.shape[1]} channels")
    return _same(x)


@infers("tril.default", "triu.default")
def _triangle(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if len(x.shape) < 2:
        raise InferError(f"{node.op.partition('.')[0]} needs a tensor of rank >= 2, got {list(x.shape)}")
    return _same(x)
