"""GEMMs map to hipBLAS (`hipblasGemmStridedBatchedEx`, rocBLAS underneath) as the cuda target's map to cuBLAS: this
module turns a gemm KernelCall into the plan a HIP runtime would execute as is (no source: it only resolves
pointers). The hip target is compile-only, so nothing executes the plan here; the tests check that it computes the
record's product by emulating the column-major call in NumPy.

hipBLAS reads matrices column-major, as cuBLAS does, and takes the same (operand dtype, result dtype) pairs with
float32 accumulation (float64 for float64): the layout is cuda/gemm.py's (our row-major product C = A @ B computed
as C^T = B^T @ A^T, batch dims collapsed where their strides allow). Types and operations are named, not numbered:
hipBLAS's enums changed between ROCm releases (`hipblasDatatype_t` before 6.0, `hipDataType` and
`hipblasComputeType_t` after), so a runtime maps the names onto the ones of the library it loads.
"""

from __future__ import annotations

from typing import Any

from ...program import CompiledProgram, KernelCall
from ..cuda.gemm import OP_N, SUPPORTED, gemm_plan

FUNCTION = "hipblasGemmStridedBatchedEx"
HIP_TYPES = {"float32": "HIP_R_32F", "float16": "HIP_R_16F", "bfloat16": "HIP_R_16BF", "float64": "HIP_R_64F"}


def blas_can(k: KernelCall, program: CompiledProgram) -> bool:
    """Whether hipBLAS takes this GEMM's dtypes: operands of one float dtype and a result of the pairs above."""
    ad, bd, od = (program.dtype_of(r) for r in (k.args[0], k.args[1], k.outs[0]))
    return ad == bd and (ad, od) in SUPPORTED


def hipblas_plan(k: KernelCall, program: CompiledProgram) -> dict[str, Any]:
    """The call(s) of one GEMM record: `transa`/`transb` ("N" or "T"), m, n, k, leading dimensions and batch
    strides (elements), `calls` (each the element offsets of A, B and C for one strided-batched call), which of
    the record's arguments are A and B, the dtypes and their hipBLAS names, the compute type, alpha and beta (beta
    scales C, which a launch before the call filled with the bias where the record has one; 0 otherwise)."""
    p = gemm_plan(k, program)
    compute = "HIPBLAS_COMPUTE_64F" if p["dtype_c"] == "float64" else "HIPBLAS_COMPUTE_32F"
    keep = ("m", "n", "k", "lda", "ldb", "ldc", "stride_a", "stride_b", "stride_c", "batch_count", "calls", "a_arg",
            "b_arg", "dtype_a", "dtype_b", "dtype_c", "alpha", "beta", "flops")
    return {"function": FUNCTION, **{key: p[key] for key in keep},
            "transa": "N" if p["transa"] == OP_N else "T", "transb": "N" if p["transb"] == OP_N else "T",
            "type_a": HIP_TYPES[p["dtype_a"]], "type_b": HIP_TYPES[p["dtype_b"]], "type_c": HIP_TYPES[p["dtype_c"]],
            "compute": compute}


def call_text(plan: dict[str, Any]) -> str:
    """The plan as the host code a HIP runtime would run for it (for `npusim describe --source`): one hipBLAS call
    for each of its `calls`, the record's buffers named as the kernels name them (`out0`, `a0`, ...), offsets in
    elements."""
    scalar, suffix = ("double", "") if plan["compute"] == "HIPBLAS_COMPUTE_64F" else ("float", "f")
    lines = [f"// {len(plan['calls'])} hipBLAS call(s): column-major C^T = op(B^T) op(A^T), {plan['flops']} FLOPs; "
             "no kernel source (rocBLAS's own GEMM)",
             f"const {scalar} alpha = {plan['alpha']!r}{suffix}, beta = {plan['beta']!r}{suffix};"]
    for oa, ob, oc in plan["calls"]:
        lines.append(
            f"{FUNCTION}(handle, HIPBLAS_OP_{plan['transa']}, HIPBLAS_OP_{plan['transb']}, {plan['m']}, {plan['n']}, "
            f"{plan['k']}, &alpha, a{plan['a_arg']} + {oa}, {plan['type_a']}, {plan['lda']}, {plan['stride_a']}, "
            f"a{plan['b_arg']} + {ob}, {plan['type_b']}, {plan['ldb']}, {plan['stride_b']}, &beta, out0 + {oc}, "
            f"{plan['type_c']}, {plan['ldc']}, {plan['stride_c']}, {plan['batch_count']}, {plan['compute']}, "
            "HIPBLAS_GEMM_DEFAULT);")
    return "\n".join(lines) + "\n"
