"""`convolution` (core ATen's one convolution: 1-d, 2-d and 3-d, transposed or not) and `col2im`, onto the conv1d and
conv2d the compiler lowers.

A 3-d convolution is a sum over the kernel's depth of 2-d convolutions of depth slices (the depth folded into the
batch). A transposed convolution is the plain convolution of the input spread out by the stride (zeros between its
elements), padded by dilation * (kernel - 1) - padding (and output_padding at the end), with the kernel flipped and
its in/out channels swapped per group. col2im places each kernel position's columns on the canvas the same way and
sums them.
"""

from __future__ import annotations

from ..dtypes import HALF_DTYPES
from ..ir.graph import Node, Value
from .registry import Rewriter, decomposes

F32 = "float32"
_EMITS = ("conv1d.default", "conv2d.default", "constant_pad_nd.default", "slice.Tensor", "select.int",
          "permute.default", "reshape.default", "add.Tensor", "unsqueeze.default", "flip.default", "transpose.int",
          "to.dtype", "zeros.default")


def _spread(rw: Rewriter, x: Value, axis: int, stride: int) -> Value:
    """`x` with stride - 1 zeros between its elements along `axis` (none after the last)."""
    if stride == 1 or x.shape[axis] == 0:
        return x
    n = x.shape[axis]
    v = rw.op("unsqueeze.default", x, dim=axis + 1)
    pads = [0, 0] * (len(v.shape) - axis - 2) + [0, stride - 1]
    v = rw.op("constant_pad_nd.default", v, pad=pads, value=0)
    shape = list(x.shape)
    shape[axis] = n * stride
    v = rw.op("reshape.default", v, shape=shape)
    return rw.op("slice.Tensor", v, dim=axis, start=0, end=(n - 1) * stride + 1, step=1)


def _conv(rw: Rewriter, x: Value, w: Value, b: Value | None, stride: list[int], padding: list[int],
          dilation: list[int], groups: int) -> Value:
    """A plain (not transposed) 1-, 2- or 3-d convolution."""
    nd = len(w.shape) - 2
    bias = [b] if b is not None else []
    if nd in (1, 2):
        return rw.op(f"conv{nd}d.default", x, w, *bias, stride=stride, padding=padding, dilation=dilation,
                     groups=groups)
    out_dtype = x.dtype
    if x.dtype in HALF_DTYPES:  # the depth slices' sums rounded once, as one convolution rounds
        x, w = rw.op("to.dtype", x, dtype=F32), rw.op("to.dtype", w, dtype=F32)
        b = rw.op("to.dtype", b, dtype=F32) if b is not None else None
    n, (sd, sh, sw), (pd, ph, pw), (dd, dh, dw) = x.shape[0], stride, padding, dilation
    kd = w.shape[2]
    depth = (x.shape[2] + 2 * pd - dd * (kd - 1) - 1) // sd + 1
    if pd:
        x = rw.op("constant_pad_nd.default", x, pad=[0, 0, 0, 0, pd, pd], value=0)
    total = None
    for k in range(kd):
        xs = rw.op("slice.Tensor", x, dim=2, start=k * dd, end=k * dd + (depth - 1) * sd + 1, step=sd)
        xs = rw.op("permute.default", xs, dims=[0, 2, 1, 3, 4])
        xs = rw.op("reshape.default", xs, shape=[n * depth, x.shape[1], x.shape[3], x.shape[4]])
        y = rw.op("conv2d.default", xs, rw.op("select.int", w, dim=2, index=k), stride=[sh, sw], padding=[ph, pw],
                  dilation=[dh, dw], groups=groups)
        total = y if total is None else rw.op("add.Tensor", total, y)
    o, ho, wo = total.shape[1:]
    y = rw.op("permute.default", rw.op("reshape.default", total, shape=[n, depth, o, ho, wo]), dims=[0, 2, 1, 3, 4])
    if b is not None:
        y = rw.op("add.Tensor", y, rw.op("reshape.default", b, shape=[o, 1, 1, 1]))
    return y if y.dtype == out_dtype else rw.op("to.dtype", y, dtype=out_dtype)


@decomposes("convolution.default", "conv3d.default", "conv_transpose1d.default", "conv_transpose2d.input",
            "conv_transpose3d.input", emits=_EMITS)
def _convolution(rw: Rewriter, node: Node) -> Value:
    """`convolution` and the conv ops that torch.export keeps above it (conv3d, conv_transposeNd; those take an
    unbatched input too)."""
    x, w = node.inputs[:2]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    a = node.attrs
    nd = len(w.shape) - 2
    out = node.outputs[0]
    if out.type.numel == 0:  # (a transposed convolution may produce no rows)
        return rw.op("zeros.default", size=list(out.shape), dtype=out.dtype)

    def per_dim(v: list[int]) -> list[int]:
        return list(v) * nd if len(v) == 1 else list(v)

    unbatched = len(x.shape) == nd + 1
    if unbatched:
        x = rw.op("unsqueeze.default", x, dim=0)
    stride, padding, dilation = per_dim(a["stride"]), per_dim(a["padding"]), per_dim(a["dilation"])
    groups = int(a["groups"])
    transposed = a.get("transposed", node.op.startswith("conv_transpose"))
    out_pad = per_dim(a["output_padding"]) if a.get("output_padding") else [0] * nd
    y = _transposed(rw, x, w, b, stride, padding, dilation, groups, out_pad, nd) if transposed else \
        _conv(rw, x, w, b, stride, padding, dilation, groups)
    return rw.op("reshape.default", y, shape=list(y.shape[1:])) if unbatched else y


def _transposed(rw: Rewriter, x: Value, w: Value, b: Value | None, stride: list[int], padding: list[int],
                dilation: list[int], groups: int, out_pad: list[int], nd: int) -> Value:
    for i in range(nd):
        x = _spread(rw, x, 2 + i, stride[i])
    k = list(w.shape[2:])
    pads = []
    for i in reversed(range(nd)):
        edge = dilation[i] * (k[i] - 1) - padding[i]
        pads += [edge, edge + out_pad[i]]
    if any(pads):
        x = rw.op("constant_pad_nd.default", x, pad=pads, value=0)
    # [C_in, C_out / g, *k] -> [C_out, C_in / g, *k], flipped
    cin, cout_g = w.shape[:2]
    wt = rw.op("reshape.default", w, shape=[groups, cin // groups, cout_g, *k])
    wt = rw.op("transpose.int", wt, dim0=1, dim1=2)
    wt = rw.op("reshape.default", wt, shape=[groups * cout_g, cin // groups, *k])
    wt = rw.op("flip.default", wt, dims=list(range(2, 2 + nd)))
    return _conv(rw, x, wt, b, [1] * nd, [0] * nd, dilation, groups)


@decomposes("col2im.default", emits=_EMITS)
def _col2im(rw: Rewriter, node: Node) -> Value:
    """Each kernel position's columns [N, C, Lh, Lw] spread by the stride onto the padded canvas at its offset, summed
    (in fp32 for a half input), then the padding cut off."""
    x, out = node.inputs[0], node.outputs[0]
    a = node.attrs
    (h, w), (kh, kw) = a["output_size"], a["kernel_size"]
    (dh, dw), (ph, pw), (sh, sw) = a["dilation"], a["padding"], a["stride"]
    lh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    lw = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    lead = list(out.shape[:-3])
    c = out.shape[-3]
    acc = F32 if x.dtype in HALF_DTYPES else x.dtype
    cols = rw.op("reshape.default", x if x.dtype == acc else rw.op("to.dtype", x, dtype=acc),
                 shape=lead + [c, kh, kw, lh, lw])
    r = len(lead) + 1  # the kernel's row axis in `cols`
    total = None
    for i in range(kh):
        for j in range(kw):
            patch = rw.op("select.int", rw.op("select.int", cols, dim=r, index=i), dim=r, index=j)
            patch = _spread(rw, _spread(rw, patch, r, sh), r + 1, sw)
            top, left = i * dh, j * dw
            patch = rw.op("constant_pad_nd.default", patch, value=0,
                          pad=[left, w + 2 * pw - left - patch.shape[-1], top, h + 2 * ph - top - patch.shape[-2]])
            total = patch if total is None else rw.op("add.Tensor", total, patch)
    total = rw.op("slice.Tensor", rw.op("slice.Tensor", total, dim=-2, start=ph, end=ph + h, step=1), dim=-1,
                  start=pw, end=pw + w, step=1)
    return total if total.dtype == out.dtype else rw.op("to.dtype", total, dtype=out.dtype)


@decomposes("im2col.default", emits=("constant_pad_nd.default", "slice.Tensor", "stack.default", "reshape.default"))
def _im2col(rw: Rewriter, node: Node) -> Value:
    """`F.unfold`: the input padded, one strided slice per kernel position, stacked after the channels (row c * kh *
    kw + i * kw + j of the result), the blocks flattened."""
    x, a = node.inputs[0], node.attrs
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = ([v[0], v[0]] if len(v) == 1 else list(v) for v in (
        a["kernel_size"], a["dilation"], a["padding"], a["stride"]))
    h, w = x.shape[-2:]
    lh, lw = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if ph or pw:
        x = rw.op("constant_pad_nd.default", x, pad=[pw, pw, ph, ph], value=0)
    rank = len(x.shape)
    blocks = []
    for i in range(kh):
        rows = rw.op("slice.Tensor", x, dim=rank - 2, start=i * dh, end=i * dh + (lh - 1) * sh + 1, step=sh)
        for j in range(kw):
            blocks.append(rw.op("slice.Tensor", rows, dim=rank - 1, start=j * dw, end=j * dw + (lw - 1) * sw + 1,
                                step=sw))
    y = rw.op("stack.default", *blocks, dim=rank - 2)  # [.., C, kh * kw, LH, LW]
    return rw.op("reshape.default", y, shape=list(node.outputs[0].shape))
