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
2^32 as the reference's int32 wrap. The epilogue (int8_kernels.requant_store) adds the int32 bias, requantizes per
output channel by TOSA's apply_scale_32 and clamps (a fused ReLU or clamp), or dequantizes to float32.

Tiles and stages are the record's plan (`Int8TilePlan`, `plan`): BM x BN outputs a block from the problem's shape and
the device's multiprocessors, as many stages as let two blocks share a multiprocessor's shared memory.
"""

from __future__ import annotations

from ...kernels import Int8TilePlan, QConv2dKernel, QConv2dPlan, QGemmKernel, QGemmPlan
from ...program import CompiledProgram, KernelCall
from ..clike import Launch, ptrs_of
from .common import PRELUDE, WAIT, mma_sync_ok

BK = 64  # K bytes a stage: two m16n8k32 steps
ROW = BK + 16  # bytes a shared-memory row: ldmatrix's eight rows, 80 bytes apart, fall in distinct banks
CHUNKS = BK // 16  # 16-byte copies a tile row
# (BM, BN, warp rows, warp columns), largest first: a warp's tile is whole m16n8k32 steps, its columns in pairs of 8
# (an ldmatrix x4 of B gives two)
CONFIGS = ((128, 128, 64, 32), (128, 64, 32, 32), (64, 128, 32, 32), (64, 64, 32, 32), (32, 64, 32, 16))
MIN_STAGES, MAX_STAGES = 2, 4
GATHER_TILES = ((128, 64), (64, 64), (32, 32))  # the gathering kernel's (int8_kernels.py), one stage

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
    """Whether both tiles of this qconv2d or qgemm are 16-byte copies: K runs contiguous in 16-byte aligned rows (a
    conv's input channels-last, one group, a multiple of 16 channels, its weight [O, kh, kw, C]; a linear's rows and
    its weight's rows along K), and the weight's zero point 0."""
    spec = k.spec
    if isinstance(spec, QGemmKernel):
        a, b = k.args[0], k.args[1]
        return (not spec.batch and spec.b_zero_point == 0 and a.strides[1] == 1 and b.strides[0] == 1
                and _aligned(a.strides[0], a.offset, b.strides[1], b.offset, spec.k))
    if not isinstance(spec, QConv2dKernel) or spec.groups != 1:
        return False
    x, w = k.args[0], k.args[1]
    o, c, kh, kw = w.shape
    return (x.strides[1] == 1 and _aligned(c, x.strides[0], x.strides[2], x.strides[3], x.offset, w.offset)
            and tuple(w.strides) == (kh * kw * c, 1, kw * c, c))


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


def plan(k: KernelCall, dev) -> Int8TilePlan:
    """The tile: the largest of CONFIGS (128 output channels where there are that many) that still gives every
    multiprocessor a block, else the one of any width with the most blocks (the smallest of those); the stages: as
    many (up to MAX_STAGES) as let two blocks share a multiprocessor's shared memory and one fit a block's. Where
    the tiles are not 16-byte copies (`applies`), the gathering kernel's tile (int8_kernels.plan_int8: one stage)."""
    m, n, _ = geometry(k)
    cls = QConv2dPlan if isinstance(k.spec, QConv2dKernel) else QGemmPlan
    if not applies(k):
        from .int8_kernels import plan_int8

        g = plan_int8(m, n, dev)
        return cls(g.bm, g.bn, g.bm // 2, g.bn // 2, 1)
    cfgs = [c for c in CONFIGS if c[1] == 128] if n > 64 else [c for c in CONFIGS if c[1] == 64]
    sms = max(dev.multiprocessors, 1)

    def tiles(c) -> int:
        return -(-m // c[0]) * -(-n // c[1])

    cfg = next((c for c in cfgs if tiles(c) >= sms), None) or max(CONFIGS, key=lambda c: (tiles(c), -c[0] * c[1]))
    bm, bn, wm, wn = cfg
    stages = MIN_STAGES
    for s in range(MAX_STAGES, MIN_STAGES - 1, -1):
        if 2 * _smem(bm, bn, s) <= dev.shared_memory_per_multiprocessor and \
                _smem(bm, bn, s) <= dev.shared_memory_per_block_optin:
            stages = s
            break
    return cls(bm, bn, wm, wn, stages)


def _a_setup(k: KernelCall, per: int, row: str, ityp: str, m: int) -> tuple[str, str]:
    """This thread's A rows of every tile (found once) and the loader of one A stage: (setup, loader body)."""
    spec = k.spec
    if isinstance(spec, QGemmKernel):
        a = k.args[0]
        setup = f"""  {ityp} a_base[{per}];
  #pragma unroll
  for (int i = 0; i < {per}; ++i) {{
    const {ityp} p = m0 + {row};
    a_base[i] = p < {m} ? {a.offset} + p * {a.strides[0]} : -1;
  }}"""
        body = f"""    #pragma unroll
    for (int i = 0; i < {per}; ++i) {{
      const bool full = kx < {spec.k} && a_base[i] >= 0;
      npu_cp16(&As[({row}) * {ROW} + ch * 16], a0 + (full ? a_base[i] + kx : 0), full);
    }}"""
        return setup, body
    x, w, out = k.args[0], k.args[1], k.outs[0]
    _, c, h, wd = x.shape
    _, _, kh, kw = w.shape
    ho, wo = out.shape[2], out.shape[3]
    xs = x.strides
    (sh, sw), (ph, pw), (dh, dw) = spec.stride, spec.padding, spec.dilation
    kdim = c * kh * kw
    setup = f"""  {ityp} a_base[{per}]; int a_ih[{per}], a_iw[{per}];
  #pragma unroll
  for (int i = 0; i < {per}; ++i) {{
    const {ityp} p = m0 + {row};
    const {ityp} ow = p % {wo}, oh = (p / {wo}) % {ho}, nb = p / {wo * ho};
    a_ih[i] = p < {m} ? (int)(oh * {sh} - {ph}) : -{2 ** 30};
    a_iw[i] = (int)(ow * {sw} - {pw});
    a_base[i] = {x.offset} + nb * {xs[0]} + oh * {sh * xs[2]} + ow * {sw * xs[3]} - {ph * xs[2] + pw * xs[3]};
  }}"""
    fill = spec.x_zero_point & 0xFF
    fill_word = f"0x{fill * 0x01010101:08x}u"
    if fill:  # padding holds the zero point: stored, as a copy fills only zeros
        place = (f"if (inside || !in_k) npu_cp16(dst, src, inside);\n"
                 f"      else *(uint4*)dst = make_uint4({fill_word}, {fill_word}, {fill_word}, {fill_word});")
    else:
        place = "npu_cp16(dst, src, inside);"
    body = f"""    const int rs = kx / {c}, cc = kx % {c}, kr = rs / {kw}, ks = rs % {kw};
    const bool in_k = kx < {kdim};
    #pragma unroll
    for (int i = 0; i < {per}; ++i) {{
      const int ih = a_ih[i] + kr * {dh}, iw = a_iw[i] + ks * {dw};
      const bool inside = in_k && ih >= 0 && ih < {h} && iw >= 0 && iw < {wd};
      unsigned char* dst = &As[({row}) * {ROW} + ch * 16];
      const signed char* src = (const signed char*)a0 + (inside ? a_base[i] + cc + ({ityp})(kr * {dh}) * {xs[2]}
                                                    + ({ityp})(ks * {dw}) * {xs[3]} : 0);
      {place}
    }}"""
    return setup, body


def tile_plan(k: KernelCall, dev) -> Int8TilePlan:
    """The record's plan where this kernel can honour it on this device (one of its tiles, stages that fit), else the
    one `plan` makes for the device."""
    p = k.plan
    if isinstance(p, Int8TilePlan) and p.chosen:
        if not applies(k):
            if p.stages == 1 and (p.bm, p.bn) in GATHER_TILES:
                return p
        elif (p.bm, p.bn, p.warp_m, p.warp_n) in CONFIGS and MIN_STAGES <= p.stages <= MAX_STAGES \
                and _smem(p.bm, p.bn, p.stages) <= dev.shared_memory_per_block_optin:
            return p
    return plan(k, dev)


def threads(k: KernelCall, dev) -> int:
    pl = tile_plan(k, dev)
    return 32 * (pl.bm // pl.warp_m) * (pl.bn // pl.warp_n)


def render(k: KernelCall, program: CompiledProgram, dev, signature: str, ityp: str, flip: bool, za: int
           ) -> tuple[str, Launch]:
    """The kernel of one qconv2d or qgemm this path `applies` to; `za`: the input's zero point after a uint8
    operand's flip."""
    from .int8_kernels import column_values, requant_store, row_offsets

    epilogue = requant_store(k, program, hoisted=True)
    columns = column_values(k, program)
    rows = row_offsets(k, ityp)
    skip_row = f"\n            const {ityp} npu_srow = npu_rows[i][h][1];" if len(rows) > 1 else ""
    pl = tile_plan(k, dev)
    bm, bn, wm, wn, stages = pl.bm, pl.bn, pl.warp_m, pl.warp_n, pl.stages
    m, n, kdim = geometry(k)
    warps_n = bn // wn
    nthreads = 32 * (bm // wm) * warps_n
    fm, fn = wm // 16, wn // 8
    tiles_n = -(-n // bn)
    tiles = -(-m // bm) * tiles_n
    kt_n = -(-kdim // BK)
    per_a, per_b = bm * CHUNKS // nthreads, -(-bn * CHUNKS // nthreads)
    rows_per = nthreads // CHUNKS
    row = f"(tid / {CHUNKS} + i * {rows_per})"
    a_setup, a_body = _a_setup(k, per_a, row, ityp, m)
    w = k.args[1]
    ldb = w.strides[1] if isinstance(k.spec, QGemmKernel) else kdim
    past = f"\n      if ({row} >= {bn}) break;" if bn * CHUNKS % nthreads else ""
    a_stage, b_stage = bm * ROW, bn * ROW
    smem = _smem(bm, bn, stages)
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
    epi = "\n            ".join(epilogue)
    src = f"""{PRELUDE}{_integer_helpers()}{HELPERS}
{signature} {{
{WAIT}
  extern __shared__ __align__(16) unsigned char npu_smem[];
  {f"__shared__ int npu_cs[{bn}];" if colsum else ""}
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  const int wm0 = (warp / {warps_n}) * {wm}, wn0 = (warp % {warps_n}) * {wn};
  const {ityp} tile = blockIdx.x;
  const {ityp} m0 = (tile / {tiles_n}) * {bm};
  const int n0 = (int)(tile % {tiles_n}) * {bn};
  const int ch = tid % {CHUNKS};
{a_setup}
  auto load = [&](int st, int k0) {{
    const int kx = k0 + ch * 16;
    unsigned char* As = npu_smem + st * {a_stage};
    unsigned char* Bs = npu_smem + {stages * a_stage} + st * {b_stage};
{a_body}
    #pragma unroll
    for (int i = 0; i < {per_b}; ++i) {{{past}
      const int col = n0 + {row};
      const bool full = col < {n} && kx < {kdim};
      npu_cp16(&Bs[({row}) * {ROW} + ch * 16], a1 + (full ? {w.offset} + ({ityp})col * {ldb} + kx : 0), full);
    }}
  }};
  int acc[{fm}][{fn}][4];
  #pragma unroll
  for (int i = 0; i < {fm}; ++i)
    #pragma unroll
    for (int j = 0; j < {fn}; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0;
  {"int npu_csum = 0;" if colsum else ""}
  #pragma unroll
  for (int s = 0; s < {stages - 1}; ++s) {{
    if (s < {kt_n}) load(s, s * {BK});
    npu_commit();
  }}
  for (int kt = 0; kt < {kt_n}; ++kt) {{
    npu_wait_copies<{stages - 2}>();
    __syncthreads();
    {{
      const int nk = kt + {stages - 1};
      if (nk < {kt_n}) load(nk % {stages}, nk * {BK});
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
  // the epilogue: each of this thread's rows' output (and skip) offsets found once, each column's values once
  {ityp} npu_rows[{fm}][2][{len(rows)}];
  #pragma unroll
  for (int i = 0; i < {fm}; i++)
    #pragma unroll
    for (int h = 0; h < 2; h++) {{
      const {ityp} r = m0 + wm0 + i * 16 + gq + h * 8;
      {" ".join(f"npu_rows[i][h][{e}] = {x};" for e, x in enumerate(rows))}
    }}
  #pragma unroll
  for (int j = 0; j < {fn}; j++)
    #pragma unroll
    for (int e = 0; e < 2; e++) {{
      const int lc = wn0 + j * 8 + tq * 2 + e;
      const int c = n0 + lc;
      if (c >= {n}) continue;
      {columns}
      #pragma unroll
      for (int i = 0; i < {fm}; i++)
        #pragma unroll
        for (int h = 0; h < 2; h++) {{
          const {ityp} r = m0 + wm0 + i * 16 + gq + h * 8;
          if (r < {m}) {{
            const {ityp} npu_orow = npu_rows[i][h][0];{skip_row}
            const unsigned s = (unsigned)acc[i][j][h * 2 + e];
            unsigned t = {correct};
            {epi}
          }}
        }}
    }}
}}
"""
    return src, Launch((tiles, 1, 1), nthreads, ptrs_of(k), smem)


def _integer_helpers() -> str:
    from .int8_kernels import INTEGER_HELPERS

    return INTEGER_HELPERS


__all__ = ["applies", "plan", "render", "threads", "tile_plan"]
