"""The weight-only GEMV (`wgemm` with its codes, and its activations where it reads them, in 16-byte aligned rows
along K): a decode step's projections, which stream int8 or packed int4 weights once at close to the copy bandwidth,
with the folds the bf16 GEMV has (gemv.py): the RMSNorm before the projection as a prologue, SiLU(gate) * up over
column groups, the residual add as the epilogue.

Layout. A block of WARPS warps, one wave of blocks (at most WAVE_BLOCKS_PER_SM an SM), each walking tiles of output
columns in a grid-stride loop, the tiles shared out evenly (as few blocks as take the same number of rounds). A warp
takes `cpw` output columns of a tile and with them their weight rows: one a column, or with G column groups
(`acc_groups`) the G rows of a column (gate and up), so a warp finishes its columns itself. A column gets `splits`
warps where there are too few columns to keep the device's warps loading (splits_for: the down projection), their
sums meeting in shared memory. The lanes stride over K in 16-byte chunks of codes (16 int8 or 32 int4), a lane's
whole share of its rows loaded before any is used (its `batch` of chunks a row), and the first tile's share loaded
before the wait for the kernel before (programmatic dependent launch: no kernel writes a weight), so the weight
stream starts while that kernel and this one's prologue run; where a lane's share is one batch, each chunk's
registers take the next tile's chunk as soon as its products are done, so those loads are in flight during the rest
of this tile's decoding (about as long as the loads themselves at int8: several operations a code), its sums and its
epilogue. (Loading the whole next tile into a second set of registers before decoding this one needed 80-128
registers and spilled in the prologue's kernels.)

Decoding in registers, without conversion instructions (a quarter of the FMA rate, which at these bandwidths would
bind): an int8 code goes into the mantissa of 2^23 (`__byte_perm` of the byte, its sign flipped) and 2^23 + 128 is
subtracted, which is exact; an int4 code, shifted into a byte's bits 3-6, becomes 1 + q / 16 (mantissa bits 19-22
under 1.0's exponent, one `__byte_perm`), so a chunk's sum d = sum a (1 + q / 16) needs no subtraction: sum a q =
16 d - 16 sum a. int8 sums a q and applies the channel's scale once at the end; int4 sums a chunk's d and a (a chunk
lies in one group when the group is a multiple of 32) and adds scale * (16 d - (16 + zero) sum a), so a group's scale
and zero point are read once a chunk, loaded with the chunk's codes (a tile waits for memory once). PTX of the int4
gate/up GEMV: 1 prmt, 1 fma and about 2 other operations a code. The products are
f32 in another order than the reference's (the scale after the sum), within float32 summation-order error
(docs/tolerances.md). Then the bias, the product rounded to the output dtype where an epilogue reads it (`Acc`, as
the unfused graph stores it), the epilogue, the store.

A prologue (the norm) is computed by every block into shared memory first, as the bf16 GEMV's (its renderer), and
the warps read the rows from there.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...dtypes import itemsize
from ...kernels import WGemmKernel
from ...program import BufferSpec, CompiledProgram, KernelCall, TensorRef
from ..clike import KernelText, Launch, affine, max_extent, ptrs_of
from .common import CUDA, PRELUDE, WAIT, WEIGHTS_BEGIN, WEIGHTS_END, load_expr, round_expr, store_expr, unpack16
from .gemv import GEMV_MAX_M, _prologue_prefetch, _prologue_rows, prologue_bytes, splits_for

WARPS = 8  # a block's warps
WAVE_BLOCKS_PER_SM = 4  # blocks an SM (the launch bounds: 64 registers a thread), as the bf16 GEMV's wave
COLS = 2  # output columns a warp (4 where a row is less than a warp of chunks: more loads in flight)
MAX_LOADS = 8  # 16-byte weight loads a lane holds at once (its rows times its batch): 32 registers
ROWS = 4  # activation rows a warp keeps sums for (a longer operand is walked ROWS rows at a time)
_FLOAT = ("bfloat16", "float16", "float32")
PREFETCH_LINE = 128  # bytes an L2 prefetch brings (a cache line)
HELPERS = """__device__ __forceinline__ void npu_prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
}
"""


def _aligned(ref: TensorRef, elems: int) -> bool:
    """Rows of `ref` contiguous along K, each and the view's start a multiple of `elems` elements."""
    return ref.strides[-1] == 1 and ref.offset % elems == 0 and (ref.shape[0] <= 1 or ref.strides[0] % elems == 0)


def _per(bits: int) -> int:
    return 16 if bits == 8 else 32  # codes a 16-byte load holds


def wgemv_shape_fits(m: int, k: int, bits: int, group: int, a_dtype: str, dev, prologue: bool) -> bool:
    """Whether this kernel runs a wgemm of this shape: a float activation dtype, K in whole 16-byte chunks of codes,
    (int4) groups of whole 32-code chunks, and a prologue's rows (at most GEMV_MAX_M) in shared memory."""
    per = _per(bits)
    if a_dtype not in _FLOAT or k % per or (bits == 4 and group % per) or m < 1:
        return False
    return not prologue or (m <= GEMV_MAX_M and m * k * itemsize(a_dtype) <= prologue_bytes(dev))


def wgemv_fits(k: KernelCall, buffers: Sequence[BufferSpec], dev) -> bool:
    """This kernel runs the call: no batch dims, the shape (wgemv_shape_fits), codes (and activations read from
    memory) in 16-byte aligned rows."""
    spec: WGemmKernel = k.spec
    od = buffers[k.outs[0].buffer].dtype
    pro = spec.prologue is not None
    if spec.batch or not wgemv_shape_fits(spec.m, spec.k, spec.bits, spec.group, od, dev, pro):
        return False
    if not _aligned(k.args[spec.w_arg], 16):
        return False
    return pro or (buffers[k.args[0].buffer].dtype == od and _aligned(k.args[0], 16 // itemsize(od)))


def wgemv_applies(k: KernelCall, program: CompiledProgram, dev) -> bool:
    return wgemv_fits(k, program.buffers, dev)


def _code(bits: int, word: str, e: int) -> str:
    """Code e (of the 4 int8 or 8 int4 codes of the 32-bit `word`) as an exact float, through the mantissa of 2^23
    (see the module's docstring)."""
    if bits == 8:
        return f"(__uint_as_float(__byte_perm({word} ^ 0x80808080u, 0x4B000000u, 0x754{e})) - 8388736.0f)"
    # int4: 1 + code / 16 (the code in mantissa bits 19-22 under 1.0's exponent), no subtraction: the sum of a times
    # it is sum a + (sum a q) / 16, and sum a is summed anyway (see _products)
    nib = (f"((({word} << 3) & 0x78787878u) | 0x80808080u)" if e % 2 == 0
           else f"((({word} >> 1) & 0x78787878u) | 0x80808080u)")
    return f"__uint_as_float(__byte_perm({nib}, 0x3F000000u, 0x7{e // 2}54))"


class _Plan:
    """The GEMV's shape for one call on one device (see the module's docstring)."""

    def _tiles(self, cpw: int, splits: int) -> int:
        return -(-self.out_n // ((WARPS // splits) * cpw))

    def __init__(self, spec: WGemmKernel, dev) -> None:
        self.per = _per(spec.bits)
        self.chunks = spec.k // self.per
        self.groups = spec.acc_groups
        self.out_n = spec.out_n
        cpw = 1 if self.groups > 1 else (COLS if self.chunks >= 32 else 2 * COLS)
        splits = min(splits_for(-(-self.out_n // cpw), self.chunks, dev), WARPS)
        # fewer columns a warp, then more warps a column, where the tiles would not give every SM a block (a short
        # projection: Qwen2.5-1.5B's o projection at int4 is 96 tiles of 16 columns)
        while cpw > 1 and self._tiles(cpw, splits) < dev.multiprocessors:
            cpw //= 2
        while (splits < WARPS and self._tiles(cpw, splits) < dev.multiprocessors
               and self.chunks >= 2 * 32 * splits):
            splits *= 2
        self.cpw, self.splits = cpw, splits
        self.rows = cpw * self.groups  # weight rows a warp
        self.col_groups = WARPS // splits  # warps' column sets a block
        self.tile = self.col_groups * cpw  # output columns a tile
        self.tiles = self._tiles(cpw, splits)
        share = -(-self.chunks // (32 * self.splits))  # chunks a lane of a row
        self.batch = max(1, min(share, MAX_LOADS // self.rows))
        self.whole_row = self.batch >= share
        self.rm = min(spec.m, ROWS)  # activation rows at once
        per_sm = max(1, min(WAVE_BLOCKS_PER_SM, dev.max_threads_per_multiprocessor // (32 * WARPS)))
        self.per_sm = per_sm
        grid = min(self.tiles, dev.multiprocessors * per_sm, CUDA.max_grid)
        self.grid = -(-self.tiles // -(-self.tiles // grid)) if self.tiles and spec.m else 0
        # the next tile's loads issued early: one batch a lane's whole share, one pass over the activation rows
        self.ahead = self.whole_row and spec.m <= self.rm and self.grid < self.tiles


def _weight_rows(spec: WGemmKernel, q: TensorRef, p: _Plan, ityp: str, base: str, name: str = "wp") -> list[str]:
    """`wp[j]` (or `name`): weight row j of the warp (column `base` + j / G, group j % G) as uint4s; columns past the
    end read the last column's row (their sums are dropped)."""
    row = affine([(f"((long long)(j % {p.groups}) * {p.out_n} + min({base} + j / {p.groups}, "
                   f"(long long){p.out_n - 1}))", q.strides[0])], q.offset)
    return [f"    const uint4* {name}[{p.rows}];", "    #pragma unroll",
            f"    for (int j = 0; j < {p.rows}; j++) {name}[j] = (const uint4*)(a{spec.w_arg} + {row});"]


def _load_batch(spec: WGemmKernel, k: KernelCall, p: _Plan, v0: str, indent: str) -> list[str]:
    """The lane's batch of chunks of every row of the warp (columns from `n0`) into w[j][b], and (int4) each chunk's
    group's scale and zero point into sc[j][b], zp[j][b]: issued with the codes, so that a tile waits for memory
    once."""
    return [f"{indent}#pragma unroll", f"{indent}for (int j = 0; j < {p.rows}; j++)",
            f"{indent}  #pragma unroll", f"{indent}  for (int b = 0; b < {p.batch}; b++) {{",
            f"{indent}    const int ch = {v0} + b * {32 * p.splits};",
            *_load_chunk(spec, k, p, f"{indent}    ", "wp", "n0"), f"{indent}  }}"]


def _load_chunk(spec: WGemmKernel, k: KernelCall, p: _Plan, indent: str, ptrs: str, base: str) -> list[str]:
    """Chunk `ch` of row j (through the row pointers `ptrs`, columns from `base`) into w[j][b] (int4: its scale and
    zero point into sc[j][b], zp[j][b]); zeros past the row's end."""
    lines = [f"{indent}w[j][b] = ch < {p.chunks} ? __ldcs({ptrs}[j] + ch) : make_uint4(0u, 0u, 0u, 0u);"]
    if spec.bits == 4:
        w0 = spec.w_arg
        s, z = k.args[w0 + 1], k.args[w0 + 2]
        g = f"(ch * {p.per} / {spec.group})"
        row = f"((long long)(j % {p.groups}) * {p.out_n} + min({base} + j / {p.groups}, (long long){p.out_n - 1}))"
        lines += [f"{indent}sc[j][b] = ch < {p.chunks} ? "
                  f"a{w0 + 1}[{affine([(row, s.strides[0]), (g, s.strides[1])], s.offset)}] : 0.0f;",
                  f"{indent}zp[j][b] = ch < {p.chunks} ? "
                  f"(float)a{w0 + 2}[{affine([(row, z.strides[0]), (g, z.strides[1])], z.offset)}] : 0.0f;"]
    return lines


def _registers(spec: WGemmKernel, p: _Plan) -> str:
    """The declarations of what _load_batch loads."""
    return f"  uint4 w[{p.rows}][{p.batch}];" + (f" float sc[{p.rows}][{p.batch}], zp[{p.rows}][{p.batch}];"
                                                 if spec.bits == 4 else "")


def _products(spec: WGemmKernel, k: KernelCall, p: _Plan, ad: str, a_ptr: str, a_row: str) -> list[str]:
    """The lane's batch multiplied into p_[r][j]: each activation chunk, 16 bytes at a time, unpacked once and used by
    every row of the warp. With `ahead`, each chunk's registers take the next tile's chunk as soon as they are used
    (`wpn`, `nn0`, `more`: its rows, columns and whether there is one), so that those loads are in flight during the
    rest of this tile's products, its sums and its epilogue."""
    vec = 16 // itemsize(ad)
    words = ("x", "y", "z", "w")
    codes_per_word = 4 if spec.bits == 8 else 8
    lines = ["      #pragma unroll", f"      for (int b = 0; b < {p.batch}; b++) {{",
             f"        const int ch = v0 + b * {32 * p.splits};", f"        if (ch >= {p.chunks}) break;",
             f"        const int k0 = ch * {p.per};"]
    lines += ["        #pragma unroll", f"        for (int r = 0; r < {p.rm}; r++) {{",
              f"          if (r0 + r >= {spec.m}) break;",
              f"          float d_[{p.rows}] = {{}};" + (" float s_ = 0.0f;" if spec.bits == 4 else "")]
    for jv in range(p.per // vec):
        lines += ["          {", f"            const uint4 x4 = *(const uint4*)({a_ptr} + {a_row} + k0 + {jv * vec});",
                  f"            float x_[{vec}];", *(f"            {ln}" for ln in unpack16(ad, "x4", "x_"))]
        for e in range(vec):
            c = jv * vec + e
            if spec.bits == 4:
                lines.append(f"            s_ += x_[{e}];")
            lines += [f"            d_[{j}] = fmaf(x_[{e}], "
                      f"{_code(spec.bits, f'w[{j}][b].{words[c // codes_per_word]}', c % codes_per_word)}, d_[{j}]);"
                      for j in range(p.rows)]
        lines.append("          }")
    if spec.bits == 8:
        lines.append(f"          for (int j = 0; j < {p.rows}; j++) p_[r][j] += d_[j];")
    else:
        # d = sum a (1 + q / 16): sum a (q - zero) = 16 d - (16 + zero) sum a
        lines.append(f"          for (int j = 0; j < {p.rows}; j++) p_[r][j] = fmaf(sc[j][b], fmaf(16.0f, d_[j], "
                     "-(16.0f + zp[j][b]) * s_), p_[r][j]);")
    lines.append("        }")
    if p.ahead:
        lines += ["        if (more) {", "          #pragma unroll", f"          for (int j = 0; j < {p.rows}; j++) {{",
                  *_load_chunk(spec, k, p, "            ", "wpn", "nn0"), "          }", "        }"]
    return lines + ["      }"]


def _finish(k: KernelCall, program: CompiledProgram, p: _Plan, render_epilogue, ityp: str) -> list[str]:
    """The warp's sums reduced by shuffles into shared memory; then lane r * cpw + c of a column's first warp adds its
    split warps' sums for row r0 + r, column n0 + c, every group: scale (int8), bias, epilogue, store."""
    spec: WGemmKernel = k.spec
    out, od = k.outs[0], program.dtype_of(k.outs[0])
    sync = "__syncthreads();" if p.splits > 1 else "__syncwarp();"
    vals = p.rm * p.rows
    lines = ["    #pragma unroll", f"    for (int r = 0; r < {p.rm}; r++)", "      #pragma unroll",
             f"      for (int j = 0; j < {p.rows}; j++) {{", "        float v = p_[r][j];",
             "        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);",
             f"        if (lane == 0) red_[warp][r * {p.rows} + j] = v;", "      }", f"    {sync}",
             f"    if (part == 0 && lane < {p.rm * p.cpw}) {{",
             f"      const int r = lane / {p.cpw}, c = lane % {p.cpw};",
             f"      const {ityp} o0 = r0 + r, o1 = n0 + c;",
             f"      if (o0 < {spec.m} && o1 < {p.out_n}) {{"]
    accs = []
    for g in range(p.groups):
        lines += [f"        float v{g} = 0.0f;",
                  f"        for (int s = 0; s < {p.splits}; s++) v{g} += red_[warp + s][r * {p.rows} + c * {p.groups}"
                  f" + {g}];"]
        col = f"({g * p.out_n} + o1)"
        if spec.bits == 8:
            s = k.args[spec.w_arg + 1]
            lines.append(f"        v{g} *= a{spec.w_arg + 1}[{affine([(col, s.strides[0])], s.offset)}];")
        if spec.bias:
            i = spec.first_epilogue_arg - 1
            b = k.args[i]
            at = affine([(col, b.strides[0])], b.offset)
            lines.append(f"        v{g} = __fadd_rn(v{g}, {load_expr(od, f'a{i}[{at}]')});")
        if spec.epilogue is not None:
            lines.append(f"        const float acc{g} = {round_expr(f'v{g}', od)};")
            accs.append(f"acc{g}")
    value, value_dtype = "v0", "float32"
    if spec.epilogue is not None:
        names = [f"a{i}" for i in range(len(k.args))]
        body, value = render_epilogue(spec.epilogue, k, program, names, accs if p.groups > 1 else accs[0], ityp,
                                      "        ")
        lines += body
        value_dtype = spec.epilogue.dtype
    at = affine([("o0", out.strides[0]), ("o1", out.strides[1])], out.offset)
    lines += [f"        out0[{at}] = {store_expr(od, value, value_dtype)};", "      }", "    }", f"    {sync}"]
    assert vals <= 32 * WARPS
    return lines


def _prefetch(spec: WGemmKernel, q: TensorRef, p: _Plan) -> list[str]:
    """This warp's share of its first tile's code rows into L2 while the kernels before this one still run (a prefetch
    is a hint), where the first batch loaded before the wait is not all of them."""
    row_bytes = spec.k * spec.bits // 8
    row = affine([(f"((long long)(c % {p.groups}) * {p.out_n} + f0 + c / {p.groups})", q.strides[0])], q.offset)
    return ["  {",
            f"    const long long f0 = ((long long)blockIdx.x * {p.col_groups} + (threadIdx.x >> 5) / {p.splits})"
            f" * {p.cpw};",
            f"    for (int c = 0; c < {p.rows}; c++)",
            f"      if (f0 + c / {p.groups} < {p.out_n})",
            f"        for (int o = ((threadIdx.x >> 5) % {p.splits} * 32 + (threadIdx.x & 31)) * {PREFETCH_LINE}; "
            f"o < {row_bytes}; o += {32 * p.splits * PREFETCH_LINE})",
            f"          npu_prefetch_l2(reinterpret_cast<const char*>(a{spec.w_arg} + {row}) + o);",
            "  }"]


def wgemv(k: KernelCall, program: CompiledProgram, dev, render_epilogue) -> tuple[str, Launch]:
    """The CUDA C of a wgemm that `wgemv_applies` to, sized for the device `dev` (see the module's docstring);
    `render_epilogue`: the target's epilogue renderer (library.render_epilogue)."""
    spec: WGemmKernel = k.spec
    p = _Plan(spec, dev)
    pro = spec.prologue is not None
    od = program.dtype_of(k.outs[0])
    ad = od
    names = [f"a{i}" for i in range(len(k.args))]
    extents = [max_extent(tuple(r.shape), tuple(r.strides), r.offset) for r in (*k.args, k.outs[0])]
    ityp = "long long" if max(extents) >= 2**31 - 1 else "int"
    text = KernelText([], 32 * WARPS)
    prologue = _prologue_rows(k, program, names, ityp, text) if pro else []
    if pro:
        a_ptr, a_row = "xs", f"(r0 + r) * {spec.k}"
    else:
        a = k.args[0]
        a_ptr, a_row = "a0", affine([("(r0 + r)", a.strides[0])], a.offset)
    # the first tile's first batch before the wait (no kernel writes a weight: memory_check.check_read_only)
    preload = spec.m <= p.rm and program.buffers[k.args[spec.w_arg].buffer].kind == "weight"
    pre = [WEIGHTS_BEGIN, _registers(spec, p), "  {",
           f"    const long long n0 = ((long long)blockIdx.x * {p.col_groups} + warp / {p.splits}) * {p.cpw};",
           *_weight_rows(spec, k.args[spec.w_arg], p, ityp, "n0"),
           "    const int v0 = part * 32 + lane;", *_load_batch(spec, k, p, "v0", "    "), "  }", WEIGHTS_END]
    # the next tile's rows, where each chunk's registers take its chunk once used (see _products)
    nxt = [f"    const long long nn0 = ((t + gridDim.x) * {p.col_groups} + warp / {p.splits}) * {p.cpw};",
           f"    const bool more = t + gridDim.x < {p.tiles};",
           *_weight_rows(spec, k.args[spec.w_arg], p, ityp, "nn0", "wpn")] if p.ahead else []
    params = [f"{CUDA.storage(od)}* out0"] + [f"const {CUDA.storage(program.dtype_of(r))}* __restrict__ {n}"
                                              for r, n in zip(k.args, names)]
    shared = [f"  __shared__ {ty} {name}[{count}];" for name, (ty, count) in sorted(text.shared.items())]
    src = [PRELUDE, HELPERS, *sorted(text.helpers),
           f'extern "C" __global__ void __launch_bounds__({32 * WARPS}, {p.per_sm}) npu_kernel({", ".join(params)}) {{',
           *shared,
           "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
           f"  const int part = warp % {p.splits};  // this warp's share of its columns' chunks",
           *([] if preload and p.whole_row else _prefetch(spec, k.args[spec.w_arg], p)),
           *(_prologue_prefetch(k, program) if pro else []),
           *(pre if preload else []),
           WAIT, *([] if preload else [_registers(spec, p)]), *prologue,
           f"  __shared__ float red_[{WARPS}][{p.rm * p.rows}];",
           f"  bool first = {'true' if preload else 'false'};",
           f"  for (long long t = blockIdx.x; t < {p.tiles}; t += gridDim.x) {{",
           f"    const long long n0 = (t * {p.col_groups} + warp / {p.splits}) * {p.cpw};",
           *_weight_rows(spec, k.args[spec.w_arg], p, ityp, "n0"), *nxt,
           f"  for (int r0 = 0; r0 < {spec.m}; r0 += {p.rm}) {{",
           f"    float p_[{p.rm}][{p.rows}] = {{}};",
           f"    for (int v0 = part * 32 + lane; v0 < {p.chunks}; v0 += {32 * p.splits * p.batch}) {{",
           "      if (!first) {", *_load_batch(spec, k, p, "v0", "        "), "      }", "      first = false;",
           *_products(spec, k, p, ad, a_ptr, a_row),
           "    }",
           *(["    first = more;  // the next tile's batch is loaded"] if p.ahead else []),
           *_finish(k, program, p, render_epilogue, ityp),
           "  }", "  }", "}"]
    return "\n".join(src) + "\n", Launch((p.grid, 1, 1), 32 * WARPS, ptrs_of(k), early=preload)


__all__ = ["wgemv", "wgemv_applies", "wgemv_fits", "wgemv_shape_fits"]
