"""Number formats on the NPU: the rate at which its array and vector unit compute each format, the energy of a MAC in
it, what happens to a format the hardware does not take (costed as the nearest it takes, and flagged), and a
program's floating-point tensors costed as another format (what a quantized program would move and compute).

A preset lists the formats its array takes with their MACs per cell per cycle (`array.formats`, e.g. TPU v1's
`{ int8 = 1.0, int16 = 0.25 }`: 16-bit operands take four passes of its 8-bit multipliers). A product of two
formats of different rates runs at the geometric mean of the two (8 x 16 bits at half speed on the TPU: the
passes of a decomposed multiplier are the product of each side's). An empty table takes every format at one MAC per
cell per cycle.
"""

from __future__ import annotations

import dataclasses
import math

from ..program import CompiledProgram
from ..targets.config import FORMAT_BITS, FORMATS, NPUConfig

DTYPE_OF_FORMAT = {"int8": "int8", "int16": "int16", "fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def format_of(dtype: str) -> str:
    return FORMATS.get(dtype, dtype)


def resolve(table: dict[str, float], fmt: str) -> tuple[str, float]:
    """(the format the hardware computes `fmt` in, its rate): `fmt` itself when the table lists it (or is empty),
    else the narrowest listed format at least as wide (the fastest of equals), else the widest listed."""
    if not table or fmt in table:
        return fmt, table.get(fmt, 1.0)
    bits = FORMAT_BITS.get(fmt, 32)
    wide = sorted((FORMAT_BITS[f], -r, f) for f, r in table.items() if FORMAT_BITS[f] >= bits and r > 0)
    if wide:
        return wide[0][2], table[wide[0][2]]
    f = max(table, key=lambda f: (FORMAT_BITS[f], table[f]))
    return f, table[f]


def mac_rate(npu: NPUConfig, a_dtype: str, b_dtype: str) -> tuple[float, tuple[str, str], str | None]:
    """(MACs per cell per cycle, the formats computed, a note when one is not the program's)."""
    fa, fb = format_of(a_dtype), format_of(b_dtype)
    (ca, ra), (cb, rb) = resolve(npu.array_formats, fa), resolve(npu.array_formats, fb)
    note = None
    if (ca, cb) != (fa, fb):
        takes = ", ".join(sorted(npu.array_formats))
        note = (f"{_pair(fa, fb)} MACs: {npu.name}'s array takes {takes}; costed as {_pair(ca, cb)} (quantize the "
                f"program, or estimate it with --format)")
    return math.sqrt(ra * rb) if ra > 0 and rb > 0 else 0.0, (ca, cb), note


def vector_rate(npu: NPUConfig, dtype: str) -> tuple[float, str | None]:
    fmt = format_of(dtype)
    costed, rate = resolve(npu.vector_formats, fmt)
    note = None
    if costed != fmt:
        takes = ", ".join(sorted(npu.vector_formats))
        note = f"{fmt} vector work: {npu.name}'s vector unit takes {takes}; costed as {costed}"
    return rate, note


def mac_energy(npu: NPUConfig, formats: tuple[str, str]) -> float:
    """pJ per MAC: the geometric mean of the two formats' figures (`energy.mac_pj_by_format`, else `mac_pj`)."""
    a, b = (npu.mac_pj_by_format.get(f, npu.mac_pj) for f in formats)
    return math.sqrt(a * b)


def _pair(a: str, b: str) -> str:
    return a if a == b else f"{a} x {b}"


def as_format(program: CompiledProgram, fmt: str) -> CompiledProgram:
    """`program` with every floating-point tensor (activations, weights, constants) held in `fmt`: what the program
    would move and compute once quantized to it (integer tensors, such as token ids, keep their dtype). For the
    estimate only: the copy is never run."""
    if fmt not in DTYPE_OF_FORMAT:
        raise ValueError(f"unknown number format {fmt!r}; formats: {', '.join(DTYPE_OF_FORMAT)}")
    dtype = DTYPE_OF_FORMAT[fmt]
    buffers = [dataclasses.replace(b, dtype=dtype) if b.dtype in FLOAT_DTYPES else b for b in program.buffers]
    return dataclasses.replace(program, buffers=buffers)
