"""The small device programs around an LLM step, so that a step moves a few bytes between host and device:

- `step_inputs`: from the first cache slot of the step and its count of padding rows (two int64 uploaded), the
  position ids, the cache positions and the causal mask of the step, written straight into the buffers the model
  program reads (bound to them);
- `greedy_token`: the argmax of the last row of logits, so that a greedy step reads back one token id instead of a
  vocabulary of logits.

They are ordinary `CompiledProgram`s of generated kernels (the kernel contract: typed records, run by every
backend from the records), built here from their few expressions instead of from an IR graph.
"""

from __future__ import annotations

import math

from npu_compiler.expr import nodes as X
from npu_compiler.kernels import GeneratedKernel
from npu_compiler.lowering.memory_plan import ALIGN as ARENA_ALIGN
from npu_compiler.program import BufferSpec, CompiledProgram, KernelCall, TensorSpec, full_ref

I64 = "int64"


def _program(name: str, target: str, buffers: list[BufferSpec], inputs: list[TensorSpec],
             outputs: list[TensorSpec], kernels: list[KernelCall]) -> CompiledProgram:
    prog = CompiledProgram(name, target, "float32", {}, inputs, outputs, [], buffers, kernels, 0)
    for k in kernels:  # the same checks a compiled program's kernels pass
        k.spec.check(k, buffers)
    return prog


def _kernel(name: str, expr: X.Expr, args: list[BufferSpec], out: BufferSpec, shape: tuple[int, ...],
            reduce_shape: tuple[int, ...] = ()) -> KernelCall:
    return KernelCall(name, GeneratedKernel(expr, reduce_shape), [full_ref(a) for a in args], [full_ref(out, shape)],
                      [name], name)


def step_inputs(target: str, seq_len: int, cache_len: int, mask_dtype: str, masked: float) -> CompiledProgram:
    """start [1], front_pads [1] -> position_ids [1, T], cache_position [T] and the additive mask [1, 1, T, L]: 0
    where slot j <= the row's position (the query sees it), `masked` elsewhere.

    With p = front_pads, rows t >= p hold the step's tokens at positions start + t - p, and the p rows before them
    are padding placed after those tokens, at positions start + T - p + t. So a prompt shorter than T ends on the
    program's last row, whose logits are the ones a last-position-only prefill keeps, while every real query sees
    only real slots. The pads' cache slots are written before any later step reads them. p = 0 is the plain step:
    positions start + t."""
    T, L = seq_len, cache_len
    bufs = [BufferSpec(0, "start", "input", I64, 1), BufferSpec(1, "front_pads", "input", I64, 1),
            BufferSpec(2, "position_ids", "output", I64, T), BufferSpec(3, "cache_position", "output", I64, T),
            BufferSpec(4, "attention_mask", "output", mask_dtype, T * L)]

    def position(rank: int, row_dim: int) -> X.Expr:
        s, p = X.Load(I64, 0, (0,) * rank), X.Load(I64, 1, (0,) * rank)
        t = X.Index(I64, row_dim)
        real = X.Binary(I64, "sub", X.Binary(I64, "add", s, t), p)
        pad = X.Binary(I64, "add", X.Binary(I64, "add", s, X.Binary(I64, "sub", X.Const(I64, T), p)), t)
        return X.Where(I64, X.Binary("bool", "lt", t, p), pad, real)

    visible = X.Binary("bool", "le", X.Index(I64, 3), position(4, 2))
    mask = X.Where(mask_dtype, visible, X.Const(mask_dtype, 0.0), X.Const(mask_dtype, float(masked)))
    ins = [bufs[0], bufs[1]]
    kernels = [_kernel("position_ids", position(2, 1), ins, bufs[2], (1, T)),
               _kernel("cache_position", position(1, 0), ins, bufs[3], (T,)),
               _kernel("attention_mask", mask, ins, bufs[4], (1, 1, T, L))]
    return _program("llm_step_inputs", target, bufs,
                    [TensorSpec("start", (1,), I64, I64, 0), TensorSpec("front_pads", (1,), I64, I64, 1)],
                    [TensorSpec("position_ids", (1, T), I64, I64, 2), TensorSpec("cache_position", (T,), I64, I64, 3),
                     TensorSpec("attention_mask", (1, 1, T, L), mask_dtype, mask_dtype, 4)], kernels)


CHUNK_MIN, CHUNK_MAX = 64, 1024


def _chunk(v: int) -> int:
    """The largest divisor of the vocabulary in [CHUNK_MIN, CHUNK_MAX] (v itself where there is none)."""
    return next((c for c in range(min(v, CHUNK_MAX), CHUNK_MIN - 1, -1) if v % c == 0), v)


def _first_max(values: X.Expr, index: X.Expr, absent: int, best: X.Expr | None = None) -> X.Expr:
    """The smallest `index` over the reduction where `values` is largest (a NaN counts as the largest, as
    torch.argmax takes it): max over r of -index where it is hit (-absent elsewhere), negated. `best`: the largest
    value where it is already known (else reduced here)."""
    best = X.Reduce("float32", "max", values) if best is None else best
    hit = X.Binary("bool", "or", X.Binary("bool", "eq", values, best), X.Binary("bool", "ne", values, values))
    neg = X.Where(I64, hit, X.Unary(I64, "neg", index), X.Const(I64, -absent))
    return X.Unary(I64, "neg", X.Reduce(I64, "max", neg))


def greedy_token(target: str, logits_shape: tuple[int, ...], logits_dtype: str) -> CompiledProgram:
    """logits [..., V] -> the index of the largest value of the last row (the first one on ties; a NaN counts as the
    largest, as torch.argmax takes it), as a [1, 1] int64: the shape of a decode step's input ids, so that the token
    can feed the next step without leaving the device.

    In two stages where V has a divisor in [CHUNK_MIN, CHUNK_MAX] (151,936 = 1,187 x 128): each chunk's largest value
    and its first index, one chunk per row of a row kernel (a GPU spreads the chunks over its multiprocessors; one
    row of 151,936 would keep one busy), then the first chunk that holds the overall largest value gives its index."""
    V = logits_shape[-1]
    rows = math.prod(logits_shape[:-1])
    last = (rows - 1) * V
    logits = BufferSpec(0, "logits", "input", logits_dtype, rows * V)
    token = BufferSpec(1, "token", "output", I64, 1)
    chunk = _chunk(V)
    n = V // chunk
    specs = ([TensorSpec("logits", tuple(logits_shape), logits_dtype, logits_dtype, 0)],
             [TensorSpec("token", (1, 1), I64, I64, 1)])
    if n == 1:
        x = X.Cast("float32", X.Load(logits_dtype, 0, (0, 0), last, (1,)))
        kernels = [_kernel("argmax", _first_max(x, X.RIndex(I64, 0), V), [logits], token, (1, 1), (V,))]
        return _program("llm_greedy_token", target, [logits, token], *specs, kernels)
    idx_at = -(-n * 4 // ARENA_ALIGN) * ARENA_ALIGN
    cmax = BufferSpec(2, "chunk_max", "arena", "float32", n, offset=0)
    cidx = BufferSpec(3, "chunk_index", "arena", I64, n, offset=idx_at)
    x = X.Cast("float32", X.Load(logits_dtype, 0, (chunk,), last, (1,)))
    own_max = X.Load("float32", 1, (1,))  # (the chunk's largest value, from the first kernel)
    at = X.Binary(I64, "add", X.Binary(I64, "mul", X.Index(I64, 0), X.Const(I64, chunk)), X.RIndex(I64, 0))
    first = _first_max(x, at, V, own_max)
    kernels = [
        _kernel("argmax_chunk_max", X.Reduce("float32", "max", x), [logits], cmax, (n,), (chunk,)),
        _kernel("argmax_chunk_index", first, [logits, cmax], cidx, (n,), (chunk,)),
        _kernel("argmax", _first_max(X.Load("float32", 0, (0, 0), 0, (1,)), X.Load(I64, 1, (0, 0), 0, (1,)), V),
                [cmax, cidx], token, (1, 1), (n,)),
    ]
    prog = _program("llm_greedy_token", target, [logits, token, cmax, cidx], *specs, kernels)
    prog.arena_bytes = idx_at + n * 8
    return prog
