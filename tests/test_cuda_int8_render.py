"""The cuda target's integer kernels (`targets/cuda/int8_kernels.py`) render for every case of tests/int8_cases.py and
for a PT2E-form model, and NVRTC compiles them for sm_80 (the A100 row: mma.sync m16n8k32 s8) and sm_90 (the H200
row); ptxas, where installed, assembles them. Their results are checked on a GPU by tests/gpu/test_int8_cuda.py."""

from __future__ import annotations

import numpy as np
import pytest
from int8_cases import Case, integer_cases, program_of, wgemm_cases

from npu_compiler.kernels import WGemmKernel
from npu_compiler.targets.cuda import CudaTarget, nvrtc


def _decode_wgemm(bits: int, m: int, n: int, k: int) -> Case:
    """A bf16 decode step's weight-only projection (render only: the values are zeros)."""
    g = 128 if bits == 4 else 0
    ins = [("x", np.zeros((m, k), np.float32), "bfloat16"),
           ("q", np.zeros((n, k if bits == 8 else k // 2), np.uint8), "int8" if bits == 8 else "uint8"),
           ("s", np.zeros((n,) if bits == 8 else (n, k // g), np.float32), "float32")]
    if bits == 4:
        ins.append(("z", np.zeros((n, k // g), np.uint8), "uint8"))
    ins.append(("bias", np.zeros(n, np.float32), "bfloat16"))
    return Case(f"wgemm bf16 int{bits} {m}x{n}x{k}", WGemmKernel(m, n, k, (), bits, g, True), ins, (m, n), "bfloat16")


# Qwen2.5-1.5B's q/k/v (concatenated), gate/up and down projections in bf16, as the decode step runs them
DECODE = [_decode_wgemm(8, 1, 2048, 1536), _decode_wgemm(4, 1, 17920, 1536), _decode_wgemm(4, 3, 1536, 8960)]
CASES = integer_cases() + wgemm_cases() + DECODE


def _sources(device: str) -> list[tuple[str, str]]:
    target = CudaTarget(device)
    out = []
    for case in CASES:
        program = program_of(case, "cuda")
        for text in target.kernel_sources(program.kernels[0], program):
            out.append((case.name, text))
    return out


def test_integer_kinds_render_on_tensor_cores() -> None:
    texts = dict(_sources("h200"))
    assert "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32" in texts["qgemm plain"]
    assert "mma.sync.aligned.m16n8k32" in texts["qconv2d 3x3 pad"]
    assert "uint4" in texts["wgemm int4"]  # 16-byte loads of the packed codes
    assert "npu_cp16(&Bs" in texts["qconv2d 16-byte weight rows"]  # [O, C, kh, kw] rows of K = 144: copies
    assert "uint4" not in texts["qgemm b zero point"]  # K = 12: element loads
    # both tiles 16-byte rows along K: cp.async stages and ldmatrix fragments (int8_conv.py)
    for name in ("qgemm uint8 acts, k%4", "qgemm 16-byte rows, tiles", *(c.name for c in integer_cases()
                                                                        if "channels-last" in c.name)):
        assert "cp.async.cg.shared.global" in texts[name] and "ldmatrix" in texts[name], name
    # NCHW, 3 channels: both tiles gathered a byte an element (one row a thread), still staged and on ldmatrix
    assert "npu_cp16(dst" not in texts["qconv2d 3x3 pad"] and "As[(tid % " in texts["qconv2d 3x3 pad"]
    assert "ldmatrix" in texts["qconv2d 3x3 pad"]
    assert "npu_rs[" in texts["qconv2d groups dilation"]  # groups: the gathering kernel of int8_kernels.py
    # the zero point's column sums only where the (flipped) zero point is not 0; its padding stored where it is not 0
    assert "npu_csum" not in texts["qconv2d channels-last 3x3 pad"]
    assert "npu_csum" in texts["qconv2d channels-last stride 2 zero point relu"]
    assert "make_uint4" in texts["qconv2d channels-last stride 2 zero point relu"]
    assert "npu_csum" not in texts["qconv2d channels-last uint8 dilation"]  # 128: 0 once flipped, but stored
    assert "make_uint4(0x80808080u" in texts["qconv2d channels-last uint8 dilation"]


def test_a_gpu_without_int8_tensor_cores_is_refused_by_name() -> None:
    from helpers import turing_profile

    from npu_compiler.errors import NPUCompileError

    case = integer_cases()[0]
    program = program_of(case, "cuda")
    with pytest.raises(NPUCompileError, match="int8 tensor cores"):
        CudaTarget(turing_profile()).kernel_sources(program.kernels[0], program)


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is absent (the project's cuda extra installs it)")
@pytest.mark.parametrize("device,arch", [("a100", "80"), ("h200", "90")])
def test_integer_kernels_compile_with_nvrtc(device: str, arch: str) -> None:
    seen: set[str] = set()
    ptxas = nvrtc.ptxas_path()
    for name, text in _sources(device):
        if text in seen:
            continue
        seen.add(text)
        ptx = nvrtc.compile_source(text, f"compute_{arch}", name=f"{name}.cu")
        assert b"mma.sync.aligned.m16n8k32" in ptx or not name.startswith(("qgemm", "qconv2d"))
        if ptxas:
            nvrtc.ptxas_check(ptx, f"sm_{arch}")


def test_tiles_are_planned_from_the_device_profile() -> None:
    """The tile is the largest that still gives every multiprocessor a block (an A100 and an L4 differ by their SM
    counts); every NVIDIA row's plan fits the row's threads and its shared memory without opting in."""
    import re

    from npu_compiler.devices import CHIPS
    from npu_compiler.targets.cuda.int8_kernels import plan_int8

    rows, cols = 64 * 56 * 56, 256  # ResNet-50 batch 64's first bottleneck 1x1
    a100, l4 = plan_int8(rows, cols, CHIPS["a100"]), plan_int8(rows, cols, CHIPS["l4"])
    assert (a100.bm, a100.bn) == (128, 64) and a100.grid != l4.grid
    assert (plan_int8(32, 32, CHIPS["h200"]).bm, plan_int8(32, 32, CHIPS["h200"]).bn) == (32, 32)
    from npu_compiler.targets.cuda.int8_kernels import render_integer

    for case in (next(c for c in integer_cases() if c.name == n) for n in ("qconv2d groups dilation",
                                                                          "qconv2d channels-last many tiles")):
        program = program_of(case, "cuda")
        for name, dev in CHIPS.items():
            if dev.vendor != "nvidia" or dev.compute_capability < 80:
                continue
            ((text, launch),) = render_integer(program.kernels[0], program, CudaTarget(name).profile)
            static = sum(int(a) * int(b) for a, b in re.findall(r"npu_s[ab]\[(\d+)\]\[(\d+)\]", text))
            assert launch.block <= dev.max_threads_per_block and static < 48 * 1024, name
            assert launch.smem <= dev.shared_memory_per_block_optin, name


def test_weight_only_gemv_prefetches_only_before_its_wait() -> None:
    from helpers import assert_waits_first

    texts = dict(_sources("h200"))
    for name in ("wgemm int8", "wgemm int4", "wgemm int8 split k", "wgemm int4 row tail", *(c.name for c in DECODE)):
        assert "npu_prefetch_l2(" in texts[name] and "__shfl_xor_sync" in texts[name]
        assert_waits_first(texts[name])


def test_integer_convs_keep_channels_last_int8_and_stored_plans(tmp_path) -> None:
    """On cuda a quantized conv chain keeps its int8 activations channels-last between layers and its weights as
    [O, kh, kw, C], each integer GEMM renders on the 16-byte copy path, and its tiles are the record's plan, stored in
    the artifact (kernels/plans.py) and rendered from there."""
    import torch
    from conftest import export_ir
    from test_quant_fold import QConv, _dq, _q

    from npu_compiler import compile as compile_ir
    from npu_compiler.kernels import QConv2dPlan
    from npu_compiler.program import CompiledProgram

    class Chain(torch.nn.Module):
        """q -> dq -> conv 3x3 -> relu -> q -> dq -> conv 1x1 -> q: two integer convs, one int8 tensor between."""

        def __init__(self):
            super().__init__()
            self.a, self.b = QConv(16, 32, 3, padding=1, act="relu", x_zp=0), QConv(32, 16, 1, x_zp=0)

        def forward(self, x):
            xd = _dq(_q(x, 0.03, 0, torch.int8), 0.03, 0, torch.int8)
            y = torch.relu(torch.nn.functional.conv2d(xd, self._w(self.a), self.a.bias, 1, 1))
            yd = _dq(_q(y, 0.05, 0, torch.int8), 0.05, 0, torch.int8)
            return _q(torch.nn.functional.conv2d(yd, self._w(self.b), self.b.bias), 0.05, 0, torch.int8)

        @staticmethod
        def _w(m):
            return torch.ops.quantized_decomposed.dequantize_per_channel(m.w_q, m.w_s, m.w_z, 0, -127, 127,
                                                                          torch.int8)

    ir = export_ir(Chain, [torch.randn(2, 16, 6, 6)])
    program = compile_ir(ir, "cuda")
    convs = [k for k in program.kernels if k.kind == "qconv2d"]
    assert len(convs) == 2
    for k in convs:  # (the first reads the program's input as quantized: NCHW)
        assert k.args[1].strides[1] == 1 and k.outs[0].strides[1] == 1, (k.args[1].strides, k.outs[0].strides)
        assert isinstance(k.plan, QConv2dPlan) and k.plan.chosen
    assert convs[0].outs[0].buffer == convs[1].args[0].buffer  # no layout copy between them
    program.save(tmp_path / "q.npubin")
    again = CompiledProgram.load(tmp_path / "q.npubin")
    assert [k.plan for k in again.kernels] == [k.plan for k in program.kernels]
    target = CudaTarget("h200")
    for k in again.kernels:
        if k.kind == "qconv2d":
            (text,) = target.kernel_sources(k, again)
            assert f"npu_wait_copies<{k.plan.stages - 2}>" in text and "npu_cp16(&Bs" in text
            # the program's input as quantized is NCHW: gathered; the int8 tensor between the convs: copied
            assert ("npu_cp16(dst" in text) == (k.args[0].strides[1] == 1)


def test_a_stored_int8_plan_the_device_cannot_honour_is_replanned() -> None:
    """A program planned for a GPU with more shared memory, or a crafted tile: the renderer plans for its own."""
    import dataclasses

    from int8_cases import qconv_channels_last_cases

    from npu_compiler.kernels import QConv2dPlan
    from npu_compiler.targets.cuda import int8_conv

    case = qconv_channels_last_cases()[0]
    program = program_of(case, "cuda")
    k = program.kernels[0]
    dev = CudaTarget("h200").profile
    k.plan = QConv2dPlan(128, 128, 64, 32, 4)
    assert int8_conv.tile_plan(k, dev) == k.plan
    small = dataclasses.replace(dev, shared_memory_per_block_optin=48 * 1024, shared_memory_per_block=48 * 1024,
                                shared_memory_per_multiprocessor=64 * 1024)
    assert int8_conv.tile_plan(k, small) == int8_conv.plan(k, small) != k.plan
    k.plan = QConv2dPlan(1024, 1024, 16, 16, 4)
    assert int8_conv.tile_plan(k, dev) == int8_conv.plan(k, dev)


def test_a_crafted_int8_plan_is_refused_by_name() -> None:
    from npu_compiler.kernels import plan_from_data

    with pytest.raises(ValueError, match="bm"):
        plan_from_data("qconv2d", {"bm": 1 << 20}, "k1_qconv2d.plan")


def test_a_deep_conv_of_few_tiles_is_split_along_k_in_its_plan(tmp_path) -> None:
    """One image through a conv of K = 2304 into 64 channels (one tile): the plan splits K (int32 parts in the
    plan's scratch, a buffer of the memory plan), stored in the artifact, rendered as the GEMM and a launch summing
    the parts; an input zero point not 0 keeps the GEMM whole."""
    import torch
    from conftest import export_ir
    from test_quant_fold import QConv

    from npu_compiler import compile as compile_ir
    from npu_compiler.program import CompiledProgram

    ir = export_ir(lambda: QConv(256, 64, 3, padding=1, x_zp=0), [torch.randn(1, 256, 4, 4)])
    program = compile_ir(ir, "cuda")
    (k,) = [k for k in program.kernels if k.kind == "qconv2d"]
    assert k.plan.splits > 1 and len(k.scratch) == 1
    assert program.buffers[k.scratch[0].buffer].dtype == "int32"
    program.save(tmp_path / "q.npubin")
    again = CompiledProgram.load(tmp_path / "q.npubin")
    (k2,) = [k for k in again.kernels if k.kind == "qconv2d"]
    texts = CudaTarget("h200").kernel_sources(k2, again)
    assert len(texts) == 2 and "out1[(npu_split" in texts[0] and "out1[p *" in texts[1]
    ir = export_ir(lambda: QConv(256, 64, 3, padding=1, x_zp=3), [torch.randn(1, 256, 4, 4)])
    (k,) = [k for k in compile_ir(ir, "cuda").kernels if k.kind == "qconv2d"]
    assert k.plan.splits == 0 and not k.scratch
