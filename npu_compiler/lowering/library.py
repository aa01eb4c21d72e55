"""Lowering of the ops that become library kernels (GEMM, conv, pooling, softmax, attention, embedding, cache
write) and of cat and the tensor factories (generated kernels with a store map or no operands)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..errors import UnsupportedOpError
from ..expr import nodes as X
from ..expr.aten_table import cast, const
from ..ir.graph import Node
from ..program import TensorRef
from . import views as V

if TYPE_CHECKING:
    from .lower import Lowering


def _gemm(L: Lowering, node: Node, a: TensorRef, b: TensorRef, bias: TensorRef | None = None,
          alpha: float = 1.0, beta: float = 1.0, residual: TensorRef | None = None, activation: str = "none") -> None:
    """out[batch..., M, N] = alpha * a[batch..., M, K] @ b[batch..., K, N] + beta * bias (broadcast), rounded to
    the output dtype, then + residual (the epilogue of a fused residual add, rounded again as the IR does)."""
    out_v = node.outputs[0]
    out_shape = out_v.shape
    a2, b2 = a, b
    if len(a.shape) == 1:
        a2 = V.reshape(a, (1, a.shape[0]))
    if len(b.shape) == 1:
        b2 = V.reshape(b, (b.shape[0], 1))
    batch = _broadcast(a2.shape[:-2], b2.shape[:-2])
    m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    a2 = L.gemm_operand(V.expand(a2, (*batch, m, k)))
    b2 = L.gemm_operand(V.expand(b2, (*batch, k, n)))
    full = (*batch, m, n)
    buf = L.new_buffer(out_v.name, "arena", out_v.dtype, math.prod(full))
    out = TensorRef(buf.id, full, _contig(full), 0)
    args = [a2, b2]
    params = {"alpha": float(alpha), "beta": float(beta), "has_bias": bias is not None, "m": m, "n": n, "k": k,
              "batch": list(batch), "has_residual": residual is not None, "activation": activation}
    if bias is not None:
        args.append(V.expand(bias, full))
    if residual is not None:
        args.append(V.expand(residual, full))
    L.emit("gemm", args, [out], params)
    r = V.reshape(out, out_shape)
    L.bind(out_v, r)


def _contig(shape):
    from ..program import contiguous_strides

    return contiguous_strides(shape)


def _broadcast(s1: tuple[int, ...], s2: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(s1), len(s2))
    a = (1,) * (n - len(s1)) + tuple(s1)
    b = (1,) * (n - len(s2)) + tuple(s2)
    return tuple(max(x, y) for x, y in zip(a, b))


def linear(L: Lowering, node: Node) -> None:
    x, w = L.ref(node.inputs[0]), L.ref(node.inputs[1])
    bias = L.ref(node.inputs[2]) if len(node.inputs) > 2 else None
    k = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    x2 = V.reshape(x, (rows, k)) or V.reshape(L.contiguous(x), (rows, k))
    wt = V.transpose(w, 0, 1) if len(w.shape) == 2 else w  # [K, N] as a transposed view: no copy
    _gemm(L, node, x2, wt, bias)


def matmul(L: Lowering, node: Node) -> None:
    _gemm(L, node, L.ref(node.inputs[0]), L.ref(node.inputs[1]))


def addmm(L: Lowering, node: Node) -> None:
    bias, a, b = (L.ref(v) for v in node.inputs)
    _gemm(L, node, a, b, bias, node.attrs.get("alpha", 1), node.attrs.get("beta", 1))


def conv2d(L: Lowering, node: Node) -> None:
    a = node.attrs
    has_bias = a.get("has_bias", len(node.inputs) > 2)
    has_residual = a.get("has_residual", False)
    if _conv_is_gemm(node):
        _conv1x1_as_gemm(L, node, has_bias, has_residual)
        return
    if L.conv_im2col and L.target in IM2COL_TARGETS and int(a["groups"]) == 1 and node.inputs[1].kind == "weight":
        _conv_im2col_gemm(L, node, has_bias, has_residual)
        return
    args = [L.contiguous(L.ref(v)) for v in node.inputs]  # x, w, [bias], [residual] (npu.conv2d epilogues)
    out = L.fresh(node.outputs[0])
    params = {"stride": list(a["stride"]), "padding": _pair(a["padding"]), "dilation": list(a["dilation"]),
              "groups": int(a["groups"]), "has_bias": has_bias, "activation": a.get("activation", "none"),
              "has_residual": has_residual}
    L.emit("conv2d", args, [out], params)


def _conv_is_gemm(node: Node) -> bool:
    """A 1x1 conv with stride 1, no padding and one group is a batched GEMM over the pixels: weight [O, C] times
    input [C, H*W] per image. GEMM libraries run it on tensor cores; a direct conv kernel would not."""
    a = node.attrs
    w = node.inputs[1]
    return (len(w.shape) == 4 and tuple(w.shape[2:]) == (1, 1) and list(a["stride"]) == [1, 1]
            and _pair(a["padding"]) == [0, 0] and int(a["groups"]) == 1 and w.kind == "weight")


def _conv1x1_as_gemm(L: Lowering, node: Node, has_bias: bool, has_residual: bool) -> None:
    x_v, w_v = node.inputs[0], node.inputs[1]
    n, c, h, wd = x_v.shape
    o = w_v.shape[0]
    x = L.contiguous(L.ref(x_v))
    b = V.reshape(x, (n, c, h * wd))
    a = V.expand(V.reshape(L.ref(w_v), (o, c)), (n, o, c))
    bias = V.expand(V.reshape(L.ref(node.inputs[2]), (o, 1)), (n, o, h * wd)) if has_bias else None
    res = V.reshape(L.contiguous(L.ref(node.inputs[-1])), (n, o, h * wd)) if has_residual else None
    _gemm(L, node, a, b, bias, residual=res, activation=node.attrs.get("activation", "none") or "none")


# Targets whose GEMM library is much faster than their direct conv kernel (tensor cores).
IM2COL_TARGETS = {"cuda"}


def _conv_im2col_gemm(L: Lowering, node: Node, has_bias: bool, has_residual: bool) -> None:
    """On a GPU, a conv as copies plus one GEMM on tensor cores: pad the input into a zeroed buffer, gather the
    patches (im2col: an affine index map, so a plain generated copy), and multiply by the weight viewed as
    [O, C*kh*kw]. Costs the patch matrix in memory (kh*kw times the input); buys the GEMM library's speed."""
    from .lower import full_ref

    a = node.attrs
    x_v, w_v, out_v = node.inputs[0], node.inputs[1], node.outputs[0]
    n, c, h, wd = x_v.shape
    o, _, kh, kw = w_v.shape
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], _pair(a["padding"]), a["dilation"]
    ho, wo = out_v.shape[2:]
    dt = x_v.dtype
    src = L.contiguous(L.ref(x_v))
    if ph or pw:
        hp, wp = h + 2 * ph, wd + 2 * pw
        padded = full_ref(L.new_buffer(f"{node.name}.padded", "arena", dt, n * c * hp * wp), (n, c, hp, wp))
        L.generated(padded, lambda load: const(0, dt))
        interior = V.slice_(V.slice_(padded, 2, ph, ph + h, 1), 3, pw, pw + wd, 1)
        L.generated(interior, lambda load: load(src))
        src = padded
    st = src.strides
    patches = TensorRef(src.buffer, (n, c, kh, kw, ho, wo),
                        (st[0], st[1], st[2] * dh, st[3] * dw, st[2] * sh, st[3] * sw), src.offset)
    cols = full_ref(L.new_buffer(f"{node.name}.im2col", "arena", dt, n * c * kh * kw * ho * wo),
                    (n, c, kh, kw, ho, wo))
    L.generated(cols, lambda load: load(patches))
    k = c * kh * kw
    b = V.reshape(cols, (n, k, ho * wo))
    w = V.expand(V.reshape(L.contiguous(L.ref(w_v)), (o, k)), (n, o, k))
    bias = V.expand(V.reshape(L.ref(node.inputs[2]), (o, 1)), (n, o, ho * wo)) if has_bias else None
    res = V.reshape(L.contiguous(L.ref(node.inputs[-1])), (n, o, ho * wo)) if has_residual else None
    _gemm(L, node, w, b, bias, residual=res, activation=a.get("activation", "none") or "none")


def _pair(p) -> list[int]:
    if isinstance(p, str):
        raise UnsupportedOpError("conv2d", "aten.conv2d", "any", f"string padding {p!r}")
    return list(p) if isinstance(p, list | tuple) else [int(p), int(p)]


def _pool_window(a: dict) -> tuple[list[int], list[int]]:
    """Kernel and stride as pairs (ATen allows one value for both dims, and an empty stride means the kernel)."""
    ks = list(a["kernel_size"])
    ks = ks * 2 if len(ks) == 1 else ks
    stride = list(a["stride"]) or ks
    return ks, stride * 2 if len(stride) == 1 else stride


def max_pool2d(L: Lowering, node: Node) -> None:
    x = L.contiguous(L.ref(node.inputs[0]))
    a = node.attrs
    out = L.fresh(node.outputs[0])
    ks, stride = _pool_window(a)
    L.emit("max_pool2d", [x], [out], {"kernel": ks, "stride": stride, "padding": _pair(a["padding"]),
                                       "dilation": list(a["dilation"]), "ceil_mode": bool(a["ceil_mode"])})


def avg_pool2d(L: Lowering, node: Node) -> None:
    x = L.contiguous(L.ref(node.inputs[0]))
    a = node.attrs
    out = L.fresh(node.outputs[0])
    ks, stride = _pool_window(a)
    L.emit("avg_pool2d", [x], [out], {"kernel": ks, "stride": stride, "padding": _pair(a["padding"]),
                                       "ceil_mode": bool(a["ceil_mode"]),
                                       "count_include_pad": bool(a["count_include_pad"]),
                                       "divisor_override": a.get("divisor_override")})


def adaptive_avg_pool2d(L: Lowering, node: Node) -> None:
    x_v, out_v = node.inputs[0], node.outputs[0]
    src = L.ref(x_v)
    h, w = x_v.shape[-2:]
    oh, ow = out_v.shape[-2:]
    if (oh, ow) == (1, 1):
        # A global average: a reduction over H and W (no library kernel needed).
        out = L.fresh(out_v)
        lead = len(x_v.shape) - 2
        ostrides = tuple(src.strides[:lead]) + (0, 0)
        acc = "float32"
        body = cast(X.Load(L.dtype_of(src), 0, ostrides, src.offset, tuple(src.strides[-2:])), acc)
        e = X.Binary(acc, "div", X.Reduce(acc, "sum", body), const(h * w, acc))
        from .lower import full_ref

        L.emit("generated", [full_ref(L.buffers[src.buffer])], [out], expr=cast(e, out_v.dtype),
               reduce_shape=(h, w))
        return
    x = L.contiguous(src)
    out = L.fresh(out_v)
    L.emit("adaptive_avg_pool2d", [x], [out], {"output_size": [oh, ow]})


def embedding(L: Lowering, node: Node) -> None:
    w = L.contiguous(L.ref(node.inputs[0]))
    ids = L.contiguous(L.ref(node.inputs[1]))
    out = L.fresh(node.outputs[0])
    L.emit("embedding", [w, ids], [out], {"num_embeddings": w.shape[0], "dim": w.shape[1]})


def index_copy(L: Lowering, node: Node) -> None:
    self_v, index_v, src_v = node.inputs
    dim = V.norm_dim(node.attrs["dim"], len(self_v.shape))
    idx = L.contiguous(L.ref(index_v))
    src = L.ref(src_v)  # read through its strides and converted to the cache's dtype by the kernel
    out_v = node.outputs[0]
    if L.can_overwrite(self_v, out_v):
        # The cache write: in place, never a copy of the whole cache.
        out = L.ref(self_v)
        L.flush_readers(out.buffer)
        buf = L.buffers[out.buffer]
        if buf.kind == "input":
            L._inplace_inputs[buf.id] = buf.name
        L.bind(out_v, out)
        L.emit("index_copy", [idx, src], [out], {"dim": dim, "inplace": True})
        return
    out = L.fresh(out_v)
    base = L.ref(self_v)
    L.generated(out, lambda load: cast(load(base), out_v.dtype))
    L.emit("index_copy", [idx, src], [out], {"dim": dim, "inplace": False})


def softmax(L: Lowering, node: Node) -> None:
    x_v, out_v = node.inputs[0], node.outputs[0]
    x = L.contiguous(L.ref(x_v))
    out = L.fresh(out_v)
    dim = V.norm_dim(node.attrs["dim"], len(x_v.shape)) if x_v.shape else 0
    L.emit("softmax", [x], [out], {"dim": dim, "log": node.op == "log_softmax.int"})


def sdpa(L: Lowering, node: Node) -> None:
    a = node.attrs
    if a.get("dropout_p", 0.0):
        raise UnsupportedOpError(node.name, "aten.scaled_dot_product_attention", L.target, "dropout_p > 0")
    q, k, v = (L.contiguous(L.ref(x)) for x in node.inputs[:3])
    out_v = node.outputs[0]
    b, h, t, d = (*((1,) * (4 - len(q.shape))), *q.shape)
    lk = k.shape[-2]
    hk = k.shape[-3] if len(k.shape) >= 3 else 1
    args = [q, k, v]
    mask_kind = "none"
    if len(node.inputs) > 3:
        m_v = node.inputs[3]
        mask_kind = "bool" if m_v.dtype == "bool" else "additive"
        args.append(V.expand(L.ref(m_v), tuple(q.shape[:-1]) + (lk,)))
    out = L.fresh(out_v)
    scale = a.get("scale")
    L.emit("attention", args, [out], {
        "scale": float(scale) if scale is not None else 1.0 / math.sqrt(d),
        "is_causal": bool(a.get("is_causal")), "mask": mask_kind, "batch": b, "heads": h, "kv_heads": hk,
        "q_len": t, "kv_len": lk, "head_dim": d, "v_dim": v.shape[-1], "valid_len_input": None,
    })


def cat(L: Lowering, node: Node) -> None:
    out_v = node.outputs[0]
    dim = V.norm_dim(node.attrs.get("dim", 0), len(out_v.shape))
    out = L.fresh(out_v)
    start = 0
    for v in node.inputs:
        n = v.shape[dim] if len(v.shape) == len(out_v.shape) else 0
        if n == 0:
            continue  # ATen skips empty operands (legacy 1-D empty tensors included)
        region = V.slice_(out, dim, start, start + n, 1)
        src = L.ref(v, pending_ok=True)
        L.generated(region, lambda load, src=src: cast(load(src), out_v.dtype))
        start += n


def factory(L: Lowering, node: Node) -> None:
    out_v = node.outputs[0]
    out = L.fresh(out_v)
    a, dt = node.attrs, out_v.dtype
    if node.op in ("arange.default", "arange.start", "arange.start_step"):
        start = a.get("start", 0)
        step = a.get("step", 1)
        e: X.Expr = X.Binary(dt, "add", const(start, dt),
                             X.Binary(dt, "mul", cast(X.Index("int64", 0), dt), const(step, dt)))
    else:
        value = {"zeros.default": 0, "ones.default": 1}.get(node.op, a.get("fill_value", 0))
        e = const(value, dt)
    L.emit("generated", [], [out], expr=e)


LIBRARY = {
    "linear.default": linear,
    "matmul.default": matmul,
    "mm.default": matmul,
    "bmm.default": matmul,
    "addmm.default": addmm,
    "conv2d.default": conv2d,
    "max_pool2d.default": max_pool2d,
    "avg_pool2d.default": avg_pool2d,
    "adaptive_avg_pool2d.default": adaptive_avg_pool2d,
    "embedding.default": embedding,
    "index_copy.default": index_copy,
    "softmax.int": softmax,
    "_softmax.default": softmax,
    "log_softmax.int": softmax,
    "scaled_dot_product_attention.default": sdpa,
    "cat.default": cat,
    "arange.default": factory,
    "arange.start": factory,
    "arange.start_step": factory,
    "full.default": factory,
    "zeros.default": factory,
    "ones.default": factory,
}
