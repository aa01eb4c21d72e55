"""GEMM kernels map to cuBLAS (`cublasGemmStridedBatchedEx`): this module turns a gemm KernelCall into the plan the
runtime executes as is (no source: the runtime only resolves pointers).

cuBLAS is column-major. A row-major product C = A @ B is computed as C^T = B^T @ A^T: cuBLAS's first operand is
our B and its second our A. A row-major operand read as column-major memory already is its transpose (op N); a
column-major (transposed-view) operand needs op T. Batch dims are collapsed where their strides allow; the
innermost remaining batch dim becomes the strided batch and any outer ones become separate calls.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from ...errors import NPUCompileError
from ...program import CompiledProgram, KernelCall

OP_N, OP_T = 0, 1
CUDA_R = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14}  # cudaDataType
COMPUTE_32F, COMPUTE_64F = 68, 70  # cublasComputeType_t (32F: no TF32, so fp32 GEMMs stay fp32)
# (A/B dtype, C dtype) pairs cublasGemmEx accepts with the compute type used for them
SUPPORTED = {
    ("float32", "float32"): COMPUTE_32F,
    ("float16", "float16"): COMPUTE_32F,
    ("bfloat16", "bfloat16"): COMPUTE_32F,
    ("float16", "float32"): COMPUTE_32F,
    ("bfloat16", "float32"): COMPUTE_32F,
    ("float64", "float64"): COMPUTE_64F,
}


def operand_layout(rows: int, cols: int, s_row: int, s_col: int) -> tuple[int, int] | None:
    """(op, ld) that makes cuBLAS read the transpose of a rows x cols operand stored with these strides, or None."""
    if (s_col == 1 or cols == 1) and (rows == 1 or s_row >= cols):
        return OP_N, max(s_row if rows > 1 else cols, cols, 1)
    if (s_row == 1 or rows == 1) and (cols == 1 or s_col >= rows):
        return OP_T, max(s_col if cols > 1 else rows, rows, 1)
    return None


def collapse_batch(sizes: list[int], strides: list[list[int]]) -> list[tuple[int, list[int]]]:
    """Batch dims (outer first) as [(size, [stride per operand])], size-1 dims dropped and neighbours merged when
    every operand steps through both as through one dim."""
    dims = [(n, [s[d] for s in strides]) for d, n in enumerate(sizes) if n != 1]
    merged: list[tuple[int, list[int]]] = []
    for n, st in dims:
        if merged:
            pn, pst = merged[-1]
            if all(ps == s * n for ps, s in zip(pst, st)):
                merged[-1] = (pn * n, st)
                continue
        merged.append((n, st))
    return merged


def gemm_plan(k: KernelCall, program: CompiledProgram) -> dict[str, Any]:
    spec = k.spec
    a, b = k.args[0], k.args[1]
    out = k.outs[0]
    m, n, kk = spec.m, spec.n, spec.k
    ad, bd, od = (program.buffers[r.buffer].dtype for r in (a, b, out))
    where = f"kernel {k.name} (nodes {', '.join(k.nodes[:3])})"
    if ad != bd:
        raise NPUCompileError(f"{where}: cuda gemm needs operands of one dtype, got {ad} and {bd}")
    compute = SUPPORTED.get((ad, od))
    if compute is None:
        raise NPUCompileError(f"{where}: cuda gemm does not support {ad} operands with a {od} result")
    if tuple(a.shape[-2:]) != (m, kk) or tuple(b.shape[-2:]) != (kk, n) or tuple(out.shape[-2:]) != (m, n):
        raise NPUCompileError(f"{where}: gemm shapes {a.shape} @ {b.shape} -> {out.shape} do not match m, n, k")
    la = operand_layout(m, kk, a.strides[-2], a.strides[-1])
    lb = operand_layout(kk, n, b.strides[-2], b.strides[-1])
    if la is None or lb is None:
        raise NPUCompileError(f"{where}: gemm operand without a unit-stride dim (strides {a.strides}, {b.strides})")
    if not ((out.strides[-1] == 1 or n == 1) and (m == 1 or out.strides[-2] >= n)):
        raise NPUCompileError(f"{where}: gemm result must be row-major, got strides {out.strides}")
    ldc = max(out.strides[-2] if m > 1 else n, n, 1)
    batch = list(out.shape[:-2])
    if list(a.shape[:-2]) != batch or list(b.shape[:-2]) != batch:
        raise NPUCompileError(f"{where}: gemm batch dims {a.shape[:-2]}, {b.shape[:-2]} -> {batch}")
    # operand order here is cuBLAS's: A' = our b, B' = our a, C' = out
    dims = collapse_batch(batch, [list(b.strides[:-2]), list(a.strides[:-2]), list(out.strides[:-2])])
    if dims:
        count, (sa, sb, sc) = dims[-1][0], dims[-1][1]
        outer = dims[:-1]
    else:
        count, sa, sb, sc = 1, 0, 0, m * n
        outer = []
    calls = []
    for idx in itertools.product(*[range(sz) for sz, _ in outer]):
        oa = b.offset + sum(i * st[0] for i, (_, st) in zip(idx, outer))
        ob = a.offset + sum(i * st[1] for i, (_, st) in zip(idx, outer))
        oc = out.offset + sum(i * st[2] for i, (_, st) in zip(idx, outer))
        calls.append([oa, ob, oc])
    return {
        "bias_epilogue": _bias_epilogue(k, program, count, calls),
        "transa": lb[0], "transb": la[0],
        "m": n, "n": m, "k": kk,
        "lda": lb[1], "ldb": la[1], "ldc": ldc,
        "stride_a": sa, "stride_b": sb, "stride_c": sc, "batch_count": count,
        "calls": calls,
        "a_arg": 1, "b_arg": 0,
        "dtype_a": bd, "dtype_b": ad, "dtype_c": od,
        "type_a": CUDA_R[bd], "type_b": CUDA_R[ad], "type_c": CUDA_R[od], "compute": compute,
        "alpha": float(spec.alpha),
        "beta": float(spec.beta) if spec.bias else 0.0,
        "flops": 2 * m * n * kk * math.prod(batch),
    }


def _bias_epilogue(k: KernelCall, program: CompiledProgram, batch_count: int, calls: list) -> dict[str, int] | None:
    """Where the runtime may add the bias in cuBLASLt's epilogue instead of filling the output with it first (the
    launch before the GEMM): one call of 16-bit operands, beta 1 (the epilogue adds the bias unscaled), and a bias
    of the output's dtype that is one row broadcast over the output's rows (its vector is cuBLAS's per-row bias of
    the column-major result). {"arg": the bias's argument index, "offset": its element offset}."""
    spec = k.spec
    if not spec.bias or spec.beta != 1.0 or batch_count != 1 or len(calls) != 1:
        return None
    a, bias, out = k.args[0], k.args[2], k.outs[0]
    if program.dtype_of(a) not in ("bfloat16", "float16") or program.dtype_of(bias) != program.dtype_of(out):
        return None
    n = spec.n
    if any(s != 0 for s in bias.strides[:-1]) or (n > 1 and bias.strides[-1] != 1):
        return None
    return {"arg": 2, "offset": int(bias.offset)}
