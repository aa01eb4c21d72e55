"""Convolutions as implicit GEMMs on tensor cores (targets/cuda/conv_tc.py) against PyTorch (cuDNN) on the same GPU
in the same dtype: 1x1, 3x3 and 7x7 windows, strides, padding, dilation, bias or none, a residual add and a ReLU in
the epilogue; both loads of each operand (16-byte copies of a contiguous weight and of contiguous pixel rows; the
element-by-element gather of a window, of a program input in NCHW and of a weight whose K is no multiple of 8);
output-channel, pixel and K counts that are not multiples of the tile; every block tile size. The direct kernel of
64-channel stride-1 convs on Hopper (conv_direct.py) against PyTorch the same way."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fused_cases import ConvPool, ir_dict, module_weights
from tolerances import assert_close

import npu_compiler
from npu_compiler.targets.cuda import CudaTarget, conv_direct, conv_narrow, conv_tc
from npu_runtime import load_weights

from .util import rendered_for, to_np


class ConvBlock(torch.nn.Module):
    """[1x1 conv, so that a batch's activations are channel-major] -> conv [+ r] [-> relu]."""

    def __init__(self, c, o, k, stride, pad, dil, bias, pre, relu) -> None:
        super().__init__()
        self.pre = torch.nn.Conv2d(c, c, 1) if pre else None
        self.conv = torch.nn.Conv2d(c, o, k, stride, pad, dil, bias=bias)
        self.relu = relu

    def forward(self, x, *r):
        if self.pre is not None:
            x = self.pre(x)
        y = self.conv(x)
        if r:
            y = y + r[0]
        return torch.relu(y) if self.relu else y


# name: dtype, (n, c, h, w), o, kernel, stride, padding, dilation, bias, pre, residual, relu. Each has enough pixels
# for the kernel to give every SM a block (below that the program keeps its convs on cuBLAS).
CASES = {
    # ResNet's bottleneck convs over channels-last activations (16-byte copies of both operands)
    "1x1_rows_b2_fp16": ("float16", (2, 64, 66, 66), 96, 1, 1, 0, 1, True, True, True, True),
    "3x3_pad_b3_fp16": ("float16", (3, 24, 57, 59), 72, 3, 1, 1, 1, True, True, True, True),
    "3x3_stride2_b4_fp16": ("float16", (4, 64, 112, 112), 128, 3, 2, 1, 1, True, True, False, True),
    "1x1_stride2_b2_bf16": ("bfloat16", (2, 64, 184, 184), 128, 1, 2, 0, 1, False, True, True, False),
    # the stem: 3 input channels over the NCHW program input (both operands element by element)
    "7x7_stem_b2_fp16": ("float16", (2, 3, 224, 224), 64, 7, 2, 3, 1, True, False, False, True),
    # an NCHW program input (its pixels element by element), an odd pixel count, 40 output channels (a part tile)
    "1x1_odd_pixels_bf16": ("bfloat16", (1, 32, 97, 91), 40, 1, 1, 0, 1, True, False, True, False),
    "dilated_bf16": ("bfloat16", (1, 16, 100, 100), 24, 3, 1, 2, 2, False, False, False, True),
    # pixels through a shared-memory window (conv_window.py: pixel tiles enough for two blocks an SM), tiles that
    # run into the next image: the stem; rows of 37 columns copied element by element, a dilation; rows of 40
    # columns in 16-byte copies, a stride, a residual
    "7x7_stem_window_b3_fp16": ("float16", (3, 3, 224, 224), 64, 7, 2, 3, 1, True, False, False, True),
    "3x3_window_rows_fp16": ("float16", (24, 3, 45, 37), 32, 3, 1, 2, 2, True, False, False, False),
    "5x5_window_copies_bf16": ("bfloat16", (96, 4, 40, 40), 48, 5, 2, 2, 1, False, False, True, True),
    # 20 channels: K = 500, no multiple of 8 (both operands element by element, a part K tile); no bias
    "5x5_k_tail_fp16": ("float16", (2, 20, 75, 65), 48, 5, 1, 2, 1, False, True, True, True),
    # the 128 x 128 and 64 x 128 tiles
    "1x1_tile128_fp16": ("float16", (2, 16, 64, 66), 256, 1, 1, 0, 1, True, True, True, True),
    "3x3_tile64x128_bf16": ("bfloat16", (2, 16, 66, 64), 128, 3, 1, 1, 1, True, True, True, True),
    # Hopper's 192 x 128 tiles of three warpgroups (conv_tc.tall_tiles: 53 x 2 of them against 79 x 2 of 128 x 128;
    # 107 against 160), the last pixel tile a part one
    "3x3_tall_fp16": ("float16", (4, 64, 50, 50), 256, 3, 1, 1, 1, True, True, True, True),
    "1x1_tall_bf16": ("bfloat16", (5, 64, 64, 64), 128, 1, 1, 0, 1, False, True, True, False),
    # few pixels and a long K (1,024 outputs, K = 2,304): the K split across 8 blocks of a cluster that sum their
    # parts in shared memory (Hopper); "scratch": as the A100 (no clusters) runs it, 7 splits summed by a second launch
    "split_k_3x3_fp16": ("float16", (1, 256, 128, 128), 256, 3, 4, 1, 1, True, True, True, True),
    # a split conv of part tiles in both dims (900 pixels, 40 output channels: the 64 x 64 tile), no bias
    "split_k_part_tiles_bf16": ("bfloat16", (1, 128, 60, 60), 40, 3, 2, 1, 1, False, True, True, True),
}
CASES["split_k_scratch_3x3_fp16"] = CASES["split_k_3x3_fp16"]
# on Hopper, the cases whose pixels come through a shared-memory window (the element-by-element inputs of the others
# have too few pixel tiles or do not fit half of its shared memory: a K of 500, 16 channels of 3 output rows; the
# stems, 3 channels and 64 outputs, take the kernel of few channels, conv_narrow.py)
WINDOWED = {"3x3_window_rows_fp16", "5x5_window_copies_bf16"}
STEMS = {"7x7_stem_b2_fp16", "7x7_stem_window_b3_fp16"}
# on Hopper, the cases on 192 x 128 tiles (1x1_stride2: 89 of them against 133 of 128 x 128)
TALL = {"3x3_tall_fp16", "1x1_tall_bf16", "1x1_stride2_b2_bf16"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_conv_on_tensor_cores_matches_torch(name, cuda_backend) -> None:
    dtype, (n, c, h, w), o, k, stride, pad, dil, bias, pre, residual, relu = CASES[name]
    # "scratch": planned and rendered for a GPU without thread-block clusters (the A100's row of the chip table)
    device = "a100" if "scratch" in name else None
    tdt = getattr(torch, dtype)
    torch.manual_seed(0)
    model = ConvBlock(c, o, k, stride, pad, dil, bias, pre, relu).eval().to(tdt)
    x = torch.randn(n, c, h, w).to(tdt)
    ho = (h + 2 * pad - dil * (k - 1) - 1) // stride + 1
    wo = (w + 2 * pad - dil * (k - 1) - 1) // stride + 1
    # a residual of a quarter of the conv's scale: where it cancels the conv's result, the error left is the conv's
    # own rounding at the size of the result (a unit residual cancelling a result of 2 leaves 2's ulp, 16x the
    # tolerance at 0.06)
    args = [x] + ([torch.randn(n, o, ho, wo).mul(0.25).to(tdt)] if residual else [])
    program = npu_compiler.compile(ir_dict(model, args, name), "cuda", dtype=dtype, device=device)
    convs = [kc for kc in program.kernels if kc.kind == "conv2d"]
    assert len(convs) == 1 + pre and not any(kc.kind == "gemm" for kc in program.kernels), \
        [kc.kind for kc in program.kernels]
    main = convs[-1]
    dev = rendered_for(program, cuda_backend)
    assert "mma.sync" in CudaTarget(dev).kernel_sources(main, program)[0], "the tensor-core kernel was not chosen"
    assert (main.spec.epilogue is not None) == (residual or relu)
    assert (main.plan.splits > 1) == name.startswith("split_k"), main.plan
    if dev.compute_capability == 90:  # pixels read element by element come through a window where it fits
        source = CudaTarget(dev).kernel_sources(main, program)[0]
        assert ("copy_window" in source) == (name in WINDOWED), name
        assert conv_narrow.fits(main, program, dev) == (name in STEMS), name
        assert ("__launch_bounds__(384, 1)" in source) == (name in TALL), name
    if main.plan.splits > 1:
        clustered = conv_tc.in_cluster(main.plan.splits, dev)
        assert clustered == ("scratch" not in name and dev.cluster_blocks > 0)
        assert len(CudaTarget(dev).kernel_sources(main, program)) == 1 + (not clustered)
    _check_against_torch(model, args, program, dtype, name, cuda_backend)


def _check_against_torch(model, args, program, dtype: str, name: str, cuda_backend) -> None:
    """The program on the GPU (arena poisoned) against the module run by PyTorch on the same GPU."""
    weights = load_weights(program, module_weights(model), cuda_backend)
    ex = cuda_backend.create_executor(program)
    ex.poison()
    feeds = {s.name: to_np(a) for s, a in zip(program.inputs, args, strict=True)}
    got = ex.run_numpy(feeds, weights)[program.outputs[0].name]
    with torch.no_grad():
        ref = model.cuda()(*(a.cuda() for a in args)).float().cpu().numpy()
    assert_close(got.astype(np.float32), ref, dtype, "accumulate", "cuda", what=name)


# The direct kernel (conv_direct.py, Hopper: 64 input channels, stride 1, the weight resident in shared memory,
# pixels from a halo). name: dtype, (n, c, h, w), o, kernel, padding, bias, relu; every case has tiles for every SM.
DIRECT = {
    # ResNet's first-stage 3x3 conv (tiles of 28 rows: the MMA's n = 224)
    "3x3_stage1_fp16": ("float16", (10, 64, 56, 56), 64, 3, 1, True, True),
    # two tiles of 64 output channels; 30 columns: the last column tile half outside the image; n = 240
    "3x3_two_channel_tiles_bf16": ("bfloat16", (24, 64, 30, 30), 128, 3, 1, True, False),
    # no padding, no bias, no epilogue: 43 output rows as two tiles of 22 (one row past the image), 42 columns
    "3x3_valid_no_bias_fp16": ("float16", (12, 64, 45, 44), 64, 3, 0, False, False),
    # a 2x2 window over 32 output rows (n = 256, the MMA's largest), 63 columns
    "2x2_bf16": ("bfloat16", (17, 64, 33, 64), 64, 2, 0, True, True),
    # ResNet's second-stage 3x3 conv: 128 channels, two blocks of the weight a tap, one halo buffer
    "3x3_stage2_one_halo_fp16": ("float16", (20, 128, 28, 28), 128, 3, 1, True, True),
}


@pytest.mark.parametrize("name", sorted(DIRECT))
def test_direct_conv_matches_torch(name, cuda_backend) -> None:
    dtype, (n, c, h, w), o, k, pad, bias, relu = DIRECT[name]
    tdt = getattr(torch, dtype)
    torch.manual_seed(0)
    model = ConvBlock(c, o, k, 1, pad, 1, bias, True, relu).eval().to(tdt)
    args = [torch.randn(n, c, h, w).to(tdt)]
    program = npu_compiler.compile(ir_dict(model, args, name), "cuda", dtype=dtype)
    main = [kc for kc in program.kernels if kc.kind == "conv2d"][-1]
    dev = rendered_for(program, cuda_backend)
    assert conv_direct.fits(main, program, dev) == dev.warpgroup_mma
    if dev.warpgroup_mma:
        ho = h + 2 * pad - k + 1
        assert f"m64n{8 * conv_direct.tile_rows(ho)}k16" in CudaTarget(dev).kernel_sources(main, program)[0]
    _check_against_torch(model, args, program, dtype, name, cuda_backend)


# The conv of few input channels (conv_narrow.py, Hopper: the window read by the MMA as it is). name: dtype, (n, c, h,
# w), o, kernel, stride, padding, bias, pre (a 1x1 conv first: a channels-last input), relu
NARROW = {
    # ResNet's stem over the NCHW program input at batch 1 (tiles of 8 rows) and 4 (28)
    "stem_b1_fp16": ("float16", (1, 3, 224, 224), 64, 7, 2, 3, True, False, True),
    "stem_b4_fp16": ("float16", (4, 3, 224, 224), 64, 7, 2, 3, True, False, True),
    # two tiles of 64 output channels, 34 x 38 outputs (row and column tiles past the image), no bias, no epilogue
    "stem_odd_bf16": ("bfloat16", (3, 3, 67, 75), 128, 7, 2, 3, False, False, False),
    # stride 1: columns of 8 channels (5 of them the input's, channels-last), a 3-column run of 24 halfs in 32
    "3x3_c5_stride1_fp16": ("float16", (4, 5, 40, 36), 64, 3, 1, 1, True, True, True),
    # stride 4: columns of 2 channels, a 4-column run of 8 halfs in 16; stride 8: one channel, 8 columns
    "patchify_stride4_bf16": ("bfloat16", (2, 2, 64, 64), 64, 4, 4, 0, True, False, False),
    "patchify_stride8_fp16": ("float16", (3, 1, 128, 120), 64, 8, 8, 0, True, False, True),
}


@pytest.mark.parametrize("name", sorted(NARROW))
def test_narrow_conv_matches_torch(name, cuda_backend) -> None:
    dtype, (n, c, h, w), o, k, stride, pad, bias, pre, relu = NARROW[name]
    tdt = getattr(torch, dtype)
    torch.manual_seed(0)
    model = ConvBlock(c, o, k, stride, pad, 1, bias, pre, relu).eval().to(tdt)
    args = [torch.randn(n, c, h, w).to(tdt)]
    program = npu_compiler.compile(ir_dict(model, args, name), "cuda", dtype=dtype)
    main = [kc for kc in program.kernels if kc.kind == "conv2d"][-1]
    dev = rendered_for(program, cuda_backend)
    assert conv_narrow.fits(main, program, dev) == dev.warpgroup_mma
    _check_against_torch(model, args, program, dtype, name, cuda_backend)


class WeightInput(torch.nn.Module):
    """A conv whose weight is a program input (kept as given, [O, C, kh, kw]: read element by element) over
    channels-last activations (16-byte copies)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.pre = torch.nn.Conv2d(c, c, 1)

    def forward(self, x, w):
        return torch.relu(torch.nn.functional.conv2d(self.pre(x), w, padding=1))


def test_conv_with_a_weight_input_matches_torch(cuda_backend) -> None:
    torch.manual_seed(0)
    model = WeightInput(32).eval().half()
    # the weight at a conv's initial scale (1 / sqrt(fan-in)), so that the 1x1 conv's roundings before it stay
    # within the tolerance of the result
    args = [torch.randn(2, 32, 66, 66).half(), (torch.randn(64, 32, 3, 3) / 288**0.5).half()]
    program = npu_compiler.compile(ir_dict(model, args, "weight_input"), "cuda", dtype="float16")
    convs = [kc for kc in program.kernels if kc.kind == "conv2d"]
    assert len(convs) == 2
    src = CudaTarget().kernel_sources(convs[-1], program)[0]
    assert "mma.sync" in src and src.count("tc_cp16(&smem") == 1, "expected copies of the input, not the weight"
    _check_against_torch(model, args, program, "float16", "weight_input", cuda_backend)


@pytest.mark.parametrize("dtype,pool", [("float16", "max3"), ("bfloat16", "max2"), ("float16", "avg3")])
def test_pools_over_channels_last_match_torch(dtype, pool, cuda_backend) -> None:
    """A small pooling window over a channels-last activation is written out position by position
    (`clike._unrolled`), so that each position's 8 channels are one 16-byte load: the max pools (whose output is
    channels-last too) take that form; the edges of an odd-sized image (29 x 31) read the window's padding. Against
    PyTorch on the same GPU."""
    tdt = getattr(torch, dtype)
    torch.manual_seed(0)
    model = ConvPool(pool).eval().to(tdt)
    args = [torch.randn(2, 16, 29, 31).to(tdt)]
    program = npu_compiler.compile(ir_dict(model, args, f"conv_{pool}"), "cuda", dtype=dtype)
    pools = [k for k in program.kernels if k.kind == "generated" and "pool" in k.group]
    assert len(pools) == 1, [(k.kind, k.group) for k in program.kernels]
    src = CudaTarget().kernel_sources(pools[0], program)[0]
    if pool.startswith("max"):
        assert "uint4" in src and "for (int r = " not in src, src
    _check_against_torch(model, args, program, dtype, f"conv_{pool}", cuda_backend)


class ShortcutBlock(torch.nn.Module):
    """A 3x3 conv (so that the block's input is a channels-last intermediate), then a ResNet bottleneck's last two
    steps: a 1x1 conv of the block's branch plus a 1x1 projection shortcut of the block's input (stride 1 or 2,
    each with a bias: a folded BatchNorm's), ReLU."""

    def __init__(self, c: int, mid: int, o: int, stride: int) -> None:
        super().__init__()
        self.pre = torch.nn.Conv2d(8, c, 3, padding=1)
        self.branch = torch.nn.Conv2d(c, mid, 3, stride, 1)
        self.last = torch.nn.Conv2d(mid, o, 1)
        self.shortcut = torch.nn.Conv2d(c, o, 1, stride)

    def forward(self, x):
        x = torch.relu(self.pre(x))
        return torch.relu(self.last(torch.relu(self.branch(x))) + self.shortcut(x))


# name: dtype, (n, h, w), block input channels, branch channels, output channels, shortcut stride
SHORTCUTS = {
    "stride1_fp16": ("float16", (2, 56, 56), 64, 64, 256, 1),
    "stride2_bf16": ("bfloat16", (2, 57, 55), 128, 128, 192, 2),
    # 1,024 output channels and enough pixels for 128-pixel tiles (on Hopper the warpgroup MMA)
    "stride2_wide_fp16": ("float16", (8, 28, 28), 128, 64, 1024, 2),
}


@pytest.mark.parametrize("device", [None, "a100", "turing"], ids=["device", "mma_sync", "direct"])
@pytest.mark.parametrize("name", sorted(SHORTCUTS))
def test_side_conv_matches_the_unfolded_program_and_torch(name, device, cuda_backend, monkeypatch) -> None:
    """The projection shortcut folded into the last conv (`lowering/side_convs.py`) gives the unfolded program's
    bits (the shortcut's sum rounded as it stored it), on the device's kernel, on mma.sync (as an Ampere GPU renders
    it) and on the direct kernel of a GPU without tensor cores; and PyTorch's result within the fp16/bf16 tolerance."""
    from helpers import turing_profile

    import npu_runtime.cuda.executor as executor

    dtype, (n, h, w), c, mid, o, stride = SHORTCUTS[name]
    tdt = getattr(torch, dtype)
    torch.manual_seed(0)
    model = ShortcutBlock(c, mid, o, stride).eval().to(tdt)
    args = [torch.randn(n, 8, h, w).to(tdt)]
    ir = ir_dict(model, args, name)
    folded = npu_compiler.compile(ir, "cuda", dtype=dtype)
    plain = npu_compiler.compile(ir, "cuda", dtype=dtype, disable_passes=["conv_side"])
    (side,) = [k for k in folded.kernels if k.kind == "conv2d" and k.spec.side_stride]
    assert side.spec.side_stride == (stride, stride) and len(folded.kernels) == len(plain.kernels) - 1
    assert any(p.startswith("conv_side(1)") for p in folded.passes)
    forced = turing_profile() if device == "turing" else device
    if forced is not None:  # rendered as that GPU would (compiled for this one)
        monkeypatch.setattr(executor, "CudaTarget", lambda _device, forced=forced: CudaTarget(forced))
    render = CudaTarget(forced or rendered_for(folded, cuda_backend))
    src = render.kernel_sources(side, folded)[0]
    direct = device == "turing"
    assert ("tc_cp16" in src) != direct and ("x2t" in src) != direct, "not the kernel expected"
    outs = []
    for program in (folded, plain):
        weights = load_weights(program, module_weights(model), cuda_backend)
        ex = cuda_backend.create_executor(program)
        ex.poison()
        feeds = {s.name: to_np(a) for s, a in zip(program.inputs, args, strict=True)}
        outs.append(ex.run_numpy(feeds, weights)[program.outputs[0].name])
    np.testing.assert_array_equal(outs[0], outs[1])
    with torch.no_grad():
        ref = model.cuda()(*(a.cuda() for a in args)).float().cpu().numpy()
    assert_close(outs[0].astype(np.float32), ref, dtype, "accumulate", "cuda", what=name)
