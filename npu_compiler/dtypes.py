"""Dtype names as the IR writes them, and the facts the compiler needs about each (no NumPy types here:
the runtime maps names to array types)."""

from __future__ import annotations

from .errors import IRFormatError

ITEMSIZE: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
FLOAT_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64"})
HALF_DTYPES = frozenset({"float16", "bfloat16"})
INT_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint8"})

_ALIASES = {
    "float": "float32",
    "half": "float16",
    "double": "float64",
    "long": "int64",
    "int": "int32",
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "f16": "float16",
}


def normalize_dtype(name: object, where: str = "") -> str:
    """'torch.bfloat16', 'bfloat16', 'bf16' -> 'bfloat16'. Raises a clear error for anything else."""
    if not isinstance(name, str):
        raise IRFormatError(f"{where}: dtype must be a string, got {name!r}")
    s = name.removeprefix("torch.")
    s = _ALIASES.get(s, s)
    if s not in ITEMSIZE:
        raise IRFormatError(f"{where}: unknown dtype {name!r} (known: {', '.join(sorted(ITEMSIZE))})")
    return s


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def itemsize(dtype: str) -> int:
    return ITEMSIZE[dtype]
