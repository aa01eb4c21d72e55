"""PyTorch's own quantized graphs: models quantized with PT2E (torchao's `prepare_pt2e` / `convert_pt2e`, which
torch 2.13 no longer ships under torch.ao) and exported by `torch_ir` are compiled with their quantize/dequantize
pairs folded into integer kernels. Each integer op is within one unit of PyTorch's reference given the same inputs
(tests/test_quant_fold.py); across a model a unit of difference propagates, so the outputs are held to three units of
their scale, most of them identical (docs/tolerances.md, "Integer programs")."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import npu_compiler
import npu_runtime
from npu_runtime.cpu.backend import CpuBackend

pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
xnnpack = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")


class Cnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = F.hardtanh(self.bn(self.c(x)), 0.0, 6.0)
        y = F.relu(self.dw(y)) + y
        y = F.max_pool2d(y, 2)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class Block(torch.nn.Module):
    """An encoder block: projections, attention in float (softmax, matmuls of activations), layer norm, GELU."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(32, 32) for _ in range(3))
        self.ln = torch.nn.LayerNorm(32)
        self.f1, self.f2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

    def forward(self, x):
        a = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2) / 5.6, -1) @ self.v(x)
        x = self.ln(x + a)
        return x + self.f2(F.gelu(self.f1(x)))


def _pt2e(model: torch.nn.Module, x: torch.Tensor):
    """PT2E with XNNPACK's symmetric recipe (int8 per-channel weights), four calibration batches; the IR and state
    dict as torch_ir writes them, and the converted model."""
    import torch_ir

    from npu_export.ir_io import ir_to_dict

    torch.manual_seed(0)
    quantizer = xnnpack.XNNPACKQuantizer().set_global(xnnpack.get_symmetric_quantization_config(is_per_channel=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = pt2e.prepare_pt2e(torch.export.export(model.eval(), (x,)).module(), quantizer)
        for _ in range(4):
            prepared(torch.randn_like(x))
        converted = pt2e.convert_pt2e(prepared)
        exported = torch.export.export(converted, (x,))
    ir = ir_to_dict(torch_ir.convert_exported_program(exported, model_name=type(model).__name__))
    state = {k: v.detach().contiguous().numpy() for k, v in exported.state_dict.items()}
    return ir, state, converted


@pytest.mark.parametrize("make,shape,kinds", [(Cnn, (2, 3, 8, 8), {"qconv2d", "qadd", "qgemm"}),
                                              (Block, (2, 7, 32), {"qgemm", "qadd"})], ids=["cnn", "encoder_block"])
def test_pt2e_graph_folds_and_agrees_with_pytorch(make, shape, kinds):
    torch.manual_seed(1)
    x = torch.randn(shape)
    ir, state, converted = _pt2e(make(), x)
    program = npu_compiler.compile(ir, "cpu")
    assert kinds <= {k.kind for k in program.kernels}, [k.kind for k in program.kernels]
    be = CpuBackend()
    weights = npu_runtime.load_weights(program, state, be, strict=False)  # PT2E keeps the float weights too
    ex = be.create_executor(program)
    last = next(n for n in reversed(ir["nodes"]) if n["op_type"].endswith("dequantize_per_tensor.default"))
    unit = float(last["attrs"]["scale"])
    units = []
    for seed in range(8):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        got = list(ex.run_numpy({ir["graph_inputs"][0]["name"]: x.numpy()}, weights).values())[0]
        units.append(np.abs(got - converted(x).detach().numpy()).reshape(-1) / unit)
    units = np.concatenate(units)
    assert units.max() <= 3 + 1e-3, f"{units.max():.2f} units off"
    assert (units < 1e-3).mean() > 0.8, f"only {(units < 1e-3).mean():.2f} identical"


def test_pt2e_without_fold_is_pytorch_bit_for_bit():
    x = torch.randn(2, 3, 8, 8)
    ir, state, converted = _pt2e(Cnn(), x)
    program = npu_compiler.compile(ir, "cpu", disable_passes=["quant_fold"])
    be = CpuBackend()
    got = list(be.create_executor(program).run_numpy({ir["graph_inputs"][0]["name"]: x.numpy()},
                                                     npu_runtime.load_weights(program, state, be, strict=False))
               .values())[0]
    np.testing.assert_array_equal(got, converted(x).detach().numpy())
