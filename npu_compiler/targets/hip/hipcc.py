"""Compiling the hip target's sources with hipcc, to AMD code objects: proof that the rendered HIP C++ is valid for
an AMD architecture, and what a HIP runtime would load.

hipcc is Debian's `hipcc` package (ROCm 5.2: clang 15 with the HIP headers and the AMD device libraries; `apt-get
install hipcc`). It needs no GPU. Where `nvcc` is on the PATH it would pick the NVIDIA platform, so it is run with
`HIP_PLATFORM=amd`. Its clang knows gfx90a (CDNA2, the MI200s) but not gfx942 (MI300): `check_sources` refuses an
arch the compiler does not take rather than checking another one.

Each hipcc run costs about a second of parsing the HIP headers before any kernel, so `check_sources` compiles many
sources in one translation unit (`bundle`: the shared prelude once, each source's own text in a namespace of its
own, its `extern "C"` dropped so that the kernels' names do not collide), units in parallel, each distinct text
once per process; a unit that fails is split in halves until the sources at fault stand alone.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Collection, Iterable
from concurrent.futures import ThreadPoolExecutor

from ...errors import NPUCompileError

ENV = {"HIP_PLATFORM": "amd"}
FLAGS = ("--genco", "-O3")
# the architectures Debian's hipcc (clang 15) compiles for, of those the chip table names
KNOWN_ARCHS = ("gfx90a",)
# at most this many sources a translation unit: a unit costs about 0.9 s of parsing the HIP headers, a kernel about
# 0.03 s at -O3 (measured: 400 of the op conformance table's sources took 36 s of CPU time in units of 24, 13 s in
# units of 200, 11.5 s in one)
UNIT_SOURCES = 256
STREAM_UNIT = 160  # sources a unit where they arrive one by one (`check_sources` given an iterator)
TIMEOUT_S = 600
_EXTERN = 'extern "C" __global__'

_checked: dict[str, str | None] = {}  # digest of (arch, text) -> None (compiled) or hipcc's message


class HipccError(NPUCompileError):
    """hipcc rejected a source; the message holds its diagnostics."""


def hipcc_path() -> str | None:
    return shutil.which("hipcc")


def available() -> bool:
    return hipcc_path() is not None


def _run(text: str, arch: str, workdir: str, tag: str) -> str | None:
    """Compile one translation unit; None, or hipcc's diagnostics."""
    src = os.path.join(workdir, f"{tag}.hip")
    with open(src, "w") as f:
        f.write(text)
    cmd = [hipcc_path() or "hipcc", f"--offload-arch={arch}", *FLAGS, src, "-o", os.path.join(workdir, f"{tag}.hsaco")]
    try:
        done = subprocess.run(cmd, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"hipcc ran past {TIMEOUT_S} s"
    return None if done.returncode == 0 else (done.stderr or done.stdout or f"hipcc exit status {done.returncode}")


def compile_source(text: str, arch: str = "gfx90a") -> bytes:
    """One source's code object (a clang offload bundle holding the gfx ELF); HipccError with hipcc's message."""
    _check_arch(arch)
    with tempfile.TemporaryDirectory(prefix="npusim-hipcc-") as tmp:
        err = _run(text, arch, tmp, "k")
        if err is not None:
            raise HipccError(f"hipcc --offload-arch={arch} rejected the source:\n{err}")
        with open(os.path.join(tmp, "k.hsaco"), "rb") as f:
            return f.read()


def bundle(texts: list[str], prelude: str) -> str:
    """One translation unit compiling every text (each of which starts with `prelude`): the prelude once, then each
    text's own part in `namespace npu_k<i>`, its kernel declared without C linkage."""
    parts = [prelude]
    for i, text in enumerate(texts):
        if not text.startswith(prelude) or text.count(_EXTERN) != 1:
            raise ValueError(f"source {i} does not start with the prelude or has not one kernel")
        parts.append(f"namespace npu_k{i} {{\n{text[len(prelude):].replace(_EXTERN, '__global__')}\n}}  // npu_k{i}\n")
    return "\n".join(parts)


def _check_arch(arch: str) -> None:
    if arch not in KNOWN_ARCHS:
        raise NPUCompileError(f"hipcc here compiles for {', '.join(KNOWN_ARCHS)}, not {arch} (Debian's hipcc is "
                              "ROCm 5.2's clang 15)")


def check_sources(texts: Iterable[str], prelude: str, arch: str = "gfx90a", jobs: int | None = None,
                  unit: int | None = None) -> dict[str, str]:
    """Compile every distinct text (each starting with `prelude`) for `arch`, `jobs` hipcc runs at once (default:
    the machine's cores), at most `unit` texts a translation unit (default: a collection's texts spread evenly over
    the jobs, at most UNIT_SOURCES each; an iterator's STREAM_UNIT each, every unit compiled as soon as it is full,
    so that producing the texts, such as compiling the programs they come from, overlaps compiling them); returns
    {text: hipcc's message} for each that fails. Texts compiled before in this process are not compiled again. A
    unit that fails is split in halves, and those that fail again, until the sources at fault are compiled alone."""
    _check_arch(arch)
    if not available():
        raise NPUCompileError("hipcc is not installed (apt-get install hipcc)")
    jobs = jobs or os.cpu_count() or 2
    if unit is None:
        unit = (min(UNIT_SOURCES, max(1, -(-len(texts) // jobs))) if isinstance(texts, Collection)
                else STREAM_UNIT)

    def key(text: str) -> str:
        return hashlib.sha256(f"{arch}\0{' '.join(FLAGS)}\0{text}".encode()).hexdigest()

    seen: dict[str, None] = {}
    with tempfile.TemporaryDirectory(prefix="npusim-hipcc-") as tmp, ThreadPoolExecutor(max_workers=jobs) as pool:
        def run(members: list[str], tag: str) -> None:
            text = members[0] if len(members) == 1 else bundle(members, prelude)
            err = _run(text, arch, tmp, tag)
            if err is None or len(members) == 1:
                for t in members:
                    _checked[key(t)] = err
                return
            half = len(members) // 2
            run(members[:half], tag + "a")
            run(members[half:], tag + "b")
            if not any(_checked[key(t)] for t in members):  # (the sources pass alone, not together: a failure too)
                _checked[key(members[0])] = f"a translation unit of {len(members)} sources failed:\n{err}"

        futures, pending = [], []
        for t in texts:
            if t in seen:
                continue
            seen[t] = None
            if key(t) in _checked:
                continue
            if not t.startswith(prelude) or t.count(_EXTERN) != 1:
                futures.append(pool.submit(run, [t], f"u{len(futures)}"))  # compiled as it is
                continue
            pending.append(t)
            if len(pending) >= unit:
                futures.append(pool.submit(run, pending, f"u{len(futures)}"))
                pending = []
        if pending:
            futures.append(pool.submit(run, pending, f"u{len(futures)}"))
        for f in futures:
            f.result()
    return {t: _checked[key(t)] for t in seen if _checked.get(key(t))}


__all__ = ["ENV", "FLAGS", "HipccError", "KNOWN_ARCHS", "available", "bundle", "check_sources", "compile_source",
           "hipcc_path"]
