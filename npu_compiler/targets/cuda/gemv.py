"""GEMV: the GEMMs of decoding (a handful of rows times a weight matrix), as one kernel that streams the weights once
at close to the copy bandwidth, with the bias and the epilogue (residual add, activation) applied as each output is
produced. cuBLAS would need a bias fill before and an epilogue pass after, three launches for a few microseconds of
work each.

out[m, n] = epilogue(round(alpha * sum_k a[m, k] * w[n, k] + beta * bias[m, n])) for m < M <= GEMV_MAX_M, where the
GEMM's b operand [K, N] is the weight read row by row (w[n, k] = b[k, n], unit stride along k). Each output column
n gets `splits_for` warps (1 for a wide GEMV; 2-8 where there are too few columns to keep enough loads in flight, as
in a decode step's down projection): their lanes stride over k with 16-byte loads of the weight row (streamed past
L1) and of the activation rows (cached), accumulate in fp32 and reduce with shuffles, then across the column's warps
in shared memory; the epilogue runs on the lanes that hold the sum. A lane loads up to UNROLL chunks of its share
of the row before it uses any (a 1,536-long row is 6 chunks a lane: one wait for memory a column), and the first
batch of its block's first column before it waits for the previous kernel (programmatic dependent launch) and
before any prologue, since no kernel writes a weight: the weight stream starts while those run. Where a row share
is longer than one batch, each warp also prefetches its first row into L2 before the wait.

A GEMM whose operand comes from a prologue (`GemmKernel.prologue`: the RMSNorm before a projection) computes the
operand's rows into shared memory first, every block all of them (a norm's sum of squares as a block reduction, then
each element as the graph rounds it), and its warps read them from there. Blocks are then PROLOGUE_WARPS warps, at
most one wave of them, each running column group after column group, so that the rows are computed once a block;
the groups are shared out evenly (as few blocks as take the same number of rounds), and a column gets fewer warps
where that makes every group fit in one round.
The target asks for norms only (see `CudaTarget.gemm_prologue`); any prologue renders.

A GEMM over column groups (`GemmKernel.acc_groups` G: SiLU(gate) * up as the gate/up projection's epilogue) keeps a
block's warps on weight rows as before, the block's rows being G groups of the same output columns: each warp sums
its row, rounds it as the graph stores the product, and leaves it in shared memory; the G warps of a column meet at
a named barrier, and the first group's warp runs the epilogue with every group's value of the column. So the blocks
stream as many rows each as without groups (a warp a column pair instead would have left half the blocks with an
extra pair: a longer tail). Measured on the H100 (Qwen2.5-1.5B decode): the step 1.861 / 1.833 -> 1.821 / 1.816 ms
at KV 1024, 1.935 / 1.940 -> 1.924 / 1.941 ms at 8192; a barrier of the whole block in place of the named one made
the step slower than the kernel it saved.

A block that runs column group after column group, its lane's share of a row one batch of loads, issues the next
group's batch as soon as this group's products are summed, so that the loads are in flight during the shuffles, the
barrier and the epilogue and not after them. Measured on the H100 (Qwen2.5-1.5B decode step, in one process, the
program otherwise the same: the gate/up and LM-head GEMVs change): 1.504 -> 1.476 ms at KV position 128, 1.530 ->
1.522 and 1.566 -> 1.555 at 1024, 1.547 -> 1.536 and 1.552 -> 1.530 at 2000.

A prologue's small weight operands (a norm's scale) are prefetched into L1 before the wait: the prologue reads them
after its reduction, and by then the decode step's weight stream has evicted them from L2. Measured on the H100 (the
step in one process, twice each): 1.525 / 1.523 -> 1.509 / 1.518 ms at KV position 1024, 1.549 / 1.549 -> 1.537 /
1.534 at 2000, 1.468 / 1.473 -> 1.462 / 1.465 at 128.

A GEMV without a prologue whose blocks do not all fit on the GPU at once (by threads) runs the same way: one wave of
WAVE_BLOCKS_PER_SM blocks an SM, each taking column group after column group with the next group's loads issued
early. A block a column had left a second and third wave of blocks to start, and load, only as the first ones ended.
Measured on the H100 (Qwen2.5-1.5B decode step, in one process, twice each; the down projection, 1,536 columns of
8,960, becomes 512 blocks of three columns): 1.543 / 1.536 -> 1.500 / 1.499 ms at KV position 1024, 1.513 / 1.516 ->
1.478 / 1.477 at 2000.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ...dtypes import itemsize
from ...expr import nodes as X
from ...kernels import GemmKernel
from ...program import BufferSpec, CompiledProgram, KernelCall, TensorRef
from ..clike import ExprRenderer, KernelText, Launch, Scope, decompose
from .common import (
    CUDA,
    PRELUDE,
    WEIGHTS_BEGIN,
    WEIGHTS_END,
    literal,
    load_expr,
    max_extent,
    round_expr,
    store_expr,
    unpack16,
)

GEMV_MAX_M = 8
WARPS = 4  # warps per block (max(WARPS, splits): a column's warps share a block)
PROLOGUE_WARPS = 16  # with a prologue: each block computes the operand's rows once for 16 / splits columns
# the computed rows live in static shared memory, all a block has without opting in but what the reductions keep
PROLOGUE_SPARE_BYTES = 8 * 1024
PROLOGUE_UNROLL = 8
# blocks of PROLOGUE_WARPS an SM: the grid is one wave of them, and the launch bounds hold the registers to that.
# ncu on the H100 (Qwen2.5-1.5B's gate/up projection): at 36 registers a thread three blocks fit where the grid
# assumed four, and a second wave of 132 blocks ran; three with the weights loaded before the prologue spill (40
# registers), and the decode step got slower (1.94 -> 2.12 ms); two spill nothing
PROLOGUE_BLOCKS_PER_SM = 2
# blocks an SM of a GEMV without a prologue that runs as one wave (its launch bounds: 64 registers a thread at 8
# warps a block). Measured on the H100 (Qwen2.5-1.5B decode, the down projection's 1,536 columns of 8 warps): 2 an SM
# (six column groups a block) no faster than a block a column, 3 slower than 4, 6 and 8 spill (1.79 and 2.06 ms)
WAVE_BLOCKS_PER_SM = 4
UNROLL = 8
PREFETCH_BYTES = 16 * 1024  # a prologue's weight operand at most this large is prefetched into L1 before the wait
MAX_SPLITS = 8
MAX_GROUPS = 8  # column groups (registers: every lane of an epilogue warp holds each group's value)
MAX_WARPS = 32  # a block's threads: 1,024
_VEC = {"bfloat16": 8, "float16": 8, "float32": 4}  # elements per 16-byte load


def _fits(m: int, n: int, k: int, batch: int, ad: str, bd: str, b: TensorRef) -> bool:
    return (batch == 1 and 1 <= m <= GEMV_MAX_M and n >= 1 and k >= 1 and ad == bd and ad in _VEC
            and (b.strides[-2] == 1 or k == 1))


def prologue_bytes(dev) -> int:
    """The most bytes of operand rows a prologue computes into shared memory on the device `dev`."""
    return dev.shared_memory_per_block - PROLOGUE_SPARE_BYTES


def prologue_applies(m: int, k: int, batch: tuple[int, ...], ad: str, b: TensorRef, bd: str, dev) -> bool:
    """A GEMM whose operand this kernel can compute in a prologue: one it runs, with the operand's rows fitting in
    shared memory."""
    return _fits(m, b.shape[-1], k, math.prod(batch), ad, bd, b) and m * k * itemsize(ad) <= prologue_bytes(dev)


def gemv_applies(k: KernelCall, program: CompiledProgram, dev) -> bool:
    return gemv_fits(k, program.buffers, dev)


def gemv_fits(k: KernelCall, buffers: Sequence[BufferSpec], dev) -> bool:
    """A GEMM this kernel runs: one batch, at most GEMV_MAX_M rows, the weight read along k with unit stride, the
    activations too (or computed by a prologue that fits), float operands of one dtype, at most MAX_GROUPS column
    groups in a block of at most MAX_WARPS warps."""
    spec: GemmKernel = k.spec
    b, out = k.args[spec.b_arg], k.outs[0]
    bd, od = buffers[b.buffer].dtype, buffers[out.buffer].dtype
    _, warps, cpo = _layout(spec, buffers, k, dev)
    if spec.acc_groups > MAX_GROUPS or warps > MAX_WARPS or (spec.acc_groups > 1 and cpo > 15):
        return False  # (with groups, a block's output columns each have a named barrier: ids 1 to 15)
    if spec.prologue is not None:
        return od in _VEC and prologue_applies(spec.m, spec.k, tuple(spec.batch), spec.prologue.dtype, b, bd, dev)
    a = k.args[0]
    return (_fits(spec.m, spec.n, spec.k, spec.batch_count, buffers[a.buffer].dtype, bd, b) and od in _VEC
            and (a.strides[-1] == 1 or spec.k == 1))


def _blocks_per_sm(warps: int, dev, cap: int = PROLOGUE_BLOCKS_PER_SM) -> int:
    """Blocks of `warps` warps an SM of a GEMV running as one wave (its launch bounds): at most `cap`, and no more
    than an SM's threads hold. The SMs times this is its one wave."""
    return max(1, min(cap, dev.max_threads_per_multiprocessor // (32 * warps)))


def _layout(spec: GemmKernel, buffers: Sequence[BufferSpec], k: KernelCall, dev) -> tuple[int, int, int]:
    """(warps a column, warps a block, output columns a block): a block's weight rows are `acc_groups` groups of its
    output columns, each row `splits` warps."""
    dt = buffers[k.args[spec.b_arg].buffer].dtype
    vec = _VEC.get(dt, 8)
    splits = splits_for(spec.n, spec.k // vec if _vectorizable(k, buffers, vec) else spec.k // 8, dev)
    base = PROLOGUE_WARPS if spec.prologue is not None else WARPS
    g = spec.acc_groups

    def rows_for(s: int) -> int:
        return g * -(-max(base // s, 1) // g)

    if spec.prologue is not None:
        # a prologue GEMV's blocks are one wave that runs column group after column group: fewer warps a column
        # where that makes the groups fit the wave (one round of loads a block instead of two). Measured on the
        # H100 (Qwen2.5-1.5B decode: q/k/v in 256 blocks of 8 columns, not 264 blocks with two rounds of 4 each):
        # the step 1.566 -> 1.539 ms at KV position 1024, 1.690 -> 1.681 ms at 8192
        def groups_over_wave(s: int) -> bool:
            rows = rows_for(s)
            return -(-spec.out_n // (rows // g)) > dev.multiprocessors * _blocks_per_sm(rows * s, dev)

        while splits > 1 and groups_over_wave(splits) and not groups_over_wave(splits // 2):
            splits //= 2
    rows = rows_for(splits)
    return splits, rows * splits, rows // g


def _vectorizable(k: KernelCall, buffers: Sequence[BufferSpec], vec: int) -> bool:
    spec: GemmKernel = k.spec
    b = k.args[spec.b_arg]
    ldw = b.strides[-1] if spec.n > 1 else spec.k
    if spec.prologue is not None:  # the rows are in shared memory, each 16-byte aligned when k is a multiple of vec
        return spec.k % vec == 0 and b.offset % vec == 0 and ldw % vec == 0
    a = k.args[0]
    lda = a.strides[-2] if spec.m > 1 else spec.k
    return spec.k % vec == 0 and b.offset % vec == 0 and a.offset % vec == 0 and ldw % vec == 0 and lda % vec == 0


def splits_for(n_cols: int, k_vecs: int, dev) -> int:
    """Warps per output column (each sums every `splits`-th 16-byte chunk of the row): a GEMV with few columns
    (a decode step's down projection: 1,536 columns of 8,960) would otherwise have too few warps in flight to
    stream its weights at the copy bandwidth (as many as the device holds), and a short one finishes in fewer
    dependent loads."""
    target_warps = dev.resident_threads // 32
    s = 1
    while s < MAX_SPLITS and n_cols * s < target_warps and k_vecs >= 64 * s:
        s *= 2
    return s


def _prefetch(k: KernelCall, program: CompiledProgram, ityp: str, ldw: int, splits: int, cpo: int) -> list[str]:
    """This warp's share of its weight row into L2 while the kernels before this one still run (no kernel writes a
    weight, so this may come before the wait). Decode alternates weight-streaming GEMVs with short latency-bound
    kernels (norms, RoPE, attention), and this lets the weight stream start during those."""
    spec: GemmKernel = k.spec
    b = k.args[spec.b_arg]
    row_bytes = spec.k * itemsize(program.dtype_of(b))
    col = f"(({ityp})blockIdx.x * {cpo} + (threadIdx.x >> 5) / {splits} % {cpo})"
    return [
        f"  if ({col} < {spec.out_n}) {{",
        f"    const char* wp = reinterpret_cast<const char*>(a{spec.b_arg} + {b.offset} + ({col}"
        f" + (threadIdx.x >> 5) / {splits} / {cpo} * {spec.out_n}) * {ldw});",
        f"    for (long long o = ((threadIdx.x >> 5) % {splits} * 32 + (threadIdx.x & 31)) * 128; o < {row_bytes};"
        f" o += {32 * splits * 128})",
        '      asm volatile("prefetch.L2 [%0];" :: "l"(wp + o));',
        f'    if ((threadIdx.x & 31) == 0) asm volatile("prefetch.L2 [%0];" :: "l"(wp + {row_bytes - 1}));',
        "  }",
    ]


def _prologue_prefetch(k: KernelCall, program: CompiledProgram) -> list[str]:
    """Lines bringing the prologue's small weight operands (a norm's scale) into this SM's L1 before the wait: the
    prologue reads them only after its reduction, and a decode step's weight stream has evicted them from L2 since
    the step before, so that read would otherwise wait for DRAM with the whole block held at it."""
    spec: GemmKernel = k.spec
    lines = []
    for i in sorted({r.arg for r in X.reads(spec.prologue)}):
        ref = k.args[i]
        buf = program.buffers[ref.buffer]
        if buf.kind != "weight":
            continue
        nbytes = max_extent(tuple(ref.shape), tuple(ref.strides), ref.offset) * itemsize(buf.dtype)
        if nbytes > PREFETCH_BYTES:
            continue
        lines += [
            f"  for (int o = threadIdx.x * 128; o < {nbytes}; o += blockDim.x * 128)",
            f'    asm volatile("prefetch.global.L1 [%0];" :: "l"(reinterpret_cast<const char*>(a{i}) + o));',
        ]
    return lines


def _prologue_rows(k: KernelCall, program: CompiledProgram, names: list[str], ityp: str, text: KernelText
                    ) -> list[str]:
    """Lines computing the operand's rows into shared memory `xs` ([m][k], the operand dtype): the whole block runs
    each row (its reductions block-wide, then its elements), as a generated row kernel does."""
    spec: GemmKernel = k.spec
    expr, shape = spec.prologue, spec.a_shape
    outer = shape[:-1]
    # unrolled loops: each thread's loads of a row issue together (a row is a few loads a thread, and every block
    # waits for its rows before it streams its weights)
    hint = f"#pragma unroll {PROLOGUE_UNROLL}"
    r = ExprRenderer(CUDA, text, names, [program.dtype_of(a) for a in k.args], shape, ityp,
                     tuple(spec.prologue_reduce), row_dims=1, block_reduce=True, prefix="p_", loop_hint=hint)
    row = Scope("      ")
    r.row_scope = row
    row.lines += decompose(CUDA, "row", outer, "o", ityp, row.indent)
    elem = Scope("        ", parent=row)
    r.elem_scope = elem
    elem.lines += decompose(CUDA, "e", shape[-1:], "o", ityp, elem.indent, first=len(outer))
    value = r.emit(expr, elem)
    elem.lines.append(f"{elem.indent}xs[row * {spec.k} + e] = {store_expr(expr.dtype, value, expr.dtype)};")
    return [
        f"  __shared__ __align__(16) {CUDA.storage(expr.dtype)} xs[{spec.m * spec.k}];",
        "  {",
        f"    for ({ityp} row = 0; row < {spec.m}; ++row) {{",
        *row.lines,
        f"      {hint}",
        f"      for ({ityp} e = threadIdx.x; e < {spec.k}; e += blockDim.x) {{",
        *elem.lines,
        "      }",
        "    }",
        "  }",
        "  __syncthreads();",
    ]


def gemv(k: KernelCall, program: CompiledProgram, render_epilogue, dev) -> tuple[str, Launch]:
    spec: GemmKernel = k.spec
    b, out = k.args[spec.b_arg], k.outs[0]
    pro = spec.prologue is not None
    dt, od = program.dtype_of(b), program.dtype_of(out)
    m_rows, n_rows, kk = spec.m, spec.n, spec.k
    groups, n_out = spec.acc_groups, spec.out_n
    ldw = b.strides[-1] if n_rows > 1 else kk
    # the operand's rows: read from memory, or computed into shared memory by the prologue (`xs`, rows of k)
    a_ptr, a_off, lda = ("xs", 0, kk) if pro else ("a0", k.args[0].offset, k.args[0].strides[-2] if m_rows > 1 else kk)
    w_ptr = f"a{spec.b_arg}"
    vec = _VEC[dt]
    vectorized = _vectorizable(k, program.buffers, vec)
    # cpo: output columns a block (cpo * groups weight rows)
    splits, warps, cpo = _layout(spec, program.buffers, k, dev)
    extents = [max_extent(tuple(r.shape), tuple(r.strides), r.offset) for r in (*k.args, out)]
    ityp = "long long" if max(extents) >= 2**31 - 1 else "int"
    rank = len(out.shape)
    names = [f"a{i}" for i in range(len(k.args))]
    text = KernelText([], 32 * warps)
    lines = _prologue_rows(k, program, names, ityp, text) if pro else []
    n_groups = math.ceil(n_out / cpo)
    # one wave of blocks, each running column group after column group, where there is a prologue (a block computes
    # its rows once) or where a block a group would be more blocks than the GPU holds at once (by threads: see the
    # module's docstring); else one group a block. The launch bounds hold the registers to the wave's blocks an SM.
    sms = dev.multiprocessors
    wave = pro or n_groups > sms * _blocks_per_sm(warps, dev, cap=dev.max_threads_per_multiprocessor)  # (uncapped)
    per_sm = _blocks_per_sm(warps, dev, PROLOGUE_BLOCKS_PER_SM if pro else WAVE_BLOCKS_PER_SM)
    grid = n_groups
    if wave:
        # the groups shared out evenly: as few blocks as take the same number of rounds (the gate/up projection's
        # 1,120 groups: 224 blocks of five, where 264 blocks left 200 of them idle in the fifth round while 64 ran
        # it). Measured on the H100 (Qwen2.5-1.5B decode): 1.529 -> 1.505 ms at KV position 1024, 1.661 -> 1.641 ms
        # at 8192
        grid = min(n_groups, sms * per_sm)
        grid = -(-n_groups // -(-n_groups // grid))
    head = [
        "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
        f"  const int part = warp % {splits};  // this warp sums every {splits}-th chunk of the row",
        f"  const int slot = warp / {splits}, col = slot % {cpo}, grp = slot / {cpo};  // row: group grp of column col",
    ]
    n_vec = kk // vec
    batch = max(1, min(UNROLL, -(-n_vec // (32 * splits))))
    whole_row = batch * 32 * splits >= n_vec  # one batch is the lane's whole share of a row
    # (a weight only: no kernel writes one, memory_check.check_read_only; b may also be an activation or a KV cache
    # that the kernel before is still writing)
    preload = vectorized and program.buffers[b.buffer].kind == "weight"
    # a block running column group after column group loads the next group's batch once this one's is summed (see
    # the module's docstring)
    ahead = preload and whole_row and grid < n_groups

    head, lines = _gemv_loads(a_off=a_off, a_ptr=a_ptr, ahead=ahead, b=b, batch=batch, cpo=cpo, dt=dt, grid=grid,
        groups=groups, head=head, ityp=ityp, kk=kk, lda=lda, ldw=ldw, lines=lines, m_rows=m_rows, n_groups=n_groups,
        n_out=n_out, n_vec=n_vec, preload=preload, pro=pro, splits=splits, vec=vec, vectorized=vectorized, w_ptr=w_ptr,
        warps=warps)
    idx = {rank - 2: "m", rank - 1: "n"}

    src = _gemv_tail(ahead=ahead, cpo=cpo, grid=grid, groups=groups, head=head, idx=idx, ityp=ityp, k=k, ldw=ldw,
        lines=lines, m_rows=m_rows, n_groups=n_groups, n_out=n_out, names=names, od=od, out=out, per_sm=per_sm,
        preload=preload, pro=pro, program=program, rank=rank, render_epilogue=render_epilogue, spec=spec, splits=splits,
        text=text, warps=warps, wave=wave, whole_row=whole_row)
    # with its weights loaded before the wait, it starts early (target._early_triggers)
    return src, Launch((grid, 1, 1), 32 * warps, [("out", 0)] + [("arg", i) for i in range(len(k.args))],
                       early=preload)


def _gemv_loads(*, a_off, a_ptr, ahead, b, batch, cpo, dt, grid, groups, head, ityp, kk, lda, ldw, lines, m_rows,
    n_groups, n_out, n_vec, preload, pro, splits, vec, vectorized, w_ptr, warps):
    """A warp's loads of its weight rows: preloaded before the wait where it can, 16-byte vectors or scalars, split over
    the column's warps."""
    def weight_row(n: str) -> str:
        return f"{b.offset} + (min({n}, ({ityp}){n_out - 1}) + ({ityp})grp * {n_out}) * {ldw}"

    if preload:
        # the first batch of the block's first column group, loaded before the wait for the kernel before (no kernel
        # writes a weight) and before the prologue: the weight stream starts while those run
        head += [
            WEIGHTS_BEGIN,
            f"  uint4 wpre[{batch}];",
            "  {",
            f"    const {ityp} n = ({ityp})blockIdx.x * {cpo} + col;",
            f"    const uint4* w4 = reinterpret_cast<const uint4*>({w_ptr} + {weight_row('n')});",
            "    #pragma unroll",
            f"    for (int b = 0; b < {batch}; ++b) {{",
            f"      const {ityp} v = part * 32 + lane + b * {32 * splits};",
            f"      wpre[b] = (n < {n_out} && v < {n_vec}) ? __ldcs(w4 + v) : make_uint4(0u, 0u, 0u, 0u);",
            "    }",
            "  }",
            WEIGHTS_END,
            "  bool first = true;",
        ]
    if grid < n_groups:
        if groups > 1:
            lines.append("  int it = 0;")
        lines.append(f"  for ({ityp} cg = blockIdx.x; cg < {n_groups}; cg += gridDim.x) {{")
    lines += [
        f"  const {ityp} n = {'cg' if grid < n_groups else f'({ityp})blockIdx.x'} * {cpo} + col;",
        f"  const bool live = n < {n_out};",
        f"  float acc[{m_rows}];",
        "  #pragma unroll",
        f"  for (int m = 0; m < {m_rows}; ++m) acc[m] = 0.0f;",
        f"  const {ityp} wrow = {weight_row('n')};",
    ]
    x_load = "*" if pro else "__ldg"  # shared memory, or the read-only cache
    if vectorized:
        # a batch of the lane's 16-byte weight chunks is loaded before any is used: the whole row share where it is
        # at most UNROLL chunks (a wide GEMV's 1,536-long rows: 6), so a warp waits for memory once a column
        lines += [
            f"  const uint4* w4 = reinterpret_cast<const uint4*>({w_ptr} + wrow);",
            f"  for ({ityp} v0 = part * 32 + lane; live && v0 < {n_vec}; v0 += {32 * splits * batch}) {{",
            f"    uint4 wv[{batch}];",
            "    #pragma unroll",
            f"    for (int b = 0; b < {batch}; ++b) {{",
            f"      const {ityp} v = v0 + b * {32 * splits};",
            f"      wv[b] = {'first ? wpre[b] : ' if preload else ''}v < {n_vec} ? __ldcs(w4 + v) : "
            "make_uint4(0u, 0u, 0u, 0u);",
            "    }",
            *(["    first = false;"] if preload else []),
            "    #pragma unroll",
            f"    for (int b = 0; b < {batch}; ++b) {{",
            f"      const {ityp} v = v0 + b * {32 * splits};",
            f"      if (v >= {n_vec}) break;",
            f"      float wf[{vec}];",
            *[f"      {ln}" for ln in unpack16(dt, "wv[b]", "wf")],
            "      #pragma unroll",
            f"      for (int m = 0; m < {m_rows}; ++m) {{",
            f"        const uint4 xv = {x_load}(reinterpret_cast<const uint4*>({a_ptr} + {a_off} + m * {lda}) + v);",
            f"        float xf[{vec}];",
            *[f"        {ln}" for ln in unpack16(dt, "xv", "xf")],
            "        #pragma unroll",
            f"        for (int e = 0; e < {vec}; ++e) acc[m] = fmaf(xf[e], wf[e], acc[m]);",
            "      }",
            "    }",
            "  }",
        ]
        if ahead:
            # the next column group's batch, in flight during this group's sums, barrier and epilogue
            lines += [
                "  {",
                f"    const {ityp} n2 = (cg + gridDim.x) * {cpo} + col;",
                f"    const uint4* w4n = reinterpret_cast<const uint4*>({w_ptr} + {weight_row('n2')});",
                "    #pragma unroll",
                f"    for (int b = 0; b < {batch}; ++b) {{",
                f"      const {ityp} v = part * 32 + lane + b * {32 * splits};",
                f"      wpre[b] = (n2 < {n_out} && v < {n_vec}) ? __ldcs(w4n + v) : make_uint4(0u, 0u, 0u, 0u);",
                "    }",
                "    first = true;",
                "  }",
            ]
    else:
        lines += [
            f"  for ({ityp} kk = part * 32 + lane; live && kk < {kk}; kk += {32 * splits}) {{",
            f"    const float wv = {load_expr(dt, f'{w_ptr}[wrow + kk]')};",
            "    #pragma unroll",
            f"    for (int m = 0; m < {m_rows}; ++m)",
            f"      acc[m] = fmaf({load_expr(dt, f'{a_ptr}[{a_off} + m * {lda} + kk]')}, wv, acc[m]);",
            "  }",
        ]
    lines += [
        "  #pragma unroll",
        f"  for (int m = 0; m < {m_rows}; ++m) {{",
        "    #pragma unroll",
        "    for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);",
        "  }",
    ]
    if splits > 1:
        lines += [
            f"  __shared__ float red[{warps}][{m_rows}];",
            f"  if (lane < {m_rows}) red[warp][lane] = acc[lane];",
            "  __syncthreads();",
            "  #pragma unroll",
            f"  for (int m = 0; part == 0 && m < {m_rows}; ++m) {{",
            "    float t = 0.0f;",
            "    #pragma unroll",
            f"    for (int p = 0; p < {splits}; ++p) t += red[warp + p][m];",
            "    acc[m] = t;",
            "  }",
        ]
    return head, lines


def _gemv_tail(*, ahead, cpo, grid, groups, head, idx, ityp, k, ldw, lines, m_rows, n_groups, n_out, names, od, out,
    per_sm, preload, pro, program, rank, render_epilogue, spec, splits, text, warps, wave, whole_row):
    """The products of a block's rows, the combine of a column's warps and groups, the epilogue and the source."""
    def product(indent: str) -> list[str]:
        """`v` = alpha * the row's sum + beta * bias, at this warp's column of the product."""
        body = [f"{indent}float v = acc[m];"]
        if spec.alpha != 1.0:
            body.append(f"{indent}v = v * {literal(spec.alpha, 'float32')};")
        if spec.bias:
            bias = k.args[spec.b_arg + 1]
            at_n = {**idx, rank - 1: f"n + ({ityp})grp * {n_out}" if groups > 1 else "n"}
            at = " + ".join([str(bias.offset)] + [f"({at_n[d]}) * {s}" for d, s in enumerate(bias.strides)
                                                  if s and d in at_n])
            bv = load_expr(program.dtype_of(bias), f"a{spec.b_arg + 1}[{at}]")
            body.append(f"{indent}v = v + {bv}" + (f" * {literal(spec.beta, 'float32')};" if spec.beta != 1.0
                                                   else ";"))
        return body

    if groups > 1:
        # every row's value, rounded as the graph stores the product, to shared memory (two buffers, alternating
        # from one column group to the next); the warps of a column meet at a barrier of their own, and the first
        # group's warp finishes the column with every group's value. A barrier of the whole block here made its 16
        # warps wait for the slowest at every column group: the gate/up GEMV took 2 us longer than without groups
        par = "(it & 1)" if grid < n_groups else "0"
        lines += [
            f"  __shared__ float gacc[2][{groups * cpo}][{m_rows}];",
            "  #pragma unroll",
            f"  for (int m = 0; live && part == 0 && m < {m_rows}; ++m) {{",
            "    if (lane != m) continue;",
            *product("    "),
            f"    gacc[{par}][slot][m] = {round_expr('v', od)};",
            "  }",
            f'  if (part == 0) asm volatile("bar.sync %0, %1;" :: "r"(1 + col), "r"({32 * groups}) : "memory");',
            "  #pragma unroll",
            f"  for (int m = 0; live && part == 0 && grp == 0 && m < {m_rows}; ++m) {{",
            "    if (lane != m) continue;",
            *[f"    const float acc{g} = gacc[{par}][{g * cpo} + col][m];" for g in range(groups)],
        ]
        accs: str | list[str] = [f"acc{g}" for g in range(groups)]
    else:
        lines += [
            "  #pragma unroll",
            f"  for (int m = 0; live && part == 0 && m < {m_rows}; ++m) {{",
            "    if (lane != m) continue;  // every lane holds every sum: lane m finishes row m",
            *product("    "),
        ]
        accs = "accv"
    value, value_dtype = "v", "float32"
    if spec.epilogue is not None:
        if groups == 1:
            lines.append(f"    const float accv = {round_expr('v', od)};")
        lines += [f"    const {ityp} o{d} = {idx.get(d, '0')};" for d in range(rank)]
        body, value = render_epilogue(spec.epilogue, k, program, names, accs, ityp, "    ")
        lines += body
        value_dtype = spec.epilogue.dtype
    o_at = " + ".join([str(out.offset)] + [f"({idx[d]}) * {s}" for d, s in enumerate(out.strides)
                                           if s and d in idx])
    lines.append(f"    out0[{o_at}] = {store_expr(od, value, value_dtype)};")
    lines.append("  }")
    if preload and not ahead:
        lines.append("  first = false;")
    if grid < n_groups:
        if splits > 1:
            lines.append("  __syncthreads();  // `red` is written again by the next group")
        if groups > 1:
            lines.append("  ++it;")
        lines.append("  }")
    params = [f"{CUDA.storage(od)}* out0"] + [f"const {CUDA.storage(program.dtype_of(r))}* __restrict__ {n}"
                                              for r, n in zip(k.args, names)]
    shared = [f"  __shared__ {ty} {name}[{count}];" for name, (ty, count) in sorted(text.shared.items())]
    bounds = f"{32 * warps}, {per_sm}" if wave else f"{32 * warps}"
    src = "\n".join([PRELUDE, *sorted(text.helpers),
                     f'extern "C" __global__ void __launch_bounds__({bounds}) npu_kernel('
                     f'{", ".join(params)}) {{', *shared,
                     *([] if preload and whole_row else _prefetch(k, program, ityp, ldw, splits, cpo)),
                     *(_prologue_prefetch(k, program) if pro else []),
                     *head, "  npu_wait_prior();", *lines, "}"]) + "\n"
    return src


__all__ = ["gemv", "gemv_applies", "gemv_fits", "prologue_applies", "prologue_bytes", "GEMV_MAX_M"]
