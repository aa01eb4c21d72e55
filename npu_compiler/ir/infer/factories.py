"""Rules of factories and fills (full, arange, zeros_like, ...) and of scatters and index writes."""

from __future__ import annotations

import math

from ..graph import Node, TensorType
from .core import (
    DEFAULT_FLOAT,
    INT64_MAX,
    InferError,
    _fill_fits,
    _same,
    _scalar_dtype,
    _wrapped_scalar_fits,
    broadcast,
    infers,
    norm_dim,
    tensor,
)


@infers("embedding.default")
def _embedding(node: Node) -> list[TensorType]:
    w, ids = tensor(node, 0, "weight"), tensor(node, 1, "indices")
    if len(w.shape) != 2:
        raise InferError(f"the embedding table must have rank 2, got {list(w.shape)}")
    if ids.dtype not in ("int64", "int32"):
        raise InferError(f"indices must be int64 or int32, got {ids.dtype}")
    return [TensorType(ids.shape + (w.shape[1],), w.dtype)]


@infers("index_copy.default")
def _index_copy(node: Node) -> list[TensorType]:
    x, index, src = tensor(node, 0, "self"), tensor(node, 1, "index"), tensor(node, 2, "source")
    r = len(x.shape)
    d = norm_dim(node.attrs["dim"], r)
    if index.dtype != "int64":
        raise InferError(f"index must be int64, got {index.dtype}")
    if len(index.shape) > 1:
        raise InferError(f"index must be a vector, got shape {list(index.shape)}")
    if src.dtype != x.dtype:
        raise InferError(f"source is {src.dtype}, self is {x.dtype}: they must match")
    n = index.shape[0] if index.shape else 1
    want = list(x.shape)
    if want:
        want[d] = n
    if list(src.shape) != want and not (not src.shape and n == 1 and r <= 1):
        raise InferError(f"source has shape {list(src.shape)}; {n} index entries along dim {d} of {list(x.shape)} "
                         f"need {want}")
    return _same(x)


def _factory_size(node: Node) -> tuple[int, ...]:
    size = node.attrs["size"]
    if any(d < 0 for d in size):
        raise InferError(f"size {size} has a negative dim")
    return tuple(size)


@infers("full.default")
def _full(node: Node) -> list[TensorType]:
    v = node.attrs["fill_value"]
    dt = node.attrs.get("dtype") or _scalar_dtype(v)
    size = _factory_size(node)
    _fill_fits(v, dt, math.prod(size), "fill_value")
    return [TensorType(size, dt)]


@infers("zeros.default", "ones.default", "empty.memory_format", "empty_strided.default")
def _zeros(node: Node) -> list[TensorType]:
    if node.op == "empty_strided.default" and len(node.attrs["stride"]) != len(node.attrs["size"]):
        raise InferError(f"stride {node.attrs['stride']} and size {node.attrs['size']} differ in length")
    return [TensorType(_factory_size(node), node.attrs.get("dtype") or DEFAULT_FLOAT)]


@infers("arange.default", "arange.start", "arange.start_step")
def _arange(node: Node) -> list[TensorType]:
    a = node.attrs
    start, end, step = a.get("start", 0), a["end"], a.get("step", 1)
    floaty = any(isinstance(v, float) for v in (start, end, step))
    dt = a.get("dtype") or (DEFAULT_FLOAT if floaty else "int64")
    if step == 0 or (dt == "int64" and int(step) == 0):
        raise InferError("step must not be 0")
    # the direction is checked on the bounds as given, before an int64 arange truncates them
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise InferError(f"arange from {start} to {end} with step {step} goes the wrong way")
    if dt == "int64":
        # ATen converts the bounds to int64 (truncating) and counts in integers
        start, end, step = int(start), int(end), int(step)
    if dt == "int64":
        n = abs(end - start + step - (1 if step > 0 else -1)) // abs(step)
    else:
        n = max(math.ceil((end - start) / step), 0)
    if n > INT64_MAX:
        raise InferError(f"arange of {n} elements")
    return [TensorType((n,), dt)]


@infers("full_like.default", "zeros_like.default", "ones_like.default", "empty_like.default")
def _like(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    dt = node.attrs.get("dtype") or x.dtype
    if node.op == "full_like.default":
        _fill_fits(node.attrs["fill_value"], dt, x.type.numel, "fill_value")
    return _same(x, dt)


@infers("new_ones.default", "new_zeros.default", "new_full.default", "new_empty.default", "new_empty_strided.default")
def _new(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if node.op == "new_empty_strided.default" and len(node.attrs["stride"]) != len(node.attrs["size"]):
        raise InferError(f"stride {node.attrs['stride']} and size {node.attrs['size']} differ in length")
    dt = node.attrs.get("dtype") or x.dtype
    size = _factory_size(node)
    if node.op == "new_full.default":
        _fill_fits(node.attrs["fill_value"], dt, math.prod(size), "fill_value")
    return [TensorType(size, dt)]


@infers("scalar_tensor.default")
def _scalar_tensor(node: Node) -> list[TensorType]:
    dt = node.attrs.get("dtype") or DEFAULT_FLOAT
    _wrapped_scalar_fits(node.attrs["s"], dt, "s")
    return [TensorType((), dt)]



@infers("index_add.default")
def _index_add(node: Node) -> list[TensorType]:
    x, index, src = tensor(node, 0, "self"), tensor(node, 1, "index"), tensor(node, 2, "source")
    d = norm_dim(node.attrs["dim"], len(x.shape))
    if index.dtype not in ("int64", "int32"):
        raise InferError(f"index must be int64 or int32, got {index.dtype}")
    if len(index.shape) > 1:
        raise InferError(f"index must be a vector, got shape {list(index.shape)}")
    if src.dtype != x.dtype:
        raise InferError(f"source is {src.dtype}, self is {x.dtype}: they must match")
    n = index.type.numel
    want = list(x.shape)
    if want:
        want[d] = n
    if (list(src.shape) != want and not (len(src.shape) <= 1 and len(x.shape) <= 1 and src.type.numel == n)):
        raise InferError(f"source has shape {list(src.shape)}; {n} index entries along dim {d} of {list(x.shape)} "
                         f"need {want}")
    alpha = node.attrs.get("alpha", 1)
    if isinstance(alpha, float) and x.dtype not in ("float16", "bfloat16", "float32", "float64") \
            and alpha != int(alpha):
        raise InferError(f"alpha {alpha!r} is not an integer, but self is {x.dtype}")
    _wrapped_scalar_fits(alpha, x.dtype, "alpha")
    return _same(x)


@infers("scatter.src", "scatter.value", "scatter_add.default", "scatter_reduce.two")
def _scatter(node: Node) -> list[TensorType]:
    x, index = tensor(node, 0, "self"), tensor(node, 1, "index")
    d = norm_dim(node.attrs["dim"], len(x.shape))
    if index.dtype not in ("int64", "int32"):
        raise InferError(f"index must be int64 or int32, got {index.dtype}")
    src = tensor(node, 2, "src") if node.op != "scatter.value" else None
    if node.op == "scatter_reduce.two" and node.attrs["reduce"] not in ("sum", "prod", "mean", "amax", "amin", "max",
                                                                        "min"):
        raise InferError(f"reduce {node.attrs['reduce']!r} is not one of sum, prod, mean, amax, amin")
    if src is not None and src.dtype != x.dtype:
        raise InferError(f"src is {src.dtype}, self is {x.dtype}: they must match")
    if node.op == "scatter.value":
        _wrapped_scalar_fits(node.attrs["value"], x.dtype, "value")
    if index.type.numel:
        xs, ix = x.shape or (1,), index.shape or (1,)
        if len(ix) != len(xs) or (src is not None and len(src.shape or (1,)) != len(ix)):
            raise InferError(f"index {list(index.shape)}, self {list(x.shape)} and src must have one rank")
        if any(i != d and n > xs[i] for i, n in enumerate(ix)):
            raise InferError(f"index of shape {list(index.shape)} is larger than self {list(x.shape)} outside dim {d}")
        if src is not None and any(n > m for n, m in zip(ix, src.shape or (1,))):
            raise InferError(f"index of shape {list(index.shape)} is larger than src {list(src.shape)}")
    return _same(x)


@infers("masked_scatter.default")
def _masked_scatter(node: Node) -> list[TensorType]:
    x, mask, src = tensor(node, 0, "self"), tensor(node, 1, "mask"), tensor(node, 2, "source")
    if mask.dtype != "bool":
        raise InferError(f"the mask must be a bool tensor, got {mask.dtype}")
    if src.dtype != x.dtype:
        raise InferError(f"source is {src.dtype}, self is {x.dtype}: they must match")
    return [TensorType(broadcast(x.shape, mask.shape), x.dtype)]


@infers("index_put.default")
def _index_put(node: Node) -> list[TensorType]:
    x, values = tensor(node, 0, "self"), node.inputs[-1]
    idx = node.inputs[1:-1]
    masks = node.attrs.get("_tensor_list_none_masks")
    slots = list(masks[0]) if masks else [False] * len(idx)
    if len(node.inputs) < 2 or sum(not m for m in slots) != len(idx):
        raise InferError(f"the index list {slots} does not match the {len(idx)} index inputs")
    sizes = node.attrs.get("_tensor_list_sizes")
    if sizes is not None and sizes != [len(idx)]:
        raise InferError(f"_tensor_list_sizes {sizes} does not match the {len(idx)} index inputs")
    if values.dtype != x.dtype:
        raise InferError(f"values are {values.dtype}, self is {x.dtype}: they must match")
    used = len(slots)  # each entry indexes one dim; a mask of rank k indexes k
    for v in idx:
        if v.dtype not in ("int64", "int32", "bool", "uint8"):
            raise InferError(f"index tensors must be int64, int32 or bool, got {v.dtype}")
        used += len(v.shape) - 1 if v.dtype in ("bool", "uint8") else 0
    if used > max(len(x.shape), 1) or not idx:
        raise InferError(f"{used} indexed dims for a tensor of rank {len(x.shape)}")
    return _same(x)


@infers("_embedding_bag.default", "embedding_bag.default", "embedding_bag.padding_idx")
def _embedding_bag(node: Node) -> list[TensorType]:
    w, idx, offsets = tensor(node, 0, "weight"), tensor(node, 1, "indices"), tensor(node, 2, "offsets")
    a = node.attrs
    if len(w.shape) != 2 or w.dtype not in ("float32", "float16", "bfloat16", "float64"):
        raise InferError(f"the weight must be a floating-point matrix, got {w.dtype}{list(w.shape)}")
    if idx.dtype not in ("int64", "int32") or offsets.dtype not in ("int64", "int32") or len(idx.shape) != 1 \
            or len(offsets.shape) != 1:
        raise InferError("indices and offsets must be integer vectors")
    mode = a["mode"]
    if mode not in (0, 1, 2):
        raise InferError(f"mode {mode} is not 0 (sum), 1 (mean) or 2 (max)")
    if len(node.inputs) > 3:
        psw = node.inputs[3]
        if mode != 0 or psw.shape != idx.shape or psw.dtype != w.dtype:
            raise InferError("per_sample_weights go with mode 0 (sum), one per index, in the weight's dtype")
    bags = offsets.shape[0] - (1 if a["include_last_offset"] else 0)
    if bags < 0:
        raise InferError("include_last_offset needs at least one offset")
    n, d = idx.shape[0], w.shape[1]
    # the other outputs exist for a backward pass; their shapes differ between ATen's CPU kernel and the meta
    # function torch.export traces with: each is taken as declared among the two
    declared = [v.type.shape for v in node.outputs[1:4]] + [()] * 3

    def pick(i: int, choices: list[tuple[int, ...]]) -> TensorType:
        return TensorType(declared[i] if declared[i] in choices else choices[0], "int64")

    k = offsets.shape[0]
    extra = [(bags, d)] if mode == 2 else [(bags,), (k,), (0,)]
    return [TensorType((bags, d), w.dtype), pick(0, [(n,), (0,)]), pick(1, [(bags,), (k,)]), pick(2, extra)]


@infers("one_hot.default")
def _one_hot(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    n = node.attrs["num_classes"]
    if x.dtype != "int64":
        raise InferError(f"one_hot takes an int64 tensor of class indices, got {x.dtype}")
    if n == -1:
        raise InferError("num_classes=-1 takes the number of classes from the data (its largest index): give "
                         "num_classes")
    if n < 1 and not (n == 0 and x.type.numel == 0):
        raise InferError(f"num_classes {n} must be positive")
    return [TensorType(x.shape + (n,), "int64")]
