"""What every CUDA C source of the cuda target shares: dtype tables, literals, index arithmetic and the prelude.

Registers: every float computes in fp32 (fp64 stays fp64), every integer in int64 (`long long`), bools as `bool`.
Storage types are the buffer's own; loads widen to the register type and stores narrow with round-to-nearest-even.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...dtypes import itemsize
from ...errors import NPUCompileError

KERNEL_NAME = "npu_kernel"  # every source defines exactly one `extern "C" __global__` function of this name

STORAGE: dict[str, str] = {
    "float32": "float",
    "float16": "__half",
    "bfloat16": "__nv_bfloat16",
    "float64": "double",
    "int64": "long long",
    "int32": "int",
    "int16": "short",
    "int8": "signed char",
    "uint8": "unsigned char",
    "bool": "bool",
}
REG: dict[str, str] = {"float32": "float", "float16": "float", "bfloat16": "float", "float64": "double",
                       "bool": "bool"}
INF_F = "__int_as_float(0x7f800000)"
NEG_INF_F = "__int_as_float(0xff800000)"
INT64_MIN = "(-9223372036854775807LL - 1)"


def reg(dtype: str) -> str:
    """The register type a value of `dtype` computes in."""
    return REG.get(dtype, "long long")


def storage(dtype: str) -> str:
    try:
        return STORAGE[dtype]
    except KeyError:
        raise NPUCompileError(f"cuda target: no storage type for dtype {dtype!r}") from None


def load_expr(dtype: str, lvalue: str) -> str:
    """A storage element (an lvalue text) widened to its register type."""
    if dtype == "float16":
        return f"__half2float({lvalue})"
    if dtype == "bfloat16":
        return f"__bfloat162float({lvalue})"
    if reg(dtype) == "long long" and dtype != "int64":
        return f"(long long)({lvalue})"
    return lvalue


def store_expr(dtype: str, value: str, value_dtype: str | None = None) -> str:
    """A register value converted (rounding to nearest even) to the storage type of `dtype`."""
    vreg = reg(value_dtype) if value_dtype else reg(dtype)
    if dtype == "float16":
        return f"__float2half_rn((float)({value}))" if vreg != "float" else f"__float2half_rn({value})"
    if dtype == "bfloat16":
        return f"__float2bfloat16_rn((float)({value}))" if vreg != "float" else f"__float2bfloat16_rn({value})"
    if dtype == "bool":
        return f"(({value}) != 0)" if vreg != "bool" else value
    st = storage(dtype)
    return value if st == vreg else f"({st})({value})"


def cast_expr(x: str, src: str, dst: str) -> str:
    """`Cast` semantics (matching the reference): halves round through fp32, floats to ints truncate, anything to
    bool is `!= 0`; the result is in the register type of `dst`."""
    if dst in ("float16", "bfloat16"):
        f = x if reg(src) == "float" else f"(float)({x})"
        if dst == "float16":
            return f"__half2float(__float2half_rn({f}))"
        return f"__bfloat162float(__float2bfloat16_rn({f}))"
    if dst == "float32":
        return x if reg(src) == "float" else f"(float)({x})"
    if dst == "float64":
        return x if reg(src) == "double" else f"(double)({x})"
    if dst == "bool":
        return x if src == "bool" else f"(({x}) != 0)"
    # integers: the register keeps int64 (no wrap until the store, as the reference does)
    return x if reg(src) == "long long" else f"(long long)({x})"


def round_expr(x: str, dtype: str | None) -> str:
    """An fp32 value rounded to a half dtype and back (where the IR stores an intermediate in that dtype); other
    dtypes leave it as is."""
    if dtype == "float16":
        return f"__half2float(__float2half_rn({x}))"
    if dtype == "bfloat16":
        return f"__bfloat162float(__float2bfloat16_rn({x}))"
    return x


def literal(value: float | int | bool, dtype: str) -> str:
    """An exact C literal of a constant in the register type of `dtype`."""
    r = reg(dtype)
    if r == "bool":
        return "true" if value else "false"
    if r == "long long":
        v = int(value)
        if v == -(2**63):
            return INT64_MIN
        return f"{v}LL"
    v = float(value)
    if r == "float":
        f = float(np.float32(v))
        if math.isnan(f):
            return "__int_as_float(0x7fc00000)"
        if math.isinf(f):
            return INF_F if f > 0 else NEG_INF_F
        return f"{f.hex()}f" if f != 0 else ("-0.0f" if math.copysign(1, f) < 0 else "0.0f")
    if math.isnan(v):
        return "__longlong_as_double(0x7ff8000000000000LL)"
    if math.isinf(v):
        return "__longlong_as_double(0x7ff0000000000000LL)" if v > 0 else "__longlong_as_double(0xfff0000000000000LL)"
    return v.hex() if v != 0 else ("-0.0" if math.copysign(1, v) < 0 else "0.0")


# ---- index arithmetic -----------------------------------------------------------------------------------------


def index_type(extent: int) -> str:
    """32-bit index math where every reachable element offset fits (it is much cheaper), else 64-bit."""
    return "int" if extent < 2**31 - 1 else "long long"


def affine(terms: list[tuple[str, int]], offset: int = 0) -> str:
    """`offset + sum(var * stride)` with zero strides dropped."""
    parts = [str(offset)] if offset else []
    for var, stride in terms:
        if stride == 0:
            continue
        parts.append(var if stride == 1 else f"{var} * {stride}")
    return " + ".join(parts) if parts else "0"


def decompose(var: str, shape: tuple[int, ...], prefix: str, ityp: str, indent: str) -> list[str]:
    """Lines that split a flat row-major index `var` into per-dim indices `{prefix}{d}` (size-1 dims are 0)."""
    lines: list[str] = []
    dims = [d for d, n in enumerate(shape) if n != 1]
    for d, n in enumerate(shape):
        if n == 1:
            lines.append(f"{indent}const {ityp} {prefix}{d} = 0;")
    if not dims:
        return lines
    lines.append(f"{indent}{ityp} {prefix}_rem = {var};")
    for j, d in enumerate(reversed(dims)):
        if j == len(dims) - 1:
            lines.append(f"{indent}const {ityp} {prefix}{d} = {prefix}_rem;")
        else:
            n = shape[d]
            lines.append(f"{indent}const {ityp} {prefix}{d} = {prefix}_rem % {n}; {prefix}_rem /= {n};")
    return lines


def max_extent(shape: tuple[int, ...], strides: tuple[int, ...], offset: int = 0) -> int:
    """One past the largest element offset a strided view reaches."""
    if any(n == 0 for n in shape):
        return offset
    return offset + sum((n - 1) * abs(s) for n, s in zip(shape, strides)) + 1


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def is_flat_map(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Does the map equal the contiguous row-major one (ignoring size-1 dims)? Then the flat index is the offset."""
    return all(n == 1 or s == c for n, s, c in zip(shape, strides, contiguous_strides(shape)))


@dataclass
class Launch:
    """How the runtime launches one source: grid and block sizes, dynamic shared memory, and the pointer arguments
    in order (each ("out", i) or ("arg", i): the base pointer of that TensorRef's buffer)."""

    grid: tuple[int, int, int]
    block: int
    ptrs: list[tuple[str, int]]
    smem: int = 0

    def to_params(self) -> dict:
        return {"grid": list(self.grid), "block": self.block, "smem": self.smem,
                "ptrs": [list(p) for p in self.ptrs]}


def grid_for(n: int, block: int, cap: int = 65536) -> int:
    """Blocks for a grid-stride loop over n items (capped: the loop covers the rest)."""
    return max(1, min(cap, -(-n // block)))


def nbytes(dtype: str, n: int) -> int:
    return itemsize(dtype) * n


PRELUDE = r"""#include <cuda_fp16.h>
#include <cuda_bf16.h>

// NaN-propagating max/min (torch.maximum/minimum and relu propagate NaN; fmaxf does not).
__device__ __forceinline__ float npu_max(float a, float b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ float npu_min(float a, float b) { return (a < b || a != a) ? a : b; }
__device__ __forceinline__ double npu_max(double a, double b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ double npu_min(double a, double b) { return (a < b || a != a) ? a : b; }
__device__ __forceinline__ long long npu_max(long long a, long long b) { return a > b ? a : b; }
__device__ __forceinline__ long long npu_min(long long a, long long b) { return a < b ? a : b; }
__device__ __forceinline__ long long npu_ipow(long long a, long long e) {
  long long r = 1;
  if (e < 0) return (a == 1) ? 1 : ((a == -1) ? ((e & 1) ? -1 : 1) : 0);
  while (e) { if (e & 1) r *= a; a *= a; e >>= 1; }
  return r;
}
"""

REDUCE_HELPERS = r"""
struct NpuSum {
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct NpuMax {
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return npu_max(a, b); }
};
// Every thread of the block gets the result. `sh` holds one value per warp; the leading barrier lets the
// block call this again right after a previous call.
template <class T, class Op>
__device__ __forceinline__ T npu_block_reduce(T v, Op op, T* sh) {
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (blockDim.x <= 32) return v;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = sh[0];
  const int nw = (int)(blockDim.x >> 5);
  for (int w = 1; w < nw; ++w) r = op(r, sh[w]);
  return r;
}
"""
