"""The cuda target's integer kernels run on the CPU, for CI (no GPU there): the rendered CUDA C compiled by g++ with
one std::thread per CUDA thread of a block, `__syncthreads` a barrier, `cp.async` an immediate copy, `ldmatrix` an
exchange of the warp's row addresses, and `mma.sync.m16n8k32` s8 computed per warp
from its lanes' fragments as the PTX ISA lays them out (a0..a3: rows g and g + 8, k 4t..4t+3 and + 16; b0, b1: k
4t..4t+3 and + 16, column g; c0..c3: row g and g + 8, columns 2t and 2t + 1; g = lane / 4, t = lane % 4, the
layouts of CuTe's SM80_16x8x32_S32S8S8S32_TN). It checks everything but the hardware: the tiles, the loaders, the
zero-point sums and the epilogue. A warp's shuffles go through an array and the warp's barrier. Blocks run one after
another."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
from int8_cases import NP, Case, feeds, program_of

from npu_compiler.targets.cuda import CudaTarget
from npu_compiler.targets.cuda.int8_kernels import INTEGER_HELPERS, render_integer

HARNESS = r"""
#include <thread>
#include <barrier>
#include <vector>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <algorithm>
struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
struct int4 { int x, y, z, w; };
inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
struct dim3_ { unsigned x = 0, y = 0, z = 0; };
thread_local dim3_ threadIdx;
dim3_ blockIdx, gridDim, blockDim;
#define __global__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __device__
#define __forceinline__ inline
#define __restrict__
static std::barrier<>* g_bar;
static std::barrier<>* w_bar[64];
inline void __syncthreads() { g_bar->arrive_and_wait(); }
inline void npu_wait_prior() {}
inline void npu_prefetch_l2(const void*) {}
inline int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; i++) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
  return c;
}
inline float __int2float_rn(int x) { return (float)x; }
inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcs(const T* p) { return *p; }
using std::min;
inline void __syncwarp() { w_bar[threadIdx.x >> 5]->arrive_and_wait(); }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  unsigned long long v = ((unsigned long long)y << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 255u) << (8 * i);
  return r;
}
static float shfl_[64][32];
inline float __shfl_xor_sync(unsigned, float v, int o) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  shfl_[w][l] = v;
  w_bar[w]->arrive_and_wait();
  float r = shfl_[w][l ^ o];
  w_bar[w]->arrive_and_wait();
  return r;
}
// cp.async as an immediate copy (the kernels wait for every copy before a barrier that precedes its reads), and
// ldmatrix x4 from the lanes' row addresses (lane l: row l / 4 of matrix m, bytes 4 (l % 4) .. + 3)
inline void npu_cp16(void* dst, const void* src, bool full) {
  if (full) std::memcpy(dst, src, 16); else std::memset(dst, 0, 16);
}
inline void npu_commit() {}
template <int N> inline void npu_wait_copies() {}
static const unsigned char* ldsm_[64][32];
inline void npu_ldsm(unsigned* r, const void* p) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  ldsm_[w][l] = (const unsigned char*)p;
  w_bar[w]->arrive_and_wait();
  for (int m = 0; m < 4; m++) std::memcpy(&r[m], ldsm_[w][m * 8 + (l >> 2)] + (l & 3) * 4, 4);
  w_bar[w]->arrive_and_wait();
}
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static unsigned fragA[64][32][4], fragB[64][32][2];
inline void npu_mma_s8(int* c, const unsigned* a, const unsigned* b) {
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  for (int i = 0; i < 4; i++) fragA[w][l][i] = a[i];
  for (int i = 0; i < 2; i++) fragB[w][l][i] = b[i];
  w_bar[w]->arrive_and_wait();
  signed char A[16][32], B[32][8];
  for (int L = 0; L < 32; L++) {
    int g = L >> 2, t = L & 3;
    for (int i = 0; i < 4; i++) for (int j = 0; j < 4; j++)
      A[g + 8 * (i & 1)][t * 4 + j + 16 * (i >> 1)] = (signed char)(fragA[w][L][i] >> (8 * j));
    for (int i = 0; i < 2; i++) for (int j = 0; j < 4; j++)
      B[t * 4 + j + 16 * i][g] = (signed char)(fragB[w][L][i] >> (8 * j));
  }
  int g = l >> 2, t = l & 3;
  for (int q = 0; q < 4; q++) {
    int row = g + 8 * (q >> 1), col = t * 2 + (q & 1);
    int s = 0;
    for (int k = 0; k < 32; k++) s += (int)A[row][k] * (int)B[k][col];
    c[q] += s;
  }
  w_bar[w]->arrive_and_wait();
}
"""



MAIN = """
std::vector<char> rd(const char* p) {
  FILE* f = fopen(p, "rb"); std::vector<char> v; char buf[65536]; size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) v.insert(v.end(), buf, buf + n);
  fclose(f); v.resize(v.size() + 64); return v;
}
int main(int argc, char** argv) {
  @LOADS@
  gridDim.x = @GRID@; blockDim.x = @THREADS@;
  std::barrier<> bar(@THREADS@); g_bar = &bar;
  for (int w = 0; w < @WARPS@; w++) w_bar[w] = new std::barrier<>(32);
  for (unsigned b = 0; b < @GRID@; b++) {
    blockIdx.x = b;
    std::vector<std::thread> th;
    for (unsigned t = 0; t < @THREADS@; t++) th.emplace_back([&, t] { threadIdx.x = t; npu_kernel(@ARGS@); });
    for (auto& x : th) x.join();
  }
  @STORES@
}
"""


def available() -> bool:
    return shutil.which("g++") is not None


def _helpers() -> str:
    h = re.sub(r"__device__ __forceinline__ void npu_mma_s8.*?\n}\n", "", INTEGER_HELPERS, flags=re.S)
    h = re.sub(r"__device__ __forceinline__ int npu_bytesum.*?\n", "", h)
    return h + "\ninline int npu_bytesum(unsigned w) { return __dp4a((int)w, 0x01010101, 0); }\n"


def run_emulated(case: Case, device, folder: Path, program=None) -> np.ndarray:
    """The cuda target's launches of `case` (or of its `program`, a plan and scratch set), rendered for `device`,
    run on the CPU one after another over the same buffers: its output."""
    program = program or program_of(case, "cuda")
    k = program.kernels[0]
    args = [np.ascontiguousarray(feeds(case)[n]) for n, _, _ in case.inputs]
    for i, a in enumerate(args):
        a.tofile(folder / f"a{i}.bin")
    writes = [np.zeros(program.buffers[r.buffer].numel, NP[program.buffers[r.buffer].dtype]) for r in k.writes]
    for i, w in enumerate(writes):  # the output and the plan's scratch, carried from one launch to the next
        w.tofile(folder / f"w{i}.bin")
    for n_launch, (src, launch) in enumerate(render_integer(k, program, CudaTarget(device).profile)):
        body = src[src.index('extern "C"'):]
        body = body.replace("extern __shared__ __align__(16) unsigned char npu_smem[];",
                            f"static unsigned char npu_smem[{max(launch.smem, 16)}] __attribute__((aligned(16)));")
        sig = re.search(r"npu_kernel\((.*?)\)", body).group(1)
        types = [p.rsplit("*", 1)[0].replace("const", "").strip() for p in sig.split(",")]
        loads = [f'std::vector<char> o{i} = rd("{folder / f"w{i}.bin"}");' for i in range(len(writes))]
        loads += [f'std::vector<char> b{i} = rd("{folder / f"a{i}.bin"}");' for i in range(len(args))]
        stores = [f'{{ FILE* f = fopen("{folder / f"w{i}.bin"}", "wb"); fwrite(o{i}.data(), 1, {w.nbytes}, f); '
                  f'fclose(f); }}' for i, w in enumerate(writes)]
        call = [f"({types[i]}*)o{i}.data()" for i in range(len(writes))]
        call += [f"({types[len(writes) + i]}*)b{i}.data()" for i in range(len(args))]
        main = MAIN
        for key, value in (("@LOADS@", "\n  ".join(loads)), ("@STORES@", "\n  ".join(stores)),
                           ("@GRID@", str(launch.grid[0])), ("@THREADS@", str(launch.block)),
                           ("@WARPS@", str(max(1, launch.block // 32))), ("@ARGS@", ", ".join(call))):
            main = main.replace(key, value)
        cpp, exe = folder / f"k{n_launch}.cpp", folder / f"k{n_launch}"
        cpp.write_text(HARNESS + _helpers() + body + main)
        subprocess.run(["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-pthread", "-w", "-o", str(exe), str(cpp)],
                       check=True, capture_output=True, text=True)
        subprocess.run([str(exe)], check=True)
    return np.fromfile(folder / "w0.bin", NP[case.out_dtype]).reshape(case.out_shape)
