"""cuBLASLt through ctypes, for what `cublasGemmStridedBatchedEx` does not do: a GEMM that adds its bias vector in
its own epilogue (`CUBLASLT_EPILOGUE_BIAS`: D = alpha * op(A) op(B) + bias, the bias added to the fp32 accumulator
and the sum rounded once, as ATen's linear does). The plain path (the output filled with the bias, then cuBLAS with
beta = 1) costs a launch and a read of the output, and with 16-bit outputs it rounds twice: measured on the H100
(bf16, 2048 x 1536 x 2048), its result is round(round(A B) + bias) to the bit, 18% of the elements one unit off
`torch.nn.functional.linear`'s on the same GPU; this path's equals it on every element.

A plan is made once per GEMM when the executor builds its launches: descriptors, layouts and the heuristic's first
algorithm for the workspace the backend gives cuBLAS. Where the library is missing or has no algorithm for the
problem, `LtGemm.create` returns None and the executor keeps the plain path."""

from __future__ import annotations

import ctypes
import functools
import weakref
from typing import Any

from ..errors import NPURuntimeError
from .cublas import c_function, load_library

_c = ctypes

# cublasLtMatmulDescAttributes_t, cublasLtMatrixLayoutAttribute_t, cublasLtMatmulPreferenceAttributes_t, epilogues
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER, DESC_BIAS_DATA_TYPE = 3, 4, 7, 8, 26
PREF_MAX_WORKSPACE_BYTES = 1
EPILOGUE_BIAS = 4
CUDA_R_32F = 0
HEURISTIC_BYTES = 96  # cublasLtMatmulHeuristicResult_t: algo (64), workspaceSize, state, wavesCount, reserved[4]


@functools.cache
def library() -> ctypes.CDLL | None:
    try:
        return load_library("cublasLt", ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"), "cuBLASLt")
    except NPURuntimeError:
        return None  # the plain cuBLAS path serves


@functools.cache
def _fn(name: str, *argtypes: Any) -> Any:
    return c_function(library(), name, *argtypes)


class _Failed(Exception):
    pass


def _ok(status: int) -> None:
    if status != 0:
        raise _Failed(status)


@functools.cache
def _handle() -> int | None:
    """One cuBLASLt handle for the process (it holds no stream: each call names its own)."""
    if library() is None:
        return None
    h = _c.c_void_p()
    try:
        _ok(_fn("cublasLtCreate", _c.POINTER(_c.c_void_p))(_c.byref(h)))
    except _Failed:
        return None
    return h.value


def _set(setter: str, obj: int, attr: int, value: Any) -> None:
    _ok(_fn(setter, _c.c_void_p, _c.c_int, _c.c_void_p, _c.c_size_t)(obj, attr, _c.byref(value), _c.sizeof(value)))


def _destroy(objects: list[tuple[str, int]]) -> None:
    for fn, obj in objects:
        _fn(fn, _c.c_void_p)(obj)


class LtGemm:
    """One column-major GEMM D[m, n] = alpha * op(A) op(B) + bias[m], D written in place of C (cuBLAS's view of a
    row-major product, as `gemm.py` maps it)."""

    def __init__(self) -> None:
        self._objects: list[tuple[str, int]] = []
        self._finalizer = weakref.finalize(self, _destroy, self._objects)

    @classmethod
    def create(cls, p: dict[str, Any], bias: int, workspace_bytes: int) -> LtGemm | None:
        """The plan of gemm plan `p` (one call, no batch) with the bias vector at device address `bias` added in
        its epilogue, or None where cuBLASLt is unavailable or finds no algorithm."""
        handle = _handle()
        if handle is None:
            return None
        g = cls()
        try:
            g._make(handle, p, workspace_bytes)
            _set("cublasLtMatmulDescSetAttribute", g.desc, DESC_BIAS_POINTER, _c.c_void_p(bias))
        except (_Failed, AttributeError):
            g._finalizer()
            return None
        return g

    def _track(self, destroy: str, obj: int) -> int:
        self._objects.append((destroy, obj))
        return obj

    def _layout(self, dtype: int, rows: int, cols: int, ld: int) -> int:
        lay = _c.c_void_p()
        _ok(_fn("cublasLtMatrixLayoutCreate", _c.POINTER(_c.c_void_p), _c.c_int, _c.c_uint64, _c.c_uint64,
                _c.c_int64)(_c.byref(lay), dtype, rows, cols, ld))
        return self._track("cublasLtMatrixLayoutDestroy", lay.value)

    def _make(self, handle: int, p: dict[str, Any], workspace_bytes: int) -> None:
        self.handle = handle
        desc = _c.c_void_p()
        _ok(_fn("cublasLtMatmulDescCreate", _c.POINTER(_c.c_void_p), _c.c_int, _c.c_int)(
            _c.byref(desc), p["compute"], CUDA_R_32F))
        self.desc = self._track("cublasLtMatmulDescDestroy", desc.value)
        _set("cublasLtMatmulDescSetAttribute", self.desc, DESC_TRANSA, _c.c_int32(p["transa"]))
        _set("cublasLtMatmulDescSetAttribute", self.desc, DESC_TRANSB, _c.c_int32(p["transb"]))
        _set("cublasLtMatmulDescSetAttribute", self.desc, DESC_EPILOGUE, _c.c_int32(EPILOGUE_BIAS))
        _set("cublasLtMatmulDescSetAttribute", self.desc, DESC_BIAS_DATA_TYPE, _c.c_int32(p["type_c"]))
        m, n, k = p["m"], p["n"], p["k"]
        a_rows, a_cols = (m, k) if p["transa"] == 0 else (k, m)
        b_rows, b_cols = (k, n) if p["transb"] == 0 else (n, k)
        self.a = self._layout(p["type_a"], a_rows, a_cols, p["lda"])
        self.b = self._layout(p["type_b"], b_rows, b_cols, p["ldb"])
        self.c = self._layout(p["type_c"], m, n, p["ldc"])
        pref = _c.c_void_p()
        _ok(_fn("cublasLtMatmulPreferenceCreate", _c.POINTER(_c.c_void_p))(_c.byref(pref)))
        pref_v = self._track("cublasLtMatmulPreferenceDestroy", pref.value)
        _set("cublasLtMatmulPreferenceSetAttribute", pref_v, PREF_MAX_WORKSPACE_BYTES, _c.c_uint64(workspace_bytes))
        self.result = (_c.c_ubyte * HEURISTIC_BYTES)()
        found = _c.c_int(0)
        _ok(_fn("cublasLtMatmulAlgoGetHeuristic", _c.c_void_p, _c.c_void_p, _c.c_void_p, _c.c_void_p, _c.c_void_p,
                _c.c_void_p, _c.c_void_p, _c.c_int, _c.c_void_p, _c.POINTER(_c.c_int))(
            handle, self.desc, self.a, self.b, self.c, self.c, pref_v, 1, self.result, _c.byref(found)))
        if found.value < 1:
            raise _Failed(-1)
        # (handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace, its size, stream)
        self._matmul = _fn("cublasLtMatmul", *[_c.c_void_p] * 14, _c.c_size_t, _c.c_void_p)

    def run(self, alpha_ptr: int, beta_ptr: int, a: int, b: int, c: int, workspace: int, workspace_bytes: int,
            stream: int) -> None:
        """D = C (in place) = alpha * op(A) op(B) + bias; `beta_ptr` points at 0 (C is not read)."""
        try:
            _ok(self._matmul(self.handle, self.desc, alpha_ptr, a, self.a, b, self.b, beta_ptr, c, self.c, c, self.c,
                             self.result, workspace, workspace_bytes, stream))
        except _Failed as e:
            raise NPURuntimeError(f"cublasLtMatmul failed with status {e.args[0]}") from None
