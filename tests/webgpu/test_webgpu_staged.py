"""Folded records on the webgpu backend, which has no one kernel for them: a GEMM computing its operand in a prologue
(a norm, SiLU-times-up), a conv computing a shortcut conv, a row kernel storing the sum it reads. The target plans
each in passes (targets/webgpu/staging.py: the prologue's rows or the shortcut's result through the plan's scratch,
the side value by a kernel of its own) instead of refusing the record. Its lowering builds no such record (it runs
them no faster than the unfolded kernels), so the tests ask for them as a target with those kernels would, and
compare with PyTorch and with the unfolded program on the same backend."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fused_cases import ir_dict
from gpu.util import to_np
from helpers import GatedLinear, NormLinear
from test_side_convs import _block
from test_side_outputs import ResidualNorm
from tolerances import assert_close

import npu_compiler
import npu_runtime
from npu_compiler.kernels import Conv2dKernel, GemmKernel, GemmPlan, GeneratedKernel
from npu_compiler.targets.webgpu.target import WebGPUTarget
from npu_export.cnn import model_tensors


def _run(backend, program, module, args) -> np.ndarray:
    weights = npu_runtime.load_weights(program, model_tensors(module), backend)
    feeds = {s.name: to_np(a) for s, a in zip(program.inputs, args, strict=True)}
    return backend.create_executor(program).run_numpy(feeds, weights)[program.outputs[0].name].astype(np.float32)


def _check(backend, folded, plain, module, args, what: str) -> None:
    got, unfolded = _run(backend, folded, module, args), _run(backend, plain, module, args)
    with torch.no_grad():
        ref = module(*args).float().numpy()
    assert_close(got, ref, "float32", "accumulate", "webgpu", what=what)
    np.testing.assert_allclose(got, unfolded, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["norm", "silu_mul"])
def test_gemm_prologues_run_in_two_passes(webgpu, kind, monkeypatch) -> None:
    """(K = 98: no whole 16-byte words of the weight rows, so the GEMV, which computes a norm itself, does not take
    it.)"""
    torch.manual_seed(0)
    module = (NormLinear(98, 40) if kind == "norm" else GatedLinear(98, 40)).eval()
    args = [torch.randn(2, 98), torch.randn(2, 40)] if kind == "norm" else [torch.randn(2, 98) for _ in range(2)] + [
        torch.randn(2, 40)]
    ir = ir_dict(module, args, kind)
    plain = npu_compiler.compile(ir, "webgpu", dtype="float32")
    monkeypatch.setattr(WebGPUTarget, "gemm_prologue_rows", 8)
    monkeypatch.setattr(WebGPUTarget, "gemm_prologue", lambda self, *a: True)
    folded = npu_compiler.compile(ir, "webgpu", dtype="float32")
    (gemm,) = [k for k in folded.kernels if isinstance(k.spec, GemmKernel)]
    assert gemm.spec.prologue is not None and gemm.plan == GemmPlan(prologue_apart=True)
    assert len(gemm.scratch) == 1 and gemm.scratch[0].numel == 2 * 98
    assert len(WebGPUTarget().kernel_sources(gemm, folded)) == 2
    _check(webgpu, folded, plain, module, args, f"{kind} prologue")


def test_side_convs_run_in_two_passes(webgpu, monkeypatch) -> None:
    module = _block("basic", 16, 16, 2)  # (its 3x3 conv adds the shortcut: a conv record, where 1x1 ones are GEMMs)
    args = [torch.randn(1, 3, 12, 12)]
    ir = ir_dict(module, args, "basic_block")
    plain = npu_compiler.compile(ir, "webgpu", dtype="float32")
    monkeypatch.setattr(WebGPUTarget, "conv_side", lambda self, call, buffers: True)
    folded = npu_compiler.compile(ir, "webgpu", dtype="float32")
    (side,) = [k for k in folded.kernels if isinstance(k.spec, Conv2dKernel) and k.spec.side_stride]
    assert side.plan.side_apart and side.scratch[0].numel == side.outs[0].numel
    assert len(folded.kernels) == len(plain.kernels) - 1
    _check(webgpu, folded, plain, module, args, "side conv")


def test_row_side_outputs_run_as_a_kernel_of_their_own(webgpu, monkeypatch) -> None:
    """(12 rows: more than the GEMV computes a norm for in its prologue, so the norm is a row kernel.)"""
    torch.manual_seed(0)
    module = ResidualNorm(64).eval()
    args = [torch.randn(12, 64), torch.randn(12, 64)]
    ir = ir_dict(module, args, "residual_norm")
    plain = npu_compiler.compile(ir, "webgpu", dtype="float32")
    monkeypatch.setattr(WebGPUTarget, "row_side_outputs", True)
    folded = npu_compiler.compile(ir, "webgpu", dtype="float32")
    (row,) = [k for k in folded.kernels if isinstance(k.spec, GeneratedKernel) and k.spec.side is not None]
    assert row.plan.side_apart and not row.scratch
    assert len(WebGPUTarget().kernel_sources(row, folded)) == 2
    _check(webgpu, folded, plain, module, args, "side output")
