"""Lowering of the ops that become library kernels: GEMMs (linear, matmul, bmm, mm, addmm), convolutions and
attention, with their epilogues (bias, residual add, activation) as expressions over the kernel's result."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import UnsupportedOpError
from ..expr import nodes as X
from ..expr.aten_table import build_elementwise
from ..ir.graph import Node, Value
from ..kernels import AttentionKernel, Conv2dKernel, GemmKernel, KernelCall
from ..program import TensorRef, contiguous_strides
from . import views as V
from .greedy import Pending
from .registry import lowers
from .rows import ROW_OPS

if TYPE_CHECKING:
    from .lower import Lowering


Activation = tuple[tuple[str, dict], ...]  # elementwise ops (ATen name, attrs) after a GEMM or conv, in order


def epilogue_of(L: Lowering, out_shape: tuple[int, ...], dtype: str, residual: TensorRef | None,
                activation: Activation, origins: list[str]) -> X.Expr | None:
    """The ops after a GEMM or conv, as the unfused graph computes them on its stored (rounded) result `Acc`:
    [+ residual] [-> each op of `activation`, from the expression table, rounded to the dtype as the graph does]."""
    if residual is None and not activation:
        return None
    load = L.loader(out_shape, (), origins)
    e: X.Expr = X.Acc(dtype)
    if residual is not None:
        e = build_elementwise("add.Tensor", [e, load(residual)], {}, dtype)
    for op, attrs in activation:
        e = build_elementwise(op, [e], attrs, dtype)
    return e


def gemm(L: Lowering, node: Node, a: TensorRef, b: TensorRef, bias: TensorRef | None = None, alpha: float = 1.0,
         beta: float = 1.0, residual: TensorRef | None = None, activation: Activation = (),
         out_v: Value | None = None, view: Callable[[TensorRef], TensorRef] | None = None) -> None:
    """out[batch..., M, N] = alpha * a[batch..., M, K] @ b[batch..., K, N] + beta * bias (broadcast), rounded to
    the output dtype, then the epilogue (a residual add rounded again as the IR does, an activation)."""
    out_v = out_v or node.outputs[0]
    out_shape = out_v.shape
    a2, b2 = a, b
    if len(a.shape) == 1:
        a2 = V.reshape(a, (1, a.shape[0]))
    if len(b.shape) == 1:
        b2 = V.reshape(b, (b.shape[0], 1))
    batch = _broadcast(a2.shape[:-2], b2.shape[:-2])
    m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    b2 = L.gemm_operand(V.expand(b2, (*batch, k, n)))
    origins: list[str] = []
    a2 = V.expand(a2, (*batch, m, k))
    prologue = L.prologue(a2, b2, tuple(batch), m, k, origins)  # a computed in the kernel, not read
    full = (*batch, m, n)
    buf = L.new_buffer(out_v.name, "arena", out_v.dtype, math.prod(full))
    out = TensorRef(buf.id, full, contiguous_strides(full), 0)
    args = [b2] if prologue is not None else [L.gemm_operand(a2), b2]
    if bias is not None:
        args.append(V.expand(bias, full))
    res = V.expand(residual, full) if residual is not None else None
    epilogue = epilogue_of(L, full, out_v.dtype, res, activation, origins)
    if (epilogue is not None and prologue is None and L.greedy_fusion and L.target.row_side_outputs
            and not L.is_graph_output(out_v) and any(u.op in ROW_OPS for u in L.users(out_v))
            and L.target.gemm_epilogue_apart(m, tuple(batch), L.dtype_of(args[0]), out_v.dtype)):
        # The target runs this epilogue as a pass of its own after its GEMM library's call, and a row kernel (a norm)
        # reads the result: the product goes to a buffer of its own and the epilogue stays a pending elementwise
        # result over it, which its readers inline and the norm writes as its side output (one pass, not two)
        product = L.new_buffer(f"{out_v.name}.product", "arena", out_v.dtype, math.prod(full))
        spec = GemmKernel(m, n, k, tuple(batch), float(alpha), bias is not None, float(beta), None, None, ())
        kcall = L.emit(spec, args, [TensorRef(product.id, full, contiguous_strides(full), 0)])
        acc = X.Load(out_v.dtype, product.id, contiguous_strides(full), 0, ())
        expr = X.substitute(epilogue, lambda e: acc if isinstance(e, X.Acc) else None)
        L.pending[buf.id] = Pending(expr, full, [*origins, *node.origin], node)
        L.bind(out_v, view(out) if view is not None else V.reshape(out, out_shape))
        return
    epilogue, extra, prologue = L.epilogue_args(epilogue, len(args), prologue)
    spec = GemmKernel(m, n, k, tuple(batch), float(alpha), bias is not None, float(beta), epilogue, prologue,
                      (k,) if prologue is not None and any(isinstance(e, X.Reduce) for e in X.walk(prologue)) else ())
    kcall = L.emit(spec, args + extra, [out])
    if origins:
        kcall.nodes = list(dict.fromkeys([*origins, *kcall.nodes]))
    L.bind(out_v, view(out) if view is not None else V.reshape(out, out_shape))


def _broadcast(s1: tuple[int, ...], s2: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(s1), len(s2))
    a = (1,) * (n - len(s1)) + tuple(s1)
    b = (1,) * (n - len(s2)) + tuple(s2)
    return tuple(max(x, y) for x, y in zip(a, b))


def _rows2d(L: Lowering, ref: TensorRef, rows: int, cols: int) -> TensorRef:
    return V.reshape(ref, (rows, cols)) or V.reshape(L.contiguous(ref), (rows, cols))


@lowers("linear.default", kernels=("gemm",))
def linear(L: Lowering, node: Node) -> None:
    x, w = L.ref(node.inputs[0], pending_ok=True), L.ref(node.inputs[1])
    bias = L.ref(node.inputs[2]) if len(node.inputs) > 2 else None
    k = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    wt = V.transpose(w, 0, 1) if len(w.shape) == 2 else w  # [K, N] as a transposed view: no copy
    gemm(L, node, _rows2d(L, x, rows, k), wt, bias)


@lowers("matmul.default", "mm.default", "bmm.default", kernels=("gemm",))
def matmul(L: Lowering, node: Node) -> None:
    gemm(L, node, L.ref(node.inputs[0], pending_ok=True), L.ref(node.inputs[1]))


@lowers("addmm.default", kernels=("gemm",))
def addmm(L: Lowering, node: Node) -> None:
    bias, a, b = (L.ref(v) for v in node.inputs)
    gemm(L, node, a, b, bias, node.attrs.get("alpha", 1), node.attrs.get("beta", 1))


@lowers("baddbmm.default", kernels=("gemm",))
def baddbmm(L: Lowering, node: Node) -> None:
    """beta * self + alpha * (batch1 @ batch2); with beta 0 `self` is not read (ATen ignores it, NaN included)."""
    bias, a, b = (L.ref(v) for v in node.inputs)
    beta = node.attrs.get("beta", 1)
    gemm(L, node, a, b, bias if beta != 0 else None, node.attrs.get("alpha", 1), beta)


@lowers("npu.linear", kernels=("gemm",))
def linear_epilogue(L: Lowering, node: Node) -> None:
    """A linear with its residual add (fuse_gemm_epilogue)."""
    a = node.attrs
    x, w = L.ref(node.inputs[0], pending_ok=True), L.ref(node.inputs[1])
    bias = L.ref(node.inputs[2]) if a["has_bias"] else None
    residual = L.ref(node.inputs[-1], pending_ok=True) if a["has_residual"] else None
    k = x.shape[-1]
    rows = x.numel // k
    res2 = None
    if residual is not None:
        res2 = V.reshape(residual, (rows, w.shape[0]))
        if res2 is None:
            res2 = V.reshape(L.contiguous(residual), (rows, w.shape[0]))
    gemm(L, node, _rows2d(L, x, rows, k), V.transpose(w, 0, 1), bias, residual=res2)


# ---- convolution ---------------------------------------------------------------------------------------------------


@lowers("conv2d.default", "npu.conv2d", kernels=("conv2d", "gemm"))
def conv2d(L: Lowering, node: Node) -> None:
    if len(node.inputs[0].shape) == 3:
        _batch_of_one(L, node, conv2d)
        return
    a = node.attrs
    has_bias = a.get("has_bias", len(node.inputs) > 2)
    has_residual = a.get("has_residual", False)
    activation: Activation = tuple(a.get("activation", ()))
    x_v, w_v, out_v = node.inputs[0], node.inputs[1], node.outputs[0]
    if L.conv_on_tensor_cores(node):
        # one implicit-GEMM kernel: the input, the weight and the residual read through their strides, the output
        # channels-last; its plan may split K across blocks that sum their parts in a float32 scratch
        bias = [L.ref(node.inputs[2])] if has_bias else []
        out = L.fresh_activation(out_v)
        k = _emit_conv(L, node, [L.ref(x_v), L.ref(w_v), *bias], [out], has_bias, has_residual, activation)
        L.plan(k)
        return
    if _conv_is_gemm(node) and not _split_apart(L, x_v, w_v, out_v):
        _conv1x1_as_gemm(L, node, has_bias, has_residual, activation)
        return
    if L.conv_im2col and int(a["groups"]) == 1 and w_v.kind == "weight":
        _conv_im2col_gemm(L, node, has_bias, has_residual, activation)
        return
    x, w = L.contiguous(L.ref(x_v)), L.contiguous(L.ref(w_v))
    args = [x, w] + ([L.contiguous(L.ref(node.inputs[2]))] if has_bias else [])
    k = _emit_conv(L, node, args, [L.fresh(out_v)], has_bias, has_residual, activation)
    if L.target.plans_convs:
        L.plan(k)


def _emit_conv(L: Lowering, node: Node, args: list[TensorRef], outs: list[TensorRef], has_bias: bool,
               has_residual: bool, activation: Activation) -> KernelCall:
    a = node.attrs
    origins: list[str] = []
    res = L.ref(node.inputs[-1], pending_ok=True) if has_residual else None
    epilogue, extra, _ = L.epilogue_args(epilogue_of(L, tuple(outs[0].shape), node.outputs[0].dtype, res, activation,
                                                  origins), len(args))
    spec = Conv2dKernel(tuple(a["stride"]), tuple(_pair(a["padding"], node)), tuple(a["dilation"]), int(a["groups"]),
                        has_bias, epilogue)
    k = L.emit(spec, args + extra, outs)
    if origins:
        k.nodes = list(dict.fromkeys([*origins, *k.nodes]))
    return k


@lowers("conv2d.padding", kernels=("conv2d", "gemm"))
def conv2d_padding(L: Lowering, node: Node) -> None:
    """A conv with string padding the normalisation could not turn into numbers: "same" with an even kernel pads one
    more at the end than at the start (ATen pads that extra row and column explicitly, then convolves)."""
    x_v, w_v = node.inputs[:2]
    if len(x_v.shape) == 3:
        _batch_of_one(L, node, conv2d_padding)
        return
    _conv_same(L, node, x_v, w_v, node.inputs[2] if len(node.inputs) > 2 else None, node.attrs, node.outputs[0])


def _batch_of_one(L: Lowering, node: Node, lower) -> None:
    """An unbatched conv2d ([C, H, W], as ATen takes it) as a batch of one, through [1, ...] views (no copies): the
    conv kernels take 4-d tensors."""
    ins = list(node.inputs)
    ins[0] = L.view_value(ins[0], (1, *ins[0].shape))
    if node.attrs.get("has_residual"):
        ins[-1] = L.view_value(ins[-1], (1, *ins[-1].shape))
    out_v = node.outputs[0]
    out4 = L.stand_in(out_v, (1, *out_v.shape))
    lower(L, Node(node.name, node.op, ins, [out4], node.attrs, origin=list(node.origin)))
    r = L.ref(out4)
    L.bind(out_v, V.reshape(r, out_v.shape) or V.reshape(L.contiguous(r), out_v.shape))


def _conv_same(L: Lowering, node: Node, x_v: Value, w_v: Value, bias_v: Value | None, attrs: dict,
               out_v: Value) -> None:
    from ..passes.normalize import string_padding

    pads = string_padding(node, attrs["padding"], list(w_v.shape[2:]), list(attrs["dilation"]), list(attrs["stride"]))
    extra = [hi - lo for lo, hi in pads]
    if any(extra):
        n, c, h, w = x_v.shape
        padded = L.stand_in(x_v, (n, c, h + extra[0], w + extra[1]))
        src = L.ref(x_v)
        i64 = "int64"

        def build(load) -> X.Expr:
            ih, iw = X.Index(i64, 2), X.Index(i64, 3)
            guard = X.Binary("bool", "and", _in_range(ih, h), _in_range(iw, w))
            return L.gather(src, (X.Index(i64, 0), X.Index(i64, 1), ih, iw), guard, 0)

        L.generated(L.fresh(padded), build)
        x_v = padded
    synth = Node(node.name, "conv2d.default", [x_v, w_v] + ([bias_v] if bias_v is not None else []), [out_v],
                 {**attrs, "padding": [lo for lo, _ in pads]}, origin=list(node.origin))
    conv2d(L, synth)


@lowers("conv1d.default", "conv1d.padding", kernels=("conv2d", "gemm"))
def conv1d(L: Lowering, node: Node) -> None:
    """conv1d as conv2d over [N, C, 1, L] views of the input, the weight and the result (no copies)."""
    x_v, w_v = node.inputs[:2]
    bias_v = node.inputs[2] if len(node.inputs) > 2 else None
    out_v = node.outputs[0]
    a = node.attrs
    batched = len(x_v.shape) == 3
    x4 = L.view_value(x_v, ((x_v.shape[0],) if batched else (1,)) + (x_v.shape[-2], 1, x_v.shape[-1]))
    w4 = L.view_value(w_v, (w_v.shape[0], w_v.shape[1], 1, w_v.shape[2]))
    out4 = L.stand_in(out_v, ((out_v.shape[0],) if batched else (1,)) + (out_v.shape[-2], 1, out_v.shape[-1]))
    pad = a["padding"]
    attrs = {"stride": [1, *a["stride"]], "dilation": [1, *a["dilation"]], "groups": a["groups"],
             "padding": pad if isinstance(pad, str) else [0, *_pair(pad, node)[:1]]}
    if isinstance(pad, str):
        _conv_same(L, node, x4, w4, bias_v, attrs, out4)
    else:
        conv2d(L, Node(node.name, "conv2d.default", [x4, w4] + ([bias_v] if bias_v is not None else []), [out4],
                       attrs, origin=list(node.origin)))
    r = L.ref(out4)
    L.bind(out_v, V.reshape(r, out_v.shape) or V.reshape(L.contiguous(r), out_v.shape))


def _split_apart(L: Lowering, x_v: Value, w_v: Value, out_v: Value) -> bool:
    """Does the target split this conv's K across blocks (`CodegenTarget.conv_splits`), so that it runs better as
    a conv than as a GEMM of as few tiles?"""
    n, _, ho, wo = out_v.shape
    return L.target.plans_convs and L.target.conv_splits(n * ho * wo, w_v.shape[0], math.prod(w_v.shape[1:]),
                                                           1) > 1


def _conv_is_gemm(node: Node) -> bool:
    """A 1x1 conv with stride 1, no padding and one group is a batched GEMM over the pixels: weight [O, C] times
    input [C, H*W] per image. GEMM libraries run it on tensor cores; a direct conv kernel would not."""
    a = node.attrs
    w = node.inputs[1]
    return (len(w.shape) == 4 and tuple(w.shape[2:]) == (1, 1) and list(a["stride"]) == [1, 1]
            and _pair(a["padding"], node) == [0, 0] and int(a["groups"]) == 1 and w.kind == "weight")


def _folded_view(out: TensorRef, n: int, o: int, h: int, w: int) -> TensorRef:
    """A [O, N*H*W] GEMM result as the IR's [N, O, H, W] value (channel-major memory)."""
    return TensorRef(out.buffer, (n, o, h, w), (h * w, n * h * w, w, 1), out.offset)


def _as_folded(L: Lowering, ref: TensorRef, name: str) -> TensorRef:
    """An [N, C, H, W] activation as the [C, N*H*W] matrix of a batch-folded GEMM: a view when it is channel-major
    already, else a copy into channel-major memory."""
    n, c, h, w = ref.shape
    m = V.reshape(V.permute(ref, [1, 0, 2, 3]), (c, n * h * w))
    if m is not None:
        return m
    copy = L.scratch(f"{name}.channel_major", L.dtype_of(ref), (c, n, h, w))
    L.generated(copy, lambda load: load(V.permute(ref, [1, 0, 2, 3])))
    return V.reshape(copy, (c, n * h * w))


def _conv1x1_as_gemm(L: Lowering, node: Node, has_bias: bool, has_residual: bool, activation: Activation) -> None:
    x_v, w_v, out_v = node.inputs[0], node.inputs[1], node.outputs[0]
    n, c, h, wd = x_v.shape
    o = w_v.shape[0]
    if L.batch_folded(out_v):
        # one GEMM for the whole batch: out[O, N*H*W] = w[O, C] @ x[C, N*H*W]
        b = _as_folded(L, L.ref(x_v), node.name)
        bias = V.expand(V.reshape(L.ref(node.inputs[2]), (o, 1)), (o, n * h * wd)) if has_bias else None
        res = _as_folded(L, L.ref(node.inputs[-1]), f"{node.name}.residual") if has_residual else None
        gemm(L, node, V.reshape(L.ref(w_v), (o, c)), b, bias, residual=res, activation=activation,
             view=lambda out: _folded_view(out, n, o, h, wd))
        return
    x = L.contiguous(L.ref(x_v))
    b = V.reshape(x, (n, c, h * wd))
    a = V.expand(V.reshape(L.ref(w_v), (o, c)), (n, o, c))
    bias = V.expand(V.reshape(L.ref(node.inputs[2]), (o, 1)), (n, o, h * wd)) if has_bias else None
    res = V.reshape(L.contiguous(L.ref(node.inputs[-1])), (n, o, h * wd)) if has_residual else None
    gemm(L, node, a, b, bias, residual=res, activation=activation)


def _conv_im2col_gemm(L: Lowering, node: Node, has_bias: bool, has_residual: bool, activation: Activation
                      ) -> None:
    """On a GPU, a conv as one copy plus one GEMM on tensor cores: gather the patches (im2col, with the zero
    padding as the gather's fill) and multiply by the weight viewed as [O, C*kh*kw]. Costs the patch matrix in
    memory (kh*kw times the input); buys the GEMM library's speed. With the batch folded (channel-major
    activations), the patches of all images are one matrix [C*kh*kw, N*Ho*Wo] and the conv one GEMM."""
    a = node.attrs
    x_v, w_v, out_v = node.inputs[0], node.inputs[1], node.outputs[0]
    n, c, h, wd = x_v.shape
    o, _, kh, kw = w_v.shape
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], _pair(a["padding"], node), a["dilation"]
    ho, wo = out_v.shape[2:]
    src = L.ref(x_v)
    folded = L.batch_folded(out_v)
    i64 = "int64"
    # the patch matrix's dims, and which of them index the image, the channel and the window
    if folded:
        cols = L.scratch(f"{node.name}.im2col", x_v.dtype, (c, kh, kw, n, ho, wo))
        ni, ci, ri, si, hi, wi = 3, 0, 1, 2, 4, 5
    else:
        cols = L.scratch(f"{node.name}.im2col", x_v.dtype, (n, c, kh, kw, ho, wo))
        ni, ci, ri, si, hi, wi = 0, 1, 2, 3, 4, 5

    def build(load) -> X.Expr:
        ih = _affine(X.Index(i64, hi), sh, X.Index(i64, ri), dh, -ph)
        iw = _affine(X.Index(i64, wi), sw, X.Index(i64, si), dw, -pw)
        guard = None
        if ph or pw:
            guard = X.Binary("bool", "and", _in_range(ih, h), _in_range(iw, wd))
        return L.gather(src, (X.Index(i64, ni), X.Index(i64, ci), ih, iw), guard, 0)

    L.generated(cols, build)
    k = c * kh * kw
    wmat = V.reshape(L.contiguous(L.ref(w_v)), (o, k))
    if folded:
        bias = V.expand(V.reshape(L.ref(node.inputs[2]), (o, 1)), (o, n * ho * wo)) if has_bias else None
        res = _as_folded(L, L.ref(node.inputs[-1]), f"{node.name}.residual") if has_residual else None
        gemm(L, node, wmat, V.reshape(cols, (k, n * ho * wo)), bias, residual=res, activation=activation,
             view=lambda out: _folded_view(out, n, o, ho, wo))
        return
    b = V.reshape(cols, (n, k, ho * wo))
    w = V.expand(wmat, (n, o, k))
    bias = V.expand(V.reshape(L.ref(node.inputs[2]), (o, 1)), (n, o, ho * wo)) if has_bias else None
    res = V.reshape(L.contiguous(L.ref(node.inputs[-1])), (n, o, ho * wo)) if has_residual else None
    gemm(L, node, w, b, bias, residual=res, activation=activation)


def _affine(outer: X.Expr, stride: int, inner: X.Expr, dilation: int, base: int) -> X.Expr:
    """outer * stride + inner * dilation + base, in int64."""
    i64 = "int64"
    e = X.Binary(i64, "add", X.Binary(i64, "mul", outer, X.Const(i64, stride)),
                 X.Binary(i64, "mul", inner, X.Const(i64, dilation)))
    return X.Binary(i64, "add", e, X.Const(i64, base)) if base else e


def _in_range(i: X.Expr, n: int) -> X.Expr:
    return X.Binary("bool", "and", X.Binary("bool", "ge", i, X.Const("int64", 0)),
                    X.Binary("bool", "lt", i, X.Const("int64", n)))


def _pair(p, node: Node) -> list[int]:
    if isinstance(p, str):
        raise UnsupportedOpError(node.name, f"aten.{node.op}", "any", f"string padding {p!r}")
    return list(p) if isinstance(p, list | tuple) else [int(p), int(p)]


# ---- attention -----------------------------------------------------------------------------------------------------


@lowers("scaled_dot_product_attention.default", kernels=("attention",))
def sdpa(L: Lowering, node: Node) -> None:
    a = node.attrs
    if a.get("dropout_p", 0.0):
        raise UnsupportedOpError(node.name, "aten.scaled_dot_product_attention", L.target.name, "dropout_p > 0")
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
    L.emit(AttentionKernel(float(scale) if scale is not None else 1.0 / math.sqrt(d), bool(a.get("is_causal")),
                           mask_kind, b, h, hk, t, lk, d, v.shape[-1]), args, [out])


@lowers("npu.attention", kernels=("attention", "gemm"))
def attention(L: Lowering, node: Node) -> None:
    a = node.attrs
    q, k, v = (L.contiguous(L.ref(x)) for x in node.inputs[:3])
    b, h, t, d = q.shape
    hk, lk = k.shape[1], k.shape[2]
    rows = L.target.attention_gemm_min_rows
    tiled = L.target.attention_on_tensor_cores(tuple(x.dtype for x in node.inputs[:3]), a.get("probs_dtype", "float32"),
                                               t, d, v.shape[-1], (q, k, v))
    if rows and t >= rows and not tiled:
        # (a valid-length bound is an optimisation only: the mask hides the keys past it, they add exactly zero)
        mask = V.expand(L.ref(node.inputs[3]), (b, h, t, lk)) if a["has_mask"] else None
        _attention_as_gemms(L, node, q, k, v, mask, a["has_mask"] and node.inputs[3].dtype == "bool",
                            float(a["scale"]), bool(a["is_causal"]), a.get("scores_dtype", "float32"),
                            a.get("probs_dtype", "float32"))
        return
    args = [q, k, v]
    mask_kind = "none"
    if a["has_mask"]:
        m_v = node.inputs[3]
        mask_kind = "bool" if m_v.dtype == "bool" else "additive"
        args.append(V.expand(L.ref(m_v), (b, h, t, lk)))
    if a.get("valid_len"):
        args.append(L.contiguous(L.ref(node.inputs[-1])))
    out_v = node.outputs[0]
    if tiled and _read_head_last(L, out_v):
        # kept [b, t, h, dv] in memory (the tiled kernel stores through the output's strides): the transpose that
        # reads it back to [b, t, h * dv] for the output projection is then a view, not a copy
        buf = L.new_buffer(out_v.name, "arena", out_v.dtype, out_v.type.numel)
        dv = v.shape[-1]
        out = TensorRef(buf.id, (b, h, t, dv), (t * h * dv, dv, h * dv, 1), 0)
        L.bind(out_v, out)
    else:
        out = L.fresh(out_v)
    k = L.emit(AttentionKernel(float(a["scale"]), bool(a["is_causal"]), mask_kind, b, h, hk, t, lk, d, v.shape[-1],
                               a.get("scores_dtype", "float32"), a.get("probs_dtype", "float32"),
                               bool(a.get("valid_len")), bool(a.get("online_softmax"))), args, [out])
    # key splits (flash decoding, or a tiled attention's), their scratch and the mask's tile table: the target's plan
    L.plan(k)


def _read_head_last(L: Lowering, v: Value) -> bool:
    """Is every reader of the attention output `v` ([b, h, t, dv], not a graph output) a swap of its heads and rows
    (`transpose(1, 2)`, `permute(0, 2, 1, 3)`), as the models put the heads back together?"""
    users = L.users(v)
    if not users or len(v.shape) != 4 or L.is_graph_output(v):
        return False
    for n in users:
        if n.op == "transpose.int":
            if sorted(d % 4 for d in (n.attrs["dim0"], n.attrs["dim1"])) != [1, 2]:
                return False
        elif n.op == "permute.default":
            if [d % 4 for d in n.attrs["dims"]] != [0, 2, 1, 3]:
                return False
        else:
            return False
    return True


def _attention_as_gemms(L: Lowering, node: Node, q: TensorRef, k: TensorRef, v: TensorRef, mask: TensorRef | None,
                        mask_is_bool: bool, scale: float, is_causal: bool, sd: str, pd: str) -> None:
    """Attention over many query rows as the graph computes it, on a GEMM library: scores = q @ k^T (rounded to
    the scores dtype), the row softmax with its scale and mask (rounded to the probabilities dtype), then probs @
    v. Grouped-query heads need no expanded K/V: the query heads of one KV head are stacked as the rows of one
    GEMM ([b, kv_heads, group * t, d])."""
    from .rows import attention_probs

    out_v = node.outputs[0]
    b, h, t, d = q.shape
    hk, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
    g = h // hk
    scores = L.scratch(f"{node.name}.scores", sd, (b, hk, g * t, lk))
    L.emit(GemmKernel(g * t, lk, d, (b, hk)), [L.gemm_operand(V.reshape(q, (b, hk, g * t, d))),
                                               L.gemm_operand(V.transpose(k, 2, 3))], [scores])
    probs = L.scratch(f"{node.name}.probs", pd, (b, hk, g * t, lk))
    attention_probs(L, V.reshape(scores, (b, h, t, lk)), V.reshape(probs, (b, h, t, lk)), mask, mask_is_bool, scale,
                    is_causal, sd, pd)
    out = L.scratch(out_v.name, out_v.dtype, (b, hk, g * t, dv))
    L.emit(GemmKernel(g * t, dv, lk, (b, hk)), [probs, L.gemm_operand(v)], [out])
    L.bind(out_v, V.reshape(out, out_v.shape))
