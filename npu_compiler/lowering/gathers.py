"""Generated kernels that read or write at computed positions: embedding rows, the rotated half of RoPE, pooling
windows with padding, the KV-cache write (a scatter), and cat and the tensor factories."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..dtypes import is_float, itemsize
from ..errors import UnsupportedOpError
from ..expr import nodes as X
from ..expr.aten_table import cast, const
from ..ir.graph import Node, Value
from ..kernels import Scatter
from . import views as V
from .greedy import Pending
from .registry import lowers

if TYPE_CHECKING:
    from .lower import Lowering

I64, F32 = "int64", "float32"


def _i(v: int) -> X.Expr:
    return X.Const(I64, int(v))


def _b(op: str, a: X.Expr, b: X.Expr, dtype: str = I64) -> X.Expr:
    return X.Binary(dtype, op, a, b)


def _in_range(i: X.Expr, lo: X.Expr, hi: X.Expr) -> X.Expr:
    return _b("and", _b("ge", i, lo, "bool"), _b("lt", i, hi, "bool"), "bool")


def _all(conds: list[X.Expr]) -> X.Expr | None:
    out = None
    for c in conds:
        out = c if out is None else _b("and", out, c, "bool")
    return out


# ---- embedding, RoPE ------------------------------------------------------------------------------------------------


@lowers("embedding.default")
def embedding(L: Lowering, node: Node) -> None:
    """out[..., j] = weight[ids[...], j]: a gather of rows. An id outside the table is refused (the reference) or
    reads zeros (a GPU; the runtime checks ids given from the host against their range before the run)."""
    w = L.ref(node.inputs[0])
    ids = L.ref(node.inputs[1], pending_ok=True)
    out_v = node.outputs[0]
    out = L.fresh(out_v)
    rank = len(out_v.shape)

    def build(load) -> X.Expr:
        row = cast(load(ids, strides=tuple(ids.strides) + (0,)), I64)
        return cast(L.gather(w, (row, X.Index(I64, rank - 1))), out_v.dtype)

    L.generated(out, build)


@lowers("npu.rope")
def rope(L: Lowering, node: Node) -> None:
    """x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[..., h:], x[..., :h]); each product rounded to
    `product_dtype` as the unfused graph stores it. q and k are read through their strides (transposed views)."""
    x_v = node.inputs[0]
    x = L.ref(x_v)
    cos = V.expand(L.ref(node.inputs[1], pending_ok=True), x_v.shape)
    sin = V.expand(L.ref(node.inputs[2], pending_ok=True), x_v.shape)
    out_v = node.outputs[0]
    out = L.fresh(out_v)
    rank = len(x_v.shape)
    half = x_v.shape[-1] // 2
    pd = node.attrs.get("product_dtype")

    def rnd(e: X.Expr) -> X.Expr:
        return X.Cast(F32, X.Cast(pd, e)) if pd in ("float16", "bfloat16") else e

    def build(load) -> X.Expr:
        j = X.Index(I64, rank - 1)
        first = _b("lt", j, _i(half), "bool")
        partner = X.Where(I64, first, _b("add", j, _i(half)), _b("sub", j, _i(half)))
        other = cast(L.gather(x, tuple(X.Index(I64, d) for d in range(rank - 1)) + (partner,)), F32)
        rot = X.Where(F32, first, X.Unary(F32, "neg", other), other)
        a = rnd(_b("mul", cast(load(x), F32), cast(load(cos), F32), F32))
        b = rnd(_b("mul", rot, cast(load(sin), F32), F32))
        return cast(_b("add", a, b, F32), out_v.dtype)

    origins: list[str] = []
    expr = build(L.loader(out.shape, (), origins))
    if L.greedy_fusion and id(out_v) not in L._graph_outputs:
        # pending: a consumer that reads it element for element (the cache write of k) computes it in place
        L.pending[out.buffer] = Pending(expr, tuple(out.shape), [*origins, *node.origin], node)
        return
    L._emit_generated(out, expr, (), origins)


# ---- the cache write ------------------------------------------------------------------------------------------------


@lowers("index_copy.default")
def index_copy(L: Lowering, node: Node) -> None:
    """out = self with out[..., index[j], ...] = source[..., j, ...] along `dim`: a scatter kernel over the source.
    The KV-cache write is done in place when nothing reads the old cache afterwards (never a copy of the cache)."""
    self_v, index_v, src_v = node.inputs
    dim = V.norm_dim(node.attrs["dim"], len(self_v.shape))
    idx = L.ref(index_v)
    src = L.ref(src_v, pending_ok=True)  # read through its strides, converted to the cache's dtype
    out_v = node.outputs[0]
    if L.can_overwrite(self_v, out_v):
        out = L.ref(self_v)
        L.flush_readers(out.buffer)
        buf = L.buffers[out.buffer]
        if buf.kind == "input":
            L._inplace_inputs[buf.id] = buf.name
        L.bind(out_v, out)
    else:
        out = L.fresh(out_v)
        base = L.ref(self_v, pending_ok=True)
        L.generated(out, lambda load: cast(load(base), out_v.dtype))
    shape = tuple(src_v.shape)
    origins: list[str] = []
    load = L.loader(shape, (), origins)
    value = cast(load(src), out_v.dtype)
    istrides = tuple(idx.strides[0] if d == dim and idx.shape else 0 for d in range(len(shape)))
    position = cast(load(idx, strides=istrides), I64)
    L._emit_generated(out, value, (), origins, scatter=Scatter(dim, position, shape))


# ---- pooling --------------------------------------------------------------------------------------------------------


def _pool_window(a: dict) -> tuple[list[int], list[int]]:
    """Kernel and stride as pairs (ATen allows one value for both dims, and an empty stride means the kernel)."""
    ks = list(a["kernel_size"])
    ks = ks * 2 if len(ks) == 1 else ks
    stride = list(a["stride"]) or ks
    return ks, stride * 2 if len(stride) == 1 else stride


def _pair(p, node: Node) -> list[int]:
    if isinstance(p, str):
        raise UnsupportedOpError(node.name, f"aten.{node.op}", "any", f"string padding {p!r}")
    p = list(p) if isinstance(p, list | tuple) else [int(p)]
    return p * 2 if len(p) == 1 else p


def _window_reads(L: Lowering, node: Node, kernel: list[int], stride: list[int], padding: list[int],
                  dilation: list[int], fill: float):
    """The element of window position (RIndex 0, RIndex 1) for output (.., oh, ow), `fill` outside the input."""
    x = L.ref(node.inputs[0])
    rank = len(x.shape)
    h, w = x.shape[-2:]
    ih = _b("add", _b("mul", X.Index(I64, rank - 2), _i(stride[0])), _b("add", _b("mul", X.RIndex(I64, 0),
                                                                              _i(dilation[0])), _i(-padding[0])))
    iw = _b("add", _b("mul", X.Index(I64, rank - 1), _i(stride[1])), _b("add", _b("mul", X.RIndex(I64, 1),
                                                                              _i(dilation[1])), _i(-padding[1])))
    guard = _all([_in_range(ih, _i(0), _i(h)), _in_range(iw, _i(0), _i(w))])
    idx = tuple(X.Index(I64, d) for d in range(rank - 2)) + (ih, iw)
    return cast(L.gather(x, idx, guard, fill), F32), ih, iw


@lowers("max_pool2d.default")
def max_pool2d(L: Lowering, node: Node) -> None:
    a = node.attrs
    ks, stride = _pool_window(a)
    out_v = node.outputs[0]
    out = L.fresh_activation(out_v)
    # padding never wins: -inf, or the least value of an integer input (an int8 max pool of a quantized graph)
    x_dtype = node.inputs[0].dtype
    fill = float("-inf") if is_float(x_dtype) else -(1 << (8 * itemsize(x_dtype) - 1)) if x_dtype != "uint8" else 0
    value, _, _ = _window_reads(L, node, ks, stride, _pair(a["padding"], node), _pair(a["dilation"], node), fill)
    L._emit_generated(out, cast(X.Reduce(F32, "max", value), out_v.dtype), tuple(ks), [])


@lowers("avg_pool1d.default")
def avg_pool1d(L: Lowering, node: Node) -> None:
    """The 2-D pooling over [N, C, 1, L] views, with a window of height 1."""
    x_v, out_v = node.inputs[0], node.outputs[0]
    a = node.attrs
    x4 = L.view_value(x_v, (*x_v.shape[:-1], 1, x_v.shape[-1]))
    out4 = L.stand_in(out_v, (*out_v.shape[:-1], 1, out_v.shape[-1]))
    k = list(a["kernel_size"])[:1]
    attrs = {**a, "kernel_size": [1, *k], "stride": [1, *(list(a["stride"])[:1] or k)],
             "padding": [0, *_pair(a["padding"], node)[:1]]}
    avg_pool2d(L, Node(node.name, "avg_pool2d.default", [x4], [out4], attrs, origin=list(node.origin)))
    L.bind(out_v, V.reshape(L.ref(out4), out_v.shape))


@lowers("avg_pool2d.default")
def avg_pool2d(L: Lowering, node: Node) -> None:
    a = node.attrs
    ks, stride = _pool_window(a)
    pad = _pair(a["padding"], node)
    out_v = node.outputs[0]
    out = L.fresh(out_v)
    x_v = node.inputs[0]
    h, w = x_v.shape[-2:]
    rank = len(x_v.shape)
    value, _, _ = _window_reads(L, node, ks, stride, pad, [1, 1], 0.0)
    total = X.Reduce(F32, "sum", value)
    if a.get("divisor_override"):
        div: X.Expr = const(float(a["divisor_override"]), F32)
    else:
        hs = _b("sub", _b("mul", X.Index(I64, rank - 2), _i(stride[0])), _i(pad[0]))
        ws = _b("sub", _b("mul", X.Index(I64, rank - 1), _i(stride[1])), _i(pad[1]))
        he = _b("min", _b("add", hs, _i(ks[0])), _i(h + pad[0]))
        we = _b("min", _b("add", ws, _i(ks[1])), _i(w + pad[1]))
        if a.get("count_include_pad", True):
            count = _b("mul", _b("sub", he, hs), _b("sub", we, ws))
        else:
            count = _b("mul", _b("sub", _b("min", he, _i(h)), _b("max", hs, _i(0))),
                       _b("sub", _b("min", we, _i(w)), _b("max", ws, _i(0))))
        div = cast(count, F32)
    L._emit_generated(out, cast(_b("div", total, div, F32), out_v.dtype), tuple(ks), [])


@lowers("adaptive_avg_pool1d.default")
def adaptive_avg_pool1d(L: Lowering, node: Node) -> None:
    """The 2-D pooling over [N, C, 1, L] views."""
    x_v, out_v = node.inputs[0], node.outputs[0]
    x4 = L.view_value(x_v, (*x_v.shape[:-1], 1, x_v.shape[-1]))
    out4 = L.stand_in(out_v, (*out_v.shape[:-1], 1, out_v.shape[-1]))
    _adaptive_avg(L, x4, out4)
    L.bind(out_v, V.reshape(L.ref(out4), out_v.shape))


@lowers("adaptive_avg_pool2d.default", "_adaptive_avg_pool2d.default")
def adaptive_avg_pool2d(L: Lowering, node: Node) -> None:
    _adaptive_avg(L, node.inputs[0], node.outputs[0])


def _adaptive_avg(L: Lowering, x_v: Value, out_v: Value) -> None:
    """Output cell (i, j) averages rows [floor(i*H/OH), ceil((i+1)*H/OH)) and likewise columns; a global average
    (1 x 1) is a plain reduction over H and W."""
    h, w = x_v.shape[-2:]
    oh, ow = out_v.shape[-2:]
    rank = len(x_v.shape)
    out = L.fresh(out_v)
    if (oh, ow) == (1, 1):
        src = L.ref(x_v, pending_ok=True)
        origins: list[str] = []
        ostrides = tuple(src.strides[:rank - 2]) + (0, 0)
        body = cast(L.load_raw(src.buffer, ostrides, src.offset, tuple(src.strides[-2:]), out_v.shape, (h, w),
                               origins), F32)
        e = _b("div", X.Reduce(F32, "sum", body), const(h * w, F32), F32)
        L._emit_generated(out, cast(e, out_v.dtype), (h, w), origins)
        return
    x = L.ref(x_v)
    kh = max(-(-((i + 1) * h) // oh) - (i * h) // oh for i in range(oh))
    kw = max(-(-((j + 1) * w) // ow) - (j * w) // ow for j in range(ow))
    i, j = X.Index(I64, rank - 2), X.Index(I64, rank - 1)
    h0 = _b("div", _b("mul", i, _i(h)), _i(oh))
    h1 = _b("div", _b("add", _b("mul", _b("add", i, _i(1)), _i(h)), _i(oh - 1)), _i(oh))
    w0 = _b("div", _b("mul", j, _i(w)), _i(ow))
    w1 = _b("div", _b("add", _b("mul", _b("add", j, _i(1)), _i(w)), _i(ow - 1)), _i(ow))
    ih, iw = _b("add", h0, X.RIndex(I64, 0)), _b("add", w0, X.RIndex(I64, 1))
    guard = _all([_b("lt", ih, h1, "bool"), _b("lt", iw, w1, "bool")])
    idx = tuple(X.Index(I64, d) for d in range(rank - 2)) + (ih, iw)
    total = X.Reduce(F32, "sum", cast(L.gather(x, idx, guard, 0.0), F32))
    count = cast(_b("mul", _b("sub", h1, h0), _b("sub", w1, w0)), F32)
    L._emit_generated(out, cast(_b("div", total, count, F32), out_v.dtype), (kh, kw), [])


# ---- cat and the tensor factories ----------------------------------------------------------------------------------


@lowers("cat.default")
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


# Tensors of one value: the shape and dtype are the IR's output's (a `_like` or `new_` op reads nothing of its input).
# An `empty` tensor's elements are undefined until written: zeros are as good as any (and deterministic).
_FILLS = {"zeros.default": 0, "ones.default": 1, "zeros_like.default": 0, "ones_like.default": 1,
          "new_zeros.default": 0, "new_ones.default": 1, "zero.default": 0, "empty.memory_format": 0,
          "empty_like.default": 0, "new_empty.default": 0, "empty_strided.default": 0, "new_empty_strided.default": 0}
_FILLED = {"full.default": "fill_value", "full_like.default": "fill_value", "new_full.default": "fill_value",
           "scalar_tensor.default": "s", "fill.Scalar": "value"}


@lowers("arange.default", "arange.start", "arange.start_step", *_FILLS, *_FILLED)
def factory(L: Lowering, node: Node) -> None:
    out_v = node.outputs[0]
    out = L.fresh(out_v)
    a, dt = node.attrs, out_v.dtype
    if node.op in ("arange.default", "arange.start", "arange.start_step"):
        start = a.get("start", 0)
        step = a.get("step", 1)
        e: X.Expr = X.Binary(dt, "add", const(start, dt),
                             X.Binary(dt, "mul", cast(X.Index(I64, 0), dt), const(step, dt)))
    else:
        value = _FILLS[node.op] if node.op in _FILLS else a.get(_FILLED[node.op], 0)
        e = const(value, dt)
    L.generated(out, lambda load: e)
