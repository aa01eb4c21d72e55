"""What the integer GEMM kernels of the cuda target share (int8_kernels.py's gathering kernel, int8_conv.py's
staged one): the device helpers for TOSA's fixed-point arithmetic, the gathering kernel's tile plan, and the
requantizing epilogue (bias, requantization, clamp and the fused residual add), written once for both."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...kernels import QConv2dKernel, QGemmKernel
from ...program import CompiledProgram, KernelCall, TensorRef
from ..clike import affine
from .common import CUDA, storage, store_expr

# mma.sync m16n8k32 with 8-bit operands (PTX ISA): the instruction's shape, not a device size
MMA_M, MMA_N, MMA_K = 16, 8, 32
WARPS = 4  # 2 x 2 warps a block
BLOCK = 32 * WARPS

GATHER_TILES = ((128, 64), (64, 64), (32, 32))  # the gathering kernel's (int8_kernels.py), one stage

INTEGER_HELPERS = r"""
// TOSA's apply_scale_32 on a 64-bit value: (v * m + round) >> n, round = 2^(n-1) (n > 0), double rounding adding
// +-2^30 where n > 31; the product and the sum wrap modulo 2^64 as the CPU reference's int64 arithmetic does
__device__ __forceinline__ long long npu_apply_scale(long long v, int m, int n, bool dbl) {
  long long r = n > 0 ? (1LL << (n - 1)) : 0LL;
  if (dbl && n > 31) r += v >= 0 ? (1LL << 30) : -(1LL << 30);
  unsigned long long p = (unsigned long long)v * (unsigned long long)(long long)m + (unsigned long long)r;
  return ((long long)p) >> n;
}
__device__ __forceinline__ int npu_requant(long long v, int m, int n, int zp, int lo, int hi, bool dbl) {
  long long s = npu_apply_scale(v, m, n, dbl);
  s = (long long)((unsigned long long)s + (unsigned long long)(long long)zp);
  return (int)(s < lo ? lo : (s > hi ? hi : s));
}
// TFLite's int8 ADD of codes a and b (each less its zero point, shifted left, rescaled; the sum requantized)
__device__ __forceinline__ int npu_qadd(int a, int b, int za, int zb, int ls, int ma, int na, int mb, int nb, int mo,
                                        int no, int zo, int lo, int hi, bool dbl) {
  long long va = (long long)((unsigned long long)(long long)(a - za) << ls);
  long long vb = (long long)((unsigned long long)(long long)(b - zb) << ls);
  unsigned long long sum = (unsigned long long)npu_apply_scale(va, ma, na, dbl)
                           + (unsigned long long)npu_apply_scale(vb, mb, nb, dbl);
  return npu_requant((long long)sum, mo, no, zo, lo, hi, dbl);
}
// the same where every value fits 32 bits (`qadd_call` checks the record's fields): (a - za) << ls in 32 bits,
// each rescale by a multiplier below one, the sum of the two in 32 bits; the 64-bit products are then 32 x 32-bit
// ones and nothing wraps, so the results are the reference's
__device__ __forceinline__ long long npu_apply_scale32(int v, int m, int n, bool dbl) {
  long long r = n > 0 ? (1LL << (n - 1)) : 0LL;
  if (dbl && n > 31) r += v >= 0 ? (1LL << 30) : -(1LL << 30);
  return ((long long)v * (long long)m + r) >> n;
}
__device__ __forceinline__ int npu_qadd_narrow(int a, int b, int za, int zb, int ls, int ma, int na, int mb, int nb,
                                               int mo, int no, int zo, int lo, int hi, bool dbl) {
  const int sa = (int)npu_apply_scale32((int)((unsigned)(a - za) << ls), ma, na, dbl);
  const int sb = (int)npu_apply_scale32((int)((unsigned)(b - zb) << ls), mb, nb, dbl);
  const long long s = npu_apply_scale32(sa + sb, mo, no, dbl) + zo;
  return (int)(s < lo ? lo : (s > hi ? hi : s));
}
__device__ __forceinline__ void npu_mma_s8(int* c, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ int npu_bytesum(unsigned w) { return __dp4a((int)w, 0x01010101, 0); }
"""


@dataclass(frozen=True)
class Int8Plan:
    """How one qgemm or qconv2d is tiled: BM x BN outputs a block (each a multiple of the warps' MMA tiles), and
    the grid (at most a few waves of the device's multiprocessors; blocks walk the tiles in a grid-stride loop)."""

    bm: int
    bn: int
    grid: int


def plan_int8(rows: int, cols: int, dev) -> Int8Plan:
    """Tiles from the problem and the profile: the largest of 128 x 64, 64 x 64 or 32 x 32 that still gives every
    multiprocessor a block, the grid capped at `waves` blocks a multiprocessor."""
    sms = max(dev.multiprocessors, 1)
    for bm, bn in GATHER_TILES:
        tiles = -(-rows // bm) * -(-cols // bn)
        if tiles >= sms:
            break
    return Int8Plan(bm, bn, grid_for(rows, cols, bm, bn, dev))


def grid_for(rows: int, cols: int, bm: int, bn: int, dev) -> int:
    tiles = -(-rows // bm) * -(-cols // bn)
    resident = max(1, dev.max_threads_per_multiprocessor // BLOCK)
    return max(1, min(tiles, max(dev.multiprocessors, 1) * resident, CUDA.max_grid))


def dtype_of(program: CompiledProgram, ref: TensorRef) -> str:
    return program.buffers[ref.buffer].dtype


def requant_store(k: KernelCall, program: CompiledProgram, hoisted: bool = False) -> list[str]:
    """Statements storing output (row r, column c) of a qgemm or qconv2d from its zero-point-corrected sum `t`
    (unsigned, wrapping): the bias, then the requantization and clamp (or, with `dequantize`, the float32 scale);
    with a fused residual, the add of the skip tensor. `hoisted`: the column's values are `column_values`'s and the
    row's offsets `row_offsets`'s, declared by the caller once per column and row."""
    spec = k.spec
    out = k.outs[0]
    residual = getattr(spec, "residual", None)
    if hoisted:
        at = f"npu_orow + c * {out.strides[1]}"
        skip_at = f"npu_srow + c * {k.args[-1].strides[1]}" if residual is not None else ""
        values = {"bias": "npu_bias", "scale": "npu_scale", "m": "npu_m", "n": "npu_n"}
    else:
        at = output_at(spec, out)
        skip_at = output_at(spec, k.args[-1]) if residual is not None else ""
        values = _column_refs(k)
    lines: list[str] = []
    if spec.dequantize:
        lines.append(f"float y = __fmul_rn(__int2float_rn((int)t), {values['scale']});")
        if spec.bias:
            lines.append(f"y = __fadd_rn(y, {values['bias']});")
        lines.append(f"out0[{at}] = {store_expr(dtype_of(program, out), 'y', 'float32')};")
        return lines
    lines += requant_value(k, values)
    value = "npu_q"
    if residual is not None:  # the fused add: this result (a) and the skip tensor (b, the last argument)
        value = qadd_call(residual, "npu_q", f"(int)a{len(k.args) - 1}[{skip_at}]", spec.requant.zero_point)
    lines.append(f"out0[{at}] = ({storage(dtype_of(program, out))}){value};")
    return lines


def requant_value(k: KernelCall, values: dict[str, str] | None = None) -> list[str]:
    """Statements declaring `npu_q`, the requantized (clamped) result of the corrected sum `t` plus the bias, the
    column's values as `values` names them (default: those of `column_values`)."""
    spec = k.spec
    values = values or {"bias": "npu_bias", "m": "npu_m", "n": "npu_n"}
    q = spec.requant
    dbl = "true" if q.rounding == "double" else "false"
    return ([f"t += (unsigned){values['bias']};"] if spec.bias else []) + [
        f"const int npu_q = npu_requant((long long)(int)t, {values['m']}, {values['n']}, {q.zero_point}, {q.lo}, "
        f"{q.hi}, {dbl});"]


def residual_value(k: KernelCall, a: str, b: str) -> str:
    """The fused residual add of the conv's requantized result `a` and the skip tensor's code `b`."""
    return qadd_call(k.spec.residual, a, b, k.spec.requant.zero_point)


def _column_refs(k: KernelCall) -> dict[str, str]:
    """The loads of column c's bias, float scale, multiplier and shift (those the record has)."""
    spec = k.spec
    sref = k.args[spec.scale_arg]
    ch = "c" if spec.channels > 1 else "0"
    s = f"a{spec.scale_arg}"
    out = {}
    if spec.bias:
        bias = k.args[2]
        out["bias"] = f"a2[{affine([('c', bias.strides[0])], bias.offset)}]"
    if spec.dequantize:
        out["scale"] = f"{s}[{affine([(ch, sref.strides[0])], sref.offset)}]"
    else:
        out["m"] = f"{s}[{affine([(ch, sref.strides[0])], sref.offset)}]"
        out["n"] = f"{s}[{affine([(ch, sref.strides[0])], sref.offset + sref.strides[1])}]"
    return out


def column_values(k: KernelCall, program: CompiledProgram) -> str:
    """Declarations of column c's epilogue values, for `requant_store(..., hoisted=True)`."""
    bias = storage(dtype_of(program, k.args[2])) if k.spec.bias else ""
    types = {"bias": bias, "scale": "float", "m": "int", "n": "int"}
    return " ".join(f"const {types[name]} npu_{name} = {load};" for name, load in _column_refs(k).items())


def row_offsets(k: KernelCall, ityp: str) -> tuple[str, ...]:
    """Expressions of row r's offsets in the output and (with a fused residual) the skip tensor, without the
    column's term: `npu_orow` and `npu_srow` of `requant_store(..., hoisted=True)`."""
    refs = [k.outs[0]] + ([k.args[-1]] if getattr(k.spec, "residual", None) is not None else [])
    return tuple(output_at(k.spec, dataclasses.replace(r, strides=(*r.strides[:1], 0, *r.strides[2:])))
                 if isinstance(k.spec, QConv2dKernel) else
                 output_at(k.spec, dataclasses.replace(r, strides=(r.strides[0], 0))) for r in refs)


def output_at(spec, ref: TensorRef) -> str:
    """The element of output (row r, column c) in `ref` (a qgemm's [M, N], a qconv2d's [N, O, Ho, Wo])."""
    if isinstance(spec, QGemmKernel):
        return affine([("r", ref.strides[0]), ("c", ref.strides[1])], ref.offset)
    ho, wo = ref.shape[2], ref.shape[3]
    return affine([("(r / " + str(ho * wo) + ")", ref.strides[0]), ("c", ref.strides[1]),
                   (f"((r % {ho * wo}) / {wo})", ref.strides[2]), (f"(r % {wo})", ref.strides[3])], ref.offset)


NARROW_LEFT_SHIFT = 21  # (a - za) << ls within 31 bits for |a - za| <= 510, and the sum of two such within 32


def qadd_call(spec, a: str, b: str, a_zero_point: int) -> str:
    """The C call adding codes `a` and `b` by a QAddKernel's or a ResidualAdd's fields: in 32-bit values where the
    fields keep every one within 32 bits (`npu_qadd_narrow`), else in 64-bit ones wrapping as the reference's."""
    q = spec.requant
    dbl = "true" if q.rounding == "double" else "false"
    narrow = (spec.left_shift <= NARROW_LEFT_SHIFT and spec.a_multiplier < (1 << spec.a_shift)
              and spec.b_multiplier < (1 << spec.b_shift))
    return (f"npu_qadd{'_narrow' if narrow else ''}({a}, {b}, {a_zero_point}, {spec.b_zero_point}, {spec.left_shift}, "
            f"{spec.a_multiplier}, "
            f"{spec.a_shift}, {spec.b_multiplier}, {spec.b_shift}, {spec.out_multiplier}, {spec.out_shift}, "
            f"{q.zero_point}, {q.lo}, {q.hi}, {dbl})")
