"""Kernel modules: every source of a program compiled with NVRTC for the device's architecture, cached on disk by
the hash of (source, architecture, NVRTC version, options), and loaded with CuPy."""

from __future__ import annotations

import hashlib
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from npu_compiler.targets.cuda import KERNEL_NAME
from npu_compiler.targets.cuda import nvrtc as nv

from ..errors import NPURuntimeError

CACHE_ENV = "NPUSIM_CACHE"


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    base = Path(root) if root else Path.home() / ".cache" / "npusim"
    d = base / "cuda"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _binary(name: str, source: str, arch: str) -> Path:
    """The CUBIN of one source for sm_<arch> (PTX for compute_90 when this NVRTC does not know the device's
    architecture), from the cache or freshly compiled."""
    ver = ".".join(map(str, nv.version()))
    key = hashlib.sha256(f"{arch}\0{ver}\0{' '.join(nv.COMMON_OPTIONS)}\0{source}".encode()).hexdigest()[:32]
    d = cache_dir()
    for ext in (".cubin", ".ptx"):
        hit = d / f"{key}{ext}"
        if hit.exists() and hit.stat().st_size:
            return hit
    target = nv.target_for(source, f"sm_{arch}")
    try:
        data, ext = nv.compile_source(source, target, name=f"{name}.cu"), ".cubin"
    except nv.NVRTCError as e:
        if "gpu-architecture" not in str(e):
            raise NPURuntimeError(f"source {name} does not compile for {target}: {e}") from e
        data, ext = nv.compile_source(source, nv.target_for(source, "compute_90"), name=f"{name}.cu"), ".ptx"
    path = d / f"{key}{ext}"
    _atomic_write(path, data)
    return path


def load_modules(sources: dict[str, str], arch: str) -> dict[str, Any]:
    """{source name: loaded CuPy RawModule} (its kernel is `npu_kernel`)."""
    import cupy  # noqa: PLC0415

    if not sources:
        return {}
    if nv.available():
        names = list(sources)
        with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1, len(names))) as pool:
            paths = list(pool.map(lambda n: _binary(n, sources[n], arch), names))
        return {n: cupy.RawModule(path=str(p)) for n, p in zip(names, paths)}
    # Without cuda-bindings: CuPy's own NVRTC (its cache, not ours).
    inc = tuple(f"-I{d}" for d in nv.include_dirs())
    return {n: cupy.RawModule(code=s, options=(*nv.COMMON_OPTIONS, *inc,
                                               *((f"--gpu-architecture={nv.target_for(s, f'sm_{arch}')}",)
                                                 if nv.ARCH_SPECIFIC in s else ())))
            for n, s in sources.items()}


def load_kernels(sources: dict[str, str], arch: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """({source name: RawKernel of its `npu_kernel`}, the modules, which must stay alive with the kernels)."""
    modules = load_modules(sources, arch)
    return {n: m.get_function(KERNEL_NAME) for n, m in modules.items()}, modules
