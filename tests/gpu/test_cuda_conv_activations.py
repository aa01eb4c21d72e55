"""Convs with an activation in their epilogue, run on the GPU: each of cuda's conv kernels (the implicit GEMM on
mma.sync or wgmma, Hopper's direct conv, the direct kernel of grouped convs) against PyTorch on the same GPU.
tests/test_conv_activations.py renders and compiles these sources without a GPU; this runs them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fused_cases import ir_dict, module_weights
from test_conv_activations import ConvAct, TwoConvs, _init
from tolerances import assert_close

import npu_compiler
from npu_runtime import load_weights

from .util import to_np

CASES = {
    "implicit_gemm_gelu_tanh": (lambda: TwoConvs("gelu_tanh", 64), (16, 16, 32, 32), torch.float16),
    "hopper_direct_silu_scale": (lambda: TwoConvs("silu_then_scale", 64), (16, 16, 64, 64), torch.float16),
    "grouped_hardtanh": (lambda: _init(ConvAct("hardtanh", 8, 16, groups=2)), (2, 8, 8, 8), torch.float16),
    "grouped_elu_fp32": (lambda: _init(ConvAct("elu", 8, 16, groups=4)), (2, 8, 8, 8), torch.float32),
}


@pytest.mark.parametrize("name", list(CASES))
def test_conv_activation_epilogue_on_the_gpu(cuda_backend, name):
    make, shape, dtype = CASES[name]
    torch.manual_seed(0)
    model = make().eval().to(dtype)
    x = torch.randn(shape).to(dtype)
    dt = "float16" if dtype == torch.float16 else "float32"
    program = npu_compiler.compile(ir_dict(model, [x], name), "cuda", dtype=dt)
    assert all(k.spec.epilogue is not None for k in program.kernels if k.kind == "conv2d")
    weights = load_weights(program, module_weights(model), cuda_backend)
    ex = cuda_backend.create_executor(program)
    ex.poison()
    got = ex.run_numpy({program.inputs[0].name: to_np(x)}, weights)[program.outputs[0].name]
    with torch.no_grad():
        ref = model.cuda()(x.cuda()).float().cpu().numpy()
    assert_close(np.asarray(got, dtype=np.float32), ref, dt, "accumulate", "cuda", what=name)
