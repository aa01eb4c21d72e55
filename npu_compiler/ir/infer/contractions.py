"""Rules of contractions and windowed ops: matmul, linear, convolution, pooling, attention, resampling."""

from __future__ import annotations

import math

from ...dtypes import FLOAT_DTYPES
from ..graph import Node, TensorType, Value
from .core import (
    InferError,
    _need_float,
    _same_dtypes,
    _same_shape,
    _scalar_fits,
    broadcast,
    infers,
    norm_dim,
    result_type,
    tensor,
    tensor_list,
)


def _matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if not a or not b:
        raise InferError(f"matmul needs tensors of rank >= 1, got {list(a)} and {list(b)}")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise InferError(f"cannot multiply {list(a)} by {list(b)} (inner dims {a2[-1]} and {b2[-2]})")
    out = broadcast(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


@infers("matmul.default")
def _matmul(node: Node) -> list[TensorType]:
    a, b = tensor(node, 0), tensor(node, 1)
    _same_dtypes([a, b], "both operands")
    return [TensorType(_matmul_shape(a.shape, b.shape), a.dtype)]


@infers("mm.default")
def _mm(node: Node) -> list[TensorType]:
    a, b = tensor(node, 0), tensor(node, 1)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise InferError(f"mm takes two matrices, got {list(a.shape)} and {list(b.shape)}")
    _same_dtypes([a, b], "both operands")
    return [TensorType(_matmul_shape(a.shape, b.shape), a.dtype)]


@infers("bmm.default")
def _bmm(node: Node) -> list[TensorType]:
    a, b = tensor(node, 0), tensor(node, 1)
    if len(a.shape) != 3 or len(b.shape) != 3 or a.shape[0] != b.shape[0]:
        raise InferError(f"bmm takes two batches of matrices of one batch size, got {list(a.shape)} and "
                         f"{list(b.shape)}")
    _same_dtypes([a, b], "both operands")
    return [TensorType(_matmul_shape(a.shape, b.shape), a.dtype)]


@infers("addmm.default")
def _addmm(node: Node) -> list[TensorType]:
    bias, a, b = tensor(node, 0), tensor(node, 1), tensor(node, 2)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise InferError(f"addmm multiplies two matrices, got {list(a.shape)} and {list(b.shape)}")
    _same_dtypes([bias, a, b], "all operands")
    out = _matmul_shape(a.shape, b.shape)
    if broadcast(bias.shape, out) != out:
        raise InferError(f"the added tensor {list(bias.shape)} does not broadcast to the product {list(out)}")
    _scalar_fits(node, ("alpha", "beta"), "float32" if a.dtype in ("float16", "bfloat16") else a.dtype)  # opmath
    return [TensorType(out, a.dtype)]


@infers("linear.default")
def _linear(node: Node) -> list[TensorType]:
    x, w = tensor(node, 0, "input"), tensor(node, 1, "weight")
    if len(w.shape) not in (1, 2) or not x.shape:
        raise InferError(f"linear takes an input of rank >= 1 and a weight of rank 1 or 2, got {list(x.shape)} "
                         f"and {list(w.shape)}")
    if x.shape[-1] != w.shape[-1]:
        raise InferError(f"input features {x.shape[-1]} do not match the weight {list(w.shape)}")
    out = x.shape[:-1] + w.shape[:-1]
    _same_dtypes(node.inputs, "input, weight and bias")
    if len(node.inputs) > 3:
        raise InferError(f"takes (input, weight[, bias]), got {len(node.inputs)} inputs")
    if len(node.inputs) == 3 and broadcast(node.inputs[2].shape, out) != out:
        raise InferError(f"bias {list(node.inputs[2].shape)} does not broadcast to the output {list(out)}")
    return [TensorType(out, x.dtype)]


def _window_out(size: int, kernel: int, stride: int, pad: int, dilation: int, ceil: bool) -> int:
    """ATen's pooling_output_shape (and, with ceil=False, the convolution's)."""
    span = dilation * (kernel - 1) + 1
    num = size + 2 * pad - span + ((stride - 1) if ceil else 0)
    out = num // stride + 1
    if ceil and (out - 1) * stride >= size + pad:
        out -= 1
    return out


@infers("conv2d.default", "conv2d.padding", "conv1d.default", "conv1d.padding")
def _conv(node: Node) -> list[TensorType]:
    """ATen's convolution shape check and output size, for 1-d and 2-d convs with numeric or string padding (an
    unbatched input [C, *spatial] gives an unbatched output)."""
    nd = 1 if node.op.startswith("conv1d") else 2
    x, w = tensor(node, 0, "input"), tensor(node, 1, "weight")
    a = node.attrs
    if len(x.shape) not in (nd + 1, nd + 2) or len(w.shape) != nd + 2:
        raise InferError(f"conv{nd}d takes an input of rank {nd + 1} or {nd + 2} and a weight of rank {nd + 2}, got "
                         f"{list(x.shape)} and {list(w.shape)}")
    _same_dtypes(node.inputs, "input, weight and bias")
    g = a["groups"]
    c = x.shape[-nd - 1]
    o, cg, ks = w.shape[0], w.shape[1], w.shape[2:]
    if g < 1 or o % g or cg * g != c:
        raise InferError(f"weight {list(w.shape)} with groups={g} does not fit an input of {c} channels")
    if len(node.inputs) > 3:
        raise InferError(f"takes (input, weight[, bias]), got {len(node.inputs)} inputs")
    if len(node.inputs) == 3 and node.inputs[2].shape != (o,):
        raise InferError(f"bias has shape {list(node.inputs[2].shape)}, expected [{o}]")
    stride, dilation = _per_dim(a, "stride", nd), _per_dim(a, "dilation", nd)
    pad = a["padding"] if isinstance(a["padding"], str) else _per_dim(a, "padding", nd)
    if isinstance(pad, str):
        if pad not in ("same", "valid"):
            raise InferError(f"padding {pad!r} is neither 'same' nor 'valid'")
        if pad == "same" and any(s != 1 for s in stride):
            raise InferError(f"padding 'same' needs stride 1, got {stride}")
    spatial = []
    for i, k in enumerate(ks):
        size = x.shape[-nd + i]
        if pad == "same":
            n = size
        else:
            n = _window_out(size, k, stride[i], 0 if pad == "valid" else pad[i], dilation[i], False)
        if n <= 0 or (pad == "same" and size < 1):
            raise InferError(f"input {list(x.shape)} is smaller than the kernel {list(ks)} (dilated, padded)")
        spatial.append(n)
    return [TensorType(x.shape[:-nd - 1] + (o, *spatial), x.dtype)]


def _per_dim(attrs: dict, name: str, nd: int, empty_ok: bool = False) -> list[int]:
    """An `int[nd]` attribute as nd values: ATen repeats a single value (`int[1]` lists are not length-checked by the
    reader, which reads `int[1]` as "one or more")."""
    v = list(attrs[name])
    if empty_ok and not v:
        return v
    if len(v) == 1:
        v = v * nd
    if len(v) != nd:
        raise InferError(f"{name} {attrs[name]} must have {nd} entries")
    return v


def _pool_params(node: Node, nd: int = 2) -> tuple[Value, list[int], list[int], list[int], list[int]]:
    x = tensor(node, 0)
    a = node.attrs
    if len(x.shape) not in (nd + 1, nd + 2):
        raise InferError(f"{nd}-d pooling takes an input of rank {nd + 1} or {nd + 2}, got {list(x.shape)}")
    ks = list(a["kernel_size"])
    stride = list(a["stride"]) or ks
    pad = list(a["padding"])
    dil = list(a.get("dilation", [1] * nd))
    for k, p in zip(ks, pad):
        if p > k // 2:
            raise InferError(f"padding {pad} is more than half the kernel {ks}")
    return x, ks, stride, pad, dil


def _pool_shape(node: Node, x: Value, ks, stride, pad, dil, nd: int = 2) -> tuple[int, ...]:
    out = []
    for i in range(nd):
        n = _window_out(x.shape[i - nd], ks[i], stride[i], pad[i], dil[i], bool(node.attrs["ceil_mode"]))
        if n <= 0:
            raise InferError(f"input {list(x.shape)} is smaller than the pooling window {ks}")
        out.append(n)
    return x.shape[:-nd] + tuple(out)


@infers("max_pool2d_with_indices.default", "max_pool3d_with_indices.default")
def _max_pool_with_indices(node: Node) -> list[TensorType]:
    nd = 3 if node.op.startswith("max_pool3d") else 2
    x, ks, stride, pad, dil = _pool_params(node, nd)
    if x.dtype == "bool":
        raise InferError(f"{node.op.partition('.')[0]} of a bool tensor is not supported")
    shape = _pool_shape(node, x, ks, stride, pad, dil, nd)
    return [TensorType(shape, x.dtype), TensorType(shape, "int64")]


@infers("avg_pool3d.default")
def _avg_pool3d(node: Node) -> list[TensorType]:
    x, ks, stride, pad, _ = _pool_params(node, 3)
    _need_float(x)
    if any(n < k for n, k in zip(x.shape[-3:], ks)):
        raise InferError(f"input volume {list(x.shape[-3:])} is smaller than the kernel {ks}")
    return [TensorType(_pool_shape(node, x, ks, stride, pad, [1, 1, 1], 3), x.dtype)]




@infers("max_pool2d.default")
def _max_pool2d(node: Node) -> list[TensorType]:
    x, ks, stride, pad, dil = _pool_params(node)
    if x.dtype == "bool":
        raise InferError("max_pool2d of a bool tensor is not supported")
    return [TensorType(_pool_shape(node, x, ks, stride, pad, dil), x.dtype)]


@infers("avg_pool2d.default")
def _avg_pool2d(node: Node) -> list[TensorType]:
    x, ks, stride, pad, _ = _pool_params(node)
    _need_float(x)
    return [TensorType(_pool_shape(node, x, ks, stride, pad, [1, 1]), x.dtype)]


@infers("adaptive_avg_pool2d.default", "_adaptive_avg_pool2d.default", "adaptive_avg_pool3d.default",
        "_adaptive_avg_pool3d.default")
def _adaptive_avg_pool(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    nd = 3 if "pool3d" in node.op else 2
    if len(x.shape) not in (nd + 1, nd + 2) or any(d == 0 for d in x.shape[-nd:]):
        raise InferError(f"{nd}-d adaptive pooling takes an input of rank {nd + 1} or {nd + 2} with a non-empty "
                         f"{'volume' if nd == 3 else 'image'}, got {list(x.shape)}")
    _need_float(x)
    return [TensorType(x.shape[:-nd] + tuple(node.attrs["output_size"]), x.dtype)]


@infers("scaled_dot_product_attention.default")
def _sdpa(node: Node) -> list[TensorType]:
    if len(node.inputs) not in (3, 4):
        raise InferError(f"takes (query, key, value[, attn_mask]), got {len(node.inputs)} inputs")
    q, k, v = node.inputs[:3]
    for t in (q, k, v):
        if len(t.shape) < 2:
            raise InferError(f"'{t.name}' has shape {list(t.shape)}; attention needs [..., length, dim]")
    _need_float(q, "the query")
    _same_dtypes([q, k, v], "query, key and value")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise InferError(f"query {list(q.shape)}, key {list(k.shape)} and value {list(v.shape)} do not fit")
    if not (len(q.shape) == len(k.shape) == len(v.shape)):
        raise InferError("query, key and value must have one rank")
    kb = k.shape[:-2]
    if node.attrs.get("enable_gqa") and len(q.shape) >= 3 and k.shape[-3] and q.shape[-3] % k.shape[-3] == 0:
        kb = kb[:-1] + (q.shape[-3],)
    if broadcast(q.shape[:-2], kb) != q.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise InferError(f"the batch and head dims of query {list(q.shape)} and key {list(k.shape)} do not match")
    if len(node.inputs) == 4:
        m = node.inputs[3]
        target = q.shape[:-1] + (k.shape[-2],)
        if broadcast(m.shape, target) != target:
            raise InferError(f"attn_mask {list(m.shape)} does not broadcast to {list(target)}")
        if m.dtype != "bool" and m.dtype != q.dtype:
            raise InferError(f"attn_mask is {m.dtype}; it must be bool or the query's dtype {q.dtype}")
    if node.attrs.get("is_causal") and len(node.inputs) == 4:
        raise InferError("is_causal and an explicit attn_mask cannot be given together")
    return [TensorType(q.shape[:-1] + (v.shape[-1],), q.dtype)]


@infers("baddbmm.default")
def _baddbmm(node: Node) -> list[TensorType]:
    x, a, b = tensor(node, 0, "self"), tensor(node, 1, "batch1"), tensor(node, 2, "batch2")
    if len(a.shape) != 3 or len(b.shape) != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise InferError(f"baddbmm multiplies batches [B, M, K] and [B, K, N], got {list(a.shape)} and "
                         f"{list(b.shape)}")
    _same_dtypes([x, a, b], "all operands")
    out = (a.shape[0], a.shape[1], b.shape[2])
    if broadcast(x.shape, out) != out:
        raise InferError(f"the added tensor {list(x.shape)} does not broadcast to the product {list(out)}")
    return [TensorType(out, a.dtype)]


@infers("upsample_bilinear2d.vec", "upsample_nearest2d.vec", "upsample_bilinear2d.default",
        "upsample_nearest2d.default")
def _upsample(node: Node) -> list[TensorType]:
    return _resampled(node, 2, uint8=True)


def _resampled(node: Node, nd: int, uint8: bool) -> list[TensorType]:
    """An nd-d resampling's output: [N, C, *output_size], the size given or the input's times the scale factors
    (floored); a `.vec` overload takes exactly one of them."""
    x = tensor(node, 0)
    if len(x.shape) != nd + 2:
        raise InferError(f"{nd}-d upsampling takes an input of rank {nd + 2}, got {list(x.shape)}")
    if x.dtype not in FLOAT_DTYPES and not (uint8 and x.dtype == "uint8"):
        raise InferError(f"upsampling of a {x.dtype} tensor is not supported (it takes floats"
                         f"{' and uint8' if uint8 else ''})")
    size, scales = node.attrs["output_size"], node.attrs.get("scale_factors")
    if node.op.endswith(".vec"):
        if (size is None) == (scales is None):
            raise InferError("give exactly one of output_size and scale_factors")
        if size is None:
            if len(scales) != nd:
                raise InferError(f"scale_factors {scales} must have {nd} entries")
            size = [math.floor(n * s) if math.isfinite(n * s) else -1 for n, s in zip(x.shape[2:], scales)]
    if len(size) != nd:
        raise InferError(f"output_size {size} must have {nd} entries")
    if any(n <= 0 for n in list(size) + list(x.shape[1:])):
        raise InferError(f"input {list(x.shape)} and output size {list(size)} must be greater than 0")
    return _same_shape(x, x.shape[:2] + tuple(size))


@infers("adaptive_avg_pool1d.default")
def _adaptive_avg_pool1d(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    if len(x.shape) not in (2, 3) or any(d == 0 for d in x.shape[1:]):
        raise InferError(f"1-d adaptive pooling takes an input of rank 2 or 3 with non-empty dims, got "
                         f"{list(x.shape)}")
    _need_float(x)
    if len(node.attrs["output_size"]) != 1:
        raise InferError(f"output_size {node.attrs['output_size']} must have one entry")
    return _same_shape(x, x.shape[:-1] + tuple(node.attrs["output_size"]))


@infers("avg_pool1d.default")
def _avg_pool1d(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    a = node.attrs
    if len(x.shape) not in (2, 3):
        raise InferError(f"1-d pooling takes an input of rank 2 or 3, got {list(x.shape)}")
    _need_float(x)
    k, pad = _per_dim(a, "kernel_size", 1)[0], _per_dim(a, "padding", 1)[0]
    stride = (_per_dim(a, "stride", 1, empty_ok=True) or [k])[0]
    if pad > k // 2:
        raise InferError(f"padding {pad} is more than half the kernel {k}")
    n = _window_out(x.shape[-1], k, stride, pad, 1, bool(a["ceil_mode"]))
    if n <= 0:
        raise InferError(f"input {list(x.shape)} is smaller than the pooling window {k}")
    return _same_shape(x, x.shape[:-1] + (n,))


@infers("einsum.default")
def _einsum(node: Node) -> list[TensorType]:
    from ..einsum import EinsumError, contraction_pairs, parse_einsum

    xs = tensor_list(node, "einsum")
    _same_dtypes(xs, "the operands")
    if xs[0].dtype not in FLOAT_DTYPES:
        # ATen's result dtype for integers depends on its contraction path (a sum gives int64, a bmm keeps int32)
        raise InferError(f"einsum of {xs[0].dtype} tensors: the compiler takes floating-point operands")
    try:
        spec = parse_einsum(node.attrs["equation"], [v.shape for v in xs])
        contraction_pairs(node.attrs.get("path"), len(xs))
    except EinsumError as e:
        raise InferError(f"equation {node.attrs['equation']!r}: {e}") from None
    return [TensorType(spec.out_shape, xs[0].dtype)]


@infers("convolution.default", "conv3d.default", "conv_transpose1d.default", "conv_transpose2d.input",
        "conv_transpose3d.input")
def _convolution(node: Node) -> list[TensorType]:
    """ATen's `convolution` (a batched input, 1 to 3 spatial dims, transposed or not) and the conv ops above it,
    which take an unbatched input too."""
    x, w = tensor(node, 0, "input"), tensor(node, 1, "weight")
    a = node.attrs
    nd = len(w.shape) - 2
    unbatched = node.op != "convolution.default" and len(x.shape) == nd + 1
    if unbatched:
        x = Value(x.name, TensorType((1, *x.shape), x.dtype), "node")
    if not 1 <= nd <= 3 or len(x.shape) != nd + 2 or (node.op != "convolution.default" and nd != int(
            node.op[len("conv_transpose") if "transpose" in node.op else 4])):
        raise InferError(f"takes a batched input [N, C, *spatial] and a weight of the same rank, got "
                         f"{list(x.shape)} and {list(w.shape)}")
    _same_dtypes(node.inputs, "input, weight and bias")
    _need_float(x)
    g = a["groups"]
    stride, padding, dilation = (_per_dim(a, k, nd) for k in ("stride", "padding", "dilation"))
    out_pad = (_per_dim(a, "output_padding", nd, empty_ok=True) if "output_padding" in a else []) or [0] * nd
    if g < 1 or any(v <= 0 for v in stride + dilation) or any(v < 0 for v in padding + out_pad):
        raise InferError(f"groups {g}, stride {stride}, padding {padding}, dilation {dilation} out of range")
    c, ks = x.shape[1], w.shape[2:]
    if a.get("transposed", node.op.startswith("conv_transpose")):
        if w.shape[0] != c or c % g:
            raise InferError(f"a transposed weight {list(w.shape)} with groups={g} does not fit {c} input channels")
        o = w.shape[1] * g
        if any(op >= max(s, d) for op, s, d in zip(out_pad, stride, dilation)):
            raise InferError(f"output_padding {out_pad} must be smaller than the stride or the dilation")
        spatial = [(n - 1) * s - 2 * p + d * (k - 1) + op + 1
                   for n, s, p, d, k, op in zip(x.shape[2:], stride, padding, dilation, ks, out_pad)]
    else:
        o = w.shape[0]
        if o % g or w.shape[1] * g != c:
            raise InferError(f"weight {list(w.shape)} with groups={g} does not fit an input of {c} channels")
        spatial = [_window_out(n, k, s, p, d, False)
                   for n, k, s, p, d in zip(x.shape[2:], ks, stride, padding, dilation)]
    if len(node.inputs) > 3 or (len(node.inputs) == 3 and node.inputs[2].shape != (o,)):
        raise InferError(f"takes (input, weight[, bias of shape [{o}]])")
    if any(n <= 0 for n in spatial):
        raise InferError(f"input {list(x.shape)} is smaller than the kernel {list(ks)} (dilated, padded)")
    return [TensorType((o, *spatial) if unbatched else (x.shape[0], o, *spatial), x.dtype)]


@infers("col2im.default")
def _col2im(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    a = node.attrs
    (h, w), (kh, kw) = a["output_size"], a["kernel_size"]
    (dh, dw), (ph, pw), (sh, sw) = a["dilation"], a["padding"], a["stride"]
    if len(x.shape) not in (2, 3) or x.type.numel == 0:
        raise InferError(f"takes a non-empty [N, C * kh * kw, L] (or unbatched) input, got {list(x.shape)}")
    _need_float(x)
    if min(kh, kw, dh, dw, sh, sw) <= 0 or min(ph, pw) < 0:
        raise InferError("kernel_size, dilation and stride must be positive and padding >= 0")
    lh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    lw = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    rows, length = x.shape[-2:]
    if rows % (kh * kw) or lh <= 0 or lw <= 0 or length != lh * lw:
        raise InferError(f"an input of shape {list(x.shape)} is not the columns of a {h}x{w} image with kernel "
                         f"{kh}x{kw} ({lh}x{lw} blocks)")
    return [TensorType(x.shape[:-2] + (rows // (kh * kw), h, w), x.dtype)]


@infers("_cdist_forward.default", "cdist.default")
def _cdist(node: Node) -> list[TensorType]:
    x1, x2 = tensor(node, 0, "x1"), tensor(node, 1, "x2")
    _need_float(x1, "x1")
    _same_dtypes([x1, x2], "x1 and x2")
    if len(x1.shape) < 2 or len(x2.shape) < 2 or x1.shape[-1] != x2.shape[-1]:
        raise InferError(f"x1 {list(x1.shape)} and x2 {list(x2.shape)} must be [..., P, M] and [..., R, M]")
    p = node.attrs["p"]
    if p < 0 or p != p:
        raise InferError(f"p must be a number >= 0, got {p!r}")
    return [TensorType(broadcast(x1.shape[:-2], x2.shape[:-2]) + (x1.shape[-2], x2.shape[-2]), x1.dtype)]


@infers("_pdist_forward.default", "pdist.default")
def _pdist(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    _need_float(x)
    if len(x.shape) != 2:
        raise InferError(f"pdist takes a matrix [N, M], got {list(x.shape)}")
    p = node.attrs["p"]
    if p < 0 or p != p:
        raise InferError(f"p must be a number >= 0, got {p!r}")
    n = x.shape[0]
    return [TensorType((n * (n - 1) // 2,), x.dtype)]


@infers("grid_sampler_2d.default", "grid_sampler.default")
def _grid_sampler(node: Node) -> list[TensorType]:
    x, grid = tensor(node, 0, "input"), tensor(node, 1, "grid")
    a = node.attrs
    _need_float(x)
    _same_dtypes([x, grid], "input and grid")
    if len(x.shape) != 4 or len(grid.shape) != 4 or grid.shape[-1] != 2 or grid.shape[0] != x.shape[0]:
        raise InferError(f"2-d grid sampling takes an input [N, C, H, W] and a grid [N, H_out, W_out, 2], got "
                         f"{list(x.shape)} and {list(grid.shape)}")
    if a["interpolation_mode"] not in (0, 1, 2) or a["padding_mode"] not in (0, 1, 2):
        raise InferError(f"interpolation_mode {a['interpolation_mode']} or padding_mode {a['padding_mode']} out of "
                         "range (0-2)")
    if any(n == 0 for n in x.shape[2:]):
        raise InferError(f"input {list(x.shape)} has an empty image")
    return [TensorType((x.shape[0], x.shape[1], grid.shape[1], grid.shape[2]), x.dtype)]


@infers("max_pool1d.default")
def _max_pool1d(node: Node) -> list[TensorType]:
    x, ks, stride, pad, dil = _pool_params(node, 1)
    _need_float(x)
    if x.shape[-2] == 0 and len(x.shape) == 3 or x.shape[-1] == 0:
        raise InferError(f"max_pool1d of an empty input {list(x.shape)}")
    ks, stride, pad, dil = (_per_dim({"v": v}, "v", 1) for v in (ks, stride, pad, dil))
    if min(ks[0], stride[0], dil[0]) <= 0 or pad[0] < 0:
        raise InferError("kernel_size, stride and dilation must be positive and padding >= 0")
    return [TensorType(_pool_shape(node, x, ks, stride, pad, dil, 1), x.dtype)]


@infers("adaptive_max_pool1d.default", "adaptive_max_pool2d.default")
def _adaptive_max_pool(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    nd = 1 if "pool1d" in node.op else 2
    size = _per_dim(node.attrs, "output_size", nd)
    if len(x.shape) not in (nd + 1, nd + 2) or any(d == 0 for d in x.shape[1:]):
        raise InferError(f"{nd}-d adaptive pooling takes an input of rank {nd + 1} or {nd + 2} with non-empty dims "
                         f"after the first, got {list(x.shape)}")
    if x.dtype == "bool" or (nd == 1 and x.dtype not in FLOAT_DTYPES):
        raise InferError(f"{node.op.partition('.')[0]} of a {x.dtype} tensor is not supported")
    if any(n < 0 for n in size):
        raise InferError(f"output_size {size} must not be negative")
    shape = x.shape[:-nd] + tuple(size)
    return [TensorType(shape, x.dtype), TensorType(shape, "int64")]


# spatial dims of the resampling ops besides 2-d bilinear and nearest (decomposed: decompose/pooling.py)
_RESAMPLE_DIMS = {"upsample_nearest1d.vec": 1, "upsample_nearest3d.vec": 3, "_upsample_nearest_exact1d.vec": 1,
                  "_upsample_nearest_exact2d.vec": 2, "_upsample_nearest_exact3d.vec": 3, "upsample_linear1d.vec": 1}


@infers(*_RESAMPLE_DIMS)
def _upsample_nd(node: Node) -> list[TensorType]:
    return _resampled(node, _RESAMPLE_DIMS[node.op], uint8="linear" not in node.op)


@infers("im2col.default")
def _im2col(node: Node) -> list[TensorType]:
    x = tensor(node, 0)
    a = node.attrs
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = (_per_dim(a, k, 2) for k in ("kernel_size", "dilation", "padding",
                                                                           "stride"))
    if len(x.shape) not in (3, 4) or any(d == 0 for d in x.shape[-3:]):
        raise InferError(f"takes a non-empty [N, C, H, W] (or unbatched) input, got {list(x.shape)}")
    _need_float(x)
    if min(kh, kw, dh, dw, sh, sw) <= 0 or min(ph, pw) < 0:
        raise InferError("kernel_size, dilation and stride must be positive and padding >= 0")
    c, h, w = x.shape[-3:]
    lh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    lw = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if lh <= 0 or lw <= 0:
        raise InferError(f"input {list(x.shape)} is smaller than the kernel {kh}x{kw} (dilated, padded)")
    return [TensorType(x.shape[:-3] + (c * kh * kw, lh * lw), x.dtype)]


@infers("outer.default")
def _outer(node: Node) -> list[TensorType]:
    a, b = tensor(node, 0, "self"), tensor(node, 1, "vec2")
    if len(a.shape) != 1 or len(b.shape) != 1:
        raise InferError(f"outer takes two vectors, got {list(a.shape)} and {list(b.shape)}")
    return [TensorType((a.shape[0], b.shape[0]), result_type(a, b))]


def _float_pair(node: Node) -> tuple[tuple[int, ...], str]:
    x1, x2 = tensor(node, 0, "x1"), tensor(node, 1, "x2")
    dt = result_type(x1, x2)
    if dt not in FLOAT_DTYPES:
        raise InferError(f"x1 and x2 are {x1.dtype} and {x2.dtype}; the op takes floating-point tensors")
    return broadcast(x1.shape, x2.shape), dt


@infers("cosine_similarity.default")
def _cosine_similarity(node: Node) -> list[TensorType]:
    shape, dt = _float_pair(node)
    d = norm_dim(node.attrs["dim"], len(shape))
    return [TensorType(shape[:d] + shape[d + 1:], dt)]


@infers("pairwise_distance.default")
def _pairwise_distance(node: Node) -> list[TensorType]:
    shape, dt = _float_pair(node)
    if not shape:
        return [TensorType((), dt)]
    return [TensorType(shape[:-1] + ((1,) if node.attrs["keepdim"] else ()), dt)]
