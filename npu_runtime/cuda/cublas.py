"""cuBLAS through ctypes: a handle on the backend's stream with a workspace of its own, and
`cublasGemmStridedBatchedEx`. CuPy's wrapper refuses to run while a stream is being captured; the library itself
supports capture (with a user workspace, no allocation happens inside it), so the calls go to it directly."""

from __future__ import annotations

import ctypes
import functools
from typing import Any

from ..errors import NPURuntimeError

WORKSPACE_BYTES = 32 << 20
_c = ctypes


def load_library(pathfinder_name: str, sonames: tuple[str, ...], what: str) -> ctypes.CDLL:
    """An NVIDIA library as CuPy loads it (through cuda-pathfinder: the same file, so the same library instance in
    the process), else by its sonames; NPURuntimeError naming every attempt where none loads."""
    errors = []
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib  # noqa: PLC0415

        loaded = load_nvidia_dynamic_lib(pathfinder_name)
        if loaded.abs_path:
            return ctypes.CDLL(loaded.abs_path)
    except Exception as e:  # noqa: BLE001  (pathfinder's own not-found errors)
        errors.append(str(e))
    for name in sonames:
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
    raise NPURuntimeError(f"cannot load {what}: {'; '.join(errors)}")


def c_function(lib: ctypes.CDLL, name: str, *argtypes: Any) -> Any:
    """`name` of `lib` with its argument types, returning a status int."""
    f = getattr(lib, name)
    f.argtypes = list(argtypes)
    f.restype = _c.c_int
    return f


@functools.cache
def library() -> ctypes.CDLL:
    return load_library("cublas", ("libcublas.so.13", "libcublas.so.12", "libcublas.so"), "cuBLAS")


@functools.cache
def _fn(name: str, *argtypes: Any) -> Any:
    return c_function(library(), name, *argtypes)


def _check(status: int, what: str) -> None:
    if status != 0:
        raise NPURuntimeError(f"cuBLAS {what} failed with status {status}")


class Handle:
    """A cuBLAS handle bound to one stream, with its own workspace (allocated by the caller, kept alive here)."""

    def __init__(self, stream_ptr: int, workspace_ptr: int, workspace_bytes: int, keep: Any = None) -> None:
        h = _c.c_void_p()
        _check(_fn("cublasCreate_v2", _c.POINTER(_c.c_void_p))(_c.byref(h)), "cublasCreate")
        self.ptr = h.value
        self._keep = keep
        _check(_fn("cublasSetStream_v2", _c.c_void_p, _c.c_void_p)(self.ptr, stream_ptr), "cublasSetStream")
        _check(_fn("cublasSetWorkspace_v2", _c.c_void_p, _c.c_void_p, _c.c_size_t)(self.ptr, workspace_ptr,
                                                                                     workspace_bytes),
               "cublasSetWorkspace")

    def gemm_strided_batched(self, transa: int, transb: int, m: int, n: int, k: int, alpha_ptr: int, a: int,
                             a_type: int, lda: int, stride_a: int, b: int, b_type: int, ldb: int, stride_b: int,
                             beta_ptr: int, c: int, c_type: int, ldc: int, stride_c: int, batch: int, compute: int,
                             algo: int = -1) -> None:
        f = _fn("cublasGemmStridedBatchedEx",
                _c.c_void_p, _c.c_int, _c.c_int, _c.c_int, _c.c_int, _c.c_int,
                _c.c_void_p, _c.c_void_p, _c.c_int, _c.c_int, _c.c_longlong,
                _c.c_void_p, _c.c_int, _c.c_int, _c.c_longlong,
                _c.c_void_p, _c.c_void_p, _c.c_int, _c.c_int, _c.c_longlong,
                _c.c_int, _c.c_int, _c.c_int)
        _check(f(self.ptr, transa, transb, m, n, k, alpha_ptr, a, a_type, lda, stride_a, b, b_type, ldb, stride_b,
                 beta_ptr, c, c_type, ldc, stride_c, batch, compute, algo), "cublasGemmStridedBatchedEx")
