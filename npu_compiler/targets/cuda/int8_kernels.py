"""CUDA C for the integer kinds (`qgemm`, `qconv2d`, `qadd`) and the weight-only GEMM (`wgemm`).

The CPU reference is the spec: every integer result equals it bit for bit.

- `qgemm` and `qconv2d` are one implicit-GEMM kernel on int8 tensor cores (`mma.sync.aligned.m16n8k32.row.col.s32.
  s8.s8.s32`, sm_80+): a tile of BM x BN outputs per block (the plan: `plan_int8`, from the device profile), K in
  steps of 32 through shared memory, four warps of 32 x (BN / 2) outputs each. The A tile is gathered through the
  operand's strides (a linear's rows, or a conv's windows: (channel, kh, kw) along K, padding and K's tail holding
  the input's zero point), the B tile is the weight with K contiguous. uint8 activations are made signed by flipping
  each byte's top bit (the zero point moves by 128). The tensor cores multiply raw codes; the zero points are applied
  once per output from the A tile's row sums and the B tile's column sums (sum (a - za)(b - zb) = sum ab - zb sum a
  - za sum b + K' za zb over the padded K'), exact modulo 2^32, which is the reference's int32 wrap. The epilogue
  adds the int32 bias and requantizes per output channel by TOSA's apply_scale_32 in 64-bit integers (or, with
  `dequantize`, f32(sum) x scale + bias in the reference's two float32 roundings), then clamps (a fused ReLU or
  clamp) and stores int8.
- `qadd` is elementwise, in the reference's 64-bit arithmetic (its products wrap modulo 2^64 as NumPy's int64 do).
- `wgemm` is a GEMV (wgemv.py) where codes and activations lie in 16-byte aligned rows: several weight rows a warp,
  16-byte loads of both, decoded to f32 in registers, split along K where the columns are too few for the device,
  with its folds (a norm's prologue, column groups, the epilogue). Elsewhere (odd K, strided views) a warp per output
  column reads a code at a time and computes the epilogue (the lowering folds a prologue or column groups only where
  the GEMV runs: `CudaTarget.wgemm_prologue`, `wgemm_column_groups`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import NPUCompileError
from ...kernels import QAddKernel, QConv2dKernel, QGemmKernel, WGemmKernel
from ...program import CompiledProgram, KernelCall, TensorRef
from ..clike import Launch, affine, max_extent, ptrs_of
from . import int8_conv
from .common import CUDA, PRELUDE, WAIT, index_type, load_expr, mma_sync_ok, round_expr, storage, store_expr
from .int8_common import (
    BLOCK,
    INTEGER_HELPERS,
    MMA_K,
    MMA_M,
    MMA_N,
    Int8Plan,
    dtype_of,
    grid_for,
    plan_int8,
    qadd_call,
    requant_store,
)
from .library import render_epilogue
from .wgemv import wgemv, wgemv_applies

ELEMENTWISE_BLOCK = 256
WGEMM_WARPS = 8  # output columns a block (a warp each)

def _signature(k: KernelCall, program: CompiledProgram, block: int) -> str:
    params = [f"{storage(dtype_of(program, o))}* out{i}" for i, o in enumerate(k.writes)]
    params += [f"const {storage(dtype_of(program, a))}* __restrict__ a{i}" for i, a in enumerate(k.args)]
    return f'extern "C" __global__ void __launch_bounds__({block}) npu_kernel({", ".join(params)})'


def _ityp(*refs: TensorRef) -> str:
    return index_type(max(max_extent(tuple(r.shape), tuple(r.strides), r.offset) for r in refs))


@dataclass
class _Gemm:
    """What the shared main loop needs of a qgemm or a qconv2d: rows M, columns N, K, the loaders (C statements
    that set `v` for A's (row r, k) and B's (column c, k) when in range), and the epilogue's channel."""

    rows: int
    cols: int
    kdim: int
    za: int  # A's zero point, after a uint8 operand is flipped to int8
    zb: int
    flip: bool
    load_a: str
    load_b: str
    rows_contiguous: bool = False  # A's neighbouring rows are neighbours in memory (a conv's pixels along W)
    # where a row of A (a column of B) is contiguous along K in 16-byte aligned rows: the element index of its start
    # (over `r`, `c`), loaded 16 bytes at a time
    vec_a: str | None = None
    vec_b: str | None = None


def _gemm_setup(k: KernelCall, program: CompiledProgram, ityp: str) -> _Gemm:
    spec = k.spec
    a, b = k.args[0], k.args[1]
    flip = dtype_of(program, a) == "uint8"
    if isinstance(spec, QGemmKernel):
        if spec.batch:
            raise NPUCompileError(f"kernel {k.name}: the cuda target's qgemm takes no batch dims")
        za = spec.a_zero_point - (128 if flip else 0)
        load_a = f"v = (int)a0[{affine([('r', a.strides[0]), ('kk', a.strides[1])], a.offset)}];"
        load_b = f"v = (int)a1[{affine([('kk', b.strides[0]), ('c', b.strides[1])], b.offset)}];"
        vec_a = (affine([("r", a.strides[0])], a.offset)
                 if _rows16(a.strides[1], a.strides[0], a.offset, spec.k) else None)
        vec_b = (affine([("c", b.strides[1])], b.offset)
                 if _rows16(b.strides[0], b.strides[1], b.offset, spec.k) else None)
        return _Gemm(spec.m, spec.n, spec.k, za, spec.b_zero_point, flip, load_a, load_b, False, vec_a, vec_b)
    assert isinstance(spec, QConv2dKernel)
    x, w, out = a, b, k.outs[0]
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    ho, wo = out.shape[2], out.shape[3]
    og = o // spec.groups
    (sh, sw), (ph, pw), (dh, dw) = spec.stride, spec.padding, spec.dilation
    # a row is an output pixel (n, ho, wo), K runs over (channel in the group, kh, kw), a column is an output channel
    # (a group's columns read the group's channels: the B tile's column gives the group)
    at_x = affine([("in_", x.strides[0]), ("ci", x.strides[1]), ("ih", x.strides[2]), ("iw", x.strides[3])],
                  x.offset)
    at_w = affine([("c", w.strides[0]), ("cc", w.strides[1]), ("rr", w.strides[2]), ("ss", w.strides[3])], w.offset)
    load_a = (f"{{ {ityp} in_ = r / {ho * wo}; int p = (int)(r % {ho * wo}); int oh = p / {wo}, ow = p % {wo}; "
              f"int cc = kk / {kh * kw}, rr = (kk / {kw}) % {kh}, ss = kk % {kw}; "
              f"int ih = oh * {sh} - {ph} + rr * {dh}, iw = ow * {sw} - {pw} + ss * {dw}; "
              f"int ci = npu_group * {cg} + cc; "
              f"if (ih >= 0 && ih < {h} && iw >= 0 && iw < {wd}) v = (int)a0[{at_x}]; }}")
    load_b = (f"{{ int cc = kk / {kh * kw}, rr = (kk / {kw}) % {kh}, ss = kk % {kw}; "
              f"v = (int)a1[{at_w}]; }}")
    del n, c, og
    za = spec.x_zero_point - (128 if flip else 0)
    rows_contiguous = x.strides[3] == 1
    kdim = cg * kh * kw
    w_flat = tuple(w.strides) == (kdim, kh * kw, kw, 1)  # (channel, kh, kw) is the memory order along K
    vec_b = affine([("c", kdim)], w.offset) if w_flat and _rows16(1, kdim, w.offset, kdim) else None
    return _Gemm(out.shape[0] * ho * wo, o, kdim, za, 0, flip, load_a, load_b, rows_contiguous, None, vec_b)


def _rows16(k_stride: int, row_stride: int, offset: int, kdim: int) -> bool:
    """Rows contiguous along K, each starting on 16 bytes, K a multiple of 16 (whole 16-byte loads)."""
    return k_stride == 1 and row_stride % 16 == 0 and offset % 16 == 0 and kdim % 16 == 0


def _epilogue(k: KernelCall, program: CompiledProgram, g: _Gemm, kpad: int, ityp: str) -> list[str]:
    """Statements storing output (row r, column c) from the raw MMA sum `s` (unsigned, wrapping)."""
    return [f"unsigned t = s - {g.zb}u * (unsigned)npu_rs[lr] - (unsigned)({g.za}) * (unsigned)npu_cs[lc] "
            f"+ (unsigned)({kpad * g.za * g.zb}LL);", *requant_store(k, program)]


def _fill(byte: int) -> str:
    return f"0x{(byte & 0xFF) * 0x01010101:08x}u"


def _vector_tile(tile: str, rows: int, base: str, first: str, valid: str, kdim: int, fill: str, ptr: str,
                 flip: bool) -> str:
    """Statements loading a tile of `rows` x 32 bytes 16 bytes at a time (`base`: a row's start over `r`/`c`, set by
    `first` from the tile row `e / 2`; `valid`: the row exists), K's tail and missing rows filled with `fill`."""
    xor = "v.x ^= 0x80808080u; v.y ^= 0x80808080u; v.z ^= 0x80808080u; v.w ^= 0x80808080u; " if flip else ""
    return f"""      for (int e = tid; e < {rows * 2}; e += {BLOCK}) {{
        {first}
        const int kk = k0 + (e & 1) * 16;
        uint4 v = make_uint4({fill}, {fill}, {fill}, {fill});
        if ({valid} && kk < {kdim}) {{ v = *(const uint4*)({ptr} + {base} + kk); {xor}}}
        *(uint4*)&{tile}[e / 2][(e & 1) * 16] = v;
      }}
"""


def _load_a(g: _Gemm, bm: int, a_row: str, a_k: str, ityp: str) -> str:
    if g.vec_a is not None:
        return _vector_tile("npu_sa", bm, g.vec_a, f"const {ityp} r = m0 + e / 2;", f"r < {g.rows}", g.kdim,
                            _fill(g.za), "a0", g.flip)
    flip = " ^ 0x80" if g.flip else ""
    return f"""      for (int e = tid; e < {bm * MMA_K}; e += {BLOCK}) {{
        const int lr = {a_row}, lk = {a_k};
        const {ityp} r = m0 + lr;
        const int kk = k0 + lk;
        int v = {g.za}{' + 128' if g.flip else ''};  // the zero point: padding and K's tail add nothing
        if (r < {g.rows} && kk < {g.kdim}) {g.load_a}
        npu_sa[lr][lk] = (unsigned char)(v{flip});
      }}
"""


def _load_b(g: _Gemm, bn: int, og: int) -> str:
    first = f"const int cl = n0l + e / 2; const int c = npu_group * {og} + cl;"
    if g.vec_b is not None:
        return _vector_tile("npu_sb", bn, g.vec_b, first, f"cl < {og}", g.kdim, _fill(g.zb), "a1", False)
    return f"""      for (int e = tid; e < {bn * MMA_K}; e += {BLOCK}) {{
        const int cl = n0l + e / {MMA_K};
        const int c = npu_group * {og} + cl;
        const int kk = k0 + e % {MMA_K};
        int v = {g.zb};
        if (cl < {og} && kk < {g.kdim}) {g.load_b}
        npu_sb[e / {MMA_K}][e % {MMA_K}] = (unsigned char)v;
      }}
"""


def int8_gemm(k: KernelCall, program: CompiledProgram, dev) -> list[tuple[str, Launch]]:
    """qgemm or qconv2d on int8 tensor cores (see the module's docstring)."""
    if not mma_sync_ok(dev):
        raise NPUCompileError(f"kernel {k.name}: the cuda target's {k.kind} runs on int8 tensor cores (mma.sync, "
                              f"sm_80+); {dev.title} has none")
    ityp = _ityp(*k.args, *k.outs)
    g = _gemm_setup(k, program, ityp)
    if int8_conv.applies(k):
        return int8_conv.render(k, program, dev, _signature(k, program, int8_conv.threads(k, dev)), ityp, g.flip,
                                g.za)
    if k.scratch:
        raise NPUCompileError(f"kernel {k.name}: a {k.kind} split along K runs on the staged kernel only")
    stored = int8_conv.tile_plan(k, dev)  # the record's plan where it has one
    plan = Int8Plan(stored.bm, stored.bn, grid_for(g.rows, g.cols, stored.bm, stored.bn, dev))
    bm, bn = plan.bm, plan.bn
    wm, wn = bm // 2, bn // 2  # each warp's outputs
    fm, fn = wm // MMA_M, wn // MMA_N  # its MMA tiles
    kpad = -(-g.kdim // MMA_K) * MMA_K
    groups = k.spec.groups if isinstance(k.spec, QConv2dKernel) else 1
    og = g.cols // groups  # a group's output channels: a tile's columns lie in one group
    per_group = -(-og // bn)
    tiles_n = groups * per_group
    tiles = -(-g.rows // bm) * tiles_n
    row_pad = MMA_K + 16  # bytes a shared row: 16 more than a K step, so the fragments' rows fall in other banks
    epi = _epilogue(k, program, g, kpad, ityp)
    # neighbouring threads load neighbouring A elements along the operand's contiguous dim: K for a linear's rows,
    # the output pixels for a conv over NCHW (a pixel's window is spread over channel planes)
    if g.rows_contiguous:
        a_row, a_k = f"e % {bm}", f"e / {bm}"
    else:
        a_row, a_k = f"e / {MMA_K}", f"e % {MMA_K}"
    load_tiles = _load_a(g, bm, a_row, a_k, ityp) + _load_b(g, bn, og)
    src = f"""{PRELUDE}{INTEGER_HELPERS}
{_signature(k, program, BLOCK)} {{
{WAIT}
  __shared__ __align__(16) unsigned char npu_sa[{bm}][{row_pad}];
  __shared__ __align__(16) unsigned char npu_sb[{bn}][{row_pad}];
  __shared__ int npu_rs[{bm}];  // the A tile's row sums over K (raw codes), each row summed by one thread
  __shared__ int npu_cs[{bn}];  // the B tile's column sums
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  const int wm0 = (warp >> 1) * {wm}, wn0 = (warp & 1) * {wn};
  for ({ityp} tile = blockIdx.x; tile < {tiles}; tile += gridDim.x) {{
    const {ityp} m0 = (tile / {tiles_n}) * {bm};
    const int tn = (int)(tile % {tiles_n});
    const int npu_group = tn / {per_group};
    const int n0l = (tn % {per_group}) * {bn};  // the tile's first column in its group
    const int n0 = npu_group * {og} + n0l;
    int acc[{fm}][{fn}][4];
    #pragma unroll
    for (int i = 0; i < {fm}; i++)
      #pragma unroll
      for (int j = 0; j < {fn}; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0;
    for (int k0 = 0; k0 < {kpad}; k0 += {MMA_K}) {{
      __syncthreads();
      if (k0 == 0)
        for (int i = tid; i < {bm + bn}; i += {BLOCK}) {{ if (i < {bm}) npu_rs[i] = 0; else npu_cs[i - {bm}] = 0; }}
{load_tiles}
      __syncthreads();
      for (int i = tid; i < {bm + bn}; i += {BLOCK}) {{
        const unsigned* row = (const unsigned*)(i < {bm} ? npu_sa[i] : npu_sb[i - {bm}]);
        int s = 0;
        #pragma unroll
        for (int w = 0; w < {MMA_K // 4}; w++) s += npu_bytesum(row[w]);
        if (i < {bm}) npu_rs[i] += s; else npu_cs[i - {bm}] += s;
      }}
      #pragma unroll
      for (int i = 0; i < {fm}; i++) {{
        unsigned af[4];
        const int ar = wm0 + i * {MMA_M} + gq;
        af[0] = *(const unsigned*)&npu_sa[ar][tq * 4];
        af[1] = *(const unsigned*)&npu_sa[ar + 8][tq * 4];
        af[2] = *(const unsigned*)&npu_sa[ar][16 + tq * 4];
        af[3] = *(const unsigned*)&npu_sa[ar + 8][16 + tq * 4];
        #pragma unroll
        for (int j = 0; j < {fn}; j++) {{
          unsigned bf[2];
          const int bc = wn0 + j * {MMA_N} + gq;
          bf[0] = *(const unsigned*)&npu_sb[bc][tq * 4];
          bf[1] = *(const unsigned*)&npu_sb[bc][16 + tq * 4];
          npu_mma_s8(acc[i][j], af, bf);
        }}
      }}
    }}
    __syncthreads();
    #pragma unroll
    for (int i = 0; i < {fm}; i++)
      #pragma unroll
      for (int j = 0; j < {fn}; j++)
        #pragma unroll
        for (int q = 0; q < 4; q++) {{
          const int lr = wm0 + i * {MMA_M} + gq + (q >> 1) * 8;
          const int lc = wn0 + j * {MMA_N} + tq * 2 + (q & 1);
          const {ityp} r = m0 + lr;
          const int c = n0 + lc;
          if (r < {g.rows} && n0l + lc < {og}) {{
            const unsigned s = (unsigned)acc[i][j][q];
            {(chr(10) + '            ').join(epi)}
          }}
        }}
  }}
}}
"""
    return [(src, Launch((plan.grid, 1, 1), BLOCK, ptrs_of(k)))]


def qadd(k: KernelCall, program: CompiledProgram) -> tuple[str, Launch]:
    """TFLite's int8 ADD in the reference's 64-bit arithmetic, one output element a thread."""
    spec: QAddKernel = k.spec
    a, b, out = k.args[0], k.args[1], k.outs[0]
    ityp = _ityp(a, b, out)
    total = out.numel
    at = {name: affine([(f"o{d}", s) for d, s in enumerate(r.strides)], r.offset)
          for name, r in (("a", a), ("b", b), ("out", out))}
    lines = [PRELUDE + INTEGER_HELPERS, _signature(k, program, ELEMENTWISE_BLOCK) + " {", WAIT,
             f"  for ({ityp} i = ({ityp})blockIdx.x * blockDim.x + threadIdx.x; i < {total}; "
             f"i += ({ityp})gridDim.x * blockDim.x) {{"]
    lines += ["    " + ln for ln in _decompose("i", tuple(out.shape), ityp)]
    value = qadd_call(spec, f"(int)a0[{at['a']}]", f"(int)a1[{at['b']}]", spec.a_zero_point)
    lines += [f"    out0[{at['out']}] = ({storage(dtype_of(program, out))}){value};", "  }", "}"]
    grid = min(-(-total // ELEMENTWISE_BLOCK), CUDA.max_grid) if total else 0
    return "\n".join(lines) + "\n", Launch((grid, 1, 1), ELEMENTWISE_BLOCK, ptrs_of(k))


def _decompose(var: str, shape: tuple[int, ...], ityp: str) -> list[str]:
    from ..clike import decompose

    return decompose(CUDA, var, shape, "o", ityp, "")


ROWS_AT_ONCE = 8  # activation rows a warp keeps sums for while it reads a weight row once


def _wgemm_vector(spec: WGemmKernel, q: TensorRef) -> bool:
    """16-byte loads of the codes: rows contiguous, every row and the view's start on 16 bytes."""
    row_bytes = spec.k if spec.bits == 8 else spec.k // 2
    return q.strides[1] == 1 and q.strides[0] % 16 == 0 and q.offset % 16 == 0 and row_bytes % 16 == 0


def wgemm(k: KernelCall, program: CompiledProgram, dev) -> tuple[str, Launch]:
    """The GEMV of wgemv.py where its rows are 16-byte aligned, else a warp per output column reading a code at a
    time (see the module's docstring)."""
    if wgemv_applies(k, program, dev):
        return wgemv(k, program, dev, render_epilogue)
    spec: WGemmKernel = k.spec
    if spec.batch:
        raise NPUCompileError(f"kernel {k.name}: the cuda target's wgemm takes no batch dims")
    if spec.prologue is not None or spec.acc_groups > 1:
        raise NPUCompileError(f"kernel {k.name}: the cuda target computes a wgemm's prologue or column groups only in "
                              "its GEMV (16-byte aligned rows of codes, K a multiple of 16 codes; int4 groups of 32)")
    a, q, s, out = k.args[0], k.args[1], k.args[2], k.outs[0]
    ad, od = dtype_of(program, a), dtype_of(program, out)
    ityp = _ityp(*k.args, out)
    rows = min(spec.m, ROWS_AT_ONCE)
    at_a = affine([("(r0 + rr)", a.strides[0]), ("kk", a.strides[1])], a.offset)
    if spec.bits == 8:
        s_at = affine([("n", s.strides[0])], s.offset)
        decode = f"__fmul_rn((float)(signed char)code, a2[{s_at}])"
        per_byte = 1
    else:
        z = k.args[3]
        grp = f"(kk / {spec.group})"
        s_at = affine([("n", s.strides[0]), (grp, s.strides[1])], s.offset)
        z_at = affine([("n", z.strides[0]), (grp, z.strides[1])], z.offset)
        decode = f"__fmul_rn(__fsub_rn((float)code, (float)a3[{z_at}]), a2[{s_at}])"
        per_byte = 2
    fma = [f"        if (rr < {rows} && r0 + rr < {spec.m}) p[rr] += {load_expr(ad, f'a0[{at_a}]')} * w;"]

    def one_code(byte: str, nib: str) -> list[str]:
        code = byte if spec.bits == 8 else f"(({byte} >> {nib}) & 15)"
        return [f"      {{ const unsigned code = {code};", f"        const float w = {decode};",
                "        #pragma unroll", f"        for (int rr = 0; rr < {rows}; rr++)", *fma, "      }"]

    if _wgemm_vector(spec, q):
        chunk = 16 * per_byte  # codes a 16-byte load holds
        row = affine([("n", q.strides[0])], q.offset)
        body = [f"    for (int k0 = lane * {chunk}; k0 < {spec.k}; k0 += {32 * chunk}) {{",
                f"      const uint4 v = *(const uint4*)(a1 + {row} + k0 / {per_byte});",
                "      const unsigned wv[4] = {v.x, v.y, v.z, v.w};",
                "      #pragma unroll",
                f"      for (int e = 0; e < {chunk}; e++) {{",
                "        const int kk = k0 + e;",
                f"        const unsigned byte = (wv[e / {4 * per_byte}] >> (8 * ((e / {per_byte}) & 3))) & 255u;",
                *[ln.replace("      {", "        {", 1) for ln in one_code("byte", "(4 * (e & 1))")],
                "      }", "    }"]
    else:
        q_at = affine([("n", q.strides[0]), (f"(kk / {per_byte})", q.strides[1])], q.offset)
        body = [f"    for (int kk = lane; kk < {spec.k}; kk += 32) {{",
                f"      const unsigned byte = (unsigned char)a1[{q_at}];",
                *one_code("byte", "(4 * (kk & 1))"), "    }"]
    out_at = affine([("(r0 + rr)", out.strides[0]), ("n", out.strides[1])], out.offset)
    bias = ""
    if spec.bias:
        i = spec.first_epilogue_arg - 1
        b = k.args[i]
        b_at = affine([("n", b.strides[0])], b.offset)
        bias = f"v = __fadd_rn(v, {load_expr(od, f'a{i}[{b_at}]')});"
    value, value_dtype, epilogue = "v", "float32", []
    if spec.epilogue is not None:
        epilogue = [f"      const {ityp} o0 = r0 + rr, o1 = n;", f"      const float accv = {round_expr('v', od)};"]
        body, value = render_epilogue(spec.epilogue, k, program, [f"a{i}" for i in range(len(k.args))], "accv",
                                      ityp, "      ")
        epilogue += body
        value_dtype = spec.epilogue.dtype
    src = "\n".join([PRELUDE, _signature(k, program, 32 * WGEMM_WARPS) + " {", WAIT,
                     "  const int lane = threadIdx.x & 31;",
                     f"  for ({ityp} n = ({ityp})blockIdx.x * {WGEMM_WARPS} + (threadIdx.x >> 5); n < {spec.n}; "
                     f"n += ({ityp})gridDim.x * {WGEMM_WARPS}) {{",
                     f"  for (int r0 = 0; r0 < {spec.m}; r0 += {rows}) {{",
                     f"    float p[{rows}];",
                     f"    for (int rr = 0; rr < {rows}; rr++) p[rr] = 0.0f;",
                     *body,
                     f"    for (int rr = 0; rr < {rows} && r0 + rr < {spec.m}; rr++) {{",
                     "      float v = p[rr];",
                     "      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);",
                     f"      {bias}", *epilogue,
                     f"      if (lane == 0) out0[{out_at}] = {store_expr(od, value, value_dtype)};",
                     "    }", "  }", "  }", "}"])
    grid = min(-(-spec.n // WGEMM_WARPS), CUDA.max_grid) if spec.n and spec.m else 0
    return src + "\n", Launch((grid, 1, 1), 32 * WGEMM_WARPS, ptrs_of(k))


INTEGER_KERNELS = frozenset({"qgemm", "qconv2d", "qadd", "wgemm"})


def render_integer(k: KernelCall, program: CompiledProgram, dev) -> list[tuple[str, Launch]]:
    """The CUDA C launches of one integer or weight-only kernel (a K split's GEMM: two)."""
    if k.kind in ("qgemm", "qconv2d"):
        return int8_gemm(k, program, dev)
    if k.kind == "qadd":
        return [qadd(k, program)]
    if k.kind == "wgemm":
        return [wgemm(k, program, dev)]
    raise NPUCompileError(f"kernel {k.name}: the cuda target has no '{k.kind}' kernel")


__all__ = ["INTEGER_KERNELS", "Int8Plan", "plan_int8", "render_integer"]
