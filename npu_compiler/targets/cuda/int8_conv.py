"""The integer implicit GEMM (`qconv2d`, `qgemm`) where both operand tiles move as 16-byte `cp.async` copies: the
int8 counterpart of conv_tc.py's fp16 kernel, bit for bit the CPU reference's integers.

out[p, o] = requant(sum_k a[p, k] * w[o, k] + bias[o]): for a conv p = (n, ho, wo) an output pixel (the GEMM's M),
o an output channel (N), k = (r, s, c) a window position and input channel (K). With channels-last int8
activations (the lowering keeps them so between layers) a pixel's K run for one window position is a contiguous
run of channels, and with the weight kept as [O, kh, kw, C] (WeightSpec.layout) an output channel's K run is too,
so both tiles are 16-byte copies, BK = 64 bytes a stage (two m16n8k32 steps) through `stages` shared-memory stages:
the copies of the next tiles are in flight while the tensor cores multiply. A window position outside the image
holds the input's zero point (a real 0): a zero-filled copy where that point is 0, a stored fill otherwise. K's
tail is zero-filled in both tiles. A linear (`qgemm`) is the same with its rows for pixels.

Fragments come from shared memory by `ldmatrix` (an int8 m16n8k32 fragment is the b16 one of m16n8k16, four bytes
a thread a register), rows 16 bytes longer than a stage's K so that its eight row reads fall in distinct banks.
uint8 activations are made signed by flipping each fragment byte's top bit (the zero point moves down 128). The
tensor cores multiply raw codes; the input's zero point za is applied once per output as za times the weight
column's sum over K (the weight's zero point is 0: symmetric), which the block sums from its B tiles, exact modulo
2^32 as the reference's int32 wrap. The epilogue (int8_common.requant_store) adds the int32 bias, requantizes per
output channel by TOSA's apply_scale_32 and clamps (a fused ReLU or clamp), or dequantizes to float32.

Tiles and stages are the record's plan (`Int8TilePlan`, `plan`): BM x BN outputs a block from the problem's shape and
the device's multiprocessors, as many stages as let two blocks share a multiprocessor's shared memory.
"""

from __future__ import annotations

from ...kernels import Int8TilePlan, QConv2dKernel, QConv2dPlan, QGemmKernel, QGemmPlan
from ...program import CompiledProgram, KernelCall
from ..clike import Launch, ptrs_of
from .common import PRELUDE, WAIT, mma_sync_ok
from .int8_common import (
    GATHER_TILES,
    INTEGER_HELPERS,
    column_values,
    plan_int8,
    requant_store,
    requant_value,
    residual_value,
    row_offsets,
)

BK = 64  # K bytes a stage: two m16n8k32 steps
ROW = BK + 16  # bytes a shared-memory row: ldmatrix's eight rows, 80 bytes apart, fall in distinct banks
CHUNKS = BK // 16  # 16-byte copies a tile row
# (BM, BN, warp rows, warp columns), largest first: a warp's tile is whole m16n8k32 steps, its columns in pairs of 8
# (an ldmatrix x4 of B gives two)
CONFIGS = ((128, 128, 64, 32), (128, 64, 32, 32), (64, 128, 32, 32), (64, 64, 32, 32), (32, 64, 32, 16))
MIN_STAGES, MAX_STAGES = 2, 4
MAX_STAGES_ALONE = 8  # a block alone on its SM (`plan`)
MIN_SPLIT_STEPS, MAX_SPLITS = 4, 16  # a K split's stages at least; splits at most
# a GEMM splits its K only from this many stages (K >= 1024): each split costs a launch summing the parts, which
# shorter loops do not repay (ResNet-50 at batch 1 on the H200 ran in 0.365 ms unsplit; its longest K loops, 72
# stages on 16 blocks, were its slowest kernels)
SPLIT_FROM_STEPS = 16
SUM_THREADS = 256  # the split sums' launch: a thread an output

HELPERS = r"""
__device__ __forceinline__ void npu_cp16(void* dst, const void* src, bool full) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(s), "l"(src), "r"(full ? 16 : 0));
}
__device__ __forceinline__ void npu_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void npu_wait_copies() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
__device__ __forceinline__ void npu_ldsm(unsigned* r, const void* p) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
"""


def _aligned(*values: int) -> bool:
    return all(v % 16 == 0 for v in values)


def applies(k: KernelCall) -> bool:
    """Whether this kernel runs this qconv2d or qgemm: a conv of one group, a linear without batch dims whose weight's
    zero point is 0 (the gathering kernel of int8_kernels.py takes the others)."""
    spec = k.spec
    if isinstance(spec, QGemmKernel):
        return not spec.batch and spec.b_zero_point == 0
    return isinstance(spec, QConv2dKernel) and spec.groups == 1


def copies_a(k: KernelCall) -> bool:
    """Whether the A tile (pixels or rows x K) moves as 16-byte copies: K contiguous in 16-byte aligned runs (a conv's
    input channels-last with 16k channels, K ordered channels innermost; a linear's rows)."""
    spec, a = k.spec, k.args[0]
    if isinstance(spec, QGemmKernel):
        return a.strides[1] == 1 and _aligned(a.strides[0], a.offset, spec.k)
    return (_channels_inner(k) and a.strides[1] == 1
            and _aligned(a.shape[1], a.strides[0], a.strides[2], a.strides[3], a.offset))


def copies_b(k: KernelCall) -> bool:
    """Whether the B tile (output channels x K) moves as 16-byte copies: the weight's rows contiguous along K in
    16-byte aligned runs (a conv's weight as [O, kh, kw, C] with 16k channels, or as [O, C, kh, kw] with K = 16k)."""
    spec, w = k.spec, k.args[1]
    if isinstance(spec, QGemmKernel):
        return w.strides[0] == 1 and _aligned(w.strides[1], w.offset, spec.k)
    o, c, kh, kw = w.shape
    if _channels_inner(k):
        return tuple(w.strides) == (kh * kw * c, 1, kw * c, c) and _aligned(c, w.offset)
    return tuple(w.strides) == (c * kh * kw, kh * kw, kw, 1) and _aligned(c * kh * kw, w.offset)


def _channels_inner(k: KernelCall) -> bool:
    """A conv's K order: (kh, kw, channel) where the weight is channels-last in memory (the lowering's [O, kh, kw, C]
    layout), else (channel, kh, kw), the weight's own order."""
    return k.args[1].strides[1] == 1


def _window(k: KernelCall, kx: str) -> str:
    """Declarations of K index `kx`'s channel `cc` and window row `kr` and column `ks` (a conv), in its K order."""
    _, c, kh, kw = k.args[1].shape
    if _channels_inner(k):
        return f"const int rs = {kx} / {c}, cc = {kx} % {c}, kr = rs / {kw}, ks = rs % {kw};"
    return f"const int cc = {kx} / {kh * kw}, kr = ({kx} / {kw}) % {kh}, ks = {kx} % {kw};"


def channels_last_ok(conv: tuple, dev) -> bool:
    """Whether an integer conv (dtypes, groups, input, weight and output shapes: CodegenTarget.convs_on_tensor_cores)
    runs here with channels-last activations: int8 matrix units, one group, 16-byte channel runs."""
    dtypes, groups, x_shape, w_shape, out_shape = conv
    return (mma_sync_ok(dev) and groups == 1 and len(x_shape) == 4 and len(w_shape) == 4 and x_shape[1] % 16 == 0
            and dtypes[1] == "int8")


def geometry(k: KernelCall) -> tuple[int, int, int]:
    """(M, N, K) of the GEMM."""
    spec = k.spec
    if isinstance(spec, QGemmKernel):
        return spec.m, spec.n, spec.k
    out, w = k.outs[0], k.args[1]
    return out.shape[0] * out.shape[2] * out.shape[3], w.shape[0], w.shape[1] * w.shape[2] * w.shape[3]


def _smem(bm: int, bn: int, stages: int) -> int:
    return (bm + bn) * ROW * stages


def plan(k: KernelCall, dev, x_dtype: str = "int8") -> Int8TilePlan:
    """The tile: the largest of CONFIGS (128 output channels where there are that many) that still gives every
    multiprocessor a block, else the one of any width with the most blocks (the smallest of those); the stages: as
    many (up to MAX_STAGES) as let two blocks share a multiprocessor's shared memory and one fit a block's, up to
    MAX_STAGES_ALONE where the grid has no more blocks than the device has multiprocessors. Where
    the tiles are not 16-byte copies (`applies`), the gathering kernel's tile (int8_common.plan_int8: one stage)."""
    m, n, _ = geometry(k)
    cls = QConv2dPlan if isinstance(k.spec, QConv2dKernel) else QGemmPlan
    if not applies(k):
        g = plan_int8(m, n, dev)
        return cls(g.bm, g.bn, g.bm // 2, g.bn // 2, 1)
    cfgs = [c for c in CONFIGS if c[1] == 128] if n > 64 else [c for c in CONFIGS if c[1] == 64]
    sms = max(dev.multiprocessors, 1)

    def tiles(c) -> int:
        return -(-m // c[0]) * -(-n // c[1])

    cfg = next((c for c in cfgs if tiles(c) >= sms), None) or max(CONFIGS, key=lambda c: (tiles(c), -c[0] * c[1]))
    bm, bn, wm, wn = cfg
    splits = _splits(k, tiles(cfg), sms, x_dtype)
    # a grid of at most a block an SM (one image's deep layers) keeps more copies in flight: its K loop is long and
    # each stage waits for memory, with no other block to hide the wait
    most, share = (MAX_STAGES, 2) if tiles(cfg) * splits > sms else (MAX_STAGES_ALONE, 1)
    stages = MIN_STAGES
    for s in range(most, MIN_STAGES - 1, -1):
        if share * _smem(bm, bn, s) <= dev.shared_memory_per_multiprocessor and \
                _smem(bm, bn, s) <= dev.shared_memory_per_block_optin:
            stages = s
            break
    return cls(bm, bn, wm, wn, stages, splits if splits > 1 else 0)


def _splits(k: KernelCall, tiles: int, sms: int, x_dtype: str) -> int:
    """Across how many blocks a GEMM of too few tiles for the device and a K of SPLIT_FROM_STEPS stages or more splits
    its K: about two blocks an SM, each at least MIN_SPLIT_STEPS stages long, at most MAX_SPLITS; none where the
    input's zero point is not 0 once flipped (its share needs each block's weight column sums) or the result is
    float."""
    spec = k.spec
    za = spec.x_zero_point if isinstance(spec, QConv2dKernel) else spec.a_zero_point
    if tiles >= sms or spec.dequantize or za != (128 if x_dtype == "uint8" else 0):
        return 1
    kt = -(-geometry(k)[2] // BK)
    if kt < SPLIT_FROM_STEPS:
        return 1
    return max(1, min(-(-2 * sms // tiles), kt // MIN_SPLIT_STEPS, MAX_SPLITS))


def _conv_rows(k: KernelCall, per: int, row: str, ityp: str, m: int) -> str:
    """Declarations of this thread's `per` pixels of every A tile (`row`, an expression of i < per): each one's
    offset in the input at its window's corner and that corner's row and column (-2^30: a pixel past M)."""
    x, out = k.args[0], k.outs[0]
    xs = x.strides
    ho, wo = out.shape[2], out.shape[3]
    (sh, sw), (ph, pw) = k.spec.stride, k.spec.padding
    return f"""  {ityp} a_base[{per}]; int a_ih[{per}], a_iw[{per}];
  #pragma unroll
  for (int i = 0; i < {per}; ++i) {{
    const {ityp} p = m0 + {row};
    const {ityp} ow = p % {wo}, oh = (p / {wo}) % {ho}, nb = p / {wo * ho};
    a_ih[i] = p < {m} ? (int)(oh * {sh} - {ph}) : -{2 ** 30};
    a_iw[i] = (int)(ow * {sw} - {pw});
    a_base[i] = {x.offset} + nb * {xs[0]} + oh * {sh * xs[2]} + ow * {sw * xs[3]} - {ph * xs[2] + pw * xs[3]};
  }}"""


def _gemm_rows(k: KernelCall, per: int, row: str, ityp: str, m: int) -> str:
    a = k.args[0]
    return f"""  {ityp} a_base[{per}];
  #pragma unroll
  for (int i = 0; i < {per}; ++i) {{
    const {ityp} p = m0 + {row};
    a_base[i] = p < {m} ? {a.offset} + p * {a.strides[0]} : -1;
  }}"""


def _a_loader(k: KernelCall, threads: int, bm: int, ityp: str, m: int) -> tuple[str, str]:
    """(setup, body) of the A tile's loader: the setup finds this thread's rows once, the body (with `kx`, `As`)
    fills one stage: 16-byte copies of K runs (`copies_a`), else one byte an element through the operand's strides
    (neighbouring threads neighbouring rows: a conv's neighbouring pixels), the padding and K's tail the zero
    point."""
    spec, x = k.spec, k.args[0]
    kdim = geometry(k)[2]
    fill = (spec.x_zero_point if isinstance(spec, QConv2dKernel) else spec.a_zero_point) & 0xFF
    gemm = isinstance(spec, QGemmKernel)
    if copies_a(k):
        per = bm * CHUNKS // threads
        row = f"(tid / {CHUNKS} + i * {threads // CHUNKS})"
        setup = (_gemm_rows if gemm else _conv_rows)(k, per, row, ityp, m)
        dst = f"unsigned char* dst = &As[({row}) * {ROW} + ch * 16];"
        if gemm:
            return setup, f"""    #pragma unroll
    for (int i = 0; i < {per}; ++i) {{
      const bool full = kx < {kdim} && a_base[i] >= 0;
      {dst}
      npu_cp16(dst, a0 + (full ? a_base[i] + kx : 0), full);
    }}"""
        _, _, h, wd = x.shape
        (dh, dw), xs = spec.dilation, x.strides
        fill_word = f"0x{fill * 0x01010101:08x}u"
        if fill:  # padding holds the zero point: stored, as a copy fills only zeros (K's tail: B is 0 there)
            place = (f"if (inside || !in_k) npu_cp16(dst, src, inside);\n"
                     f"      else *(uint4*)dst = make_uint4({fill_word}, {fill_word}, {fill_word}, {fill_word});")
        else:
            place = "npu_cp16(dst, src, inside);"
        return setup, f"""    {_window(k, "kx")}
    const bool in_k = kx < {kdim};
    #pragma unroll
    for (int i = 0; i < {per}; ++i) {{
      const int ih = a_ih[i] + kr * {dh}, iw = a_iw[i] + ks * {dw};
      const bool inside = in_k && ih >= 0 && ih < {h} && iw >= 0 && iw < {wd};
      {dst}
      const signed char* src = (const signed char*)a0 + (inside ? a_base[i] + cc * {xs[1]}
                                                    + ({ityp})(kr * {dh}) * {xs[2]} + ({ityp})(ks * {dw}) * {xs[3]}
                                                    : 0);
      {place}
    }}"""
    # one row a thread (the same of every tile), BK / (threads / BM) of its K a stage
    per = BK * bm // threads
    step = threads // bm
    setup = (_gemm_rows if gemm else _conv_rows)(k, 1, f"(tid % {bm})", ityp, m)
    head = f"""    #pragma unroll 4
    for (int j = 0; j < {per}; ++j) {{
      const int kl = tid / {bm} + j * {step}, ke = kx - ch * 16 + kl;
      unsigned char v = {fill};"""
    store = f"      As[(tid % {bm}) * {ROW} + kl] = v;\n    }}"
    if gemm:
        return setup, f"""{head}
      if (ke < {kdim} && a_base[0] >= 0) v = (unsigned char)a0[a_base[0] + ({ityp})ke * {x.strides[1]}];
{store}"""
    _, _, h, wd = x.shape
    (dh, dw), xs = spec.dilation, x.strides
    if window_table(k, ityp):
        return setup, f"""{head}
      const int4 q = npu_ktab[ke];
      const int ih = a_ih[0] + q.y, iw = a_iw[0] + q.z;
      if (ke < {kdim} && ih >= 0 && ih < {h} && iw >= 0 && iw < {wd}) v = (unsigned char)a0[a_base[0] + q.x];
{store}"""
    return setup, f"""{head}
      {_window(k, "ke")}
      const int ih = a_ih[0] + kr * {dh}, iw = a_iw[0] + ks * {dw};
      if (ke < {kdim} && ih >= 0 && ih < {h} && iw >= 0 && iw < {wd})
        v = (unsigned char)a0[a_base[0] + cc * {xs[1]} + ({ityp})(kr * {dh}) * {xs[2]} + ({ityp})(ks * {dw}) * {xs[3]}];
{store}"""


TABLE_MAX_K = 1024  # K positions a window table holds at most (16 bytes each, in shared memory)


def window_table(k: KernelCall, ityp: str) -> bool:
    """Whether a conv with a gathered tile finds each K position's input offset, window row and column and weight
    offset in a table it fills once in shared memory (`npu_ktab`, TABLE_MAX_K entries at most, 32-bit offsets),
    instead of dividing K by the window's sizes for every byte (the stem: 3 channels, 7 x 7)."""
    if not isinstance(k.spec, QConv2dKernel) or (copies_a(k) and copies_b(k)) or ityp != "int":
        return False
    return -(-geometry(k)[2] // BK) * BK <= TABLE_MAX_K


def _table_fill(k: KernelCall, threads: int, at: str) -> str:
    """Statements filling the window table at shared address `at` (then a barrier)."""
    x, w = k.args[0], k.args[1]
    kpad = -(-geometry(k)[2] // BK) * BK
    xs, ws = x.strides, w.strides
    dh, dw = k.spec.dilation
    return f"""  // each K position: input offset, window row, window column, weight offset
  int4* npu_ktab = (int4*)({at});
  for (int e = tid; e < {kpad}; e += {threads}) {{
    {_window(k, "e")}
    npu_ktab[e] = make_int4(cc * {xs[1]} + kr * {dh * xs[2]} + ks * {dw * xs[3]}, kr * {dh}, ks * {dw},
                            cc * {ws[1]} + kr * {ws[2]} + ks * {ws[3]});
  }}
  __syncthreads();"""


def _b_loader(k: KernelCall, threads: int, bn: int, ityp: str) -> str:
    """The body filling one stage of the B tile (output channels x K, with `kx`, `Bs`): 16-byte copies of the
    weight's rows (`copies_b`), else a byte an element through its strides (neighbouring threads neighbouring K);
    columns past N and K's tail 0."""
    spec, w = k.spec, k.args[1]
    n, kdim = geometry(k)[1:]
    if copies_b(k):
        per = -(-bn * CHUNKS // threads)
        row = f"(tid / {CHUNKS} + i * {threads // CHUNKS})"
        past = f"\n      if ({row} >= {bn}) break;" if bn * CHUNKS % threads else ""
        ldb = w.strides[1] if isinstance(spec, QGemmKernel) else kdim
        return f"""    #pragma unroll
    for (int i = 0; i < {per}; ++i) {{{past}
      const int col = n0 + {row};
      const bool full = col < {n} && kx < {kdim};
      npu_cp16(&Bs[({row}) * {ROW} + ch * 16], a1 + (full ? {w.offset} + ({ityp})col * {ldb} + kx : 0), full);
    }}"""
    per = bn * BK // threads
    if isinstance(spec, QGemmKernel):
        window, at = "", f"{w.offset} + ({ityp})ke * {w.strides[0]} + ({ityp})col * {w.strides[1]}"
    elif window_table(k, ityp):
        window, at = "const int4 q = npu_ktab[ke];", f"{w.offset} + ({ityp})col * {w.strides[0]} + q.w"
    else:
        ws = w.strides
        window = _window(k, "ke")
        at = f"{w.offset} + ({ityp})col * {ws[0]} + cc * {ws[1]} + kr * {ws[2]} + ks * {ws[3]}"
    return f"""    #pragma unroll 4
    for (int j = 0; j < {per}; ++j) {{
      const int e = tid + j * {threads}, row = e / {BK}, kl = e % {BK}, col = n0 + row, ke = kx - ch * 16 + kl;
      {window}
      Bs[row * {ROW} + kl] = col < {n} && ke < {kdim} ? (unsigned char)a1[{at}] : (unsigned char)0;
    }}"""


def tile_plan(k: KernelCall, dev) -> Int8TilePlan:
    """The record's plan where this kernel can honour it on this device (one of its tiles, stages that fit), else the
    one `plan` makes for the device."""
    p = k.plan
    if isinstance(p, Int8TilePlan) and p.chosen:
        if not applies(k):
            if p.stages == 1 and (p.bm, p.bn) in GATHER_TILES:
                return p
        elif (p.bm, p.bn, p.warp_m, p.warp_n) in CONFIGS and MIN_STAGES <= p.stages <= MAX_STAGES_ALONE \
                and _smem(p.bm, p.bn, p.stages) <= dev.shared_memory_per_block_optin:
            return p
    return plan(k, dev)


def threads(k: KernelCall, dev) -> int:
    pl = tile_plan(k, dev)
    return 32 * (pl.bm // pl.warp_m) * (pl.bn // pl.warp_n)


def render(k: KernelCall, program: CompiledProgram, dev, signature: str, ityp: str, flip: bool, za: int
           ) -> list[tuple[str, Launch]]:
    """The launches of one qconv2d or qgemm this path `applies` to (a second one summing a K split's parts); `za`:
    the input's zero point after a uint8 operand's flip."""
    pl = tile_plan(k, dev)
    bm, bn, wm, wn, stages = pl.bm, pl.bn, pl.warp_m, pl.warp_n, pl.stages
    m, n, kdim = geometry(k)
    # K split only where the program holds the scratch the plan asked for (and no zero point's share is needed)
    splits = pl.splits if pl.splits > 1 and k.scratch and za == 0 and not k.spec.dequantize else 1
    warps_n = bn // wn
    nthreads = 32 * (bm // wm) * warps_n
    fm, fn = wm // 16, wn // 8
    tiles_n = -(-n // bn)
    tiles = -(-m // bm) * tiles_n
    kt_n = -(-kdim // BK)
    a_setup, a_body = _a_loader(k, nthreads, bm, ityp, m)
    b_body = _b_loader(k, nthreads, bn, ityp)
    a_stage, b_stage = bm * ROW, bn * ROW
    smem = _smem(bm, bn, stages)
    table = ""
    if window_table(k, ityp):
        table = _table_fill(k, nthreads, f"npu_smem + {smem}")
        smem += -(-kdim // BK) * BK * 16
    xor = "".join(f" af[i][{q}] ^= 0x80808080u;" for q in range(4)) if flip else ""
    colsum = za != 0
    sum_b = f"""
    if (tid < {bn}) {{  // the weight columns' sums over K (the zero point's share of each output)
      const unsigned* r_ = (const unsigned*)&Bs[tid * {ROW}];
      #pragma unroll
      for (int q = 0; q < {BK // 4}; ++q) npu_csum = __dp4a((int)r_[q], 0x01010101, npu_csum);
    }}""" if colsum else ""
    cs_store = f"""
  __syncthreads();
  if (tid < {bn}) npu_cs[tid] = npu_csum;
  __syncthreads();""" if colsum else ""
    correct = f"s - (unsigned)({za}) * (unsigned)npu_cs[lc]" if colsum else "s"
    shape = (m, n, bm, bn, wm, wn, fm, fn, nthreads)
    if splits > 1:
        epilogue_src = _split_epilogue(shape, splits)
    else:
        epilogue_src = (_staged_epilogue(k, program, ityp, correct, shape) if staged_epilogue(k)
                        else _direct_epilogue(k, program, ityp, correct, shape))
    kt_per = -(-kt_n // splits)
    src = f"""{PRELUDE}{_integer_helpers()}{HELPERS}
{signature} {{
{WAIT}
  extern __shared__ __align__(16) unsigned char npu_smem[];
  {f"__shared__ int npu_cs[{bn}];" if colsum else ""}
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  const int wm0 = (warp / {warps_n}) * {wm}, wn0 = (warp % {warps_n}) * {wn};
  const {ityp} tile = blockIdx.x % {tiles};
  const int npu_split = (int)(blockIdx.x / {tiles});  // (K split: this block's share of K)
  const int kt0 = npu_split * {kt_per}, kn = min({kt_n} - kt0, {kt_per});
  const {ityp} m0 = (tile / {tiles_n}) * {bm};
  const int n0 = (int)(tile % {tiles_n}) * {bn};
  const int ch = tid % {CHUNKS};
{table}
{a_setup}
  auto load = [&](int st, int k0) {{
    const int kx = k0 + ch * 16;
    unsigned char* As = npu_smem + st * {a_stage};
    unsigned char* Bs = npu_smem + {stages * a_stage} + st * {b_stage};
{a_body}
{b_body}
  }};
  int acc[{fm}][{fn}][4];
  #pragma unroll
  for (int i = 0; i < {fm}; ++i)
    #pragma unroll
    for (int j = 0; j < {fn}; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0;
  {"int npu_csum = 0;" if colsum else ""}
  #pragma unroll
  for (int s = 0; s < {stages - 1}; ++s) {{
    if (s < kn) load(s, (kt0 + s) * {BK});
    npu_commit();
  }}
  for (int kt = 0; kt < kn; ++kt) {{
    npu_wait_copies<{stages - 2}>();
    __syncthreads();
    {{
      const int nk = kt + {stages - 1};
      if (nk < kn) load(nk % {stages}, (kt0 + nk) * {BK});
      npu_commit();
    }}
    const unsigned char* As = npu_smem + (kt % {stages}) * {a_stage};
    const unsigned char* Bs = npu_smem + {stages * a_stage} + (kt % {stages}) * {b_stage};{sum_b}
    #pragma unroll
    for (int kk = 0; kk < {BK}; kk += 32) {{
      unsigned af[{fm}][4], bf[{fn // 2}][4];
      #pragma unroll
      for (int i = 0; i < {fm}; ++i) {{
        npu_ldsm(af[i], &As[(wm0 + i * 16 + (lane & 15)) * {ROW} + kk + (lane >> 4) * 16]);{xor}
      }}
      #pragma unroll
      for (int j = 0; j < {fn // 2}; ++j)
        npu_ldsm(bf[j], &Bs[(wn0 + j * 16 + (lane & 7) + ((lane >> 4) << 3)) * {ROW} + kk + ((lane >> 3) & 1) * 16]);
      #pragma unroll
      for (int i = 0; i < {fm}; ++i)
        #pragma unroll
        for (int j = 0; j < {fn}; ++j) npu_mma_s8(acc[i][j], af[i], &bf[j >> 1][(j & 1) * 2]);
    }}
  }}
  npu_wait_copies<0>();{cs_store}
{epilogue_src}
}}
"""
    main = (src, Launch((tiles * splits, 1, 1), nthreads, ptrs_of(k), smem))
    if splits == 1:
        return [main]
    return [main, _split_sum(k, program, signature.replace(f"__launch_bounds__({nthreads})",
                                                            f"__launch_bounds__({SUM_THREADS})"), m, n, splits, dev)]


def _split_epilogue(shape: tuple, splits: int) -> str:
    """A split block's raw sums into its part of the scratch ([split, M, N] int32, the launch's second output)."""
    m, n, _, _, _, _, fm, fn, _ = shape
    part = "long long" if splits * m * n >= 2**31 else "int"
    return f"""  #pragma unroll
  for (int i = 0; i < {fm}; i++)
    #pragma unroll
    for (int j = 0; j < {fn}; j++)
      #pragma unroll
      for (int q = 0; q < 4; q++) {{
        const {part} r = m0 + wm0 + i * 16 + gq + (q >> 1) * 8;
        const int c = n0 + wn0 + j * 8 + tq * 2 + (q & 1);
        if (r < {m} && c < {n}) out1[(npu_split * {m} + r) * {n} + c] = acc[i][j][q];
      }}"""


def _split_sum(k: KernelCall, program: CompiledProgram, signature: str, m: int, n: int, splits: int, dev
               ) -> tuple[str, Launch]:
    """The second launch of a split GEMM: each output's parts added (wrapping, in split order), then the epilogue."""
    total = m * n
    ityp = "long long" if splits * total >= 2**31 else "int"
    epi = "\n    ".join(requant_store(k, program))
    src = f"""{PRELUDE}{_integer_helpers()}
{signature} {{
{WAIT}
  for ({ityp} e = ({ityp})blockIdx.x * {SUM_THREADS} + threadIdx.x; e < {total};
       e += ({ityp})gridDim.x * {SUM_THREADS}) {{
    const {ityp} r = e / {n};
    const int c = (int)(e % {n});
    unsigned s = 0;
    #pragma unroll
    for (int p = 0; p < {splits}; p++) s += (unsigned)out1[p * {total} + e];
    unsigned t = s;
    {epi}
  }}
}}
"""
    grid = max(1, min(-(-total // SUM_THREADS), dev.multiprocessors * 8))
    return src, Launch((grid, 1, 1), SUM_THREADS, ptrs_of(k))


def _fragment_loops(k: KernelCall, program: CompiledProgram, fm: int, fn: int, n: int) -> str:
    """The epilogue's loops over this thread's fragments, column (c, each column's values declared once) outside,
    row (i, h) inside, opening the innermost body."""
    return f"""  #pragma unroll
  for (int j = 0; j < {fn}; j++)
    #pragma unroll
    for (int e = 0; e < 2; e++) {{
      const int lc = wn0 + j * 8 + tq * 2 + e;
      const int c = n0 + lc;
      if (c >= {n}) continue;
      {column_values(k, program)}
      #pragma unroll
      for (int i = 0; i < {fm}; i++)
        #pragma unroll
        for (int h = 0; h < 2; h++) {{"""


def _direct_epilogue(k: KernelCall, program: CompiledProgram, ityp: str, correct: str, shape: tuple) -> str:
    """Each thread stores its fragments' outputs itself, through the output's strides."""
    m, n, _, _, wm, wn, fm, fn, _ = shape
    epi = "\n            ".join(requant_store(k, program, hoisted=True))
    rows = row_offsets(k, ityp)
    skip_row = f"\n            const {ityp} npu_srow = npu_rows[i][h][1];" if len(rows) > 1 else ""
    return f"""  // the epilogue: each thread's rows' output (and skip) offsets found once, each column's values once
  {ityp} npu_rows[{fm}][2][{len(rows)}];
  #pragma unroll
  for (int i = 0; i < {fm}; i++)
    #pragma unroll
    for (int h = 0; h < 2; h++) {{
      const {ityp} r = m0 + wm0 + i * 16 + gq + h * 8;
      {" ".join(f"npu_rows[i][h][{e}] = {x};" for e, x in enumerate(rows))}
    }}
{_fragment_loops(k, program, fm, fn, n)}
          const {ityp} r = m0 + wm0 + i * 16 + gq + h * 8;
          if (r < {m}) {{
            const {ityp} npu_orow = npu_rows[i][h][0];{skip_row}
            const unsigned s = (unsigned)acc[i][j][h * 2 + e];
            unsigned t = {correct};
            {epi}
          }}
        }}
    }}"""


def _rows_aligned(k: KernelCall, ref) -> bool:
    """A tensor whose rows (a conv's pixels, a linear's rows) hold their columns contiguous from 16-byte aligned
    starts."""
    row_strides = ref.strides[:1] if isinstance(k.spec, QGemmKernel) else (ref.strides[0], *ref.strides[2:])
    return ref.strides[1] == 1 and _aligned(ref.offset, *row_strides)


def staged_epilogue(k: KernelCall) -> bool:
    """Whether the block's int8 results go out through shared memory as 16-byte row runs: a requantizing kernel
    whose output (and skip tensor) rows are contiguous and aligned (channels-last), N a multiple of 16."""
    spec = k.spec
    n = geometry(k)[1]
    residual = getattr(spec, "residual", None)
    return (not spec.dequantize and n % 16 == 0 and _rows_aligned(k, k.outs[0])
            and (residual is None or _rows_aligned(k, k.args[-1])))


def _staged_epilogue(k: KernelCall, program: CompiledProgram, ityp: str, correct: str, shape: tuple) -> str:
    """The requantized results of the block's tile into shared memory (over the stages, free by then), then each
    thread 16 bytes of a row at a time: a 16-byte store of the output (the fused add's skip read 16 bytes too),
    neighbouring threads neighbouring runs of a row."""
    m, n, bm, bn, wm, wn, fm, fn, threads = shape
    pitch = bn + 16  # bytes a row of the staged tile: 16-byte aligned rows
    runs = bn // 16
    rows = row_offsets(k, ityp)
    q = "\n            ".join(requant_value(k))
    if getattr(k.spec, "residual", None) is not None:
        mid = "(int)(signed char)" if k.spec.residual.mid_dtype == "int8" else "(int)(unsigned char)"
        sk = "(int)(signed char)" if program.buffers[k.args[-1].buffer].dtype == "int8" else "(int)(unsigned char)"
        add = residual_value(k, f"{mid}(w >> (8 * b))", f"{sk}(sw >> (8 * b))")
        combine = f"""
        const uint4 sv = *(const uint4*)((const unsigned char*)a{len(k.args) - 1} + ({rows[1]}) + c);
        const unsigned in_[4] = {{v.x, v.y, v.z, v.w}}, sk_[4] = {{sv.x, sv.y, sv.z, sv.w}};
        unsigned res_[4];
        #pragma unroll
        for (int u = 0; u < 4; u++) {{
          const unsigned w = in_[u], sw = sk_[u];
          unsigned o_ = 0;
          #pragma unroll
          for (int b = 0; b < 4; b++) o_ |= ((unsigned)({add}) & 0xffu) << (8 * b);
          res_[u] = o_;
        }}
        v = make_uint4(res_[0], res_[1], res_[2], res_[3]);"""
    else:
        combine = ""
    return f"""  // the epilogue: the tile's requantized results staged in shared memory, then written 16 bytes a time
  __syncthreads();  // (every warp is done with the stages)
  unsigned char* npu_ot = npu_smem;
{_fragment_loops(k, program, fm, fn, n)}
          const int lr = wm0 + i * 16 + gq + h * 8;
          const unsigned s = (unsigned)acc[i][j][h * 2 + e];
          unsigned t = {correct};
          {q}
          npu_ot[lr * {pitch} + lc] = (unsigned char)npu_q;
        }}
    }}
  __syncthreads();
  for (int e = tid; e < {bm * runs}; e += {threads}) {{
    const int lr = e / {runs}, lc = (e % {runs}) * 16;
    const {ityp} r = m0 + lr;
    const int c = n0 + lc;
    if (r < {m} && c < {n}) {{
      uint4 v = *(const uint4*)&npu_ot[lr * {pitch} + lc];{combine}
      *(uint4*)((unsigned char*)out0 + ({rows[0]}) + c) = v;
    }}
  }}"""


def _integer_helpers() -> str:
    return INTEGER_HELPERS


__all__ = ["applies", "plan", "render", "threads", "tile_plan"]
