"""The cuda target's convolutions on tensor cores, without a GPU: which programs take them (a batch of images, not
one image), what the lowering does for them (channels-last activations, conv weights kept as [O, kh, kw, C] through
WeightSpec.layout, no im2col copy, GEMM or epilogue pass), that the program computes the model (its kernels run by
their NumPy references against PyTorch on the CPU), that every source compiles with NVRTC and assembles without
spills, and that the artifact carries the weight layout and refuses a wrong one."""

from __future__ import annotations

import dataclasses
import re
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_ir")

from fused_cases import ir_dict, module_weights  # noqa: E402
from helpers import assert_waits_first  # noqa: E402

import npu_compiler  # noqa: E402
import npu_runtime  # noqa: E402
from npu_compiler.devices import CHIPS  # noqa: E402
from npu_compiler.errors import ArtifactError  # noqa: E402
from npu_compiler.program import CompiledProgram  # noqa: E402
from npu_compiler.targets.cuda import CudaTarget, nvrtc  # noqa: E402
from npu_compiler.targets.cuda.conv_tc import splits_for, tall_tiles, tile_for  # noqa: E402
from npu_compiler.tensor import memory_order  # noqa: E402
from npu_runtime.cpu.executor import CpuExecutor  # noqa: E402
from npu_runtime.errors import WeightError  # noqa: E402
from npu_runtime.metrics import compare  # noqa: E402


class Bottleneck(torch.nn.Module):
    """ResNet's bottleneck with a projection shortcut, and a stem of 3 channels before it. At 2 x 368 x 368 most of
    its FLOPs are in convs with enough pixels to give every SM a block (the tensor cores pay); the last two convs have
    fewer, and run on them too."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 7, 2, 3, bias=False)
        self.bn = torch.nn.BatchNorm2d(16)
        self.a = torch.nn.Conv2d(16, 16, 1, bias=False)
        self.b = torch.nn.Conv2d(16, 16, 3, 1, 1, bias=False)
        self.c = torch.nn.Conv2d(16, 64, 1)
        self.proj = torch.nn.Conv2d(16, 64, 1, 2)
        self.d = torch.nn.Conv2d(64, 64, 3, 2, 1)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.stem(x))), 3, 2, 1)
        y = torch.relu(self.c(torch.relu(self.b(torch.relu(self.a(x))))) + x.repeat(1, 4, 1, 1))
        return torch.relu(self.d(y) + self.proj(x))


def _program(batch: int = 2, size: int = 368, dtype: str = "float16"
             ) -> tuple[Bottleneck, torch.Tensor, CompiledProgram]:
    torch.manual_seed(0)
    model = Bottleneck().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(batch, 3, size, size)
    return model, x, npu_compiler.compile(ir_dict(model, [x], "bottleneck"), "cuda", dtype=dtype)


def test_a_batch_runs_its_convs_on_tensor_cores_channels_last() -> None:
    _, _, prog = _program()
    convs = [k for k in prog.kernels if k.kind == "conv2d"]
    assert len(convs) == 6 and not any(k.kind == "gemm" for k in prog.kernels), [k.kind for k in prog.kernels]
    sources = [CudaTarget().kernel_sources(k, prog)[0] for k in convs]
    assert all("mma.sync" in s for s in sources)
    # activations channels-last: every conv output is [N, C, H, W] with the channel stride 1
    for k in convs:
        n, c, h, w = k.outs[0].shape
        assert tuple(k.outs[0].strides) == (h * w * c, 1, w * c, c), k.name
    # weights of a multiple of 8 input channels as [O, kh, kw, C] (16-byte copies); the stem's 3 are not
    layouts = {w.name: w.layout for w in prog.weights if len(w.shape) == 4}
    assert sorted(layouts.values()).count((0, 2, 3, 1)) == 5 and () in layouts.values(), layouts
    # the last 3x3 conv has 67 tiles and a K of 576: its K is split in two (a float32 scratch beside the output);
    # the 1x1 projection beside it has too short a K to split
    split = [k for k in convs if k.plan.splits > 1]
    assert len(split) == 1 and split[0].plan.splits == 2 and tuple(split[0].args[1].shape) == (64, 64, 3, 3)
    assert len(split[0].scratch) == 1 and prog.dtype_of(split[0].scratch[0]) == "float32"
    assert split[0].scratch[0].numel == 2 * split[0].outs[0].numel
    # Hopper: the two splits are one cluster that sums its parts in shared memory, one launch; an A100 writes them
    # to the scratch and a second launch sums them
    (hopper,) = CudaTarget(90).kernel_sources(split[0], prog)
    assert "__cluster_dims__(1, 1, 2)" in hopper and "out1" not in hopper.split("npu_kernel(", 1)[1].split(")", 1)[1]
    ampere = CudaTarget(80).kernel_sources(split[0], prog)
    assert len(ampere) == 2 and not any("cluster" in src for src in ampere)
    # the residual adds and ReLUs are in the convs' epilogues; what is left: the pool and the output copy
    assert sorted(k.group for k in prog.kernels if k.kind != "conv2d") == ["max_pool2d.default", "output_copy",
                                                                          "repeat.default"]


class _ConvOfInputs(torch.nn.Module):
    def forward(self, x, w):
        return torch.nn.functional.conv2d(x, w, padding=1)


def test_only_weight_buffers_are_copied_before_the_wait() -> None:
    """A tensor-core conv copies its first weight tiles (a windowed conv: its whole weight tile) to shared memory
    before it waits for the kernel ahead only where the weight is a weight buffer (read-only); a conv over two
    activations copies nothing early."""
    from npu_compiler.targets.cuda.common import WEIGHTS_BEGIN

    _, _, prog = _program()
    convs = [k for k in prog.kernels if k.kind == "conv2d"]
    for k in convs:
        text = CudaTarget().kernel_sources(k, prog)[0]
        wide = len(k.args[1].shape) == 4 and k.args[1].shape[1] % 8 == 0  # 16-byte weight copies
        windowed = "copy_window" in text  # the stem: its whole weight tile, once a block
        assert (WEIGHTS_BEGIN in text) == (wide or windowed), k.name
        assert_waits_first(text)
    args = [torch.randn(2, 64, 40, 40), torch.randn(64, 64, 3, 3)]
    prog = npu_compiler.compile(ir_dict(_ConvOfInputs(), args, "conv_of_inputs"), "cuda", dtype="float16")
    for k in prog.kernels:
        for text in CudaTarget().kernel_sources(k, prog):
            assert WEIGHTS_BEGIN not in text, k.name
            assert_waits_first(text, weights=False)


def test_one_image_splits_the_long_k_of_its_deep_convs() -> None:
    """One image: the deep convs have a few tiles each and a long K, split across blocks."""
    _, _, prog = _program(1, 64)
    convs = [k for k in prog.kernels if k.kind == "conv2d"]
    assert len(convs) == 6 and all(w.layout for w in prog.weights if len(w.shape) == 4 and w.shape[1] % 8 == 0)
    assert max(k.plan.splits for k in convs) > 1


class Depthwise(torch.nn.Module):
    """Most conv FLOPs in a depthwise conv (groups = channels), which the tensor-core kernel does not run."""

    def __init__(self) -> None:
        super().__init__()
        self.point = torch.nn.Conv2d(16, 16, 1)
        self.depth = torch.nn.Conv2d(16, 16, 7, padding=3, groups=16)

    def forward(self, x):
        return self.depth(self.point(x))


def test_convs_stay_on_cublas_where_switched_off_or_mostly_grouped() -> None:
    off = npu_compiler.compile(ir_dict(Bottleneck().eval(), [torch.randn(2, 3, 368, 368)], "b"), "cuda",
                               dtype="float16", disable_passes=["conv_tensor_cores"])
    assert not any(k.kind == "conv2d" for k in off.kernels) and all(not w.layout for w in off.weights)
    dw = npu_compiler.compile(ir_dict(Depthwise().eval(), [torch.randn(4, 16, 64, 64)], "dw"), "cuda",
                              dtype="float16")
    assert all(not w.layout for w in dw.weights)
    assert not any("mma.sync" in CudaTarget().kernel_sources(k, dw)[0] for k in dw.kernels if k.kind == "conv2d")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_channels_last_program_computes_the_model(dtype: str) -> None:
    """The cuda program's kernels run by their NumPy references (the records mean the same on every target): the
    weight layouts, the strided views and the epilogues against PyTorch in float32 on the CPU, under the model
    tolerance of the compute dtype (what `npusim verify` holds a model to: six convs, a folded BN, two residuals)."""
    model, x, prog = _program(dtype=dtype)
    assert any(k.kind == "conv2d" for k in prog.kernels)
    cpu = npu_runtime.get_backend("cpu")
    as_cpu = dataclasses.replace(prog, target="cpu")
    ws = npu_runtime.load_weights(as_cpu, module_weights(model), cpu)
    got = CpuExecutor(as_cpu, cpu).run_numpy({as_cpu.inputs[0].name: x.numpy()}, ws)[as_cpu.outputs[0].name]
    with torch.no_grad():
        ref = model(x).numpy()
    c = compare("bottleneck", got.astype(np.float32), ref, dtype)
    assert c.passed, c


def _resnet50(batch: int) -> CompiledProgram:
    import torch_ir

    from npu_export import resnet
    from npu_export.ir_io import ir_to_dict

    with torch.device("meta"):
        m = resnet.resnet50().eval()
        x = torch.randn(batch, 3, 224, 224)
    with torch.no_grad():
        ir = ir_to_dict(torch_ir.extract_ir(m, (x,), model_name="resnet50"))
    return npu_compiler.compile(ir, "cuda", dtype="float16")


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is absent")
def test_tensor_core_conv_sources_compile_without_spills(tmp_path) -> None:
    prog = _resnet50(64)
    convs = [k for k in prog.kernels if k.kind == "conv2d"]
    # 53 convs, the four projection shortcuts computed by the expansions that add them (conv_side)
    assert len(convs) == 49 and len(prog.kernels) == 52 and sum(bool(k.spec.side_stride) for k in convs) == 4
    r = CudaTarget().render_program(prog)
    sources = {r.steps[prog.kernels.index(k)][0].source for k in convs}
    _, _, small = _program()  # and the K-split kernels: in a cluster (Hopper), and with their sums (Ampere)
    for arch in (90, 80):
        rs = CudaTarget(arch).render_program(small)
        r.sources.update({f"{arch}_{n}": t for n, t in rs.sources.items()})
        sources |= {f"{arch}_{st.source}" for k, steps in zip(small.kernels, rs.steps) if k.kind == "conv2d"
                    for st in steps}
    ptxas = nvrtc.ptxas_path()
    for name in sorted(sources):
        assert_waits_first(r.sources[name])
        ptx = nvrtc.compile_source(r.sources[name], nvrtc.target_for(r.sources[name], "compute_90"),
                                   name=f"{name}.cu")
        if ptxas:
            path = tmp_path / f"{name}.ptx"
            path.write_bytes(ptx if isinstance(ptx, bytes) else ptx.encode())
            arch = nvrtc.target_for(r.sources[name], "sm_90")
            info = subprocess.run([ptxas, f"-arch={arch}", "-v", str(path), "-o", str(tmp_path / "k.cubin")],
                                  capture_output=True, text=True, check=True).stderr
            spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", info)]
            assert max(spills, default=0) <= 8, f"{name}: {info}"


def test_block_tiles() -> None:
    """128 output channels where there are that many; 128 pixels where that still gives every SM a block. The GPU
    test's cases (tests/gpu/test_cuda_conv_tc.py) exercise every tile."""
    from gpu.test_cuda_conv_tc import CASES

    h100 = CHIPS["h100"]
    assert tile_for(64 * 56 * 56, 256, h100)[:2] == (128, 128)
    assert tile_for(64 * 56 * 56, 64, h100)[:2] == (128, 64)
    assert tile_for(64 * 7 * 7, 512, h100)[:2] == (64, 128)
    # Hopper's warpgroup MMA: 128-pixel tiles unsplit where they give half the SMs a block (100 blocks here)
    assert tile_for(64 * 7 * 7, 512, h100, wide=True)[:2] == (128, 128)
    assert splits_for(64 * 7 * 7, 512, 4608, h100, wide=True) == 1 and splits_for(64 * 7 * 7, 512, 4608, h100) == 1
    assert tile_for(7 * 7, 512, h100, wide=True)[:2] == (64, 128)
    assert splits_for(7 * 7, 512, 4608, h100, wide=True) == 8
    assert tile_for(2 * 33 * 33, 40, h100)[:2] == (64, 64)
    # Hopper's 192-pixel tiles where the busiest SM then multiplies fewer pixels: ResNet-50's third stage at batch 64
    # (196 tiles of 128 -> 132 of 192), not its second (392 -> 262: three rounds of 128 against two of 192) nor its
    # fourth (100 -> 68) nor 64 channels
    assert tall_tiles(64 * 14 * 14, 256, h100) and not tall_tiles(64 * 14 * 14, 1024, h100)
    assert not any(tall_tiles(p, o, h100) for p, o in ((64 * 28 * 28, 128), (64 * 7 * 7, 512), (64 * 56 * 56, 64)))
    tiles = set()
    for _dt, (n, _c, h, w), o, k, stride, pad, dil, *_ in CASES.values():
        ho = (h + 2 * pad - dil * (k - 1) - 1) // stride + 1
        wo = (w + 2 * pad - dil * (k - 1) - 1) // stride + 1
        tiles.add(tile_for(n * ho * wo, o, h100)[:2])
    assert tiles == {(128, 128), (64, 128), (128, 64), (64, 64)}, tiles


def test_generated_kernels_walk_a_permuted_output_in_memory_order() -> None:
    assert memory_order((2, 8, 4, 4), (128, 1, 32, 8)) == [0, 2, 3, 1]  # channels-last
    assert memory_order((2, 8, 4, 4), (16, 32, 4, 1)) == [1, 0, 2, 3]  # channel-major
    assert memory_order((2, 8, 4, 4), (128, 16, 4, 1)) is None  # row-major
    assert memory_order((2, 8, 4, 4), (256, 1, 32, 8)) is None  # holes
    _, _, prog = _program()
    pool = next(k for k in prog.kernels if k.group == "max_pool2d.default")
    src = CudaTarget().kernel_sources(pool, prog)[0]
    # the channel index is the innermost of the flat index: consecutive threads write consecutive channels
    assert re.search(r"o1 = o_rem % ", src), src


def test_the_artifact_carries_the_weight_layout_and_refuses_a_wrong_one(tmp_path) -> None:
    model, _, prog = _program()
    again = CompiledProgram.from_bytes(prog.to_bytes())
    assert [w.layout for w in again.weights] == [w.layout for w in prog.weights]
    bad = dataclasses.replace(prog, weights=[dataclasses.replace(w, layout=(0, 1, 1, 3)) if w.layout else w
                                             for w in prog.weights])
    with pytest.raises(ArtifactError, match=r"weights\[\d+\]\.layout.*not an order of the 4 dims"):
        CompiledProgram.from_bytes(bad.to_bytes())


def test_weights_loaded_for_another_layout_are_refused() -> None:
    """The same weights loaded for a program that keeps them as they are (its convs on cuBLAS) bound to one that
    keeps them as [O, kh, kw, C]: refused, not computed with the wrong order."""
    model, x, batch = _program()
    single = npu_compiler.compile(ir_dict(model, [x], "b"), "cuda", dtype="float16",
                                  disable_passes=["conv_tensor_cores"])
    cpu = npu_runtime.get_backend("cpu")
    ws = npu_runtime.load_weights(dataclasses.replace(single, target="cpu"), module_weights(model), cpu)
    as_cpu = dataclasses.replace(batch, target="cpu")
    with pytest.raises(WeightError, match=r"keeps it as \[\d+, \d+, \d+, \d+\].*load the weights for this program"):
        CpuExecutor(as_cpu, cpu).run_numpy({as_cpu.inputs[0].name: np.zeros(as_cpu.inputs[0].shape, np.float32)}, ws)


def test_describe_shows_the_layouts_and_the_splits(tmp_path, capsys) -> None:
    from npusim.cli import main

    _, _, prog = _program()
    rows = [k for k in prog.describe()["kernels"] if k["kind"] == "conv2d"]
    assert all(r["out_order"] == [0, 2, 3, 1] for r in rows)
    assert [r.get("splits", 1) for r in rows] == [k.plan.splits for k in prog.kernels if k.kind == "conv2d"]
    path = tmp_path / "b.npubin"
    prog.save(path)
    assert main(["describe", str(path)]) == 0
    text = capsys.readouterr().out
    assert "5 stored with their dims in the order [0, 2, 3, 1]" in text
    assert "[NHWC in memory, K split 2 ways]" in text and text.count("NHWC in memory") == 7
    # one image (its batch dim of size 1 has no stride of its own): still NHWC, not HWCN
    _, _, single = _program(1, 64)
    single.save(path)
    assert main(["describe", str(path)]) == 0
    text = capsys.readouterr().out
    assert "NHWC in memory" in text and "HWCN" not in text


class OddConvs(torch.nn.Module):
    """Convs of odd shapes behind a large one (so that the program takes the tensor cores): one output channel,
    a 2x2 window at stride 4, 8 input channels (K shorter than a K step), a dilated 3x3 whose K is split, a 1x1
    over a 1x1 image."""

    def __init__(self) -> None:
        super().__init__()
        self.big = torch.nn.Conv2d(8, 64, 3, padding=1)
        self.one = torch.nn.Conv2d(64, 1, 1)
        self.odd = torch.nn.Conv2d(64, 64, 2, stride=4)
        self.dil = torch.nn.Conv2d(64, 40, 3, padding=2, dilation=2, bias=False)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.last = torch.nn.Conv2d(40, 16, 1)

    def forward(self, x):
        y = torch.relu(self.big(x))
        z = self.dil(self.odd(y))
        return self.one(y)[:, :, ::10, ::10].flatten(), self.last(self.pool(z)).flatten()


def test_odd_convs_compile_and_compute_the_model() -> None:
    torch.manual_seed(0)
    model = OddConvs().eval()
    x = torch.randn(2, 8, 200, 200)
    prog = npu_compiler.compile(ir_dict(model, [x], "odd"), "cuda", dtype="float16")
    convs = [k for k in prog.kernels if k.kind == "conv2d"]
    assert len(convs) == 5 and any(k.plan.splits > 1 for k in convs), [k.plan.splits for k in convs]
    target = CudaTarget()
    assert all(any(mma in target.kernel_sources(k, prog)[0] for mma in ("mma.sync", "wgmma.mma_async"))
               for k in convs)
    if nvrtc.available():
        for k in convs:
            for src in target.kernel_sources(k, prog):
                nvrtc.compile_source(src, nvrtc.target_for(src, "compute_90"), name=f"{k.name}.cu")
    cpu = npu_runtime.get_backend("cpu")
    as_cpu = dataclasses.replace(prog, target="cpu")
    ws = npu_runtime.load_weights(as_cpu, module_weights(model), cpu)
    got = CpuExecutor(as_cpu, cpu).run_numpy({as_cpu.inputs[0].name: x.numpy()}, ws)
    with torch.no_grad():
        ref = model(x)
    for spec, r in zip(as_cpu.outputs, ref, strict=True):
        c = compare(spec.name, got[spec.name].astype(np.float32), r.numpy(), "float16")
        assert c.passed, c


@pytest.mark.parametrize("device", ["h100", "a100", "l4", "rtx4090", "b200"])
def test_shared_memory_fits_the_gpu(device: str) -> None:
    """The K step (and so the shared memory) of each conv fits the GPU the runtime renders for (its profile's
    shared memory a block may opt in to): Hopper takes the longer step where both tiles are copies; an sm_89 GPU (99
    KiB a block) the shorter one."""
    prog = _resnet50(8)
    target = CudaTarget(device)
    launches = [lc for k in prog.kernels for kind, (_, lc) in target.render_kernel(k, prog) if kind == "launch"]
    assert max(lc.smem for lc in launches) <= target.profile.shared_memory_per_block_optin
    # three stages of 128 x 128 tiles at K 64 (Hopper's warpgroup MMA without padding rows): 96 KiB at least
    assert (max(lc.smem for lc in launches) >= 3 * (128 + 128) * 64 * 2) == (device in ("h100", "a100", "b200"))


def test_window_plan_spans_the_output_rows_of_every_pixel_tile() -> None:
    """conv_window.plan: the output rows a pixel tile spans (its window's slabs), counted pixel by pixel, for tiles
    that start mid-row and run into the next image; ResNet-50's stem at batch 64 through the window in 16-byte copies,
    at batch 1 (too few tiles for the grid) and with a K too long for half the shared memory not."""
    from npu_compiler.targets.cuda import conv_window
    from npu_compiler.tensor import TensorRef, contiguous_strides

    def nchw(shape):
        return TensorRef(0, shape, contiguous_strides(shape))

    for n, c, h, w, k, s, p, d, bm in ((3, 3, 45, 37, 3, 1, 2, 2, 128), (96, 4, 40, 40, 5, 2, 2, 1, 64),
                                       (64, 3, 224, 224, 7, 2, 3, 1, 128), (5, 3, 9, 11, 3, 1, 1, 1, 128)):
        ho, wo = (h + 2 * p - d * (k - 1) - 1) // s + 1, (w + 2 * p - d * (k - 1) - 1) // s + 1
        win = conv_window.plan(nchw((n, c, h, w)), (16, c, k, k), (n, 16, ho, wo), (s, s), (p, p), (d, d), bm, 64,
                               32, 227 * 1024, 1)
        total = n * ho * wo
        spans = [len({q // wo for q in range(t, min(t + bm, total))}) for t in range(0, total, bm)]
        assert win is not None and win.orows == max(spans)
        assert win.vector == (w % 8 == 0) and win.kp % 32 == 0 and win.kp >= c * k * k
        # every column a pixel reads, the left padding included, lies inside a window row
        assert win.padl >= p and win.padl - p + (wo - 1) * s + (k - 1) * d < win.width
    stem = (nchw((64, 3, 224, 224)), (64, 3, 7, 7), (64, 64, 112, 112), (2, 2), (3, 3), (1, 1), 128, 64, 32, 227 * 1024)
    assert conv_window.plan(*stem, 264).orows == 2
    one = (nchw((1, 3, 224, 224)), (64, 3, 7, 7), (1, 64, 112, 112), (2, 2), (3, 3), (1, 1), 64, 64, 32, 227 * 1024)
    assert conv_window.plan(*one, 264) is None
    long_k = (nchw((64, 20, 75, 65)), (48, 20, 5, 5), (64, 48, 75, 65), (1, 1), (2, 2), (1, 1), 128, 64, 32, 227 * 1024)
    assert conv_window.plan(*long_k, 1) is None
