"""What a kernel asks of the NPU, in the model's own terms, and the one translation from a program's kernels to it.

The model (`model.py`) knows four kinds of work: a GEMM, a convolution, an attention, and vector work (elementwise,
norms, softmax, pooling, gathers: operations and bytes). `kernel_work` is the only place that reads
each kernel's typed record (`npu_compiler.kernels`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..dtypes import itemsize
from ..kernels import AttentionKernel, Conv2dKernel, GemmKernel, KernelCost, QConv2dKernel, QGemmKernel, WGemmKernel
from ..program import CompiledProgram, KernelCall, TensorRef
from .residency import Placement


@dataclass(frozen=True)
class Operand:
    """A tensor a kernel reads or writes: its distinct bytes, and whether it lives on chip (an intermediate held in
    the activation buffer between kernels) or in DRAM. `constant`: a weight or constant (it depends on no earlier
    kernel, so it can be loaded ahead). `zeros`: the fraction of its elements that are zero where the caller knows it
    (measured activations), None where not: it then moves dense and gates nothing."""

    bytes: int
    on_chip: bool = False
    constant: bool = False
    zeros: float | None = None
    elem: int = 0  # bytes of one element (0: not known)


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
    extra: tuple[Operand, ...] = ()  # epilogue and prologue operands (bias, residual, a norm's input), read once
    vector_ops: int = 0  # the vector unit's work beside the array: a prologue computing A, the epilogue, all batches
    label: str = "gemm"
    staging: float | None = None  # activation-buffer bytes free for its streamed tiles (None: the whole buffer)
    dtypes: tuple[str, str] = ("float16", "float16")  # A's and B's: the MACs' number formats
    out_dtype: str = "float16"  # what the epilogue computes in

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
    vector_ops: int = 0  # bias and epilogue, all output elements
    label: str = "conv2d"
    side_c: int = 0  # a 1x1 side conv's input channels (its K, added to the conv's: one GEMM over both)
    staging: float | None = None
    dtypes: tuple[str, str] = ("float16", "float16")  # the input's and the weights'
    out_dtype: str = "float16"

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
    softmax_ops: int = 0  # the vector unit's work on the scores (scale, mask, max, exp, sum, divide)
    extra: tuple[Operand, ...] = ()  # what else it reads (the cache positions)
    staging: float | None = None
    dtypes: tuple[str, str] = ("float16", "float16")  # Q's and K's

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
    dtype: str = ""  # the number format it computes in (its output's)


Work = GemmWork | ConvWork | AttentionWork | VectorWork


def kernel_work(program: CompiledProgram, k: KernelCall, placement: Placement | None = None, *,
                context_len: int | None = None, zeros: Mapping[str, float] | None = None) -> Work:
    """What kernel `k` of `program` asks of the NPU: its shape from its typed record, its operations and bytes from
    its kind's one count (`KernelCall.spec.cost`, which the profiler reads too), each operand on chip or in DRAM as
    the residency plan's `placement` says (None: every operand in DRAM). `context_len`: tokens a decode attention
    reads from its cache (None: the whole static cache). `zeros`: the fraction of zero elements of the tensors it
    names (by buffer name), where they are known."""
    cost = k.spec.cost(k, program.buffers, context_len=context_len)
    place = placement or Placement()
    known = zeros or {}

    def operand(nbytes: int, buffer: int, on_chip: bool) -> Operand:
        b = program.buffers[buffer]
        return Operand(nbytes, on_chip, b.kind in ("weight", "constant"), known.get(b.name), itemsize(b.dtype))

    def read(i: int) -> Operand:
        return operand(cost.read_of(i), k.args[i].buffer, k.args[i].buffer in place.reads_on_chip)

    def reads_except(*skip: int) -> tuple[Operand, ...]:
        return tuple(operand(t.bytes, t.buffer, t.buffer in place.reads_on_chip) for t in cost.reads
                     if t.index not in skip)

    def written(i: int = 0) -> Operand:
        t = next(t for t in cost.writes if t.index == i)
        return operand(t.bytes, t.buffer, t.buffer in place.writes_on_chip)

    def elem(ref: TensorRef) -> int:
        return itemsize(program.buffers[ref.buffer].dtype)

    def dtype(ref: TensorRef) -> str:
        return program.buffers[ref.buffer].dtype

    spills = (Operand(place.spill_bytes),) if place.spill_bytes else ()
    staging = place.staging_bytes
    spec = k.spec
    if isinstance(spec, GemmKernel):
        return _gemm_work(program, k, cost, read, lambda *skip: reads_except(*skip) + spills, written, elem, dtype,
                          staging)
    if isinstance(spec, Conv2dKernel):
        x, w, out = k.args[0], k.args[1], k.outs[0]
        n, c, h, wd = x.shape
        o, _, kh, kw = w.shape
        ho, wo = out.shape[2:]
        side_c = k.args[spec.side_first_arg].shape[1] if spec.side_stride else 0
        return ConvWork(n, c, h, wd, o, kh, kw, ho, wo, read(0), read(1), written(), tuple(spec.stride),
                        tuple(spec.padding), tuple(spec.dilation), spec.groups, elem(x), reads_except(0, 1) + spills,
                        cost.vector_ops, k.name, side_c, staging, (dtype(x), dtype(w)), dtype(out))
    if isinstance(spec, WGemmKernel) and spec.prologue is not None:  # A computed on chip (as a float GEMM's)
        b, out = k.args[0], k.outs[0]
        a_op = Operand(math.prod(spec.a_shape) * elem(out), on_chip=True)
        return GemmWork(spec.m, spec.n, spec.k, a_op, read(0), written(), elem(out), elem(b), elem(out),
                        math.prod(spec.batch), reads_except(0) + spills, cost.vector_ops, k.name, staging,
                        cost.mac_dtypes, dtype(out))
    if isinstance(spec, QGemmKernel | WGemmKernel):  # int8 x int8 MACs; weight-only: the weight's codes read once
        a, b, out = k.args[0], k.args[1], k.outs[0]
        return GemmWork(spec.m, spec.n, spec.k, read(0), read(1), written(), elem(a), elem(b), elem(out),
                        math.prod(spec.batch), reads_except(0, 1) + spills, cost.vector_ops, k.name, staging,
                        cost.mac_dtypes, dtype(out))
    if isinstance(spec, QConv2dKernel):
        x, w, out = k.args[0], k.args[1], k.outs[0]
        n, c, h, wd = x.shape
        o, _, kh, kw = w.shape
        return ConvWork(n, c, h, wd, o, kh, kw, out.shape[2], out.shape[3], read(0), read(1), written(),
                        tuple(spec.stride), tuple(spec.padding), tuple(spec.dilation), spec.groups, elem(x),
                        reads_except(0, 1) + spills, cost.vector_ops, k.name, 0, staging, (dtype(x), dtype(w)),
                        dtype(out))
    if isinstance(spec, AttentionKernel):
        mask = read(3) if spec.mask != "none" else None
        return AttentionWork(spec.batch, spec.heads, spec.kv_heads, spec.q_len, spec.attended(context_len),
                             spec.head_dim, spec.v_dim, read(0), read(1), read(2), written(), mask, elem(k.args[0]),
                             k.name, cost.vector_ops, reads_except(0, 1, 2, 3) + spills, staging,
                             (dtype(k.args[0]), dtype(k.args[1])))
    outs = tuple(written(t.index) for t in cost.writes)
    return VectorWork(cost.vector_ops, reads_except(), outs + spills, k.name, dtype(k.outs[0]))


def _gemm_work(program: CompiledProgram, k: KernelCall, cost: KernelCost, read, reads_except, written, elem, dtype,
               staging: float | None) -> GemmWork:
    """Orient the product so that B is the weight (C^T = B^T A^T when the weight is A, as in a 1x1 convolution
    lowered to a GEMM), and fold the batch into M when B is shared by every batch entry."""
    spec: GemmKernel = k.spec
    m, n, kk = spec.m, spec.n, spec.k
    batch = spec.batch_count
    b = k.args[spec.b_arg]
    out = k.outs[0]
    if spec.prologue is not None:
        # A is computed by the vector unit from the operands it reads (extra) and handed on chip to the array
        a_elem = elem(b)  # the prologue computes A in B's dtype (the record's check)
        a_op = Operand(batch * m * kk * a_elem, on_chip=True)
        return GemmWork(m, n, kk, a_op, read(spec.b_arg), written(), a_elem, elem(b), elem(out), batch,
                        reads_except(spec.b_arg), cost.vector_ops, k.name, staging, (dtype(b), dtype(b)), dtype(out))
    a = k.args[0]
    a_op, b_op = read(0), read(1)

    def shared(ref: TensorRef) -> bool:
        return all(s == 0 or d == 1 for d, s in zip(ref.shape[:-2], ref.strides[:-2]))

    def is_weight(ref: TensorRef) -> bool:
        return program.buffers[ref.buffer].kind in ("weight", "constant")

    if is_weight(a) and not is_weight(b):
        a, b, m, n, a_op, b_op = b, a, n, m, b_op, a_op
    if batch > 1 and shared(b):
        m, batch = m * batch, 1
    return GemmWork(m, n, kk, a_op, b_op, written(), elem(a), elem(b), elem(out), batch, reads_except(0, 1),
                    cost.vector_ops, k.name, staging, (dtype(a), dtype(b)), dtype(out))
