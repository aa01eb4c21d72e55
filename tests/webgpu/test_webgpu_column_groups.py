"""GEMMs whose epilogue combines two column groups (act(a) * b over the halves of one projection) on the webgpu
backend against PyTorch eager in the same dtype: the skinny GEMM of a few rows computes both groups of its columns
in one workgroup. A grouped GEMM the kernel cannot hold is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fused_cases import TORCH_DTYPES, ir_dict
from gpu.util import to_np
from helpers import GluProjection, glu_case
from tolerances import assert_close

import npu_compiler
import npu_runtime
from npu_compiler.errors import NPUSimError
from npu_compiler.program import CompiledProgram
from npu_export.cnn import model_tensors

CASES = [("silu", False, False, 1, "float32"), ("gelu", True, False, 3, "float32"), ("relu", True, True, 4, "bfloat16"),
         ("silu", True, False, 2, "float16")]


@pytest.mark.parametrize("act,bias,swap,m,dtype", CASES, ids=[f"{a}_m{m}_{d}" for a, _, _, m, d in CASES])
def test_column_groups_match_torch(webgpu, act, bias, swap, m, dtype) -> None:
    module, x = glu_case(96, 40, m, act, bias, swap, TORCH_DTYPES[dtype])
    program = npu_compiler.compile(ir_dict(module, [x], "glu"), "webgpu", dtype=dtype)
    (gemm,) = program.kernels
    assert gemm.spec.acc_groups == 2
    weights = npu_runtime.load_weights(program, model_tensors(module), webgpu)
    got = webgpu.create_executor(program).run_numpy({program.inputs[0].name: to_np(x)}, weights)
    with torch.no_grad():
        ref = module(x).float().numpy()
    assert_close(got[program.outputs[0].name].astype(np.float32), ref, dtype, "accumulate", "webgpu",
                 what=f"{act} glu m={m} {dtype}")


def test_too_many_rows_for_the_workgroup_are_refused(webgpu) -> None:
    """The cpu target folds any GEMM; relabelled as a webgpu program, 8 rows of 2 groups exceed the skinny kernel's
    workgroup memory and the load says so instead of rendering something else."""
    module = GluProjection(64, 16).eval()
    program = npu_compiler.compile(ir_dict(module, [torch.randn(8, 64)], "glu"), "cpu", dtype="float32")
    assert program.kernels[0].spec.acc_groups == 2
    d = program.to_dict()
    d["target"] = "webgpu"
    d["config"] = npu_compiler.default_config("webgpu").to_dict()
    relabelled = CompiledProgram.from_dict(d)
    with pytest.raises(NPUSimError, match="column groups"):
        webgpu.create_executor(relabelled)
