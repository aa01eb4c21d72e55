"""GEMV: the GEMMs of decoding (a few rows times a weight matrix read along K), streaming the weights in 16-byte words.

out[m, n] = epilogue(alpha * sum_k a[m, k] * b[k, n] + beta * bias) for m < SKINNY_M rows, b read along k with unit
stride (a linear layer's weight, w[n, k] = b[k, n]). A workgroup takes `rows` output columns of every row (with
column groups, `GemmKernel.acc_groups`, each column's value in every group: the SiLU(gate) * up epilogue) and its
invocations stride over K together, each loading a 16-byte word of every weight row it holds (eight packed halves
or four floats: `bindings.Param.wide`) and of each activation row, `unroll` words of a row before it uses any, and
summing products in f32. Neighbouring invocations read neighbouring words of a row, so a subgroup reads whole
cache lines; every invocation takes the same steps (one past K's words loads a word in range and adds nothing), so
the subgroup operations after them run in uniform control flow. The partial sums meet through `subgroupAdd` and one
word of workgroup memory a subgroup where the device has subgroup operations (`DeviceCaps.subgroup_min_size`), else
through a tree in workgroup memory; the invocations holding a column's sums run the epilogue.

A GEMM whose operand a prologue computes (`GemmKernel.prologue`: the RMSNorm before a decode projection; the target
folds norms only, `WebGPUTarget.gemm_prologue`) computes the operand's rows into workgroup memory first, each
workgroup all of them (a norm's sum of squares through workgroup memory, then each element rounded as the graph
stores it), and reads them from there: one dispatch where the passes of `staging.py` take two and a round trip of
the rows through memory. The rows take at most half the workgroup memory (`prologue_fits`).

The schedule comes from the device profile and the adapter when the kernel is rendered (`schedule`): a workgroup of
up to SUBGROUPS subgroups (the profile's `warp_width`), fewer where K leaves invocations idle; `rows` columns a
workgroup, fewer where the columns would not give every compute unit two workgroups; `unroll` words a row at once,
as many as the registers allow but fewer where that splits an invocation's words evenly; workgroup memory within
the adapter's limit. Halves widen exactly: bfloat16 by shifts, float16 by `unpack2x16float` (exact, subnormals
included; a `bitcast` to `vec2<f16>` is not, on lavapipe).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ...kernels import GemmKernel
from ...program import BufferSpec, CompiledProgram, KernelCall
from ..clike import ExprRenderer, KernelText, Launch, Scope, decompose, ptrs_of
from .bindings import DeviceCaps
from .language import WGSL, entry_point, reg
from .library import SKINNY_M, _batch_lines, _dt, _gemm_pre, _grid3, _round, column_tiles, epilogue_fn
from .words import FLOATS, elems, pieces, rows_in_words, unpack_for

SUBGROUPS = 4  # subgroups a workgroup at most
ROWS = 4  # output columns a workgroup at most
PROLOGUE_ROWS = 16  # output columns a workgroup at most where it computes a prologue (a norm) first
WAVES = 2  # workgroups a compute unit at least, where fewer columns a workgroup give them
UNROLL = 4  # 16-byte words of each row an invocation loads before it uses them
MAX_WORDS = 24  # weight words in flight an invocation (unroll x rows x groups): 96 registers
MAX_SUMS = 32  # f32 partial sums an invocation holds (rows of a x columns x groups)
IDLE = 1 / 8  # the share of invocation steps left idle by K that a narrower workgroup is preferred to


@dataclass(frozen=True)
class GemvShape:
    """How one GEMV runs: invocations a workgroup, output columns a workgroup, words of a row an invocation loads at
    once, and whether its sums meet through subgroup operations."""

    threads: int
    rows: int
    unroll: int
    subgroups: bool
    slots: int  # workgroup-memory words a sum meets in: one a subgroup (at most), else one an invocation


def _weight_fits(k: int, b, b_dtype: str) -> bool:
    """Is the weight `b` ([..., k, n] of `b_dtype`) read along K in whole 16-byte words?"""
    per = elems(b_dtype) if b_dtype in FLOATS else 0
    return (per > 0 and k % per == 0 and k >= per and b.strides[-2] == 1 and b.offset % per == 0
            and all(s % per == 0 for s in b.strides[:-2]) and b.strides[-1] % per == 0)


def prologue_fits(m: int, k: int, batch: tuple[int, ...], a_dtype: str, b, b_dtype: str, storage: int) -> bool:
    """Can this kernel compute a GEMM's operand rows ([m, k] of `a_dtype`) in a prologue: one batch, at most SKINNY_M
    rows, their f32 values in at most half of `storage` bytes of workgroup memory, a weight it reads in words?"""
    return (math.prod(batch) == 1 and 1 <= m <= SKINNY_M and a_dtype in FLOATS and 8 * m * k <= storage
            and _weight_fits(k, b, b_dtype))


def gemv_fits(k: KernelCall, buffers: Sequence[BufferSpec], storage: int) -> bool:
    """A GEMM this kernel runs: at most SKINNY_M rows (times its column groups), float operands and output, the
    weight read along K in whole 16-byte words, neither operand written by the kernel; a prologue (a norm) that
    `prologue_fits` within `storage` bytes of workgroup memory."""
    spec: GemmKernel = k.spec
    if not 1 <= spec.m * spec.acc_groups <= SKINNY_M or spec.out_n < 1:
        return False
    b, out = k.args[spec.b_arg], k.outs[0]
    written = {r.buffer for r in k.writes}
    if reg(buffers[out.buffer].dtype) != "f32" or buffers[out.buffer].dtype not in FLOATS or b.buffer in written:
        return False
    bd = buffers[b.buffer].dtype
    if spec.prologue is not None:
        return prologue_fits(spec.m, spec.k, tuple(spec.batch), spec.prologue.dtype, b, bd, storage)
    a = k.args[0]
    return buffers[a.buffer].dtype in FLOATS and a.buffer not in written and _weight_fits(spec.k, b, bd)


def _wide_a(k: KernelCall, program: CompiledProgram) -> bool:
    """Is operand a read in 16-byte words too (rows along K, aligned, a word holding a whole number of the weight's
    words' elements)? Not where a prologue computes it."""
    if k.spec.prologue is not None:
        return False
    a, per = k.args[0], elems(_dt(program, k.args[1]))
    pa = elems(_dt(program, a))
    return per % pa == 0 and rows_in_words(a, _dt(program, a))


def schedule(spec: GemmKernel, per: int, dev, caps: DeviceCaps) -> GemvShape:
    """The workgroup for a GEMV of `per` elements a weight word on the device `dev` with the adapter's `caps` (a
    prologue's rows and its reductions' words take their share of the workgroup memory)."""
    words = spec.k // per
    threads = dev.warp_width * SUBGROUPS
    while threads > dev.max_threads_per_block:
        threads //= 2
    # a narrower workgroup where K's words leave many invocations without a word in the last step
    while threads > dev.warp_width and (-(-words // threads) * threads - words) > IDLE * words:
        threads //= 2
    # every workgroup computes a prologue's rows for itself: more columns a workgroup share that work
    rows = ROWS if spec.prologue is None else PROLOGUE_ROWS
    cols = spec.out_n * max(spec.batch_count, 1)
    while rows > 1 and (-(-cols // rows) < WAVES * dev.multiprocessors or spec.m * spec.acc_groups * rows > MAX_SUMS
                        or rows * spec.acc_groups > MAX_WORDS):
        rows //= 2
    sub = caps.subgroup_min_size

    def slots(t: int) -> int:
        return -(-t // sub) if sub else t

    def reserved(t: int) -> int:
        return 4 * (spec.m * spec.k + t) if spec.prologue is not None else 0

    while threads > 1 and 4 * spec.m * spec.acc_groups * rows * slots(threads) + reserved(threads) \
            > caps.max_workgroup_storage:
        threads //= 2
    # words a row an invocation loads at once: as many as allowed, fewer where that splits its words evenly
    steps = -(-words // threads)
    most = max(1, min(UNROLL, steps, MAX_WORDS // (rows * spec.acc_groups)))
    unroll = min(range(1, most + 1), key=lambda u: (-(-steps // u) * u - steps, -u))
    return GemvShape(threads, rows, unroll, sub > 0, slots(threads))


def _apieces(k: KernelCall, program: CompiledProgram, m: int, kq: str, per: int, tag: str
              ) -> tuple[list[str], list[str]]:
    """(lines, pieces): row m of operand a under weight word `kq`, as the weight word's pieces (the even and the odd
    elements for halves), in variables named after `tag`."""
    if k.spec.prologue is not None:  # the rows are in workgroup memory, each weight word's pieces a vec4
        parts = 1 if per == 4 else 2
        return [], [f"npu_xs[{m * k.spec.k // per * parts} + {kq} * {parts} + {i}]" for i in range(parts)]
    a = k.args[0]
    ad, sam = _dt(program, a), a.strides[-2]
    if _wide_a(k, program):
        pa = elems(ad)
        n = per // pa  # a's words under one weight word
        base = f"abase / {pa} + {m * sam // pa} + {kq}" + (f" * {n}" if n > 1 else "")
        lines = [f"let x{tag}_{i} = ldv_a0({base} + {i});" for i in range(n)]
        if ad != "float32":
            return lines, pieces(ad, f"x{tag}_0")
        if n == 1:
            return lines, [f"x{tag}_0"]
        return lines, [f"vec4<f32>(x{tag}_0.xz, x{tag}_1.xz)", f"vec4<f32>(x{tag}_0.yw, x{tag}_1.yw)"]
    sak = a.strides[-1]
    lines = []
    for i in range(per):
        at = f"abase + {m * sam} + ({kq} * {per} + {i}) * {sak}"
        lines.append(f"let e{tag}_{i} = {WGSL.convert(WGSL.load('a0', at, ad), ad, 'float32')};")
    e = [f"e{tag}_{i}" for i in range(per)]
    if per == 4:
        return lines, [f"vec4<f32>({', '.join(e)})"]
    return lines, [f"vec4<f32>({', '.join(e[0::2])})", f"vec4<f32>({', '.join(e[1::2])})"]


def _reduce(shape: GemvShape, m: int, groups: int, store: str) -> list[str]:
    """Lines adding the invocations' sums `p{o}` (o = (row * rows + column) * groups + group) and running `store`
    (placeholders {m}, {c}, {v}: row, column of the workgroup, the column's values of each group) in invocation
    row * rows + column."""
    T, R = shape.threads, shape.rows
    sums = m * R * groups
    lines = ["      workgroupBarrier();"]  # the previous columns' sums are read
    if shape.subgroups:
        lines += [f"      let s{o} = subgroupAdd(p{o});" for o in range(sums)]
        lines += ["      if (npu_sl == 0u) {"]
        lines += [f"        npu_part[{o * shape.slots} + i32(npu_sg)] = s{o};" for o in range(sums)]
        lines += ["      }", "      workgroupBarrier();"]
        read = ["for (var i: i32 = 0; i < i32(npu_nsg); i++) {{ v{g} = v{g} + npu_part[(o + {g}) * "
                f"{shape.slots} + i]; }}}}"]
    else:
        half = 1 << max(0, (T - 1).bit_length() - 1)
        lines += [f"      npu_part[{o * T} + npu_tid] = p{o};" for o in range(sums)]
        lines += ["      workgroupBarrier();",
                  f"      for (var s: i32 = {half}; s > 0; s = s / 2) {{",
                  f"        if (npu_tid < s && npu_tid + s < {T}) {{",
                  f"          for (var o: i32 = 0; o < {sums}; o++) {{ npu_part[o * {T} + npu_tid] = "
                  f"npu_part[o * {T} + npu_tid] + npu_part[o * {T} + npu_tid + s]; }}",
                  "        }",
                  "        workgroupBarrier();",
                  "      }"]
        read = [f"v{{g}} = npu_part[(o + {{g}}) * {T}];"]
    lines += [f"      if (npu_tid < {m * R}) {{",
              f"        let m = npu_tid / {R};",
              f"        let c = npu_tid % {R};",
              f"        let o = npu_tid * {groups};"]
    for g in range(groups):
        lines += [f"        var v{g} = 0.0f;", "        " + read[0].format(g=g)]
    values = ", ".join(f"v{g}" for g in range(groups))
    lines += ["        " + store.replace("{m}", "m").replace("{c}", "c").replace("{v}", values), "      }"]
    return lines


def _prologue_rows(k: KernelCall, program: CompiledProgram, threads: int, per: int) -> tuple[list[str], dict]:
    """Lines computing the operand's rows into workgroup memory `npu_xs` ([m][k] f32, each value rounded to the
    prologue's dtype as the graph stores it, in vec4 pieces laid out as the pieces of a weight word of `per`
    elements: four floats, or the even then the odd elements of eight halves): the whole workgroup runs each row (its
    reductions through workgroup memory, then its elements), as a generated row kernel does; and the workgroup memory
    they take."""
    spec: GemmKernel = k.spec
    expr, shape = spec.prologue, spec.a_shape
    outer = shape[:-1]
    text = KernelText([], threads)
    r = ExprRenderer(WGSL, text, [f"a{i}" for i in range(len(k.args))], [_dt(program, a) for a in k.args], shape,
                     "i32", tuple(spec.prologue_reduce), row_dims=1, block_reduce=True, prefix="p_")
    row = Scope("    ")
    r.row_scope = row
    row.lines += decompose(WGSL, "row", outer, "o", "i32", row.indent)
    elem = Scope("      ", parent=row)
    r.elem_scope = elem
    elem.lines += decompose(WGSL, "e", shape[-1:], "o", "i32", elem.indent, first=len(outer))
    value = r.emit(expr, elem)
    at = "npu_x / 4][npu_x % 4]" if per == 4 else f"npu_x / {per} * 2 + npu_x % 2][(npu_x % {per}) / 2]"
    elem.lines.append(f"{elem.indent}let npu_x = row * {spec.k} + e;")
    elem.lines.append(f"{elem.indent}npu_xs[{at} = {_round(value, expr.dtype)};")
    lines = ["  {", f"  for (var row: i32 = 0; row < {spec.m}; row++) {{", *row.lines,
             f"    for (var e: i32 = npu_tid; e < {spec.k}; e += {threads}) {{", *elem.lines, "    }", "  }", "  }",
             "  workgroupBarrier();"]
    return lines, {**text.shared, "npu_xs": ("vec4<f32>", spec.m * spec.k // 4)}


def gemv(k: KernelCall, program: CompiledProgram, dev, caps: DeviceCaps) -> tuple[str, Launch, frozenset[str]]:
    """The GEMV's WGSL, its launch and the parameters it reads in 16-byte words (see the module's docstring)."""
    spec: GemmKernel = k.spec
    b = k.args[spec.b_arg]
    bd = _dt(program, b)
    per = elems(bd)
    shape = schedule(spec, per, dev, caps)
    T, R, U, G = shape.threads, shape.rows, shape.unroll, spec.acc_groups
    m, n, words = spec.m, spec.out_n, spec.k // per
    nb = len(spec.batch)
    epi = epilogue_fn(k, program, spec, "float32", [_gemm_pre(k, program, g * n) for g in range(G)])
    refs = {"b": b} if spec.prologue is not None else {"a": k.args[0], "b": b}
    blines, bases = _batch_lines(spec, refs, "tz", "    ")
    bases.setdefault("a", "0")
    sbn = b.strides[-1]
    slots = [(c, g) for c in range(R) for g in range(G)]  # weight rows of the workgroup: column c of group g
    rows = [f"      let wr{c}_{g} = (bbase + (min(n0 + {c}, {n - 1}) + {g * n}) * {sbn}) / {per};" for c, g in slots]
    exact = words % (T * U) == 0
    loads, fma = [], []
    for u in range(U):
        kq = f"kq{u}"
        loads.append(f"        let {kq} = " + (f"kv + {u * T};" if exact else f"min(kv + {u * T}, {words - 1});"))
        loads += [f"        let w{u}_{c}_{g} = ldv_a{spec.b_arg}(wr{c}_{g} + {kq});" for c, g in slots]
        for i in range(m):
            lines, xs = _apieces(k, program, i, kq, per, f"{u}_{i}")
            loads += [f"        {ln}" for ln in lines]
            for c, g in slots:
                ws = pieces(bd, f"w{u}_{c}_{g}")
                dot = " + ".join(f"dot({x}, {w})" for x, w in zip(xs, ws, strict=True))
                o = (i * R + c) * G + g
                term = dot if exact else f"select(0.0f, {dot}, kv + {u * T} < {words})"
                fma.append(f"        p{o} = p{o} + {term};")
    store = ("if (n0 + {c} < " + str(n) + ") { npu_epi("
             + ", ".join([f"o{d}" for d in range(nb)] + ["{m}", "n0 + {c}"]) + ", {v}); }")
    tile = f"""{chr(10).join(rows)}
{chr(10).join(f'      var p{o}: f32 = 0.0f;' for o in range(m * R * G))}
      for (var k0: i32 = 0; k0 < {words}; k0 += {T * U}) {{
        let kv = k0 + npu_tid;
{chr(10).join(loads)}
{chr(10).join(fma)}
      }}
{chr(10).join(_reduce(shape, m, G, store))}"""
    body = column_tiles(spec, blines, bases, -(-n // R), R, tile)
    shared = {"npu_part": ("f32", m * R * G * shape.slots)}
    first = []
    if spec.prologue is not None:
        first, more = _prologue_rows(k, program, T, per)
        shared.update(more)
    unpack = unpack_for(body)
    src = epi + "\n" + unpack + entry_point(T, [*first, body], shared, subgroups=shape.subgroups)
    grid = _grid3(-(-n // R), max(spec.batch_count, 1), 1)
    wide = {f"a{spec.b_arg}"} | ({"a0"} if _wide_a(k, program) else set())
    return src, Launch(grid, T, ptrs_of(k)), frozenset(wide)


__all__ = ["GemvShape", "gemv", "gemv_fits", "prologue_fits", "schedule"]
