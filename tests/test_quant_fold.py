"""Quantized graphs in PT2E's form folded into integer kernels (`npu_compiler/quant/fold.py`), on the CPU reference,
against PyTorch's quantized reference ops (`torch.ops.quantized_decomposed` around float convolutions, linears and
adds, the same scales): every int8 result within one unit, the rule of docs/tolerances.md ("Integer programs").
Targets without integer kernels refuse the folded ops by name; the partition path runs them on the CPU."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import run_module

import npu_compiler
from npu_runtime.cpu.backend import CpuBackend

importlib.import_module("torch.ao.quantization.fx._decomposed")
QD = torch.ops.quantized_decomposed
RANGES = {torch.int8: (-128, 127), torch.uint8: (0, 255)}


def _q(x, scale, zp, dt):
    lo, hi = RANGES[dt]
    return QD.quantize_per_tensor(x, scale, zp, lo, hi, dt)


def _dq(q, scale, zp, dt):
    lo, hi = RANGES[dt]
    return QD.dequantize_per_tensor(q, scale, zp, lo, hi, dt)


ACTS = {"none": lambda y: y, "relu": F.relu, "hardtanh": lambda y: F.hardtanh(y, -0.5, 1.0)}


class QConv(torch.nn.Module):
    """x -> q -> dq -> conv2d(., dq_c(w_q), bias) -> act -> q: PT2E's reference form, its int8 weight a buffer."""

    def __init__(self, cin, cout, k, stride=1, padding=0, dilation=1, groups=1, act="none", dt=torch.int8,
                 x_zp=3, out_zp=-7, linear=False):
        super().__init__()
        shape = (cout, cin) if linear else (cout, cin // groups, k, k)
        w = torch.randn(shape) * 0.3
        ws = w.abs().reshape(cout, -1).amax(1) / 127
        self.register_buffer("w_q", torch.clamp(torch.round(w / ws.reshape(-1, *[1] * (w.dim() - 1))), -127, 127)
                             .to(torch.int8))
        self.register_buffer("w_s", ws)
        self.register_buffer("w_z", torch.zeros(cout, dtype=torch.int64))
        self.bias = torch.nn.Parameter(torch.randn(cout) * 0.5)
        self.geometry = (stride, padding, dilation, groups)
        self.act, self.dt, self.linear = ACTS[act], dt, linear
        lo = RANGES[dt][0]
        self.x_zp, self.out_zp = x_zp - lo - 128 if dt == torch.uint8 else x_zp, out_zp + (128 if lo == 0 else 0)

    def forward(self, x):
        xd = _dq(_q(x, 0.03, self.x_zp, self.dt), 0.03, self.x_zp, self.dt)
        wd = QD.dequantize_per_channel(self.w_q, self.w_s, self.w_z, 0, -127, 127, torch.int8)
        y = F.linear(xd, wd, self.bias) if self.linear else F.conv2d(xd, wd, self.bias, *self.geometry)
        return _q(self.act(y), 0.05, self.out_zp, self.dt)


class QAdd(torch.nn.Module):
    def __init__(self, act="relu"):
        super().__init__()
        self.act = ACTS[act]

    def forward(self, a, b):
        ad = _dq(_q(a, 0.021, -3, torch.int8), 0.021, -3, torch.int8)
        bd = _dq(_q(b, 0.043, 11, torch.int8), 0.043, 11, torch.int8)
        return _q(self.act(ad + bd), 0.05, -20, torch.int8)


def _within_one_unit(ir: dict, got: np.ndarray, ref: torch.Tensor, kinds: set[str]) -> None:
    program = npu_compiler.compile(ir, "cpu")
    assert {k.kind for k in program.kernels} >= kinds, [k.kind for k in program.kernels]
    diff = np.abs(got.astype(np.int64) - ref.numpy().astype(np.int64))
    assert diff.max() <= 1, f"{int((diff > 1).sum())} of {diff.size} results more than one unit off"
    # the rounding modes differ in rare cases only: most results are identical
    assert (diff == 0).mean() > 0.9, f"only {(diff == 0).mean():.3f} identical"


CONVS = [
    dict(cin=3, cout=8, k=3, padding=1, act="relu"),
    dict(cin=8, cout=6, k=3, stride=2, padding=1, groups=2, act="none", dt=torch.uint8, x_zp=128, out_zp=0),
    dict(cin=6, cout=6, k=3, padding=2, dilation=2, groups=6, act="hardtanh"),
    dict(cin=5, cout=7, k=1, act="relu", x_zp=-128, out_zp=-128),
]


@pytest.mark.parametrize("cfg", CONVS, ids=lambda c: f"{c['cin']}x{c['cout']}k{c['k']}{c.get('act')}")
def test_qconv2d_against_pytorch(cfg):
    ir, got, ref = run_module(CpuBackend(), lambda: QConv(**cfg), [torch.randn(2, cfg["cin"], 9, 9) * 2])
    _within_one_unit(ir, got[0], ref[0], {"qconv2d"})


@pytest.mark.parametrize("act", ["none", "relu"])
def test_qlinear_against_pytorch(act):
    ir, got, ref = run_module(CpuBackend(), lambda: QConv(24, 10, 0, act=act, linear=True), [torch.randn(3, 5, 24)])
    _within_one_unit(ir, got[0], ref[0], {"qgemm"})


@pytest.mark.parametrize("act", ["none", "relu"])
def test_qadd_against_pytorch(act):
    ir, got, ref = run_module(CpuBackend(), lambda: QAdd(act), [torch.randn(4, 3, 5, 5), torch.randn(4, 3, 5, 5)])
    _within_one_unit(ir, got[0], ref[0], {"qadd"})


def test_gpu_targets_compile_the_integer_kernels():
    from conftest import export_ir

    ir = export_ir(lambda: QConv(3, 4, 3), [torch.randn(1, 3, 6, 6)])
    for target in ("cuda", "webgpu"):
        try:
            npu_compiler.targets.codegen.get_codegen_target(target)
        except npu_compiler.errors.NPUCompileError:
            continue
        assert "qconv2d" in {k.kind for k in npu_compiler.compile(ir, target).kernels}


def test_partition_runs_the_integer_ops_on_the_cpu(monkeypatch):
    """A target without the integer kinds (webgpu, as if it had none) runs such patterns on the CPU."""
    from conftest import export_ir

    from npu_compiler.kernels import INTEGER_KINDS
    from npu_compiler.partition import partition
    from npu_compiler.targets.webgpu.target import WebGPUTarget

    monkeypatch.setattr(WebGPUTarget, "library_kernels", WebGPUTarget.library_kernels - INTEGER_KINDS)

    ir = export_ir(lambda: QConv(3, 4, 3, act="relu"), [torch.randn(1, 3, 6, 6)])
    plan = partition(ir, "webgpu")
    on_cpu = {f.name for f in plan.fallback}
    assert {"conv2d", "relu", "dequantize_per_channel"} <= on_cpu, on_cpu
    assert all("qconv2d" in f.reason for f in plan.fallback), [f.reason for f in plan.fallback]


def test_unfolded_graph_is_pytorchs_bit_for_bit():
    """With the fold off, the same graph runs as PyTorch's reference does (dequantize, float op, quantize)."""
    from conftest import export_ir, to_numpy

    import npu_runtime

    torch.manual_seed(0)
    real = QConv(3, 8, 3, padding=1, act="relu").eval()
    x = torch.randn(2, 3, 9, 9)
    ir = export_ir(lambda: QConv(3, 8, 3, padding=1, act="relu"), [x])
    program = npu_compiler.compile(ir, "cpu", dtype="float32", disable_passes=["quant_fold"])
    assert not {"qconv2d"} & {k.kind for k in program.kernels}
    be = CpuBackend()
    state = {k: to_numpy(v) for k, v in {**real.state_dict(), **dict(real.named_buffers())}.items()}
    out = be.create_executor(program).run_numpy({ir["graph_inputs"][0]["name"]: x.numpy()},
                                                npu_runtime.load_weights(program, state, be))
    np.testing.assert_array_equal(list(out.values())[0], real(x).numpy())


def test_artifact_round_trip_keeps_the_integer_records(tmp_path):
    from conftest import export_ir

    from npu_compiler.program import CompiledProgram

    ir = export_ir(lambda: QAdd(), [torch.randn(2, 3), torch.randn(2, 3)])
    program = npu_compiler.compile(ir, "cpu")
    program.save(tmp_path / "q.npubin")
    again = CompiledProgram.load(tmp_path / "q.npubin")
    assert [k.spec for k in again.kernels] == [k.spec for k in program.kernels]


def test_partition_path_runs_a_quantized_graph(backend):
    """On a target without integer kernels the pattern runs on the CPU (the CPU reference's integer kernels, or the
    torch_ir fallback running PyTorch's own reference ops), the quantize before it on the target: within one unit
    of PyTorch either way."""
    from conftest import export_ir, to_numpy

    from npusim.partition_path import run_partitioned

    torch.manual_seed(0)
    real = QConv(3, 4, 3, padding=1, act="relu").eval()
    x = torch.randn(1, 3, 6, 6)
    ir = export_ir(lambda: QConv(3, 4, 3, padding=1, act="relu"), [x])
    state = {k: to_numpy(v) for k, v in {**real.state_dict(), **dict(real.named_buffers())}.items()}
    got = list(run_partitioned(ir, state, {ir["graph_inputs"][0]["name"]: x.numpy()}, backend).values())[0]
    assert np.abs(got.astype(np.int64) - real(x).numpy()).max() <= 1


def test_describe_and_partition_show_number_formats():
    from conftest import export_ir

    from npu_compiler.partition import format_report, partition

    ir = export_ir(lambda: QConv(3, 4, 3, act="relu"), [torch.randn(1, 3, 6, 6)])
    formats = {k["kind"]: k["format"] for k in npu_compiler.compile(ir, "cpu").describe()["kernels"]}
    assert formats["qconv2d"] == "int8 (int32 acc)" and formats["generated"] == "float32 -> int8"
    plan = partition(ir, "cpu")
    assert plan.formats["conv2d"] == "int8 (qconv2d)"
    assert "number formats (nodes):" in format_report(plan)
