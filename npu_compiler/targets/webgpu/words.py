"""Reading float tensors in 16-byte words (`ldv_<name>` of `bindings.py`: four floats, or eight packed halves), and
widening a word of halves exactly into two vec4<f32> pieces: the even and the odd elements. The GEMV streams its
weights this way and decode attention its keys."""

from __future__ import annotations

from ...dtypes import itemsize
from ...program import TensorRef

FLOATS = ("float32", "float16", "bfloat16")
WORD = 16  # bytes a wide load reads

# bfloat16 widens by shifts, float16 by `unpack2x16float` (exact, subnormals included; a `bitcast` to vec2<f16> is
# not, on lavapipe)
UNPACK = """fn npu_lo_bf16(w: vec4<u32>) -> vec4<f32> { return bitcast<vec4<f32>>(w << vec4<u32>(16u)); }
fn npu_hi_bf16(w: vec4<u32>) -> vec4<f32> { return bitcast<vec4<f32>>(w & vec4<u32>(0xffff0000u)); }
fn npu_lo_f16(w: vec4<u32>) -> vec4<f32> {
  return vec4<f32>(unpack2x16float(w.x).x, unpack2x16float(w.y).x, unpack2x16float(w.z).x, unpack2x16float(w.w).x);
}
fn npu_hi_f16(w: vec4<u32>) -> vec4<f32> {
  return vec4<f32>(unpack2x16float(w.x).y, unpack2x16float(w.y).y, unpack2x16float(w.z).y, unpack2x16float(w.w).y);
}
"""


def elems(dtype: str) -> int:
    """Elements of `dtype` in one 16-byte word."""
    return WORD // itemsize(dtype)


def pieces(dtype: str, word: str) -> list[str]:
    """A 16-byte word of `dtype` as vec4<f32> pieces: the even and the odd elements of eight halves, or four
    floats."""
    if dtype == "float32":
        return [word]
    kind = "bf16" if dtype == "bfloat16" else "f16"
    return [f"npu_lo_{kind}({word})", f"npu_hi_{kind}({word})"]


def piece_of(dtype: str, e: int) -> tuple[int, int]:
    """(piece, lane) of element `e` of a word (`pieces`' order)."""
    return (0, e) if dtype == "float32" else (e % 2, e // 2)


def unpack_for(source: str) -> str:
    """The widening helpers a source calls, or nothing."""
    return UNPACK if "npu_lo_" in source or "npu_hi_" in source else ""


def rows_in_words(ref: TensorRef, dtype: str, last_unit: bool = True) -> bool:
    """Does every row of `ref` (a float tensor) start at a whole 16-byte word and run along its last dim?"""
    if dtype not in FLOATS:
        return False
    per = elems(dtype)
    return (ref.offset % per == 0 and all(s % per == 0 for s in ref.strides[:-1])
            and (not last_unit or ref.strides[-1] == 1))


__all__ = ["FLOATS", "UNPACK", "WORD", "elems", "piece_of", "pieces", "rows_in_words", "unpack_for"]
