"""Linear layers with a bias on cuBLAS (more rows than a GEMV takes) against PyTorch eager on the CPU in the same
dtype: with 16-bit operands the bias is added in cuBLASLt's epilogue (no launch filling the output with it first), and
the executor says so; float32, and an addmm whose beta is not 1, keep the fill and cuBLAS's beta."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fused_cases import TORCH_DTYPES, Lin, ir_dict
from helpers import LinearResidual
from tolerances import assert_close

import npu_compiler
import npu_runtime
from npu_export.cnn import model_tensors

from .util import to_np


class Addmm(torch.nn.Module):
    """beta * bias + x @ w: the bias scaled, which an epilogue adding it unscaled cannot do."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(k, n))
        self.b = torch.nn.Parameter(torch.zeros(n))

    def forward(self, x):
        return torch.addmm(self.b, x, self.w, beta=0.5)


CASES = {
    # name: module, rows, k, n, dtype, bias in the epilogue
    "linear_bf16": (Lin, 300, 1536, 2048, "bfloat16", True),
    "linear_fp16_odd_n": (Lin, 129, 520, 1000, "float16", True),
    "linear_residual_bf16": (LinearResidual, 256, 512, 768, "bfloat16", True),
    "linear_batched_rows_bf16": (Lin, (4, 70), 256, 384, "bfloat16", True),
    "linear_fp32": (Lin, 200, 256, 384, "float32", False),
    "addmm_beta_half_bf16": (Addmm, 200, 256, 384, "bfloat16", False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_linear_bias_matches_torch(name, cuda_backend) -> None:
    cls, rows, k, n, dtype, lt = CASES[name]
    tdt = TORCH_DTYPES[dtype]
    gen = torch.Generator().manual_seed(k + n)
    module = cls(k, n)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (k ** -0.5 if p.dim() == 2 else 1.0))
    module = module.to(tdt).eval()
    shape = rows if isinstance(rows, tuple) else (rows,)
    args = [torch.randn((*shape, k), generator=gen).to(tdt)]
    if cls is LinearResidual:
        args.append(torch.randn((*shape, n), generator=gen).to(tdt))
    program = npu_compiler.compile(ir_dict(module, args, name), "cuda", dtype=dtype)
    gemms = [c for c in program.kernels if c.kind == "gemm"]
    assert len(gemms) == 1 and gemms[0].spec.bias, [c.name for c in program.kernels]
    weights = npu_runtime.load_weights(program, model_tensors(module), cuda_backend)
    ex = cuda_backend.create_executor(program)
    feeds = {s.name: to_np(a) for s, a in zip(program.inputs, args, strict=True)}
    got = ex.run_numpy(feeds, weights)[program.outputs[0].name]
    assert ex.bias_epilogues == ({gemms[0].name} if lt else set()), ex.bias_epilogues
    with torch.no_grad():
        ref = module(*args)
    assert_close(got.astype(np.float32), ref.float().numpy(), dtype, "accumulate", "cuda", what=name)


def test_linear_bias_rounds_once(cuda_backend) -> None:
    """Integer operands make every partial sum exact in fp32 whatever cuBLAS's order, and sums past 256 are not bf16
    numbers: the bias added to the unrounded product and rounded once (as ATen's linear) is known to the bit, while
    a product rounded before the bias is added (cuBLAS with beta on a bias-filled output) differs on many elements."""
    import ml_dtypes

    gen = torch.Generator().manual_seed(7)
    rows, k, n = 256, 1024, 512
    module = Lin(k, n)
    with torch.no_grad():
        module.fc.weight.copy_(torch.randint(-8, 9, (n, k), generator=gen).float())
        module.fc.bias.copy_(torch.randint(-16, 17, (n,), generator=gen).float() / 4)  # quarters: exact in bf16
    module = module.to(torch.bfloat16).eval()
    x = torch.randint(-8, 9, (rows, k), generator=gen).to(torch.bfloat16)
    program = npu_compiler.compile(ir_dict(module, [x], "lin_exact"), "cuda", dtype="bfloat16")
    weights = npu_runtime.load_weights(program, model_tensors(module), cuda_backend)
    ex = cuda_backend.create_executor(program)
    got = ex.run_numpy({program.inputs[0].name: to_np(x)}, weights)[program.outputs[0].name]
    assert ex.bias_epilogues, "the bias was not added in the GEMM's epilogue"
    acc = x.double().numpy() @ module.fc.weight.detach().double().numpy().T  # exact: integers below 2^24
    bias = module.fc.bias.detach().double().numpy()
    once = (acc + bias).astype(np.float32).astype(ml_dtypes.bfloat16)
    twice = (acc.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64) + bias).astype(np.float32)
    twice = twice.astype(ml_dtypes.bfloat16)
    assert (np.abs(acc) > 512).mean() > 0.3, "too few sums past bf16's integers to tell the roundings apart"
    assert (once != twice).mean() > 0.05, "the two roundings agree: the test cannot tell them apart"
    np.testing.assert_array_equal(got.astype(np.float32), once.astype(np.float32))
