"""The integer kinds on webgpu (`npu_compiler/targets/webgpu/int8_kernels.py`) bit for bit against the CPU
reference, with the packed 4x8-bit dot products where the adapter has them and without; the weight-only GEMM
within float32 summation-order error (docs/tolerances.md)."""

from __future__ import annotations

import numpy as np
import pytest
from int8_cases import check_bit_exact, check_weight_only, integer_cases, qgemm_cases, reference, run_case, wgemm_cases

# (a conv with a fused residual add is a record only targets that fuse it get: cuda; webgpu refuses it by name,
# tests/test_qconv_residual.py)
CASES = [c for c in integer_cases() if getattr(c.spec, "residual", None) is None]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_integer_kernel_is_bit_exact(webgpu, case):
    check_bit_exact(webgpu, case)


@pytest.mark.parametrize("case", qgemm_cases()[:4], ids=[c.name for c in qgemm_cases()[:4]])
def test_qgemm_without_packed_dot_products(webgpu, case, monkeypatch):
    from npu_runtime.webgpu import backend as wb

    monkeypatch.setenv(wb.PACKED_ENV, "0")
    state = wb.device_state()
    state.__dict__.pop("packed_dot", None)
    try:
        np.testing.assert_array_equal(run_case(webgpu, case), reference(case))
    finally:
        state.__dict__.pop("packed_dot", None)


def test_packed_path_is_taken_where_the_adapter_has_it(webgpu):
    from int8_cases import program_of

    from npu_compiler.targets.webgpu import WebGPUTarget
    from npu_compiler.targets.webgpu.bindings import DeviceCaps
    from npu_runtime.webgpu.backend import device_state

    case = qgemm_cases()[1]
    program = program_of(case, "webgpu")
    (text, _), = WebGPUTarget(caps=DeviceCaps(packed_dot=True)).render_kernel(0, program.kernels[0], program)
    assert "dot4I8Packed" in text
    (plain, _), = WebGPUTarget(caps=DeviceCaps(packed_dot=False)).render_kernel(0, program.kernels[0], program)
    assert "dot4I8Packed" not in plain
    assert isinstance(device_state().packed_dot, bool)


@pytest.mark.parametrize("case", wgemm_cases(), ids=[c.name for c in wgemm_cases()])
def test_weight_only_gemm(webgpu, case):
    check_weight_only(webgpu, case)


MODELS = [
    ("conv relu", lambda: __import__("test_quant_fold").QConv(3, 8, 3, padding=1, act="relu"), [(1, 3, 7, 7)]),
    ("conv uint8 groups", lambda: __import__("test_quant_fold").QConv(8, 6, 3, stride=2, padding=1, groups=2,
                                                                      dt=__import__("torch").uint8, x_zp=128,
                                                                      out_zp=0), [(2, 8, 6, 6)]),
    ("linear", lambda: __import__("test_quant_fold").QConv(24, 10, 0, linear=True), [(3, 5, 24)]),
    ("add relu", lambda: __import__("test_quant_fold").QAdd("relu"), [(2, 3, 4, 4), (2, 3, 4, 4)]),
]


@pytest.mark.parametrize("name,make,shapes", MODELS, ids=[m[0] for m in MODELS])
def test_quantized_model_runs_whole_on_webgpu(webgpu, name, make, shapes):
    """A PT2E-form model compiles for webgpu with its integer kernels on the device (no CPU segment) and gives the
    CPU reference's integers."""
    import torch
    from conftest import run_module

    from npu_runtime.cpu.backend import CpuBackend

    inputs = [torch.randn(s) for s in shapes]
    _, got, _ = run_module(webgpu, make, inputs)
    _, want, _ = run_module(CpuBackend(), make, inputs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("wd,bits", [("int8", 8), ("int4", 4)])
def test_weight_only_layer_with_folds(webgpu, wd, bits):
    """tests/wgemm_folds.py's layer: SiLU(gate) * up over column groups and the residual adds in the wgemm (its norms
    are kernels of their own here), against PyTorch on the dequantized weights and the CPU reference."""
    from wgemm_folds import check_layer

    check_layer(webgpu, "webgpu", wd, bits, {"prologue": 0, "groups": 1, "epilogue": 3, "wgemm": 4})
