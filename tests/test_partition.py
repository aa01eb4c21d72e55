"""Partition path: op support, the plan, mixed NPU/CPU execution (DAGExecutor) and `npusim partition`."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest
import torch
from torch_ir import extract_ir

import npu_compiler
import npu_runtime
from npu_compiler.errors import NPUCompileError
from npu_compiler.op_support import is_op_supported, support_predicate, supported_ops, unsupported_reason
from npu_compiler.partition import CPU, NPU, PartitionPlan, RunPartition, TransferOp, format_report, partition
from npu_compiler.partitioned_program import artifact_from_bytes
from npu_export.ir_io import ir_to_dict
from npu_runtime import fallback
from npu_runtime.dag_executor import DAGExecutor
from npusim.cli import main as npusim_main
from npusim.partition_path import needs_partition, run_partitioned

# Real ATen ops that torch.export emits and that the compiler has no lowering for.
UNSUPPORTED = ("aten.logcumsumexp.default", "aten.cummin.default", "aten.lgamma.default", "aten.cummax.default",
               "aten.special_i0e.default", "aten.special_i1e.default")


class Alternating(torch.nn.Module):
    """NPU and CPU ops interleaved so that the plan alternates several times between devices."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(16, 16)
        self.l2 = torch.nn.Linear(16, 16)
        self.l3 = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor):
        y = self.l1(x).relu()
        c = torch.logcumsumexp(y, dim=-1)  # cpu
        y = self.l2(c) * 0.5  # npu
        v, _ = torch.cummin(y, dim=-1)  # cpu
        z = torch.lgamma(v) + y  # cpu, npu (y is used again: already on the npu)
        t = torch.cummax(z, dim=-1).values  # cpu
        w = self.l3(torch.special.i0e(z) + c)  # cpu i0e; npu add, linear (c moves to the npu once)
        return w.sigmoid(), t, torch.special.i1e(w) * 2.0  # npu, cpu, npu


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(16, 32)
        self.l2 = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor):
        return self.l2(torch.nn.functional.gelu(self.l1(x))).softmax(-1)


class Bf16Boundary(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(16, 16)
        self.l2 = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor):
        return self.l2(torch.lgamma(self.l1(x)) * 2.0)


def _export(model: torch.nn.Module, shape: tuple[int, ...], dtype: torch.dtype = torch.float32):
    model = model.to(dtype).eval()
    meta = copy.deepcopy(model).to("meta")
    with torch.no_grad():
        ir = extract_ir(meta, (torch.empty(shape, dtype=dtype, device="meta"),), model_name=type(model).__name__)
    data = json.loads(json.dumps(ir_to_dict(ir)))  # exactly what a saved IR JSON gives back
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return data, sd


def _torch_outputs(model: torch.nn.Module, x: np.ndarray) -> list[np.ndarray]:
    with torch.no_grad():
        outs = model(fallback.to_torch(x))
    outs = outs if isinstance(outs, tuple) else (outs,)
    return [fallback.to_numpy(o) for o in outs]


@pytest.fixture(scope="module")
def alternating():
    torch.manual_seed(0)
    model = Alternating()
    data, sd = _export(model, (4, 16))
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    return model, data, sd, x


@pytest.fixture(scope="module")
def cpu_backend():
    return npu_runtime.get_backend("cpu")


def _check(outputs: dict[str, np.ndarray], data: dict, expected: list[np.ndarray], atol: float = 1e-5) -> None:
    names = [t["name"] for t in data["graph_outputs"]]
    assert list(outputs) == names
    for name, exp in zip(names, expected):
        assert outputs[name].dtype == exp.dtype, name
        np.testing.assert_allclose(outputs[name].astype(np.float32), exp.astype(np.float32), atol=atol, rtol=1e-5,
                                   err_msg=name)


# ---- op support ---------------------------------------------------------------------------------------------


def test_op_support_registry():
    assert is_op_supported("cpu", "aten.add.Tensor")
    assert is_op_supported("cpu", "aten.linear.default")
    assert is_op_supported("cpu", "aten.relu_.default")  # in-place forms normalise to the out-of-place op
    assert is_op_supported("cpu", "<built-in function getitem>")
    assert is_op_supported("cpu", "aten._assert_tensor_metadata.default")
    assert is_op_supported("cpu", "aten.dropout.default", {"p": 0.1, "train": False})
    assert not is_op_supported("cpu", "aten.dropout.default", {"p": 0.1, "train": True})
    for op in UNSUPPORTED:
        assert not is_op_supported("cpu", op), op
    assert "aten.logcumsumexp.default" in unsupported_reason("cpu", "aten.logcumsumexp.default")
    ops = supported_ops("cpu")
    assert {"add.Tensor", "linear.default", "getitem", "relu_.default"} <= ops
    assert "logcumsumexp.default" not in ops
    with pytest.raises(NPUCompileError, match="unknown target"):
        is_op_supported("no-such-target", "aten.add.Tensor")


# ---- plan -------------------------------------------------------------------------------------------------------


def test_plan_alternates_and_transfers_once(alternating):
    _, data, _, _ = alternating
    plan = partition(data, support_predicate("cpu"))
    devices = [p.device for p in plan.partitions]
    assert devices.count(NPU) >= 3 and devices.count(CPU) >= 3
    assert all(a != b for a, b in zip(devices, devices[1:]))  # contiguous same-device runs are merged
    assert {f.op for f in plan.fallback} == set(UNSUPPORTED)
    # Each tensor moves to a device at most once, however many later partitions read it.
    moved = [(t.tensor, t.dst) for t in plan.transfers]
    assert len(moved) == len(set(moved)) == plan.num_transfers == plan.stats.transfers
    scan_out = next(p for p in plan.partitions if "logcumsumexp" in p.nodes).outputs
    assert "logcumsumexp" in [t.name for t in scan_out]
    assert sum(1 for p in plan.partitions if "logcumsumexp" in [t.name for t in p.inputs]) >= 1
    # Every step's partition reads only tensors that are resident by then.
    runs = [s.partition for s in plan.steps if isinstance(s, RunPartition)]
    assert runs == list(range(len(plan.partitions)))
    for s in plan.steps:
        if isinstance(s, TransferOp):
            assert s.producer < s.before and s.src != s.dst
    # Stats: node coverage and FLOP share.
    st = plan.stats
    assert st.nodes_npu + st.nodes_cpu == st.nodes_total == len(data["nodes"]) - len(plan.dead)
    assert plan.dead == ["getitem_1", "getitem_3"]  # the unread getitems of two multi-output ops (max, cummin)
    assert 0 < st.node_coverage < 1 and 0.5 < st.flop_coverage < 1  # the linears dominate the FLOPs
    # NPU sub-IRs are valid pytorch-ir for the compiler; weights are restricted to what each reads.
    for p in plan.partitions:
        assert [t["name"] for t in p.ir["graph_inputs"]] == [t.name for t in p.inputs]
        if p.device == NPU:
            npu_compiler.read_ir(p.ir)
        used = {t["name"] for nd in p.ir["nodes"] for t in nd["inputs"] if t.get("producer_node") is None}
        assert set(p.ir["weight_name_mapping"]) == used
    # JSON round trip.
    again = PartitionPlan.from_dict(json.loads(plan.to_json()))
    assert again.to_dict() == plan.to_dict()


def test_fully_supported_graph_is_one_partition(cpu_backend):
    torch.manual_seed(1)
    model = Mlp()
    data, sd = _export(model, (3, 16))
    plan = partition(data, "cpu")
    assert len(plan.partitions) == 1 and plan.partitions[0].device == NPU
    assert plan.num_transfers == 0 and not plan.fallback and plan.stats.node_coverage == 1.0
    assert needs_partition(data, "cpu") == []
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    ex = DAGExecutor(plan, cpu_backend, weights=sd, dtype="float32")
    _check(ex.run({"x": x}), data, _torch_outputs(model, x))
    assert ex.num_transfers == 0


# ---- mixed execution ------------------------------------------------------------------------------------------


def test_mixed_execution_matches_pytorch(alternating, cpu_backend):
    model, data, sd, x = alternating
    plan = partition(data, support_predicate("cpu"))
    compiled: list[str] = []

    def compile_fn(sub_ir):
        compiled.append(sub_ir["model_name"])
        return npu_compiler.compile(sub_ir, cpu_backend.compile_target(), dtype="float32")

    ex = DAGExecutor(plan, cpu_backend, compile_fn=compile_fn, weights=sd)
    expected = _torch_outputs(model, x)
    first = ex.run({"x": x})
    _check(first, data, expected)
    assert ex.num_transfers == plan.num_transfers > 0
    # Second run: same result, nothing compiled or uploaded again.
    weight_sets = [s.weights for s in ex.stages if s is not None and s.device == NPU]
    second = ex.run({"x": x})
    for k in first:
        np.testing.assert_array_equal(first[k], second[k])
    assert ex.num_transfers == plan.num_transfers
    assert len(compiled) == len(set(compiled)) == sum(p.device == NPU for p in plan.partitions)
    assert [s.weights for s in ex.stages if s is not None and s.device == NPU] == weight_sets
    assert any(ws is not None for ws in weight_sets)


def test_force_cpu_moves_ops(alternating, cpu_backend):
    model, data, sd, x = alternating
    base = partition(data, "cpu")
    plan = partition(data, support_predicate("cpu", ["linear", "aten.mul.Tensor"]))
    moved = {f.name for f in plan.fallback} - {f.name for f in base.fallback}
    linears = {n["name"] for n in data["nodes"] if n["op_type"] in ("aten.linear.default", "aten.mul.Tensor")}
    assert moved == linears
    for p in plan.partitions:
        if p.device == NPU:
            assert not set(p.nodes) & linears
    assert plan.stats.flop_coverage < base.stats.flop_coverage
    ex = DAGExecutor(plan, cpu_backend, weights=sd, dtype="float32")
    _check(ex.run({"x": x}), data, _torch_outputs(model, x))
    assert ex.num_transfers == plan.num_transfers
    # The same through the helper that `npusim verify/run` call.
    outs, ex2 = run_partitioned(data, sd, {"x": x}, "cpu", "float32", ["linear", "mul"], return_executor=True)
    _check(outs, data, _torch_outputs(model, x))


def test_bf16_stays_bf16_across_boundaries(cpu_backend, monkeypatch):
    torch.manual_seed(2)
    model = Bf16Boundary()
    data, sd = _export(model, (4, 16), torch.bfloat16)
    plan = partition(data, "cpu")
    assert [p.device for p in plan.partitions] == [NPU, CPU, NPU]
    assert {t.dtype for t in plan.transfers} == {"bfloat16"} and plan.num_transfers == 2
    seen: list[torch.dtype] = []
    real_run = fallback.CpuFallback.run

    def spy(self, inputs):
        seen.extend(v.dtype for v in inputs.values())
        out = real_run(self, inputs)
        seen.extend(v.dtype for v in out.values())
        return out

    monkeypatch.setattr(fallback.CpuFallback, "run", spy)
    x = np.random.default_rng(2).standard_normal((4, 16)).astype(ml_dtypes.bfloat16)
    ex = DAGExecutor(plan, cpu_backend, weights=sd, dtype="bfloat16")
    out = ex.run({"x": x})
    assert seen and set(seen) == {torch.bfloat16}
    (name,) = out
    assert out[name].dtype == np.dtype(ml_dtypes.bfloat16)
    (exp,) = _torch_outputs(model, x)
    np.testing.assert_allclose(out[name].astype(np.float32), exp.astype(np.float32), atol=0.1, rtol=0.05)
    # The boundary conversions themselves are exact (bit patterns, no rounding through fp32).
    bits = np.arange(-32768, 32767, 7, dtype=np.int16).view(ml_dtypes.bfloat16)
    t = fallback.to_torch(bits)
    assert t.dtype == torch.bfloat16
    np.testing.assert_array_equal(fallback.to_numpy(t).view(np.int16), bits.view(np.int16))


class ZeroDim(torch.nn.Module):
    """0-d tensors cross the boundary both ways (sum -> cpu lgamma -> npu mul), and 0-d graph outputs of each side."""

    def forward(self, x: torch.Tensor):
        s = x.sum()
        d = torch.lgamma(s).detach()
        b = x * d + s
        return torch.lgamma(b).sum(), b.amax()


@pytest.mark.parametrize("force", [[], ["mul"], ["sum"]])
def test_zero_dim_tensors_cross_boundaries(cpu_backend, force):
    """A 0-d tensor stays 0-d across a partition boundary (NumPy's ascontiguousarray made it [1]: `input 'detach_':
    expected shape [], got [1]`)."""
    model = ZeroDim()
    data, sd = _export(model, (3, 4))
    plan = partition(data, support_predicate("cpu", force))
    assert {p.device for p in plan.partitions} == {NPU, CPU}
    assert any(t.shape == [] for p in plan.partitions for t in p.inputs)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    out = DAGExecutor(plan, cpu_backend, weights=sd, dtype="float32").run({"x": x})
    assert all(v.shape == () for v in out.values())
    _check(out, data, _torch_outputs(model, x))


class ResidualToCpu(torch.nn.Module):
    """A fused output (linear + residual: one npu.linear node) is read by a CPU partition."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(16, 16)
        self.l2 = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor):
        y = self.l1(x) + x
        return self.l2(torch.lgamma(y))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_boundaries_keep_the_ir_dtypes(cpu_backend, dtype):
    """An fp32 graph computed in a half dtype hands its partitions the IR's dtypes: a fused node's output too (it came
    back in the compute dtype: `output tensor 'layer_norm_1' came back as torch.bfloat16, the IR says float32`)."""
    torch.manual_seed(3)
    model = ResidualToCpu()
    data, sd = _export(model, (4, 16))
    plan = partition(data, "cpu")
    assert [p.device for p in plan.partitions] == [NPU, CPU, NPU]
    ex = DAGExecutor(plan, cpu_backend, weights=sd, dtype=dtype)
    assert [s.dtype for s in ex.stages[0].program.outputs] == ["float32"]
    x = np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32)
    out = ex.run({"x": x})
    (name,) = out
    assert out[name].dtype == np.float32
    (exp,) = _torch_outputs(model, x)
    np.testing.assert_allclose(out[name], exp, atol=0.05, rtol=0.05)


def test_force_cpu_relu_on_a_half_resnet(cpu_backend):
    """`verify --force-cpu relu_` on a ResNet in float16: every boundary in the IR's dtype."""
    from npu_export import resnet

    torch.manual_seed(4)
    model = resnet.resnet18(num_classes=5, width=8).eval()
    data, sd = _export(model, (1, 3, 32, 32))
    x = np.random.default_rng(4).standard_normal((1, 3, 32, 32)).astype(np.float32)
    outs = run_partitioned(data, sd, {"x": x}, cpu_backend, "float16", ["relu_"])
    (exp,) = _torch_outputs(model, x)
    np.testing.assert_allclose(next(iter(outs.values())), exp, atol=0.02 * float(np.abs(exp).max()), rtol=0)


def test_compile_options_reach_every_partition(alternating, cpu_backend):
    """--no-fusion, --disable-pass and the dtype reach every accelerator partition, not only the first."""
    model, data, sd, x = alternating
    plan = partition(data, "cpu")
    npu = [p.index for p in plan.partitions if p.device == NPU]
    assert len(npu) >= 3
    plain = DAGExecutor(plan, cpu_backend, weights=sd, compile_options={"fusion": False, "dtype": "float32"})
    fused = DAGExecutor(plan, cpu_backend, weights=sd, dtype="float32")
    fusion_steps = tuple(f"{name}(" for name in npu_compiler.compiler.FUSION_PASSES)
    for i in npu:
        assert not any(p.startswith(fusion_steps) for p in plain.stages[i].program.passes)
        assert any(p.startswith(fusion_steps) for p in fused.stages[i].program.passes)
        assert plain.stages[i].program.compute_dtype == "float32"
    _check(plain.run({"x": x}), data, _torch_outputs(model, x))
    # With no dtype given, the whole graph's choice is made once and given to every partition.
    _, ex = run_partitioned(data, sd, {"x": x}, cpu_backend, None, ["sigmoid"], return_executor=True,
                            compile_options={"disable_passes": ["elementwise_fusion"]})
    progs = [s.program for s in ex.stages if s is not None and s.device == NPU]
    assert {p.compute_dtype for p in progs} == {"float32"}
    assert not any(k.group == "fused_elementwise" for p in progs for k in p.kernels)


def test_partition_that_fails_to_compile_runs_on_cpu(alternating, cpu_backend):
    model, data, sd, x = alternating
    plan = partition(data, "cpu")
    victim = next(p for p in plan.partitions if p.device == NPU and p.index > 0)

    def compile_fn(sub_ir):
        if sub_ir["model_name"].endswith(f".p{victim.index}"):
            raise NPUCompileError("simulated failure")
        return npu_compiler.compile(sub_ir, "cpu", dtype="float32")

    with pytest.warns(RuntimeWarning, match=rf"partition {victim.index} .*simulated failure"):
        ex = DAGExecutor(plan, cpu_backend, compile_fn=compile_fn, weights=sd)
    assert ex.fell_back == [victim.index]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _check(ex.run({"x": x}), data, _torch_outputs(model, x))
    # The fallen-back partition reads its inputs on the CPU side: nothing moves to the NPU for it.
    assert ex.last_transfers and not any(r.before == victim.index and r.dst == NPU for r in ex.last_transfers)


def test_dag_executor_errors_name_tensor(alternating, cpu_backend):
    _, data, sd, x = alternating
    plan = partition(data, "cpu")
    ex = DAGExecutor(plan, cpu_backend, weights=sd, dtype="float32")
    with pytest.raises(npu_runtime.InputError, match="'x'"):
        ex.run({"x": x[:2]})
    with pytest.raises(npu_runtime.InputError, match="missing"):
        ex.run({})
    bad = {k: v for k, v in sd.items() if k != "l2.weight"}
    with pytest.raises(npu_runtime.WeightError, match="l2.weight"):
        DAGExecutor(partition(data, support_predicate("cpu", ["linear"])), cpu_backend, weights=bad)


# ---- CLI --------------------------------------------------------------------------------------------------------


def test_cli_partition_report(alternating, tmp_path, capsys):
    _, data, _, _ = alternating
    path = tmp_path / "alt.json"
    path.write_text(json.dumps(data))
    assert npusim_main(["partition", str(path), "--target", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "coverage:" in text and "FLOPs" in text and "transfer" in text
    for nd in data["nodes"]:
        if nd["op_type"] in UNSUPPORTED:
            assert nd["name"] in text and nd["op_type"] in text
    assert npusim_main(["partition", str(path), "--target", "cpu", "--json", "--force-cpu", "linear"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["stats"]["transfers"] == len([s for s in report["steps"] if s["kind"] == "transfer"])
    assert {f["op"] for f in report["fallback"]} == set(UNSUPPORTED) | {"aten.linear.default"}
    assert "ir" not in report["partitions"][0]


def test_compiler_side_imports_no_torch():
    code = ("import sys, npu_compiler.partition, npu_compiler.op_support, npu_runtime.dag_executor, "
            "npu_runtime.fallback, npusim.partition_path, npusim.commands.partition; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


class _BatchStatsNorm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)
        self.bn = torch.nn.BatchNorm1d(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.fc(x)).relu()


def test_the_fallback_never_writes_the_callers_weights(cpu_backend):
    """A batch norm computing batch statistics run on the CPU partition (forced there: the compiler computes it too)
    has ATen update its running statistics in place: the fallback's own copy takes the writes, so the caller's
    arrays and the next run see none (a fuzz run found the cached weights changed under it)."""
    torch.manual_seed(3)
    data, sd = _export(_BatchStatsNorm(), (4, 6))
    for n in data["nodes"]:
        if n["op_type"] == "aten.batch_norm.default":
            n["attrs"]["training"] = True
    weights = {k: fallback.to_numpy(v) for k, v in sd.items()}
    before = {k: v.copy() for k, v in weights.items()}
    plan = partition(data, support_predicate("cpu", ["batch_norm"]))
    assert CPU in [p.device for p in plan.partitions]
    assert fallback.written_weights(next(p.ir for p in plan.partitions if p.device == CPU)) == {
        "bn.running_mean", "bn.running_var"}
    ex = DAGExecutor(plan, cpu_backend, weights=weights, dtype="float32")
    x = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    first, second = ex.run({"x": x}), ex.run({"x": x})
    for k, v in weights.items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    for k in first:
        np.testing.assert_array_equal(first[k], second[k])
    model = _BatchStatsNorm()
    model.load_state_dict(sd)
    with torch.no_grad():
        want = model.train()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(next(iter(first.values())), want, rtol=1e-5, atol=1e-5)


def test_the_artifact_keeps_removed_nodes_and_reports_them(alternating):
    """The plan read back from an artifact is the plan it was compiled from: the nodes removed as unread are still
    named (in the report too), not lost with the sub-IRs."""
    _, data, _, _ = alternating
    art = npu_compiler.compile_artifact(data, "cpu", dtype="float32")
    back = artifact_from_bytes(art.to_bytes())
    assert back.plan().dead == art.dead == ["getitem_1", "getitem_3"]
    assert "removed, their outputs unread (2 node(s)): getitem_1, getitem_3" in format_report(back.plan())
