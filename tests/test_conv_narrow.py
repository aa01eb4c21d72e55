"""Which convs the cuda target's kernel of few input channels takes (targets/cuda/conv_narrow.py: Hopper, a stem over
the program input), its shared-memory layout and tiles, and its sources compiled by NVRTC, without a GPU. Its results
against PyTorch are GPU tests (tests/gpu/test_cuda_conv_tc.py)."""

from __future__ import annotations

import pytest
import torch
from fused_cases import ir_dict
from test_cuda_codegen import _check_sources, needs_nvrtc

import npu_compiler
from npu_compiler.devices import CHIPS
from npu_compiler.targets.cuda import CudaTarget, conv_narrow


class Stem(torch.nn.Module):
    """[a 1x1 conv, so that the input is channels-last] -> the conv under test [+ r] [-> relu]."""

    def __init__(self, c: int, o: int, k: int, stride: int, pad: int, pre: bool, relu: bool, dil: int = 1) -> None:
        super().__init__()
        self.pre = torch.nn.Conv2d(c, c, 1) if pre else None
        self.conv = torch.nn.Conv2d(c, o, k, stride, pad, dil)
        self.relu = relu

    def forward(self, x, *r):
        y = self.conv(self.pre(x) if self.pre is not None else x)
        y = y + r[0] if r else y
        return torch.relu(y) if self.relu else y


def _program(n: int, c: int, hw: int, o: int, k: int, stride: int, pad: int, pre: bool = False, relu: bool = True,
             dil: int = 1, residual: bool = False):
    with torch.device("meta"):
        model = Stem(c, o, k, stride, pad, pre, relu, dil).eval().half()
        x = torch.randn(n, c, hw, hw).half()
        ho = (hw + 2 * pad - dil * (k - 1) - 1) // stride + 1
        args = [x] + ([torch.randn(n, o, ho, ho).half()] if residual else [])
    program = npu_compiler.compile(ir_dict(model, args, "narrow"), "cuda", dtype="float16")
    return program, [kc for kc in program.kernels if kc.kind == "conv2d"][-1]


RESNET_STEM = {"c": 3, "o": 64, "k": 7, "stride": 2, "pad": 3}


@pytest.mark.parametrize("case,want", [
    ({"n": 2, "hw": 64, **RESNET_STEM}, True),  # ResNet's stem over the NCHW program input
    ({"n": 2, "hw": 64, **RESNET_STEM, "pre": True}, True),  # ... over a channels-last input
    ({"n": 2, "hw": 64, **RESNET_STEM, "relu": False}, True),  # no epilogue
    ({"n": 2, "hw": 64, **RESNET_STEM, "residual": True}, False),  # its epilogue reads a tensor
    ({"n": 2, "hw": 64, **RESNET_STEM, "dil": 2}, False),  # a dilated window's columns are no run
    ({"n": 2, "hw": 64, "c": 5, "o": 64, "k": 7, "stride": 2, "pad": 3}, False),  # 5 channels: more than 8 / 2
    ({"n": 2, "hw": 64, "c": 3, "o": 96, "k": 7, "stride": 2, "pad": 3}, False),  # no whole tiles of 64 channels
    ({"n": 2, "hw": 64, "c": 3, "o": 64, "k": 3, "stride": 3, "pad": 1}, False),  # a stride that does not divide 8
    ({"n": 2, "hw": 40, "c": 5, "o": 64, "k": 3, "stride": 1, "pad": 1, "pre": True}, True),  # 5 of 8 at stride 1
    ({"n": 2, "hw": 40, "c": 8, "o": 64, "k": 3, "stride": 1, "pad": 1, "pre": True}, False),  # 16-byte copies
    ({"n": 2, "hw": 64, "c": 2, "o": 128, "k": 4, "stride": 4, "pad": 0}, True),  # a patchify: 2 of 2 at stride 4
])
def test_narrow_conv_is_chosen_where_it_fits(case, want) -> None:
    program, main = _program(**case)
    assert conv_narrow.fits(main, program, CHIPS["h100"]) == want
    assert conv_narrow.fits(main, program, CHIPS["h200"]) == want
    assert not conv_narrow.fits(main, program, CHIPS["a100"])  # the warpgroup MMA: Hopper only
    assert not conv_narrow.fits(main, program, CHIPS["b200"])
    source = CudaTarget(90).kernel_sources(main, program)[0]
    assert ("fill_window" in source) == want


def test_resnet_stem_layout_and_tiles() -> None:
    """ResNet-50's stem: columns of 4 channels (stride 2), a kernel row's 7 columns a run of 32 halfs, tiles of 28
    output rows (n = 224) where the batch gives every SM tiles, 8 (n = 64) for one image (196 tiles)."""
    dev = CHIPS["h100"]
    lay = conv_narrow.layout((64, 3, 224, 224), (64, 3, 7, 7), (64, 64, 112, 112), (2, 2), dev)
    assert (lay.cp, lay.kr, lay.k_blocks, lay.ty) == (4, 32, 4, 28)
    assert (lay.wy, lay.wx, lay.row_bytes) == (2 * 27 + 7, 2 * 7 + 8, 22 * 8)
    assert lay.smem == 4 * 8192 + 2 * 61 * 176 <= dev.shared_memory_per_block_optin // conv_narrow.RESIDENT
    one = conv_narrow.layout((1, 3, 224, 224), (64, 3, 7, 7), (1, 64, 112, 112), (2, 2), dev)
    assert one.ty == 8 and conv_narrow.tile_count(1, 112, 112, 8) == 196
    # a window row holds a pixel's whole run: 8 pixels 16 bytes apart, the last one's run ending the row
    assert 7 * conv_narrow.RUN_BYTES + 2 * lay.kr == lay.row_bytes


@needs_nvrtc
def test_narrow_sources_compile() -> None:
    """The kernel's sources for a stem at batch 2 and 64-ish shapes, stride 1, 4 and 8, bias or none, compile for
    sm_90a (NVRTC and ptxas) and wait for the kernel before them first; each launch a grid of at most its tiles."""
    sources = {}
    for i, case in enumerate([{"n": 2, "hw": 64, **RESNET_STEM}, {"n": 3, "hw": 67, **RESNET_STEM, "relu": False},
                              {"n": 2, "hw": 40, "c": 5, "o": 64, "k": 3, "stride": 1, "pad": 1, "pre": True},
                              {"n": 2, "hw": 64, "c": 2, "o": 128, "k": 4, "stride": 4, "pad": 0},
                              {"n": 2, "hw": 64, "c": 1, "o": 64, "k": 8, "stride": 8, "pad": 0}]):
        program, main = _program(**case)
        target = CudaTarget(90)
        assert conv_narrow.fits(main, program, target.profile), case
        (kind, (src, launch)), = target.render_kernel(main, program)
        x, w, out = main.args[0], main.args[1], main.outs[0]
        lay = conv_narrow.layout(x.shape, w.shape, out.shape, main.spec.stride, target.profile)
        assert launch.block == 128 and launch.smem == lay.smem
        assert launch.grid[0] <= conv_narrow.tile_count(x.shape[0], out.shape[2], out.shape[3], lay.ty)
        assert launch.grid[1] == w.shape[0] // conv_narrow.O_TILE
        assert f"m64n{8 * lay.ty}k16" in src
        assert src.index("npu_wait_prior();") < src.index("prefetch_window(t")  # the input after the wait only
        sources[f"narrow_{i}"] = src
    failures = _check_sources(sources)
    assert not failures, "\n\n".join(failures[:2])
