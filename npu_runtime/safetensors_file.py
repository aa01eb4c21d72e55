"""Reading safetensors files without trusting them: the header is checked field by field (dtype, shape, offsets
inside the file, no overlaps) before any tensor is touched, and tensors are read lazily from a memory map, so a
truncated, corrupted or crafted file gives a `WeightError` naming the file and the tensor, never a MemoryError or a
crash, and a tensor's bytes are read only when it is asked for.

Format (https://github.com/huggingface/safetensors): u64 little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the data, each tensor
little-endian and C-contiguous at [begin, end) of the data. The dtypes NumPy (with ml_dtypes) can hold are read;
the others (complex, 4- and 6-bit floats, F8_E8M0) are refused by name.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from npu_compiler.atomic import note_input

from .errors import WeightError

MAX_HEADER_BYTES = 100 << 20  # the reference implementation's own limit
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn), "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


@dataclass(frozen=True)
class TensorInfo:
    dtype: str  # the safetensors name ("F32", "BF16", ...)
    shape: tuple[int, ...]
    begin: int  # byte offsets inside the data section
    end: int


class SafetensorsFile:
    """One safetensors file, header checked, data memory-mapped (read only when a tensor is asked for)."""

    def __init__(self, path: str | os.PathLike, max_tensor_bytes: int | None = None) -> None:
        self.path = os.fspath(path)
        try:
            with open(self.path, "rb") as f:
                note_input(self.path)
                size = os.fstat(f.fileno()).st_size
                head = f.read(8)
                if len(head) < 8:
                    raise self._bad(f"{size} bytes is too short for a safetensors file (truncated?)")
                (n,) = struct.unpack("<Q", head)
                if n > MAX_HEADER_BYTES or 8 + n > size:
                    raise self._bad(f"header length {n} does not fit a file of {size} bytes (truncated or not a "
                                    "safetensors file)")
                header = f.read(n)
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size > 8 + n else None
        except FileNotFoundError:
            raise WeightError(f"weights file not found: {self.path}") from None
        except IsADirectoryError:
            raise WeightError(f"{self.path} is a folder, not a safetensors file") from None
        except (OSError, ValueError) as e:
            raise WeightError(f"cannot read {self.path}: {getattr(e, 'strerror', None) or e}") from None
        self._data_start = 8 + n
        self.tensors, self.metadata = self._parse(header, size - 8 - n, max_tensor_bytes)

    def _bad(self, what: str, key: str | None = None) -> WeightError:
        where = f"{self.path}" + (f", tensor '{_short(key)}'" if key is not None else "")
        return WeightError(f"invalid safetensors file {where}: {what}")

    def _parse(self, header: bytes, data_len: int, max_tensor_bytes: int | None
               ) -> tuple[dict[str, TensorInfo], dict[str, str]]:
        try:
            d = json.loads(header.decode("utf-8"), parse_int=_parse_int)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise self._bad(f"the header is not JSON ({str(e)[:80]})") from None
        if not isinstance(d, dict):
            raise self._bad("the header is not a JSON object")
        meta = d.pop("__metadata__", None)
        meta = {} if meta is None else meta
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise self._bad("__metadata__ must map strings to strings")
        out: dict[str, TensorInfo] = {}
        for key, info in d.items():
            if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
                raise self._bad("an entry needs exactly 'dtype', 'shape' and 'data_offsets'", key)
            dt, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
            if not isinstance(dt, str) or dt not in DTYPES:
                raise self._bad(f"dtype {_short(dt)} is not one npusim reads (known: {', '.join(DTYPES)})", key)
            if (not isinstance(shape, list) or len(shape) > 64
                    or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape)):
                raise self._bad(f"shape {_short(shape)} is not a list of sizes", key)
            if (not isinstance(offs, list) or len(offs) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) for x in offs)
                    or not 0 <= offs[0] <= offs[1] <= data_len):
                raise self._bad(f"data_offsets {_short(offs)} are not inside the {data_len} data bytes", key)
            nbytes = math.prod(shape) * DTYPES[dt].itemsize
            if offs[1] - offs[0] != nbytes:
                raise self._bad(f"{dt}{shape} needs {nbytes} bytes, data_offsets {offs} hold {offs[1] - offs[0]}",
                                key)
            if max_tensor_bytes is not None and nbytes > max_tensor_bytes:
                raise self._bad(f"{nbytes} bytes, above the limit of {max_tensor_bytes} ($NPUSIM_MAX_BYTES)", key)
            out[key] = TensorInfo(dt, tuple(shape), offs[0], offs[1])
        end = 0
        for key, t in sorted(out.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
            if t.begin < end:
                raise self._bad(f"data_offsets {[t.begin, t.end]} overlap another tensor's", key)
            if t.begin > end:  # the format indexes every data byte: a hole is a damaged or edited file
                raise self._bad(f"data bytes [{end}, {t.begin}) belong to no tensor", key)
            end = t.end
        if end != data_len:
            raise self._bad(f"data bytes [{end}, {data_len}) belong to no tensor (truncated header or extra data)")
        return out, meta

    def keys(self) -> list[str]:
        return list(self.tensors)

    def get(self, key: str) -> np.ndarray:
        """The tensor as a read-only NumPy array over the file (no copy until converted)."""
        t = self.tensors[key]
        dt = DTYPES[t.dtype]
        count = t.end - t.begin
        if count == 0 or self._map is None:
            return np.zeros(t.shape, dt)
        return np.frombuffer(self._map, dtype=dt, count=count // dt.itemsize,
                             offset=self._data_start + t.begin).reshape(t.shape)


def _parse_int(s: str) -> int:
    if len(s.lstrip("-")) > 20:
        raise ValueError(f"integer literal of {len(s)} digits")
    return int(s)


def _short(v: object) -> str:
    text = repr(v) if not isinstance(v, str) else v
    return text if len(text) <= 60 else text[:57] + "..."
