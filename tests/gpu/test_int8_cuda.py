"""The integer kinds on cuda bit for bit against the CPU reference (the cases of tests/int8_cases.py: requantization
edges, uint8 activations, zero points, K not a multiple of 32, odd shapes, groups, channels-last operands on the
16-byte copy path, fused residual adds), PT2E-form models run whole on the GPU (a bottleneck's add fused into its
conv on cuda, apart on the CPU), and the weight-only GEMM within float32 summation-order error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from int8_cases import check_bit_exact, check_weight_only, integer_cases, wgemm_cases

CASES = integer_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_integer_kernel_is_bit_exact(cuda_backend, case):
    check_bit_exact(cuda_backend, case)


SPLIT = [c for c in CASES if c.name in ("qconv2d channels-last many tiles", "qconv2d residual channels-last 1x1 relu",
                                        "qgemm 16-byte rows, uint8, 16-byte stores")]


@pytest.mark.parametrize("case", SPLIT, ids=[c.name for c in SPLIT])
def test_split_k_is_bit_exact(cuda_backend, case):
    """K split three ways (int32 parts in the plan's scratch, a second launch summing them)."""
    from int8_cases import feeds, program_of, reference, with_split

    program = with_split(program_of(case, "cuda"), cuda_backend.device_profile(), 3)
    got = cuda_backend.create_executor(program).run_numpy(feeds(case))["out"]
    np.testing.assert_array_equal(got, reference(case))


@pytest.mark.parametrize("case", wgemm_cases(), ids=[c.name for c in wgemm_cases()])
def test_weight_only_gemm(cuda_backend, case):
    check_weight_only(cuda_backend, case)


def _big_conv():
    from test_quant_fold import QConv

    return QConv(64, 96, 3, padding=1, act="relu")


def _block():
    from test_qconv_residual import _block

    return _block()


def _chain():
    """Two integer convs of 64 channels, the int8 tensor between them channels-last with zero point -5 (the 16-byte
    copy path on real tiles: the padding stored, the zero point's column sums)."""
    from test_quant_fold import QConv, _dq, _q

    def weight(m):
        return torch.ops.quantized_decomposed.dequantize_per_channel(m.w_q, m.w_s, m.w_z, 0, -127, 127, torch.int8)

    class Chain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = QConv(64, 64, 3), QConv(64, 128, 3)

        def forward(self, x):
            xd = _dq(_q(x, 0.03, 0, torch.int8), 0.03, 0, torch.int8)
            y = torch.relu(torch.nn.functional.conv2d(xd, weight(self.a), self.a.bias, 1, 1))
            yd = _dq(_q(y, 0.05, -5, torch.int8), 0.05, -5, torch.int8)
            return _q(torch.nn.functional.conv2d(yd, weight(self.b), self.b.bias, 2, 1), 0.05, 2, torch.int8)

    return Chain()


MODELS = [
    ("bottleneck tail, add fused", _block, [(2, 16, 5, 5), (2, 32, 5, 5)]),
    ("conv chain 64 channels", _chain, [(2, 64, 20, 20)]),
    ("conv relu", lambda: __import__("test_quant_fold").QConv(3, 8, 3, padding=1, act="relu"), [(2, 3, 9, 9)]),
    ("conv 64->96", _big_conv, [(2, 64, 14, 14)]),
    ("conv uint8 groups", lambda: __import__("test_quant_fold").QConv(8, 6, 3, stride=2, padding=1, groups=2,
                                                                      dt=torch.uint8, x_zp=128, out_zp=0),
     [(2, 8, 6, 6)]),
    ("linear", lambda: __import__("test_quant_fold").QConv(200, 130, 0, linear=True), [(3, 70, 200)]),
    ("add relu", lambda: __import__("test_quant_fold").QAdd("relu"), [(2, 3, 4, 4), (2, 3, 4, 4)]),
]


@pytest.mark.parametrize("name,make,shapes", MODELS, ids=[m[0] for m in MODELS])
def test_quantized_model_runs_whole_on_cuda(cuda_backend, name, make, shapes):
    from conftest import run_module

    from npu_runtime.cpu.backend import CpuBackend

    inputs = [torch.randn(s) for s in shapes]
    _, got, _ = run_module(cuda_backend, make, inputs)
    _, want, _ = run_module(CpuBackend(), make, inputs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
