"""Side convs (lowering/side_convs.py): a ResNet block's 1x1 projection shortcut folded into the conv whose epilogue
adds it, where the target runs it (the cpu reference always; cuda on tensor cores, both inputs channels-last). The
folded program must give the unfolded one's bits (the shortcut's sum is rounded as it stored it) and PyTorch's result
within the dtype's tolerance; where the shortcut's result is read by anything else, nothing is folded; a record with
a side conv that does not add up is refused with the field named."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from fused_cases import TORCH_DTYPES, ir_dict
from gpu.util import to_np
from helpers import turing_profile
from tolerances import assert_close

import npu_compiler
import npu_runtime
from npu_compiler.npu import estimate_program, load_npu
from npu_compiler.targets.cuda import CudaTarget
from npu_export.cnn import model_tensors
from npu_export.resnet import BasicBlock, Bottleneck

CPU = npu_runtime.get_backend("cpu")


class Block(torch.nn.Module):
    """A 3x3 conv and ReLU before the block, so that the block's input is an intermediate (channels-last where the
    target keeps convs on tensor cores), then the block."""

    def __init__(self, block: torch.nn.Module, cin: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, cin, 3, padding=1)
        self.block = block

    def forward(self, x):
        return self.block(torch.relu(self.conv(x)))


def _block(kind: str, cin: int, planes: int, stride: int) -> Block:
    expansion = 4 if kind == "bottleneck" else 1
    ds = torch.nn.Sequential(torch.nn.Conv2d(cin, planes * expansion, 1, stride, bias=False),
                             torch.nn.BatchNorm2d(planes * expansion))
    inner = (Bottleneck if kind == "bottleneck" else BasicBlock)(cin, planes, stride, ds)
    torch.manual_seed(0)
    model = Block(inner, cin).eval()
    for m in model.modules():  # BatchNorm statistics away from the identity, so that the folded biases matter
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.2)
            m.running_var.uniform_(0.8, 1.25)
            m.weight.data.uniform_(0.8, 1.2)
            m.bias.data.normal_(0, 0.2)
    return model


def _run(program, model, x) -> np.ndarray:
    weights = npu_runtime.load_weights(program, model_tensors(model), CPU)
    feeds = {s.name: to_np(a) for s, a in zip(program.inputs, [x], strict=True)}
    return CPU.create_executor(program).run_numpy(feeds, weights)[program.outputs[0].name]


def _sides(program) -> list:
    return [k for k in program.kernels if k.kind == "conv2d" and k.spec.side_stride]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_basic_block_shortcut_folds_and_matches(dtype) -> None:
    """ResNet-18's downsampling block on the cpu reference: the stride-2 shortcut folded into the second 3x3 conv."""
    model = _block("basic", 16, 32, 2).to(TORCH_DTYPES[dtype])
    x = torch.randn(2, 3, 18, 14).to(TORCH_DTYPES[dtype])
    ir = ir_dict(model, [x], "basic")
    folded = npu_compiler.compile(ir, "cpu", dtype=dtype)
    plain = npu_compiler.compile(ir, "cpu", dtype=dtype, disable_passes=["conv_side"])
    (side,) = _sides(folded)
    assert side.spec.side_stride == (2, 2) and side.spec.side_bias and not _sides(plain)
    assert tuple(side.args[1].shape[2:]) == (3, 3) and len(folded.kernels) == len(plain.kernels) - 1
    assert "conv_side(1)" in folded.passes and {"add", "relu"} <= {n.split("_")[0] for n in side.nodes}
    got = _run(folded, model, x)
    np.testing.assert_array_equal(got, _run(plain, model, x))
    with torch.no_grad():
        ref = model(x).float().numpy()
    assert_close(got.astype(np.float32), ref, dtype, "accumulate", what=f"basic block {dtype}")


class SharedShortcut(torch.nn.Module):
    """A block whose shortcut's result is also returned."""

    def __init__(self) -> None:
        super().__init__()
        self.branch = torch.nn.Conv2d(16, 32, 3, 2, 1)
        self.shortcut = torch.nn.Conv2d(16, 32, 1, 2)

    def forward(self, x):
        s = self.shortcut(x)
        return torch.relu(self.branch(x) + s), s


def test_shortcut_read_elsewhere_is_not_folded() -> None:
    """The shortcut's result is also a program output: it must still be written, so it stays a kernel."""
    model = SharedShortcut().eval()
    prog = npu_compiler.compile(ir_dict(model, [torch.randn(1, 16, 12, 12)], "both"), "cpu", dtype="float32")
    assert not _sides(prog) and not any(p.startswith("conv_side") for p in prog.passes)
    assert len([k for k in prog.kernels if k.kind == "conv2d"]) == 2


@pytest.mark.parametrize("stride", [1, 2])
def test_cuda_folds_the_bottleneck_shortcut_on_tensor_cores(stride) -> None:
    """On cuda the bottleneck's expansion takes its shortcut where both inputs are channels-last and both K are
    multiples of 64; the source reads the shortcut's input (`x2`) and keeps its rounded sums (`sdp`), and on a GPU
    without tensor cores the direct kernel computes it as a second loop. The NPU estimate counts both products."""
    model = _block("bottleneck", 64, 64, stride).half()
    # enough pixels for 128-pixel tiles (on Hopper the warpgroup MMA's)
    ir = ir_dict(model, [torch.randn(8, 3, 64, 64).half()], "bottleneck")
    folded = npu_compiler.compile(ir, "cuda", dtype="float16")
    plain = npu_compiler.compile(ir, "cuda", dtype="float16", disable_passes=["conv_side"])
    (side,) = _sides(folded)
    assert side.spec.side_stride == (stride, stride) and tuple(side.args[1].shape) == (256, 64, 1, 1)
    for arch in (90, 80):
        src = CudaTarget(arch).kernel_sources(side, folded)[0]
        assert "x2t" in src and "sdp[" in src and ("wgmma" in src) == (arch == 90), arch
    direct = CudaTarget(turing_profile()).kernel_sources(side, folded)[0]
    assert "acc2[i][j]" in direct and "tc_cp16" not in direct
    npu = load_npu("edge-4tops")
    assert estimate_program(folded, npu).macs == estimate_program(plain, npu).macs
    webgpu = npu_compiler.compile(ir, "webgpu", dtype="float16")
    assert not _sides(webgpu)


def test_cuda_keeps_the_shortcut_over_a_program_input() -> None:
    """A shortcut of the NCHW program input (read element by element) is not folded on cuda."""
    ds = torch.nn.Sequential(torch.nn.Conv2d(64, 256, 1, bias=False), torch.nn.BatchNorm2d(256))
    model = Bottleneck(64, 64, 1, ds).eval().half()
    prog = npu_compiler.compile(ir_dict(model, [torch.randn(2, 64, 32, 32).half()], "input"), "cuda",
                                dtype="float16")
    assert not _sides(prog)


def test_a_side_conv_that_does_not_add_up_is_refused() -> None:
    model = _block("basic", 16, 32, 2)
    prog = npu_compiler.compile(ir_dict(model, [torch.randn(1, 3, 12, 12)], "basic"), "cpu", dtype="float32")
    (side,) = _sides(prog)
    bad = dataclasses.replace(side.spec, side_stride=(1, 1))
    with pytest.raises(ValueError, match="side conv of stride"):
        bad.check(dataclasses.replace(side, spec=bad), prog.buffers)
    no_epilogue = dataclasses.replace(side.spec, epilogue=None)
    with pytest.raises(ValueError, match="needs an epilogue"):
        no_epilogue.check(dataclasses.replace(side, spec=no_epilogue), prog.buffers)
    args = list(side.args)
    args[side.spec.side_first_arg + 1] = side.args[1]  # the 3x3 weight where the shortcut's 1x1 weight belongs
    with pytest.raises(ValueError, match="side conv's weight"):
        side.spec.check(dataclasses.replace(side, args=args), prog.buffers)


def test_webgpu_refuses_a_side_conv_record_without_its_plan() -> None:
    """A side conv is never folded for webgpu; the target runs a record that has one in passes through its plan's
    scratch (tests/webgpu/test_webgpu_staged.py), and one without that plan (a hostile artifact) is refused at
    render, naming what it lacks."""
    from npu_compiler.errors import NPUCompileError
    from npu_compiler.targets.webgpu.target import WebGPUTarget

    model = _block("basic", 16, 32, 2)
    ir = ir_dict(model, [torch.randn(1, 3, 12, 12)], "basic")
    prog = npu_compiler.compile(ir, "webgpu", dtype="float32")
    cpu = npu_compiler.compile(ir, "cpu", dtype="float32")
    (side,) = _sides(cpu)
    (conv,) = [k for k in prog.kernels if k.kind == "conv2d" and k.nodes[-1] == side.nodes[-1]] or [None]
    assert conv is not None and not conv.spec.side_stride
    kernels = list(prog.kernels)
    kernels[kernels.index(conv)] = bad = dataclasses.replace(conv, spec=side.spec, args=side.args)
    prog.kernels = kernels
    with pytest.raises(NPUCompileError, match="in passes, which need the scratch of a webgpu plan"):
        WebGPUTarget().kernel_sources(bad, prog)
