"""Writing a result file safely: atomically, with the user's umask, only onto a regular file or a new path, and
never over a file the same command reads.

- Atomic: the data goes to a temporary file beside the target, which replaces the target only when everything is
  written, so a failed or interrupted write leaves no half-written file; the file then has the permissions a plain
  `open(path, "w")` would give (0666 minus the umask), not the private 0600 of a temporary file.
- Where: the target must be a new path or a regular file. A symbolic link, a FIFO, a character or block device
  (`-o /dev/null`), a socket or a folder is refused with an `OutputError` naming what it is, before anything is
  written: replacing it would destroy it (as root, `/dev/null` itself).
- Not over an input: within `command_files()` (the CLI runs each command in one), every file a reader of the
  project opens is noted (`note_input`), and a write whose target is one of them (the same path, or the same file by
  device and inode: a hard link) is refused. `npusim compile m.json -o m.json` keeps its IR.
- Temporaries: named `.NAME.npusim-PID-XXXX.tmpSUFFIX` beside the target. They are removed when the write fails,
  on Ctrl-C, and on SIGTERM/SIGHUP (`remove_temporaries`, which the CLI's signal handler calls); a SIGKILL cannot
  be caught and leaves one, so the next write of the same target removes the temporaries of that name whose process
  no longer runs (`sweep_stale`).

A target whose folder does not exist is an `OutputError` before anything is written (no folder is created on the
user's behalf unless the caller asks).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from .errors import OutputError

__all__ = ["check_writable", "check_target", "atomic_path", "write_bytes", "write_text", "umask", "command_files",
           "note_input", "remove_temporaries", "sweep_stale", "TEMP_MARK"]

TEMP_MARK = ".npusim-"  # in every temporary's name: `.{target name}.npusim-{pid}-{random}.tmp{suffix}`

_lock = threading.Lock()
_live: set[str] = set()  # temporaries being written now (removed on SIGTERM by remove_temporaries)
_inputs: list[dict[tuple[int, int], str]] = []  # stack of active command_files(): (st_dev, st_ino) -> path read


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


# ---- the command's own inputs ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def command_files(inputs: Iterable[str | os.PathLike] = ()) -> Iterator[None]:
    """For the block: remember every file read (`note_input`, plus `inputs`), and refuse to write over any of them."""
    with _lock:
        _inputs.append({})
    try:
        for p in inputs:
            note_input(p)
        yield
    finally:
        with _lock:
            _inputs.pop()


def note_input(path: str | os.PathLike) -> None:
    """`path` is read by the current command (a no-op outside `command_files`, or for a path that is not a file)."""
    if not _inputs:
        return
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return
    if stat.S_ISREG(st.st_mode):
        with _lock:
            if _inputs:
                _inputs[-1][(st.st_dev, st.st_ino)] = os.fspath(path)


def _input_named(st: os.stat_result) -> str | None:
    with _lock:
        return _inputs[-1].get((st.st_dev, st.st_ino)) if _inputs else None


# ---- the target ------------------------------------------------------------------------------------------------------

_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a folder"))


def check_target(path: str | os.PathLike, what: str = "cannot write") -> None:
    """Refuse a target that is not a new path or a regular file, or that is a file the current command reads."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise OutputError(f"{what} {os.fspath(path)}: {e.strerror or e}") from None
    for test, kind in _KINDS:
        if test(st.st_mode):
            fix = "give a file name" if kind == "a folder" else "give a new path or a regular file"
            raise OutputError(f"{what} {os.fspath(path)}: it is {kind}; npusim writes only to regular files or new "
                              f"paths ({fix})")
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{what} {os.fspath(path)}: not a regular file")
    read = _input_named(st)
    if read is not None:
        same = "" if os.path.abspath(read) == os.path.abspath(path) else f" (the same file as {read})"
        raise OutputError(f"{what} {os.fspath(path)}: it is an input of this command{same}; writing it would "
                          "destroy what the command reads: give another output path")


def check_writable(path: str | os.PathLike, what: str = "cannot write", make_parents: bool = False) -> Path:
    """`path` as a Path, after checking its folder exists (or making it) and that the path itself may be written
    (`check_target`)."""
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
    check_target(p, what)
    return p


# ---- temporaries -----------------------------------------------------------------------------------------------------


def _prefix(target: Path) -> str:
    return f".{target.name}{TEMP_MARK}"


def _uid(st: os.stat_result) -> int:
    return os.getuid() if hasattr(os, "getuid") else st.st_uid


def _pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # another user's process (or a number no process can have: left alone)
    return True


def sweep_stale(target: str | os.PathLike) -> list[Path]:
    """Remove the temporaries of `target` that a killed write left: regular files of this user, named as this module
    names them, whose process no longer runs. Returns what was removed."""
    target = Path(target)
    folder = target.parent if str(target.parent) else Path(".")
    prefix = _prefix(target)
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(prefix) or ".tmp" not in entry.name:
            continue
        pid_text = entry.name[len(prefix):].split("-", 1)[0]
        if not pid_text.isdigit() or _pid_runs(int(pid_text)):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_uid == _uid(st):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            continue
    return removed


def remove_temporaries() -> None:
    """Remove every temporary being written now (from a signal handler: the write will not finish)."""
    with _lock:
        names = list(_live)
        _live.clear()
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(name)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, make_parents: bool = False) -> Iterator[Path]:
    """Yield a temporary path in `path`'s folder; it becomes `path` (with the umask's permissions) only if the block
    finishes without an error."""
    target = check_writable(path, make_parents=make_parents)
    sweep_stale(target)
    suffix = "".join(target.suffixes[-1:])  # writers that add an extension (np.savez) see the one they expect
    try:
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f"{_prefix(target)}{os.getpid()}-",
                                        suffix=f".tmp{suffix}")
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
    with _lock:
        _live.add(tmp_name)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~umask())
        check_target(target)  # again: the path may have been replaced while the data was made
        os.replace(tmp, target)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        with _lock:
            _live.discard(tmp_name)


def write_bytes(path: str | os.PathLike, data: bytes, make_parents: bool = False) -> Path:
    with atomic_path(path, make_parents) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def write_text(path: str | os.PathLike, text: str, make_parents: bool = False) -> Path:
    return write_bytes(path, text.encode("utf-8"), make_parents)
