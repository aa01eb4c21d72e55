"""What a kernel asks of the NPU, in the model's own terms, and the one translation from a program's kernels to it.

The model (`model.py`) knows four kinds of work: a GEMM, a convolution, an attention, and vector work (elementwise,
norms, softmax, pooling, gathers: operations and bytes). `kernel_work` is the only place that reads
each kernel's typed record (`npu_compiler.kernels`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..dtypes import itemsize
from ..expr import nodes as X
from ..kernels import AttentionKernel, Conv2dKernel, GemmKernel, GeneratedKernel
from ..kernels.base import expr_flops
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
    prologue_ops: int = 0  # vector operations that compute A (a norm or an activation folded in), all batches

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
    side_c: int = 0  # a 1x1 side conv's input channels (its K, added to the conv's: one GEMM over both)

    @property
    def macs(self) -> int:
        return self.n * self.o * self.ho * self.wo * ((self.c // self.groups) * self.kh * self.kw + self.side_c)


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


def kernel_work(program: CompiledProgram, k: KernelCall, *, arena_on_chip: bool = False,
                context_len: int | None = None) -> Work:
    """What kernel `k` of `program` asks of the NPU, from its typed record. `arena_on_chip`: the program's
    intermediates (its arena) stay in the activation buffer between kernels. `context_len`: tokens an attention
    kernel with a valid-length bound reads from its cache (decode); None means the whole static cache."""

    def op(ref: TensorRef, numel: int | None = None) -> Operand:
        buf = program.buffers[ref.buffer]
        n = footprint(ref) if numel is None else numel
        return Operand(min(n, buf.numel) * itemsize(buf.dtype), arena_on_chip and buf.kind == "arena")

    def elem(ref: TensorRef) -> int:
        return itemsize(program.buffers[ref.buffer].dtype)

    spec = k.spec
    if isinstance(spec, GemmKernel):
        return _gemm_work(program, k, op, elem)
    if isinstance(spec, Conv2dKernel):
        x, w, out = k.args[0], k.args[1], k.outs[0]
        n, c, h, wd = x.shape
        o, _, kh, kw = w.shape
        ho, wo = out.shape[2:]
        extra = tuple(op(r) for r in k.args[2:])
        side_c = k.args[spec.side_first_arg].shape[1] if spec.side_stride else 0
        return ConvWork(n, c, h, wd, o, kh, kw, ho, wo, op(x), op(w), op(out), tuple(spec.stride),
                        tuple(spec.padding), tuple(spec.dilation), spec.groups, elem(x), extra,
                        _epilogue_ops(spec.bias, 1.0, spec.epilogue) + int(spec.side_bias), k.name, side_c)
    if isinstance(spec, AttentionKernel):
        q, kk, v = k.args[:3]
        full = spec.kv_len
        kv_len = max(1, min(full, context_len)) if spec.valid_len and context_len is not None else full
        b, h, hk = spec.batch, spec.heads, spec.kv_heads
        mask = None
        if spec.mask != "none":  # read only for the keys attended to
            mask = op(k.args[3], max(1, footprint(k.args[3]) * kv_len // max(full, 1)))
        return AttentionWork(b, h, hk, spec.q_len, kv_len, spec.head_dim, spec.v_dim, op(q),
                             op(kk, b * hk * kv_len * spec.head_dim), op(v, b * hk * kv_len * spec.v_dim),
                             op(k.outs[0]), mask, elem(q), k.name)
    return _generated_work(program, k, op)


def footprint(ref: TensorRef) -> int:
    """Distinct elements a strided view touches: broadcast (stride-0) dimensions count once."""
    return math.prod(d for d, s in zip(ref.shape, ref.strides) if s != 0) if ref.shape else 1


def _epilogue_ops(bias: bool, alpha: float, epilogue: X.Expr | None, groups: int = 1) -> int:
    """Vector operations per element of the product: the bias, a scale, and the epilogue expression (which runs once
    for every `groups` product elements where it combines column groups)."""
    return int(bias) + int(alpha != 1.0) + (-(-expr_flops(epilogue, 1) // groups) if epilogue is not None else 0)


def _gemm_work(program: CompiledProgram, k: KernelCall, op, elem) -> GemmWork:
    """Orient the product so that B is the weight (C^T = B^T A^T when the weight is A, as in a 1x1 convolution
    lowered to a GEMM), and fold the batch into M when B is shared by every batch entry."""
    spec: GemmKernel = k.spec
    m, n, kk = spec.m, spec.n, spec.k
    batch = spec.batch_count
    b = k.args[spec.b_arg]
    if spec.prologue is not None:
        # A is computed by the vector unit from the operands it reads (extra) and handed on chip to the array
        a_elem = itemsize(spec.prologue.dtype)
        a_op = Operand(batch * m * kk * a_elem, on_chip=True)
        points = batch * m * kk
        extra = tuple(op(r) for r in k.args[spec.b_arg + 1:])
        return GemmWork(m, n, kk, a_op, op(b), op(k.outs[0]), a_elem, elem(b), elem(k.outs[0]), batch, extra,
                        _epilogue_ops(spec.bias, spec.alpha, spec.epilogue, spec.acc_groups), k.name,
                        expr_flops(spec.prologue, points, points if spec.prologue_reduce else 0))
    a = k.args[0]

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
                    _epilogue_ops(spec.bias, spec.alpha, spec.epilogue, spec.acc_groups), k.name)


def _generated_work(program: CompiledProgram, k: KernelCall, op) -> VectorWork:
    """An expression kernel: its operations by its record's cost model; each buffer it reads is read once, as far
    as its loads reach (a gather reads at most one element per evaluation)."""
    spec: GeneratedKernel = k.spec
    shape = spec.iteration_shape(k)
    red = tuple(spec.reduce_shape)
    reads: dict[int, int] = {}
    seen: set[tuple] = set()
    for r in X.reads(spec.expr) + (X.reads(spec.scatter.index) if spec.scatter is not None else []):
        if isinstance(r, X.Load):
            key: tuple = (r.arg, r.strides, r.offset, r.rstrides)
            n = math.prod(d for d, s in zip(shape, r.strides) if s != 0)
            n *= math.prod(d for d, s in zip(red, r.rstrides) if s != 0)
        else:
            key = (r.arg, r.shape, r.strides, r.offset, id(r))
            n = min(math.prod(r.shape), math.prod(shape) * max(1, math.prod(red)))
        if key in seen:
            continue
        seen.add(key)
        buf = k.args[r.arg].buffer
        reads[buf] = reads.get(buf, 0) + n
    operands = []
    for buf, n in reads.items():
        b = program.buffers[buf]
        operands.append(op(TensorRef(buf, (b.numel,), (1,)), min(n, b.numel)))
    out = k.outs[0]
    written = op(out, math.prod(shape)) if spec.scatter is not None else op(out)
    return VectorWork(spec.cost(k, program.buffers).flops, tuple(operands), (written,), k.name)
