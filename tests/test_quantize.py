"""Post-training quantization (`npu_quant`, `npusim quantize`): the calibration methods on known distributions and
against PyTorch's observers, the rewrite of a CNN into PT2E's form and its integer program's accuracy, the per-tensor
report, and the command line."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import export_ir, to_numpy

import npu_compiler
import npu_runtime
from npu_quant.calibration import NUM_BINS, TensorStats, choose_qparams, entropy_threshold, qparams_for
from npu_quant.flow import Options, quantize
from npu_runtime.cpu.backend import CpuBackend

# ---- calibration --------------------------------------------------------------------------------------------------


def test_minmax_takes_the_observed_range():
    s = TensorStats()
    s.update(np.array([-1.5, 0.25, 2.0], np.float32))
    s.update(np.array([3.0, -0.5], np.float32))
    assert (s.min, s.max, s.count) == (-1.5, 3.0, 5)
    p = qparams_for(s, "minmax", symmetric=True)
    assert p.zero_point == 0 and p.scale == pytest.approx(3.0 / 127.5)
    a = qparams_for(s, "minmax", symmetric=False)
    assert a.scale == pytest.approx(4.5 / 255) and a.zero_point == -128 + round(1.5 / a.scale)


@pytest.mark.parametrize("symmetric", [True, False])
def test_qparams_are_pytorchs_observers(symmetric):
    from torch.ao.quantization.observer import MinMaxObserver

    rng = np.random.default_rng(0)
    for lo, hi in [(-2.0, 5.0), (0.1, 3.0), (-7.0, -0.5), (-0.003, 0.001)]:
        x = np.concatenate([[lo, hi], rng.uniform(lo, hi, 100)]).astype(np.float32)
        obs = MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric if symmetric else
                             torch.per_tensor_affine, quant_min=-128, quant_max=127)
        obs(torch.from_numpy(x))
        scale, zp = obs.calculate_qparams()
        s = TensorStats()
        s.update(x)
        p = qparams_for(s, "minmax", symmetric)
        assert p.scale == pytest.approx(float(scale), rel=1e-6) and p.zero_point == int(zp), (lo, hi)


def test_asymmetric_zero_is_exact():
    for lo, hi in [(-0.3, 7.1), (-5.0, 0.2), (1.0, 2.0)]:
        p = choose_qparams(lo, hi, symmetric=False)
        assert -128 <= p.zero_point <= 127
        assert round(0.0 / p.scale) + p.zero_point == p.zero_point  # 0 is a code
        assert (p.qmin - p.zero_point) * p.scale <= min(lo, 0) + p.scale and (p.qmax - p.zero_point) * p.scale >= \
            max(hi, 0) - p.scale


def test_percentile_of_a_gaussian():
    rng = np.random.default_rng(1)
    s = TensorStats()
    for _ in range(4):
        s.update(rng.standard_normal(250_000).astype(np.float32))
    # P(|x| > 3.8906) = 1e-4 for a standard normal
    assert s.percentile(99.99) == pytest.approx(3.8906, abs=3 * s.width + 0.05)
    assert s.percentile(99.0) == pytest.approx(2.5758, abs=3 * s.width + 0.02)


def test_histogram_grows_with_later_batches():
    s = TensorStats()
    s.update(np.array([1.0, -0.5], np.float32))
    width = s.width
    s.update(np.array([10.0], np.float32))
    assert s.width == width and s.hist.size > NUM_BINS and s.hist.sum() == 3


def _entropy_reference(hist: np.ndarray, levels: int = 128) -> int:
    """The candidate bin TensorRT's algorithm picks, written loop by loop from its description (pytorch-quantization's
    `_compute_amax_entropy`: np.digitize over linspace, KL as scipy.stats.entropy computes it)."""

    def entropy(p, q):
        p, q = p / p.sum(), q / q.sum()
        m = p > 0
        return math.inf if (q[m] == 0).any() else float(np.sum(p[m] * np.log(p[m] / q[m])))

    best, best_kl = None, math.inf
    for i in range(levels, len(hist) + 1):
        p = hist[:i].astype(np.float64)
        p[i - 1] += hist[i:].sum()
        space = np.linspace(0, i, num=levels + 1)
        level = np.digitize(np.arange(i), space) - 1
        level[hist[:i] == 0] = -1
        q = np.zeros(i)
        for j in range(levels):
            members = level == j
            if members.any():
                q[members] = hist[:i][members].sum() / members.sum()
        kl = entropy(p, q)
        if kl < best_kl:
            best, best_kl = i, kl
    return best


def test_entropy_is_tensorrts_algorithm():
    rng = np.random.default_rng(2)
    x = np.abs(np.concatenate([rng.standard_normal(60_000), rng.standard_normal(30) * 12]))
    hist, _ = np.histogram(x, bins=400, range=(0, x.max()))
    width = x.max() / 400
    assert entropy_threshold(hist, width) == pytest.approx(_entropy_reference(hist) * width)


def test_entropy_clips_outliers_and_keeps_a_uniform_range():
    rng = np.random.default_rng(3)
    s = TensorStats()
    x = rng.standard_normal(400_000).astype(np.float32)
    x[:20] = 60.0  # rare outliers far out: min-max would spend almost every level on them
    s.update(x)
    assert 2.5 < s.entropy() < 8.0
    u = TensorStats()
    u.update(rng.uniform(-1, 1, 400_000).astype(np.float32))
    assert u.entropy() == pytest.approx(1.0, abs=0.01)  # nothing to clip: the whole range


def test_entropy_needs_a_filled_histogram():
    s = TensorStats()
    s.update(np.linspace(0.1, 1.0, 500, dtype=np.float32))
    assert qparams_for(s, "entropy", True) == qparams_for(s, "minmax", True)


def _sample_mse(x: np.ndarray, p) -> float:
    """The quantize-dequantize error of the samples themselves (PyTorch's fake quantize: an independent reference)."""
    t = torch.from_numpy(x)
    return float(((t - torch.fake_quantize_per_tensor_affine(t, p.scale, p.zero_point, p.qmin, p.qmax)) ** 2).mean())


def _best_sample_mse(x: np.ndarray, symmetric: bool, steps: int = 200) -> float:
    """The least error over clipping thresholds on a fine grid, scored on the samples (brute force)."""
    top = float(np.abs(x).max())
    return min(_sample_mse(x, choose_qparams(max(float(x.min()), -t), min(float(x.max()), t), symmetric))
               for t in np.linspace(top / steps, top, steps))


@pytest.mark.parametrize("case", ["heavy tail", "gelu", "one-sided outlier"])
@pytest.mark.parametrize("symmetric", [True, False])
def test_mse_finds_the_least_error_range(case, symmetric):
    """The histogram's choice is as good as the best threshold measured on the values themselves, and beats min-max
    where clipping pays. At 8 bits it rarely does: a step's rounding error is small, so only a heavy tail is cut."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal(50_000).astype(np.float32)
    if case == "heavy tail":
        x = rng.standard_t(3, size=50_000).astype(np.float32)  # a heavy tail: the least error clips it
    elif case == "gelu":
        x = torch.nn.functional.gelu(torch.from_numpy(x * 1.5)).numpy()
        x[:5] = 25.0  # a layer's outlier channel, one token
    else:
        x[:50] = 30.0  # a layer norm's outlier channel: kept (clipping 50 values costs more than coarser steps)
    s = TensorStats()
    for part in np.split(x, 4):
        s.update(part)
    assert int(s.neg.sum()) == int((x < 0).sum())
    p = qparams_for(s, "mse", symmetric)
    got, best = _sample_mse(x, p), _best_sample_mse(x, symmetric)
    assert got <= best * 1.03, (got, best)
    assert got <= _sample_mse(x, qparams_for(s, "minmax", symmetric))
    if case == "heavy tail":
        assert got < 0.95 * _sample_mse(x, qparams_for(s, "minmax", symmetric))  # the tail clipped


def test_mse_asymmetric_uses_the_sign():
    """A one-sided tensor (a GELU's output) quantized asymmetrically spends its levels on the side it has."""
    rng = np.random.default_rng(5)
    x = torch.nn.functional.gelu(torch.from_numpy(rng.standard_normal(100_000).astype(np.float32) * 2)).numpy()
    s = TensorStats()
    s.update(x)
    a, m = qparams_for(s, "mse", symmetric=False), qparams_for(s, "mse", symmetric=True)
    assert a.zero_point < -100  # the range starts near GELU's minimum, -0.17
    assert _sample_mse(x, a) < 0.5 * _sample_mse(x, m)



# ---- a CNN with trained weights -----------------------------------------------------------------------------------


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(1, 8, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.c3 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn1(self.c1(x))), 2)
        x = torch.relu(self.c3(torch.relu(self.c2(x))) + x)
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))


def _blobs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images of noise with a bright blob in one of four quadrants: the class."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = torch.randn(n, 1, 12, 12, generator=g) * 0.5
    for i, c in enumerate(y.tolist()):
        r, col = 1 + 6 * (c // 2) + int(torch.randint(0, 2, (), generator=g)), 1 + 6 * (c % 2)
        x[i, 0, r:r + 3, col:col + 3] += 2.5
    return x, y


@pytest.fixture(scope="module")
def trained():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small batches: more threads only contend (25 s instead of 1.5 on two busy cores)
    try:
        torch.manual_seed(0)
        model = SmallCNN()
        opt = torch.optim.Adam(model.parameters(), lr=0.02)
        x, y = _blobs(512, 0)
        for step in range(120):
            i = torch.arange(step * 64, step * 64 + 64) % 512
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[i]), y[i]).backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()
    return model


def _float_setup(model: torch.nn.Module):
    ir = export_ir(SmallCNN, [torch.zeros(16, 1, 12, 12)])
    weights = {k: to_numpy(v) for k, v in {**model.state_dict(), **dict(model.named_buffers())}.items()}
    return ir, weights, ir["graph_inputs"][0]["name"]


def _run(program, weights, name, x: torch.Tensor) -> np.ndarray:
    be = CpuBackend()
    ex = be.create_executor(program)
    w = npu_runtime.load_weights(program, weights, be)
    return np.concatenate([list(ex.run_numpy({name: x[i:i + 16].numpy()}, w).values())[0]
                           for i in range(0, len(x), 16)])


@pytest.mark.parametrize("method", ["minmax", "percentile", "mse"])
def test_int8_cnn_keeps_the_float_top1(trained, method):
    """Entropy is left out: on this network's sparse ReLU features it clips the rare large activations that carry
    the class (docs/quantization.md says so, with the measurement)."""
    ir, weights, name = _float_setup(trained)
    calib = [{name: x.numpy()} for x in _blobs(64, 1)[0].split(16)]
    q = quantize(ir, weights, calib, Options(method=method))
    program = npu_compiler.compile(q.ir, "cpu")
    kinds = {k.kind for k in program.kernels}
    assert {"qconv2d", "qadd", "qgemm"} <= kinds, kinds
    x, y = _blobs(400, 2)
    got = _run(program, q.weights, name, x)
    with torch.no_grad():
        ref = trained(x).numpy()
    assert (ref.argmax(1) == y.numpy()).mean() > 0.9  # the float model learned the task
    agree = (got.argmax(1) == ref.argmax(1)).mean()
    assert agree >= 0.99, f"int8 ({method}) picks the float model's class on {agree:.3f} of the inputs"


def test_report_lists_every_quantized_tensor_worst_first(trained):
    from npu_quant.report import sqnr_report

    ir, weights, name = _float_setup(trained)
    calib = [{name: x.numpy()} for x in _blobs(32, 1)[0].split(16)]
    q = quantize(ir, weights, calib)
    rows = sqnr_report(ir, weights, q, calib)
    assert [r.name for r in rows] and {r.name for r in rows} == set(q.plan.tensors)
    assert [r.sqnr_db for r in rows] == sorted(r.sqnr_db for r in rows)
    assert all(r.sqnr_db > 20 for r in rows), [(r.name, r.sqnr_db) for r in rows]
    for r in rows:
        assert r.scale == q.qparams[r.name].scale and r.zero_point == q.qparams[r.name].zero_point


def test_rewrite_is_pt2e_form(trained):
    ir, weights, name = _float_setup(trained)
    q = quantize(ir, weights, [{name: _blobs(16, 1)[0].numpy()}])
    ops = [n["op_type"] for n in q.ir["nodes"]]
    assert "aten.batch_norm.default" not in ops  # folded into the conv before its weight is quantized
    assert ops.count("quantized_decomposed.dequantize_per_channel.default") == 4  # three convs and the linear
    assert q.weights["c1.weight.bn_folded.int8"].dtype == np.int8
    assert np.abs(q.weights["fc.weight.int8"]).max() == 127  # symmetric, the largest weight of a row at 127
    # an op with no integer kernel reads a dequantized tensor and computes in float
    pool = next(n for n in q.ir["nodes"] if n["op_type"] == "aten.adaptive_avg_pool2d.default")
    assert pool["inputs"][0]["producer_node"].endswith("_dequantize_" + pool["name"])


# ---- the command line ---------------------------------------------------------------------------------------------


def test_cli_quantize_then_compile_and_run(trained, tmp_path):
    from safetensors.numpy import save_file

    from npusim.cli import main

    ir, weights, name = _float_setup(trained)
    (tmp_path / "m.json").write_text(json.dumps(ir))
    save_file({k: np.ascontiguousarray(v) for k, v in weights.items()}, str(tmp_path / "m.safetensors"))
    (tmp_path / "calib").mkdir()
    np.save(tmp_path / "calib" / "a.npy", _blobs(48, 1)[0].numpy().reshape(3, 16, 1, 12, 12))
    out = tmp_path / "q"
    assert main(["quantize", str(tmp_path / "m.json"), "--weights", str(tmp_path / "m.safetensors"), "--calibration",
                 str(tmp_path / "calib"), "--method", "percentile", "--report", "-o", str(out)]) == 0
    params = json.loads((out / "m_int8.quant.json").read_text())
    assert params["samples"] == 3 and params["method"] == "percentile"
    assert [r["sqnr_db"] for r in params["report"]] == sorted(r["sqnr_db"] for r in params["report"])
    assert main(["compile", str(out / "m_int8.json"), "-o", str(tmp_path / "q.npubin")]) == 0
    assert main(["run", str(tmp_path / "q.npubin"), "--weights", str(out / "m_int8.safetensors")]) == 0
    # one step: quantize and compile
    assert main(["compile", str(tmp_path / "m.json"), "--quantize", "int8", "--weights",
                 str(tmp_path / "m.safetensors"), "--calibration-random", "2", "-o", str(tmp_path / "one.npubin")]) == 0
    assert (tmp_path / "m_int8.safetensors").exists()


def test_cli_quantize_refuses_bad_calibration(trained, tmp_path, capsys):
    from safetensors.numpy import save_file

    from npusim.cli import main

    ir, weights, _ = _float_setup(trained)
    (tmp_path / "m.json").write_text(json.dumps(ir))
    save_file({k: np.ascontiguousarray(v) for k, v in weights.items()}, str(tmp_path / "m.safetensors"))
    (tmp_path / "calib").mkdir()
    np.save(tmp_path / "calib" / "a.npy", np.zeros((3, 12, 12), np.float32))
    args = ["quantize", str(tmp_path / "m.json"), "--weights", str(tmp_path / "m.safetensors"), "-o", str(tmp_path)]
    assert main([*args, "--calibration", str(tmp_path / "calib")]) == 1
    assert "shape [3, 12, 12]" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(args)  # neither --calibration nor --calibration-random
    assert e.value.code == 2
    assert main(["compile", str(tmp_path / "m.json"), "--quantize", "int8", "-o", str(tmp_path / "x.npubin")]) == 2


def test_keep_float_leaves_a_tensors_readers_in_float(trained, tmp_path, capsys):
    ir, weights, name = _float_setup(trained)
    calib = [{name: _blobs(16, 1)[0].numpy()}]
    pooled = next(n["outputs"][0]["name"] for n in ir["nodes"] if n["op_type"] == "aten.flatten.using_ints")
    q = quantize(ir, weights, calib, Options(keep_float=(pooled,)))
    assert pooled not in q.qparams
    kinds = [k.kind for k in npu_compiler.compile(q.ir, "cpu").kernels]
    assert "qgemm" not in kinds and "gemm" in kinds  # the classifier reads float: a float GEMM
    from npusim.cli import main

    (tmp_path / "m.json").write_text(json.dumps(ir))
    assert main(["quantize", str(tmp_path / "m.json"), "--weights", str(tmp_path / "none.safetensors"),
                 "--calibration-random", "1", "--keep-float", "no_such_tensor", "-o", str(tmp_path)]) == 2
    assert "no such tensor" in capsys.readouterr().err


# ---- a transformer's residual ---------------------------------------------------------------------------------------


class PostNormBlock(torch.nn.Module):
    """BERT's post-norm shape: the norm's output is both a linear's input and the residual."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 16)
        self.ln2 = torch.nn.LayerNorm(16)

    def forward(self, x):
        h = self.ln1(x)
        return self.ln2(h + self.fc(h))


def test_a_float_op_reads_the_float_value_of_a_quantized_tensor():
    """The residual add reads the norm's float output, not its int8 copy (which only the linear needs): a float op
    between a dequantize and a quantize reads float where a float value exists, as PT2E's per-edge observers do."""
    torch.manual_seed(0)
    model = PostNormBlock().eval()
    with torch.no_grad():
        model.ln1.weight.uniform_(0.5, 3.0)
    ir = export_ir(PostNormBlock, [torch.zeros(4, 8, 16)])
    weights = {k: to_numpy(v) for k, v in model.state_dict().items()}
    name = ir["graph_inputs"][0]["name"]
    x = torch.randn(4, 8, 16)
    q = quantize(ir, weights, [{name: x.numpy()}], Options(symmetric=False))
    (t,) = q.plan.tensors
    add = next(n for n in q.ir["nodes"] if n["op_type"] == "aten.add.Tensor")
    producers = {r["producer_node"] for r in add["inputs"]}
    assert not any("dequantize" in p for p in producers), producers
    program = npu_compiler.compile(q.ir, "cpu")
    assert "qgemm" in {k.kind for k in program.kernels}
    got = _run(program, q.weights, name, x)
    p = q.qparams[t]
    w = torch.from_numpy(q.weights["fc.weight.int8"].astype(np.float32) * q.weights["fc.weight.scale"][:, None])
    with torch.no_grad():
        h = model.ln1(x)
        hq = torch.fake_quantize_per_tensor_affine(h, p.scale, p.zero_point, p.qmin, p.qmax)
        y = torch.nn.functional.linear(hq, w, model.fc.bias)
        want = model.ln2(h + y).numpy()
        int8_residual = model.ln2(hq + y).numpy()
    err = np.abs(got - want).max()
    assert err < 1e-4 < np.abs(int8_residual - want).max(), err


# ---- verify --per-node on an integer program (docs/tolerances.md, "Integer programs") -------------------------------


def _per_node(tmp_path, capsys, ir, weights, backend: str = "cpu", extra: tuple | list = ()) -> tuple[int, dict]:
    """`npusim verify --per-node --json` of the int8 program of `ir` (min-max on two batches of blobs)."""
    from safetensors.numpy import save_file

    from npusim.cli import main

    name = ir["graph_inputs"][0]["name"]
    q = quantize(ir, weights, [{name: _blobs(16, s)[0].numpy()} for s in (1, 2)])
    (tmp_path / "q.json").write_text(json.dumps(q.ir))
    save_file({k: np.ascontiguousarray(v) for k, v in q.weights.items()}, str(tmp_path / "q.safetensors"))
    np.save(tmp_path / "x.npy", _blobs(16, 3)[0].numpy())
    capsys.readouterr()
    rc = main(["verify", str(tmp_path / "q.json"), "--input", f"{name}={tmp_path / 'x.npy'}", "--per-node",
               "--backend", backend, "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def _shifted_requantize(monkeypatch, units: int):
    """Every integer kernel's requantized codes moved up by `units` (saturating): a kernel that is off by that much."""
    from npu_compiler.kernels import requant

    real = requant.requantize
    monkeypatch.setattr(requant, "requantize", lambda acc, m, n, zp, lo, hi, rounding="single":
                        np.minimum(real(acc, m, n, zp, lo, hi, rounding) + units, hi))


def test_per_node_holds_integer_kernels_to_one_unit_on_the_references_inputs(trained, tmp_path, capsys):
    ir, weights, _ = _float_setup(trained)
    rc, report = _per_node(tmp_path, capsys, ir, weights)
    assert rc == 0 and report["tolerance"]["source"] == "int8 default"
    rows = {r["kind"]: r for r in report["per_node"]["kernels"] if r["comparison"]}
    assert {"qconv2d", "qgemm"} <= rows.keys()
    conv = rows["qconv2d"]["comparison"]
    assert conv["exact"] is not None and conv["max_abs"] <= 1  # units of the output's scale

    alone = [r for r in report["per_node"]["kernels"] if r["note"] == "alone, on the reference's inputs"]
    assert {r["kind"] for r in alone} >= {"qconv2d", "qadd", "qgemm"}  # and the quantizes
    assert all(r["comparison"]["passed"] for r in alone)


def test_per_node_finds_an_integer_kernel_two_units_off(trained, tmp_path, capsys, monkeypatch):
    ir, weights, _ = _float_setup(trained)
    _shifted_requantize(monkeypatch, 2)
    rc, report = _per_node(tmp_path, capsys, ir, weights, extra=["--dump-repro", str(tmp_path / "repro")])
    bad = report["per_node"]["first_failure"]
    assert rc == 1 and bad["kind"] == "qconv2d" and bad["index"] == 1
    assert bad["comparison"]["max_abs"] >= 2  # two units, three where the kernel's own rounding adds one
    assert "units (at most 1, given the reference's inputs)" in bad["comparison"]["why"]
    # the repro runs the kernel as per-node did: alone on the reference's inputs, held to one unit
    meta = json.loads((tmp_path / "repro" / "kernel.json").read_text())
    assert meta["units"] == 1 and meta["tolerance"] == "int8"
    from npu_compiler.program import CompiledProgram
    from npu_runtime.metrics import compare_codes

    mini = CompiledProgram.load(tmp_path / "repro" / "kernel.npubin")
    ex = CpuBackend().create_executor(mini)
    ex.run({})
    want = np.load(tmp_path / "repro" / "expected.npy")
    got = np.array(ex.view(mini.kernels[0].outs[0])).reshape(want.shape)
    assert compare_codes("x", got, want, 1, "").max_abs == bad["comparison"]["max_abs"]  # still shifted: patched
    # the script in a process of its own runs the real (unpatched) kernel: within one unit
    proc = subprocess.run([sys.executable, str(tmp_path / "repro" / "repro.py")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(npu_runtime.__file__).parents[1])}, timeout=120)
    assert proc.returncode == 0 and " ok " in proc.stdout, proc.stdout + proc.stderr


def test_per_node_on_a_partitioned_integer_program(trained, tmp_path, capsys, monkeypatch):
    """On a target without the integer kinds (webgpu, as if it had none) the integer kernels run in CPU segments and
    the quantizes between them on the GPU: each is rerun alone on its own segment's backend, with the reference's
    values of its inputs (a segment's inputs included)."""
    from npu_compiler.kernels import INTEGER_KINDS
    from npu_compiler.targets.webgpu.target import WebGPUTarget

    if "webgpu" not in npu_runtime.available_backends():
        pytest.skip("no webgpu adapter here")
    monkeypatch.setattr(WebGPUTarget, "library_kernels", WebGPUTarget.library_kernels - INTEGER_KINDS)
    ir, weights, _ = _float_setup(trained)
    rc, report = _per_node(tmp_path, capsys, ir, weights, "webgpu")
    assert rc == 0, report["per_node"]["first_failure"]
    alone = [r for r in report["per_node"]["kernels"] if r["note"] == "alone, on the reference's inputs"]
    assert {"qconv2d", "qadd"} <= {r["kind"] for r in alone}
    assert len({r["segment"] for r in alone}) >= 2  # the quantizes of the webgpu segments too
