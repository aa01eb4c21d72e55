"""What every CUDA C source of the cuda target shares: dtype tables, literals, index arithmetic and the prelude.

Registers: every float computes in fp32 (fp64 stays fp64), every integer in int64 (`long long`), bools as `bool`.
Storage types are the buffer's own; loads widen to the register type and stores narrow with round-to-nearest-even.
"""

from __future__ import annotations

import math

import numpy as np

from ...dtypes import itemsize
from ...errors import NPUCompileError
from ...memory_check import written_buffers
from ..clike import KernelText, Language, affine, decompose, grid_for, is_flat_map, max_extent  # noqa: F401
from .nvrtc import ARCH_SPECIFIC

KERNEL_NAME = "npu_kernel"  # every source defines exactly one `extern "C" __global__` function of this name
WAIT = "  npu_wait_prior();"  # every kernel's first statement (see the prelude)
EARLY_WAIT = "  npu_wait_prior_early();"  # WAIT where the next kernel may launch first (target.render_program)
# What a kernel may read before WAIT besides L2 prefetches: weights, which no kernel writes (memory_check.
# check_read_only), between these two lines (the tests check that nothing else is read there)
WEIGHTS_BEGIN = "  // weights (read-only) before the wait: {"
WEIGHTS_END = "  // } weights"
# ... and inputs that no kernel of the program writes (`unwritten_input`): the host, or a program run before this one
# on the stream, wrote them before the program's first kernel started
INPUTS_BEGIN = "  // inputs no kernel writes, before the wait: {"
INPUTS_END = "  // } inputs"


def unwritten_input(program, buffer: int) -> bool:
    """Whether `buffer` is an input of `program` that none of its kernels writes, so that a kernel may read it before
    it waits for the kernel before (a KV cache input, which index_copy writes, is not one)."""
    return program.buffers[buffer].kind == "input" and buffer not in written_buffers(program.kernels)

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


def unpack16(dtype: str, word: str, out: str) -> list[str]:
    """Statements turning one 16-byte load `word` (a uint4) of `dtype` into floats out[0..] (8 halves, 4 floats)."""
    if dtype == "bfloat16":
        return [f"{out}[{2 * i}] = __uint_as_float({word}.{c} << 16); "
                f"{out}[{2 * i + 1}] = __uint_as_float({word}.{c} & 0xffff0000u);" for i, c in enumerate("xyzw")]
    if dtype == "float16":
        return [f"{{ const float2 f_ = __half22float2(*reinterpret_cast<const __half2*>(&{word}.{c})); "
                f"{out}[{2 * i}] = f_.x; {out}[{2 * i + 1}] = f_.y; }}" for i, c in enumerate("xyzw")]
    if dtype == "float32":
        return [f"{out}[{i}] = __uint_as_float({word}.{c});" for i, c in enumerate("xyzw")]
    raise NPUCompileError(f"cuda target: no 16-byte unpacking of {dtype}")


def nbytes(dtype: str, n: int) -> int:
    return itemsize(dtype) * n


def valid_length_prologue(pos, arg: int, kv_len: int, ityp: str) -> str:
    """Kernel lines defining `nvalid`: one past the largest cache position written this step (argument `arg`, the
    positions tensor `pos`), at most `kv_len`. Keys from there on are masked anyway: attention does not read them.
    Needs REDUCE_HELPERS and the whole block."""
    p_at = affine([("j", pos.strides[0] if pos.strides else 0)], pos.offset)
    n_pos = math.prod(pos.shape)
    return f"""
  // keys past the largest cache position written this step are masked: do not read them
  __shared__ long long npu_sh_i[32];
  long long pmax = -1;
  for (int j = threadIdx.x; j < {n_pos}; j += blockDim.x) pmax = npu_max(pmax, (long long)a{arg}[{p_at}]);
  pmax = npu_block_reduce(pmax, NpuMax(), npu_sh_i);
  const {ityp} nvalid = ({ityp})min(max(pmax + 1, 0LL), (long long){kv_len});"""


PRELUDE = r"""#include <cuda_fp16.h>
#include <cuda_bf16.h>

// NaN-propagating max/min (torch.maximum/minimum and relu propagate NaN; fmaxf does not).
__device__ __forceinline__ float npu_max(float a, float b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ float npu_min(float a, float b) { return (a < b || a != a) ? a : b; }
__device__ __forceinline__ double npu_max(double a, double b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ double npu_min(double a, double b) { return (a < b || a != a) ? a : b; }
__device__ __forceinline__ long long npu_max(long long a, long long b) { return a > b ? a : b; }
__device__ __forceinline__ long long npu_min(long long a, long long b) { return a < b ? a : b; }
// Programmatic dependent launch: a kernel may start before the one it follows has finished (its launch overlaps the
// other's tail); it waits here, before anything that reads what an earlier kernel writes, until that kernel's writes
// are visible. Then it lets the kernel after it launch: that one's blocks are placed once every block of this one
// has been (so they never take an SM this one still needs), and wait in turn, so that a chain of small kernels pays
// its launches and prologues while the one before still runs. No-ops when launched normally. (A GEMV loads its first
// weights and prefetches its rows into L2 before waiting, a conv the weights of its first pixel tile, a split decode
// attention its keys and values: a prefetch is a hint, and the loads that follow the wait see every write.)
__device__ __forceinline__ void npu_wait_prior() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// The same, with the kernel after it let launch first: for a kernel whose successor does work before its own wait
// (prefetches its operands into L2), so that the work overlaps the kernel this one waits for. Only the successor's
// launch moves; its wait still returns once this kernel has finished.
__device__ __forceinline__ void npu_wait_prior_early() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ long long npu_ipow(long long a, long long e) {
  long long r = 1;
  if (e < 0) return (a == 1) ? 1 : ((a == -1) ? ((e & 1) ? -1 : 1) : 0);
  while (e) { if (e & 1) r *= a; a *= a; e >>= 1; }
  return r;
}
"""


def mma_sync_ok(dev) -> bool:
    """Whether a device (a DeviceProfile) runs the tensor-core kernels written for `mma.sync` m16n8k16 with bf16
    operands, `ldmatrix` and `cp.async`: NVIDIA compute capability 8.0 and later."""
    return dev.has_mma("mma.sync") and dev.async_copy


def swizzled_at(row: str, ch: str) -> str:
    """The half-element offset, in a K-major tile of the warpgroup MMA with the 128-byte swizzle (`wg_desc`), of the
    16-byte chunk `ch` of row `row`: a row's 64 K values one 128-byte line, the chunk at chunk ch ^ (row % 8)."""
    return f"({row}) * 64 + ((({ch}) ^ (({row}) & 7)) * 8)"


def wgmma_helpers(mma_t: str, products: dict[str, tuple], plain_desc: bool = False) -> str:
    """Device helpers of the kernels on Hopper's warpgroup MMA (`wgmma`, sm_90a only: the source asks for the
    arch-specific target). `wg_desc(at, lead, stride)`: the shared-memory matrix descriptor of a tile in the
    128-byte swizzle from `at` (8 rows of 128 bytes an atom, the 16-byte chunk c of row r at chunk c ^ (r % 8);
    `lead` and `stride` its leading and stride byte offsets: for a K-major tile the leading one is unused and the
    stride is the 1,024 bytes between 8-row atoms; for the transposed form of B the leading one is the distance
    between 64-column regions). For each `name: (n, a_from_registers, b_transposed[, scale_d])` of `products` an m64
    x n x k16 product of `mma_t` operands into fp32 accumulators `d` (the thread's n / 2): `name(d, da, db)` with A
    in shared memory (K-major), or `name(d, a, db)` with A in registers (an mma.sync m16n8k16 A fragment of each
    warp's 16 rows); B in shared memory, K-major or in its transposed (N-contiguous) form. With `scale_d` the
    product takes a last int argument: 0 overwrites `d` instead of adding to it (a tile's first K step needs no
    zeroed accumulators). `wg_wait<N>(d)`: every committed product done, and N accumulators fenced so that no read
    of them moves above the wait; `wg_wait<N, P>(d)`: every product but the P committed last done (those may run
    on). With `plain_desc`, `wg_desc_plain(at, lead, stride)` too: the descriptor of a tile without swizzle (core
    matrices of 8 rows of 16 bytes, each 128 contiguous bytes; for a K-major tile `lead` the bytes between core
    matrices along K and `stride` along M or N)."""
    plain = """__device__ __forceinline__ unsigned long long wg_desc_plain(unsigned at, unsigned lead,
                                                                unsigned stride) {
  return wg_desc(at, lead, stride) & ~(3ull << 62);
}
""" if plain_desc else ""
    out = [f"""{ARCH_SPECIFIC}
__device__ __forceinline__ unsigned long long wg_desc(unsigned at, unsigned lead, unsigned stride) {{
  return (unsigned long long)((at & 0x3FFFFu) >> 4) | ((unsigned long long)(lead >> 4) << 16)
         | ((unsigned long long)(stride >> 4) << 32) | (1ull << 62);
}}
{plain}template <int N, int P = 0> __device__ __forceinline__ void wg_wait(float* d) {{
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(P) : "memory");
  #pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}}"""]
    for name, (n, a_regs, trans_b, *scaled) in products.items():
        regs = n // 2
        outs = ", ".join(f"%{i}" for i in range(regs))
        accs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
        scale, sd = (", int sd", '"r"(sd)') if scaled and scaled[0] else ("", '"r"(1)')
        if a_regs:
            params, a, b, flags = "const unsigned* a", f"{{%{regs}, %{regs + 1}, %{regs + 2}, %{regs + 3}}}", \
                f"%{regs + 4}", f"1, 1, {int(trans_b)}"
            ins, pred = f'"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), {sd}', regs + 5
        else:
            params, a, b, flags = "unsigned long long da", f"%{regs}", f"%{regs + 1}", f"1, 1, 0, {int(trans_b)}"
            ins, pred = f'"l"(da), "l"(db), {sd}', regs + 2
        out.append(f"""__device__ __forceinline__ void {name}(float* d, {params}, unsigned long long db{scale}) {{
  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{pred}, 0;\\n"
               "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{mma_t}.{mma_t} {{{outs}}}, {a}, {b}, p, {flags};\\n}}"
               : {accs}
               : {ins});
}}""")
    return "\n".join(out) + "\n"


def tc_helpers(mma_t: str) -> str:
    """Device helpers of the tensor-core kernels (Ampere and later): 16-byte `cp.async` copies into shared memory
    (zero-filled where `full` is false), their commit and wait, `ldmatrix` x4 (plain and transposed), and the
    m16n8k16 `mma.sync` with fp32 accumulators; `mma_t` is the operand type ("bf16" or "f16")."""
    return f"""__device__ __forceinline__ void tc_cp16(void* dst, const void* src, bool full) {{
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(s), "l"(src), "r"(full ? 16 : 0));
}}
__device__ __forceinline__ void tc_commit() {{ asm volatile("cp.async.commit_group;"); }}
template <int N> __device__ __forceinline__ void tc_wait() {{
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}}
__device__ __forceinline__ void tc_ldsm(unsigned* r, const void* p) {{
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%0,%1,%2,%3}}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}}
__device__ __forceinline__ void tc_ldsm_t(unsigned* r, const void* p) {{
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{%0,%1,%2,%3}}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}}
__device__ __forceinline__ void tc_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {{
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{mma_t}.{mma_t}.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, "
               "{{%0,%1,%2,%3}};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}}
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


_UNARY: dict[str, dict[str, str]] = {
    "neg": {"f": "(-{a})", "d": "(-{a})", "i": "(-{a})"},
    "exp": {"f": "expf({a})", "d": "exp({a})"},
    "log": {"f": "logf({a})", "d": "log({a})"},
    "sqrt": {"f": "sqrtf({a})", "d": "sqrt({a})"},
    # 1/sqrt (both correctly rounded) rather than rsqrtf (2 ulp): the same bits as the reference
    "rsqrt": {"f": "(1.0f / sqrtf({a}))", "d": "(1.0 / sqrt({a}))"},
    "sin": {"f": "sinf({a})", "d": "sin({a})"},
    "cos": {"f": "cosf({a})", "d": "cos({a})"},
    "tanh": {"f": "tanhf({a})", "d": "tanh({a})"},
    "erf": {"f": "erff({a})", "d": "erf({a})"},
    "abs": {"f": "fabsf({a})", "d": "fabs({a})", "i": "llabs({a})"},
    "not": {"b": "(!{a})", "i": "({a} == 0)", "f": "({a} == 0.0f)", "d": "({a} == 0.0)"},
    "floor": {"f": "floorf({a})", "d": "floor({a})", "i": "{a}"},
    "trunc": {"f": "truncf({a})", "d": "trunc({a})", "i": "{a}"},
}
_BINARY: dict[str, dict[str, str]] = {
    "add": {"*": "({a} + {b})"},
    "sub": {"*": "({a} - {b})"},
    "mul": {"*": "({a} * {b})"},
    "div": {"*": "({a} / {b})"},
    "max": {"*": "npu_max({a}, {b})", "b": "({a} || {b})"},
    "min": {"*": "npu_min({a}, {b})", "b": "({a} && {b})"},
    "pow": {"f": "powf({a}, {b})", "d": "pow({a}, {b})", "i": "npu_ipow({a}, {b})"},
    "eq": {"*": "({a} == {b})"},
    "ne": {"*": "({a} != {b})"},
    "lt": {"*": "({a} < {b})"},
    "le": {"*": "({a} <= {b})"},
    "gt": {"*": "({a} > {b})"},
    "ge": {"*": "({a} >= {b})"},
    "and": {"*": "({a} && {b})"},
    "or": {"*": "({a} || {b})"},
}
_KIND = {"float": "f", "double": "d", "long long": "i", "bool": "b"}
_SHARED = {"float": "npu_sh_f", "long long": "npu_sh_i", "double": "npu_sh_d"}


def _primitive(table: dict[str, dict[str, str]], op: str, dtype: str) -> str:
    row = table.get(op)
    if row is None:
        raise NPUCompileError(f"cuda target: no primitive '{op}'")
    text = row.get(_KIND[reg(dtype)], row.get("*"))
    if text is None:
        raise NPUCompileError(f"cuda target: primitive '{op}' is not defined for {dtype}")
    return text


class CudaLanguage(Language):
    """CUDA C for the renderer base: fp32/fp64/int64/bool registers, __half/__nv_bfloat16 storage, one block of
    threads per `blockIdx.x`, warp-shuffle block reductions."""

    name = "cuda"
    kernel_name = KERNEL_NAME
    max_grid = 65536
    max_block = 1024
    # measured on the H100 (Qwen2.5-1.5B prefill, SiLU-times-up into 2,048 x 8,960 bf16, the kernel alone): 87 us at
    # one element a thread (its two 2-byte loads the only ones in flight), 61 us at four, 58 us at eight
    elementwise_ilp = 4
    unroll_hint = "#pragma unroll"
    row_loop_hint = "#pragma unroll 4"
    int32_type = "int"
    vector_bytes = 16
    block_id, thread_id, block_dim, grid_dim = "blockIdx.x", "threadIdx.x", "blockDim.x", "gridDim.x"
    # what a library kernel's source starts with, and its first statement (the hip target's language has no wait)
    prelude = PRELUDE
    wait = WAIT

    def reg(self, dtype: str) -> str:
        return reg(dtype)

    # the conversions a library kernel writes inline (a language of another dialect of C++ overrides them)
    def load_expr(self, dtype: str, lvalue: str) -> str:
        return load_expr(dtype, lvalue)

    def store_expr(self, dtype: str, value: str, value_dtype: str | None = None) -> str:
        return store_expr(dtype, value, value_dtype)

    def round_expr(self, x: str, dtype: str | None) -> str:
        return round_expr(x, dtype)

    def storage(self, dtype: str) -> str:
        return storage(dtype)

    def index_type(self, extent: int) -> str:
        return index_type(extent)

    def literal(self, value: float | int | bool, dtype: str) -> str:
        return literal(value, dtype)

    def load(self, arg: str, index: str, dtype: str) -> str:
        return load_expr(dtype, f"{arg}[{index}]")

    def store(self, out: str, index: str, dtype: str, value: str, value_dtype: str) -> str:
        return f"{out}[{index}] = {store_expr(dtype, value, value_dtype)};"

    def cast(self, x: str, src: str, dst: str) -> str:
        return cast_expr(x, src, dst)

    def unary(self, op: str, dtype: str, a: str) -> str:
        return _primitive(_UNARY, op, dtype).format(a=a)

    def binary(self, op: str, dtype: str, a: str, b: str) -> str:
        return _primitive(_BINARY, op, dtype).format(a=a, b=b)

    def select(self, cond: str, a: str, b: str) -> str:
        return f"({cond} ? {a} : {b})"

    def to_index(self, x: str, ityp: str) -> str:
        return f"({ityp}){x}" if x in (self.block_id, self.grid_dim) else x

    def index_value(self, var: str, ityp: str) -> str:
        return var if ityp == "long long" else f"(long long){var}"

    def decl(self, name: str, ty: str, value: str, mutable: bool = False) -> str:
        return f"{'' if mutable else 'const '}{ty} {name} = {value};"

    def loop(self, var: str, ty: str, start: str, end: str, step: str) -> str:
        inc = f"++{var}" if step == "1" else f"{var} += {step}"
        return f"for ({ty} {var} = {start}; {var} < {end}; {inc}) {{"

    def reduce_init(self, op: str, dtype: str) -> str:
        t = reg(dtype)
        if t not in ("float", "long long", "double"):
            raise NPUCompileError(f"cuda target: reduction accumulating in {dtype}")
        if op == "sum":
            return {"float": "0.0f", "double": "0.0", "long long": "0LL"}[t]
        if op == "max":
            return {"float": NEG_INF_F, "long long": INT64_MIN,
                    "double": "-__longlong_as_double(0x7ff0000000000000LL)"}[t]
        raise NPUCompileError(f"cuda target: unknown reduction '{op}'")

    def combine(self, op: str, dtype: str, acc: str, v: str) -> str:
        return f"{acc} + {v}" if op == "sum" else f"npu_max({acc}, {v})"

    def block_reduce(self, acc: str, op: str, dtype: str, kernel: KernelText) -> list[str]:
        t = reg(dtype)
        kernel.helpers.add(REDUCE_HELPERS)
        kernel.shared[_SHARED[t]] = (t, 32)
        functor = "NpuSum()" if op == "sum" else "NpuMax()"
        return [f"{acc} = npu_block_reduce({acc}, {functor}, {_SHARED[t]});"]

    def vector_load(self, arg: str, index: str, dtype: str, out: str) -> list[str]:
        return [f"float {out}[8];", f"const uint4 {out}w = *reinterpret_cast<const uint4*>(&{arg}[{index}]);",
                *unpack16(dtype, f"{out}w", out)]

    def vector_load_if(self, arg: str, index: str, dtype: str, out: str, cond: str, fill: str) -> list[str]:
        _, *load = self.vector_load(arg, index, dtype, out)
        return [f"float {out}[8] = {{{', '.join([fill] * 8)}}};", f"if ({cond}) {{", *("  " + line for line in load),
                "}"]

    def vector_store(self, out: str, index: str, dtype: str, values: list[str], value_dtype: str) -> list[str]:
        bits = "__half_as_ushort" if dtype == "float16" else "__bfloat16_as_ushort"
        halves = [f"(unsigned){bits}({store_expr(dtype, v, value_dtype)})" for v in values]
        words = [f"{halves[2 * i]} | ({halves[2 * i + 1]} << 16)" for i in range(len(halves) // 2)]
        return [f"*reinterpret_cast<uint4*>(&{out}[{index}]) = make_uint4({', '.join(words)});"]

    def kernel(self, text: KernelText) -> str:
        params = []
        for name, dtype, written in text.params:
            if written:
                params.append(f"{storage(dtype)}* {name}")
            else:
                params.append(f"const {storage(dtype)}* {'__restrict__ ' if text.restrict else ''}{name}")
        lines = [PRELUDE]
        lines += sorted(text.helpers)
        lines.append(f'extern "C" __global__ void __launch_bounds__({text.block}) {KERNEL_NAME}({", ".join(params)}) '
                     "{")
        for name, (ty, count) in sorted(text.shared.items()):
            lines.append(f"  __shared__ {ty} {name}[{count}];")
        lines.append(WAIT)
        lines += text.body
        lines.append("}")
        return "\n".join(lines) + "\n"


CUDA = CudaLanguage()


class FastCudaLanguage(CudaLanguage):
    """CudaLanguage whose float exponentials and divisions go through the special-function unit (`__expf`,
    `__fdividef`: a few units in fp32's last place, and 0 for a divisor above 2^126), for an epilogue that a 16-bit
    rounding follows and that runs beside tensor-core work, where the correctly rounded forms' longer, branchy
    sequences made it the bottleneck (grouped_gemm.py). Everything else renders as CudaLanguage does."""

    def unary(self, op: str, dtype: str, a: str) -> str:
        if op == "exp" and reg(dtype) == "float":
            return f"__expf({a})"
        return super().unary(op, dtype, a)

    def binary(self, op: str, dtype: str, a: str, b: str) -> str:
        if op == "div" and reg(dtype) == "float":
            return f"__fdividef({a}, {b})"
        return super().binary(op, dtype, a, b)


FAST_CUDA = FastCudaLanguage()
