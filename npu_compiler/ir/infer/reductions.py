"""Rules of reductions, row ops, scans and normalisations (batch, layer and group norm)."""

from __future__ import annotations

from typing import Any

from ...dtypes import FLOAT_DTYPES, INT_DTYPES
from ..graph import Node, TensorType, Value
from .core import InferError, _float_of, _need_float, _same, broadcast, infers, norm_dim, result_type, tensor


def _batch_norm_check(node: Node) -> Value:
    x = tensor(node, 0)
    _need_float(x)
    if len(x.shape) < 2:
        raise InferError(f"input of shape {list(x.shape)}: batch norm needs a batch and a channel dim")
    no_stats = node.op == "_native_batch_norm_legit.no_stats" or (
        node.op == "batch_norm.default" and node.attrs.get("training"))
    if len(node.inputs) not in ((1, 3, 5) if no_stats else (3, 5)):
        raise InferError(f"takes (input, running_mean, running_var) or (input, weight, bias, running_mean, "
                         f"running_var){' or (input[, weight, bias]) with batch statistics' if no_stats else ''}, got "
                         f"{len(node.inputs)} inputs")
    c = x.shape[1]
    for v in node.inputs[1:]:
        if v.shape != (c,):
            raise InferError(f"'{v.name}' has shape {list(v.shape)}; per-channel parameters of {c} channels "
                             f"have shape [{c}]")
        _need_float(v, f"'{v.name}'")
    return x


@infers("batch_norm.default")
def _batch_norm(node: Node) -> list[TensorType]:
    return _same(_batch_norm_check(node))


@infers("_native_batch_norm_legit_no_training.default")
def _native_batch_norm(node: Node) -> list[TensorType]:
    x = _batch_norm_check(node)
    # The saved statistics (unused in eval) are empty on CPU and [C] on the meta device torch.export traces on;
    # they are kept in the accumulation dtype (fp32 for half inputs)
    stats = "float32" if x.dtype in ("float16", "bfloat16") else x.dtype
    declared = [v.shape for v in node.outputs[1:3]]
    shapes = [s if s in ((0,), (x.shape[1],)) else (0,) for s in declared] + [(0,)] * (2 - len(declared))
    return [x.type, TensorType(shapes[0], stats), TensorType(shapes[1], stats)]


def _statistics(node: Node, choices: list[TensorType]) -> TensorType:
    """The type of a node's two statistics outputs: the first of `choices` unless the IR declares another of them
    for the first (ATen's CPU kernels and the meta functions torch.export traces with differ in the dtype or shape
    of these backward-only outputs); the second must match it."""
    declared = node.outputs[1].type if len(node.outputs) > 1 else None
    return declared if declared in choices else choices[0]


@infers("_native_batch_norm_legit.default", "_native_batch_norm_legit.no_stats")
def _native_batch_norm_legit(node: Node) -> list[TensorType]:
    x = _batch_norm_check(node)
    acc = "float32" if x.dtype in ("float16", "bfloat16") else x.dtype
    c = x.shape[1]
    if node.op.endswith("no_stats") and not node.attrs["training"]:
        raise InferError("batch norm without running statistics needs training=True (batch statistics)")
    if node.op.endswith("no_stats") or node.attrs["training"]:
        choices = [TensorType((c,), acc), TensorType((c,), x.dtype)]
    else:
        choices = [TensorType((0,), acc), TensorType((c,), acc)]
    return [x.type] + [_statistics(node, choices)] * 2


@infers("native_layer_norm.default")
def _native_layer_norm(node: Node) -> list[TensorType]:
    x = _layer_norm(node)[0]
    k = len(node.attrs["normalized_shape"])
    shape = x.shape[:len(x.shape) - k] + (1,) * k
    choices = [TensorType(shape, x.dtype), TensorType(shape, "float32")]
    return [x] + [_statistics(node, choices)] * 2


@infers("native_group_norm.default")
def _native_group_norm(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    a = node.attrs
    _need_float(x)
    if len(x.shape) < 2 or (a["N"], a["C"], a["HxW"]) != (x.shape[0], x.shape[1], x.type.numel // max(
            x.shape[0] * x.shape[1], 1)):
        raise InferError(f"N={a['N']}, C={a['C']}, HxW={a['HxW']} do not describe an input of shape {list(x.shape)}")
    g = a["group"]
    if g < 1 or x.shape[1] % g:
        raise InferError(f"group={g} does not divide the {x.shape[1]} channels")
    if len(node.inputs) > 3 or any(v.shape != (x.shape[1],) for v in node.inputs[1:]):
        raise InferError("takes (input[, weight][, bias]) with per-channel parameters")
    shape = (x.shape[0], g)
    choices = [TensorType(shape, x.dtype), TensorType(shape, "float32")]
    return [x.type] + [_statistics(node, choices)] * 2


@infers("sort.default", "sort.stable")
def _sort(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    norm_dim(node.attrs["dim"], len(x.shape))
    return [x.type, TensorType(x.shape, "int64")]


@infers("layer_norm.default")
def _layer_norm(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    _need_float(x)
    _normalized_shape(node, x)
    return _same(x)


def _normalized_shape(node: Node, x: Value) -> None:
    """A layer norm's normalized_shape: the input's trailing dims, and the shape of its weight and bias."""
    ns = tuple(node.attrs["normalized_shape"])
    if not ns or len(ns) > len(x.shape) or x.shape[len(x.shape) - len(ns):] != ns:
        raise InferError(f"normalized_shape {list(ns)} is not the trailing shape of the input {list(x.shape)}")
    for v in node.inputs[1:]:
        if v.shape != ns:
            raise InferError(f"'{v.name}' has shape {list(v.shape)}, normalized_shape is {list(ns)}")


def _reduced(x: Value, dims: Any, keepdim: bool) -> tuple[int, ...]:
    r = len(x.shape)
    if dims is None or dims == []:
        axes = set(range(r))
    else:
        listed = dims if isinstance(dims, list) else [dims]
        axes = {norm_dim(d, r) for d in listed}
        if len(axes) != len(listed):
            raise InferError(f"dim {dims} names a dim twice")
    if keepdim:
        return tuple(1 if i in axes else n for i, n in enumerate(x.shape))
    return tuple(n for i, n in enumerate(x.shape) if i not in axes)


@infers("mean.default", "mean.dim")
def _mean(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    dt = node.attrs.get("dtype") or x.dtype
    if dt not in FLOAT_DTYPES:
        raise InferError(f"mean of a {dt} tensor: give a floating dtype")
    if node.op == "mean.default":
        return [TensorType((), dt)]
    return [TensorType(_reduced(x, node.attrs["dim"], node.attrs["keepdim"]), dt)]


@infers("sum.default", "sum.dim_IntList", "prod.default", "prod.dim_int")
def _sum(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    dt = node.attrs.get("dtype") or ("int64" if x.dtype in INT_DTYPES | {"bool"} else x.dtype)
    if node.op in ("sum.default", "prod.default"):
        return [TensorType((), dt)]
    return [TensorType(_reduced(x, node.attrs["dim"], node.attrs["keepdim"]), dt)]


@infers("amax.default", "amin.default")
def _amax(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if any(d == 0 for i, d in enumerate(x.shape) if not node.attrs["dim"] or i in
           {norm_dim(a, len(x.shape)) for a in node.attrs["dim"]}):
        raise InferError(f"{node.op.partition('.')[0]} over an empty dim of shape {list(x.shape)} has no identity")
    return [TensorType(_reduced(x, node.attrs["dim"], node.attrs["keepdim"]), x.dtype)]


@infers("softmax.int", "log_softmax.int")
def _softmax(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    norm_dim(node.attrs["dim"], len(x.shape))
    dt = node.attrs.get("dtype") or x.dtype
    if dt not in FLOAT_DTYPES:
        raise InferError(f"softmax of a {dt} tensor: give a floating dtype")
    return _same(x, dt)


@infers("_softmax.default", "_log_softmax.default")
def _softmax_internal(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    norm_dim(node.attrs["dim"], len(x.shape))
    _need_float(x)
    if node.attrs["half_to_float"]:
        if x.dtype not in ("float16", "bfloat16"):
            raise InferError("half_to_float needs a half-precision input")
        return _same(x, "float32")
    return _same(x)


@infers("cumsum.default")
def _cumsum(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    norm_dim(node.attrs["dim"], len(x.shape))
    dt = node.attrs.get("dtype") or ("int64" if x.dtype in INT_DTYPES | {"bool"} else x.dtype)
    if dt == "bool" and x.shape:  # (a 0-d input is copied, no kernel runs)
        raise InferError("cumsum into a bool tensor is not supported")
    return _same(x, dt)


@infers("topk.default")
def _topk(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if x.dtype == "bool":
        raise InferError("topk of a bool tensor is not supported")
    d = norm_dim(node.attrs["dim"], len(x.shape))
    k, n = node.attrs["k"], (x.shape[d] if x.shape else 1)
    if not 0 <= k <= n:
        raise InferError(f"k={k} is out of range for dim {d} of size {n}")
    shape = tuple(k if i == d else s for i, s in enumerate(x.shape))
    return [TensorType(shape, x.dtype), TensorType(shape, "int64")]


@infers("any.default", "any.dim", "any.dims", "all.default", "all.dim", "all.dims")
def _any(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    dt = "uint8" if x.dtype == "uint8" else "bool"
    if node.op in ("any.default", "all.default"):
        return [TensorType((), dt)]
    dim = node.attrs["dim"]
    if node.op in ("any.dims", "all.dims") and dim == []:  # an empty list reduces nothing here (unlike sum's)
        return _same(x, dt)
    return [TensorType(_reduced(x, dim, node.attrs["keepdim"]), dt)]


@infers("var.correction", "var.dim", "std.correction", "std.dim")
def _var(node: Node) -> list[TensorType]:
    """var and std; var_mean and std_mean give two of these."""
    x = tensor(node, 0)
    if x.dtype not in FLOAT_DTYPES:
        raise InferError(f"{node.op.partition('.')[0]} of a {x.dtype} tensor is not supported (it takes "
                         "floating-point tensors)")
    return [TensorType(_reduced(x, node.attrs["dim"], node.attrs["keepdim"]), x.dtype)]


@infers("argmax.default", "argmin.default")
def _argmax(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if x.dtype == "bool":
        raise InferError(f"{node.op.partition('.')[0]} of a bool tensor is not supported")
    dim, keep = node.attrs["dim"], node.attrs["keepdim"]
    if dim is None:
        if x.type.numel == 0:
            raise InferError(f"{node.op.partition('.')[0]} of an empty tensor without a dim")
        return [TensorType((1,) * len(x.shape) if keep else (), "int64")]
    d = norm_dim(dim, len(x.shape))
    if x.shape and x.shape[d] == 0:
        raise InferError(f"{node.op.partition('.')[0]} over the empty dim {d} of {list(x.shape)}")
    return [TensorType(_reduced(x, dim, keep), "int64")]


@infers("max.dim", "min.dim")
def _max_dim(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    d = norm_dim(node.attrs["dim"], len(x.shape))
    if x.shape and x.shape[d] == 0:
        raise InferError(f"{node.op.partition('.')[0]} over the empty dim {d} of {list(x.shape)}")
    shape = _reduced(x, node.attrs["dim"], node.attrs["keepdim"])
    return [TensorType(shape, x.dtype), TensorType(shape, "int64")]


@infers("group_norm.default")
def _group_norm(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    _need_float(x)
    if len(x.shape) < 2:
        raise InferError(f"input of shape {list(x.shape)}: group norm needs a batch and a channel dim")
    g, c = node.attrs["num_groups"], x.shape[1]
    if g < 1 or c % g:
        raise InferError(f"num_groups={g} does not divide the {c} channels")
    if len(node.inputs) > 3:
        raise InferError(f"takes (input[, weight][, bias]), got {len(node.inputs)} inputs")
    for v in node.inputs[1:]:
        if v.shape != (c,):
            raise InferError(f"'{v.name}' has shape {list(v.shape)}; per-channel parameters of {c} channels have "
                             f"shape [{c}]")
    return _same(x)



_NARROWER = {"float32": ("float16", "bfloat16"), "float64": ("float32", "float16", "bfloat16")}


@infers("linalg_vector_norm.default")
def _vector_norm(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    _need_float(x)
    dt = node.attrs.get("dtype") or x.dtype
    if dt not in FLOAT_DTYPES or dt in _NARROWER.get(x.dtype, ()) or (x.dtype == "bfloat16" and dt == "float16") \
            or (x.dtype == "float16" and dt == "bfloat16"):
        raise InferError(f"a {x.dtype} input's norm cannot be computed in {dt} (a narrower or non-float dtype)")
    ord_ = node.attrs["ord"]
    if isinstance(ord_, bool) or ord_ != ord_:
        raise InferError(f"ord must be a number, got {ord_!r}")
    dims = node.attrs["dim"]
    shape = _reduced(x, dims, node.attrs["keepdim"])
    if ord_ < 0 or ord_ == float("inf"):
        reduced = range(len(x.shape)) if not dims else {norm_dim(d, len(x.shape)) for d in
                                                        (dims if isinstance(dims, list) else [dims])}
        if any(x.shape[i] == 0 for i in reduced if x.shape) or (not dims and x.type.numel == 0):
            raise InferError(f"the norm of order {ord_} over an empty dim has no value")
    return [TensorType(shape, dt)]


@infers("norm_except_dim.default")
def _norm_except_dim(node: Node) -> list[TensorType]:
    v = tensor(node, 0, "v")
    _need_float(v)
    dim = node.attrs["dim"]
    if dim == -1:
        return [TensorType((), v.dtype)]
    d = norm_dim(dim, len(v.shape))
    return [TensorType(tuple(n if i == d else 1 for i, n in enumerate(v.shape)), v.dtype)]


def _weight_norm_operands(node: Node) -> tuple[Value, Value]:
    v, g = tensor(node, 0, "v"), tensor(node, 1, "g")
    _need_float(v)
    _need_float(g, "g")
    return v, g


@infers("_weight_norm.default")
def _weight_norm(node: Node) -> list[TensorType]:
    v, g = _weight_norm_operands(node)
    dim = node.attrs["dim"]
    if dim in (0, len(v.shape) - 1):  # ATen's fused kernel (on the CPU for fp16 too)
        if v.dtype != g.dtype:
            raise InferError(f"v is {v.dtype} and g {g.dtype}: the fused kernel takes one dtype")
        return _same(v)
    # v * (g / norm_except_dim(v, 2, dim)), op by op with ATen's type promotion
    norm = () if dim == -1 else tuple(n if i == norm_dim(dim, len(v.shape)) else 1 for i, n in enumerate(v.shape))
    ratio = Value("g/norm", TensorType(broadcast(g.shape, norm), result_type(g, Value("norm", TensorType(norm, v.dtype),
                                                                                      "node"))), "node")
    return [TensorType(broadcast(v.shape, ratio.shape), result_type(v, ratio))]


@infers("_weight_norm_interface.default")
def _weight_norm_interface(node: Node) -> list[TensorType]:
    v, g = _weight_norm_operands(node)
    if v.dtype != g.dtype:
        raise InferError(f"v is {v.dtype} and g {g.dtype}: they must match")
    d = node.attrs["dim"]
    if d not in (0, len(v.shape) - 1):
        raise InferError(f"dim {d} must be the first or the last dim of v {list(v.shape)}")
    keep = tuple(n if i == d else 1 for i, n in enumerate(v.shape))
    if g.type.numel != v.shape[d]:
        raise InferError(f"g has {g.type.numel} elements; dim {d} of v {list(v.shape)} needs {v.shape[d]}")
    # The norm stays in the accumulation dtype: fp32 for bf16 (and for fp16 in ATen's CPU kernel, while the meta
    # function torch.export traces with keeps fp16's own: either is taken as the IR declares it)
    norm = "float32" if v.dtype == "bfloat16" else v.dtype
    declared = node.outputs[1].dtype if len(node.outputs) > 1 else norm
    if v.dtype == "float16" and declared in ("float16", "float32"):
        norm = declared
    return [v.type, TensorType(keep, norm)]


@infers("var_mean.correction", "var_mean.dim", "std_mean.correction", "std_mean.dim")
def _var_mean(node: Node) -> list[TensorType]:
    return _var(node) * 2


@infers("max.default", "min.default")
def _max_all(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if x.type.numel == 0:
        raise InferError(f"{node.op.partition('.')[0]}() of an empty tensor: give a dim")
    return [TensorType((), x.dtype)]


@infers("aminmax.default")
def _aminmax(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    dim, keep = node.attrs["dim"], node.attrs["keepdim"]
    if dim is None:
        if x.type.numel == 0:
            raise InferError("aminmax of an empty tensor without a dim")
        shape: tuple[int, ...] = (1,) * len(x.shape) if keep else ()
    else:
        d = norm_dim(dim, len(x.shape))
        if x.shape and x.shape[d] == 0:
            raise InferError(f"aminmax over the empty dim {d} of {list(x.shape)}")
        shape = _reduced(x, dim, keep)
    return [TensorType(shape, x.dtype), TensorType(shape, x.dtype)]


@infers("logsumexp.default")
def _logsumexp(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if not node.attrs["dim"] and not node.attrs["keepdim"] and x.type.numel and x.shape:
        # ATen reduces every dim for dim=[], then fails to drop them (its result has the input's rank)
        raise InferError("logsumexp over dim=[] without keepdim is refused by ATen: list the dims")
    return [TensorType(_reduced(x, node.attrs["dim"], node.attrs["keepdim"]), _float_of(x.dtype))]


@infers("count_nonzero.default", "count_nonzero.dim_IntList")
def _count_nonzero(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    dim = node.attrs["dim"]
    return [TensorType(_reduced(x, [] if dim is None else dim, False), "int64")]


@infers("argsort.default", "argsort.stable")
def _argsort(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    norm_dim(node.attrs["dim"], len(x.shape))
    return [TensorType(x.shape, "int64")]


@infers("glu.default")
def _glu(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    _need_float(x)
    if not x.shape:
        raise InferError("glu does not take a 0-d tensor")
    d = norm_dim(node.attrs["dim"], len(x.shape))
    if x.shape[d] % 2:
        raise InferError(f"glu halves dim {d}, of odd size {x.shape[d]}")
    return [TensorType(x.shape[:d] + (x.shape[d] // 2,) + x.shape[d + 1:], x.dtype)]


@infers("rms_norm.default")
def _rms_norm(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    _need_float(x)
    _normalized_shape(node, x)
    for v in node.inputs[1:]:
        if v.dtype != x.dtype:
            raise InferError(f"weight is {v.dtype} and the input {x.dtype}")
    return _same(x)


@infers("instance_norm.default")
def _instance_norm(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    _need_float(x)
    if len(x.shape) < 2:
        raise InferError(f"input of shape {list(x.shape)}: instance norm needs a batch and a channel dim")
    if len(node.inputs) not in (1, 3, 5):
        raise InferError(f"takes the input with its weight and bias and/or its running statistics, got "
                         f"{len(node.inputs)} inputs")
    for v in node.inputs[1:]:
        if v.shape != (x.shape[1],):
            raise InferError(f"'{v.name}' has shape {list(v.shape)}, expected [{x.shape[1]}] (one per channel)")
    if not node.attrs["use_input_stats"] and len(node.inputs) == 1:
        raise InferError("use_input_stats=False needs the running mean and variance")
    return _same(x)
