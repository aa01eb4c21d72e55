"""Dtype names -> NumPy array types (bf16 through ml_dtypes)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

NP_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float64": np.dtype(np.float64),
    "int64": np.dtype(np.int64),
    "int32": np.dtype(np.int32),
    "int16": np.dtype(np.int16),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
}


def np_dtype(name: str) -> np.dtype:
    return NP_DTYPES[name]


def dtype_name(dt: np.dtype) -> str:
    dt = np.dtype(dt)
    for k, v in NP_DTYPES.items():
        if v == dt:
            return k
    raise KeyError(f"unsupported array dtype {dt}")


def convert(arr: np.ndarray, dtype: str) -> np.ndarray:
    """Cast with round-to-nearest-even; bf16 <-> fp16 go through fp32 (ml_dtypes cannot mix them directly)."""
    target = np_dtype(dtype)
    if arr.dtype == target:
        return arr
    src = arr
    if src.dtype in (NP_DTYPES["bfloat16"], NP_DTYPES["float16"]) and target != np.float32:
        src = src.astype(np.float32)
    return src.astype(target)
