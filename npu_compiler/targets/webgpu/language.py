"""WGSL for the renderer base: what the webgpu target's generated and library kernels are written in.

Registers: every float computes in `f32`, every integer in `i32`, bools as `bool`. WGSL has no 64-bit types:
- float64 is refused (no kernel of the webgpu target computes in it);
- int64 values are narrowed to i32. Data entering the device is range-checked on the host (inputs, weights,
  constants); arithmetic whose result is int64 (+, -, *, negation, abs, powers, sums, float-to-int casts) goes
  through checked helpers that record the kernel in a status word when a value leaves the int32 range, and the
  runtime reports it after the run. Narrower integer dtypes wrap as ATen's do (i32 arithmetic is exact modulo 2^32).
Storage is each buffer's own dtype (see `bindings.py`): loads widen to the register type and stores narrow, halves
rounding to nearest even in integer arithmetic (WGSL leaves the rounding of its f32-to-f16 conversion to the
implementation; bf16 has no WGSL type at all).

Precision: WGSL allows inexact transcendental builtins (tanh inherits sinh/cosh's error, sin/cos are bounded only
in absolute terms inside [-pi, pi]), division within 2.5 ulp, and has no erf. tanh and erf are polynomials fitted for
this renderer (max error 1.6e-7 relative, 1.5e-7 absolute, measured in f32); sin and cos reduce their argument
exactly first; division is the device's where it is correctly rounded and corrected otherwise (`DIVISION`). NaN and
infinity are tested on the bits, which no compiler may fold. docs/webgpu.md has the whole list.
"""

from __future__ import annotations

import math
import re

import numpy as np

from ...errors import NPUCompileError
from ..clike import KernelText, Language

KERNEL_NAME = "npu_kernel"
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INF_F = "bitcast<f32>(0x7f800000u)"
NEG_INF_F = "bitcast<f32>(0xff800000u)"
NAN_F = "bitcast<f32>(0x7fc00000u)"
I32_MIN = "i32(-2147483648)"

FLOAT_REG = ("float32", "float16", "bfloat16")
INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8")


def reg(dtype: str) -> str:
    """The register type a value of `dtype` computes in."""
    if dtype in FLOAT_REG:
        return "f32"
    if dtype == "bool":
        return "bool"
    if dtype in INT_DTYPES:
        return "i32"
    if dtype == "float64":
        raise NPUCompileError("webgpu target: WGSL has no float64; compile the model in float32, float16 or bfloat16")
    raise NPUCompileError(f"webgpu target: no register type for dtype {dtype!r}")


def f32_literal(value: float) -> str:
    """An exact WGSL literal of `value` rounded to f32."""
    f = float(np.float32(value))
    if math.isnan(f):
        return NAN_F
    if math.isinf(f):
        return INF_F if f > 0 else NEG_INF_F
    if f == 0:
        return "(-0.0f)" if math.copysign(1, f) < 0 else "0.0f"
    mant, _, exp = f.hex().partition("p")
    mant = mant.rstrip("0")
    if mant.endswith("."):
        mant += "0"
    return f"({mant}p{exp}f)" if mant.startswith("-") else f"{mant}p{exp}f"


def i32_literal(value: int) -> str:
    v = int(value)
    if not INT32_MIN <= v <= INT32_MAX:
        raise NPUCompileError(f"webgpu target: the integer constant {v} is outside the int32 range that WGSL "
                              "computes integers in")
    if v == INT32_MIN:
        return I32_MIN
    return f"({v}i)" if v < 0 else f"{v}i"


# ---- helper functions, included in a shader only when its text names them ---------------------------------------
# name -> WGSL source. A helper may call others; `helpers_for` closes over those references.
HELPERS: dict[str, str] = {
    "npu_isnan": "fn npu_isnan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }",
    # NaN-propagating max/min (torch.maximum/minimum and relu propagate NaN)
    "npu_max_f": "fn npu_max_f(a: f32, b: f32) -> f32 { return select(b, a, a > b || npu_isnan(a)); }",
    "npu_min_f": "fn npu_min_f(a: f32, b: f32) -> f32 { return select(b, a, a < b || npu_isnan(a)); }",
    # bf16 <-> f32: widening is exact (the 16 bits are the top of an f32); narrowing rounds to nearest even
    "npu_bf16_bits": """fn npu_bf16_bits(x: f32) -> u32 {
  let u = bitcast<u32>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) { return (u >> 16u) | 0x40u; }
  return (u + 0x7fffu + ((u >> 16u) & 1u)) >> 16u;
}""",
    "npu_bf16_f32": "fn npu_bf16_f32(h: u32) -> f32 { return bitcast<f32>(h << 16u); }",
    "npu_round_bf16": "fn npu_round_bf16(x: f32) -> f32 { return bitcast<f32>(npu_bf16_bits(x) << 16u); }",
    # f16 <-> f32 in integer arithmetic: exact widening (subnormals included) and round-to-nearest-even narrowing
    "npu_f16_f32": """fn npu_f16_f32(h: u32) -> f32 {
  let s = (h & 0x8000u) << 16u;
  let e = (h >> 10u) & 0x1fu;
  let m = h & 0x3ffu;
  if (e == 0x1fu) { return bitcast<f32>(s | 0x7f800000u | (m << 13u)); }
  if (e == 0u) { return bitcast<f32>(s | bitcast<u32>(f32(m) * 5.9604644775390625e-8f)); }
  return bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
}""",
    "npu_f16_bits": """fn npu_f16_bits(x: f32) -> u32 {
  let u = bitcast<u32>(x);
  let s = (u >> 16u) & 0x8000u;
  let a = u & 0x7fffffffu;
  if (a > 0x7f800000u) { return s | 0x7e00u; }
  if (a >= 0x477ff000u) { return s | 0x7c00u; }
  if (a >= 0x38800000u) { return s | ((a + 0x0fffu + ((a >> 13u) & 1u) - 0x38000000u) >> 13u); }
  let e = a >> 23u;
  if (e < 102u) { return s; }
  let m = (a & 0x7fffffu) | 0x800000u;
  let sh = 126u - e;
  let q = m >> sh;
  let rem = m & ((1u << sh) - 1u);
  let half = 1u << (sh - 1u);
  return s | (q + select(0u, 1u, rem > half || (rem == half && (q & 1u) == 1u)));
}""",
    "npu_round_f16": "fn npu_round_f16(x: f32) -> f32 { return npu_f16_f32(npu_f16_bits(x)); }",
    # int -> f32 rounding to nearest even (WGSL leaves the direction of an inexact conversion open): two exact parts
    # and one correctly rounded addition
    "npu_i2f": "fn npu_i2f(x: i32) -> f32 { return f32(x >> 8u) * 256.0f + f32(x & 255i); }",
    "npu_log": """fn npu_log(x: f32) -> f32 {
  if (x == 0.0f) { return bitcast<f32>(0xff800000u); }
  if (x < 0.0f) { return bitcast<f32>(0x7fc00000u); }
  return log(x);
}""",
    "npu_sqrt": "fn npu_sqrt(x: f32) -> f32 { return select(sqrt(x), bitcast<f32>(0x7fc00000u), x < 0.0f); }",
    "npu_exp": """fn npu_exp(x: f32) -> f32 {
  if (x > 88.72284f) { return bitcast<f32>(0x7f800000u); }
  if (x < -103.97209f) { return 0.0f; }
  return exp(x);
}""",
    "npu_tanh": """fn npu_tanh(x: f32) -> f32 {
  let a = abs(x);
  if (npu_isnan(x)) { return x; }
  if (a < 0.625f) {
    let u = x * x;
    return x * (0x1.0p+0f + u * (-0x1.555554p-2f + u * (0x1.111066p-3f + u * (-0x1.b9eefep-5f + u * (
      0x1.6391c4p-6f + u * (-0x1.0c1818p-7f + u * 0x1.1966c8p-9f))))));
  }
  if (a > 9.0f) { return select(1.0f, -1.0f, x < 0.0f); }
  let r = 1.0f - 2.0f / (exp(2.0f * a) + 1.0f);
  return select(r, -r, x < 0.0f);
}""",
    "npu_erf": """fn npu_erf(x: f32) -> f32 {
  let a = abs(x);
  if (npu_isnan(x)) { return x; }
  if (a < 1.0f) {
    let u = x * x;
    return x * (0x1.20dd76p+0f + u * (-0x1.812740p-2f + u * (0x1.ce2d64p-4f + u * (-0x1.b7ffb6p-6f + u * (
      0x1.543632p-8f + u * (-0x1.a541e2p-11f + u * 0x1.4cc13ep-14f))))));
  }
  if (a > 4.5f) { return select(1.0f, -1.0f, x < 0.0f); }
  let t = 1.0f / (1.0f + 0.5f * a);
  let q = -0x1.43e4ecp+0f + t * (0x1.fd1e18p-1f + t * (0x1.ae894ep-2f + t * (-0x1.f0f3a4p-4f + t * (
    0x1.ddafbap-2f + t * (-0x1.04c736p+0f + t * (0x1.2d8374p-1f + t * (0x1.38138cp-8f + t * -0x1.1f6e08p-4f)))))));
  let r = 1.0f - t * exp(q - a * a);
  return select(r, -r, x < 0.0f);
}""",
    # sin and cos: WGSL bounds its builtins only in absolute terms inside [-pi, pi] (lavapipe's is off by 1.9 at 3e38),
    # so the argument is reduced exactly (Payne-Hanek: the mantissa times a 96-bit window of 2/pi's bits, in 16-bit
    # limbs) to r in [-pi/4, pi/4] and a quadrant, and r goes through fitted polynomials (error < 8e-8)
    "npu_sin_r": """fn npu_sin_r(r: f32) -> f32 {
  let u = r * r;
  return r + r * u * (-0x1.555556p-3f + u * (0x1.11110ep-7f + u * (-0x1.a01422p-13f + u * 0x1.6ddc44p-19f)));
}""",
    "npu_cos_r": """fn npu_cos_r(r: f32) -> f32 {
  let u = r * r;
  return 1.0f - 0.5f * u + u * u * (0x1.555556p-5f + u * (-0x1.6c16c0p-10f + u * (0x1.a01616p-16f + u * (
    -0x1.25387ap-22f))));
}""",
    "npu_reduce": """fn npu_reduce(a: f32) -> vec2<f32> {
  var t = array<u32, 8>(0xa2f9836eu, 0x4e441529u, 0xfc2757d1u, 0xf534ddc0u, 0xdb629599u, 0x3c439041u, 0xfe5163abu,
                        0xdebbc561u);
  let ub = bitcast<u32>(a);
  let e = i32(ub >> 23u) - 150;
  let m = (ub & 0x7fffffu) | 0x800000u;
  let i0 = max(1, e - 1);
  let k = (i0 - 1) / 32;
  let o = u32((i0 - 1) % 32);
  var w = array<u32, 6>();
  for (var j: i32 = 0; j < 3; j++) {
    let hi = t[k + 2 - j];
    let lo = t[k + 3 - j];
    let word = select((hi << o) | (lo >> (32u - o)), hi, o == 0u);
    w[2 * j] = word & 0xffffu;
    w[2 * j + 1] = word >> 16u;
  }
  let m0 = m & 0xffffu;
  let m1 = m >> 16u;
  var p = array<u32, 10>();
  for (var j: i32 = 0; j < 6; j++) {
    let x = m0 * w[j];
    let y = m1 * w[j];
    p[j] += x & 0xffffu;
    p[j + 1] += (x >> 16u) + (y & 0xffffu);
    p[j + 2] += y >> 16u;
  }
  for (var j: i32 = 0; j < 9; j++) {
    p[j + 1] += p[j] >> 16u;
    p[j] = p[j] & 0xffffu;
  }
  let qbit = i0 + 95 - e;
  var q = (p[qbit / 16] >> u32(qbit % 16)) & 1u;
  q = q | (((p[(qbit + 1) / 16] >> u32((qbit + 1) % 16)) & 1u) << 1u);
  var f = array<u32, 2>();
  for (var j: i32 = 0; j < 2; j++) {
    let lo = qbit - 32 * (j + 1);
    let idx = lo / 16;
    let off = u32(lo % 16);
    let low32 = p[idx] | (p[idx + 1] << 16u);
    f[j] = select((low32 >> off) | (p[idx + 2] << (32u - off)), low32, off == 0u);
  }
  q = (q + (f[0] >> 31u)) & 3u;
  let fr = npu_i2f(bitcast<i32>(f[0])) + f32(f[1]) * 0x1.0p-32f;
  return vec2<f32>(fr * 0x1.921fb6p-32f, f32(q));
}""",
    "npu_sin": """fn npu_sin(x: f32) -> f32 {
  let a = abs(x);
  if (!(a <= 0x1.fffffep+127f)) { return bitcast<f32>(0x7fc00000u); }
  if (a < 0.78539816f) { return npu_sin_r(x); }
  let red = npu_reduce(a);
  let q = u32(red.y);
  var v = select(npu_sin_r(red.x), npu_cos_r(red.x), (q & 1u) == 1u);
  v = select(v, -v, q >= 2u);
  return select(v, -v, x < 0.0f);
}""",
    "npu_cos": """fn npu_cos(x: f32) -> f32 {
  let a = abs(x);
  if (!(a <= 0x1.fffffep+127f)) { return bitcast<f32>(0x7fc00000u); }
  if (a < 0.78539816f) { return npu_cos_r(a); }
  let red = npu_reduce(a);
  let q = u32(red.y);
  let v = select(npu_cos_r(red.x), npu_sin_r(red.x), (q & 1u) == 1u);
  return select(v, -v, q == 1u || q == 2u);
}""",
    # pow as C99 defines it at zeros, infinities, NaN and negative bases (WGSL's pow is undefined for x < 0)
    "npu_pow": """fn npu_pow(a: f32, b: f32) -> f32 {
  let inf = bitcast<f32>(0x7f800000u);
  if (b == 0.0f || a == 1.0f) { return 1.0f; }
  if (npu_isnan(a) || npu_isnan(b)) { return bitcast<f32>(0x7fc00000u); }
  let ab = abs(b);
  if (ab == inf) {
    if (a == -1.0f) { return 1.0f; }
    return select(0.0f, inf, (abs(a) > 1.0f) == (b > 0.0f));
  }
  let integral = trunc(b) == b;
  let odd = integral && ab < 16777216.0f && (i32(ab) & 1i) == 1i;
  if (a == 0.0f || abs(a) == inf) {
    let big = (a == 0.0f) == (b < 0.0f);
    let mag = select(0.0f, inf, big);
    return select(mag, -mag, odd && bitcast<i32>(a) < 0i);
  }
  if (a < 0.0f) {
    if (!integral) { return bitcast<f32>(0x7fc00000u); }
    let m = exp2(b * log2(-a));
    return select(m, -m, odd);
  }
  return exp2(b * log2(a));
}""",
    # int64 arithmetic narrowed to i32: the result is exact unless a value leaves the int32 range, which is recorded
    "npu_add_l": """fn npu_add_l(a: i32, b: i32) -> i32 {
  let r = a + b;
  if (((a ^ r) & (b ^ r)) < 0i) { npu_flag(); }
  return r;
}""",
    "npu_sub_l": """fn npu_sub_l(a: i32, b: i32) -> i32 {
  let r = a - b;
  if (((a ^ b) & (a ^ r)) < 0i) { npu_flag(); }
  return r;
}""",
    "npu_mul_l": """fn npu_mul_l(a: i32, b: i32) -> i32 {
  let r = a * b;
  if (a != 0i && ((a == -1i && b == i32(-2147483648)) || r / a != b)) { npu_flag(); }
  return r;
}""",
    "npu_neg_l": """fn npu_neg_l(a: i32) -> i32 {
  if (a == i32(-2147483648)) { npu_flag(); }
  return -a;
}""",
    "npu_abs_l": """fn npu_abs_l(a: i32) -> i32 {
  if (a == i32(-2147483648)) { npu_flag(); }
  return abs(a);
}""",
    # integer division truncates (C and the reference); x / 0 is 0 (NumPy's answer), not WGSL's x
    "npu_div_i": """fn npu_div_i(a: i32, b: i32) -> i32 {
  if (b == 0i) { return 0i; }
  if (b == -1i) { return -a; }
  return a / b;
}""",
    "npu_div_l": """fn npu_div_l(a: i32, b: i32) -> i32 {
  if (b == -1i && a == i32(-2147483648)) { npu_flag(); }
  return npu_div_i(a, b);
}""",
    "npu_ipow_i": """fn npu_ipow_i(a0: i32, e0: i32) -> i32 {
  if (e0 < 0i) { return select(select(0i, select(1i, -1i, (e0 & 1i) == 1i), a0 == -1i), 1i, a0 == 1i); }
  var r = 1i;
  var a = a0;
  var e = e0;
  loop {
    if (e == 0i) { break; }
    if ((e & 1i) == 1i) { r = r * a; }
    e = e >> 1u;
    if (e != 0i) { a = a * a; }
  }
  return r;
}""",
    "npu_ipow_l": """fn npu_ipow_l(a0: i32, e0: i32) -> i32 {
  if (e0 < 0i) { return select(select(0i, select(1i, -1i, (e0 & 1i) == 1i), a0 == -1i), 1i, a0 == 1i); }
  var r = 1i;
  var a = a0;
  var e = e0;
  loop {
    if (e == 0i) { break; }
    if ((e & 1i) == 1i) { r = npu_mul_l(r, a); }
    e = e >> 1u;
    if (e != 0i) { a = npu_mul_l(a, a); }
  }
  return r;
}""",
    # float -> int64: truncation, with NaN and values outside int32 recorded
    "npu_f2l": """fn npu_f2l(x: f32) -> i32 {
  if (!(abs(x) < 2147483648.0f)) { npu_flag(); return 0i; }
  return i32(x);
}""",
}
_NAME = re.compile(r"\bnpu_[A-Za-z0-9_]+\b")


# f32 division. WGSL allows `/` an error of 2.5 ulp; where the device's `/` is not correctly rounded (the runtime
# probes it), quotients are corrected: the exact residual a - q*b of q and of its neighbours (Dekker's product: no
# fma, which WGSL does not promise to fuse and lavapipe does not), stepping to the neighbour whose residual is smaller.
# The correctly rounded quotient is the candidate nearest a/b (a quotient of two floats is never a midpoint), and the
# residual of a candidate within one ulp is exactly representable. The correction runs on the mantissas (frexp: a and b
# scaled into [0.5, 1), the quotient by the same power of two, exactly), so no product can underflow or overflow at
# any exponent; zero, infinite, NaN and subnormal quotients keep the device's. "fused" is the same correction with the
# residual as one fused multiply-add, for a device whose `fma` is fused (measured): a device that fuses also
# contracts the products of Dekker's splitting (NVIDIA's Vulkan driver does), which breaks it. There the quotient
# enters the correction OR-ed with a zero read from a buffer (as PRODUCTS does): NVIDIA's compiler, seeing q = x / 3.0
# and fma(-q, 3.0, x), rewrote the correction and left a quarter of such quotients one ulp off.
DIVISION = {
    "exact": "fn npu_div(a: f32, b: f32) -> f32 { return a / b; }",
    "corrected": "fn npu_div(a: f32, b: f32) -> f32 { return npu_fix_quotient(a, b, a / b); }",
    "fused": "fn npu_div(a: f32, b: f32) -> f32 { "
             "return npu_fix_quotient(a, b, bitcast<f32>(bitcast<u32>(a / b) | npu_zero[0])); }",
}
RESIDUAL = {
    "fused": "fn npu_residual(a: f32, q: f32, b: f32) -> f32 { return fma(-q, b, a); }",
    "corrected": """fn npu_residual(a: f32, q: f32, b: f32) -> f32 {
  let p = q * b;
  let cq = 4097.0f * q;
  let qh = cq - (cq - q);
  let ql = q - qh;
  let cb = 4097.0f * b;
  let bh = cb - (cb - b);
  let bl = b - bh;
  let e = ((qh * bh - p) + qh * bl + ql * bh) + ql * bl;
  return (a - p) - e;
}""",
}
FIX_QUOTIENT = """fn npu_fix_quotient(a: f32, b: f32, q0: f32) -> f32 {
  let aq = abs(q0);
  if (!(aq >= 0x1.0p-126f && aq <= 0x1.fffffep+127f)) { return q0; }
  let fa = frexp(a);
  let fb = frexp(b);
  let sa = fa.fract;
  let sb = fb.fract;
  let e = fa.exp - fb.exp;
  var q = ldexp(q0, -e);
  var r = npu_residual(sa, q, sb);
  for (var it: i32 = 0; it < 4; it++) {
    let up = (r > 0.0f) == (sb > 0.0f);
    let qb = bitcast<u32>(q);
    let qn = bitcast<f32>(select(qb - 1u, qb + 1u, up == (q > 0.0f)));
    let rn = npu_residual(sa, qn, sb);
    if (!(abs(rn) < abs(r))) { break; }
    q = qn;
    r = rn;
  }
  return ldexp(q, e);
}"""


# f32 products of generated kernels. Vulkan (SPIR-V) lets a driver fuse a*b + c into one rounding unless the
# product is marked NoContraction, which WGSL cannot say; the op-by-op reference rounds the product (the cuda target
# compiles with --fmad=false for the same reason). Where the device fuses (the runtime probes it), each product is
# OR-ed with a zero the compiler cannot see (read from a buffer), so it must be rounded before it is added.
PRODUCTS = {
    "plain": "fn npu_mul(a: f32, b: f32) -> f32 { return a * b; }",
    "opaque": "fn npu_mul(a: f32, b: f32) -> f32 { return bitcast<f32>(bitcast<u32>(a * b) | npu_zero[0]); }",
}


def helpers_for(text: str, division: str = "exact", products: str = "plain") -> list[str]:
    """The helper functions `text` calls, with those they call in turn, in a stable order; `division` picks how
    `npu_div` divides ("exact": the device's `/`, "corrected" or "fused": see DIVISION), `products` how `npu_mul`
    multiplies ("plain", "opaque": see PRODUCTS)."""
    table = {**HELPERS, "npu_div": DIVISION[division], "npu_fix_quotient": FIX_QUOTIENT,
             "npu_residual": RESIDUAL.get(division, RESIDUAL["corrected"]), "npu_mul": PRODUCTS[products]}
    need: set[str] = set()
    todo = [m for m in _NAME.findall(text) if m in table]
    while todo:
        name = todo.pop()
        if name in need:
            continue
        need.add(name)
        todo += [m for m in _NAME.findall(table[name]) if m in table and m not in need]
    return [table[n] for n in sorted(need)]


_UNARY_F = {
    "neg": "(-({a}))", "exp": "npu_exp({a})", "log": "npu_log({a})", "sqrt": "npu_sqrt({a})",
    # 1/sqrt (both correctly rounded where the implementation is) rather than inverseSqrt (2 ulp in WGSL)
    "rsqrt": "(1.0f / npu_sqrt({a}))", "sin": "npu_sin({a})", "cos": "npu_cos({a})", "tanh": "npu_tanh({a})",
    "erf": "npu_erf({a})", "abs": "abs({a})", "not": "({a} == 0.0f)", "floor": "floor({a})", "trunc": "trunc({a})",
}
_UNARY_I = {"neg": "(-({a}))", "abs": "abs({a})", "not": "({a} == 0i)", "floor": "{a}", "trunc": "{a}"}
_UNARY_L = {**_UNARY_I, "neg": "npu_neg_l({a})", "abs": "npu_abs_l({a})"}
_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


class WgslLanguage(Language):
    """WGSL compute shaders: one workgroup per `workgroup_id.x`, `NPU_BLOCK` invocations each; block reductions
    through workgroup memory (subgroup operations are an optional feature)."""

    name = "webgpu"
    kernel_name = KERNEL_NAME
    max_grid = 65535  # workgroups per dimension (WebGPU's guaranteed limit); grid-stride loops cover the rest
    block_id, thread_id, block_dim, grid_dim = "npu_bid", "npu_tid", "NPU_BLOCK", "npu_nwg"

    def reg(self, dtype: str) -> str:
        return reg(dtype)

    def storage(self, dtype: str) -> str:
        return reg(dtype)  # what a load yields; the bytes behind it are the bindings' business (bindings.py)

    def index_type(self, extent: int) -> str:
        if extent > INT32_MAX:
            raise NPUCompileError(f"webgpu target: a tensor of {extent} elements is beyond the int32 indices WGSL "
                                  "computes with")
        return "i32"

    def literal(self, value: float | int | bool, dtype: str) -> str:
        r = reg(dtype)
        if r == "bool":
            return "true" if value else "false"
        if r == "i32":
            return i32_literal(value)
        return f32_literal(value)

    def index_literal(self, value: int, ityp: str) -> str:
        return str(value)

    def load(self, arg: str, index: str, dtype: str) -> str:
        return f"ld_{arg}({index})"

    def store(self, out: str, index: str, dtype: str, value: str, value_dtype: str) -> str:
        if reg(value_dtype) != reg(dtype):
            value = self.convert(value, value_dtype, dtype)
        return f"st_{out}({index}, {value});"

    def convert(self, x: str, src: str, dst: str) -> str:
        """A register value of `src` in the register type of `dst`, without rounding to a half dtype (the store
        rounds)."""
        rs, rd = reg(src), reg(dst)
        if rs == rd:
            return x
        if rd == "bool":
            return f"(!({x} == 0.0f))" if rs == "f32" else f"({x} != 0i)"
        if rd == "f32":
            return f"select(0.0f, 1.0f, {x})" if rs == "bool" else f"npu_i2f({x})"
        if rs == "bool":
            return f"select(0i, 1i, {x})"
        return f"npu_f2l({x})" if dst == "int64" else f"i32({x})"

    def cast(self, x: str, src: str, dst: str) -> str:
        """`Cast` semantics (the reference's): halves round through f32, floats to integers truncate, anything to
        bool is `!= 0`; integers stay in the i32 register (no wrap until the store)."""
        v = self.convert(x, src, dst)
        if dst == "float16":
            return f"npu_round_f16({v})"
        if dst == "bfloat16":
            return f"npu_round_bf16({v})"
        return v

    def unary(self, op: str, dtype: str, a: str) -> str:
        r = reg(dtype)
        if r == "bool":
            table = {"not": "(!{a})"}
        else:
            table = _UNARY_F if r == "f32" else (_UNARY_L if dtype == "int64" else _UNARY_I)
        text = table.get(op)
        if text is None:
            raise NPUCompileError(f"webgpu target: primitive '{op}' is not defined for {dtype}")
        return text.format(a=a)

    def binary(self, op: str, dtype: str, a: str, b: str) -> str:
        r = reg(dtype)
        if op in _CMP:
            if r == "bool" and op not in ("eq", "ne"):
                a, b = f"select(0i, 1i, {a})", f"select(0i, 1i, {b})"
            if r == "f32" and op == "ne":
                return f"(!({a} == {b}))"  # naga's `!=` is the ordered comparison: false for NaN, unlike IEEE's
            return f"({a} {_CMP[op]} {b})"
        if op in ("and", "or"):
            if r != "bool":
                a, b = self.convert(a, dtype, "bool"), self.convert(b, dtype, "bool")
            return f"({a} {'&&' if op == 'and' else '||'} {b})"
        if r == "bool":
            if op == "max":
                return f"({a} || {b})"
            if op == "min":
                return f"({a} && {b})"
            raise NPUCompileError(f"webgpu target: primitive '{op}' is not defined for bool")
        if r == "f32":
            if op in ("add", "sub"):
                return f"({a} {'+' if op == 'add' else '-'} {b})"
            if op == "mul":
                return f"npu_mul({a}, {b})"
            if op == "div":
                return f"npu_div({a}, {b})"
            if op in ("max", "min"):
                return f"npu_{op}_f({a}, {b})"
            if op == "pow":
                return f"npu_pow({a}, {b})"
        else:
            wide = dtype == "int64"
            if op in ("add", "sub", "mul"):
                if wide:
                    return f"npu_{op}_l({a}, {b})"
                return f"({a} {'+-*'[('add', 'sub', 'mul').index(op)]} {b})"
            if op == "div":
                return f"npu_div_{'l' if wide else 'i'}({a}, {b})"
            if op in ("max", "min"):
                return f"{op}({a}, {b})"
            if op == "pow":
                return f"npu_ipow_{'l' if wide else 'i'}({a}, {b})"
        raise NPUCompileError(f"webgpu target: no primitive '{op}'")

    def select(self, cond: str, a: str, b: str) -> str:
        return f"select({b}, {a}, {cond})"

    def to_index(self, x: str, ityp: str) -> str:
        return x

    def index_value(self, var: str, ityp: str) -> str:
        return var

    def decl(self, name: str, ty: str, value: str, mutable: bool = False) -> str:
        return f"{'var' if mutable else 'let'} {name}: {ty} = {value};"

    def loop(self, var: str, ty: str, start: str, end: str, step: str) -> str:
        inc = f"{var}++" if step == "1" else f"{var} += {step}"
        return f"for (var {var}: {ty} = {start}; {var} < {end}; {inc}) {{"

    def reduce_init(self, op: str, dtype: str) -> str:
        r = reg(dtype)
        if r not in ("f32", "i32"):
            raise NPUCompileError(f"webgpu target: reduction accumulating in {dtype}")
        if op == "sum":
            return "0.0f" if r == "f32" else "0i"
        if op == "max":
            return NEG_INF_F if r == "f32" else I32_MIN
        raise NPUCompileError(f"webgpu target: unknown reduction '{op}'")

    def combine(self, op: str, dtype: str, acc: str, v: str) -> str:
        r = reg(dtype)
        if op == "sum":
            return f"npu_add_l({acc}, {v})" if dtype == "int64" else f"{acc} + {v}"
        return f"npu_max_f({acc}, {v})" if r == "f32" else f"max({acc}, {v})"

    def block_reduce(self, acc: str, op: str, dtype: str, kernel: KernelText) -> list[str]:
        r = reg(dtype)
        sh = f"npu_sh_{r}"
        kernel.shared[sh] = (r, kernel.block)
        step = self.combine(op, dtype, f"{sh}[npu_tid]", f"{sh}[npu_tid + s]")
        # The leading barrier lets the workgroup reduce again right after a previous reduction read `sh[0]`.
        return ["workgroupBarrier();", f"{sh}[npu_tid] = {acc};", "workgroupBarrier();",
                "for (var s: i32 = NPU_BLOCK / 2; s > 0; s = s / 2) {",
                f"  if (npu_tid < s) {{ {sh}[npu_tid] = {step}; }}", "  workgroupBarrier();", "}",
                f"{acc} = {sh}[0];"]

    def kernel(self, text: KernelText) -> str:
        """The entry point and its workgroup memory; `bindings.finish_source` adds the buffers and helpers."""
        return entry_point(text.block, text.body, text.shared)


# the subgroup builtins an entry point takes with `subgroups=True` (naga's: wgpu's `subgroup` feature, no directive)
SUBGROUP_BUILTINS = (", @builtin(subgroup_id) npu_sg: u32, @builtin(num_subgroups) npu_nsg: u32, "
                     "@builtin(subgroup_invocation_id) npu_sl: u32")


def entry_point(block: int, body: list[str], shared: dict[str, tuple[str, int]] | None = None,
                subgroups: bool = False) -> str:
    lines = [f"var<workgroup> {name}: array<{ty}, {count}>;" for name, (ty, count) in sorted((shared or {}).items())]
    lines += [f"const NPU_BLOCK: i32 = {block};",
              f"@compute @workgroup_size({block})",
              f"fn {KERNEL_NAME}(@builtin(workgroup_id) npu_wid: vec3<u32>, @builtin(local_invocation_id) "
              "npu_lid: vec3<u32>, @builtin(num_workgroups) npu_nwgs: vec3<u32>"
              f"{SUBGROUP_BUILTINS if subgroups else ''}) {{",
              "  let npu_bid = i32(npu_wid.x);",
              "  let npu_tid = i32(npu_lid.x);",
              "  let npu_nwg = i32(npu_nwgs.x);"]
    lines += body
    lines.append("}")
    return "\n".join(lines) + "\n"


WGSL = WgslLanguage()
