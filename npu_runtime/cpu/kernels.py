"""The CPU backend's library kernels (NumPy): the reference every other backend is measured against.
Half-precision inputs compute in fp32 and round once to the output dtype; GEMMs and reductions accumulate in fp32."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..dtypes import np_dtype
from ..errors import NPURuntimeError


def f32(a: np.ndarray) -> np.ndarray:
    if a.dtype == np.float32:
        return a
    if a.dtype.kind in "iub":
        return a.astype(np.float32)
    return a.astype(np.float32)


def store(out: np.ndarray, value: np.ndarray) -> None:
    if value.dtype != out.dtype:
        value = value.astype(np.float32).astype(out.dtype) if out.dtype != np.float32 else value.astype(np.float32)
    np.copyto(out, value, casting="unsafe")


def round_to(x: np.ndarray, dtype: np.dtype | str | None) -> np.ndarray:
    """Round fp32 values to a half dtype and back (where the IR stores an intermediate in that dtype)."""
    if dtype is None:
        return x
    dt = np_dtype(dtype) if isinstance(dtype, str) else np.dtype(dtype)
    if dt.itemsize != 2 or dt.kind == "i":
        return x
    return x.astype(dt).astype(np.float32)


def gemm(args, outs, p, ctx) -> None:
    a, b = args[0], args[1]
    if outs[0].dtype.kind in "iu":
        # Integer GEMMs are exact in int64 (wrapping), as ATen's are: fp32 would round sums above 2^24.
        acc = np.matmul(a.astype(np.int64), b.astype(np.int64))
        if p.get("alpha", 1) != 1:
            acc = acc * np.int64(p["alpha"])
        if p.get("has_bias"):
            acc = acc + args[2].astype(np.int64) * np.int64(p.get("beta", 1))
        np.copyto(outs[0], acc, casting="unsafe")
        return
    acc = np.matmul(f32(a), f32(b))
    if p.get("alpha", 1.0) != 1.0:
        acc = acc * np.float32(p["alpha"])
    if p.get("has_bias"):
        bias = f32(args[2])
        acc = acc + (bias * np.float32(p["beta"]) if p.get("beta", 1.0) != 1.0 else bias)
    if p.get("has_residual"):
        acc = round_to(acc, outs[0].dtype) + f32(args[-1])
    if p.get("activation", "none") not in (None, "none"):
        acc = _activation(round_to(acc, outs[0].dtype), p["activation"])
    store(outs[0], acc)


def _activation(y: np.ndarray, kind: str) -> np.ndarray:
    if kind == "relu":
        return np.maximum(y, 0)
    if kind != "none":
        raise NPURuntimeError(f"unknown activation {kind}")
    return y


def conv2d(args, outs, p, ctx) -> None:
    x, w = f32(args[0]), f32(args[1])
    out = outs[0]
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    sh, sw = p["stride"]
    ph, pw = p["padding"]
    dh, dw = p["dilation"]
    g = p["groups"]
    ho, wo = out.shape[2], out.shape[3]
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw))) if ph or pw else x
    eh, ew = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    win = sliding_window_view(xp, (eh, ew), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw][:, :, :ho, :wo]
    og = o // g
    y = np.empty((n, o, ho, wo), np.float32)
    for gi in range(g):
        cols = win[:, gi * cg:(gi + 1) * cg]  # n, cg, ho, wo, kh, kw
        cols = cols.transpose(0, 2, 3, 1, 4, 5).reshape(n * ho * wo, cg * kh * kw)
        wg = w[gi * og:(gi + 1) * og].reshape(og, cg * kh * kw)
        y[:, gi * og:(gi + 1) * og] = (cols @ wg.T).reshape(n, ho, wo, og).transpose(0, 3, 1, 2)
    if p.get("has_bias"):
        y += f32(args[2]).reshape(1, -1, 1, 1)
    if p.get("has_residual"):
        # The unfused graph stores the conv result in its dtype before the residual add: round there too.
        y = round_to(y, out.dtype) + f32(args[3 if p.get("has_bias") else 2])
    store(out, _activation(y, p.get("activation", "none")))


def _pool_windows(x: np.ndarray, p, out_hw, fill: float) -> np.ndarray:
    kh, kw = p["kernel"]
    sh, sw = p["stride"]
    ph, pw = p["padding"]
    dh, dw = p.get("dilation", [1, 1])
    ho, wo = out_hw
    h, w = x.shape[-2:]
    eh, ew = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    need_h = max((ho - 1) * sh + eh - h - ph, ph)
    need_w = max((wo - 1) * sw + ew - w - pw, pw)
    xp = np.pad(x, ((0, 0), (0, 0), (ph, need_h), (pw, need_w)), constant_values=fill)
    return sliding_window_view(xp, (eh, ew), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw][:, :, :ho, :wo]


def max_pool2d(args, outs, p, ctx) -> None:
    x = f32(args[0])
    win = _pool_windows(x, p, outs[0].shape[2:], -np.inf)
    store(outs[0], win.max(axis=(-2, -1)))


def avg_pool2d(args, outs, p, ctx) -> None:
    x = f32(args[0])
    ho, wo = outs[0].shape[2:]
    win = _pool_windows(x, p, (ho, wo), 0.0)
    total = win.sum(axis=(-2, -1))
    kh, kw = p["kernel"]
    sh, sw = p["stride"]
    ph, pw = p["padding"]
    h, w = x.shape[-2:]
    if p.get("divisor_override"):
        div = np.float32(p["divisor_override"])
    else:
        hs = np.arange(ho) * sh - ph
        ws = np.arange(wo) * sw - pw
        he = np.minimum(hs + kh, h + ph)
        we = np.minimum(ws + kw, w + pw)
        if p.get("count_include_pad", True):
            div = ((he - hs)[:, None] * (we - ws)[None, :]).astype(np.float32)
        else:
            hh = np.minimum(he, h) - np.maximum(hs, 0)
            ww = np.minimum(we, w) - np.maximum(ws, 0)
            div = (hh[:, None] * ww[None, :]).astype(np.float32)
    store(outs[0], total / div)


def adaptive_avg_pool2d(args, outs, p, ctx) -> None:
    x = f32(args[0])
    h, w = x.shape[-2:]
    oh, ow = p["output_size"]
    y = np.empty(x.shape[:-2] + (oh, ow), np.float32)
    for i in range(oh):
        h0, h1 = (i * h) // oh, -(-((i + 1) * h) // oh)
        for j in range(ow):
            w0, w1 = (j * w) // ow, -(-((j + 1) * w) // ow)
            y[..., i, j] = x[..., h0:h1, w0:w1].mean(axis=(-2, -1))
    store(outs[0], y)


def embedding(args, outs, p, ctx) -> None:
    w, ids = args
    bad = (ids < 0) | (ids >= w.shape[0])
    if bad.any():
        raise NPURuntimeError(f"{ctx}: index {int(ids[bad].flat[0])} out of range for an embedding of "
                              f"{w.shape[0]} rows")
    np.copyto(outs[0], np.take(w, ids, axis=0))


def index_copy(args, outs, p, ctx) -> None:
    idx, src = args
    out = outs[0]
    dim = p["dim"]
    if idx.size and (idx.min() < 0 or idx.max() >= out.shape[dim]):
        raise NPURuntimeError(f"{ctx}: index_copy position {int(idx.max())} out of range for size "
                              f"{out.shape[dim]} of dim {dim}")
    sl = (slice(None),) * dim + (idx.reshape(-1),)
    out[sl] = src.astype(out.dtype, copy=False)


def softmax(args, outs, p, ctx) -> None:
    x = f32(args[0])
    d = p["dim"]
    if "scale" in p:  # npu.softmax: scale and mask applied as the row is read, rounded where the IR rounds
        rd = p.get("round_dtype")
        x = round_to(x / np.float32(p["scale"]) if p.get("divide") else x * np.float32(p["scale"]), rd)
        if p.get("mask") == "additive":
            x = round_to(x + f32(args[1]), rd)
        elif p.get("mask") == "bool":
            x = np.where(args[1], x, -np.inf)
    m = x.max(axis=d, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(axis=d, keepdims=True)
    store(outs[0], (x - m) - np.log(s) if p.get("log") else e / s)


def attention(args, outs, p, ctx) -> None:
    q, k, v = (f32(a) for a in args[:3])
    b, h, t, d = p["batch"], p["heads"], p["q_len"], p["head_dim"]
    hk, lk = p["kv_heads"], p["kv_len"]
    mask = args[3] if p["mask"] != "none" else None
    if p.get("valid_len"):
        # Decode over a static cache: slots past the last written position are masked; do not read them.
        pos = args[-1]
        n = int(pos.max()) + 1 if pos.size else lk
        if not 0 < n <= lk:
            raise NPURuntimeError(f"{ctx}: cache position {n - 1} outside a cache of {lk} slots")
        k, v, lk = k[:, :, :n], v[:, :, :n], n
        mask = mask[..., :n] if mask is not None else None
    sd, pd = p.get("scores_dtype"), p.get("probs_dtype")
    q = q.reshape(b, hk, h // hk, t, d)
    k = k.reshape(b, hk, 1, lk, d)
    v = v.reshape(b, hk, 1, lk, -1)
    # Rounded where the graph stores in a half dtype (the bf16 QK^T, its scaled and masked versions).
    s = round_to(np.matmul(q, k.swapaxes(-1, -2)), sd)
    s = round_to(s * np.float32(p["scale"]), sd)
    if mask is not None:
        m = mask.reshape(b, hk, h // hk, t, lk)
        if p["mask"] == "bool":
            s = np.where(m, s, -np.inf)
        else:
            s = round_to(s + f32(m), sd)
    if p.get("is_causal"):
        s = np.where(np.tril(np.ones((t, lk), bool)), s, -np.inf)
    mx = s.max(axis=-1, keepdims=True)
    # A query row whose keys are all masked out attends to nothing: zeros, as ATen's attention gives (its "safe
    # softmax"), not the NaN of 0/0.
    dead = np.isneginf(mx)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - np.where(dead, np.float32(0), mx))
        pr = round_to(e / np.where(dead, np.float32(1), e.sum(axis=-1, keepdims=True)), pd)
    o = np.matmul(pr, v).reshape(outs[0].shape)
    store(outs[0], o)


def rope(args, outs, p, ctx) -> None:
    """x * cos + rotate_half(x) * sin, each product rounded to its IR dtype as the unfused graph does."""
    x, cos, sin = (f32(a) for a in args)
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    pd = p.get("product_dtype")
    store(outs[0], round_to(x * cos, pd) + round_to(rot * sin, pd))


def rmsnorm(args, outs, p, ctx) -> None:
    x = f32(args[0])
    var = (x * x).mean(axis=-1, keepdims=True)
    y = x / np.sqrt(var + np.float32(p["eps"]))
    if p.get("cast_dtype"):
        y = y.astype(np_dtype(p["cast_dtype"])).astype(np.float32)
    store(outs[0], y * f32(args[1]))


LIBRARY = {
    "gemm": gemm,
    "conv2d": conv2d,
    "max_pool2d": max_pool2d,
    "avg_pool2d": avg_pool2d,
    "adaptive_avg_pool2d": adaptive_avg_pool2d,
    "embedding": embedding,
    "index_copy": index_copy,
    "softmax": softmax,
    "attention": attention,
    "rmsnorm": rmsnorm,
    "rope": rope,
}

