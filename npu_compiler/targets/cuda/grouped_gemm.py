"""A GEMM whose epilogue combines two column groups of its product (`GemmKernel.acc_groups` 2: SiLU(gate) * up over
a gate/up projection, GeGLU and the like), on Hopper's tensor cores, for the many rows of a prefill.

cuBLAS has no such epilogue: without this kernel the product's 2 H columns go to memory and an elementwise kernel
reads them back (Qwen2.5-1.5B's prefill: 73 MB written and read again, and a launch, every layer). Here each block
computes a 128-row tile of both groups' columns j .. j + 127 at once and writes the epilogue's 128 columns. A block
is one SM's worth (384 threads), walking the tiles (row tiles fastest, so that the weight slices of the tiles in
flight stay in L2 while every row tile reads them):

- one producer thread copies each K step's tiles into shared memory with the tensor memory accelerator
  (`cp.async.bulk.tensor`: the operand a, 128 rows, and the two 128-row slices of the weight, one a group) in the
  128-byte swizzle the warpgroup MMA reads, completing on an mbarrier; STAGES steps in flight. The tensor maps are
  made by the runtime when it resolves the launch's pointers (`Launch.tensor_maps`) and handed over in global memory.
- two consumer warpgroups (64 rows each) multiply with `wgmma` m64n256k16 (the 256 columns: group 0's 128, then
  group 1's) into fp32 accumulators, hand each stage back through a second mbarrier once their products that read it
  are done, and at a tile's end store both groups' products rounded to the output dtype (`Acc(g)`, as the unfused
  graph stores them) into a staging tile in shared memory, then go on with the next tile at once;
- three epilogue warps evaluate the record's expression (`render_epilogue`) over the staged tile, 8 columns a
  thread, and store the output 16 bytes at a time, while the consumers compute the next tile. Their exponentials and
  divisions go through the special-function unit (`FAST_CUDA`): with the correctly rounded forms these warps were
  the bottleneck.

Measured on the H100 (one-off scripts at Qwen2.5-1.5B's prefill shapes, M = 2048, K = 1536, H = 8960, bf16, in one
process against cuBLAS's gate/up GEMM alone at 170-200 us, which the SiLU-times-up kernel then follows): the products
alone 154-167 us; with the epilogue run by the consumers themselves 198-214 us (the warpgroups idle on the tensor
cores while both run it: 5 us a tile); with the epilogue warps 211 us with exact exponentials and divisions and 172 us
with the SFU's. In the whole prefill (28 layers, one process, the same weights, 12 alternating rounds of 10 calls):
12.03 -> 11.02 ms, the kernel 161 us a layer in the per-kernel profile, and the logits the same to the bit as the
cuBLAS path's (the products' sums run in the same order, and no rounding of the SFU's results differed). Tried and
left out there: a cluster of two blocks sharing the weight slices through multicast copies (no faster: the loop is
not bound by L2), the consumers' epilogue staged through shared memory and stored 16 bytes a thread (203 us), their
stores deferred into the next tile's K loop (238 us).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...kernels import GemmKernel
from ...program import BufferSpec, CompiledProgram, KernelCall
from ..clike import Launch
from .common import FAST_CUDA, PRELUDE, WAIT, storage, store_expr, wgmma_helpers

GROUPS = 2
BM = 128  # rows a tile: two consumer warpgroups of 64
BH = 128  # output columns a tile: each group's 128 product columns, one m64n256 product
BK = 64  # K a stage: one 128-byte swizzled line a row
STAGES = 3
THREADS = 384  # two consumer warpgroups, then a warp with the producer thread and three epilogue warps
EPI_THREADS = 96
_A_BYTES = BM * BK * 2
_B_BYTES = GROUPS * BH * BK * 2
_STAGE_BYTES = _A_BYTES + _B_BYTES
_STAGED_BYTES = GROUPS * BM * BH * 2  # a tile's two groups of products, rounded, for the epilogue warps
# the stages, the staged tile, the mbarriers, and the slack that aligns the stages to the swizzle's 1,024 bytes
SMEM = STAGES * _STAGE_BYTES + _STAGED_BYTES + (2 * STAGES + 2) * 8 + 1024
_MMA = {"bfloat16": "bf16", "float16": "f16"}
_ALIGN = 16  # bytes: a tensor map's base and row pitch


def grouped_fits(call: KernelCall, buffers: Sequence[BufferSpec], dev) -> bool:
    """Whether this kernel computes the column-group GEMM `call` on the device `dev` (a DeviceProfile with the warpgroup
    MMA and the tensor memory accelerator, and shared memory for SMEM): two groups, more rows than a GEMV takes (the
    caller checks that one first), one batch, no bias or prologue, 16-bit operands and output of one dtype, the operand
    a read row by row and the weight column by column (both with unit stride along K, rows 16-byte aligned: what a
    tensor map copies), and an output of contiguous rows (stored 16 bytes at a time where they start on 16 bytes, else
    element by element)."""
    spec = call.spec
    if not (dev.warpgroup_mma and dev.tma and SMEM <= dev.shared_memory_per_block_optin) \
            or not isinstance(spec, GemmKernel) or spec.acc_groups != GROUPS:
        return False
    if spec.prologue is not None or spec.bias or spec.batch_count != 1 or spec.m < 1 or spec.k < 1:
        return False
    a, b, out = call.args[0], call.args[1], call.outs[0]
    dts = {buffers[r.buffer].dtype for r in (a, b, out)}
    if len(dts) != 1 or next(iter(dts)) not in _MMA:
        return False
    size = 2

    def rows_ok(offset: int, pitch: int) -> bool:
        return (offset * size) % _ALIGN == 0 and (pitch * size) % _ALIGN == 0 and pitch >= spec.k

    if a.strides[-1] != 1 and spec.k != 1 or not rows_ok(a.offset, a.strides[-2] if spec.m > 1 else spec.k):
        return False
    if b.strides[-2] != 1 and spec.k != 1 or not rows_ok(b.offset, b.strides[-1]):
        return False
    h = spec.out_n
    return out.is_contiguous() and max(spec.m, spec.n, spec.k) < 2**31 and spec.m * h < 2**62


def tensor_maps(k: KernelCall, program: CompiledProgram) -> tuple[dict, ...]:
    """The launch's tensor maps: the operand a as [m, k] rows and the weight as [n, k] rows (its columns of the
    [k, n] view), tiles of BK x BM and BK x BH, 128-byte swizzle, zero fill past the edges."""
    spec: GemmKernel = k.spec
    a, b = k.args[0], k.args[1]
    dt = program.dtype_of(a)
    lda = a.strides[-2] if spec.m > 1 else spec.k
    return (
        {"ref": ("arg", 0), "offset": int(a.offset), "dtype": dt, "dims": (spec.k, spec.m), "pitch": int(lda),
         "box": (BK, BM)},
        {"ref": ("arg", 1), "offset": int(b.offset), "dtype": dt, "dims": (spec.k, spec.n), "pitch": int(b.strides[-1]),
         "box": (BK, BH)},
    )


_HELPERS = r"""__device__ __forceinline__ unsigned gg_smem(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void gg_bar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void gg_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void gg_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void gg_wait(unsigned bar, unsigned parity) {
  unsigned ok = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                 : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
  } while (!ok);
}
__device__ __forceinline__ void gg_copy(unsigned dst, const void* map, int x, int y, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
               :: "r"(dst), "l"(map), "r"(x), "r"(y), "r"(bar) : "memory");
}
"""


def grouped_gemm(k: KernelCall, program: CompiledProgram, render_epilogue, dev) -> tuple[str, Launch]:
    """The kernel (see the module's docstring) and its launch: a block an SM of the device `dev`, the address of its
    tensor maps first among its pointers."""
    spec: GemmKernel = k.spec
    out = k.outs[0]
    od = program.dtype_of(out)
    mma_t = _MMA[od]
    m, kk, h = spec.m, spec.k, spec.out_n
    rank = len(out.shape)
    ityp = "long long" if m * h + out.offset >= 2**31 else "int"
    names = [f"a{i}" for i in range(len(k.args))]
    params = [f"const {storage(program.dtype_of(r))}* __restrict__ {nm}" for r, nm in zip(k.args, names)]
    idx = [f"const {ityp} o{d}" for d in range(rank)]
    body, value = render_epilogue(spec.epilogue, k, program, names, ["acc0", "acc1"], ityp, "  ", FAST_CUDA)
    epi_fn = "\n".join([
        f"__device__ __forceinline__ float gg_epilogue(const float acc0, const float acc1, {', '.join(idx)}, "
        f"{', '.join(params)}) {{",
        *body, f"  return (float)({value});", "}"])
    lead = ", ".join(["0"] * (rank - 2) + ["row", "col + j"])
    args = ", ".join(names)
    tiles_m, tiles_h = -(-m // BM), -(-h // BH)
    ksteps = -(-kk // BK)
    st_t = storage(od)
    pair_t = "__nv_bfloat162" if od == "bfloat16" else "__half2"
    pack = "__floats2bfloat162_rn" if od == "bfloat16" else "__floats2half2_rn"
    to_f = "__bfloat162float" if od == "bfloat16" else "__half2float"
    scale = "" if spec.alpha == 1.0 else f" * {float(spec.alpha)!r}f"
    # 16-byte stores of 8 outputs where every row of the output starts on 16 bytes; else one element at a time
    wide = h % 8 == 0 and out.offset % 8 == 0
    value_j = store_expr(od, f"gg_epilogue({to_f}(g8[j]), {to_f}(u8[j]), {lead}, {args})", "float32")
    if wide:
        store = f"""          if (col < {h}) {{
            uint4 ov;
            {st_t}* o8 = reinterpret_cast<{st_t}*>(&ov);
            #pragma unroll
            for (int j = 0; j < 8; ++j) o8[j] = {value_j};
            *reinterpret_cast<uint4*>(out0 + {out.offset} + ({ityp})row * {h} + col) = ov;
          }}"""
    else:
        store = f"""          #pragma unroll
          for (int j = 0; j < 8; ++j)
            if (col + j < {h})
              out0[{out.offset} + ({ityp})row * {h} + col + j] = {value_j};"""
    src = _grouped_source(epi_fn=epi_fn, h=h, ksteps=ksteps, m=m, mma_t=mma_t, pack=pack, pair_t=pair_t, params=params,
        scale=scale, st_t=st_t, store=store, tiles_h=tiles_h, tiles_m=tiles_m)
    return src, Launch((min(tiles_m * tiles_h, dev.multiprocessors), 1, 1), THREADS,
                       [("maps", 0), ("out", 0)] + [("arg", i) for i in range(len(k.args))], smem=SMEM,
                       tensor_maps=tensor_maps(k, program))


def _grouped_source(*, epi_fn, h, ksteps, m, mma_t, pack, pair_t, params, scale, st_t, store, tiles_h, tiles_m):
    """The source: the producer's tensor-map copies into the stages, the consumers' warpgroup MMAs, the epilogue warps
    over the staged tiles."""
    src = f"""{PRELUDE}{_HELPERS}{wgmma_helpers(mma_t, {"gg_mma": (2 * BH, False, False, True)})}{epi_fn}

extern "C" __global__ void __launch_bounds__({THREADS}, 1) npu_kernel(const unsigned char* __restrict__ maps,
    {st_t}* __restrict__ out0, {", ".join(params)}) {{
{WAIT}
  extern __shared__ unsigned char gg_raw[];
  unsigned char* smem = (unsigned char*)(((unsigned long long)gg_raw + 1023) & ~1023ull);
  unsigned char* stg = smem + {STAGES * _STAGE_BYTES};  // the staged tile: group 0, then group 1
  unsigned long long* full = (unsigned long long*)(stg + {_STAGED_BYTES});
  unsigned long long* empty = full + {STAGES};
  unsigned long long* staged = empty + {STAGES};  // written by the 256 consumer threads
  unsigned long long* drained = staged + 1;  // read by the {EPI_THREADS} epilogue threads
  const int tid = threadIdx.x, wg = tid >> 7;
  if (tid == 0) {{
    for (int s = 0; s < {STAGES}; ++s) {{
      gg_bar_init(gg_smem(&full[s]), 1);
      gg_bar_init(gg_smem(&empty[s]), 2);
    }}
    gg_bar_init(gg_smem(staged), 256);
    gg_bar_init(gg_smem(drained), {EPI_THREADS});
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }}
  __syncthreads();
  const int tiles = {tiles_m * tiles_h};
  if (wg == 2) {{
    if (tid == {2 * 128}) {{
      // the producer: every K step of every tile of this block into the next free stage
      int s = 0;
      unsigned ph = 0;
      for (int t = blockIdx.x; t < tiles; t += gridDim.x) {{
        const int m0 = (t % {tiles_m}) * {BM}, n0 = (t / {tiles_m}) * {BH};
        for (int ks = 0; ks < {ksteps}; ++ks) {{
          gg_wait(gg_smem(&empty[s]), ph ^ 1);
          const unsigned fb = gg_smem(&full[s]);
          gg_expect(fb, {_STAGE_BYTES});
          unsigned char* st = smem + s * {_STAGE_BYTES};
          gg_copy(gg_smem(st), maps, ks * {BK}, m0, fb);
          gg_copy(gg_smem(st + {_A_BYTES}), maps + 128, ks * {BK}, n0, fb);
          gg_copy(gg_smem(st + {_A_BYTES + _B_BYTES // 2}), maps + 128, ks * {BK}, {h} + n0, fb);
          if (++s == {STAGES}) {{ s = 0; ph ^= 1; }}
        }}
      }}
    }} else if (tid >= {2 * 128 + 32}) {{
      // the epilogue warps: each staged tile's rows, 8 columns (16 bytes of each group) a thread at a time, while
      // the consumers compute the next tile
      const int et = tid - {2 * 128 + 32};
      unsigned eph = 0;
      for (int t = blockIdx.x; t < tiles; t += gridDim.x) {{
        const int m0 = (t % {tiles_m}) * {BM}, n0 = (t / {tiles_m}) * {BH};
        gg_wait(gg_smem(staged), eph);
        for (int q = et; q < {BM * BH // 8}; q += {EPI_THREADS}) {{
          const int rr = q >> 4, c = q & 15, at = rr * 256 + ((c ^ (rr & 7)) << 4);
          const uint4 gv = *reinterpret_cast<const uint4*>(stg + at);
          const uint4 uv = *reinterpret_cast<const uint4*>(stg + {_STAGED_BYTES // 2} + at);
          const {st_t}* g8 = reinterpret_cast<const {st_t}*>(&gv);
          const {st_t}* u8 = reinterpret_cast<const {st_t}*>(&uv);
          const int row = m0 + rr, col = n0 + c * 8;
          if (row >= {m}) continue;
{store}
        }}
        gg_arrive(gg_smem(drained));
        eph ^= 1;
      }}
    }}
    __syncwarp();
  }} else {{
    // a consumer warpgroup: rows 64 cw .. 64 cw + 63 of each tile, both groups' 128 columns
    const int cw = wg, w4 = (tid & 127) >> 5, lane = tid & 31;
    float acc[128];
    int s = 0, ps = 0;
    unsigned ph = 0, eph = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {{
      for (int ks = 0; ks < {ksteps}; ++ks) {{
        gg_wait(gg_smem(&full[s]), ph);
        const unsigned a0 = gg_smem(smem + s * {_STAGE_BYTES}) + cw * {64 * BK * 2};
        const unsigned b0 = gg_smem(smem + s * {_STAGE_BYTES} + {_A_BYTES});
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        #pragma unroll
        for (int kq = 0; kq < {BK // 16}; ++kq)
          gg_mma(acc, wg_desc(a0 + kq * 32, 16, 1024), wg_desc(b0 + kq * 32, 16, 1024), (ks | kq) != 0);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        // the products of the step before are done: its stage may be copied into again
        if (ks > 0 && (tid & 127) == 0) gg_arrive(gg_smem(&empty[ps]));
        ps = s;
        if (++s == {STAGES}) {{ s = 0; ph ^= 1; }}
      }}
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
      #pragma unroll
      for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(acc[i]) :: "memory");
      if ((tid & 127) == 0) gg_arrive(gg_smem(&empty[ps]));
      // each group's products rounded to the output dtype (`Acc`) into the staged tile, once the epilogue warps are
      // done with the last one: column 8 nb + 2 (lane % 4) + e, row 16 w4 + lane / 4 + 8 hh of this warpgroup's is
      // acc[4 nb + 2 hh + e] for group 0, acc[64 + ...] for group 1 (16-byte chunk c of a row at c ^ (row % 8): no
      // bank conflicts here or where the epilogue warps read whole chunks)
      gg_wait(gg_smem(drained), eph ^ 1);
      #pragma unroll
      for (int nb = 0; nb < 16; ++nb) {{
        #pragma unroll
        for (int hh = 0; hh < 2; ++hh) {{
          const int rr = cw * 64 + w4 * 16 + (lane >> 2) + 8 * hh;
          const int at = rr * 256 + ((nb ^ (rr & 7)) << 4) + (lane & 3) * 4;
          const int i = nb * 4 + 2 * hh;
          *reinterpret_cast<{pair_t}*>(stg + at) = {pack}(acc[i]{scale}, acc[i + 1]{scale});
          *reinterpret_cast<{pair_t}*>(stg + {_STAGED_BYTES // 2} + at) =
              {pack}(acc[64 + i]{scale}, acc[65 + i]{scale});
        }}
      }}
      gg_arrive(gg_smem(staged));
      eph ^= 1;
    }}
  }}
}}
"""
    return src


__all__ = ["grouped_fits", "grouped_gemm", "tensor_maps"]
