"""The weight-only GEMV (`wgemm` with its codes and activations in 16-byte aligned rows along K): a decode step's
projections, which stream int8 or packed int4 weights once at close to the copy bandwidth.

It follows the bf16 GEMV (gemv.py): a block of WARPS warps, each output column `splits` warps (splits_for: more
where there are too few columns to keep enough loads in flight, as in the down projection), the lanes striding over
K in 16-byte chunks of codes (16 int8 or 32 int4), and one wave of blocks walking column groups in a grid-stride
loop. Each warp takes COLS weight rows at once: their chunks are loaded together (COLS loads in flight a lane before
any is used) and each activation chunk, read with 16-byte loads and unpacked to f32 once, serves all of them. The
codes are decoded in registers: int8 accumulates sum a q and applies the channel's scale once at the end; int4 sums
a chunk's sum a q and sum a (a chunk lies in one group when the group is a multiple of 32) and adds scale * (sum a q -
zero * sum a), so a group's scale and zero point are read once a chunk, not once a code. The warps' sums meet in
shared memory; the first warp of a column adds the bias and stores. The products are f32 in another order than the
reference's (scale applied after the sum), within float32 summation-order error (docs/tolerances.md).
"""

from __future__ import annotations

from ...dtypes import itemsize
from ...kernels import WGemmKernel
from ...program import CompiledProgram, KernelCall, TensorRef
from ..clike import Launch, affine, ptrs_of
from .common import CUDA, PRELUDE, WAIT, load_expr, store_expr, unpack16
from .gemv import WAVE_BLOCKS_PER_SM, splits_for

WARPS = 8  # a block's warps
COLS = 2  # weight rows a warp streams at once (4 where a row is less than a warp of chunks: more loads in flight)
ROWS = 4  # activation rows a warp keeps sums for (a prefill's longer operand is walked ROWS rows at a time)
_FLOAT = ("bfloat16", "float16", "float32")
PREFETCH_LINE = 128  # bytes an L2 prefetch brings (a cache line)
HELPERS = """__device__ __forceinline__ void npu_prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
}
"""


def _aligned(ref: TensorRef, elems: int) -> bool:
    """Rows of `ref` contiguous along K, each and the view's start a multiple of `elems` elements."""
    return ref.strides[-1] == 1 and ref.offset % elems == 0 and (ref.shape[0] <= 1 or ref.strides[0] % elems == 0)


def wgemv_applies(k: KernelCall, program: CompiledProgram) -> bool:
    """This kernel runs the call: no batch dims, codes and activations in 16-byte aligned rows, a float activation
    dtype, and (int4) groups of whole 32-code chunks."""
    spec: WGemmKernel = k.spec
    a, q = k.args[0], k.args[1]
    ad = program.dtype_of(a)
    per = 16 if spec.bits == 8 else 32  # codes a 16-byte load holds
    if spec.batch or ad not in _FLOAT or spec.k % per or (spec.bits == 4 and spec.group % per):
        return False
    return _aligned(q, 16) and _aligned(a, 16 // itemsize(ad))


def _code(bits: int, word: str, e: int) -> str:
    """Code e of a 16-byte chunk (the uint4's words in w_[c][0..3]) as a float."""
    if bits == 8:
        return f"(float)(signed char)({word}[{e // 4}] >> {8 * (e % 4)})"
    return f"(float)(({word}[{e // 8}] >> {4 * (e % 8)}) & 15u)"


def _chunk(spec: WGemmKernel, ad: str, a: TensorRef, rows: int, cols: int) -> list[str]:
    """One lane's chunk `ch` of K for COLS columns and `rows` rows: the weight loads first, then each row's
    activations, unpacked a 16-byte load at a time, multiplied into every column's sum."""
    per = 16 if spec.bits == 8 else 32
    vec = 16 // itemsize(ad)
    lines = [f"      const int k0 = ch * {per};",
             f"      unsigned w_[{cols}][4];",
             "      #pragma unroll",
             f"      for (int c = 0; c < {cols}; c++) {{",
             f"        const uint4 v = n0 + c < {spec.n} ? __ldg(wrow[c] + ch) : make_uint4(0u, 0u, 0u, 0u);",
             "        w_[c][0] = v.x; w_[c][1] = v.y; w_[c][2] = v.z; w_[c][3] = v.w;", "      }",
             "      #pragma unroll", f"      for (int r = 0; r < {rows}; r++) {{",
             f"        if (r0 + r >= {spec.m}) break;",
             f"        float d_[{cols}] = {{}};" + (" float s_ = 0.0f;" if spec.bits == 4 else "")]
    at = affine([("(r0 + r)", a.strides[0]), ("k0", 1)], a.offset)
    for j in range(per // vec):
        lines += ["        {", f"          const uint4 x4 = *(const uint4*)(a0 + {at} + {j * vec});",
                  f"          float x_[{vec}];", *(f"          {s}" for s in unpack16(ad, "x4", "x_"))]
        for e in range(vec):
            code = e + j * vec
            lines.append(f"          s_ += x_[{e}];" if spec.bits == 4 else "")
            lines += [f"          d_[{c}] = fmaf(x_[{e}], {_code(spec.bits, f'w_[{c}]', code)}, d_[{c}]);"
                      for c in range(cols)]
        lines.append("        }")
    if spec.bits == 8:
        lines += [f"        #pragma unroll\n        for (int c = 0; c < {cols}; c++) p[r][c] += d_[c];"]
    else:
        s, z = k_scale_zero(spec)
        lines += ["        #pragma unroll", f"        for (int c = 0; c < {cols}; c++) {{",
                  f"          if (n0 + c >= {spec.n}) break;",
                  f"          p[r][c] = fmaf({s}, d_[c] - {z} * s_, p[r][c]);", "        }"]
    lines += ["      }"]
    return [ln for ln in lines if ln]


def k_scale_zero(spec: WGemmKernel) -> tuple[str, str]:
    """The (scale, zero point) of column n0 + c's group at k0 (int4), read through the pointers set per column."""
    return f"a2[srow[c] + k0 / {spec.group}]", f"(float)a3[zrow[c] + k0 / {spec.group}]"


def _column_pointers(spec: WGemmKernel, q: TensorRef, k: KernelCall, cols: int) -> list[str]:
    """Per column c of the warp: its code row as uint4s, and (int4) where its scales and zero points start."""
    row = affine([("(n0 + c)", q.strides[0])], q.offset)
    lines = [f"    const uint4* wrow[{cols}];"]
    body = [f"      wrow[c] = (const uint4*)(a1 + (n0 + c < {spec.n} ? {row} : {q.offset}));"]
    if spec.bits == 4:
        s, z = k.args[2], k.args[3]
        lines.append(f"    long long srow[{cols}], zrow[{cols}];")
        body += [f"      srow[c] = {affine([('(n0 + c)', s.strides[0])], s.offset)};",
                 f"      zrow[c] = {affine([('(n0 + c)', z.strides[0])], z.offset)};"]
    return lines + ["    #pragma unroll", f"    for (int c = 0; c < {cols}; c++) {{", *body, "    }"]


def _finish(k: KernelCall, program: CompiledProgram, rows: int, splits: int, cols: int) -> list[str]:
    """The warps' sums into shared memory, then the first warp of each column adds them up (lane i: row i / COLS,
    column i % COLS), applies the int8 scale and the bias, and stores."""
    spec: WGemmKernel = k.spec
    out, od = k.outs[0], program.dtype_of(k.outs[0])
    vals = rows * cols
    lines = ["    #pragma unroll", f"    for (int r = 0; r < {rows}; r++)", "      #pragma unroll",
             f"      for (int c = 0; c < {cols}; c++) {{", "        float v = p[r][c];",
             "        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);",
             f"        if (lane == 0) red_[warp][r * {cols} + c] = v;", "      }", "    __syncthreads();",
             f"    if (part == 0 && lane < {vals}) {{",
             f"      const int r = lane / {cols}, c = lane % {cols};", "      float v = 0.0f;",
             f"      for (int s = 0; s < {splits}; s++) v += red_[warp + s][lane];",
             f"      if (r0 + r < {spec.m} && n0 + c < {spec.n}) {{"]
    if spec.bits == 8:
        s = k.args[2]
        lines.append(f"        v *= a2[{affine([('(n0 + c)', s.strides[0])], s.offset)}];")
    if spec.bias:
        b = k.args[-1]
        at_b = affine([("(n0 + c)", b.strides[0])], b.offset)
        lines.append(f"        v = __fadd_rn(v, {load_expr(od, f'a{len(k.args) - 1}[{at_b}]')});")
    at = affine([("(r0 + r)", out.strides[0]), ("(n0 + c)", out.strides[1])], out.offset)
    lines += [f"        out0[{at}] = {store_expr(od, 'v', 'float32')};", "      }", "    }", "    __syncthreads();"]
    return lines


def _prefetch(spec: WGemmKernel, q: TensorRef, cols: int, groups: int, splits: int) -> list[str]:
    """This warp's share of its first column group's code rows into L2 while the kernels before this one still run
    (no kernel writes a weight, and a prefetch is a hint): decode alternates these weight streams with short
    latency-bound kernels (norms, RoPE, attention), as the bf16 GEMV does (gemv.py)."""
    row_bytes = spec.k * spec.bits // 8
    row = affine([("(f0 + c)", q.strides[0])], q.offset)
    return ["  {",
            f"    const long long f0 = ((long long)blockIdx.x * {groups} + (threadIdx.x >> 5) / {splits}) * {cols};",
            f"    for (int c = 0; c < {cols}; c++)",
            f"      if (f0 + c < {spec.n})",
            f"        for (int o = ((threadIdx.x >> 5) % {splits} * 32 + (threadIdx.x & 31)) * {PREFETCH_LINE}; "
            f"o < {row_bytes}; o += {32 * splits * PREFETCH_LINE})",
            f"          npu_prefetch_l2(reinterpret_cast<const char*>(a1 + {row}) + o);",
            "  }"]


def wgemv(k: KernelCall, program: CompiledProgram, dev, signature: str) -> tuple[str, Launch]:
    """The CUDA C of a wgemm that `wgemv_applies` to, sized for the device `dev` (see the module's docstring);
    `signature` is the kernel's declaration for a block of 32 * WARPS threads."""
    spec: WGemmKernel = k.spec
    a = k.args[0]
    per = 16 if spec.bits == 8 else 32
    chunks = spec.k // per
    cols = COLS if chunks >= 32 else 2 * COLS
    splits = min(splits_for(-(-spec.n // cols), chunks, dev), WARPS)
    groups = WARPS // splits  # column groups of COLS a block
    rows = min(spec.m, ROWS)
    tiles = -(-spec.n // (cols * groups))
    blocks = max(1, min(WAVE_BLOCKS_PER_SM, dev.max_threads_per_multiprocessor // (32 * WARPS)))
    grid = min(tiles, dev.multiprocessors * blocks, CUDA.max_grid) if spec.n and spec.m else 0
    src = [PRELUDE, HELPERS, signature + " {", *_prefetch(spec, k.args[1], cols, groups, splits), WAIT,
           f"  __shared__ float red_[{WARPS}][{rows * cols}];",
           "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
           f"  const int part = warp % {splits};  // this warp's share of the column's chunks",
           f"  for (long long t = blockIdx.x; t < {tiles}; t += gridDim.x) {{",
           f"    const long long n0 = (t * {groups} + warp / {splits}) * {cols};",
           *_column_pointers(spec, k.args[1], k, cols),
           f"  for (int r0 = 0; r0 < {spec.m}; r0 += {rows}) {{",
           f"    float p[{rows}][{cols}] = {{}};",
           f"    for (int ch = part * 32 + lane; ch < {chunks}; ch += {32 * splits}) {{",
           *_chunk(spec, program.dtype_of(a), a, rows, cols),
           "    }",
           *_finish(k, program, rows, splits, cols),
           "  }", "  }", "}"]
    return "\n".join(src) + "\n", Launch((grid, 1, 1), 32 * WARPS, ptrs_of(k))


__all__ = ["wgemv", "wgemv_applies"]
