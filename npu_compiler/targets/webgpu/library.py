"""WGSL library kernels (GEMM, convolution, attention), rendered per kernel from its record and specialised by its
constants (shapes, strides, offsets, dtypes, flags). Every kernel computes in f32 registers and accumulates in f32
(integer GEMMs in i32, checked where the result is int64); elements are read and written through the `ld_`/`st_`
functions of `bindings.py` (parameters `out<i>` and `a<i>` in the call's order). Epilogues are expressions, rendered
inline by the renderer base. Workgroup grids are capped at 65,535 per dimension; every kernel walks its work in
grid-stride loops, so any size runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import NPUCompileError
from ...kernels import AttentionKernel, Conv2dKernel, GemmKernel, plan_of
from ...program import CompiledProgram, KernelCall, TensorRef
from ..clike import (
    ExprRenderer,
    KernelText,
    Launch,
    Scope,
    affine,
    attention_geometry,
    decompose,
    grid_for,
    max_extent,
    pad4,
    ptrs_of,
)
from .language import NEG_INF_F, WGSL, entry_point, f32_literal, reg
from .words import elems, pieces, rows_in_words, unpack_for

MAX_GRID = WGSL.max_grid


def _dt(program: CompiledProgram, ref: TensorRef) -> str:
    return program.buffers[ref.buffer].dtype


def names_of(k: KernelCall) -> list[str]:
    return [f"out{i}" for i in range(len(k.writes))] + [f"a{i}" for i in range(len(k.args))]


def _check_extent(*refs: TensorRef) -> None:
    WGSL.index_type(max(max_extent(tuple(r.shape), tuple(r.strides), r.offset) for r in refs))


def _tile_product(fma: str) -> str:
    """The inner loop of a 64x64 tile over the 16-deep slices in workgroup memory (`npu_as`, `npu_bs`): each
    invocation's 4x4 outputs accumulate by `fma` (its lines, indented for the loop body)."""
    loads = [f"            let av{i} = npu_as[kq * 64 + tm + {16 * i}];" for i in range(4)]
    loads += [f"            let bv{j} = npu_bs[kq * 65 + tn + {16 * j}];" for j in range(4)]
    return "\n".join(["          for (var kq: i32 = 0; kq < 16; kq++) {", *loads,
                      fma.replace("          c", "            c"), "          }"])


def _load_f32(program: CompiledProgram, ref: TensorRef, name: str, at: str) -> str:
    """A load of `name` at `at` as f32 (an integer operand converted exactly)."""
    return WGSL.convert(WGSL.load(name, at, _dt(program, ref)), _dt(program, ref), "float32")


def _round(x: str, dtype: str) -> str:
    """An f32 value rounded to a half dtype (where the graph stores one), else as is."""
    return WGSL.cast(x, "float32", dtype) if dtype in ("float16", "bfloat16") else x


def epilogue_fn(k: KernelCall, program: CompiledProgram, spec, acc_dtype: str, pres: list[list[str]]) -> str:
    """`fn npu_epi(o0, ..., v0, ..)`: for each value (one, or one a column group of a GEMM's product) its lines of
    `pres` (alpha, bias: they read `v`), then the epilogue expression over `Acc` (each value rounded to the output
    dtype, as the unfused graph stores it) and the store of one output element."""
    out = k.outs[0]
    od = _dt(program, out)
    rank = len(out.shape)
    ar = reg(acc_dtype)
    args = ", ".join([f"o{d}: i32" for d in range(rank)] + [f"v{g}: {ar}" for g in range(len(pres))])
    lines = [f"fn npu_epi({args}) {{", f"  var v: {ar} = v0;"]
    for g, pre in enumerate(pres):
        if g:  # the value before is done: rounded as the graph stores it
            lines += [f"  let acc{g - 1}: {reg(od)} = {WGSL.cast('v', acc_dtype, od)};", f"  v = v{g};"]
        lines += [f"  {ln}" for ln in pre]
    value, value_dtype = "v", acc_dtype
    if spec.epilogue is not None:
        lines.append(f"  let acc{len(pres) - 1}: {reg(od)} = {WGSL.cast('v', acc_dtype, od)};")
        r = ExprRenderer(WGSL, KernelText([], 0), [f"a{i}" for i in range(len(k.args))],
                         [_dt(program, a) for a in k.args], tuple(out.shape), "i32",
                         acc=[f"acc{g}" for g in range(len(pres))], prefix="ep_")
        scope = Scope("  ")
        value = r.emit(spec.epilogue, scope)
        lines += scope.lines
        value_dtype = spec.epilogue.dtype
    at = affine([(f"o{d}", s) for d, s in enumerate(out.strides)], out.offset)
    lines.append("  " + WGSL.store("out0", at, od, value, value_dtype))
    lines.append("}")
    return "\n".join(lines)


def _grid3(*counts: int) -> tuple[int, int, int]:
    if any(c == 0 for c in counts):
        return (0, 1, 1)
    x, y, z = (min(c, MAX_GRID) for c in counts)
    return (x, y, z)


# ---- GEMM ------------------------------------------------------------------------------------------------------------

TILE, TK, THREADS = 64, 16, 256  # 64 x 64 output tiles, K in steps of 16, each invocation 4 x 4 outputs


def gemm(k: KernelCall, program: CompiledProgram) -> tuple[str, Launch]:
    out = k.outs[0]
    _check_extent(*k.args, out)
    if k.spec.acc_groups != 1:
        if not skinny_groups_fit(k.spec, _dt(program, out)):
            raise NPUCompileError(f"kernel {k.name}: the webgpu target runs a gemm whose epilogue combines "
                                  f"{k.spec.acc_groups} column groups only for at most {SKINNY_M} rows times groups, "
                                  f"float output; this one is {k.spec.m} x {k.spec.k} x {k.spec.n}")
        return _gemm_skinny(k, program)
    if reg(_dt(program, out)) == "i32":
        return _gemm_int(k, program)
    if k.spec.m <= SKINNY_M:
        return _gemm_skinny(k, program)
    return _gemm_tiled(k, program)


# A product with this few output rows (a decode step's GEMVs, a conv over a few pixels) leaves most of a 64 x 64 tile
# empty and makes few workgroups: instead each workgroup takes SKINNY_N columns of every row and its invocations
# split K, then one pass through workgroup memory adds the partial sums.
SKINNY_M, SKINNY_N, SKINNY_THREADS = 8, 4, 128


def skinny_groups_fit(spec: GemmKernel, out_dtype: str) -> bool:
    """A GEMM over column groups runs as the skinny kernel, each workgroup with the groups of its columns: its
    partial sums (rows x groups x SKINNY_N x SKINNY_THREADS floats) in WebGPU's 16 KB of workgroup memory."""
    return spec.prologue is None and reg(out_dtype) == "f32" and spec.m * spec.acc_groups <= SKINNY_M


def _skinny_reduce(rows: int, store: str, groups: int = 1) -> str:
    """Lines that add the invocations' partial sums `p{m}_{c}` (column c of the tile's groups x SKINNY_N) through
    workgroup memory and run `store` (WGSL with the placeholders {m}, {j}, {v}: row, column in the tile, the values
    of the column's groups, comma-separated) in invocation m * SKINNY_N + j."""
    T, nv, C = SKINNY_THREADS, rows * SKINNY_N, groups * SKINNY_N
    lines = ["        workgroupBarrier();"]
    lines += [f"        npu_part[{(m * C + c) * T} + npu_tid] = p{m}_{c};" for m in range(rows) for c in range(C)]
    lines += ["        workgroupBarrier();",
              f"        if (npu_tid < {nv}) {{",
              f"          let m = npu_tid / {SKINNY_N};",
              f"          let j = npu_tid % {SKINNY_N};"]
    for g in range(groups):
        lines += [f"          var v{g} = 0.0f;",
                  f"          for (var t: i32 = 0; t < {T}; t++) {{ v{g} = v{g} + "
                  f"npu_part[(m * {C} + {g * SKINNY_N} + j) * {T} + t]; }}"]
    values = ", ".join(f"v{g}" for g in range(groups))
    lines += ["          " + store.replace("{m}", "m").replace("{j}", "j").replace("{v}", values), "        }"]
    return "\n".join(lines)


def column_tiles(spec: GemmKernel, blines: list[str], bases: dict, tiles: int, width: int, tile: str) -> str:
    """The loops of a skinny GEMM: over the batch (workgroups' y, operand bases `abase`, `bbase`), then over tiles of
    `width` output columns (workgroups' x, the first column `n0`), running `tile` (lines indented six) for each."""
    return f"""  for (var tz: i32 = i32(npu_wid.y); tz < {max(spec.batch_count, 1)}; tz += i32(npu_nwgs.y)) {{
{chr(10).join(blines)}
    let abase = {bases['a']};
    let bbase = {bases['b']};
    for (var tx: i32 = i32(npu_wid.x); tx < {tiles}; tx += i32(npu_nwgs.x)) {{
      let n0 = tx * {width};
{tile}
    }}
  }}"""


def _gemm_skinny(k: KernelCall, program: CompiledProgram) -> tuple[str, Launch]:
    """M <= 8: each workgroup computes 4 columns of every row, its invocations striding over K (neighbours read
    neighbouring elements of K, contiguous in a linear layer's weight), then adds the partial sums."""
    spec: GemmKernel = k.spec
    a, b = k.args[0], k.args[1]
    groups = spec.acc_groups
    m, n, kk = spec.m, spec.out_n, spec.k  # n: the output's columns (each with `groups` columns of the product)
    nb = len(spec.batch)
    epi = epilogue_fn(k, program, spec, "float32", [_gemm_pre(k, program, g * n) for g in range(groups)])
    blines, bases = _batch_lines(spec, {"a": a, "b": b}, "tz", "    ")
    sam, sak = a.strides[-2], a.strides[-1]
    sbk, sbn = b.strides[-2], b.strides[-1]
    C = groups * SKINNY_N  # the tile's product columns: column j of the output in each group
    loads = []
    for g in range(groups):
        for j in range(SKINNY_N):
            c = g * SKINNY_N + j
            at = affine([("bbase", 1), ("kk", sbk), (f"(n0 + {j + g * n})", sbn)])
            loads.append(f"          var b{c} = 0.0f;")
            loads.append(f"          if (n0 + {j} < {n}) {{ b{c} = {_load_f32(program, b, 'a1', at)}; }}")
    for i in range(m):
        at = affine([("abase", 1), (str(i), sam), ("kk", sak)]) if sam else affine([("abase", 1), ("kk", sak)])
        loads.append(f"          let x{i} = {_load_f32(program, a, 'a0', at)};")
    fma = [f"          p{i}_{c} = p{i}_{c} + x{i} * b{c};" for i in range(m) for c in range(C)]
    idx = [f"o{d}" for d in range(nb)]
    store = "if (n0 + {j} < " + str(n) + ") { npu_epi(" + ", ".join(idx + ["{m}", "n0 + {j}"]) + ", {v}); }"
    tile = f"""{chr(10).join(f'      var p{i}_{c} = 0.0f;' for i in range(m) for c in range(C))}
      for (var kk: i32 = npu_tid; kk < {kk}; kk += {SKINNY_THREADS}) {{
{chr(10).join(loads)}
{chr(10).join(fma)}
      }}
{_skinny_reduce(m, store, groups)}"""
    body = column_tiles(spec, blines, bases, -(-n // SKINNY_N), SKINNY_N, tile)
    shared = {"npu_part": ("f32", max(m, 1) * C * SKINNY_THREADS)}
    src = epi + "\n" + entry_point(SKINNY_THREADS, [body], shared)
    grid = _grid3(-(-n // SKINNY_N), max(spec.batch_count, 1), 1) if m else (0, 1, 1)
    return src, Launch(grid, SKINNY_THREADS, ptrs_of(k))


def _gemm_pre(k: KernelCall, program: CompiledProgram, shift: int = 0) -> list[str]:
    """alpha and the bias, applied to the product `v` before the epilogue (the bias `shift` columns to the right of
    the output's column: a column group's)."""
    spec: GemmKernel = k.spec
    pre = []
    if spec.alpha != 1.0:
        pre.append(f"v = v * {f32_literal(spec.alpha)};")
    if spec.bias:
        i = spec.b_arg + 1
        bias = k.args[i]
        bat = affine([(f"o{d}", s) for d, s in enumerate(bias.strides)], bias.offset + shift * bias.strides[-1])
        bv = _load_f32(program, bias, f"a{i}", bat)
        pre.append(f"v = v + {bv}" + (f" * {f32_literal(spec.beta)};" if spec.beta != 1.0 else ";"))
    return pre


def _batch_lines(spec: GemmKernel, refs: dict[str, TensorRef], var: str, indent: str) -> tuple[list[str], dict]:
    """Lines splitting the flat batch index `var` into `o0..o{nb-1}` and each operand's batch offset."""
    nb = len(spec.batch)
    lines = decompose(WGSL, var, tuple(spec.batch), "o", "i32", indent) if nb else []
    bases = {}
    for name, ref in refs.items():
        bases[name] = affine([(f"o{d}", ref.strides[d]) for d in range(nb)], ref.offset)
    return lines, bases


def _gemm_tiled(k: KernelCall, program: CompiledProgram) -> tuple[str, Launch]:
    """A 64 x 64 tile of the output per workgroup, K in steps of 16 through workgroup memory (each operand tile
    loaded along its contiguous dim, so neighbouring invocations read neighbouring elements), 4 x 4 accumulators
    per invocation; alpha, bias and the epilogue applied per output element at the store."""
    spec: GemmKernel = k.spec
    a, b = k.args[0], k.args[1]
    m, n, kk = spec.m, spec.n, spec.k
    nb = len(spec.batch)
    epi = epilogue_fn(k, program, spec, "float32", [_gemm_pre(k, program)])
    blines, bases = _batch_lines(spec, {"a": a, "b": b}, "tz", "    ")
    sam, sak = a.strides[-2], a.strides[-1]
    sbk, sbn = b.strides[-2], b.strides[-1]
    # which dim of each tile neighbouring invocations walk: the operand's contiguous one
    a_k_fast = sak == 1 or (sam != 1 and abs(sak) <= abs(sam))
    b_n_fast = sbn == 1 or (sbk != 1 and abs(sbn) <= abs(sbk))
    a_idx = ("let kq = e % 16; let mq = e / 16;" if a_k_fast else "let kq = e / 64; let mq = e % 64;")
    b_idx = ("let nq = e % 64; let kq = e / 64;" if b_n_fast else "let kq = e % 16; let nq = e / 16;")
    a_at = affine([("abase", 1), ("mi", sam), ("ki", sak)])
    b_at = affine([("bbase", 1), ("ki", sbk), ("ni", sbn)])
    fma = "\n".join(f"          c{i}{j} = c{i}{j} + av{i} * bv{j};" for i in range(4) for j in range(4))
    # one call site of the epilogue (a loop over the 16 results), so it is compiled once
    stores = f"""        let cs = array<f32, 16>({', '.join(f'c{i}{j}' for i in range(4) for j in range(4))});
        for (var q: i32 = 0; q < 16; q++) {{
          let mi = m0 + tm + 16 * (q / 4);
          let ni = n0 + tn + 16 * (q % 4);
          if (mi < {m} && ni < {n}) {{ npu_epi({', '.join([f'o{d}' for d in range(nb)] + ['mi', 'ni'])}, cs[q]); }}
        }}"""
    body = f"""  let tn = npu_tid % 16;
  let tm = npu_tid / 16;
  for (var tz: i32 = i32(npu_wid.z); tz < {max(spec.batch_count, 1)}; tz += i32(npu_nwgs.z)) {{
{chr(10).join(blines)}
    let abase = {bases['a']};
    let bbase = {bases['b']};
    for (var ty: i32 = i32(npu_wid.y); ty < {-(-m // TILE)}; ty += i32(npu_nwgs.y)) {{
      for (var tx: i32 = i32(npu_wid.x); tx < {-(-n // TILE)}; tx += i32(npu_nwgs.x)) {{
        let m0 = ty * 64;
        let n0 = tx * 64;
{chr(10).join(f'        var c{i}{j} = 0.0f;' for i in range(4) for j in range(4))}
        for (var k0: i32 = 0; k0 < {kk}; k0 += 16) {{
          for (var q: i32 = 0; q < 4; q++) {{
            let e = npu_tid + q * 256;
            {a_idx}
            let mi = m0 + mq;
            let ki = k0 + kq;
            var x = 0.0f;
            if (mi < {m} && ki < {kk}) {{ x = {_load_f32(program, a, 'a0', a_at)}; }}
            npu_as[kq * 64 + mq] = x;
          }}
          for (var q: i32 = 0; q < 4; q++) {{
            let e = npu_tid + q * 256;
            {b_idx}
            let ni = n0 + nq;
            let ki = k0 + kq;
            var x = 0.0f;
            if (ni < {n} && ki < {kk}) {{ x = {_load_f32(program, b, 'a1', b_at)}; }}
            npu_bs[kq * 65 + nq] = x;
          }}
          workgroupBarrier();
{_tile_product(fma)}
          workgroupBarrier();
        }}
{stores}
      }}
    }}
  }}"""
    shared = {"npu_as": ("f32", TK * TILE), "npu_bs": ("f32", TK * (TILE + 1))}
    src = epi + "\n" + entry_point(THREADS, [body], shared)
    return src, Launch(_grid3(-(-n // TILE), -(-m // TILE), max(spec.batch_count, 1)), THREADS, ptrs_of(k))


def _gemm_int(k: KernelCall, program: CompiledProgram) -> tuple[str, Launch]:
    """Integer GEMMs: one invocation per output element, exact in i32 (wrapping as ATen's int32 GEMM does; an int64
    result is checked and a value outside int32 is reported, see language.py)."""
    spec: GemmKernel = k.spec
    a, b, out = k.args[0], k.args[1], k.outs[0]
    od = _dt(program, out)
    rank = len(out.shape)
    n_out = math.prod(out.shape)
    lead = [f"o{d}" for d in range(rank - 2)]
    i, j = f"o{rank - 2}", f"o{rank - 1}"
    a_at = affine([(v, a.strides[d]) for d, v in enumerate(lead)] + [(i, a.strides[-2]), ("kk", a.strides[-1])],
                  a.offset)
    b_at = affine([(v, b.strides[d]) for d, v in enumerate(lead)] + [("kk", b.strides[-2]), (j, b.strides[-1])],
                  b.offset)
    add = lambda x, y: WGSL.binary("add", od, x, y)  # noqa: E731
    mul = lambda x, y: WGSL.binary("mul", od, x, y)  # noqa: E731

    def ld(ref: TensorRef, name: str, at: str) -> str:
        return WGSL.convert(WGSL.load(name, at, _dt(program, ref)), _dt(program, ref), od)

    pre = []
    if spec.alpha != 1.0:
        pre.append(f"v = {mul('v', WGSL.literal(int(spec.alpha), od))};")
    if spec.bias:
        bias = k.args[2]
        bat = affine([(f"o{d}", s) for d, s in enumerate(bias.strides)], bias.offset)
        bv = ld(bias, "a2", bat)
        pre.append(f"v = {add('v', mul(bv, WGSL.literal(int(spec.beta), od)) if spec.beta != 1 else bv)};")
    epi = epilogue_fn(k, program, spec, od, [pre])
    body = [f"  for (var i: i32 = npu_bid * NPU_BLOCK + npu_tid; i < {n_out}; i += npu_nwg * NPU_BLOCK) {{"]
    body += decompose(WGSL, "i", tuple(out.shape), "o", "i32", "    ")
    body += ["    var acc: i32 = 0i;",
             f"    for (var kk: i32 = 0; kk < {spec.k}; kk++) {{",
             f"      acc = {add('acc', mul(ld(a, 'a0', a_at), ld(b, 'a1', b_at)))};",
             "    }",
             f"    npu_epi({', '.join(f'o{d}' for d in range(rank))}, acc);",
             "  }"]
    src = epi + "\n" + entry_point(256, body)
    return src, Launch((grid_for(n_out, 256, MAX_GRID) if n_out else 0, 1, 1), 256, ptrs_of(k))


# ---- conv2d: implicit GEMM -------------------------------------------------------------------------------------


CONV_MIN_SPLIT_K = 128  # K a split of a conv at least (eight steps of its tiles)


def conv_splits(m_total: int, og: int, k_total: int, groups: int, dev) -> int:
    """Across how many workgroups the K of a conv is split (1: none): where its 64 x 64 tiles are too few to give
    every compute unit two workgroups (one image's deep layers: ResNet-50's last 3x3 convs have 8 tiles and a K of
    4,608), enough splits for about two a compute unit, each at least CONV_MIN_SPLIT_K long. Not for grouped convs,
    nor those of at most SKINNY_M pixels (their own kernel splits K inside a workgroup)."""
    tiles = -(-m_total // TILE) * -(-og // TILE)
    blocks = 2 * dev.multiprocessors
    if groups != 1 or m_total <= SKINNY_M or tiles >= blocks:
        return 1
    return max(1, min(-(-blocks // tiles), k_total // CONV_MIN_SPLIT_K, 1024))


def conv2d(k: KernelCall, program: CompiledProgram) -> list[tuple[str, Launch]]:
    """Implicit GEMM: M = N*Ho*Wo output pixels x Og output channels of a group, K = Cg*KH*KW, in 64 x 64 x 16 tiles
    through workgroup memory (im2col on the fly, zero padding by bounds checks); bias and the epilogue per output
    element, one rounding at the store. With a plan's `splits`, each tile's K is split across that many workgroups
    (grid z), which store their f32 sums in the scratch `out1` ([splits, pixels, Og]); a second dispatch adds the
    splits' sums of each element and runs the epilogue."""
    spec: Conv2dKernel = k.spec
    x, w, out = k.args[0], k.args[1], k.outs[0]
    _check_extent(*k.args, out)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    _, _, ho, wo = out.shape
    g = spec.groups
    og = o // g
    sh, sw = spec.stride
    ph, pw = spec.padding
    dh, dw = spec.dilation
    m_total = n * ho * wo
    k_total = cg * kh * kw
    xs, ws = x.strides, w.strides
    pre = []
    if spec.bias:
        bias = k.args[2]
        pre.append(f"v = v + {_load_f32(program, bias, 'a2', affine([('o1', bias.strides[0])], bias.offset))};")
    epi = epilogue_fn(k, program, spec, "float32", [pre])
    x_at = affine([("nb", xs[0]), ("ci", xs[1]), ("ih", xs[2]), ("iw", xs[3])], x.offset)
    w_at = affine([("co", ws[0]), ("cc", ws[1]), ("kr", ws[2]), ("ks", ws[3])], w.offset)
    if m_total <= SKINNY_M:
        return [_conv_skinny(k, program, epi, x_at, w_at)]
    splits = plan_of(k).splits if k.scratch else 1
    if splits > 1 and g != 1:
        raise NPUCompileError(f"kernel {k.name}: a conv of {g} groups split {splits} ways (not a webgpu plan)")
    # each split's K: whole steps of 16
    kspan = -(-k_total // (16 * splits)) * 16
    kb, ke = ("split * " + str(kspan), f"min(split * {kspan} + {kspan}, {k_total})") if splits > 1 else ("0",
                                                                                                          str(k_total))
    fma = "\n".join(f"          c{i}{j} = c{i}{j} + av{i} * bv{j};" for i in range(4) for j in range(4))
    keep = (f"st_out1((split * {m_total} + m) * {og} + co, cs[q]);" if splits > 1 else
            f"let ow = m % {wo}; let t1 = m / {wo}; let oh = t1 % {ho}; let nb = t1 / {ho};\n"
            f"            npu_epi(nb, grp * {og} + co, oh, ow, cs[q]);")
    stores = [f"""        let cs = array<f32, 16>({', '.join(f'c{i}{j}' for i in range(4) for j in range(4))});
        for (var q: i32 = 0; q < 16; q++) {{
          let m = m0 + tm + 16 * (q / 4);
          let co = n0 + tn + 16 * (q % 4);
          if (m < {m_total} && co < {og}) {{
            {keep}
          }}
        }}"""]
    # the conv's groups walk grid z, or its splits do (a split conv has one group)
    zloop = ("  let grp = 0;\n  for (var split: i32 = i32(npu_wid.z); split < " + str(splits)
             + "; split += i32(npu_nwgs.z)) {") if splits > 1 else \
        f"  for (var grp: i32 = i32(npu_wid.z); grp < {g}; grp += i32(npu_nwgs.z)) {{"
    body = f"""  let tm = npu_tid % 16;
  let tn = npu_tid / 16;
{zloop}
    for (var ty: i32 = i32(npu_wid.y); ty < {-(-og // TILE)}; ty += i32(npu_nwgs.y)) {{
      for (var tx: i32 = i32(npu_wid.x); tx < {-(-m_total // TILE)}; tx += i32(npu_nwgs.x)) {{
        let m0 = tx * 64;
        let n0 = ty * 64;
{chr(10).join(f'        var c{i}{j} = 0.0f;' for i in range(4) for j in range(4))}
        let ke = {ke};
        for (var k0: i32 = {kb}; k0 < ke; k0 += 16) {{
          for (var q: i32 = 0; q < 4; q++) {{
            let e = npu_tid + q * 256;
            let kq = e / 64;
            let mq = e % 64;
            let m = m0 + mq;
            let kidx = k0 + kq;
            var xv = 0.0f;
            if (m < {m_total} && kidx < ke) {{
              let ow = m % {wo}; let t1 = m / {wo}; let oh = t1 % {ho}; let nb = t1 / {ho};
              let ks = kidx % {kw}; let t2 = kidx / {kw}; let kr = t2 % {kh}; let cc = t2 / {kh};
              let ih = oh * {sh} - {ph} + kr * {dh};
              let iw = ow * {sw} - {pw} + ks * {dw};
              let ci = grp * {cg} + cc;
              if (ih >= 0 && ih < {h} && iw >= 0 && iw < {wd}) {{ xv = {_load_f32(program, x, 'a0', x_at)}; }}
            }}
            npu_as[kq * 64 + mq] = xv;
          }}
          for (var q: i32 = 0; q < 4; q++) {{
            let e = npu_tid + q * 256;
            let kq = e % 16;
            let nq = e / 16;
            let kidx = k0 + kq;
            var wv = 0.0f;
            if (n0 + nq < {og} && kidx < ke) {{
              let ks = kidx % {kw}; let t2 = kidx / {kw}; let kr = t2 % {kh}; let cc = t2 / {kh};
              let co = grp * {og} + n0 + nq;
              wv = {_load_f32(program, w, 'a1', w_at)};
            }}
            npu_bs[kq * 65 + nq] = wv;
          }}
          workgroupBarrier();
{_tile_product(fma)}
          workgroupBarrier();
        }}
{chr(10).join(stores)}
      }}
    }}
  }}"""
    shared = {"npu_as": ("f32", TK * TILE), "npu_bs": ("f32", TK * (TILE + 1))}
    src = epi + "\n" + entry_point(THREADS, [body], shared)
    tiles = Launch(_grid3(-(-m_total // TILE), -(-og // TILE), splits if splits > 1 else g), THREADS, ptrs_of(k))
    if splits == 1:
        return [(src, tiles)]
    total = m_total * og
    add = f"""  for (var i: i32 = npu_bid * {THREADS} + npu_tid; i < {total}; i += npu_nwg * {THREADS}) {{
    var r = 0.0f;
    for (var s2: i32 = 0; s2 < {splits}; s2++) {{ r = r + ld_out1(s2 * {total} + i); }}
    let co = i % {og}; let m = i / {og};
    let ow = m % {wo}; let t1 = m / {wo}; let oh = t1 % {ho}; let nb = t1 / {ho};
    npu_epi(nb, co, oh, ow, r);
  }}"""
    return [(src, tiles), (epi + "\n" + entry_point(THREADS, [add]),
                           Launch((grid_for(total, THREADS, MAX_GRID), 1, 1), THREADS, ptrs_of(k)))]


def _conv_skinny(k: KernelCall, program: CompiledProgram, epi: str, x_at: str, w_at: str) -> tuple[str, Launch]:
    """A convolution over at most 8 output pixels (deep layers at a small resolution): as `_gemm_skinny`, each
    workgroup takes 4 output channels of every pixel and its invocations split K = Cg*KH*KW."""
    spec: Conv2dKernel = k.spec
    x, w, out = k.args[0], k.args[1], k.outs[0]
    _, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    _, _, ho, wo = out.shape
    g = spec.groups
    og = o // g
    (sh, sw), (ph, pw), (dh, dw) = spec.stride, spec.padding, spec.dilation
    m_total, k_total = out.shape[0] * ho * wo, cg * kh * kw
    loads = []
    for j in range(SKINNY_N):
        loads += [f"          var b{j} = 0.0f;",
                  f"          if (c0 + {j} < {og}) {{ let co = grp * {og} + c0 + {j}; "
                  f"b{j} = {_load_f32(program, w, 'a1', w_at)}; }}"]
    for i in range(m_total):
        nb_, rest = divmod(i, ho * wo)
        oh_, ow_ = divmod(rest, wo)
        loads += [f"          var x{i} = 0.0f;",
                  "          {",
                  f"            let nb = {nb_}; let ih = {oh_ * sh - ph} + kr * {dh}; "
                  f"let iw = {ow_ * sw - pw} + ks * {dw};",
                  f"            if (ih >= 0 && ih < {h} && iw >= 0 && iw < {wd}) {{ x{i} = "
                  f"{_load_f32(program, x, 'a0', x_at)}; }}",
                  "          }"]
    fma = [f"          p{i}_{j} = p{i}_{j} + x{i} * b{j};" for i in range(m_total) for j in range(SKINNY_N)]
    store = ("if (c0 + {j} < " + str(og) + ") { let ow = {m} % " + str(wo) + "; let t1 = {m} / " + str(wo)
             + "; npu_epi(t1 / " + str(ho) + ", grp * " + str(og) + " + c0 + {j}, t1 % " + str(ho) + ", ow, {v}); }")
    body = f"""  for (var grp: i32 = i32(npu_wid.y); grp < {g}; grp += i32(npu_nwgs.y)) {{
    for (var tx: i32 = i32(npu_wid.x); tx < {-(-og // SKINNY_N)}; tx += i32(npu_nwgs.x)) {{
      let c0 = tx * {SKINNY_N};
{chr(10).join(f'      var p{i}_{j} = 0.0f;' for i in range(m_total) for j in range(SKINNY_N))}
      for (var kidx: i32 = npu_tid; kidx < {k_total}; kidx += {SKINNY_THREADS}) {{
          let ks = kidx % {kw}; let t2 = kidx / {kw}; let kr = t2 % {kh}; let cc = t2 / {kh};
          let ci = grp * {cg} + cc;
{chr(10).join(loads)}
{chr(10).join(fma)}
      }}
{_skinny_reduce(m_total, store)}
    }}
  }}"""
    shared = {"npu_part": ("f32", max(m_total, 1) * SKINNY_N * SKINNY_THREADS)}
    src = epi + "\n" + entry_point(SKINNY_THREADS, [body], shared)
    grid = _grid3(-(-og // SKINNY_N), g, 1) if m_total else (0, 1, 1)
    return src, Launch(grid, SKINNY_THREADS, ptrs_of(k))


# ---- attention ---------------------------------------------------------------------------------------------------

ATTN_THREADS = 64
# A decode step has a handful of query rows (one per head, fewer than two a compute unit): give each row's workgroup
# more invocations, so it walks the cache in fewer, wider blocks of keys.
ATTN_THREADS_FEW_ROWS, FEW_ROWS_PER_UNIT = 256, 2
COMBINE_LANES = 16  # invocations that add one output dim's partial outputs of a split attention's splits


@dataclass
class _Attn:
    """What the attention generators share: sizes, the helpers (the score of one key: q.k scaled and masked,
    rounded as the graph rounds; block max and sum), the valid-length prologue, the row decomposition, the load of
    v, the output index and the workgroup memory."""

    T: int
    per: int
    rows: int
    h: int
    t: int
    d: int
    dv: int
    pd: str
    od: str
    jend: str
    valid: str
    helpers: str
    row_head: str
    vload: str
    o_at: str
    shared: dict
    wide: frozenset[str]  # parameters read in 16-byte words: the keys, where their rows are whole words


def _keys_in_words(k: KernelCall, program: CompiledProgram, d: int) -> bool:
    """Can the keys be read in 16-byte words: float rows of whole words along d, in a buffer the kernel does not
    write (a written buffer is bound as plain elements)?"""
    kk, kd = k.args[1], _dt(program, k.args[1])
    return (rows_in_words(kk, kd) and d % elems(kd) == 0
            and kk.buffer not in {w.buffer for w in k.writes})


def _score_fn(k: KernelCall, program: CompiledProgram, d: int, wide: bool) -> tuple[str, str, dict]:
    """(the lines of npu_score that sum q.k into `s`, the lines that put the row's q in workgroup memory, that
    memory). In words: q is kept as vec4<f32> pieces laid out as a key word's (`words.pieces`), and each step loads a
    key word and adds its pieces' dot products."""
    q, kk = k.args[0], k.args[1]
    qd, kd = _dt(program, q), _dt(program, kk)
    g = attention_geometry(k, "webgpu")
    qload = WGSL.convert(WGSL.load("a0", g.q_at, qd), qd, "float32")
    if not wide:
        kload = WGSL.convert(WGSL.load("a1", g.k_at, kd), kd, "float32")
        return (f"  for (var dd: i32 = 0; dd < {d}; dd++) {{ s = s + npu_q[dd] * {kload}; }}",
                f"npu_q[dd] = {qload};", {"npu_q": ("f32", d)})
    per = elems(kd)
    parts = len(pieces(kd, "w"))
    _, ks = pad4(kk, "webgpu")
    base = affine([("bi", ks[0]), ("kvh", ks[1]), ("j", ks[2])], kk.offset)
    dots = " + ".join(f"dot(npu_qv[w * {parts} + {i}], {p})" for i, p in enumerate(pieces(kd, "kw")))
    score = f"""  let kb = ({base}) / {per};
  for (var w: i32 = 0; w < {d // per}; w++) {{
    let kw = ldv_a1(kb + w);
    s = s + {dots};
  }}"""
    # element dd of q where the key word's pieces have it: four floats as they are, eight halves even then odd
    at = "npu_qv[dd / 4][dd % 4]" if parts == 1 else f"npu_qv[dd / {per} * 2 + dd % 2][(dd % {per}) / 2]"
    return score, f"{at} = {qload};", {"npu_qv": ("vec4<f32>", d // 4)}


def _attention_setup(k: KernelCall, program: CompiledProgram, dev) -> _Attn:
    p: AttentionKernel = k.spec
    g = attention_geometry(k, "webgpu")
    v, out, mask, pos = g.v, g.out, g.mask, g.pos
    _check_extent(*k.args, out)
    b, h, t, d, lk, dv, group = g.b, g.h, g.t, g.d, g.kv_len, g.v_dim, g.group
    T = ATTN_THREADS_FEW_ROWS if b * h * t <= FEW_ROWS_PER_UNIT * dev.multiprocessors else ATTN_THREADS
    sd, pd = p.scores_dtype, p.probs_dtype
    vd, od = _dt(program, v), _dt(program, out)
    v_at, o_at, m_at = g.v_at("jj"), g.o_at, g.m_at
    mask_line = ""
    if mask is not None:
        if p.mask == "bool":
            mask_line = f"  if (!{WGSL.load('a3', m_at, 'bool')}) {{ s = {NEG_INF_F}; }}"
        else:
            mv = _load_f32(program, mask, "a3", m_at)
            mask_line = f"  s = {_round('(s + ' + mv + ')', sd)};"
    scale = f32_literal(float(p.scale))
    wide = _keys_in_words(k, program, d)
    score, qstore, qshared = _score_fn(k, program, d, wide)
    vload = WGSL.convert(WGSL.load("a2", v_at, vd), vd, "float32")
    reduce = "\n".join(f"""fn npu_b{name}(x: f32) -> f32 {{
  workgroupBarrier();
  npu_r[npu_lid_p] = x;
  for (var s: i32 = {T // 2}; s > 0; s = s / 2) {{
    workgroupBarrier();
    if (npu_lid_p < s) {{ npu_r[npu_lid_p] = {op.format(a='npu_r[npu_lid_p]', b='npu_r[npu_lid_p + s]')}; }}
  }}
  return workgroupUniformLoad(&npu_r[0]);
}}""" for name, op in (("max", "npu_max_f({a}, {b})"), ("sum", "{a} + {b}")))
    helpers = f"""var<private> npu_lid_p: i32;
fn npu_score(bi: i32, hi: i32, ti: i32, kvh: i32, j: i32) -> f32 {{
  var s = 0.0f;
{score}
  s = {_round('s', sd)};
  s = {_round(f'(s * {scale})', sd)};
{mask_line}
  return s;
}}
{reduce}"""
    valid = ""
    jend = f"min(ti + 1, {lk})" if p.is_causal else f"{lk}"
    shared = {**qshared, "npu_p": ("f32", T), "npu_r": ("f32", T)}
    if pos is not None:
        pa = len(k.args) - 1
        n_pos = math.prod(pos.shape)
        p_at = affine([("j", pos.strides[0] if pos.strides else 0)], pos.offset)
        pl = WGSL.convert(WGSL.load(f"a{pa}", p_at, _dt(program, pos)), _dt(program, pos), "int32")
        valid = f"""  // keys past the largest cache position written this step are masked: do not read them
  var pm: i32 = -1;
  for (var j: i32 = npu_tid; j < {n_pos}; j += {T}) {{ pm = max(pm, {pl}); }}
  npu_ri[npu_tid] = pm;
  for (var s: i32 = {T // 2}; s > 0; s = s / 2) {{
    workgroupBarrier();
    if (npu_tid < s) {{ npu_ri[npu_tid] = max(npu_ri[npu_tid], npu_ri[npu_tid + s]); }}
  }}
  let nvalid = clamp(workgroupUniformLoad(&npu_ri[0]) + 1, 0, {lk});"""
        jend = f"min({jend}, nvalid)"
        shared["npu_ri"] = ("i32", T)
    row_head = f"""    let ti = row % {t}; let t1 = row / {t};
    let hi = t1 % {h}; let bi = t1 / {h};
    let kvh = hi / {group};
    workgroupBarrier();
    for (var dd: i32 = npu_tid; dd < {d}; dd += {T}) {{ {qstore} }}
    workgroupBarrier();
    let jend = {jend};"""
    if wide:
        helpers = unpack_for(helpers) + helpers
    return _Attn(T, -(-dv // T), b * h * t, h, t, d, dv, pd, od, jend, valid, helpers, row_head, vload, o_at,
                 shared, frozenset({"a1"} if wide else ()))


def _accumulate(a: _Attn, expr_p: str, rescale: bool, end: str = "jend") -> str:
    """Lines that put each invocation's probability `expr_p` of key j0 + tid in workgroup memory and add the block's
    probabilities times v to the invocation's output dims (`o<c>`, rescaled by `corr` first when `rescale`)."""
    lines = [f"      npu_p[npu_tid] = {expr_p};", "      workgroupBarrier();",
             f"      let cnt = min({a.T}, {end} - j0);"]
    for c in range(a.per):
        upd = f"o{c} * corr + acc" if rescale else f"o{c} + acc"
        lines.append(f"""      {{
        let dd = npu_tid + {a.T * c};
        if (dd < {a.dv}) {{
          var acc = 0.0f;
          for (var tq: i32 = 0; tq < cnt; tq++) {{ let jj = j0 + tq; acc = acc + npu_p[tq] * {a.vload}; }}
          o{c} = {upd};
        }}
      }}""")
    lines.append("      workgroupBarrier();")
    return "\n".join(lines)


def _stats_loop(a: _Attn, begin: str, end: str, accumulate: str) -> str:
    """The online max and sum of exponentials over keys [begin, end), blocks of T keys (and, with `accumulate`, the
    rescaled products with v)."""
    return f"""    for (var j0: i32 = {begin}; j0 < {end}; j0 += {a.T}) {{
      let j = j0 + npu_tid;
      var s = {NEG_INF_F};
      if (j < {end}) {{ s = npu_score(bi, hi, ti, kvh, j); }}
      let mn = npu_max_f(m, npu_bmax(s));
      if (mn == {NEG_INF_F}) {{ continue; }}
      let corr = select(exp(m - mn), 0.0f, m == {NEG_INF_F});
      let pj = select(exp(s - mn), 0.0f, s == {NEG_INF_F});
      l = l * corr + npu_bsum(pj);
{accumulate}
      m = mn;
    }}"""


def _attention_source(a: _Attn, body: str) -> str:
    return a.helpers + "\n" + entry_point(a.T, ["  npu_lid_p = npu_tid;", a.valid, body], a.shared)


def attention(k: KernelCall, program: CompiledProgram, dev) -> list[tuple[str, Launch, frozenset[str]]]:
    """softmax(q k^T * scale + mask) v, one workgroup per query row (grid-stride over rows), the row's keys in blocks
    of 64 (256 for a few rows: decode), one key per invocation (its score), each invocation accumulating its share
    of the output dims; f32 accumulation; GQA maps query head h to kv head h / (heads / kv_heads) (no expanded K/V).

    Roundings follow the graph: scores rounded to `scores_dtype` after q.k, after the scale and after the mask;
    probabilities rounded to `probs_dtype` before the product with v. With f32 probabilities one online-softmax
    pass suffices; rounded probabilities need the row's max and sum first, so a first pass finds them and a second
    accumulates. `valid_len`: the last argument holds the cache positions written this step; keys past the largest
    are masked anyway and are not read. A row with every key masked gives zeros. With `splits` the keys of each
    row are split across workgroups (`attention_split`)."""
    if plan_of(k).splits and k.scratch:
        return attention_split(k, program, dev)
    a = _attention_setup(k, program, dev)
    decl_o = "\n".join(f"    var o{c} = 0.0f;" for c in range(a.per))
    if a.pd not in ("float16", "bfloat16"):
        passes = _stats_loop(a, "0", "jend", _accumulate(a, "pj", True))
        finish = "select(o{c} / l, 0.0f, m == " + NEG_INF_F + ")"
    else:
        second = f"""    if (m != {NEG_INF_F}) {{
      for (var j0: i32 = 0; j0 < jend; j0 += {a.T}) {{
        let j = j0 + npu_tid;
        var s = {NEG_INF_F};
        if (j < jend) {{ s = npu_score(bi, hi, ti, kvh, j); }}
        let pj = select({_round('(exp(s - m) / l)', a.pd)}, 0.0f, s == {NEG_INF_F});
{_accumulate(a, 'pj', False)}
      }}
    }}"""
        passes = _stats_loop(a, "0", "jend", "") + "\n" + second
        finish = "o{c}"
    stores = "\n".join(f"""    {{
      let dd = npu_tid + {a.T * c};
      if (dd < {a.dv}) {{ {WGSL.store('out0', a.o_at, a.od, finish.format(c=c), 'float32')} }}
    }}""" for c in range(a.per))
    body = f"""  for (var row: i32 = npu_bid; row < {a.rows}; row += npu_nwg) {{
{a.row_head}
    var m = {NEG_INF_F};
    var l = 0.0f;
{decl_o}
{passes}
{stores}
  }}"""
    grid = (grid_for(a.rows, 1, MAX_GRID) if a.rows else 0, 1, 1)
    return [(_attention_source(a, body), Launch(grid, a.T, ptrs_of(k)), a.wide)]


def attention_split(k: KernelCall, program: CompiledProgram, dev) -> list[tuple[str, Launch, frozenset[str]]]:
    """Decode attention with the keys of each query row split across workgroups (flash-decoding): a decode step has
    one query row per head, too few to fill a GPU with one workgroup each. Three dispatches over the float32 scratch
    `outs[1]` ([rows, splits, 2 + v_dim]): (1) each (row, split) workgroup finds its keys' max and sum of
    exponentials; (2) each combines all splits' (max, sum) into the row's and accumulates its keys' probabilities
    (rounded to `probs_dtype` as the graph rounds them) times v; (3) one workgroup per row adds the splits' partial
    outputs. Scores are rounded exactly as in `attention`."""
    a = _attention_setup(k, program, dev)
    S = plan_of(k).splits
    stride = 2 + a.dv
    head = f"""  for (var row: i32 = npu_bid; row < {a.rows}; row += npu_nwg) {{
{a.row_head}
    let split = i32(npu_wid.y);
    let per = (jend + {S - 1}) / {S};
    let jb = split * per;
    let je = min(jend, jb + per);
    let base = (row * {S} + split) * {stride};"""
    stats = head + f"""
    var m = {NEG_INF_F};
    var l = 0.0f;
{_stats_loop(a, "jb", "je", "")}
    if (npu_tid == 0) {{ st_out1(base, m); st_out1(base + 1, l); }}
  }}"""
    decl_o = "\n".join(f"    var o{c} = 0.0f;" for c in range(a.per))
    accumulate = head + f"""
    // the row's max and sum over every split, the splits' (max, sum) read in parallel (a serial loop of loads in one
    // invocation took most of the kernel's time)
    var mloc = {NEG_INF_F};
    for (var s2: i32 = npu_tid; s2 < {S}; s2 += {a.T}) {{
      mloc = npu_max_f(mloc, ld_out1((row * {S} + s2) * {stride}));
    }}
    let mx = npu_bmax(mloc);
    var tloc = 0.0f;
    for (var s2: i32 = npu_tid; s2 < {S}; s2 += {a.T}) {{
      let ms = ld_out1((row * {S} + s2) * {stride});
      tloc = tloc + select(ld_out1((row * {S} + s2) * {stride} + 1) * exp(ms - mx), 0.0f, ms == {NEG_INF_F});
    }}
    let tot = npu_bsum(tloc);
{decl_o}
    if (mx != {NEG_INF_F}) {{
      for (var j0: i32 = jb; j0 < je; j0 += {a.T}) {{
        let j = j0 + npu_tid;
        var s = {NEG_INF_F};
        if (j < je) {{ s = npu_score(bi, hi, ti, kvh, j); }}
        let pj = select({_round('(exp(s - mx) / tot)', a.pd)}, 0.0f, s == {NEG_INF_F});
{_accumulate(a, 'pj', False, 'je')}
      }}
    }}
{chr(10).join(f"    if (npu_tid + {a.T * c} < {a.dv}) {{ st_out1(base + 2 + npu_tid + {a.T * c}, o{c}); }}"
              for c in range(a.per))}
  }}"""
    # the splits' partial outputs added by COMBINE_LANES invocations a dim, each over every COMBINE_LANES-th split,
    # then through workgroup memory: a serial loop over the splits was latency-bound
    lanes = min(COMBINE_LANES, a.T)
    dims = a.T // lanes
    combine = f"""  for (var row: i32 = npu_bid; row < {a.rows}; row += npu_nwg) {{
    let ti = row % {a.t}; let t1 = row / {a.t};
    let hi = t1 % {a.h}; let bi = t1 / {a.h};
    let dd = i32(npu_wid.y) * {dims} + npu_tid % {dims};
    let lane = npu_tid / {dims};
    var r = 0.0f;
    if (dd < {a.dv}) {{
      for (var s2: i32 = lane; s2 < {S}; s2 += {lanes}) {{ r = r + ld_out1((row * {S} + s2) * {stride} + 2 + dd); }}
    }}
    workgroupBarrier();
    npu_c[npu_tid] = r;
    workgroupBarrier();
    if (lane == 0 && dd < {a.dv}) {{
      for (var l2: i32 = 1; l2 < {lanes}; l2++) {{ r = r + npu_c[l2 * {dims} + npu_tid]; }}
      {WGSL.store('out0', a.o_at, a.od, 'r', 'float32')}
    }}
  }}"""
    ptrs = ptrs_of(k)
    rows = grid_for(a.rows, 1, MAX_GRID) if a.rows else 0
    return [(_attention_source(a, stats), Launch((rows, S, 1), a.T, ptrs), a.wide),
            (_attention_source(a, accumulate), Launch((rows, S, 1), a.T, ptrs), a.wide),
            (entry_point(a.T, [combine], {"npu_c": ("f32", a.T)}), Launch((rows, -(-a.dv // dims), 1), a.T, ptrs),
             frozenset())]

