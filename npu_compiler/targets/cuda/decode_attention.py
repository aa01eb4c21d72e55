"""Decode attention (one query row per head) at the memory limit: flash-decoding over key splits, with the query
heads that share a KV head (grouped-query attention) handled by one block, so each key and value row is read once
per KV head and not once per query head.

A block owns (batch, kv head, key split). Its lanes are grouped `LPK` to a key (each lane one 16-byte chunk of the
head dim, so a key row is one coalesced load), a warp holds 32 / LPK keys at a time, and every lane keeps the
query chunks of all the group's heads in registers. Three launches over the float32 scratch of the record ([rows,
splits, 2 + v_dim], then the scores [b, kv heads, kv_len, group]):
1. stats: each split's max and sum of exponentials per head; its scores, rounded exactly as the graph stores them,
   kept in the scratch;
2. accumulate: the probabilities (rounded to `probs_dtype` after the row's max and sum over all splits are known,
   as the graph rounds them) times v, from the kept scores, not the keys again;
3. combine (`library._split_combine`): the sum over the splits.
At KV position 8192 the keys are a few megabytes a layer and the kernels were bound by their work per key, not the
bytes, so that work is cut where it was repeated: a key's lanes sum the group's dot products as a reduce-scatter
(each lane ends with its own heads' scores and post-processes only those, not all of them), the running sum of
exponentials rescales only where the max grows (one SFU exponential a score, as in flash_attention.py), and in the
second launch each lane computes its heads' probabilities and the shuffles hand them around. Each warp issues the
loads of UNROLL key groups before it uses any. Measured on the H100 (Qwen2.5-1.5B, 28 layers, profiled kernel by
kernel): 0.96 -> 0.67 ms at KV position 8192, 0.53 -> 0.49 ms at 1024. A split of at least one round of loads (64
keys: fewer, longer splits for short rows) was slower at 1024 (0.54 ms): a split's keys are then a chain of
dependent work in one block where many blocks did a few keys each.

Where the record is `online` (the graph's attention is one fused op, which leaves the probabilities' rounding to the
kernel) one launch does both passes' work: each split keeps a running max per head (uniform across the warp: the
scores of its keys are handed around by shuffles), rescales its sum and partial output only where that max grows,
and leaves the split's (max, sum, unnormalised output) in the record, the probabilities kept in float32; the
combining launch (`library._split_combine`, online) weighs each split by exp(max - the row's max) over the row's sum.
Keys and values load together, in one round of loads, and the scores are not kept.

Where the valid length comes from an input that no kernel of the program writes (`common.unwritten_input`: the cache
positions, uploaded or made by the program run before), a split launch works out its key range before it waits for
the kernel before and prefetches its key and value rows into L2 (a hint: the row the kernel before writes is still
read after the wait), and asks to be launched early (`Launch.early`), so that the rows stream while the kernels
before run. Measured on the H100 (Qwen2.5-1.5B decode step, graph replay; with the GEMVs launched early too): 1.63 ->
1.60 ms at KV position 1024 for the prefetch alone, 1.57 with the early launches.
"""

from __future__ import annotations

from ...kernels import AttentionKernel, AttentionPlan, plan_of
from ...program import CompiledProgram, KernelCall
from ..clike import Launch, pad4
from .common import (
    INPUTS_BEGIN,
    INPUTS_END,
    NEG_INF_F,
    PRELUDE,
    REDUCE_HELPERS,
    WAIT,
    literal,
    load_expr,
    round_expr,
    unpack16,
    unwritten_input,
)

WARPS = 4
MAX_GROUP = 8
UNROLL = 8  # key groups whose loads a warp issues before it uses the first
_VEC = 8  # 2-byte elements per 16-byte load
# the online combine keeps every split's weight of a row in shared memory (the lowering gives at most
# decode_attention_blocks splits; an artifact may say more, and those run the exact launches)
MAX_ONLINE_SPLITS = 4096


def scores_scratch(batch: int, heads: int, q_len: int, kv_len: int, online: bool) -> int:
    """The float32 entries after the split record where a decode attention keeps its scores (one per query head and
    key), for the second launch to read instead of computing them again; 0 where it is not decode, or online (one
    launch: nothing kept)."""
    return batch * heads * kv_len if q_len == 1 and not online else 0


def grouped_decode_applies(k: KernelCall, program: CompiledProgram) -> bool:
    p: AttentionKernel = k.spec
    pl = plan_of(k)
    if not pl.splits or len(k.scratch) != 1 or p.q_len != 1 or p.v_dim != p.head_dim:
        return False
    if pl.scratch_extra != scores_scratch(p.batch, p.heads, p.q_len, p.kv_len, p.online):
        return False
    if p.online and pl.splits > MAX_ONLINE_SPLITS:
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
    """The launches before `library._split_combine`: two, or one where the record is online. `a` is the shared
    attention setup of library.py (`_attention_setup`): the valid-length prologue, the loop bound, the dtypes and
    the output map; `signature(block)` the kernel's parameter list."""
    p: AttentionKernel = k.spec
    pl = plan_of(k)
    q, kk, v = k.args[:3]
    mask = k.args[3] if p.mask != "none" else None
    dt = program.dtype_of(q)
    d, h, hk, splits = p.head_dim, p.heads, p.kv_heads, pl.splits
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
    G = 1 << (g - 1).bit_length()  # the group padded to a power of two (heads past g are zeros)
    NV = max(1, G // lpk)  # scores a lane holds after the reduce-scatter
    PV = -(-g // lpk)  # probabilities a lane computes in the second launch
    reduce, hb_terms, levels, n, o = [], [], [], G, lpk // 2
    while o >= 1:
        if n > 1:  # keep one half of the values (the upper where this lane's bit o is set), add the partner's
            half = n // 2
            levels.append((o, half))
            reduce += [f"    {{ const bool up = (li & {o}) != 0;",
                       "      #pragma unroll",
                       f"      for (int i = 0; i < {half}; ++i) {{",
                       f"        const float send = up ? acc[i] : acc[{half} + i];",
                       f"        acc[i] = (up ? acc[{half} + i] : acc[i]) + __shfl_xor_sync(0xffffffffu, send, {o});",
                       "      }", "    }"]
            hb_terms.append(f"((li & {o}) ? {half} : 0)")
            n = half
        else:  # one value left: every lane of the level gets the sum
            reduce.append(f"    acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], {o});")
        o //= 2
    reduce_text = "\n".join(reduce)
    dup = max(lpk // G, 1) - 1  # lanes differing only in these bits hold the same scores
    step = WARPS * kpw * UNROLL  # keys a block covers per round of loads
    past_end = f"base + ({ityp})(u * {WARPS} + warp) * {kpw} >= je"  # key group u of the round: past the split
    # the key of load u of this warp in the round from `base`
    key = f"(base + ({ityp})(u * {WARPS} + warp) * {kpw} + sub)"

    early, head, rounds = _load_helpers(a=a, d=d, dup=dup, g=g, hb_terms=hb_terms, hk=hk, ityp=ityp, k=k, key=key,
        kk=kk, ks=ks, lpk=lpk, p=p, past_end=past_end, program=program, signature=signature, splits=splits, step=step,
        stride=stride, v=v, vs=vs)

    k_rows, v_rows = ("a1", kk.offset, ks), ("a2", v.offset, vs)
    stats = head(k_rows, *([v_rows] if p.online else [])) + f"""  float qf[{g}][{_VEC}];
  #pragma unroll
  for (int gi = 0; gi < {g}; ++gi) {{
    const uint4 w = *reinterpret_cast<const uint4*>(a0 + {q.offset} + bi * {qs[0]} + (kvh * {g} + gi) * {qs[1]}
                                                      + li * {_VEC});
    {_unpack(dt, 'w', 'qf[gi]')}
  }}
  // the scores of key j (its row in w): the group's dot products summed over the key's lanes as a reduce-scatter
  // (each lane ends with NV of them, heads hb.., instead of all), then rounded as the graph stores them, in s_[]
  auto scores = [&](const uint4 w, const {ityp} j, float* s_) {{
    float kf[{_VEC}];
    {_unpack(dt, 'w', 'kf')}
    float acc[{G}];
    #pragma unroll
    for (int gi = 0; gi < {G}; ++gi) {{
      float s = 0.0f;
      #pragma unroll
      for (int e = 0; gi < {g} && e < {_VEC}; ++e) s = fmaf(qf[gi < {g} ? gi : 0][e], kf[e], s);
      acc[gi] = s;
    }}
{reduce_text}
    #pragma unroll
    for (int i = 0; i < {NV}; ++i) {{
      const {ityp} head = kvh * {g} + min(hb + i, {g - 1});
      float s = acc[i];
      s = {round_expr('s', sd)};
      s = {round_expr(f's * {scale}', sd)};
{mask_lines}
      s_[i] = s;
    }}
  }};
"""
    b = p.batch
    if p.online:
        return [(stats + _online_split(p, pl, g, NV, dt, levels, rounds, key, past_end, ks[2] // _VEC, vs[2] // _VEC,
                                       stride),
                 Launch((b * hk, splits, 1), 32 * WARPS, ptrs, early=early))]
    return _two_pass(NV=NV, PV=PV, b=b, d=d, dt=dt, early=early, g=g, h=h, head=head, hk=hk, ityp=ityp, key=key, ks=ks,
        lpk=lpk, pd=pd, ptrs=ptrs, rounds=rounds, splits=splits, stats=stats, stride=stride, v_rows=v_rows, vs=vs)


def _load_helpers(*, a, d, dup, g, hb_terms, hk, ityp, k, key, kk, ks, lpk, p, past_end, program, signature, splits,
    step, stride, v, vs):
    """The rounds of loads of key or value rows and a launch's head (its prologue, split range and query loads)."""
    def rounds(word: str, row: str, row_stride: int, more: str = "") -> str:
        """The split's keys in rounds of UNROLL key groups a warp: the round's loads of `row` into `word[]` first
        (and the lines `more`, more loads of the round), then the body for each key group (key `j`, its row
        `word[u]`), which the caller goes on to close with two braces; a warp past the split's end stops
        (warp-uniform: the body's shuffles need every lane). The loads come first because the body's early exit
        keeps the compiler from issuing a later group's loads before an earlier group's body has run."""
        return f"""  for ({ityp} base = jb; base < je; base += {step}) {{
    uint4 {word}[{UNROLL}];
    #pragma unroll
    for (int u = 0; u < {UNROLL}; ++u) {word}[u] = __ldg({row} + min({key}, je - 1) * {row_stride});{more}
    #pragma unroll
    for (int u = 0; u < {UNROLL}; ++u) {{
      if ({past_end}) break;
      const {ityp} j = {key};"""
    keep_scores = f"""  // this KV head's scores, [key][group head], after the split record
  float* sc = out1 + {p.rows * splits * stride} + (bi * {hk} + kvh) * {p.kv_len * g};"""
    split_range = f"""  const {ityp} bi = blockIdx.x / {hk}, kvh = blockIdx.x % {hk}, split = blockIdx.y;
  const {ityp} ti = 0;
  const {ityp} jend = {a.jmax};
  const {ityp} per = (jend + {splits} - 1) / {splits};
  const {ityp} jb = split * per, je = min(jend, jb + per);"""
    # the split's range is known before the wait where the valid length comes from an input no kernel writes (or
    # there is none): its key and value rows go into L2 while the kernels before run, and the loads after the wait
    # find them there (a prefetch is a hint: the rows the kernel before writes are read after the wait as ever)
    pos = k.args[-1] if a.valid else None
    early = pos is None or unwritten_input(program, pos.buffer)

    row_lines = -(-d * 2 // 128) + 1  # a 16-bit row's 128-byte lines, and its last byte (a row need not be aligned)

    def head(*rows: tuple[str, int, tuple[int, ...]]) -> str:
        """The setup every launch shares; the split's rows of each (pointer, offset, padded strides) of `rows` are
        prefetched where `early`."""
        valid = f"\n{INPUTS_BEGIN}{a.valid}\n{INPUTS_END}" if early and a.valid else a.valid
        prefetch = "".join(f"""
  for ({ityp} t = threadIdx.x; t < (je - jb) * {row_lines}; t += blockDim.x) {{
    const {ityp} j = jb + t / {row_lines}, c = t % {row_lines};
    const char* r = reinterpret_cast<const char*>({ptr} + {off} + bi * {st[0]} + kvh * {st[1]} + j * {st[2]});
    asm volatile("prefetch.L2 [%0];" :: "l"(r + min(c * 128, ({ityp}){d * 2 - 1})));
  }}""" for ptr, off, st in rows) if early else ""
        setup = f"{valid}\n{split_range}{prefetch}"
        return f"""{PRELUDE}{REDUCE_HELPERS}
{signature(32 * WARPS)} {{{setup if early else ""}
{WAIT}
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int li = lane % {lpk}, sub = lane / {lpk};{"" if early else setup}
  const int hb = {" + ".join(hb_terms) or "0"};  // this lane's first head of the group after the reduce-scatter
  const bool owner = (li & {dup}) == 0;  // one lane of those holding the same heads writes them
{"" if p.online else keep_scores}
  const uint4* krow = reinterpret_cast<const uint4*>(a1 + {kk.offset} + bi * {ks[0]} + kvh * {ks[1]} + li * {_VEC});
  const uint4* vrow = reinterpret_cast<const uint4*>(a2 + {v.offset} + bi * {vs[0]} + kvh * {vs[1]} + li * {_VEC});
"""
    return early, head, rounds


def _two_pass(*, NV, PV, b, d, dt, early, g, h, head, hk, ityp, key, ks, lpk, pd, ptrs, rounds, splits, stats, stride,
    v_rows, vs):
    """The two-pass launches of a record whose probabilities round after the row's max and sum are known: the stats
    launch's rest, then the accumulate launch."""
    stats = _stats_rest(NV=NV, g=g, h=h, ks=ks, lpk=lpk, rounds=rounds, splits=splits, stats=stats, stride=stride)
    nh, ns = -(-g // WARPS), -(-splits // 32)  # heads a warp merges the splits of; splits a lane reads
    # the kept scores of the round's keys (this lane's heads), loaded with the round's value rows
    scores_of_round = f"""
    float scv[{UNROLL}][{PV}];
    #pragma unroll
    for (int u = 0; u < {UNROLL}; ++u) {{
      const {ityp} jj = min({key}, je - 1);
      #pragma unroll
      for (int i = 0; i < {PV}; ++i) scv[u][i] = (li + i * {lpk} < {g}) ? sc[jj * {g} + li + i * {lpk}] : 0.0f;
    }}"""
    accumulate = head(v_rows) + f"""  // each head's max and sum over all splits: warp w merges heads w,
  // w + {WARPS}, .., its lanes over the splits; every (max, sum) the warp needs is loaded before any is used (one
  // wait for memory, not two a head; the sums add up in the same order as one head at a time)
  __shared__ float smx[{g}], stot[{g}];
  {{
    float ms[{nh}][{ns}], ls[{nh}][{ns}];
    #pragma unroll
    for (int r = 0; r < {nh}; ++r)
      #pragma unroll
      for (int i = 0; i < {ns}; ++i) {{
        const int gi = warp + r * {WARPS}, s2 = lane + i * 32;
        const bool in = gi < {g} && s2 < {splits};
        const float* st = out1 + ((bi * {h} + kvh * {g} + min(gi, {g - 1})) * {splits}
                                  + min(s2, {splits - 1})) * {stride};
        ms[r][i] = in ? st[0] : {NEG_INF_F};
        ls[r][i] = in ? st[1] : 0.0f;
      }}
    #pragma unroll
    for (int r = 0; r < {nh}; ++r) {{
      float mm = {NEG_INF_F};
      #pragma unroll
      for (int i = 0; i < {ns}; ++i) mm = npu_max(mm, ms[r][i]);
      #pragma unroll
      for (int o = 16; o > 0; o >>= 1) mm = npu_max(mm, __shfl_xor_sync(0xffffffffu, mm, o));
      float tt = 0.0f;
      #pragma unroll
      for (int i = 0; i < {ns}; ++i) tt += (ms[r][i] == {NEG_INF_F}) ? 0.0f : ls[r][i] * expf(ms[r][i] - mm);
      #pragma unroll
      for (int o = 16; o > 0; o >>= 1) tt += __shfl_xor_sync(0xffffffffu, tt, o);
      const int gi = warp + r * {WARPS};
      if (lane == 0 && gi < {g}) {{ smx[gi] = mm; stot[gi] = tt; }}
    }}
  }}
  __syncthreads();
  float o[{g}][{_VEC}];
  #pragma unroll
  for (int gi = 0; gi < {g}; ++gi)
    #pragma unroll
    for (int e = 0; e < {_VEC}; ++e) o[gi][e] = 0.0f;
{rounds("vw", "vrow", vs[2] // _VEC, scores_of_round)}
      // lane li of the key computes the probabilities of heads li, li + {lpk}, ..; the shuffles hand them around
      float pr[{PV}];
      #pragma unroll
      for (int i = 0; i < {PV}; ++i) {{
        const int hh = li + i * {lpk};
        pr[i] = 0.0f;
        if (j < je && hh < {g}) {{
          const float s = scv[u][i], mx = smx[hh];
          if (s != {NEG_INF_F} && mx != {NEG_INF_F}) pr[i] = {round_expr('expf(s - mx) / stot[hh]', pd)};
        }}
      }}
      float vf[{_VEC}];
      {_unpack(dt, 'vw[u]', 'vf')}
      #pragma unroll
      for (int gi = 0; gi < {g}; ++gi) {{
        const float pj = __shfl_sync(0xffffffffu, pr[gi / {lpk}], sub * {lpk} + gi % {lpk});
        #pragma unroll
        for (int e = 0; e < {_VEC}; ++e) o[gi][e] = fmaf(pj, vf[e], o[gi][e]);
      }}
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
    return [(stats, Launch((b * hk, splits, 1), 32 * WARPS, ptrs, early=early)),
            (accumulate, Launch((b * hk, splits, 1), 32 * WARPS, ptrs, early=early))]


def _stats_rest(*, NV, g, h, ks, lpk, rounds, splits, stats, stride):
    """The stats launch's rest: each split's scores (kept for the second launch), their max and sum of exponentials."""
    stats += f"""  float m[{NV}], l[{NV}];
  #pragma unroll
  for (int i = 0; i < {NV}; ++i) {{ m[i] = {NEG_INF_F}; l[i] = 0.0f; }}
{rounds("kw", "krow", ks[2] // _VEC)}
      float s_[{NV}];
      scores(kw[u], min(j, je - 1), s_);
      // one exponential a score: the running sum is rescaled only where the max grows (a NaN score turns the sum
      // into NaN, and so the row, as the graph's softmax does)
      #pragma unroll
      for (int i = 0; i < {NV}; ++i) {{
        if (j >= je || hb + i >= {g}) continue;
        const float sv = s_[i];
        if (owner) sc[j * {g} + hb + i] = sv;
        if (sv > m[i]) {{
          l[i] = ((m[i] == {NEG_INF_F}) ? 0.0f : l[i] * __expf(m[i] - sv)) + 1.0f;
          m[i] = sv;
        }} else if (sv != {NEG_INF_F}) {{
          l[i] += __expf(sv - m[i]);
        }}
      }}
    }}
  }}
  auto merge = [](float& m, float& l, const float m2, const float l2) {{
    const float mn = npu_max(m, m2);
    if (mn == {NEG_INF_F}) return;
    l = ((m == {NEG_INF_F}) ? 0.0f : l * expf(m - mn)) + ((m2 == {NEG_INF_F}) ? 0.0f : l2 * expf(m2 - mn));
    m = mn;
  }};
  // across the keys a warp holds (the lanes of the same heads), then across the warps
  #pragma unroll
  for (int i = 0; i < {NV}; ++i)
    #pragma unroll
    for (int o = {lpk}; o < 32; o <<= 1)
      merge(m[i], l[i], __shfl_xor_sync(0xffffffffu, m[i], o), __shfl_xor_sync(0xffffffffu, l[i], o));
  __shared__ float sm[{WARPS}][{g}], sl[{WARPS}][{g}];
  if (sub == 0 && owner) {{
    #pragma unroll
    for (int i = 0; i < {NV}; ++i)
      if (hb + i < {g}) {{ sm[warp][hb + i] = m[i]; sl[warp][hb + i] = l[i]; }}
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
    return stats


def _online_split(p: AttentionKernel, pl: AttentionPlan, g: int, NV: int, dt: str, levels: list[tuple[int, int]],
                  rounds, key: str, past_end: str, k_stride: int, v_stride: int, stride: int) -> str:
    """The rest of the online launch, after the query and the `scores` helper. Each round of loads (keys and values
    together) first computes the scores of all its key groups, then the warp's running max of each head over them
    (one rescale of the sum and the output a round, none where the max holds), then the probabilities (each lane its
    own heads' exponentials, as after the reduce-scatter; shuffles hand them to the lanes of the head dim) times v.
    The warps' parts merge at the block's max into the split's record (max, sum, unnormalised output). `levels` are
    the reduce-scatter's (lane bit, half) steps: which lane holds which head's score afterwards; g, NV, `rounds`,
    `key` and `past_end` are grouped_decode's."""
    d = p.head_dim
    lpk = d // _VEC
    # the lane (of a key's lanes) and the register holding head gi's values: the first lane whose heads hb..
    # hb + NV - 1 include it (lanes differing only in the bits the reduce-scatter did not use hold the same)
    holder = {}
    for li in range(lpk):
        hb = sum(half for bit, half in levels if li & bit)
        for i in range(NV):
            holder.setdefault(hb + i, (li, i))

    def each_head(body: str) -> str:
        return "\n".join(body.format(gi=gi, li=holder[gi][0], i=holder[gi][1], lpk=lpk, vec=_VEC) for gi in range(g))

    values = f"""
    uint4 vw[{UNROLL}];
    #pragma unroll
    for (int u = 0; u < {UNROLL}; ++u) vw[u] = __ldg(vrow + min({key}, je - 1) * {v_stride});
    float sv[{UNROLL}][{NV}];
    #pragma unroll
    for (int u = 0; u < {UNROLL}; ++u)
      #pragma unroll
      for (int i = 0; i < {NV}; ++i) sv[u][i] = {NEG_INF_F};"""
    rescale = each_head("""    {{ const float f = __shfl_sync(0xffffffffu, fr[{i}], sub * {lpk} + {li});
      #pragma unroll
      for (int e = 0; e < {vec}; ++e) o[{gi}][e] *= f; }}""")
    accumulate = each_head("""      {{ const float pj = __shfl_sync(0xffffffffu, pr[{i}], sub * {lpk} + {li});
        #pragma unroll
        for (int e = 0; e < {vec}; ++e) o[{gi}][e] = fmaf(pj, vf[e], o[{gi}][e]); }}""")
    holders = each_head("""    if (sub == 0 && li == {li}) {{ wm[warp][{gi}] = mr[{i}]; wl[warp][{gi}] = ls[{i}]; }}""")
    return f"""  // this lane's heads (as after the reduce-scatter): the running max, uniform across its keys, and
  // the sum of exponentials of this lane's keys at it; every head's output for this lane's chunk of the head dim
  float mr[{NV}], ls[{NV}], o[{g}][{_VEC}];
  #pragma unroll
  for (int i = 0; i < {NV}; ++i) {{ mr[i] = {NEG_INF_F}; ls[i] = 0.0f; }}
  #pragma unroll
  for (int gi = 0; gi < {g}; ++gi)
    #pragma unroll
    for (int e = 0; e < {_VEC}; ++e) o[gi][e] = 0.0f;
{rounds("kw", "krow", k_stride, values)}
      float s_[{NV}];
      scores(kw[u], min(j, je - 1), s_);
      #pragma unroll
      for (int i = 0; i < {NV}; ++i) sv[u][i] = (j < je) ? s_[i] : {NEG_INF_F};
    }}
    // the round's max over the warp's keys; where it grows, the factor that takes the sum and output to it (0 from
    // -inf: nothing summed yet; a NaN score makes the max NaN, and the row NaN, as the graph's softmax does)
    float fr[{NV}];
    #pragma unroll
    for (int i = 0; i < {NV}; ++i) {{
      float mx = sv[0][i];
      #pragma unroll
      for (int u = 1; u < {UNROLL}; ++u) mx = npu_max(mx, sv[u][i]);
      #pragma unroll
      for (int o2 = {lpk}; o2 < 32; o2 <<= 1) mx = npu_max(mx, __shfl_xor_sync(0xffffffffu, mx, o2));
      mx = npu_max(mr[i], mx);
      fr[i] = (mr[i] == {NEG_INF_F}) ? 0.0f : ((mx == mr[i]) ? 1.0f : __expf(mr[i] - mx));
      ls[i] *= fr[i];
      mr[i] = mx;
    }}
{rescale}
    #pragma unroll
    for (int u = 0; u < {UNROLL}; ++u) {{
      if ({past_end}) break;
      float pr[{NV}];
      #pragma unroll
      for (int i = 0; i < {NV}; ++i) {{
        pr[i] = (sv[u][i] == {NEG_INF_F}) ? 0.0f : __expf(sv[u][i] - mr[i]);
        ls[i] += pr[i];
      }}
      float vf[{_VEC}];
      {_unpack(dt, 'vw[u]', 'vf')}
{accumulate}
    }}
  }}
  // the warp's keys share its max: their sums and outputs add up
  #pragma unroll
  for (int i = 0; i < {NV}; ++i)
    #pragma unroll
    for (int o2 = {lpk}; o2 < 32; o2 <<= 1) ls[i] += __shfl_xor_sync(0xffffffffu, ls[i], o2);
  #pragma unroll
  for (int gi = 0; gi < {g}; ++gi)
    #pragma unroll
    for (int e = 0; e < {_VEC}; ++e)
      #pragma unroll
      for (int o2 = {lpk}; o2 < 32; o2 <<= 1) o[gi][e] += __shfl_xor_sync(0xffffffffu, o[gi][e], o2);
  __shared__ float wm[{WARPS}][{g}], wl[{WARPS}][{g}], wo[{WARPS}][{g}][{d}];
{holders}
  if (sub == 0) {{
    #pragma unroll
    for (int gi = 0; gi < {g}; ++gi)
      #pragma unroll
      for (int e = 0; e < {_VEC}; ++e) wo[warp][gi][li * {_VEC} + e] = o[gi][e];
  }}
  __syncthreads();
  // the split's record per head: the warps' parts at the block's max
  for (int t = threadIdx.x; t < {g * d}; t += blockDim.x) {{
    const int gi = t / {d}, dd = t % {d};
    float mb = wm[0][gi];
    #pragma unroll
    for (int w = 1; w < {WARPS}; ++w) mb = npu_max(mb, wm[w][gi]);
    float acc = 0.0f, lb = 0.0f;
    #pragma unroll
    for (int w = 0; w < {WARPS}; ++w) {{
      const float f = (wm[w][gi] == {NEG_INF_F}) ? 0.0f : __expf(wm[w][gi] - mb);
      acc = fmaf(wo[w][gi][dd], f, acc);
      lb = fmaf(wl[w][gi], f, lb);
    }}
    float* part = out1 + ((bi * {p.heads} + kvh * {g} + gi) * {pl.splits} + split) * {stride};
    part[2 + dd] = acc;
    if (dd == 0) {{ part[0] = mb; part[1] = lb; }}
  }}
}}
"""
