"""Writing a result file atomically, with the user's umask: the data goes to a temporary file beside the target,
which replaces the target only when everything is written, so a failed or interrupted write leaves no half-written
file; the file then has the permissions a plain `open(path, "w")` would give (0666 minus the umask), not the
private 0600 of a temporary file. A target whose folder does not exist is an `OutputError` before anything is
written (no folder is created on the user's behalf unless the caller asks)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import OutputError

__all__ = ["check_writable", "atomic_path", "write_bytes", "write_text", "umask"]


def umask() -> int:
    """The process's umask, read without changing it where the system allows (Linux: /proc)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def check_writable(path: str | os.PathLike, what: str = "cannot write", make_parents: bool = False) -> Path:
    """`path` as a Path, after checking its folder exists (or making it) and that it is not itself a folder."""
    if not os.fspath(path):
        raise OutputError(f"{what} '': an empty file name")
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if make_parents:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputError(f"{what} {path}: cannot create folder {folder}: {e.strerror or e}") from None
    if not folder.is_dir():
        raise OutputError(f"{what} {path}: folder {folder} does not exist")
    if p.is_dir():
        raise OutputError(f"{what} {path}: it is a folder; give a file name")
    return p


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, make_parents: bool = False) -> Iterator[Path]:
    """Yield a temporary path in `path`'s folder; it becomes `path` (with the umask's permissions) only if the block
    finishes without an error."""
    target = check_writable(path, make_parents=make_parents)
    suffix = "".join(target.suffixes[-1:])  # writers that add an extension (np.savez) see the one they expect
    try:
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=f".tmp{suffix}")
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, target)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_bytes(path: str | os.PathLike, data: bytes, make_parents: bool = False) -> Path:
    with atomic_path(path, make_parents) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def write_text(path: str | os.PathLike, text: str, make_parents: bool = False) -> Path:
    return write_bytes(path, text.encode("utf-8"), make_parents)
