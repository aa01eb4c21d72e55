"""Attention over many query rows (prefill) on tensor cores: Q K^T and P V as `mma.sync` m16n8k16 products (bf16 or
fp16 operands, fp32 accumulators), with the scores and probabilities kept in registers and never written out.

A block (4 warps) owns 64 query rows of one (batch, head); each warp 16 of them. Key tiles of 64 rows of K and V go
through shared memory (`cp.async`, zero-filled past the last key), fragments come out with `ldmatrix`. Grouped-query
heads read their KV head in place.

The graph rounds the probabilities after the row's max and sum are known (`softmax(...).to(bf16)`, then a bf16
matmul): a one-pass online softmax cannot round them there, so this is two passes over the keys, as the other
attention kernels of this target are: (1) each row's max and sum of exponentials, (2) p = round(exp(s - max) / sum)
in the operand dtype (exactly the graph's rounding when the probabilities dtype is the operands'), then P V. Scores
are rounded where the graph stores them (`scores_dtype`), as in `library.attention`.

Exponentials go through the SFU (`__expf`: a relative error of a few 1e-6 at the scores' range, far below the bf16
or fp16 rounding of the probabilities that follows); the row max ignores NaN (`fmaxf`) but a NaN score still turns
its row's sum, and so the row, into NaN, as the graph's softmax does.

Key tiles no query row of the block can see are skipped, decided at run time from the mask itself, so a causal mask
handed in as a tensor costs half the work, as `is_causal` does:
- past the causal diagonal, past the valid length, or a tile of a bool mask that is all false: such keys get exactly
  zero probability (and a row with no visible key gets zeros, as ATen's attention gives);
- a tile of an additive mask whose every value is at most DEAD (the "finfo.min" masks of HF models, or -inf): such a
  key's score is at most DEAD plus its unmasked score, and its probability underflows to exactly zero whenever the
  row's max lies above DEAD / 4 and no unmasked score reaches -DEAD / 4 in size. The block checks both after the
  first pass over the keys it computed; where either fails (a row that sees no key above the threshold, a score of
  absurd size) it runs again with no tile skipped.
The mask is read once per block before the passes (coalesced, 16 bytes a lane for 16-bit masks), which also marks
the tiles whose every mask value is 0 (or true): their scores need no mask loads.

Where the time goes (H100): with a causal mask the block of the last 64 rows computes every key tile while the
first computes one, and all blocks fit in one wave, so that block's chain of tiles is the kernel's time; splitting
the keys of long rows across blocks (as decode attention does) is what would cut it.
"""

from __future__ import annotations

from ...kernels import AttentionKernel
from ...program import CompiledProgram, KernelCall, TensorRef
from ..clike import Launch, attention_geometry, pad4
from .common import (
    NEG_INF_F,
    PRELUDE,
    REDUCE_HELPERS,
    WAIT,
    literal,
    load_expr,
    round_expr,
    store_expr,
    unpack16,
    valid_length_prologue,
)

BM = 64  # query rows per block (16 per warp)
BN = 64  # keys per tile
WARPS = 4
# three blocks an SM (12 warps): the registers are capped at 168 a thread. Measured on the H100 (bf16, 12 heads,
# 2048 rows, head dim 128): 0.28 ms for HF's eager attention against 0.33 ms at the two blocks 226 registers allow.
MIN_BLOCKS = 3
MAX_HEAD_DIM = 128  # registers: the block keeps Q's fragments and the 16 x head-dim output per warp in registers
MIN_ARCH = 80  # mma.sync with bf16 operands and ldmatrix / cp.async: Ampere and later
MIN_ROWS = 16  # fewer query rows than an MMA tile has: the row kernels do less work
_VEC = 8  # 2-byte elements per 16-byte copy
_OPERANDS = ("bfloat16", "float16")


def tiles_apply(dtypes: tuple[str, str, str], probs_dtype: str, q_len: int, head_dim: int, v_dim: int,
                refs: tuple[TensorRef, TensorRef, TensorRef], arch: int = 90) -> bool:
    """Whether q, k, v (their dtypes and views) can be read as tiles: MIN_ROWS query rows or more, one 16-bit
    operand dtype, a head dim that is a multiple of 16 up to MAX_HEAD_DIM (the same for v), rows of 16-byte aligned,
    unit-stride elements, probabilities in the operand dtype or float32 (the graph's fp32 probabilities enter the
    P V product in the operand dtype, as ATen's fused attention kernels do)."""
    if arch < MIN_ARCH or q_len < MIN_ROWS or len(set(dtypes)) != 1 or dtypes[0] not in _OPERANDS:
        return False
    if probs_dtype not in (dtypes[0], "float32") or head_dim != v_dim or head_dim % 16 or head_dim > MAX_HEAD_DIM:
        return False
    for r in refs:
        if len(r.shape) > 4 or not r.shape:
            return False
        _, st = pad4(r, "cuda")
        if st[3] != 1 or r.offset % _VEC or any(s % _VEC for s in st[:3]):
            return False
    return True


def applies(k: KernelCall, program: CompiledProgram, arch: int) -> bool:
    p: AttentionKernel = k.spec
    if p.splits or p.batch * p.heads > 65535:  # (a grid's y dimension holds b * h)
        return False
    q, kk, v = k.args[:3]
    dts = tuple(program.dtype_of(r) for r in (q, kk, v))
    return tiles_apply(dts, p.probs_dtype, p.q_len, p.head_dim, p.v_dim, (q, kk, v), arch)  # type: ignore[arg-type]


def dead_threshold(mask_dtype: str) -> float:
    """An additive mask value at or below this hides its key (fp16 masks cannot hold -1e30: their finfo.min)."""
    return -65504.0 if mask_dtype == "float16" else -1e30


def flash_attention(k: KernelCall, program: CompiledProgram, signature, ptrs, ityp: str) -> tuple[str, Launch]:
    """The kernel's source and launch; `signature(block)` is the kernel's parameter list."""
    p: AttentionKernel = k.spec
    g = attention_geometry(k, "cuda")
    q, mask, pos = g.q, g.mask, g.pos
    b, h, t, d, lk, group = g.b, g.h, g.t, g.d, g.kv_len, g.group
    dt = program.dtype_of(q)
    od = program.dtype_of(g.out)
    sd, pd = p.scores_dtype, p.probs_dtype
    ks = d // 16  # k-steps of Q K^T
    dp_ = d // 16  # pairs of 8-wide output column blocks
    cpr = d // _VEC  # 16-byte chunks per row
    dpad = d + _VEC  # shared-memory row (padded: ldmatrix's eight rows fall in different banks)
    mma_t = "bf16" if dt == "bfloat16" else "f16"
    pack = "__floats2bfloat162_rn" if dt == "bfloat16" else "__floats2half2_rn"
    pack_t = "__nv_bfloat162" if dt == "bfloat16" else "__half2"
    scale = literal(float(p.scale), "float32")
    additive = mask is not None and p.mask == "additive"
    dead = literal(dead_threshold(program.dtype_of(mask)) if additive else -1e30, "float32")
    guard = literal(-dead_threshold(program.dtype_of(mask)) / 4 if additive else 1e29, "float32")

    # the valid length (decode-style cache positions) bounds the keys read, as in library.attention
    valid = ""
    if pos is not None:
        valid = valid_length_prologue(pos, len(k.args) - 1, lk, ityp) + "\n  jend = min(jend, nvalid);"
    causal_end = (f"\n  jend = min(jend, m0 + {BM});  // no row of the block sees a key past its last row"
                  if p.is_causal else "")

    # the mask of one score (variables ti, j): loaded (mask_pre), folded into s (mask_use); whether a key is visible
    # at all (live_test, for the choice of tiles)
    mask_pre, mask_use, live_scan = "0.0f", "", ""
    if mask is not None:
        if p.mask == "bool":
            mask_pre, mask_use = f"(a3[{g.m_at}] ? 0.0f : 1.0f)", f"if (mk[nb][e] != 0.0f) s = {NEG_INF_F};"
            mval, live_test, plain_test = f"const bool mval = a3[{g.m_at}];", "mval", "mval"
        else:
            mv = load_expr(program.dtype_of(mask), f"a3[{g.m_at}]")
            mask_pre, mask_use = mv, f"s = {round_expr('s + mk[nb][e]', sd)};"
            mval, live_test, plain_test = f"const float mval = {mv};", f"mval > {dead}", "mval == 0.0f"
        row_end = "min(jend, ti + 1)" if p.is_causal else "jend"
        # a warp reads 16 rows of a tile, a row of 64 keys at a time (coalesced); a tile is live if some row sees
        # some key of it, plain if every mask value in reach is 0 (true): its scores need no mask loads
        md = program.dtype_of(mask)
        _, mst = pad4(mask, "cuda")
        if md in ("bfloat16", "float16") and lk % _VEC == 0 and mst[3] == 1 and mask.offset % _VEC == 0 and all(
                x % _VEC == 0 for x in mst[:3]):
            # 16-bit masks with rows of 16-byte chunks: a lane reads 8 keys at once, a warp 256 keys of one row
            # (four tiles, eight lanes each), the 16 rows of the warp in flight together; ballots gather the tiles
            live_scan = f"""
  for (int i0 = 0; i0 < ntiles; i0 += 4) {{
    const {ityp} jc = ({ityp})i0 * {BN} + lane * {_VEC};
    bool any = false, plain = true;
    #pragma unroll
    for (int rr = 0; rr < 16; ++rr) {{
      const {ityp} ti = m0 + warp * 16 + rr;
      const {ityp} jl = {row_end};
      if (ti < {t} && jc < jl) {{
        const {ityp} j = jc;
        const uint4 w = __ldg(reinterpret_cast<const uint4*>(&a3[{g.m_at}]));
        float mvs[{_VEC}];
        {" ".join(unpack16(md, "w", "mvs"))}
        #pragma unroll
        for (int e = 0; e < {_VEC}; ++e) {{
          if (jc + e < jl) {{
            const float mval = mvs[e];
            any |= {live_test};
            plain &= {plain_test};
          }}
        }}
      }}
    }}
    const unsigned ba = __ballot_sync(0xffffffffu, any), bp = __ballot_sync(0xffffffffu, !plain);
    if (lane < 4 && i0 + lane < ntiles) {{
      if ((ba >> (lane * 8)) & 0xffu) tlive[i0 + lane] = 1;
      if ((bp >> (lane * 8)) & 0xffu) tmixed[i0 + lane] = 1;
    }}
  }}
  __syncthreads();"""
        else:
            live_scan = f"""
      for (int i = 0; i < ntiles; ++i) {{
        const {ityp} jb = ({ityp})i * {BN} + lane * 2;
        bool any = false, plain = true;
        #pragma unroll
        for (int rr = 0; rr < 16; ++rr) {{
          const {ityp} ti = m0 + warp * 16 + rr;
          const {ityp} jl = {row_end};
          #pragma unroll
          for (int e = 0; e < 2; ++e) {{
            const {ityp} j = jb + e;
            if (ti < {t} && j < jl) {{
              {mval}
              any |= {live_test};
              plain &= {plain_test};
            }}
          }}
        }}
        any = __any_sync(0xffffffffu, any);
        plain = __all_sync(0xffffffffu, plain);
        if (lane == 0) {{
          if (any) tlive[i] = 1;
          if (!plain) tmixed[i] = 1;
        }}
      }}
      __syncthreads();"""
    n_tiles = max(1, -(-lk // BN))
    live_default = 0 if mask is not None else 1
    edge_causal = f" || j0 + {BN - 1} > m0" if p.is_causal else ""
    causal_test = " && j <= ti" if p.is_causal else ""

    src = f"""{PRELUDE}{REDUCE_HELPERS if valid else ''}
__device__ __forceinline__ void fa_cp16(void* dst, const void* src, bool full) {{
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(s), "l"(src), "r"(full ? 16 : 0));
}}
__device__ __forceinline__ void fa_commit() {{ asm volatile("cp.async.commit_group;"); }}
template <int N> __device__ __forceinline__ void fa_wait() {{
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}}
__device__ __forceinline__ void fa_ldsm(unsigned* r, const void* p) {{
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%0,%1,%2,%3}}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}}
__device__ __forceinline__ void fa_ldsm_t(unsigned* r, const void* p) {{
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{%0,%1,%2,%3}}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}}
__device__ __forceinline__ void fa_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {{
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{mma_t}.{mma_t}.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, "
               "{{%0,%1,%2,%3}};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}}
__device__ __forceinline__ unsigned fa_pack(float lo, float hi) {{
  const {pack_t} v = {pack}(lo, hi);
  return *reinterpret_cast<const unsigned*>(&v);
}}
{signature(32 * WARPS, MIN_BLOCKS)} {{
{WAIT}
  __shared__ __align__(16) unsigned short Ks[{BN * dpad}];
  __shared__ __align__(16) unsigned short Vs[{BN * dpad}];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g8 = lane >> 2, t4 = lane & 3;
  const {ityp} m0 = ({ityp})blockIdx.x * {BM};
  const {ityp} hi = blockIdx.y % {h}, bi = blockIdx.y / {h};
  const {ityp} kvh = hi / {group};
  {ityp} jend = ({ityp}){lk};{valid}{causal_end}
  // the two query rows of this thread's accumulator fragments
  const {ityp} row0 = m0 + warp * 16 + g8, row1 = row0 + 8;

  // Q: 64 rows through shared memory (the V buffer) into fragments, zero past the last row
  for (int c = tid; c < {BM * cpr}; c += {32 * WARPS}) {{
    const int r = c / {cpr}, dd = (c % {cpr}) * {_VEC};
    const {ityp} ti = m0 + r;
    const bool in = ti < {t};
    fa_cp16(&Vs[r * {dpad} + dd], a0 + (in ? {g.q_at} : 0), in);
  }}
  fa_commit();
  fa_wait<0>();
  __syncthreads();
  unsigned qf[{ks}][4];
  #pragma unroll
  for (int s = 0; s < {ks}; ++s)
    fa_ldsm(qf[s], &Vs[(warp * 16 + (lane & 15)) * {dpad} + s * 16 + (lane >> 4) * 8]);

  auto load_tile = [&](unsigned short* dst, const auto* src, const {ityp} j0, const bool is_v) {{
    for (int c = tid; c < {BN * cpr}; c += {32 * WARPS}) {{
      const int r = c / {cpr}, dd = (c % {cpr}) * {_VEC};
      const {ityp} j = j0 + r;
      const bool in = j < jend;
      fa_cp16(&dst[r * {dpad} + dd], src + (in ? (is_v ? ({g.v_at('j')}) : ({g.k_at})) : 0), in);
    }}
    fa_commit();
  }};
  // which key tiles some row of the block sees (decided once, from the mask: one coalesced pass over it)
  const int ntiles = (int)((jend + {BN - 1}) / {BN});
  __shared__ unsigned char tlive[{n_tiles}], tmixed[{n_tiles}];
  for (int i = tid; i < ntiles; i += {32 * WARPS}) {{
    tlive[i] = {live_default};
    tmixed[i] = 0;
  }}
  __syncthreads();{live_scan}
  bool skip = true;
  // the next tile to compute after tile i
  auto next_tile = [&](int i) -> int {{
    for (++i; i < ntiles && skip && !tlive[i]; ++i) {{}}
    return i;
  }};
  // S = Q K^T over the tile in sacc (K in kb), then rounded, scaled and masked as the graph stores the scores
  float sacc[{BN // 8}][4];
  float big = 0.0f;  // the largest unmasked score seen (additive masks: the skipping's guard)
  // edge: a tile that crosses the last row, the last key or the causal diagonal (the others need no bounds test)
  auto scores = [&](const {ityp} j0, const unsigned short* kb) {{
    const bool edge = m0 + {BM} > {t} || j0 + {BN} > jend{edge_causal};
    const bool mixed = tmixed[j0 / {BN}];
    float mk[{BN // 8}][4];  // the mask, loaded before the products so that its latency hides behind them
    #pragma unroll
    for (int nb = 0; nb < {BN // 8}; ++nb)
      #pragma unroll
      for (int e = 0; e < 4; ++e) {{
        const {ityp} ti = (e < 2) ? row0 : row1;
        const {ityp} j = j0 + nb * 8 + 2 * t4 + (e & 1);
        mk[nb][e] = (mixed && (!edge || (ti < {t} && j < jend))) ? {mask_pre} : 0.0f;
        sacc[nb][e] = 0.0f;
      }}
    #pragma unroll
    for (int s = 0; s < {ks}; ++s) {{
      #pragma unroll
      for (int np = 0; np < {BN // 16}; ++np) {{
        unsigned r[4];
        fa_ldsm(r, &kb[(np * 16 + (lane & 7) + (lane >> 4) * 8) * {dpad} + s * 16 + ((lane >> 3) & 1) * 8]);
        fa_mma(sacc[2 * np], qf[s], r[0], r[1]);
        fa_mma(sacc[2 * np + 1], qf[s], r[2], r[3]);
      }}
    }}
    #pragma unroll
    for (int nb = 0; nb < {BN // 8}; ++nb)
      #pragma unroll
      for (int e = 0; e < 4; ++e) {{
        float s = sacc[nb][e];
        s = {round_expr('s', sd)};
        s = {round_expr(f's * {scale}', sd)};
        {"big = fmaxf(big, fabsf(s));" if additive else ""}
        {mask_use}
        if (edge) {{
          const {ityp} ti = (e < 2) ? row0 : row1;
          const {ityp} j = j0 + nb * 8 + 2 * t4 + (e & 1);
          if (!(ti < {t} && j < jend{causal_test})) s = {NEG_INF_F};
        }}
        sacc[nb][e] = s;
      }}
  }};

  // pass 1: each row's max and sum of exponentials (per thread over its columns, then over the 4 threads of a row);
  // K tiles alternate between the two buffers, the next one copied while this one is used
  float mx[2], sum[2];
  for (int attempt = 0; attempt < 2; ++attempt) {{
    mx[0] = mx[1] = {NEG_INF_F};
    sum[0] = sum[1] = 0.0f;
    big = 0.0f;
    int cur = next_tile(-1);
    if (cur < ntiles) load_tile(Ks, a1, ({ityp})cur * {BN}, false); else fa_commit();
    for (int which = 0; cur < ntiles; which ^= 1) {{
      const int nx = next_tile(cur);
      unsigned short* here = which ? Vs : Ks;
      if (nx < ntiles) load_tile(which ? Ks : Vs, a1, ({ityp})nx * {BN}, false); else fa_commit();
      fa_wait<1>();
      __syncthreads();
      scores(({ityp})cur * {BN}, here);
      #pragma unroll
      for (int r = 0; r < 2; ++r) {{
        float tm = {NEG_INF_F};
        #pragma unroll
        for (int nb = 0; nb < {BN // 8}; ++nb) tm = fmaxf(tm, fmaxf(sacc[nb][2 * r], sacc[nb][2 * r + 1]));
        const float mn = fmaxf(mx[r], tm);
        if (mn == {NEG_INF_F}) continue;  // every key so far hidden
        // (exp(-inf) is 0: a hidden key or an empty running sum adds nothing, with no test)
        float acc = sum[r] * __expf(mx[r] - mn);
        #pragma unroll
        for (int nb = 0; nb < {BN // 8}; ++nb) acc += __expf(sacc[nb][2 * r] - mn) + __expf(sacc[nb][2 * r + 1] - mn);
        sum[r] = acc;
        mx[r] = mn;
      }}
      __syncthreads();  // every warp is done with `here` before the next copy lands in it
      cur = nx;
    }}
    #pragma unroll
    for (int r = 0; r < 2; ++r)
      #pragma unroll
      for (int o = 1; o < 4; o <<= 1) {{
        const float m2 = __shfl_xor_sync(0xffffffffu, mx[r], o), l2 = __shfl_xor_sync(0xffffffffu, sum[r], o);
        const float mn = fmaxf(mx[r], m2);
        if (mn == {NEG_INF_F}) continue;
        sum[r] = sum[r] * __expf(mx[r] - mn) + l2 * __expf(m2 - mn);
        mx[r] = mn;
      }}
    // the skipped tiles add exactly zero only where each row sees a key above the threshold and no score is huge
    bool again = {str(additive).lower()} && skip && (big >= {guard}
        || (row0 < {t} && !(mx[0] > {dead} / 4.0f)) || (row1 < {t} && !(mx[1] > {dead} / 4.0f)));
    if (__syncthreads_or(again) == 0) break;
    skip = false;
  }}

  // pass 2: probabilities rounded as the graph rounds them, in the operand dtype, times V. K of the next tile is
  // copied during this tile's P V, V of the next tile during the next tile's Q K^T.
  float oacc[{d // 8}][4];
  #pragma unroll
  for (int nb = 0; nb < {d // 8}; ++nb) oacc[nb][0] = oacc[nb][1] = oacc[nb][2] = oacc[nb][3] = 0.0f;
  // a row with every key hidden attends to nothing: exp(-inf - 0) * 0 gives its zeros with no test per score
  const float inv0 = (mx[0] == {NEG_INF_F}) ? 0.0f : 1.0f / sum[0];
  const float inv1 = (mx[1] == {NEG_INF_F}) ? 0.0f : 1.0f / sum[1];
  const float mu0 = (mx[0] == {NEG_INF_F}) ? 0.0f : mx[0], mu1 = (mx[1] == {NEG_INF_F}) ? 0.0f : mx[1];
  int cur = next_tile(-1);
  if (cur < ntiles) {{
    load_tile(Ks, a1, ({ityp})cur * {BN}, false);
    load_tile(Vs, a2, ({ityp})cur * {BN}, true);
  }} else {{
    fa_commit();
    fa_commit();
  }}
  while (cur < ntiles) {{
    const int nx = next_tile(cur);
    fa_wait<1>();
    __syncthreads();
    scores(({ityp})cur * {BN}, Ks);
    unsigned pf[{BN // 16}][4];
    #pragma unroll
    for (int nb = 0; nb < {BN // 8}; ++nb) {{
      float pr[4];
      #pragma unroll
      for (int e = 0; e < 4; ++e)
        pr[e] = {round_expr('__expf(sacc[nb][e] - ((e >> 1) ? mu1 : mu0)) * ((e >> 1) ? inv1 : inv0)', pd)};
      pf[nb >> 1][(nb & 1) * 2] = fa_pack(pr[0], pr[1]);
      pf[nb >> 1][(nb & 1) * 2 + 1] = fa_pack(pr[2], pr[3]);
    }}
    __syncthreads();
    if (nx < ntiles) load_tile(Ks, a1, ({ityp})nx * {BN}, false); else fa_commit();
    fa_wait<1>();  // V of this tile (K of the next may still be in flight)
    __syncthreads();
    #pragma unroll
    for (int s = 0; s < {BN // 16}; ++s) {{
      #pragma unroll
      for (int dp = 0; dp < {dp_}; ++dp) {{
        unsigned r[4];
        fa_ldsm_t(r, &Vs[(s * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * {dpad} + dp * 16 + (lane >> 4) * 8]);
        fa_mma(oacc[2 * dp], pf[s], r[0], r[1]);
        fa_mma(oacc[2 * dp + 1], pf[s], r[2], r[3]);
      }}
    }}
    __syncthreads();
    if (nx < ntiles) load_tile(Vs, a2, ({ityp})nx * {BN}, true); else fa_commit();
    cur = nx;
  }}
  #pragma unroll
  for (int nb = 0; nb < {d // 8}; ++nb)
    #pragma unroll
    for (int e = 0; e < 4; ++e) {{
      const {ityp} ti = (e < 2) ? row0 : row1;
      const {ityp} dd = nb * 8 + 2 * t4 + (e & 1);
      if (ti < {t}) out0[{g.o_at}] = {store_expr(od, 'oacc[nb][e]', 'float32')};
    }}
}}
"""
    grid = (-(-t // BM), b * h, 1) if t and b * h else (0, 1, 1)
    return src, Launch(grid, 32 * WARPS, ptrs)
