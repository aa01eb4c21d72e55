"""The SHA-256 of a checkpoint, as an artifact records it (`CompiledProgram.weights_sha256`) and `run` compares it:
of a safetensors file, its bytes; of a folder of shards, one line per `*.safetensors` file in name order
("NAME SHA256\\n", as `sha256sum` prints them) hashed again, so that the digest of a folder changes when any shard
changes, is renamed, added or removed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .errors import WeightError

__all__ = ["weights_digest", "short"]

_CHUNK = 1 << 24


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def weights_digest(source: str | os.PathLike) -> str:
    """The SHA-256 (64 hex digits) of a safetensors file or a folder of them."""
    p = Path(source)
    try:
        if p.is_dir():
            shards = sorted(q for q in p.iterdir() if q.name.endswith(".safetensors") and q.is_file())
            if not shards:
                raise WeightError(f"{p}: no *.safetensors files to take the SHA-256 of")
            lines = "".join(f"{q.name} {_file_digest(q)}\n" for q in shards)
            return hashlib.sha256(lines.encode("utf-8")).hexdigest()
        return _file_digest(p)
    except OSError as e:
        raise WeightError(f"cannot read {p} to take its SHA-256: {e.strerror or e}") from None


def short(digest: str | None) -> str:
    """The first 12 hex digits, for a line of output."""
    return "-" if digest is None else digest[:12]
