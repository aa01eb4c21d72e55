"""Atomic file writes for the exporter (the one implementation is `npu_compiler.atomic`): a failed or interrupted
export never leaves a half-written file behind. The exporter creates its output folder (`-o DIR`), so parents are
made here."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from npu_compiler import atomic

__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text"]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    with atomic.atomic_path(path, make_parents=True) as tmp:
        yield tmp


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    return atomic.write_bytes(path, data, make_parents=True)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic.write_text(path, text, make_parents=True)
