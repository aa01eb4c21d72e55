"""HIP C++ for the renderer base: what the hip target's generated and library kernels are written in.

HIP is CUDA's dialect for AMD GPUs, so the language is CUDA C's (`cuda.common.CudaLanguage`: the same registers,
literals, index arithmetic, primitive table and statements) with what differs on an AMD CDNA device:
- storage types from `hip/hip_fp16.h` (`__half`) and `hip/hip_bfloat16.h` (`hip_bfloat16`, rounding to nearest even
  in its constructor, widened by its `float` conversion);
- a wavefront of `profile.warp_width` lanes (64 on CDNA): block reductions shuffle with `__shfl_xor` over the whole
  wavefront, a row or reduction block is a whole number of wavefronts, and a block holds at most
  `max_threads_per_block / warp_width` of them;
- vector loads and stores of `profile.vector_bytes` (16: `global_load_dwordx4`) through a clang vector type;
- no programmatic dependent launch (a kernel starts when the one before has finished: no wait line), no cp.async,
  no TMA, no warpgroup MMA.
Floating-point contraction is off in every source (`#pragma clang fp contract(off)`): a fused chain then rounds as
the op-by-op reference does, as the cuda target's `--fmad=false` makes it; explicit `fmaf` calls still fuse.
"""

from __future__ import annotations

from ...errors import NPUCompileError
from ..clike import KernelText
from ..cuda.common import CudaLanguage, cast_expr, load_expr, reg, store_expr

KERNEL_NAME = "npu_kernel"  # every source defines exactly one `extern "C" __global__` function of this name
INCLUDES = "#include <hip/hip_runtime.h>\n#include <hip/hip_fp16.h>\n#include <hip/hip_bfloat16.h>\n"
_SHARED = {"float": "npu_sh_f", "long long": "npu_sh_i", "double": "npu_sh_d"}


def prelude(warp_width: int, vector_words: int) -> str:
    """What every source of the hip target starts with: the headers, contraction off, a guard that the compile's
    wavefronts are as wide as the source was rendered for, NaN-propagating max/min, the integer power, and the
    vector type of the wide loads and stores (`vector_words` 32-bit words)."""
    vector = (f"typedef unsigned int npu_u32v __attribute__((ext_vector_type({vector_words})));\n"
              if vector_words > 1 else "")
    return f"""{INCLUDES}
// Every product and sum rounds on its own, as the op-by-op reference does (no fused multiply-add contraction).
#pragma clang fp contract(off)
// Rendered for {warp_width}-wide wavefronts: shuffles and block reductions span that many lanes.
#if defined(__AMDGCN_WAVEFRONT_SIZE) && __AMDGCN_WAVEFRONT_SIZE != {warp_width}
#error "rendered for {warp_width}-wide wavefronts; this compile's target has another width"
#endif
{vector}
// NaN-propagating max/min (torch.maximum/minimum and relu propagate NaN; fmaxf does not).
__device__ __forceinline__ float npu_max(float a, float b) {{ return (a > b || a != a) ? a : b; }}
__device__ __forceinline__ float npu_min(float a, float b) {{ return (a < b || a != a) ? a : b; }}
__device__ __forceinline__ double npu_max(double a, double b) {{ return (a > b || a != a) ? a : b; }}
__device__ __forceinline__ double npu_min(double a, double b) {{ return (a < b || a != a) ? a : b; }}
__device__ __forceinline__ long long npu_max(long long a, long long b) {{ return a > b ? a : b; }}
__device__ __forceinline__ long long npu_min(long long a, long long b) {{ return a < b ? a : b; }}
__device__ __forceinline__ long long npu_ipow(long long a, long long e) {{
  long long r = 1;
  if (e < 0) return (a == 1) ? 1 : ((a == -1) ? ((e & 1) ? -1 : 1) : 0);
  while (e) {{ if (e & 1) r *= a; a *= a; e >>= 1; }}
  return r;
}}
"""


def reduce_helpers(warp_width: int) -> str:
    """`npu_block_reduce(v, op, sh)`: every thread of the block gets the reduction of its values. Lanes combine
    across the wavefront by `__shfl_xor`, then the wavefronts' results through `sh` (one value a wavefront); the
    block is a whole number of wavefronts. The leading barrier lets the block call it again right away."""
    w = warp_width
    return f"""
struct NpuSum {{
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const {{ return a + b; }}
}};
struct NpuMax {{
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const {{ return npu_max(a, b); }}
}};
template <class T, class Op>
__device__ __forceinline__ T npu_block_reduce(T v, Op op, T* sh) {{
  #pragma unroll
  for (int o = {w // 2}; o > 0; o >>= 1) v = op(v, __shfl_xor(v, o, {w}));
  if (blockDim.x <= {w}) return v;
  __syncthreads();
  if ((threadIdx.x & {w - 1}) == 0) sh[threadIdx.x / {w}] = v;
  __syncthreads();
  T r = sh[0];
  const int nw = (int)(blockDim.x / {w});
  for (int w = 1; w < nw; ++w) r = op(r, sh[w]);
  return r;
}}
"""


class HipLanguage(CudaLanguage):
    """HIP C++ for a device profile (an AMD one: `vendor == "amd"`); see the module's notes."""

    name = "hip"
    kernel_name = KERNEL_NAME
    # the elementwise loop's grid cap (blocks; a grid-stride loop covers the rest) and its ILP are CudaLanguage's:
    # neither is measured on an AMD GPU (none is reachable), both are shapes any GPU's memory system rewards
    row_loop_hint = "#pragma unroll 4"
    wait = ""  # no programmatic dependent launch: a kernel starts once the one before has finished

    def __init__(self, profile) -> None:
        if profile.vendor != "amd" or profile.warp_width < 2 or profile.warp_width & (profile.warp_width - 1):
            raise NPUCompileError(f"the hip target renders for AMD GPUs with power-of-two wavefronts, not "
                                  f"{profile.title} ({profile.arch}, {profile.warp_width}-wide)")
        self.profile = profile
        self.warp_width = profile.warp_width
        self.max_block = profile.max_threads_per_block
        # 2-byte elements move a vector at a time where the device loads 8 or 16 bytes in one instruction
        self.vector_bytes = profile.vector_bytes if profile.vector_bytes in (8, 16) else 0
        self.prelude = prelude(self.warp_width, self.vector_bytes // 4)
        self.reduce_helpers = reduce_helpers(self.warp_width)

    @property
    def max_warps(self) -> int:
        """Wavefronts a block may hold."""
        return max(1, self.max_block // self.warp_width)

    # ---- types and conversions ----------------------------------------------------------------------------------
    def storage(self, dtype: str) -> str:
        return "hip_bfloat16" if dtype == "bfloat16" else super().storage(dtype)

    def load_expr(self, dtype: str, lvalue: str) -> str:
        """A storage element (an lvalue text) widened to its register type."""
        return f"(float)({lvalue})" if dtype == "bfloat16" else load_expr(dtype, lvalue)

    def store_expr(self, dtype: str, value: str, value_dtype: str | None = None) -> str:
        """A register value converted (rounding to nearest even) to the storage type of `dtype`."""
        if dtype == "bfloat16":
            vreg = reg(value_dtype) if value_dtype else "float"
            return f"hip_bfloat16({value if vreg == 'float' else f'(float)({value})'})"
        return store_expr(dtype, value, value_dtype)

    def round_expr(self, x: str, dtype: str | None) -> str:
        """An fp32 value rounded to a half dtype and back; other dtypes leave it as is."""
        if dtype == "bfloat16":
            return f"(float)hip_bfloat16({x})"
        if dtype == "float16":
            return f"__half2float(__float2half_rn({x}))"
        return x

    def load(self, arg: str, index: str, dtype: str) -> str:
        return self.load_expr(dtype, f"{arg}[{index}]")

    def store(self, out: str, index: str, dtype: str, value: str, value_dtype: str) -> str:
        return f"{out}[{index}] = {self.store_expr(dtype, value, value_dtype)};"

    def cast(self, x: str, src: str, dst: str) -> str:
        if dst == "bfloat16":
            return self.round_expr(x if reg(src) == "float" else f"(float)({x})", dst)
        return cast_expr(x, src, dst)

    # ---- wide loads and stores ----------------------------------------------------------------------------------
    def _unpack(self, dtype: str, word: str, out: str) -> list[str]:
        words = self.vector_bytes // 4
        if dtype == "bfloat16":
            return [f"{out}[{2 * i}] = __uint_as_float({word}[{i}] << 16); "
                    f"{out}[{2 * i + 1}] = __uint_as_float({word}[{i}] & 0xffff0000u);" for i in range(words)]
        if dtype == "float16":
            return [f"{out}[{2 * i}] = __half2float(__ushort_as_half((unsigned short)({word}[{i}] & 0xffffu))); "
                    f"{out}[{2 * i + 1}] = __half2float(__ushort_as_half((unsigned short)({word}[{i}] >> 16)));"
                    for i in range(words)]
        raise NPUCompileError(f"hip target: no vector unpacking of {dtype}")

    def _bits(self, dtype: str, value: str, value_dtype: str) -> str:
        if dtype == "bfloat16":
            return f"(unsigned){self.store_expr(dtype, value, value_dtype)}.data"
        return f"(unsigned)__half_as_ushort({self.store_expr(dtype, value, value_dtype)})"

    def vector_load(self, arg: str, index: str, dtype: str, out: str) -> list[str]:
        n = self.vector_bytes // 2
        return [f"float {out}[{n}];", f"const npu_u32v {out}w = *reinterpret_cast<const npu_u32v*>(&{arg}[{index}]);",
                *self._unpack(dtype, f"{out}w", out)]

    def vector_load_if(self, arg: str, index: str, dtype: str, out: str, cond: str, fill: str) -> list[str]:
        n = self.vector_bytes // 2
        _, *load = self.vector_load(arg, index, dtype, out)
        return [f"float {out}[{n}] = {{{', '.join([fill] * n)}}};", f"if ({cond}) {{",
                *("  " + line for line in load), "}"]

    def vector_store(self, out: str, index: str, dtype: str, values: list[str], value_dtype: str) -> list[str]:
        halves = [self._bits(dtype, v, value_dtype) for v in values]
        words = [f"{halves[2 * i]} | ({halves[2 * i + 1]} << 16)" for i in range(len(halves) // 2)]
        return [f"*reinterpret_cast<npu_u32v*>(&{out}[{index}]) = npu_u32v{{{', '.join(words)}}};"]

    # ---- reductions and the kernel ------------------------------------------------------------------------------
    def block_reduce(self, acc: str, op: str, dtype: str, kernel: KernelText) -> list[str]:
        t = reg(dtype)
        kernel.helpers.add(self.reduce_helpers)
        kernel.shared[_SHARED[t]] = (t, self.max_warps)
        functor = "NpuSum()" if op == "sum" else "NpuMax()"
        return [f"{acc} = npu_block_reduce({acc}, {functor}, {_SHARED[t]});"]

    def signature(self, block: int, params: list[tuple[str, str, bool]], restrict: bool = True) -> str:
        """The kernel's declaration: `params` as (name, dtype, written); read-only ones `__restrict__` unless an
        argument may alias the output (`restrict=False`)."""
        out = []
        for name, dtype, written in params:
            if written:
                out.append(f"{self.storage(dtype)}* {name}")
            else:
                out.append(f"const {self.storage(dtype)}* {'__restrict__ ' if restrict else ''}{name}")
        return f'extern "C" __global__ void __launch_bounds__({block}) {KERNEL_NAME}({", ".join(out)})'

    def kernel(self, text: KernelText) -> str:
        lines = [self.prelude, *sorted(text.helpers), self.signature(text.block, text.params, text.restrict) + " {"]
        for name, (ty, count) in sorted(text.shared.items()):
            lines.append(f"  __shared__ {ty} {name}[{count}];")
        lines += text.body
        lines.append("}")
        return "\n".join(lines) + "\n"


__all__ = ["HipLanguage", "INCLUDES", "KERNEL_NAME", "prelude", "reduce_helpers"]
