"""CUDA C sources of the library kernels (GEMM around cuBLAS, convolution, attention), rendered per kernel from its
record and specialised by its constants (shapes, strides, offsets, dtypes, flags). Every kernel computes in fp32
registers and accumulates in fp32; the pointer arguments are the base pointers of the buffers of `[*outs, *args]` in
order (offsets are constants). Epilogues are expressions, rendered inline by the renderer base.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import NPUCompileError
from ...expr import nodes as X
from ...kernels import AttentionKernel, Conv2dKernel, GemmKernel, plan_of
from ...program import CompiledProgram, KernelCall, TensorRef
from ..clike import (
    ExprRenderer,
    KernelText,
    Launch,
    Scope,
    Store,
    attention_geometry,
    ptrs_of,
    render_expression,
)
from . import conv_direct, conv_narrow
from .common import (
    CUDA,
    KERNEL_NAME,
    NEG_INF_F,
    PRELUDE,
    REDUCE_HELPERS,
    WAIT,
    affine,
    grid_for,
    index_type,
    literal,
    load_expr,
    max_extent,
    reg,
    round_expr,
    store_expr,
    valid_length_prologue,
)
from .conv_tc import conv2d_tc
from .decode_attention import grouped_decode, grouped_decode_applies
from .flash_attention import flash_attention


def _dt(program: CompiledProgram, ref: TensorRef) -> str:
    return program.buffers[ref.buffer].dtype


def _signature(k: KernelCall, program: CompiledProgram, block: int, names: list[str] | None = None,
               min_blocks: int = 0, cluster_z: int = 0, lang=CUDA) -> str:
    params = [f"{lang.storage(_dt(program, o))}* out{i}" for i, o in enumerate(k.writes)]
    for i, a in enumerate(k.args):
        name = names[i] if names else f"a{i}"
        params.append(f"const {lang.storage(_dt(program, a))}* __restrict__ {name}")
    bounds = f"{block}, {min_blocks}" if min_blocks else f"{block}"
    cluster = f"__cluster_dims__(1, 1, {cluster_z}) " if cluster_z else ""
    return f'extern "C" __global__ void {cluster}__launch_bounds__({bounds}) {KERNEL_NAME}({", ".join(params)})'


def _ityp(*refs: TensorRef) -> str:
    return index_type(max(max_extent(tuple(r.shape), tuple(r.strides), r.offset) for r in refs))


def _grid(n: int, block: int) -> int:
    return grid_for(n, block, CUDA.max_grid)


def render_epilogue(expr: X.Expr, k: KernelCall, program: CompiledProgram, names: list[str], acc: str | list[str],
                    ityp: str, indent: str, language=CUDA) -> tuple[list[str], str]:
    """Lines computing an epilogue inline (output indices `o{d}` and the accumulator `acc` already defined: one name
    per column group where there are several) and the name of its value; `language`: CUDA, or FAST_CUDA."""
    r = ExprRenderer(language, KernelText([], 0), names, [_dt(program, a) for a in k.args], tuple(k.outs[0].shape),
                     ityp, acc=acc, prefix="ep_")
    scope = Scope(indent)
    value = r.emit(expr, scope)
    return scope.lines, value


# ---- conv2d: implicit GEMM ---------------------------------------------------------------------------------------

CONV_BM, CONV_BN, CONV_BK, CONV_THREADS = 64, 64, 16, 256


def conv_names(spec: Conv2dKernel, n_args: int) -> list[str]:
    """The kernel's parameter names for a conv2d's arguments: its operands, then its epilogue's."""
    names = ["x", "w"] + (["bias"] if spec.bias else [])
    if spec.side_stride:
        names += ["x2", "w2"] + (["bias2"] if spec.side_bias else [])
    return names + [f"e{i}" for i in range(spec.first_epilogue_arg, n_args)]


def _conv_tiles(acc: str, x: TensorRef, w: TensorRef, geom: tuple[int, ...], names: tuple[str, str],
                dts: tuple[str, str], m_total: int, ityp: str, wo: int, ho: int, lang=CUDA) -> str:
    """The K loop of the direct implicit GEMM into `acc` (4 x 4 a thread) over `x` (read as `names[0]`) and `w`:
    geom is (stride h, w, padding h, w, dilation h, w, input h, w)."""
    sh, sw, ph, pw, dh, dw, h, wd = geom
    _, cg, kh, kw = w.shape
    k_total = cg * kh * kw
    xs, ws = x.strides, w.strides
    x_at = affine([("nb", xs[0]), ("ci", xs[1]), ("ih", xs[2]), ("iw", xs[3])], x.offset)
    w_at = affine([("co", ws[0]), ("cc", ws[1]), ("kr", ws[2]), ("ks", ws[3])], w.offset)
    BM, BN, BK, T = CONV_BM, CONV_BN, CONV_BK, CONV_THREADS
    og = w.shape[0] // (x.shape[1] // cg)
    return f"""  for (int k0 = 0; k0 < {k_total}; k0 += {BK}) {{
    #pragma unroll
    for (int q = 0; q < {BM * BK // T}; ++q) {{
      const int e = tid + q * {T};
      const int kk = e / {BM}, mm = e % {BM};
      const {ityp} m = m0 + mm;
      const int kidx = k0 + kk;
      float v = 0.0f;
      if (m < {m_total} && kidx < {k_total}) {{
        const {ityp} ow = m % {wo}; const {ityp} t1 = m / {wo};
        const {ityp} oh = t1 % {ho}; const {ityp} nb = t1 / {ho};
        const int ks = kidx % {kw}; const int t2 = kidx / {kw};
        const int kr = t2 % {kh}; const int cc = t2 / {kh};
        const {ityp} ih = oh * {sh} - {ph} + kr * {dh};
        const {ityp} iw = ow * {sw} - {pw} + ks * {dw};
        const {ityp} ci = ({ityp})grp * {cg} + cc;
        if (ih >= 0 && ih < {h} && iw >= 0 && iw < {wd}) v = {lang.load_expr(dts[0], names[0] + '[' + x_at + ']')};
      }}
      As[kk][mm] = v;
    }}
    #pragma unroll
    for (int q = 0; q < {BN * BK // T}; ++q) {{
      const int e = tid + q * {T};
      const int kk = e % {BK}, nn = e / {BK};
      const int nidx = n0 + nn;
      const int kidx = k0 + kk;
      float v = 0.0f;
      if (nidx < {og} && kidx < {k_total}) {{
        const int ks = kidx % {kw}; const int t2 = kidx / {kw};
        const int kr = t2 % {kh}; const int cc = t2 / {kh};
        const {ityp} co = ({ityp})grp * {og} + nidx;
        v = {lang.load_expr(dts[1], names[1] + '[' + w_at + ']')};
      }}
      Bs[kk][nn] = v;
    }}
    __syncthreads();
    #pragma unroll
    for (int kk = 0; kk < {BK}; ++kk) {{
      float av[4], bv[4];
      #pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = As[kk][tm + 16 * i];
      #pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][tn + 16 * j];
      #pragma unroll
      for (int i = 0; i < 4; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j) {acc}[i][j] = fmaf(av[i], bv[j], {acc}[i][j]);
    }}
    __syncthreads();
  }}"""


def conv2d(k: KernelCall, program: CompiledProgram, lang=CUDA) -> tuple[str, Launch]:
    """Implicit GEMM: M = N*Ho*Wo output pixels x Og output channels of a group, K = Cg*KH*KW, in 64x64x16 tiles
    through shared memory (im2col on the fly, zero padding by bounds checks); bias, residual and activation in the
    epilogue, one rounding at the store. A side conv (one group) is a second such loop, into its own sums. Nothing
    in it depends on the warp width: `lang` (CUDA, or the hip target's language) writes its types and prelude."""
    spec: Conv2dKernel = k.spec
    x, w = k.args[0], k.args[1]
    out = k.outs[0]
    has_bias = spec.bias
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    _, _, ho, wo = out.shape
    g = spec.groups
    og = o // g
    m_total = n * ho * wo
    os_ = out.strides
    bias = k.args[2] if has_bias else None
    ityp = _ityp(*k.args, out)
    xd, wdt, od = _dt(program, x), _dt(program, w), _dt(program, out)
    names = conv_names(spec, len(k.args))
    o_at = affine([("nb", os_[0]), ("co", os_[1]), ("oh", os_[2]), ("ow", os_[3])], out.offset)
    loops = _conv_tiles("acc", x, w, (*spec.stride, *spec.padding, *spec.dilation, h, wd), ("x", "w"), (xd, wdt),
                        m_total, ityp, wo, ho, lang)
    accs: str | list[str] = "accv"
    side_lines = []
    if spec.side_stride:
        x2, w2 = k.args[spec.side_first_arg], k.args[spec.side_first_arg + 1]
        loops += "\n" + _conv_tiles("acc2", x2, w2, (*spec.side_stride, 0, 0, 1, 1, *x2.shape[2:]), ("x2", "w2"),
                                     (_dt(program, x2), _dt(program, w2)), m_total, ityp, wo, ho, lang)
        side_lines.append("        float v2 = acc2[i][j];")
        if spec.side_bias:
            b2 = k.args[spec.side_first_arg + 2]
            b2_at = affine([("co", b2.strides[0])], b2.offset)
            side_lines.append(f"        v2 += {lang.load_expr(_dt(program, b2), 'bias2[' + b2_at + ']')};")
        side_lines.append(f"        const float sidev = {lang.round_expr('v2', od)};")
        accs = ["accv", "sidev"]
    epilogue = []
    if bias is not None:
        b_at = affine([("co", bias.strides[0])], bias.offset)
        epilogue.append(f"        v += {lang.load_expr(_dt(program, bias), 'bias[' + b_at + ']')};")
    value = "v"
    if spec.epilogue is not None:
        # the epilogue reads the result as the unfused graph stored it: rounded to the output dtype
        epilogue.append(f"        const float accv = {lang.round_expr('v', od)};")
        epilogue += side_lines
        epilogue.append(f"        const {ityp} o0 = nb, o1 = co, o2 = oh, o3 = ow;")
        lines, value = render_epilogue(spec.epilogue, k, program, names, accs, ityp, "        ", lang)
        epilogue += lines
    value_dtype = spec.epilogue.dtype if spec.epilogue is not None else "float32"
    BM, BN, BK, T = CONV_BM, CONV_BN, CONV_BK, CONV_THREADS
    zero = "".join(f"""
  float {a}[4][4];
  #pragma unroll
  for (int i = 0; i < 4; ++i)
    #pragma unroll
    for (int j = 0; j < 4; ++j) {a}[i][j] = 0.0f;""" for a in (("acc", "acc2") if spec.side_stride else ("acc",)))
    src = f"""{lang.prelude}
{_signature(k, program, T, names, lang=lang)} {{
{lang.wait}
  // As[k][m]: im2col tile of the input; Bs[k][n]: weight tile (one padding column against bank conflicts)
  __shared__ float As[{BK}][{BM}];
  __shared__ float Bs[{BK}][{BN} + 1];
  const int tid = threadIdx.x;
  const int tm = tid & 15, tn = tid >> 4;
  const {ityp} m0 = ({ityp})blockIdx.x * {BM};
  const int n0 = blockIdx.y * {BN};
  const int grp = blockIdx.z;{zero}
{loops}
  #pragma unroll
  for (int i = 0; i < 4; ++i) {{
    const {ityp} m = m0 + tm + 16 * i;
    if (m >= {m_total}) continue;
    const {ityp} ow = m % {wo}; const {ityp} t1 = m / {wo};
    const {ityp} oh = t1 % {ho}; const {ityp} nb = t1 / {ho};
    #pragma unroll
    for (int j = 0; j < 4; ++j) {{
      const int nidx = n0 + tn + 16 * j;
      if (nidx < {og}) {{
        const {ityp} co = ({ityp})grp * {og} + nidx;
        float v = acc[i][j];
{chr(10).join(epilogue)}
        out0[{o_at}] = {lang.store_expr(od, value, value_dtype)};
      }}
    }}
  }}
}}
"""
    grid = (-(-m_total // BM), -(-og // BN), g)
    if m_total == 0 or og == 0:
        grid = (0, 1, 1)
    return src, Launch(grid, T, ptrs_of(k))


def conv2d_tensor_cores(k: KernelCall, program: CompiledProgram, dev) -> list[tuple[str, Launch]]:
    """The implicit GEMM on tensor cores (`conv_tc.py`) for a record it applies to, on the device `dev` (a
    DeviceProfile), or the direct conv (`conv_direct.py`) or the conv of few input channels (`conv_narrow.py`)
    where one of those fits."""
    spec: Conv2dKernel = k.spec
    names = conv_names(spec, len(k.args))
    ityp = _ityp(*k.args, k.outs[0])

    def signature(threads: int, min_blocks: int, cluster_z: int = 0) -> str:
        return _signature(k, program, threads, names, min_blocks, cluster_z)

    if conv_direct.fits(k, program, dev):
        return conv_direct.conv2d_direct(k, program, render_epilogue, ityp, signature, names, dev)
    if conv_narrow.fits(k, program, dev):
        return conv_narrow.conv2d_narrow(k, program, render_epilogue, ityp, signature, names, dev)
    return conv2d_tc(k, program, render_epilogue, ityp, signature, names, dev)


# ---- attention -----------------------------------------------------------------------------------------------------

ATTN_WARPS = 8
# Decode has a handful of query rows (one per head), fewer than two an SM: give each row more warps, so the walk over
# the cache is split finer, rather than leave the rows' blocks latency-bound on one key after another.
ATTN_WARPS_FEW_ROWS = 16
FEW_ROWS_PER_SM = 2


@dataclass
class _Attn:
    """What both attention generators share: the operands' index maps, the mask line, the valid-length prologue,
    the loop bound and the score function (q.k, scaled and masked, rounded as the graph rounds)."""

    q: TensorRef
    kk: TensorRef
    v: TensorRef
    out: TensorRef
    mask: TensorRef | None
    qs_shape: tuple[int, ...]
    b: int
    h: int
    t: int
    d: int
    lk: int
    dv: int
    group: int
    dpl: int
    vpl: int
    ityp: str
    qd: str
    vd: str
    od: str
    sd: str
    pd: str
    q_at: str
    v_at: str
    o_at: str
    valid: str
    jmax: str
    score: str


def _attention_setup(k: KernelCall, program: CompiledProgram) -> _Attn:
    p: AttentionKernel = k.spec
    g = attention_geometry(k, "cuda")
    q, kk, v, out, mask, pos = g.q, g.k, g.v, g.out, g.mask, g.pos
    b, h, t, d, lk, dv, group = g.b, g.h, g.t, g.d, g.kv_len, g.v_dim, g.group
    dpl, vpl = -(-d // 32), -(-dv // 32)
    if dpl > 32 or vpl > 32:
        raise NPUCompileError(f"kernel {k.name}: cuda attention supports head dims up to 1024")
    ityp = _ityp(q, kk, v, out, *([mask] if mask is not None else []))
    qd, kd, vd, od = (_dt(program, r) for r in (q, kk, v, out))
    sd, pd = p.scores_dtype, p.probs_dtype
    q_at, k_at, v_at, o_at, m_at = g.q_at, g.k_at, g.v_at("j"), g.o_at, g.m_at
    mask_line = ""
    if mask is not None:
        if p.mask == "bool":
            mask_line = f"      if (!a3[{m_at}]) s = {NEG_INF_F};"
        else:
            mask_line = f"      s = {round_expr('s + ' + load_expr(_dt(program, mask), f'a3[{m_at}]'), sd)};"
    scale = literal(float(p.scale), "float32")
    jmax = f"min(ti + 1, ({ityp}){lk})" if p.is_causal else f"({ityp}){lk}"
    valid = ""
    if pos is not None:
        valid = valid_length_prologue(pos, len(k.args) - 1, lk, ityp)
        jmax = f"min({jmax}, nvalid)"

    # one score: q.k over the head dim (lanes split it, then a warp sum), scaled and masked, rounded as the graph
    score = f"""    auto score = [&](const {ityp} j) -> float {{
      float s = 0.0f;
      #pragma unroll
      for (int p = 0; p < {dpl}; ++p) {{
        const {ityp} dd = lane + 32 * p;
        if (dd < {d}) s = fmaf(qr[p], {load_expr(kd, f'a1[{k_at}]')}, s);
      }}
      #pragma unroll
      for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      s = {round_expr('s', sd)};
      s = {round_expr(f's * {scale}', sd)};
{mask_line}
      return s;
    }};"""
    return _Attn(q, kk, v, out, mask, (b, h, t, d), b, h, t, d, lk, dv, group, dpl, vpl, ityp, qd, vd, od, sd, pd, q_at,
                 v_at, o_at, valid, jmax, score)


def attention(k: KernelCall, program: CompiledProgram, dev) -> tuple[str, Launch]:
    """softmax(q k^T * scale + mask) v, one block per query row, keys split over the warps, fp32 accumulation;
    GQA maps query head h to kv head h / (heads / kv_heads) (no expanded K/V).

    Roundings follow the graph: scores rounded to `scores_dtype` after q.k, after the scale and after the mask (a bf16
    eager graph stores each); probabilities rounded to `probs_dtype` before the product with v. With fp32
    probabilities one online-softmax pass suffices; rounded probabilities need the row's max and sum first, so a
    first pass finds them and a second accumulates. `valid_len`: the last argument holds the cache positions written
    this step; keys past the largest are masked anyway and are not read. A row with every key masked gives zeros."""
    a = _attention_setup(k, program)
    ityp, dv, dpl, vpl, d, vd, od, pd = a.ityp, a.dv, a.dpl, a.vpl, a.d, a.vd, a.od, a.pd
    b, h, t, group, q_at, v_at, o_at, valid, jmax, score = (a.b, a.h, a.t, a.group, a.q_at, a.v_at, a.o_at, a.valid,
                                                            a.jmax, a.score)
    qd = a.qd
    few = FEW_ROWS_PER_SM * dev.multiprocessors
    nw = ATTN_WARPS_FEW_ROWS if math.prod(a.qs_shape[:3]) <= few else ATTN_WARPS
    block = 32 * nw
    two_pass = pd in ("float16", "bfloat16")
    load_v = f"(dd < {dv} ? {load_expr(vd, f'a2[{v_at}]')} : 0.0f)"
    if not two_pass:
        body = f"""    #pragma unroll 4
    for ({ityp} j = warp; j < jend; j += {nw}) {{
      const float s = score(j);
      const float mn = npu_max(m, s);
      if (mn == {NEG_INF_F}) continue;  // every score so far is masked out: nothing to accumulate
      const float corr = (m == {NEG_INF_F}) ? 0.0f : expf(m - mn);
      const float pj = (s == {NEG_INF_F}) ? 0.0f : expf(s - mn);
      l = l * corr + pj;
      #pragma unroll
      for (int p = 0; p < {vpl}; ++p) {{
        const {ityp} dd = lane + 32 * p;
        o[p] = fmaf(pj, {load_v}, o[p] * corr);
      }}
      m = mn;
    }}
    if (lane == 0) {{ sm[warp] = m; sl[warp] = l; }}
    #pragma unroll
    for (int p = 0; p < {vpl}; ++p) so[warp][lane + 32 * p] = o[p];
    __syncthreads();
    float mx = sm[0];
    #pragma unroll
    for (int w = 1; w < {nw}; ++w) mx = npu_max(mx, sm[w]);
    float wt[{nw}];
    float tot = 0.0f;
    #pragma unroll
    for (int w = 0; w < {nw}; ++w) {{
      wt[w] = (sm[w] == {NEG_INF_F}) ? 0.0f : expf(sm[w] - mx);
      tot += sl[w] * wt[w];
    }}
    for ({ityp} dd = threadIdx.x; dd < {dv}; dd += blockDim.x) {{
      float acc = 0.0f;
      #pragma unroll
      for (int w = 0; w < {nw}; ++w) acc += so[w][dd] * wt[w];
      const float r = (mx == {NEG_INF_F}) ? 0.0f : acc / tot;
      out0[{o_at}] = {store_expr(od, 'r', 'float32')};
    }}
    __syncthreads();"""
    else:
        body = f"""    // pass 1: the row's max and sum of exponentials (unrolled: independent keys' loads overlap)
    #pragma unroll 4
    for ({ityp} j = warp; j < jend; j += {nw}) {{
      const float s = score(j);
      const float mn = npu_max(m, s);
      if (mn == {NEG_INF_F}) continue;
      l = l * ((m == {NEG_INF_F}) ? 0.0f : expf(m - mn)) + ((s == {NEG_INF_F}) ? 0.0f : expf(s - mn));
      m = mn;
    }}
    if (lane == 0) {{ sm[warp] = m; sl[warp] = l; }}
    __syncthreads();
    float mx = sm[0];
    #pragma unroll
    for (int w = 1; w < {nw}; ++w) mx = npu_max(mx, sm[w]);
    float tot = 0.0f;
    #pragma unroll
    for (int w = 0; w < {nw}; ++w) tot += (sm[w] == {NEG_INF_F}) ? 0.0f : sl[w] * expf(sm[w] - mx);
    // pass 2: probabilities rounded to {pd}, times v
    if (mx != {NEG_INF_F}) {{
      #pragma unroll 4
      for ({ityp} j = warp; j < jend; j += {nw}) {{
        const float s = score(j);
        const float pj = {round_expr('expf(s - mx) / tot', pd)};
        #pragma unroll
        for (int p = 0; p < {vpl}; ++p) {{
          const {ityp} dd = lane + 32 * p;
          o[p] = fmaf(pj, {load_v}, o[p]);
        }}
      }}
    }}
    #pragma unroll
    for (int p = 0; p < {vpl}; ++p) so[warp][lane + 32 * p] = o[p];
    __syncthreads();
    for ({ityp} dd = threadIdx.x; dd < {dv}; dd += blockDim.x) {{
      float acc = 0.0f;
      #pragma unroll
      for (int w = 0; w < {nw}; ++w) acc += so[w][dd];
      out0[{o_at}] = {store_expr(od, 'acc', 'float32')};
    }}
    __syncthreads();"""
    src = f"""{PRELUDE}{REDUCE_HELPERS if a.valid else ''}
{_signature(k, program, block)} {{
{WAIT}
  __shared__ float sm[{nw}], sl[{nw}];
  __shared__ float so[{nw}][{vpl * 32}];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;{valid}
  float qr[{dpl}];
  for ({ityp} row = blockIdx.x; row < {b * h * t}; row += gridDim.x) {{
    const {ityp} ti = row % {t}; const {ityp} t1 = row / {t};
    const {ityp} hi = t1 % {h}; const {ityp} bi = t1 / {h};
    const {ityp} kvh = hi / {group};
{score}
    #pragma unroll
    for (int p = 0; p < {dpl}; ++p) {{
      const {ityp} dd = lane + 32 * p;
      qr[p] = dd < {d} ? {load_expr(qd, f'a0[{q_at}]')} : 0.0f;
    }}
    float m = {NEG_INF_F}, l = 0.0f;
    float o[{vpl}];
    #pragma unroll
    for (int p = 0; p < {vpl}; ++p) o[p] = 0.0f;
    const {ityp} jend = {jmax};
{body}
  }}
}}
"""
    rows = b * h * t
    grid = _grid(rows, 1) if rows else 0
    return src, Launch((grid, 1, 1), block, ptrs_of(k))


def attention_tiles(k: KernelCall, program: CompiledProgram, dev) -> list[tuple[str, Launch]]:
    """Attention over many query rows on tensor cores (see flash_attention.py; the caller checked it applies) on the
    device `dev`."""
    mask = [k.args[3]] if k.spec.mask != "none" else []
    return flash_attention(k, program, lambda block, min_blocks: _signature(k, program, block, min_blocks=min_blocks),
                           ptrs_of(k),
                           _ityp(*k.args[:3], k.outs[0], *mask), dev)


SPLIT_WARPS = 4
COMBINE_WARPS = 8
# loads in flight a lane: on the H100 (Qwen2.5-1.5B decode, 132 splits a KV head, in one process) 8 gave 1.700 /
# 1.727 / 1.882 ms a step at KV 1024 / 2000 / 8192 against 1.70 / 1.73 / 1.92-1.98 with 4 and 1.746 / 1.787 /
# 1.943 with 17 (every split of a warp at once)
COMBINE_UNROLL = 8


def attention_split(k: KernelCall, program: CompiledProgram) -> list[tuple[str, Launch]]:
    """Decode attention with the keys split across blocks (flash-decoding): a decode step has one query row per
    head, too few rows to fill the GPU if each row is one block. Three launches over a float32 scratch output
    (`outs[1]`, [rows, splits, 2 + v_dim]): (1) each (row, split) block finds its keys' max and sum of
    exponentials; (2) each block combines all splits' (max, sum) into the row's, and accumulates its keys'
    probabilities (rounded to `probs_dtype` as the graph rounds them) times v; (3) one block per row adds the
    splits' partial outputs. Scores are rounded exactly as in `attention`."""
    a = _attention_setup(k, program)
    if grouped_decode_applies(k, program):
        # one block per (KV head, split) for the whole query-head group: each key and value row read once
        launches = grouped_decode(k, program, a, lambda block: _signature(k, program, block), ptrs_of(k))
        return launches + [_split_combine(k, program, a, online=k.spec.online)]
    ityp, d, dv, dpl, vpl, vd, pd = a.ityp, a.d, a.dv, a.dpl, a.vpl, a.vd, a.pd
    rows = a.b * a.h * a.t
    splits = plan_of(k).splits
    nw = SPLIT_WARPS
    block = 32 * nw
    stride = 2 + dv
    head = f"""{PRELUDE}{REDUCE_HELPERS}
{_signature(k, program, block)} {{
{WAIT}
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;{a.valid}
  const {ityp} row = blockIdx.x, split = blockIdx.y;
  const {ityp} ti = row % {a.t}; const {ityp} t1 = row / {a.t};
  const {ityp} hi = t1 % {a.h}; const {ityp} bi = t1 / {a.h};
  const {ityp} kvh = hi / {a.group};
  const {ityp} jend = {a.jmax};
  const {ityp} per = (jend + {splits} - 1) / {splits};
  const {ityp} jb = split * per, je = min(jend, jb + per);
  float* part = out1 + (row * {splits} + split) * {stride};
"""
    score = f"""  float qr[{dpl}];
  #pragma unroll
  for (int p = 0; p < {dpl}; ++p) {{
    const {ityp} dd = lane + 32 * p;
    qr[p] = dd < {d} ? {load_expr(a.qd, f'a0[{a.q_at}]')} : 0.0f;
  }}
{a.score}
"""
    stats = head + score + f"""  __shared__ float sm[{nw}], sl[{nw}];
  float m = {NEG_INF_F}, l = 0.0f;
  #pragma unroll 4
  for ({ityp} j = jb + warp; j < je; j += {nw}) {{
    const float s = score(j);
    const float mn = npu_max(m, s);
    if (mn == {NEG_INF_F}) continue;
    l = l * ((m == {NEG_INF_F}) ? 0.0f : expf(m - mn)) + ((s == {NEG_INF_F}) ? 0.0f : expf(s - mn));
    m = mn;
  }}
  if (lane == 0) {{ sm[warp] = m; sl[warp] = l; }}
  __syncthreads();
  if (threadIdx.x == 0) {{
    float mx = sm[0];
    for (int w = 1; w < {nw}; ++w) mx = npu_max(mx, sm[w]);
    float tot = 0.0f;
    for (int w = 0; w < {nw}; ++w) tot += (sm[w] == {NEG_INF_F}) ? 0.0f : sl[w] * expf(sm[w] - mx);
    part[0] = mx;
    part[1] = tot;
  }}
}}
"""
    accumulate = head + score + f"""  __shared__ float so[{nw}][{vpl * 32}];
  const float* base = out1 + row * {splits} * {stride};
  float mx = {NEG_INF_F};
  for (int s2 = 0; s2 < {splits}; ++s2) mx = npu_max(mx, base[s2 * {stride}]);
  float tot = 0.0f;
  for (int s2 = 0; s2 < {splits}; ++s2) {{
    const float ms = base[s2 * {stride}];
    tot += (ms == {NEG_INF_F}) ? 0.0f : base[s2 * {stride} + 1] * expf(ms - mx);
  }}
  float o[{vpl}];
  #pragma unroll
  for (int p = 0; p < {vpl}; ++p) o[p] = 0.0f;
  if (mx != {NEG_INF_F}) {{
    #pragma unroll 4
    for ({ityp} j = jb + warp; j < je; j += {nw}) {{
      const float s = score(j);
      const float pj = (s == {NEG_INF_F}) ? 0.0f : {round_expr('expf(s - mx) / tot', pd)};
      #pragma unroll
      for (int p = 0; p < {vpl}; ++p) {{
        const {ityp} dd = lane + 32 * p;
        o[p] = fmaf(pj, (dd < {dv} ? {load_expr(vd, f'a2[{a.v_at}]')} : 0.0f), o[p]);
      }}
    }}
  }}
  #pragma unroll
  for (int p = 0; p < {vpl}; ++p) so[warp][lane + 32 * p] = o[p];
  __syncthreads();
  for ({ityp} dd = threadIdx.x; dd < {dv}; dd += blockDim.x) {{
    float acc = 0.0f;
    #pragma unroll
    for (int w = 0; w < {nw}; ++w) acc += so[w][dd];
    part[2 + dd] = acc;
  }}
}}
"""
    ptrs = ptrs_of(k)
    return [(stats, Launch((rows, splits, 1), block, ptrs)), (accumulate, Launch((rows, splits, 1), block, ptrs)),
            _split_combine(k, program, a)]


def _split_combine(k: KernelCall, program: CompiledProgram, a: _Attn, online: bool = False) -> tuple[str, Launch]:
    """The last launch of split attention: each row's output is the sum of its splits' partial outputs. A block
    owns (row, 32 output columns); its COMBINE_WARPS warps each sum every COMBINE_WARPS-th split with COMBINE_UNROLL
    loads in flight, then one warp adds the warps' sums in a fixed order. One thread a column summing every split in
    turn (12 blocks for a decode step's 12 heads) was a chain of 100-odd dependent loads a layer. `online`: the
    splits' outputs are at their own max, unnormalised (decode_attention.py); each is weighed by exp(its max - the
    row's max) / the row's sum, the weights computed once a row into shared memory (a row none of whose keys is
    visible gives zeros)."""
    rows, splits, stride, ityp, dv, od = a.b * a.h * a.t, plan_of(k).splits, 2 + a.dv, a.ityp, a.dv, a.od
    nw, un = COMBINE_WARPS, COMBINE_UNROLL
    weights, weigh = "", ""
    if online:
        weights = f"""
    const float* stats = out1 + row * {splits} * {stride};
    float mx = {NEG_INF_F};
    for (int s2 = threadIdx.x; s2 < {splits}; s2 += blockDim.x) mx = npu_max(mx, stats[s2 * {stride}]);
    mx = npu_block_reduce(mx, NpuMax(), red);
    float tot = 0.0f;
    for (int s2 = threadIdx.x; s2 < {splits}; s2 += blockDim.x) {{
      const float m2 = stats[s2 * {stride}];
      tot += (m2 == {NEG_INF_F}) ? 0.0f : stats[s2 * {stride} + 1] * __expf(m2 - mx);
    }}
    tot = npu_block_reduce(tot, NpuSum(), red);
    for (int s2 = threadIdx.x; s2 < {splits}; s2 += blockDim.x) {{
      const float m2 = stats[s2 * {stride}];
      wt[s2] = (m2 == {NEG_INF_F}) ? 0.0f : __expf(m2 - mx) / tot;
    }}
    __syncthreads();"""
        weigh = " * wt[s2]"
    src = f"""{PRELUDE}{REDUCE_HELPERS if online else ""}
{_signature(k, program, 32 * nw)} {{
{WAIT}
  __shared__ float part[{nw}][33];{f"{chr(10)}  __shared__ float wt[{splits}], red[32];" if online else ""}
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const {ityp} dd = ({ityp})blockIdx.y * 32 + lane;
  for ({ityp} row = blockIdx.x; row < {rows}; row += gridDim.x) {{
    const {ityp} ti = row % {a.t}; const {ityp} t1 = row / {a.t};
    const {ityp} hi = t1 % {a.h}; const {ityp} bi = t1 / {a.h};{weights}
    const float* base = out1 + row * {splits} * {stride} + 2 + min(dd, ({ityp}){dv - 1});
    float r = 0.0f;
    #pragma unroll {un}
    for (int s2 = warp; s2 < {splits}; s2 += {nw}) r += base[s2 * {stride}]{weigh};
    part[warp][lane] = r;
    __syncthreads();
    if (warp == 0 && dd < {dv}) {{
      float t = part[0][lane];
      #pragma unroll
      for (int w = 1; w < {nw}; ++w) t += part[w][lane];
      out0[{a.o_at}] = {store_expr(od, 't', 'float32')};
    }}
    __syncthreads();
  }}
}}
"""
    return src, Launch((_grid(rows, 1), -(-dv // 32), 1), 32 * nw, ptrs_of(k))


# ---- gemm: what runs around cuBLAS, and the kernel for what cuBLAS cannot do ----------------------------------------


def gemm_bias_fill(k: KernelCall, program: CompiledProgram, dev, lang=CUDA) -> tuple[str, Launch] | None:
    """out = bias (its broadcast view); cuBLAS then adds alpha * A @ B with beta on it. The runtime skips this launch
    where cuBLASLt adds the bias in the GEMM's epilogue (`gemm._bias_epilogue`): cuBLAS rounds the product before
    adding C to it (measured: bf16 on the H100), the epilogue rounds once, as ATen's linear does."""
    spec: GemmKernel = k.spec
    if not spec.bias:
        return None
    bias, out = k.args[2], k.outs[0]
    bd, od = _dt(program, bias), _dt(program, out)
    load = X.Load(bd, 0, tuple(bias.strides), bias.offset)
    expr: X.Expr = X.Cast(od, load) if od != bd else load
    return render_expression(lang, expr, [bd], [program.buffers[bias.buffer].numel], _store(out, od), tuple(out.shape),
                             (), 0, [("out", 0), ("arg", 2)], device=dev)


def _store(out: TensorRef, dtype: str) -> Store:
    return Store(tuple(out.shape), tuple(out.strides), out.offset, dtype)


def gemm_epilogue(k: KernelCall, program: CompiledProgram, dev, lang=CUDA) -> tuple[str, Launch] | None:
    """The epilogue after cuBLAS, in place: out = epilogue(out) with `Acc` read from the output (the product already
    rounded to the output dtype, as the unfused graph stores it before a residual add). Reads and writes `out`
    element by element: no `__restrict__` there."""
    spec: GemmKernel = k.spec
    if spec.epilogue is None:
        return None
    out = k.outs[0]
    od = _dt(program, out)
    used = sorted({r.arg for r in X.reads(spec.epilogue)})
    index = {a: i + 1 for i, a in enumerate(used)}

    def rebind(e: X.Expr) -> X.Expr | None:
        if isinstance(e, X.Acc):
            return X.Load(od, 0, tuple(out.strides), out.offset)
        if isinstance(e, X.Load):
            return X.Load(e.dtype, index[e.arg], e.strides, e.offset, e.rstrides)
        if isinstance(e, X.Gather):
            return X.Gather(e.dtype, index[e.arg], e.offset, e.shape, e.strides,
                            tuple(X.substitute(i, rebind) for i in e.indices),
                            X.substitute(e.guard, rebind) if e.guard is not None else None, e.fill)
        return None

    expr = X.substitute(spec.epilogue, rebind)
    dts = [od] + [_dt(program, k.args[a]) for a in used]
    extents = [program.buffers[out.buffer].numel] + [program.buffers[k.args[a].buffer].numel for a in used]
    return render_expression(lang, expr, dts, extents, _store(out, od), tuple(out.shape), (), 0,
                             [("out", 0), ("out", 0)] + [("arg", a) for a in used], restrict=False, device=dev)


def gemm_direct(k: KernelCall, program: CompiledProgram, lang=CUDA) -> tuple[str, Launch]:
    """A plain kernel (one thread per output element) for the GEMMs cuBLAS has no type for: integers (exact in
    int64, wrapping, as ATen), mixed operand dtypes; and for a GEMM over column groups that neither the GEMV nor the
    grouped kernel takes (a program compiled for a newer GPU: each thread sums every group's column of its output).
    Bias and the epilogue inline."""
    spec: GemmKernel = k.spec
    a, b = k.args[0], k.args[1]
    out = k.outs[0]
    rank = len(out.shape)
    od = _dt(program, out)
    ad, bd = _dt(program, a), _dt(program, b)
    acc_dt = "int64" if reg(od) == "long long" else ("float64" if "float64" in (ad, bd, od) else "float32")
    acc_t = reg(acc_dt)
    n_out = math.prod(out.shape)
    ityp = _ityp(a, b, out, *k.args[2:])
    lead = [f"o{d}" for d in range(rank - 2)]
    i, j = f"o{rank - 2}", f"o{rank - 1}"
    groups, width = spec.acc_groups, spec.out_n
    a_at = affine([(v, a.strides[d]) for d, v in enumerate(lead)] + [(i, a.strides[-2]), ("kk", a.strides[-1])],
                  a.offset)

    def cvt(x: str, dt: str) -> str:
        return x if reg(dt) == acc_t else f"({acc_t})({x})"

    av = cvt(lang.load_expr(ad, "a0[" + a_at + "]"), ad)
    body: list[str] = []
    accs = [f"acc{g}" for g in range(groups)]
    for g, acc in enumerate(accs):
        col = j if g == 0 else f"({j} + {g * width})"
        b_at = affine([(v, b.strides[d]) for d, v in enumerate(lead)] + [("kk", b.strides[-2]), (col, b.strides[-1])],
                      b.offset)
        bv = cvt(lang.load_expr(bd, "a1[" + b_at + "]"), bd)
        body += [f"    {acc_t} {acc} = {literal(0, acc_dt)};",
                 f"    for ({ityp} kk = 0; kk < {spec.k}; ++kk)",
                 f"      {acc} += {av} * {bv};"]
        if spec.alpha != 1.0:
            body.append(f"    {acc} = {acc} * {literal(spec.alpha, acc_dt)};")
        if spec.bias:
            bias = k.args[2]
            at = affine([(f"o{d}", st) for d, st in enumerate(bias.strides)],
                        bias.offset + g * width * bias.strides[-1])
            biv = cvt(lang.load_expr(_dt(program, bias), f"a2[{at}]"), _dt(program, bias))
            beta = f" * {literal(spec.beta, acc_dt)}" if spec.beta != 1.0 else ""
            body.append(f"    {acc} = {acc} + {biv}{beta};")
    value, value_dtype = "acc0", acc_dt
    if spec.epilogue is not None:
        body += [f"    const {reg(od)} accv{g} = {lang.cast(acc, acc_dt, od)};" for g, acc in enumerate(accs)]
        lines, value = render_epilogue(spec.epilogue, k, program, [f"a{q}" for q in range(len(k.args))],
                                       "accv0" if groups == 1 else [f"accv{g}" for g in range(groups)], ityp, "    ",
                                       lang)
        body += lines
        value_dtype = spec.epilogue.dtype
    body.append(f"    out0[{affine([(f'o{d}', s) for d, s in enumerate(out.strides)], out.offset)}] = "
                f"{lang.store_expr(od, value, value_dtype)};")
    return _elementwise_shell(k, program, ityp, n_out, body, lang=lang)


def _elementwise_shell(k: KernelCall, program: CompiledProgram, ityp: str, n_out: int, body: list[str],
                       block: int = 256, lang=CUDA) -> tuple[str, Launch]:
    out = k.outs[0]
    lines = [lang.prelude, _signature(k, program, block, lang=lang) + " {", lang.wait,
             f"  for ({ityp} i = ({ityp})blockIdx.x * blockDim.x + threadIdx.x; i < {n_out}; "
             f"i += ({ityp})gridDim.x * blockDim.x) {{"]
    lines += [f"    {ln}" for ln in _decompose("i", tuple(out.shape), ityp)]
    lines += body
    lines += ["  }", "}"]
    grid = _grid(n_out, block) if n_out else 0
    return "\n".join(lines) + "\n", Launch((grid, 1, 1), block, ptrs_of(k))


def _decompose(var: str, shape: tuple[int, ...], ityp: str) -> list[str]:
    from ..clike import decompose

    return decompose(CUDA, var, shape, "o", ityp, "")
