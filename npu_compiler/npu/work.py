"""What a kernel asks of the NPU, in the model's own terms, and the one translation from a program's kernels to it.

The model (`model.py`) knows four kinds of work: a GEMM, a convolution, an attention, and vector work (elementwise,
norms, softmax, pooling, gathers: operations and bytes). `kernel_work` is the only place that reads a
`KernelCall`'s kind and params; when kernels become typed records, only that function changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..dtypes import itemsize
from ..expr import nodes as X
from ..program import CompiledProgram, KernelCall, TensorRef


@dataclass(frozen=True)
class Operand:
    """A tensor a kernel reads or writes: its distinct bytes, and whether it lives on chip (an intermediate held in
    the activation buffer between kernels) or in DRAM."""

    bytes: int
    on_chip: bool = False


@dataclass(frozen=True)
class GemmWork:
    """`batch` independent products C[m, n] = A[m, k] @ B[k, n]. B is the operand the array holds stationary in the
    weight-stationary dataflow (the weights when one operand is a weight). Byte counts cover all batches."""

    m: int
    n: int
    k: int
    a: Operand
    b: Operand
    out: Operand
    a_elem: int = 2  # bytes per element
    b_elem: int = 2
    out_elem: int = 2
    batch: int = 1
    extra: tuple[Operand, ...] = ()  # epilogue operands (bias, residual), read once
    epilogue_ops: int = 0  # vector operations per output element (bias, residual add, activation, scaling)
    label: str = "gemm"

    @property
    def macs(self) -> int:
        return self.batch * self.m * self.n * self.k


@dataclass(frozen=True)
class ConvWork:
    """A 2-D convolution (NCHW input, OIHW weight); the model maps it onto the array as a GEMM over image patches."""

    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    ho: int
    wo: int
    x: Operand
    weight: Operand
    out: Operand
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    elem: int = 2
    extra: tuple[Operand, ...] = ()
    epilogue_ops: int = 0
    label: str = "conv2d"

    @property
    def macs(self) -> int:
        return self.n * self.o * self.ho * self.wo * (self.c // self.groups) * self.kh * self.kw


@dataclass(frozen=True)
class AttentionWork:
    """softmax(scale * Q K^T + mask) V for `batch` x `heads` query heads sharing `kv_heads` key/value heads."""

    batch: int
    heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    v_dim: int
    q: Operand
    k: Operand
    v: Operand
    out: Operand
    mask: Operand | None = None
    elem: int = 2
    label: str = "attention"

    @property
    def macs(self) -> int:
        return self.batch * self.heads * self.q_len * self.kv_len * (self.head_dim + self.v_dim)


@dataclass(frozen=True)
class VectorWork:
    """Work for the vector unit: `ops` elementwise operations over the bytes it reads and writes."""

    ops: int
    reads: tuple[Operand, ...]
    writes: tuple[Operand, ...]
    label: str = "vector"


Work = GemmWork | ConvWork | AttentionWork | VectorWork

# Operations per element of the vector kinds (exp, max, subtract, sum, divide for a softmax; square, mean, rsqrt,
# scale for RMSNorm; two products and a sum for RoPE).
_OPS_PER_ELEMENT = {"softmax": 5, "log_softmax": 6, "rmsnorm": 4, "rope": 3}


def kernel_work(program: CompiledProgram, k: KernelCall, *, arena_on_chip: bool = False,
                context_len: int | None = None) -> Work:
    """What kernel `k` of `program` asks of the NPU. `arena_on_chip`: the program's intermediates (its arena) stay
    in the activation buffer between kernels. `context_len`: tokens an attention kernel with a valid-length bound
    reads from its cache (decode); None means the whole static cache."""

    def op(ref: TensorRef, numel: int | None = None) -> Operand:
        buf = program.buffers[ref.buffer]
        n = footprint(ref) if numel is None else numel
        return Operand(min(n, buf.numel) * itemsize(buf.dtype), arena_on_chip and buf.kind == "arena")

    def elem(ref: TensorRef) -> int:
        return itemsize(program.buffers[ref.buffer].dtype)

    p = k.params
    if k.kind == "gemm":
        return _gemm_work(program, k, op, elem)
    if k.kind == "conv2d":
        x, w, out = k.args[0], k.args[1], k.outs[0]
        n, c, h, wd = x.shape
        o, _, kh, kw = w.shape
        ho, wo = out.shape[2:]
        extra = tuple(op(r) for r in k.args[2:])
        return ConvWork(n, c, h, wd, o, kh, kw, ho, wo, op(x), op(w), op(out), tuple(p["stride"]),
                        tuple(p["padding"]), tuple(p["dilation"]), int(p["groups"]), elem(x), extra,
                        _epilogue_ops(p), k.name)
    if k.kind == "attention":
        q, kk, v = k.args[:3]
        kv_len = int(p["kv_len"])
        if p.get("valid_len") and context_len is not None:
            kv_len = max(1, min(kv_len, context_len))
        b, h, t, d = int(p["batch"]), int(p["heads"]), int(p["q_len"]), int(p["head_dim"])
        hk, dv = int(p["kv_heads"]), int(p["v_dim"])
        full = int(p["kv_len"])
        mask = None
        if p.get("mask", "none") != "none":  # read only for the keys attended to
            mask = op(k.args[3], max(1, footprint(k.args[3]) * kv_len // full))
        return AttentionWork(b, h, hk, t, kv_len, d, dv, op(q), op(kk, b * hk * kv_len * d),
                             op(v, b * hk * kv_len * dv), op(k.outs[0]), mask, elem(q), k.name)
    out = k.outs[0] if k.outs else None
    out_numel = out.numel if out is not None else 0
    if k.kind == "generated":
        return _generated_work(program, k, op)
    if k.kind == "embedding":
        ids, table_row = k.args[1], k.args[0].shape[-1]
        return VectorWork(0, (op(ids), op(k.args[0], ids.numel * table_row)), (op(out),), k.name)
    if k.kind == "index_copy":
        idx, src = k.args
        return VectorWork(0, (op(idx), op(src)), (op(out, src.numel),), k.name)
    if k.kind in ("max_pool2d", "avg_pool2d"):
        kh, kw = p["kernel"]
        ops = out_numel * kh * kw
    elif k.kind == "adaptive_avg_pool2d":
        ops = k.args[0].numel
    elif k.kind == "softmax":
        ops = out_numel * (_OPS_PER_ELEMENT["log_softmax" if p.get("log") else "softmax"]
                           + (p.get("mask", "none") != "none") + ("scale" in p))
    else:  # rmsnorm, rope, and any kind the model does not know: a few operations per output element
        ops = out_numel * _OPS_PER_ELEMENT.get(k.kind, 1)
    return VectorWork(ops, tuple(op(r) for r in k.args), tuple(op(r) for r in k.outs), k.name)


def footprint(ref: TensorRef) -> int:
    """Distinct elements a strided view touches: broadcast (stride-0) dimensions count once."""
    return math.prod(d for d, s in zip(ref.shape, ref.strides) if s != 0) if ref.shape else 1


def _epilogue_ops(p: dict) -> int:
    return (int(bool(p.get("has_bias"))) + int(bool(p.get("has_residual")))
            + int(p.get("activation", "none") not in ("none", None)) + int(p.get("alpha", 1.0) != 1.0))


def _gemm_work(program: CompiledProgram, k: KernelCall, op, elem) -> GemmWork:
    """Orient the product so that B is the weight (C^T = B^T A^T when the weight is A, as in a 1x1 convolution
    lowered to a GEMM), and fold the batch into M when B is shared by every batch entry."""
    a, b = k.args[0], k.args[1]
    p = k.params
    m, n, kk = int(p["m"]), int(p["n"]), int(p["k"])
    batch = math.prod(p.get("batch") or [1])

    def shared(ref: TensorRef) -> bool:
        return all(s == 0 or d == 1 for d, s in zip(ref.shape[:-2], ref.strides[:-2]))

    def is_weight(ref: TensorRef) -> bool:
        return program.buffers[ref.buffer].kind in ("weight", "constant")

    if is_weight(a) and not is_weight(b):
        a, b, m, n = b, a, n, m
    if batch > 1 and shared(b):
        m, batch = m * batch, 1
    extra = tuple(op(r) for r in k.args[2:])
    return GemmWork(m, n, kk, op(a), op(b), op(k.outs[0]), elem(a), elem(b), elem(k.outs[0]), batch, extra,
                    _epilogue_ops(p), k.name)


def _generated_work(program: CompiledProgram, k: KernelCall, op) -> VectorWork:
    """An expression kernel: one operation per arithmetic node and output element (times the reduced extent for
    nodes inside a reduction); each buffer it loads is read once, as far as its loads reach."""
    out = k.outs[0]
    reduce_extent = max(1, math.prod(k.reduce_shape))
    expr = X.from_data(k.expr) if k.expr is not None else None
    ops = 0
    reads: dict[int, int] = {}
    if expr is not None:
        ops = out.numel * _count_ops(expr, reduce_extent)
        seen: set[tuple] = set()
        for ld in X.loads(expr):
            key = (ld.arg, ld.strides, ld.offset, ld.rstrides)
            if key in seen or ld.arg >= len(k.args):
                continue
            seen.add(key)
            n = math.prod(d for d, s in zip(out.shape, ld.strides) if s != 0)
            n *= math.prod(d for d, s in zip(k.reduce_shape, ld.rstrides) if s != 0)
            buf = k.args[ld.arg].buffer
            reads[buf] = reads.get(buf, 0) + n
    operands = []
    for buf, n in reads.items():
        spec = program.buffers[buf]
        ref = TensorRef(buf, (spec.numel,), (1,))
        operands.append(op(ref, min(n, spec.numel)))
    return VectorWork(ops, tuple(operands), (op(out),), k.name)


def _count_ops(e: X.Expr, reduce_extent: int) -> int:
    """Arithmetic nodes per output element; a Reduce's body runs once per reduced element."""
    if isinstance(e, X.Load | X.Const | X.Index):
        return 0
    if isinstance(e, X.Reduce):
        return reduce_extent * (1 + _count_ops(e.body, reduce_extent))
    return 1 + sum(_count_ops(c, reduce_extent) for c in X.children(e))
