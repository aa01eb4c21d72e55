"""Convolutions of too few tiles for the device on the webgpu backend: each tile's K split across workgroups, the
splits' f32 sums added by a second dispatch that runs the epilogue (bias, BatchNorm folded, ReLU), against PyTorch.
Small sizes: lavapipe runs them on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fused_cases import TORCH_DTYPES, ir_dict, module_weights
from gpu.util import to_np
from tolerances import assert_close

import npu_compiler
import npu_runtime


class ConvBnRelu(torch.nn.Module):
    def __init__(self, c: int, o: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(c, o, 3, padding=1, bias=True)
        self.bn = torch.nn.BatchNorm2d(o)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_split_conv_matches_torch(webgpu, dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    module = ConvBnRelu(40, 24).eval()
    with torch.no_grad():
        module.bn.running_mean.normal_(0, 0.2, generator=gen)
        module.bn.running_var.uniform_(0.5, 2.0, generator=gen)
    module = module.to(TORCH_DTYPES[dtype])
    x = torch.randn((1, 40, 9, 9), generator=gen).to(TORCH_DTYPES[dtype])  # 81 pixels: 2 tiles, K 360
    program = npu_compiler.compile(ir_dict(module, [x], "conv_split"), "webgpu", dtype=dtype)
    (conv,) = [k for k in program.kernels if k.kind == "conv2d"]
    assert conv.plan.splits == 2 and len(conv.scratch) == 1  # K 360 // 128: two splits, though tiles want more
    ex = webgpu.create_executor(program)
    assert len(ex.rendered.steps[program.kernels.index(conv)]) == 2
    weights = npu_runtime.load_weights(program, module_weights(module), webgpu)
    ex.poison()
    got = ex.run_numpy({program.inputs[0].name: to_np(x)}, weights)[program.outputs[0].name].astype(np.float32)
    with torch.no_grad():
        ref = module(x).float().numpy()
    assert_close(got, ref, dtype, "accumulate", "webgpu", what=f"split conv {dtype}")


def test_pointwise_conv_of_few_tiles_stays_a_split_conv(webgpu) -> None:
    """A 1x1 conv is a GEMM elsewhere; where the webgpu target splits its K (few pixels, a deep K) it stays a conv,
    split, with its residual and ReLU in the epilogue."""

    class Bottleneck(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(512, 16, 1, bias=False)

        def forward(self, x, r):
            return torch.relu(self.conv(x) + r)

    gen = torch.Generator().manual_seed(6)
    module = Bottleneck().eval()
    x = torch.randn((1, 512, 3, 3), generator=gen)
    r = torch.randn((1, 16, 3, 3), generator=gen)
    program = npu_compiler.compile(ir_dict(module, [x, r], "pointwise"), "webgpu", dtype="float32")
    assert [k.kind for k in program.kernels] == ["conv2d"] and program.kernels[0].plan.splits == 4
    ex = webgpu.create_executor(program)
    weights = npu_runtime.load_weights(program, module_weights(module), webgpu)
    got = ex.run_numpy({s.name: to_np(a) for s, a in zip(program.inputs, (x, r), strict=True)}, weights)
    with torch.no_grad():
        ref = module(x, r).numpy()
    assert_close(got[program.outputs[0].name], ref, "float32", "accumulate", "webgpu", what="split pointwise conv")
