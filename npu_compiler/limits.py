"""Size limits: what the compiler and the runtime refuse before allocating anything. A number from an input (a
shape in the IR, a buffer in an artifact, an input array's header) is checked against these before any memory is
asked for, so that a crafted `[1, 10**12]` gets an error naming the size and the limit, not a MemoryError.

The defaults are far above any model this project runs (a Qwen2.5-1.5B decode program needs about 0.1 GiB of
buffers) and below what would exhaust a large machine. Each can be set through the environment:

| variable | default | bounds |
| --- | --- | --- |
| `NPUSIM_MAX_BYTES` | 64 GiB | a program's buffers (arena, inputs, outputs, constants); any one tensor or weight |
| `NPUSIM_MAX_IR_BYTES` | 1 GiB | an IR JSON file (or string) |

`Limits()` reads the environment when it is made; pass one to `npu_compiler.compile(..., limits=...)` to set them in
code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

MAX_BYTES_ENV = "NPUSIM_MAX_BYTES"
MAX_IR_BYTES_ENV = "NPUSIM_MAX_IR_BYTES"
DEFAULT_MAX_BYTES = 64 << 30
DEFAULT_MAX_IR_BYTES = 1 << 30
MAX_RANK = 16  # tensors of higher rank are refused (ATen's own limit is 64; no model here comes close to 16)
MAX_JSON_DEPTH = 64  # an IR nests about 8 deep (a constant's data adds its rank)
MAX_NAME_CHARS = 4096  # a node, tensor or model name


def _env_bytes(name: str, default: int) -> int:
    """A byte count from the environment: a plain integer, or with a K/M/G/T suffix (powers of 1024)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(text[-1].upper(), 1)
    digits = text[:-1] if scale != 1 else text
    try:
        value = int(digits) * scale
    except ValueError:
        from .errors import InputError

        raise InputError(f"${name}={text!r}: expected a number of bytes (like 68719476736 or 64G)") from None
    if value <= 0:
        from .errors import InputError

        raise InputError(f"${name}={text!r}: must be positive")
    return value


@dataclass(frozen=True)
class Limits:
    max_bytes: int = field(default_factory=lambda: _env_bytes(MAX_BYTES_ENV, DEFAULT_MAX_BYTES))
    max_ir_bytes: int = field(default_factory=lambda: _env_bytes(MAX_IR_BYTES_ENV, DEFAULT_MAX_IR_BYTES))
    max_rank: int = MAX_RANK

    def tensor_problem(self, shape: tuple[int, ...] | list[int], itemsize: int) -> str | None:
        """What is wrong with a tensor of `shape` under these limits (None: nothing). Every dim is bounded on its
        own too, so that a zero-size tensor cannot carry a dim whose strides overflow int64."""
        if len(shape) > self.max_rank:
            return f"rank {len(shape)} is above the limit of {self.max_rank}"
        span = 1  # elements the strides of a contiguous layout reach (zero-size dims counted as 1)
        numel = 1
        for d in shape:
            span *= max(d, 1)
            numel *= d
            if span * itemsize > self.max_bytes:
                return (f"shape {list(shape)} needs {format_bytes(_prod(shape) * itemsize)}, above the limit of "
                        f"{format_bytes(self.max_bytes)} (${MAX_BYTES_ENV})")
        return None


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= max(d, 1)
    return n


def format_bytes(n: int) -> str:
    """1536 -> '1.50 KiB'; exact for small counts."""
    if n < 1024:
        return f"{n} bytes"
    for unit, scale in (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


def limits() -> Limits:
    """The limits the environment sets now."""
    return Limits()
