"""Lowering of PT2E's quantize/dequantize ops (what is left of them after `quant/fold.py` took the patterns it folds
into integer kernels), of the folded integer ops (`npu.qconv2d`, `npu.qlinear`, `npu.qadd`) and of the weight-only
quantized linear (`npu.wlinear`, `quant/weight_only.py`)."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from ..expr import nodes as X
from ..ir.graph import Node, Value
from ..ir.quant_ops import DEQUANTIZE, DEQUANTIZE_CHANNEL, QUANTIZE, QUANTIZE_CHANNEL
from ..kernels import QAddKernel, QConv2dKernel, QGemmKernel, Requant, ResidualAdd, WGemmKernel
from ..program import TensorRef
from ..quant import expressions as Q
from . import views as V
from .registry import lowers

if TYPE_CHECKING:
    from .lower import Lowering


def _along(ref: TensorRef, axis: int, rank: int) -> TensorRef:
    """A per-channel vector [C] as a view broadcastable along `axis` of a rank-`rank` tensor."""
    return V.reshape(ref, tuple(ref.shape[0] if d == axis else 1 for d in range(rank)))


def quant_expression(L: Lowering, node: Node, load) -> X.Expr:
    """The expression of one quantize/dequantize node (`quant/expressions.py`), its operands read through `load`."""
    a, out = node.attrs, node.outputs[0]
    x = node.inputs[0]
    if node.op in (QUANTIZE, DEQUANTIZE):
        scale, zp = float(a["scale"]), int(a["zero_point"])
        if node.op == QUANTIZE:
            return Q.quantize(load(L.ref(x, pending_ok=True)), Q.f32_const(1.0 / scale), Q.f32_const(zp),
                              int(a["quant_min"]), int(a["quant_max"]), out.dtype)
        return Q.dequantize(load(L.ref(x, pending_ok=True)), Q.f32_const(scale), Q.f32_const(zp), out.dtype)
    rank = len(x.shape)
    axis = int(a["axis"]) % max(rank, 1)
    scale = load(_along(L.ref(node.inputs[1]), axis, rank))
    zp = load(_along(L.ref(node.inputs[2]), axis, rank)) if len(node.inputs) > 2 else None
    if node.op == QUANTIZE_CHANNEL:
        return Q.quantize(load(L.ref(x, pending_ok=True)), Q.inverse(scale), zp if zp is not None else Q.f32_const(0),
                          int(a["quant_min"]), int(a["quant_max"]), out.dtype)
    return Q.dequantize(load(L.ref(x, pending_ok=True)), scale, zp, out.dtype)


@lowers(QUANTIZE, DEQUANTIZE, QUANTIZE_CHANNEL, DEQUANTIZE_CHANNEL)
def quantize_dequantize(L: Lowering, node: Node) -> None:
    """A dequantize stays pending (its readers inline it: a few nodes); a quantize is written out. Its rounding reads
    its operand several times, and an artifact's expressions are trees (shared subtrees written once per use), so a
    chain of quantizes inlined into one another would grow geometrically."""
    build = lambda load: quant_expression(L, node, load)  # noqa: E731
    if node.op in (QUANTIZE, QUANTIZE_CHANNEL):
        L.generated(L.fresh(node.outputs[0]), build)
    else:
        L.lower_elementwise(node, build)


# ---- the folded integer ops ------------------------------------------------------------------------------------


def _requant(node: Node) -> Requant:
    a = node.attrs
    if a.get("dequantize"):
        return Requant()
    return Requant(int(a["out_zero_point"]), int(a["lo"]), int(a["hi"]), str(a.get("rounding", "single")))


def _scale_ref(L: Lowering, v: Value) -> TensorRef:
    return L.ref(v)


def _activation(L: Lowering, v: Value) -> TensorRef:
    """A new buffer for an integer image result: channels-last where the program's activations are."""
    return L.fresh_activation(v) if L.channels_last else L.fresh(v)


@lowers("npu.qconv2d", kernels=("qconv2d",))
def qconv2d(L: Lowering, node: Node) -> None:
    """inputs: x (int8/uint8), w (int8), [bias (int32)], scale (int32 [C, 2])."""
    a = node.attrs
    has_bias = bool(a["has_bias"])
    x, w = L.ref(node.inputs[0]), L.ref(node.inputs[1])
    on_matrix_units = L.conv_on_tensor_cores(node)
    if not on_matrix_units:
        x, w = L.contiguous(x), L.contiguous(w)
    args = [x, w] + ([L.ref(node.inputs[2])] if has_bias else []) + [_scale_ref(L, node.inputs[-1])]
    spec = QConv2dKernel(tuple(a["stride"]), tuple(a["padding"]), tuple(a["dilation"]), int(a["groups"]),
                         int(a["x_zero_point"]), has_bias, node.inputs[-1].shape[0], _requant(node),
                         bool(a.get("dequantize")))
    # on the target's int8 matrix units: the input and the weight read through their strides (channels-last, the
    # weight [O, kh, kw, C]: the lowering's layout), the tiles the target's plan; where the program's activations are
    # channels-last every integer conv writes them so
    L.plan(L.emit(spec, args, [_activation(L, node.outputs[0]) if not spec.dequantize else L.fresh(node.outputs[0])]))


@lowers("npu.qlinear", kernels=("qgemm",))
def qlinear(L: Lowering, node: Node) -> None:
    """inputs: x (int8/uint8 [..., K]), w (int8 [N, K]), [bias (int32 [N])], scale (int32 [C, 2])."""
    a = node.attrs
    has_bias = bool(a["has_bias"])
    x_v, w_v, out_v = node.inputs[0], node.inputs[1], node.outputs[0]
    k = x_v.shape[-1]
    rows = math.prod(x_v.shape[:-1])
    n = w_v.shape[0]
    x = L.ref(x_v)
    x2 = V.reshape(x, (rows, k)) or V.reshape(L.contiguous(x), (rows, k))
    wt = V.transpose(L.ref(w_v), 0, 1)  # [K, N] as a view of the [N, K] weight
    args = [x2, wt] + ([L.ref(node.inputs[2])] if has_bias else []) + [_scale_ref(L, node.inputs[-1])]
    spec = QGemmKernel(rows, n, k, (), int(a["x_zero_point"]), 0, has_bias, node.inputs[-1].shape[0], _requant(node),
                       bool(a.get("dequantize")))
    out = L.fresh(out_v)
    L.plan(L.emit(spec, args, [V.reshape(out, (rows, n))]))


@lowers("npu.qadd", kernels=("qadd",))
def qadd(L: Lowering, node: Node) -> None:
    a = node.attrs
    if L.target.qconv_residual and _fuse_into_conv(L, node):
        return
    out = _activation(L, node.outputs[0])
    args = [V.expand(L.ref(v), tuple(out.shape)) for v in node.inputs[:2]]
    spec = QAddKernel(int(a["a_zero_point"]), int(a["b_zero_point"]), int(a["left_shift"]), int(a["a_multiplier"]),
                      int(a["a_shift"]), int(a["b_multiplier"]), int(a["b_shift"]), int(a["out_multiplier"]),
                      int(a["out_shift"]), _requant(node))
    L.emit(spec, args, [out])


def _fuse_into_conv(L: Lowering, node: Node) -> bool:
    """The add as the epilogue of the integer conv that computes one operand (its only reader this add, not a graph
    output), where the other operand, of the output's shape, is computed before that conv and the conv's result is
    not a float (dequantizing) one: the conv's record gains the add (QConv2dKernel.residual) and the skip tensor as
    its last argument, and writes the add's result instead of its own. Returns whether it did."""
    a = node.attrs
    ins = node.inputs[:2]
    out_v = node.outputs[0]
    if ins[0] is ins[1] or any(tuple(v.shape) != tuple(out_v.shape) for v in ins):
        return False
    for side, v in enumerate(ins):
        ref = L.refs.get(id(v))
        if ref is None or ref.buffer in L.pending or L.is_graph_output(v) or len(L.users(v)) != 1:
            continue
        at = next((i for i in range(len(L.kernels) - 1, -1, -1) if ref in L.kernels[i].outs), None)
        if at is None or L.kernels[at].kind != "qconv2d":
            continue
        k = L.kernels[at]
        spec = k.spec
        if spec.residual is not None or spec.dequantize or len(k.outs) != 1:
            continue
        other = ins[1 - side]
        skip = L.ref(other)  # (written out here if pending: then after the conv, and not fused)
        if any(skip.buffer == o.buffer for later in L.kernels[at:] for o in later.writes):
            continue
        mine, theirs = ("a", "b") if side == 0 else ("b", "a")
        if int(a[f"{mine}_zero_point"]) != spec.requant.zero_point or out_v.dtype != v.dtype:
            continue  # (the conv's buffer holds the add's result: the same dtype)
        residual = ResidualAdd(v.dtype, int(a[f"{theirs}_zero_point"]), int(a["left_shift"]),
                               int(a[f"{mine}_multiplier"]), int(a[f"{mine}_shift"]), int(a[f"{theirs}_multiplier"]),
                               int(a[f"{theirs}_shift"]), int(a["out_multiplier"]), int(a["out_shift"]),
                               _requant(node))
        k.spec = dataclasses.replace(spec, residual=residual)
        k.args = [*k.args, skip]
        k.spec.check(k, L.buffers)
        k.nodes = list(dict.fromkeys([*k.nodes, *node.origin]))
        k.out_values = [out_v.name]
        L.bind(out_v, k.outs[0])
        return True
    return False


@lowers("npu.wlinear", kernels=("wgemm",))
def wlinear(L: Lowering, node: Node) -> None:
    """inputs: x (float [..., K]), the int8 weight or packed int4 codes, scales, [zero points], [bias], [residual]
    (fuse_gemm_epilogue: added to the product rounded to the output dtype, as the float linear's). A pending norm
    before it becomes the record's prologue where the target computes it in the GEMV (`wgemm_prologue`)."""
    from .library import epilogue_of

    a = node.attrs
    x_v, out_v = node.inputs[0], node.outputs[0]
    k = x_v.shape[-1]
    rows = math.prod(x_v.shape[:-1])
    bits = int(a["bits"])
    n = node.inputs[1].shape[0]
    x = L.ref(x_v, pending_ok=True)
    x2 = V.reshape(x, (rows, k)) or V.reshape(L.contiguous(x), (rows, k))
    origins: list[str] = []
    prologue = L.prologue(x2, None, (), rows, k, origins,
                          fits=lambda reduces: L.target.wgemm_prologue(rows, k, bits, int(a["group"]), L.dtype_of(x2),
                                                                       reduces))
    has_residual = bool(a.get("has_residual", False))
    weights = node.inputs[1:-1] if has_residual else node.inputs[1:]
    args = [] if prologue is not None else [L.gemm_operand(x2)]
    args += [L.ref(v) for v in weights]
    epilogue = None
    if has_residual:
        res = L.ref(node.inputs[-1], pending_ok=True)
        res2 = V.reshape(res, (rows, n)) or V.reshape(L.contiguous(res), (rows, n))
        epilogue = epilogue_of(L, (rows, n), out_v.dtype, res2, (), origins)
    epilogue, extra, prologue = L.epilogue_args(epilogue, len(args), prologue)
    reduce = (k,) if prologue is not None and any(isinstance(e, X.Reduce) for e in X.walk(prologue)) else ()
    spec = WGemmKernel(rows, n, k, (), bits, int(a["group"]), bool(a["has_bias"]), epilogue, prologue, reduce)
    out = L.fresh(out_v)
    kcall = L.emit(spec, args + extra, [V.reshape(out, (rows, n))])
    if origins:
        kcall.nodes = list(dict.fromkeys([*origins, *kcall.nodes]))
