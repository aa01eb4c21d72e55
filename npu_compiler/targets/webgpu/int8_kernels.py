"""WGSL for the integer kinds (`qgemm`, `qconv2d`, `qadd`) and the weight-only GEMM (`wgemm`).

The CPU reference (`kernels/qgemm.py`, `qconv2d.py`, `qadd.py`, `requant.py`, `quant/fixed_point.py`) is the spec:
every integer result here equals it bit for bit. Sums are i32 (WGSL's i32 arithmetic wraps, as the reference's
`wrap_int32` does); requantization is TOSA's `apply_scale_32` with a 64-bit product and an arithmetic shift of up to
62 bits, which WGSL (no 64-bit integers) computes on (low, high) `vec2<u32>` pairs (`I64_HELPERS`): every product
and sum there wraps modulo 2^64 exactly as the reference's int64 NumPy arithmetic does, so even a `qadd` whose
pre-shifted inputs leave int32 matches.

Where the adapter has WGSL's `packed_4x8_integer_dot_product` language feature (`DeviceCaps.packed_dot`) and both
operands of a `qgemm` are contiguous along K in whole words, four products at a time are `dot4I8Packed` of the raw
words (uint8 activations made signed by flipping each byte's top bit, the zero point moved by 128); the zero points
are applied once per output as sum corrections (sum (a - za)(b - zb) = sum ab - zb sum a - za sum b + K za zb, exact
modulo 2^32). Otherwise each product is one i32 multiply of elements read through the `ld_` accessors.
"""

from __future__ import annotations

from ...errors import NPUCompileError
from ...kernels import QAddKernel, QConv2dKernel, QGemmKernel, WGemmKernel
from ...program import CompiledProgram, KernelCall, TensorRef
from ..clike import ExprRenderer, KernelText, Launch, Scope, affine, decompose, ptrs_of
from .language import WGSL, entry_point, reg

THREADS = 128  # invocations per workgroup: one output element (or one output of a GEMV row) each
WGEMM_THREADS = 64  # a wgemm output's K split over a workgroup, the partial sums added through workgroup memory

# Signed 64-bit integers as vec2<u32>(low, high), two's complement; every operation wraps modulo 2^64.
I64_HELPERS = """
fn i64_from(v: i32) -> vec2<u32> { return vec2<u32>(u32(v), u32(v >> 31u)); }
fn i64_add(x: vec2<u32>, y: vec2<u32>) -> vec2<u32> {
  let lo = x.x + y.x;
  return vec2<u32>(lo, x.y + y.y + select(0u, 1u, lo < x.x));
}
fn u32_mul_wide(a: u32, b: u32) -> vec2<u32> {
  let a0 = a & 0xffffu; let a1 = a >> 16u; let b0 = b & 0xffffu; let b1 = b >> 16u;
  let p00 = a0 * b0; let p01 = a0 * b1; let p10 = a1 * b0; let p11 = a1 * b1;
  let mid = p01 + (p00 >> 16u);
  let mid2 = (mid & 0xffffu) + p10;
  return vec2<u32>((p00 & 0xffffu) | (mid2 << 16u), p11 + (mid >> 16u) + (mid2 >> 16u));
}
fn i64_mul_u32(x: vec2<u32>, m: u32) -> vec2<u32> {
  let p = u32_mul_wide(x.x, m);
  return vec2<u32>(p.x, p.y + x.y * m);
}
fn i64_shl(x: vec2<u32>, n: u32) -> vec2<u32> {
  if (n == 0u) { return x; }
  return vec2<u32>(x.x << n, (x.y << n) | (x.x >> (32u - n)));
}
fn i64_sar(x: vec2<u32>, n: u32) -> vec2<u32> {
  if (n == 0u) { return x; }
  if (n < 32u) { return vec2<u32>((x.x >> n) | (x.y << (32u - n)), u32(i32(x.y) >> n)); }
  return vec2<u32>(u32(i32(x.y) >> (n - 32u)), u32(i32(x.y) >> 31u));
}
fn i64_clamp(x: vec2<u32>, lo: i32, hi: i32) -> i32 {
  if (x.y == u32(i32(x.x) >> 31u)) { return clamp(i32(x.x), lo, hi); }
  return select(hi, lo, i32(x.y) < 0);
}
// TOSA's apply_scale_32 on a 64-bit value: (v * m + round) >> n, round = 2^(n-1) (n > 0), double rounding adding
// +-2^30 where n > 31 (the sign of v)
fn npu_apply_scale(v: vec2<u32>, m: i32, n: i32, double_round: bool) -> vec2<u32> {
  var r = vec2<u32>(0u, 0u);
  if (n > 0 && n <= 32) { r = vec2<u32>(1u << u32(n - 1), 0u); }
  if (n > 32) { r = vec2<u32>(0u, 1u << u32(n - 33)); }
  if (double_round && n > 31) {
    r = i64_add(r, select(vec2<u32>(0x40000000u, 0u), vec2<u32>(0xc0000000u, 0xffffffffu), i32(v.y) < 0));
  }
  return i64_sar(i64_add(i64_mul_u32(v, u32(m)), r), u32(n));
}
fn npu_requant(v: vec2<u32>, m: i32, n: i32, zp: i32, lo: i32, hi: i32, double_round: bool) -> i32 {
  return i64_clamp(i64_add(npu_apply_scale(v, m, n, double_round), i64_from(zp)), lo, hi);
}
"""


def _dt(program: CompiledProgram, ref: TensorRef) -> str:
    return program.buffers[ref.buffer].dtype


def _grid(total: int, threads: int) -> tuple[int, int, int]:
    return (min(-(-total // threads), WGSL.max_grid), 1, 1) if total else (0, 1, 1)


def _each_output(total: int, out: TensorRef, body: list[str]) -> list[str]:
    """A grid-stride loop over the output's elements: `o0..` its indices, `oat` its element index, then `body`."""
    lines = [f"  for (var npu_i: i32 = npu_bid * NPU_BLOCK + npu_tid; npu_i < {total}; "
             "npu_i += npu_nwg * NPU_BLOCK) {"]
    lines += decompose(WGSL, "npu_i", tuple(out.shape), "o", "i32", "    ")
    lines.append(f"    let oat = {affine([(f'o{d}', s) for d, s in enumerate(out.strides)], out.offset)};")
    return lines + body + ["  }"]


def _epilogue(spec, k: KernelCall, program: CompiledProgram, channel: str) -> list[str]:
    """Lines from the i32 sum `acc` of output channel `channel` to the store at `oat`: the int32 bias and the
    requantization (or, dequantizing, f32(acc) * scale + bias rounded as the reference's two float32 steps)."""
    bias = _at(k.args[2], channel) if spec.bias else None
    sref = k.args[spec.scale_arg]
    s = f"a{spec.scale_arg}"
    ch = channel if spec.channels > 1 else "0"
    if spec.dequantize:
        lines = [f"    var y = npu_mul(f32(acc), ld_{s}({_at(sref, ch)}));"]
        if bias:
            lines.append(f"    y = y + ld_a2({bias});")
        return lines + ["    st_out0(oat, y);"]
    q = spec.requant
    lines = [f"    let tot = acc + ld_a2({bias});"] if bias else ["    let tot = acc;"]
    mult, shift = _at(sref, ch), _at(sref, ch, 1)
    return lines + [f"    st_out0(oat, npu_requant(i64_from(tot), ld_{s}({mult}), ld_{s}({shift}), {q.zero_point}, "
                    f"{q.lo}, {q.hi}, {'true' if q.rounding == 'double' else 'false'}));"]


def _at(ref: TensorRef, index: str, column: int | None = None) -> str:
    """The element index of `ref[index]` (a vector) or `ref[index, column]` (the (M, n) rows)."""
    terms = [(index, ref.strides[0])]
    return affine(terms, ref.offset + (column * ref.strides[1] if column else 0))


def _packed(k: KernelCall, program: CompiledProgram, packed_dot: bool, max_binding: int) -> bool:
    """Whether a qgemm's sums can be dot4I8Packed of whole words: both operands' K contiguous, every row and offset
    on a word boundary, K a multiple of 4, and neither operand split across bindings (checked by the accessors)."""
    spec: QGemmKernel = k.spec
    a, b = k.args[0], k.args[1]
    return (packed_dot and not spec.batch and spec.k % 4 == 0 and a.strides[-1] == 1 and b.strides[-2] == 1
            and a.offset % 4 == 0 and b.offset % 4 == 0 and a.strides[-2] % 4 == 0 and b.strides[-1] % 4 == 0
            and _dt(program, b) == "int8"
            and all(program.buffers[r.buffer].nbytes <= max_binding for r in (a, b)))


def qgemm(k: KernelCall, program: CompiledProgram, packed_dot: bool = False, max_binding: int = 0
          ) -> tuple[str, Launch]:
    spec: QGemmKernel = k.spec
    a, b, out = k.args[0], k.args[1], k.outs[0]
    nb = len(spec.batch)
    m_dim, n_dim = f"o{nb}", f"o{nb + 1}"
    at_a = affine([(f"o{d}", a.strides[d]) for d in range(nb)] + [(m_dim, a.strides[-2]), ("kk", a.strides[-1])],
                  a.offset)
    at_b = affine([(f"o{d}", b.strides[d]) for d in range(nb)] + [("kk", b.strides[-2]), (n_dim, b.strides[-1])],
                  b.offset)
    if _packed(k, program, packed_dot, max_binding):
        flip = "0x80808080u" if _dt(program, a) == "uint8" else "0u"
        za = spec.a_zero_point - (128 if _dt(program, a) == "uint8" else 0)
        wa = affine([(m_dim, a.strides[-2] // 4), ("kw", 1)], a.offset // 4)
        wb = affine([(n_dim, b.strides[-1] // 4), ("kw", 1)], b.offset // 4)
        body = ["    var acc = 0i;", "    var sa = 0i;", "    var sb = 0i;",
                f"    for (var kw: i32 = 0; kw < {spec.k // 4}; kw++) {{",
                f"      let wa = ldw_a0({wa}) ^ {flip};", f"      let wb = ldw_a1({wb});",
                "      acc += dot4I8Packed(wa, wb);", "      sa += dot4I8Packed(wa, 0x01010101u);",
                "      sb += dot4I8Packed(wb, 0x01010101u);", "    }",
                f"    acc = acc - {spec.b_zero_point}i * sa - {za}i * sb + {spec.k * za * spec.b_zero_point}i;"]
    else:
        body = ["    var acc = 0i;", f"    for (var kk: i32 = 0; kk < {spec.k}; kk++) {{",
                f"      acc += (ld_a0({at_a}) - {spec.a_zero_point}i) * (ld_a1({at_b}) - {spec.b_zero_point}i);",
                "    }"]
    body += _epilogue(spec, k, program, n_dim)
    total = out.numel
    src = I64_HELPERS + entry_point(THREADS, _each_output(total, out, body))
    return src, Launch(_grid(total, THREADS), THREADS, ptrs_of(k))


def qconv2d(k: KernelCall, program: CompiledProgram) -> tuple[str, Launch]:
    """One invocation per output element, its window's products summed in i32; padding reads nothing (the input's
    zero point: a real 0 after the subtraction)."""
    spec: QConv2dKernel = k.spec
    if spec.residual is not None:  # (the lowering fuses an add into a conv only for targets that compute it)
        raise NPUCompileError(f"kernel {k.name}: the webgpu target's qconv2d computes no fused residual add")
    x, w, out = k.args[0], k.args[1], k.outs[0]
    _, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    og = o // spec.groups
    (sh, sw), (ph, pw), (dh, dw) = spec.stride, spec.padding, spec.dilation
    at_x = affine([("o0", x.strides[0]), ("ci", x.strides[1]), ("ih", x.strides[2]), ("iw", x.strides[3])], x.offset)
    at_w = affine([("o1", w.strides[0]), ("cc", w.strides[1]), ("r", w.strides[2]), ("s", w.strides[3])], w.offset)
    body = ["    var acc = 0i;", f"    let c0 = (o1 / {og}) * {cg};",
            f"    for (var cc: i32 = 0; cc < {cg}; cc++) {{", "      let ci = c0 + cc;",
            f"      for (var r: i32 = 0; r < {kh}; r++) {{", f"        let ih = o2 * {sh} - {ph} + r * {dh};",
            f"        if (ih < 0 || ih >= {h}) {{ continue; }}",
            f"        for (var s: i32 = 0; s < {kw}; s++) {{", f"          let iw = o3 * {sw} - {pw} + s * {dw};",
            f"          if (iw < 0 || iw >= {wd}) {{ continue; }}",
            f"          acc += (ld_a0({at_x}) - {spec.x_zero_point}i) * ld_a1({at_w});",
            "        }", "      }", "    }"]
    body += _epilogue(spec, k, program, "o1")
    del c
    total = out.numel
    src = I64_HELPERS + entry_point(THREADS, _each_output(total, out, body))
    return src, Launch(_grid(total, THREADS), THREADS, ptrs_of(k))


def qadd(k: KernelCall, program: CompiledProgram) -> tuple[str, Launch]:
    """TFLite's int8 ADD, in the reference's 64-bit arithmetic."""
    spec: QAddKernel = k.spec
    a, b, out = k.args[0], k.args[1], k.outs[0]
    q = spec.requant
    dbl = "true" if q.rounding == "double" else "false"
    at_a = affine([(f"o{d}", s) for d, s in enumerate(a.strides)], a.offset)
    at_b = affine([(f"o{d}", s) for d, s in enumerate(b.strides)], b.offset)
    body = [f"    let va = i64_shl(i64_from(ld_a0({at_a}) - {spec.a_zero_point}i), {spec.left_shift}u);",
            f"    let vb = i64_shl(i64_from(ld_a1({at_b}) - {spec.b_zero_point}i), {spec.left_shift}u);",
            f"    let sa = npu_apply_scale(va, {spec.a_multiplier}i, {spec.a_shift}i, {dbl});",
            f"    let sb = npu_apply_scale(vb, {spec.b_multiplier}i, {spec.b_shift}i, {dbl});",
            f"    st_out0(oat, npu_requant(i64_add(sa, sb), {spec.out_multiplier}i, {spec.out_shift}i, "
            f"{q.zero_point}, {q.lo}, {q.hi}, {dbl}));"]
    total = out.numel
    src = I64_HELPERS + entry_point(THREADS, _each_output(total, out, body))
    return src, Launch(_grid(total, THREADS), THREADS, ptrs_of(k))


def wgemm(k: KernelCall, program: CompiledProgram) -> tuple[str, Launch]:
    """One workgroup per output element (decode's GEMV: every weight byte read once), its invocations striding over
    K, each weight decoded to f32 in registers (int8 x scale[n]; int4 (code - zero) x scale[n, k / G]), the partial
    sums added through workgroup memory; f32 throughout, rounded once to the output dtype at the store. With column
    groups (`acc_groups`: SiLU(gate) * up) the workgroup sums each group's row of its column in turn; the epilogue (a
    residual add) reads each sum rounded to the output dtype, as the record's `Acc`. A prologue (a norm) is not
    folded on this target (`wgemm_prologue`): its norm runs as a kernel of its own before."""
    spec: WGemmKernel = k.spec
    a, q, out = k.args[0], k.args[1], k.outs[0]
    if spec.batch or spec.prologue is not None:
        raise NPUCompileError(f"kernel {k.name}: the webgpu target's wgemm takes no batch dims and computes no "
                              "prologue")
    od = _dt(program, out)
    at_a = affine([("o0", a.strides[0]), ("kk", a.strides[1])], a.offset)
    T = WGEMM_THREADS
    if spec.bits == 8:
        qat = affine([("row", q.strides[0]), ("kk", q.strides[1])], q.offset)
        s_ref = k.args[2]
        decode = f"npu_mul(f32(ld_a1({qat})), ld_a2({affine([('row', s_ref.strides[0])], s_ref.offset)}))"
    else:
        qat = affine([("row", q.strides[0]), ("(kk >> 1)", q.strides[1])], q.offset)
        s_ref, z_ref = k.args[2], k.args[3]
        g = f"(kk / {spec.group})"
        s_at = affine([("row", s_ref.strides[0]), (g, s_ref.strides[1])], s_ref.offset)
        z_at = affine([("row", z_ref.strides[0]), (g, z_ref.strides[1])], z_ref.offset)
        decode = (f"npu_mul(f32(((ld_a1({qat}) >> (u32(kk & 1) * 4u)) & 15) - ld_a3({z_at})), ld_a2({s_at}))")
    bias = spec.first_epilogue_arg - 1 if spec.bias else None
    n_out = spec.out_n
    at_bias = affine([("row", k.args[bias].strides[0])], k.args[bias].offset) if bias is not None else ""
    body = [f"  for (var npu_i: i32 = npu_bid; npu_i < {out.numel}; npu_i += npu_nwg) {{",
            f"    let o0 = npu_i / {n_out};", f"    let o1 = npu_i % {n_out};"]
    for grp in range(spec.acc_groups):
        body += ["    {", f"      let row = o1 + {grp * n_out};", "      var p = 0.0f;",
                 f"      for (var kk: i32 = npu_tid; kk < {spec.k}; kk += {T}) {{",
                 f"        p = p + npu_mul(ld_a0({at_a}), {decode});", "      }",
                 "      workgroupBarrier();", "      npu_part[npu_tid] = p;", "      workgroupBarrier();",
                 "      if (npu_tid == 0) {",
                 f"        for (var t: i32 = 0; t < {T}; t++) {{ npu_v[{grp}] = npu_v[{grp}] + npu_part[t]; }}",
                 *([f"        npu_v[{grp}] = npu_v[{grp}] + ld_a{bias}({at_bias});"] if bias is not None else []),
                 "      }", "    }"]
    at_o = affine([("o0", out.strides[0]), ("o1", out.strides[1])], out.offset)
    finish = ["    if (npu_tid == 0) {"]
    if spec.epilogue is None:
        finish.append(f"      st_out0({at_o}, npu_v[0]);")
    else:
        accs = [f"acc{g}" for g in range(spec.acc_groups)]
        finish += [f"      let {acc}: {reg(od)} = {WGSL.cast(f'npu_v[{g}]', 'float32', od)};"
                   for g, acc in enumerate(accs)]
        r = ExprRenderer(WGSL, KernelText([], 0), [f"a{i}" for i in range(len(k.args))],
                         [_dt(program, x) for x in k.args], tuple(out.shape), "i32",
                         acc=accs if spec.acc_groups > 1 else accs[0], prefix="ep_")
        scope = Scope("      ")
        value = r.emit(spec.epilogue, scope)
        finish += scope.lines
        finish.append("      " + WGSL.store("out0", at_o, od, value, spec.epilogue.dtype))
    body += [*finish, f"      for (var g: i32 = 0; g < {spec.acc_groups}; g++) {{ npu_v[g] = 0.0f; }}", "    }",
             "  }"]
    body.insert(0, f"  var npu_v: array<f32, {spec.acc_groups}>;")
    src = entry_point(T, body, {"npu_part": ("f32", T)})
    return src, Launch((min(out.numel, WGSL.max_grid), 1, 1) if out.numel else (0, 1, 1), T, ptrs_of(k))


def render_integer(k: KernelCall, program: CompiledProgram, packed_dot: bool = False, max_binding: int = 0
                   ) -> tuple[str, Launch]:
    """The WGSL of one integer or weight-only kernel (`qgemm`, `qconv2d`, `qadd`, `wgemm`)."""
    for ref in (*k.args, *k.outs):
        WGSL.index_type(program.buffers[ref.buffer].numel)
    if k.kind == "qgemm":
        return qgemm(k, program, packed_dot, max_binding)
    if k.kind == "qconv2d":
        return qconv2d(k, program)
    if k.kind == "qadd":
        return qadd(k, program)
    if k.kind == "wgemm":
        if reg(_dt(program, out := k.outs[0])) != "f32":
            raise NPUCompileError(f"kernel {k.name}: a wgemm into {_dt(program, out)}")
        return wgemm(k, program)
    raise NPUCompileError(f"kernel {k.name}: the webgpu target has no '{k.kind}' kernel")


INTEGER_KERNELS = frozenset({"qgemm", "qconv2d", "qadd", "wgemm"})

__all__ = ["INTEGER_KERNELS", "I64_HELPERS", "render_integer"]
