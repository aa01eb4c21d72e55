"""Lowering of the compiler ops the fusion patterns make (`npu.*`): each becomes one library kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir.graph import Node
from . import views as V
from .library import _gemm

if TYPE_CHECKING:
    from .lower import Lowering


def rmsnorm(L: Lowering, node: Node) -> None:
    x = L.contiguous(L.ref(node.inputs[0]))
    w = L.contiguous(L.ref(node.inputs[1]))
    out = L.fresh(node.outputs[0])
    L.emit("rmsnorm", [x, w], [out], {"eps": float(node.attrs["eps"]), "cast_dtype": node.attrs.get("cast_dtype"),
                                      "rows": x.numel // x.shape[-1], "dim": x.shape[-1]})


def attention(L: Lowering, node: Node) -> None:
    a = node.attrs
    q, k, v = (L.contiguous(L.ref(x)) for x in node.inputs[:3])
    b, h, t, d = q.shape
    hk, lk = k.shape[1], k.shape[2]
    args = [q, k, v]
    mask_kind = "none"
    if a["has_mask"]:
        m_v = node.inputs[3]
        mask_kind = "bool" if m_v.dtype == "bool" else "additive"
        args.append(V.expand(L.ref(m_v), (b, h, t, lk)))
    if a.get("valid_len"):
        args.append(L.contiguous(L.ref(node.inputs[-1])))
    out = L.fresh(node.outputs[0])
    outs = [out]
    splits = decode_splits(L, b * h * t, lk, v.shape[-1])
    if splits:
        from .lower import full_ref

        # Flash-decoding scratch: per (query row, key split) the split's max, sum and partial output.
        numel = b * h * t * splits * (2 + v.shape[-1])
        scratch = L.new_buffer(f"{node.name}.split_scratch", "arena", "float32", numel)
        outs.append(full_ref(scratch))
    L.emit("attention", args, outs, {
        "scale": float(a["scale"]), "is_causal": bool(a["is_causal"]), "mask": mask_kind, "batch": b, "heads": h,
        "kv_heads": hk, "q_len": t, "kv_len": lk, "head_dim": d, "v_dim": v.shape[-1],
        "scores_dtype": a.get("scores_dtype", "float32"), "probs_dtype": a.get("probs_dtype", "float32"),
        "valid_len": bool(a.get("valid_len")), "splits": splits,
    })


# A GPU wants a few hundred blocks; decode attention has one query row per head. Split each row's keys so that
# rows x splits reaches about two blocks per SM of a large GPU, keeping at least 64 keys per split.
DECODE_TARGET_BLOCKS = 264


def decode_splits(L: Lowering, rows: int, kv_len: int, v_dim: int) -> int:
    """How many key splits a decode attention gets on a target that runs them (0: one block per row)."""
    if L.target != "cuda" or rows == 0 or rows >= DECODE_TARGET_BLOCKS or v_dim > 1024:
        return 0
    splits = min(-(-DECODE_TARGET_BLOCKS // rows), kv_len // 64)
    return splits if splits >= 2 else 0


def rope(L: Lowering, node: Node) -> None:
    x_v = node.inputs[0]
    x = L.ref(x_v)  # any strides: q/k arrive as transposed views of the projection's output
    cos = V.expand(L.ref(node.inputs[1]), x_v.shape)
    sin = V.expand(L.ref(node.inputs[2]), x_v.shape)
    out = L.fresh(node.outputs[0])
    L.emit("rope", [x, cos, sin], [out], {"product_dtype": node.attrs.get("product_dtype"), "dim": x_v.shape[-1],
                                          "rows": x.numel // x_v.shape[-1]})


def linear(L: Lowering, node: Node) -> None:
    a = node.attrs
    x, w = L.ref(node.inputs[0]), L.ref(node.inputs[1])
    bias = L.ref(node.inputs[2]) if a["has_bias"] else None
    residual = L.ref(node.inputs[-1]) if a["has_residual"] else None
    k = x.shape[-1]
    rows = x.numel // k
    x2 = V.reshape(x, (rows, k)) or V.reshape(L.contiguous(x), (rows, k))
    res2 = None
    if residual is not None:
        res2 = V.reshape(residual, (rows, w.shape[0])) or V.reshape(L.contiguous(residual), (rows, w.shape[0]))
    _gemm(L, node, x2, V.transpose(w, 0, 1), bias, residual=res2)


def conv2d(L: Lowering, node: Node) -> None:
    from .library import conv2d as plain_conv

    plain_conv(L, node)


def masked_softmax(L: Lowering, node: Node) -> None:
    x_v = node.inputs[0]
    x = L.contiguous(L.ref(x_v))
    args = [x]
    mask_kind = "none"
    if node.attrs["has_mask"]:
        m_v = node.inputs[1]
        mask_kind = "bool" if m_v.dtype == "bool" else "additive"
        args.append(V.expand(L.ref(m_v), x_v.shape))
    out = L.fresh(node.outputs[0])
    a = node.attrs
    L.emit("softmax", args, [out], {"dim": len(x_v.shape) - 1, "log": False, "scale": float(a["scale"]),
                                    "divide": bool(a["divide"]), "mask": mask_kind,
                                    "round_dtype": a["round_dtype"]})


FUSED = {
    "npu.softmax": masked_softmax,
    "npu.rmsnorm": rmsnorm,
    "npu.attention": attention,
    "npu.rope": rope,
    "npu.linear": linear,
    "npu.conv2d": conv2d,
}
