"""How a webgpu kernel reaches its tensors: one storage binding per distinct buffer it touches (or several, for a
buffer larger than the device lets one binding be), typed by the buffer's dtype, and the `ld_<param>` /
`st_<param>` functions through which the kernel reads and writes elements in register types.

Storage per dtype (the bytes are the program's own layout, so the host and every backend read the same buffers):
- float32, int32: `array<f32>`, `array<i32>`.
- float16 with the adapter's `shader-f16`: `array<f16>`.
- bfloat16, and float16 without `shader-f16`, int16: 16-bit halves of `array<u32>` words; bool, int8, uint8: bytes
  of `array<u32>` words.
- int64: `array<i32>`, two words per element (low, high); the kernel computes in the low word (language.py) and
  writes the high word as its sign extension.
- A float buffer a kernel only reads and asks to read wide (`Param.wide`: the GEMV's weights) is `array<vec4<f32>>`
  or, for halves, `array<vec4<u32>>` (eight packed halves a word, float16 too); `ldv_<param>(j)` loads its j-th
  16-byte word and `ld_<param>` still reads one element.
A kernel that writes 16- or 8-bit elements declares that buffer `array<atomic<u32>>` and stores with an atomic AND
that clears its own bits and an atomic OR that sets them: two invocations writing the two halves of one word never
lose each other's half, whatever the output's layout (strided, scattered, tiled). The bits an invocation does not
own are never changed, so the order of the two atomics of different invocations does not matter. Arena buffers
start at 256-byte boundaries and are padded to them (memory_plan.ALIGN), so no two buffers share a word.

A buffer larger than the device's largest storage binding is bound as consecutive chunks (each a multiple of 256
bytes, so every chunk starts at an aligned offset and packs whole words); its `ld_`/`st_` functions pick the chunk
of an element index. Every binding is `read_write` when its buffer lives in the arena, because every arena buffer
is a range of one GPU buffer and WebGPU does not let one buffer be both read-only and writable storage in one
dispatch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...dtypes import itemsize
from ...errors import NPUCompileError
from ...program import CompiledProgram, KernelCall
from .language import helpers_for

CHUNK_ALIGN = 256  # bytes; WebGPU guarantees min_storage_buffer_offset_alignment <= 256


@dataclass(frozen=True)
class DeviceCaps:
    """What rendering needs to know of the device (the runtime fills it from the adapter; the defaults are the
    WebGPU specification's guaranteed limits, used when no device is at hand, e.g. `npusim describe --source`)."""

    max_binding_bytes: int = 128 << 20
    max_bindings: int = 8
    f16_native: bool = True
    max_workgroup_storage: int = 16384
    division: str = "exact"  # f32 division: "exact" (the device's `/`), "corrected" or "fused" (language.py)
    products: str = "plain"  # how f32 products render: "plain", or "opaque" where the device fuses a*b + c
    packed_dot: bool = False  # WGSL's packed_4x8_integer_dot_product language feature (dot4I8Packed)
    # the smallest subgroup the adapter runs where it has the `subgroups` feature (wgpu-native's "subgroup"), which
    # the device was made with; 0: no subgroup operations (reductions through workgroup memory)
    subgroup_min_size: int = 0


@dataclass(frozen=True)
class Param:
    """A kernel parameter: its name in the source (`ld_<name>` / `st_<name>`), which tensor of the call it is
    (("out", i) or ("arg", i)), and whether the kernel writes it."""

    name: str
    ptr: tuple[str, int]
    written: bool = False
    wide: bool = False  # read as 16-byte words too (`ldv_<name>`)


@dataclass(frozen=True)
class Binding:
    """One storage binding of a dispatch: `@binding(slot)` is bytes [offset, offset + size) of the buffer of the
    call's tensor `ptr` (("out", i), ("arg", i), or ("status", 0): the runtime's status words), declared read-only
    or writable."""

    slot: int
    ptr: tuple[str, int]
    offset: int
    size: int
    read_only: bool = False


def params_of(ptrs: list[tuple[str, int]], names: list[str], wide: frozenset[str] = frozenset()) -> list[Param]:
    return [Param(n, p, p[0] == "out", n in wide) for n, p in zip(names, ptrs, strict=True)]


def generated_params(ptrs: list[tuple[str, int]]) -> list[Param]:
    """The parameters of a source made by `clike.render_expression`: `out0`, then `a0`, `a1`, ... in `ptrs` order."""
    return params_of(ptrs, ["out0"] + [f"a{j}" for j in range(len(ptrs) - 1)])


@dataclass
class _Layout:
    """How one dtype sits in a binding's array."""

    elem: str  # WGSL array element type
    per_word: int  # elements per array element (2 or 4 for packed 16/8-bit, 1 otherwise); int64: words per element
    widen: str  # {x}: the stored bits (packed) or element -> register value
    narrow: str  # {v}: register value -> stored bits or element


def _layout(dtype: str, f16_native: bool) -> _Layout:
    if dtype == "float32":
        return _Layout("f32", 1, "{x}", "{v}")
    if dtype == "int32":
        return _Layout("i32", 1, "{x}", "{v}")
    if dtype == "int64":
        return _Layout("i32", -2, "{x}", "{v}")
    if dtype == "float16" and f16_native:
        return _Layout("f16", 1, "f32({x})", "f16(npu_round_f16({v}))")
    if dtype == "float16":
        return _Layout("u32", 2, "npu_f16_f32({x})", "npu_f16_bits({v})")
    if dtype == "bfloat16":
        return _Layout("u32", 2, "npu_bf16_f32({x})", "npu_bf16_bits({v})")
    if dtype == "int16":
        return _Layout("u32", 2, "(i32({x} << 16u) >> 16u)", "(u32({v}) & 0xffffu)")
    if dtype == "int8":
        return _Layout("u32", 4, "(i32({x} << 24u) >> 24u)", "(u32({v}) & 0xffu)")
    if dtype == "uint8":
        return _Layout("u32", 4, "i32({x})", "(u32({v}) & 0xffu)")
    if dtype == "bool":
        return _Layout("u32", 4, "({x} != 0u)", "select(0u, 1u, {v})")
    raise NPUCompileError(f"webgpu target: buffers of dtype {dtype} are not supported (WGSL has no float64)")


def _reg(dtype: str) -> str:
    return "f32" if dtype in ("float32", "float16", "bfloat16") else ("bool" if dtype == "bool" else "i32")


def _read(arr: str, lay: _Layout, j: str, atomic: bool, wide: bool = False) -> str:
    if wide:  # the element's 32-bit word is lane (word % 4) of 16-byte word (word / 4)
        if lay.per_word == 1:
            return f"{arr}[{j} >> 2u][{j} & 3i]"
        word = f"{arr}[{j} >> 3u][({j} >> 1u) & 3i]"
        return lay.widen.format(x=f"(({word} >> (u32({j} & 1i) * 16u)) & 0xffffu)")
    if lay.per_word == 1:
        return lay.widen.format(x=f"{arr}[{j}]")
    if lay.per_word == -2:
        return f"{arr}[2 * {j}]"
    bits = 16 if lay.per_word == 2 else 8
    shift = "1u" if lay.per_word == 2 else "2u"
    word = f"atomicLoad(&{arr}[{j} >> {shift}])" if atomic else f"{arr}[{j} >> {shift}]"
    mask = "0xffffu" if bits == 16 else "0xffu"
    return lay.widen.format(x=f"(({word} >> (u32({j} & {lay.per_word - 1}i) * {bits}u)) & {mask})")


def _write(arr: str, lay: _Layout, j: str, v: str) -> list[str]:
    if lay.per_word == 1:
        return [f"{arr}[{j}] = {lay.narrow.format(v=v)};"]
    if lay.per_word == -2:
        return [f"{arr}[2 * {j}] = {v};", f"{arr}[2 * {j} + 1] = {v} >> 31u;"]
    bits = 16 if lay.per_word == 2 else 8
    shift = "1u" if lay.per_word == 2 else "2u"
    mask = "0xffffu" if bits == 16 else "0xffu"
    return [f"let sh = u32({j} & {lay.per_word - 1}i) * {bits}u;",
            f"atomicAnd(&{arr}[{j} >> {shift}], ~({mask} << sh));",
            f"atomicOr(&{arr}[{j} >> {shift}], {lay.narrow.format(v=v)} << sh);"]


def bind(params: list[Param], call: KernelCall, program: CompiledProgram, caps: DeviceCaps
         ) -> tuple[str, list[Binding]]:
    """Declarations and `ld_`/`st_` functions for the parameters, and the bindings the runtime makes for them."""
    groups: dict[int, list[Param]] = {}
    for p in params:
        ref = (call.writes if p.ptr[0] == "out" else call.args)[p.ptr[1]]
        groups.setdefault(ref.buffer, []).append(p)
    lines: list[str] = []
    bindings: list[Binding] = []
    for bid, members in groups.items():
        spec = program.buffers[bid]
        written = any(p.written for p in members)
        wide = any(p.wide for p in members) and not written
        lay = _wide_layout(spec.dtype) if wide else _layout(spec.dtype, caps.f16_native)
        atomic = written and lay.per_word > 1
        access = "read_write" if written or spec.kind == "arena" else "read"
        size = spec.nbytes
        padded = max(4, -(-size // 4) * 4)
        if padded <= caps.max_binding_bytes:
            chunk = padded
            chunks = [(0, padded)]
        else:
            chunk = caps.max_binding_bytes // CHUNK_ALIGN * CHUNK_ALIGN
            chunks = [(o, min(chunk, padded - o)) for o in range(0, padded, chunk)]
        ty = "array<atomic<u32>>" if atomic else f"array<{lay.elem}>"
        if wide:
            ty = f"array<vec4<{lay.elem}>>"
        names = []
        for off, sz in chunks:
            slot = len(bindings)
            name = f"npu_b{slot}"
            names.append(name)
            lines.append(f"@group(0) @binding({slot}) var<storage, {access}> {name}: {ty};")
            bindings.append(Binding(slot, members[0].ptr, off, sz, access == "read"))
        per_chunk = chunk // itemsize(spec.dtype)
        r = _reg(spec.dtype)
        for p in members:
            lines += _accessors(p, names, lay, atomic, per_chunk, r, wide)
            if wide:
                lines += _wide_accessor(p, names, lay, chunk // 16)
    return "\n".join(lines), bindings


def _wide_layout(dtype: str) -> _Layout:
    """A float dtype read as 16-byte words: f32 lanes, or u32 lanes of packed halves (float16 widened exactly in
    integer arithmetic, as without `shader-f16`)."""
    if dtype == "float32":
        return _Layout("f32", 1, "{x}", "{v}")
    if dtype in ("float16", "bfloat16"):
        return _layout(dtype, False)
    raise NPUCompileError(f"webgpu target: a {dtype} buffer is not read as 16-byte words")


def _wide_accessor(p: Param, arrays: list[str], lay: _Layout, per_chunk: int) -> list[str]:
    """`ldv_<name>(j)`: the j-th 16-byte word of the buffer (`per_chunk` words a chunk)."""
    out = [f"fn ldv_{p.name}(j: i32) -> vec4<{lay.elem}> {{"]
    if len(arrays) == 1:
        return out + [f"  return {arrays[0]}[j];", "}"]
    out += [f"  let c = j / {per_chunk}i;", f"  let i = j - c * {per_chunk}i;", "  switch c {"]
    for c, arr in enumerate(arrays):
        out.append(f"    {'default' if c == len(arrays) - 1 else f'case {c}i'}: {{ return {arr}[i]; }}")
    return out + ["  }", "}"]


def _accessors(p: Param, arrays: list[str], lay: _Layout, atomic: bool, per_chunk: int, r: str,
               wide: bool = False) -> list[str]:
    out = [f"fn ld_{p.name}(i: i32) -> {r} {{"]
    if len(arrays) == 1:
        out.append(f"  return {_read(arrays[0], lay, 'i', atomic, wide)};")
    else:
        out += [f"  let c = i / {per_chunk}i;", f"  let j = i - c * {per_chunk}i;", "  switch c {"]
        for c, arr in enumerate(arrays):
            label = "default" if c == len(arrays) - 1 else f"case {c}i"
            out.append(f"    {label}: {{ return {_read(arr, lay, 'j', atomic, wide)}; }}")
        out.append("  }")
    out.append("}")
    if lay.per_word == 4 and len(arrays) == 1 and not atomic:
        # the raw word of four 8-bit elements (the integer kernels' packed dot products: int8_kernels.py)
        out.append(f"fn ldw_{p.name}(w: i32) -> u32 {{ return {arrays[0]}[w]; }}")
    if not p.written:
        return out
    out.append(f"fn st_{p.name}(i: i32, v: {r}) {{")
    if len(arrays) == 1:
        out += [f"  {s}" for s in _write(arrays[0], lay, "i", "v")]
    else:
        out += [f"  let c = i / {per_chunk}i;", f"  let j = i - c * {per_chunk}i;", "  switch c {"]
        for c, arr in enumerate(arrays):
            label = "default" if c == len(arrays) - 1 else f"case {c}i"
            out.append(f"    {label}: {{ {' '.join(_write(arr, lay, 'j', 'v'))} }}")
        out.append("  }")
    out.append("}")
    return out


def finish_source(entry: str, declarations: str, bindings: list[Binding], kernel_index: int,
                  division: str = "exact", products: str = "plain") -> str:
    """The whole WGSL module: the f16 directive where needed, the bindings and their accessors, the status word
    (only when a checked int64 helper is used: `npu_flag` records the first kernel whose integers left int32), the
    zero word of opaque products (language.PRODUCTS), the helpers the text calls, the entry point."""
    body = declarations + "\n" + entry
    helpers = helpers_for(body, division, products)
    text = "\n".join([declarations, *helpers, entry])
    if "npu_zero" in text:
        slot = len(bindings)
        bindings.append(Binding(slot, ("zero", 0), 0, 4, True))
        text = f"@group(0) @binding({slot}) var<storage, read> npu_zero: array<u32>;\n" + text
    if "npu_flag" in text:
        slot = len(bindings)
        bindings.append(Binding(slot, ("status", 0), 0, 4))
        text = "\n".join([
            f"@group(0) @binding({slot}) var<storage, read_write> npu_status: array<atomic<u32>>;",
            f"const NPU_KERNEL: u32 = {kernel_index}u;",
            "fn npu_flag() { atomicMin(&npu_status[0], NPU_KERNEL); }",
            text])
    if "array<f16>" in declarations:
        text = "enable f16;\n" + text
    return text
