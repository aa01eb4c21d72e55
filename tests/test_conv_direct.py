"""Which convs the direct kernel of the cuda target takes (targets/cuda/conv_direct.py: Hopper, 64 input channels,
stride 1, a window of several taps, an epilogue that reads no tensor, tiles for every SM), rendered without a GPU;
its tile rows. Its results against PyTorch are GPU tests (tests/gpu/test_cuda_conv_tc.py)."""

from __future__ import annotations

import pytest
import torch
from fused_cases import ir_dict

import npu_compiler
from npu_compiler.devices import CHIPS
from npu_compiler.targets.cuda import CudaTarget, conv_direct


class Block(torch.nn.Module):
    """A 1x1 conv (so that the activations are channels-last), then the conv under test [+ r] -> relu."""

    def __init__(self, c: int, o: int, k: int, stride: int) -> None:
        super().__init__()
        self.pre = torch.nn.Conv2d(c, c, 1)
        self.conv = torch.nn.Conv2d(c, o, k, stride, k // 2)

    def forward(self, x, *r):
        y = self.conv(self.pre(x))
        return torch.relu(y + r[0] if r else y)


def _main_conv(n: int, c: int, o: int, k: int, stride: int = 1, residual: bool = False, hw: int = 56):
    with torch.device("meta"):
        model = Block(c, o, k, stride).eval().half()
        x = torch.randn(n, c, hw, hw).half()
        args = [x] + ([torch.randn(n, o, -(-hw // stride), -(-hw // stride)).half()] if residual else [])
    program = npu_compiler.compile(ir_dict(model, args, "direct"), "cuda", dtype="float16")
    return program, [kc for kc in program.kernels if kc.kind == "conv2d"][-1]


@pytest.mark.parametrize("case,want", [
    ({"n": 10, "c": 64, "o": 64, "k": 3}, True),  # ResNet's first-stage 3x3 conv at a batch of 10
    ({"n": 10, "c": 64, "o": 128, "k": 3}, True),
    ({"n": 10, "c": 64, "o": 64, "k": 3, "residual": True}, False),  # its epilogue reads a tensor
    ({"n": 10, "c": 64, "o": 64, "k": 1}, False),  # one tap: each pixel is read once anyway
    ({"n": 1, "c": 64, "o": 64, "k": 3}, False),  # 14 tiles: too few for the GPU
    ({"n": 10, "c": 32, "o": 64, "k": 3}, False),
    ({"n": 40, "c": 64, "o": 64, "k": 3, "stride": 2}, False),
    ({"n": 10, "c": 64, "o": 96, "k": 3}, False),  # no whole tiles of 64 output channels
    # ResNet's second stage: 147 KB of weight leave room for one halo buffer
    ({"n": 20, "c": 128, "o": 128, "k": 3, "hw": 28}, True),
    ({"n": 40, "c": 256, "o": 256, "k": 3, "hw": 14}, False),  # the weight alone fills the shared memory
])
def test_direct_conv_is_chosen_where_it_fits(case, want) -> None:
    program, main = _main_conv(**case)
    assert conv_direct.fits(main, program, CHIPS["h100"]) == want
    assert not conv_direct.fits(main, program, CHIPS["a100"])  # the warpgroup MMA: Hopper only
    assert not conv_direct.fits(main, program, CHIPS["b200"])
    source = CudaTarget(90).kernel_sources(main, program)[0]
    assert ("wg_desc_plain" in source) == want
    if want:
        assert "m64n224k16" in source  # 56 or 28 output rows: tiles of 28
        # one halo buffer where two do not fit beside the weight
        assert ("the next tile's, meanwhile" in source) == (case["c"] == 64)


@pytest.mark.parametrize("rows,want", [(56, 28), (43, 22), (30, 30), (100, 25), (32, 32), (33, 11), (7, 7), (1, 1)])
def test_tile_rows(rows, want) -> None:
    assert conv_direct.tile_rows(rows) == want


def test_outputs_it_stores_two_channels_at_a_time_into() -> None:
    from npu_compiler.program import TensorRef

    n, c, h, w = 2, 64, 5, 6
    assert conv_direct._pairs(TensorRef(0, (n, c, h, w), (h * w * c, 1, w * c, c), 0))  # channels-last
    assert not conv_direct._pairs(TensorRef(0, (n, c, h, w), (c * h * w, h * w, w, 1), 0))  # NCHW
    assert not conv_direct._pairs(TensorRef(0, (n, c, h, w), (h * w * c, 1, w * c, c), 1))  # an odd first channel
    assert not conv_direct._pairs(TensorRef(0, (n, c, h, w), (h * w * 65, 1, w * 65, 65), 0))  # odd pixel stride
