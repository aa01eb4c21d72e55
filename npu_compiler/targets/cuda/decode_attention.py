"""Decode attention (one query row per head) at the memory limit: flash-decoding over key splits, with the query
heads that share a KV head (grouped-query attention) handled by one block, so each key and value row is read once
per KV head and not once per query head.

A block owns (batch, kv head, key split). Its lanes are grouped `LPK` to a key (each lane one 16-byte chunk of the
head dim, so a key row is one coalesced load), a warp holds 32 / LPK keys at a time, and every lane keeps the
query chunks of all the group's heads in registers. Three launches over the float32 scratch of the record
([rows, splits, 2 + v_dim]), as in `library.attention_split`: (1) each split's max and sum of exponentials per head,
(2) the probabilities (rounded to `probs_dtype` after the row's max and sum are known, as the graph rounds them)
times v, (3) the sum over the splits. Scores are rounded exactly as the graph stores them.
"""

from __future__ import annotations

from ...kernels import AttentionKernel
from ...program import CompiledProgram, KernelCall
from ..clike import Launch, pad4
from .common import NEG_INF_F, PRELUDE, REDUCE_HELPERS, WAIT, literal, load_expr, round_expr, unpack16

WARPS = 4
MAX_GROUP = 8
_VEC = 8  # 2-byte elements per 16-byte load


def grouped_decode_applies(k: KernelCall, program: CompiledProgram) -> bool:
    p: AttentionKernel = k.spec
    if not p.splits or len(k.outs) < 2 or p.q_len != 1 or p.v_dim != p.head_dim:
        return False
    d = p.head_dim
    if d % _VEC or d > 32 * _VEC or 32 % (d // _VEC) or p.heads // p.kv_heads > MAX_GROUP:
        return False
    q, kk, v = k.args[:3]
    if any(program.dtype_of(r) not in ("bfloat16", "float16") for r in (q, kk, v)):
        return False
    if len({program.dtype_of(r) for r in (q, kk, v)}) != 1:
        return False
    for r in (q, kk, v):
        _, st = pad4(r, "cuda")
        if st[3] != 1 or r.offset % _VEC or any(s % _VEC for s in st[:3]):
            return False
    return True


def _unpack(dtype: str, word: str, out: str) -> str:
    return " ".join(unpack16(dtype, word, out))


def grouped_decode(k: KernelCall, program: CompiledProgram, a, signature, ptrs) -> list[tuple[str, Launch]]:
    """The three launches. `a` is the shared attention setup of library.py (`_attention_setup`): the valid-length
    prologue, the loop bound, the dtypes and the output map; `signature(block)` the kernel's parameter list."""
    p: AttentionKernel = k.spec
    q, kk, v = k.args[:3]
    mask = k.args[3] if p.mask != "none" else None
    dt = program.dtype_of(q)
    d, h, hk, splits = p.head_dim, p.heads, p.kv_heads, p.splits
    g = h // hk
    lpk = d // _VEC
    kpw = 32 // lpk  # keys per warp at a time
    ityp, sd, pd = a.ityp, a.sd, a.pd
    stride = 2 + d
    _, qs = pad4(q, "cuda")
    _, ks = pad4(kk, "cuda")
    _, vs = pad4(v, "cuda")
    scale = literal(float(p.scale), "float32")
    mask_lines = ""
    if mask is not None:
        _, ms = pad4(mask, "cuda")
        at = f"{mask.offset} + bi * {ms[0]} + head * {ms[1]} + j * {ms[3]}"
        if p.mask == "bool":
            mask_lines = f"        if (!a3[{at}]) s = {NEG_INF_F};"
        else:
            mask_lines = (f"        s = {round_expr('s + ' + load_expr(program.dtype_of(mask), f'a3[{at}]'), sd)};")
    head = f"""{PRELUDE}{REDUCE_HELPERS}
{signature(32 * WARPS)} {{
{WAIT}
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int li = lane % {lpk}, sub = lane / {lpk};{a.valid}
  const {ityp} bi = blockIdx.x / {hk}, kvh = blockIdx.x % {hk}, split = blockIdx.y;
  const {ityp} ti = 0;
  const {ityp} jend = {a.jmax};
  const {ityp} per = (jend + {splits} - 1) / {splits};
  const {ityp} jb = split * per, je = min(jend, jb + per);
  float qf[{g}][{_VEC}];
  #pragma unroll
  for (int gi = 0; gi < {g}; ++gi) {{
    const uint4 w = *reinterpret_cast<const uint4*>(a0 + {q.offset} + bi * {qs[0]} + (kvh * {g} + gi) * {qs[1]}
                                                      + li * {_VEC});
    {_unpack(dt, 'w', 'qf[gi]')}
  }}
  const uint4* krow = reinterpret_cast<const uint4*>(a1 + {kk.offset} + bi * {ks[0]} + kvh * {ks[1]} + li * {_VEC});
  const uint4* vrow = reinterpret_cast<const uint4*>(a2 + {v.offset} + bi * {vs[0]} + kvh * {vs[1]} + li * {_VEC});
  // the scores of key j for the group's heads, rounded as the graph stores them, in s_[]
  auto scores = [&](const {ityp} j, float* s_) {{
    const uint4 w = __ldg(krow + j * {ks[2] // _VEC});
    float kf[{_VEC}];
    {_unpack(dt, 'w', 'kf')}
    #pragma unroll
    for (int gi = 0; gi < {g}; ++gi) {{
      float s = 0.0f;
      #pragma unroll
      for (int e = 0; e < {_VEC}; ++e) s = fmaf(qf[gi][e], kf[e], s);
      #pragma unroll
      for (int o = {lpk // 2}; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      const {ityp} head = kvh * {g} + gi;
      s = {round_expr('s', sd)};
      s = {round_expr(f's * {scale}', sd)};
{mask_lines}
      s_[gi] = s;
    }}
  }};
"""
    combine_ml = f"""    auto merge = [](float& m, float& l, const float m2, const float l2) {{
      const float mn = npu_max(m, m2);
      if (mn == {NEG_INF_F}) return;
      l = ((m == {NEG_INF_F}) ? 0.0f : l * expf(m - mn)) + ((m2 == {NEG_INF_F}) ? 0.0f : l2 * expf(m2 - mn));
      m = mn;
    }};"""
    stats = head + f"""  float m[{g}], l[{g}];
  #pragma unroll
  for (int gi = 0; gi < {g}; ++gi) {{ m[gi] = {NEG_INF_F}; l[gi] = 0.0f; }}
  // the loop is warp-uniform (the score's shuffles need every lane); a key group past the end scores -inf
  #pragma unroll 2
  for ({ityp} jj = jb + warp * {kpw}; jj < je; jj += {WARPS * kpw}) {{
    const {ityp} j = jj + sub;
    float s_[{g}];
    scores(min(j, je - 1), s_);
    #pragma unroll
    for (int gi = 0; gi < {g}; ++gi) {{
      if (j >= je) s_[gi] = {NEG_INF_F};
      const float mn = npu_max(m[gi], s_[gi]);
      if (mn == {NEG_INF_F}) continue;
      l[gi] = l[gi] * ((m[gi] == {NEG_INF_F}) ? 0.0f : expf(m[gi] - mn)) + ((s_[gi] == {NEG_INF_F}) ? 0.0f
              : expf(s_[gi] - mn));
      m[gi] = mn;
    }}
  }}
  {combine_ml}
  // across the keys a warp holds, then across the warps
  #pragma unroll
  for (int gi = 0; gi < {g}; ++gi)
    #pragma unroll
    for (int o = {lpk}; o < 32; o <<= 1)
      merge(m[gi], l[gi], __shfl_xor_sync(0xffffffffu, m[gi], o), __shfl_xor_sync(0xffffffffu, l[gi], o));
  __shared__ float sm[{WARPS}][{g}], sl[{WARPS}][{g}];
  if (lane == 0) {{
    #pragma unroll
    for (int gi = 0; gi < {g}; ++gi) {{ sm[warp][gi] = m[gi]; sl[warp][gi] = l[gi]; }}
  }}
  __syncthreads();
  if (threadIdx.x < {g}) {{
    const int gi = threadIdx.x;
    float mm = sm[0][gi], ll = sl[0][gi];
    for (int w = 1; w < {WARPS}; ++w) merge(mm, ll, sm[w][gi], sl[w][gi]);
    float* part = out1 + ((bi * {h} + kvh * {g} + gi) * {splits} + split) * {stride};
    part[0] = mm;
    part[1] = ll;
  }}
}}
"""
    accumulate = head + f"""  // each head's max and sum over all splits: one warp per head, its lanes over the splits
  __shared__ float smx[{g}], stot[{g}];
  for (int gi = warp; gi < {g}; gi += {WARPS}) {{
    const float* base = out1 + (bi * {h} + kvh * {g} + gi) * {splits} * {stride};
    float mm = {NEG_INF_F};
    for (int s2 = lane; s2 < {splits}; s2 += 32) mm = npu_max(mm, base[s2 * {stride}]);
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) mm = npu_max(mm, __shfl_xor_sync(0xffffffffu, mm, o));
    float tt = 0.0f;
    for (int s2 = lane; s2 < {splits}; s2 += 32) {{
      const float ms = base[s2 * {stride}];
      tt += (ms == {NEG_INF_F}) ? 0.0f : base[s2 * {stride} + 1] * expf(ms - mm);
    }}
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) tt += __shfl_xor_sync(0xffffffffu, tt, o);
    if (lane == 0) {{ smx[gi] = mm; stot[gi] = tt; }}
  }}
  __syncthreads();
  float mx[{g}], tot[{g}], o[{g}][{_VEC}];
  #pragma unroll
  for (int gi = 0; gi < {g}; ++gi) {{
    mx[gi] = smx[gi];
    tot[gi] = stot[gi];
    #pragma unroll
    for (int e = 0; e < {_VEC}; ++e) o[gi][e] = 0.0f;
  }}
  #pragma unroll 2
  for ({ityp} jj = jb + warp * {kpw}; jj < je; jj += {WARPS * kpw}) {{
    const {ityp} j = min(jj + sub, je - 1);
    float s_[{g}];
    scores(j, s_);
    if (jj + sub >= je) {{
      #pragma unroll
      for (int gi = 0; gi < {g}; ++gi) s_[gi] = {NEG_INF_F};
    }}
    const uint4 w = __ldg(vrow + j * {vs[2] // _VEC});
    float vf[{_VEC}];
    {_unpack(dt, 'w', 'vf')}
    #pragma unroll
    for (int gi = 0; gi < {g}; ++gi) {{
      const float pj = (s_[gi] == {NEG_INF_F} || mx[gi] == {NEG_INF_F}) ? 0.0f
                       : {round_expr('expf(s_[gi] - mx[gi]) / tot[gi]', pd)};
      #pragma unroll
      for (int e = 0; e < {_VEC}; ++e) o[gi][e] = fmaf(pj, vf[e], o[gi][e]);
    }}
  }}
  // across the keys a warp holds, then across the warps
  #pragma unroll
  for (int gi = 0; gi < {g}; ++gi)
    #pragma unroll
    for (int e = 0; e < {_VEC}; ++e)
      #pragma unroll
      for (int s2 = {lpk}; s2 < 32; s2 <<= 1) o[gi][e] += __shfl_xor_sync(0xffffffffu, o[gi][e], s2);
  __shared__ float so[{WARPS}][{g}][{d}];
  if (sub == 0) {{
    #pragma unroll
    for (int gi = 0; gi < {g}; ++gi)
      #pragma unroll
      for (int e = 0; e < {_VEC}; ++e) so[warp][gi][li * {_VEC} + e] = o[gi][e];
  }}
  __syncthreads();
  for (int t = threadIdx.x; t < {g * d}; t += blockDim.x) {{
    const int gi = t / {d}, dd = t % {d};
    float acc = 0.0f;
    #pragma unroll
    for (int w = 0; w < {WARPS}; ++w) acc += so[w][gi][dd];
    out1[((bi * {h} + kvh * {g} + gi) * {splits} + split) * {stride} + 2 + dd] = acc;
  }}
}}
"""
    b = p.batch
    return [(stats, Launch((b * hk, splits, 1), 32 * WARPS, ptrs)),
            (accumulate, Launch((b * hk, splits, 1), 32 * WARPS, ptrs))]
