"""Attention as HIP C++: softmax(scale q k^T + mask) v, one block per query row, sized for the device's wavefronts.

A block's wavefronts take the row's keys in turn (key j to wavefront j mod n); a wavefront's lanes split the head
dim (element dd to lane dd mod width) and sum a score across the wavefront with `__shfl_xor`, so that each lane holds
the whole score; the wavefronts' running (max, sum) pairs and partial outputs meet in LDS at the end of the row.
Grouped-query heads read their KV head in place. Roundings follow the graph, as the record says
(kernels/attention.py): scores rounded to `scores_dtype` after q.k, after the scale and after the mask; with
probabilities of a 16-bit `probs_dtype` a first pass finds the row's max and sum and a second accumulates the
rounded probabilities times v; with float32 probabilities one online pass does. `valid_len`: keys past the largest
cache position written this step are not read. A row whose every key is masked gives zeros.

This is the portable kernel (fp32 FMAs, no MFMA). The hip target plans no key splits (its `plan` is the default:
none), so a record's keys are always one block's; a call that carries another target's plan (key splits and their
scratch) is computed without it, its scratch pointers passed and unused. Prefill's attention over many rows runs as
two hipBLAS GEMMs around a row softmax instead (`attention_gemm_min_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ...errors import NPUCompileError
from ...kernels import AttentionKernel
from ...program import CompiledProgram, KernelCall
from ..clike import AttentionGeometry, Launch, affine, attention_geometry, grid_for, max_extent, ptrs_of
from ..cuda.common import NEG_INF_F, index_type, literal

THREADS = 256  # a block's threads (four wavefronts of 64): the keys of a row split four ways
# rows fewer than this many a compute unit leave most of them idle: give each row twice the wavefronts, so that its
# walk over the keys (a decode step's one row a head) is split finer
FEW_ROWS_PER_CU = 2
FEW_ROWS_THREADS = 512


def _dt(program: CompiledProgram, ref) -> str:
    return program.buffers[ref.buffer].dtype


def _waves(lang, rows: int, v_lanes: int) -> int:
    """Wavefronts a block: THREADS' worth (FEW_ROWS_THREADS' with few rows), halved until the block's LDS (each
    wavefront's partial output row and its (max, sum), the valid length's reduction) fits the device's."""
    dev = lang.profile
    threads = FEW_ROWS_THREADS if rows <= FEW_ROWS_PER_CU * dev.multiprocessors else THREADS
    waves = max(1, min(threads, dev.max_threads_per_block) // lang.warp_width)

    def lds(n: int) -> int:
        return 4 * n * (v_lanes * lang.warp_width + 2) + 8 * lang.max_warps

    while waves > 1 and lds(waves) > dev.shared_memory_per_block:
        waves //= 2
    if lds(waves) > dev.shared_memory_per_block:
        raise NPUCompileError(f"hip attention: a value row of {v_lanes * lang.warp_width} needs {lds(waves)} bytes "
                              f"of LDS, the device gives a block {dev.shared_memory_per_block}")
    return waves


def _valid_length(pos, arg: int, kv_len: int, ityp: str, lang) -> str:
    """Lines defining `nvalid`: one past the largest cache position written this step (argument `arg`), at most
    `kv_len`; every thread of the block takes part."""
    p_at = affine([("j", pos.strides[0] if pos.strides else 0)], pos.offset)
    return f"""
  // keys past the largest cache position written this step are masked: do not read them
  __shared__ long long npu_sh_i[{lang.max_warps}];
  long long pmax = -1;
  for (int j = threadIdx.x; j < {math.prod(pos.shape)}; j += blockDim.x)
    pmax = npu_max(pmax, (long long)a{arg}[{p_at}]);
  pmax = npu_block_reduce(pmax, NpuMax(), npu_sh_i);
  const {ityp} nvalid = ({ityp})npu_min(npu_max(pmax + 1, 0LL), {kv_len}LL);"""


def _score(k: KernelCall, program: CompiledProgram, g: AttentionGeometry, ityp: str, lang, d_lanes: int) -> str:
    """The lambda `score(j)`: q.k for key j over the head dim (the lanes' parts summed across the wavefront), scaled
    and masked, rounded as the graph rounds."""
    p: AttentionKernel = k.spec
    w, sd = lang.warp_width, p.scores_dtype
    mask_line = ""
    if g.mask is not None:
        if p.mask == "bool":
            mask_line = f"      if (!a3[{g.m_at}]) s = {NEG_INF_F};"
        else:
            added = "s + " + lang.load_expr(_dt(program, g.mask), f"a3[{g.m_at}]")
            mask_line = f"      s = {lang.round_expr(added, sd)};"
    return f"""    auto score = [&](const {ityp} j) -> float {{
      float s = 0.0f;
      #pragma unroll
      for (int p = 0; p < {d_lanes}; ++p) {{
        const {ityp} dd = lane + {w} * p;
        if (dd < {g.d}) s = fmaf(qr[p], {lang.load_expr(_dt(program, g.k), f'a1[{g.k_at}]')}, s);
      }}
      #pragma unroll
      for (int off = {w // 2}; off > 0; off >>= 1) s += __shfl_xor(s, off, {w});
      s = {lang.round_expr('s', sd)};
      s = {lang.round_expr(f's * {literal(float(p.scale), "float32")}', sd)};
{mask_line}
      return s;
    }};"""


def _one_pass(g: AttentionGeometry, ityp: str, lang, waves: int, v_lanes: int, load_v: str,
              store: Callable[[str], str]) -> str:
    """Float32 probabilities: an online softmax over the wavefront's keys, the wavefronts' parts combined at the
    end against the row's max."""
    w, ninf = lang.warp_width, NEG_INF_F
    return f"""    #pragma unroll 4
    for ({ityp} j = warp; j < jend; j += {waves}) {{
      const float s = score(j);
      const float mn = npu_max(m, s);
      if (mn == {ninf}) continue;  // every score so far is masked out: nothing to accumulate
      const float corr = (m == {ninf}) ? 0.0f : expf(m - mn);
      const float pj = (s == {ninf}) ? 0.0f : expf(s - mn);
      l = l * corr + pj;
      #pragma unroll
      for (int p = 0; p < {v_lanes}; ++p) {{
        const {ityp} dd = lane + {w} * p;
        o[p] = fmaf(pj, {load_v}, o[p] * corr);
      }}
      m = mn;
    }}
    if (lane == 0) {{ sm[warp] = m; sl[warp] = l; }}
    #pragma unroll
    for (int p = 0; p < {v_lanes}; ++p) so[warp][lane + {w} * p] = o[p];
    __syncthreads();
    float mx = sm[0];
    #pragma unroll
    for (int q = 1; q < {waves}; ++q) mx = npu_max(mx, sm[q]);
    float wt[{waves}];
    float tot = 0.0f;
    #pragma unroll
    for (int q = 0; q < {waves}; ++q) {{
      wt[q] = (sm[q] == {ninf}) ? 0.0f : expf(sm[q] - mx);
      tot += sl[q] * wt[q];
    }}
    for ({ityp} dd = threadIdx.x; dd < {g.v_dim}; dd += blockDim.x) {{
      float acc = 0.0f;
      #pragma unroll
      for (int q = 0; q < {waves}; ++q) acc += so[q][dd] * wt[q];
      const float r = (mx == {ninf}) ? 0.0f : acc / tot;
      {store("r")}
    }}
    __syncthreads();"""


def _two_pass(g: AttentionGeometry, ityp: str, lang, waves: int, v_lanes: int, load_v: str,
              store: Callable[[str], str], probs_dtype: str) -> str:
    """16-bit probabilities: the row's max and sum of exponentials first, then each probability rounded to
    `probs_dtype` (as the graph stores it) times v."""
    w, ninf = lang.warp_width, NEG_INF_F
    return f"""    // pass 1: the row's max and sum of exponentials
    #pragma unroll 4
    for ({ityp} j = warp; j < jend; j += {waves}) {{
      const float s = score(j);
      const float mn = npu_max(m, s);
      if (mn == {ninf}) continue;
      l = l * ((m == {ninf}) ? 0.0f : expf(m - mn)) + ((s == {ninf}) ? 0.0f : expf(s - mn));
      m = mn;
    }}
    if (lane == 0) {{ sm[warp] = m; sl[warp] = l; }}
    __syncthreads();
    float mx = sm[0];
    #pragma unroll
    for (int q = 1; q < {waves}; ++q) mx = npu_max(mx, sm[q]);
    float tot = 0.0f;
    #pragma unroll
    for (int q = 0; q < {waves}; ++q) tot += (sm[q] == {ninf}) ? 0.0f : sl[q] * expf(sm[q] - mx);
    // pass 2: probabilities rounded to {probs_dtype}, times v
    if (mx != {ninf}) {{
      #pragma unroll 4
      for ({ityp} j = warp; j < jend; j += {waves}) {{
        const float pj = {lang.round_expr('expf(score(j) - mx) / tot', probs_dtype)};
        #pragma unroll
        for (int p = 0; p < {v_lanes}; ++p) {{
          const {ityp} dd = lane + {w} * p;
          o[p] = fmaf(pj, {load_v}, o[p]);
        }}
      }}
    }}
    #pragma unroll
    for (int p = 0; p < {v_lanes}; ++p) so[warp][lane + {w} * p] = o[p];
    __syncthreads();
    for ({ityp} dd = threadIdx.x; dd < {g.v_dim}; dd += blockDim.x) {{
      float acc = 0.0f;
      #pragma unroll
      for (int q = 0; q < {waves}; ++q) acc += so[q][dd];
      {store("acc")}
    }}
    __syncthreads();"""


def attention(k: KernelCall, program: CompiledProgram, lang) -> tuple[str, Launch]:
    """The source and launch of an attention record (its keys one block's, whatever its plan), for `lang` (a
    HipLanguage)."""
    p: AttentionKernel = k.spec
    g = attention_geometry(k, "hip")
    refs = [g.q, g.k, g.v, g.out, *([g.mask] if g.mask is not None else [])]
    ityp = index_type(max(max_extent(tuple(r.shape), tuple(r.strides), r.offset) for r in refs))
    w = lang.warp_width
    d_lanes, v_lanes = -(-g.d // w), -(-g.v_dim // w)
    rows = g.b * g.h * g.t
    waves = _waves(lang, rows, v_lanes)
    ninf = NEG_INF_F
    jmax = f"npu_min((long long)ti + 1, {g.kv_len}LL)" if p.is_causal else f"{g.kv_len}LL"
    valid = ""
    if g.pos is not None:
        valid = _valid_length(g.pos, len(k.args) - 1, g.kv_len, ityp, lang)
        jmax = f"npu_min({jmax}, (long long)nvalid)"
    v_at = g.v_at("j")
    load_v = f"(dd < {g.v_dim} ? {lang.load_expr(_dt(program, g.v), f'a2[{v_at}]')} : 0.0f)"
    od = _dt(program, g.out)

    def store(value: str) -> str:
        return f"out0[{g.o_at}] = {lang.store_expr(od, value, 'float32')};"

    if p.probs_dtype in ("float16", "bfloat16"):
        body = _two_pass(g, ityp, lang, waves, v_lanes, load_v, store, p.probs_dtype)
    else:
        body = _one_pass(g, ityp, lang, waves, v_lanes, load_v, store)
    params = ([(f"out{i}", _dt(program, o), True) for i, o in enumerate(k.writes)]
              + [(f"a{i}", _dt(program, a), False) for i, a in enumerate(k.args)])
    src = f"""{lang.prelude}{lang.reduce_helpers if valid else ''}
{lang.signature(waves * w, params)} {{
  __shared__ float sm[{waves}], sl[{waves}];
  __shared__ float so[{waves}][{v_lanes * w}];
  const int lane = threadIdx.x & {w - 1}, warp = threadIdx.x / {w};{valid}
  float qr[{d_lanes}];
  for ({ityp} row = blockIdx.x; row < {rows}; row += gridDim.x) {{
    const {ityp} ti = row % {g.t}; const {ityp} t1 = row / {g.t};
    const {ityp} hi = t1 % {g.h}; const {ityp} bi = t1 / {g.h};
    const {ityp} kvh = hi / {g.group};
{_score(k, program, g, ityp, lang, d_lanes)}
    #pragma unroll
    for (int p = 0; p < {d_lanes}; ++p) {{
      const {ityp} dd = lane + {w} * p;
      qr[p] = dd < {g.d} ? {lang.load_expr(_dt(program, g.q), f'a0[{g.q_at}]')} : 0.0f;
    }}
    float m = {ninf}, l = 0.0f;
    float o[{v_lanes}];
    #pragma unroll
    for (int p = 0; p < {v_lanes}; ++p) o[p] = 0.0f;
    const {ityp} jend = ({ityp}){jmax};
{body}
  }}
}}
"""
    grid = grid_for(rows, 1, lang.max_grid) if rows else 0
    return src, Launch((grid, 1, 1), waves * w, ptrs_of(k))
