"""NVRTC through `cuda.bindings.nvrtc`: CUDA C -> PTX or CUBIN with no GPU (CI uses it to check every source; the
runtime uses it to build the kernels it loads). Needs the pinned pip packages of ENVIRONMENT.md (cuda-bindings and
nvidia-cuda-nvrtc 13.0.x, nvidia-cuda-runtime for the headers); neither torch nor CuPy.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile

# --fmad=false: no multiply-add contraction, so that a fused chain of +, - and * rounds exactly as the op-by-op
# reference does (the kernels that want a fused multiply-add call fmaf explicitly).
COMMON_OPTIONS = ("--std=c++17", "-default-device", "--fmad=false")


class NVRTCError(RuntimeError):
    """A source did not compile; the message carries NVRTC's log."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message + (f"\n{log}" if log else ""))
        self.log = log


def _nvrtc():
    from cuda.bindings import nvrtc  # noqa: PLC0415  (optional dependency)

    return nvrtc


def available() -> bool:
    try:
        _nvrtc()
        version()
    except Exception:  # noqa: BLE001  (ImportError, or a missing libnvrtc found only when it is loaded)
        return False
    return True


@functools.cache
def version() -> tuple[int, int]:
    nvrtc = _nvrtc()
    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "nvrtcVersion")
    return int(major), int(minor)


@functools.cache
def include_dirs() -> tuple[str, ...]:
    """Folders holding cuda_fp16.h / cuda_bf16.h: the pip headers (nvidia-cuda-runtime), else a CUDA toolkit."""
    dirs: list[str] = []
    try:
        import cuda.pathfinder as pf  # noqa: PLC0415

        for lib in ("cudart", "cccl"):
            try:
                d = pf.find_nvidia_header_directory(lib)
            except Exception:  # noqa: BLE001  (pathfinder raises its own not-found errors)
                d = None
            if d and d not in dirs:
                dirs.append(d)
    except ImportError:
        pass
    if not any(os.path.exists(os.path.join(d, "cuda_fp16.h")) for d in dirs):
        for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
            if root and os.path.exists(os.path.join(root, "include", "cuda_fp16.h")):
                dirs.append(os.path.join(root, "include"))
                break
    return tuple(dirs)


def _check(err, what: str) -> None:
    nvrtc = _nvrtc()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, msg = nvrtc.nvrtcGetErrorString(err)
        raise NVRTCError(f"{what} failed: {msg.decode() if isinstance(msg, bytes) else msg}")


# A source with this line uses features of its architecture's arch-specific target (Hopper's `wgmma`: sm_90a), which
# runs on that architecture only; the renderer adds it where the device is that architecture.
ARCH_SPECIFIC = "// npu: arch-specific target"


def target_for(source: str, arch: str) -> str:
    """The NVRTC target of `source` for `arch` ("sm_90", "compute_90"): its arch-specific one ("sm_90a") where the
    source says it needs it."""
    return arch + "a" if ARCH_SPECIFIC in source and not arch.endswith("a") else arch


def compile_source(source: str, arch: str = "compute_90", *, name: str = "kernel.cu",
                   options: tuple[str, ...] = ()) -> bytes:
    """Compile `source`. `arch` "compute_XY" gives PTX, "sm_XY" gives CUBIN (for that exact device)."""
    nvrtc = _nvrtc()
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}", *COMMON_OPTIONS, *[f"-I{d}" for d in include_dirs()], *options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise NVRTCError(f"NVRTC could not compile {name} for {arch}", _log(prog))
        if arch.startswith("sm_"):
            err, size = nvrtc.nvrtcGetCUBINSize(prog)
            _check(err, "nvrtcGetCUBINSize")
            buf = b" " * size
            (err,) = nvrtc.nvrtcGetCUBIN(prog, buf)
            _check(err, "nvrtcGetCUBIN")
            return buf
        err, size = nvrtc.nvrtcGetPTXSize(prog)
        _check(err, "nvrtcGetPTXSize")
        buf = b" " * size
        (err,) = nvrtc.nvrtcGetPTX(prog, buf)
        _check(err, "nvrtcGetPTX")
        return buf.rstrip(b"\x00")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _log(prog) -> str:
    nvrtc = _nvrtc()
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
        return ""
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\x00").decode(errors="replace")


def ptxas_path() -> str | None:
    found = shutil.which("ptxas")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and os.path.exists(os.path.join(root, "bin", "ptxas")):
            return os.path.join(root, "bin", "ptxas")
    return None


def ptxas_check(ptx: bytes, arch: str = "sm_90") -> str:
    """Assemble PTX with `ptxas` (a stricter check than NVRTC alone: register and PTX-version errors); returns its
    resource report. Raises NVRTCError on failure."""
    exe = ptxas_path()
    if exe is None:
        raise FileNotFoundError("ptxas is not on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "wb") as f:
            f.write(ptx)
        proc = subprocess.run([exe, f"-arch={arch}", "-v", src, "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise NVRTCError(f"ptxas -arch={arch} failed", proc.stderr)
    return proc.stderr
