"""The buffer plan's records: a buffer (`BufferSpec`) and a graph input or output bound to one (`TensorSpec`). They
sit below the kernel records and the program, which both refer to them."""

from __future__ import annotations

from dataclasses import dataclass

from .dtypes import itemsize


@dataclass
class BufferSpec:
    """kind: 'input' | 'output' | 'weight' | 'constant' | 'arena' (an intermediate placed in the arena)."""

    id: int
    name: str
    kind: str
    dtype: str
    numel: int
    offset: int = -1  # byte offset inside the arena (arena buffers only)
    data: bytes | None = None  # constants only (little-endian raw)

    @property
    def nbytes(self) -> int:
        return self.numel * itemsize(self.dtype)


@dataclass
class TensorSpec:
    """A graph input or output as the user sees it (`dtype`) and as the device holds it (`device_dtype`)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    device_dtype: str
    buffer: int
    alias_of: str | None = None  # an output that is an input updated in place (the KV cache)
    value_range: tuple[int, int] | None = None  # integer inputs: the valid [lo, hi) (e.g. token ids < vocab)
