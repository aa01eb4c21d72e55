"""`run` times like trtexec and summarises outputs; `verify` prints and takes tolerances and compares with golden
outputs; `profile`'s kernel share is consistent with its runs; tables never cut a name."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from npu_export import resnet
from npu_export.cnn import export_cnn
from npusim.cli import main


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    torch.manual_seed(0)
    model = resnet.resnet18(num_classes=12, width=8).eval()
    d = tmp_path_factory.mktemp("rv")
    res = export_cnn(model, (2, 3, 32, 32), d, "r18")
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    np.save(d / "x.npy", x)
    with torch.no_grad():
        golden = model(torch.from_numpy(x)).numpy()
    np.savez(d / "golden.npz", linear=golden)
    assert main(["compile", str(res.ir_path), "-o", str(d / "r18.npubin"), "--dtype", "float32"]) == 0
    return model, res, d, x, golden


def test_run_reports_generated_inputs_latency_and_top_k(net, capsys):
    _, res, d, x, golden = net
    assert main(["run", str(d / "r18.npubin"), "--weights", str(res.weights_path), "--warmup", "1", "--iters", "4",
                 "--top-k", "3"]) == 0
    cap = capsys.readouterr()
    assert "generated 1 input(s) (seed 0" in cap.err and "x float32[2, 3, 32, 32]: N(0, 1) random values" in cap.err
    assert "latency over 4 run(s) after 1 warm-up: min" in cap.out and "p90" in cap.out and "p99" in cap.out
    assert "throughput:" in cap.out and "runs/s" in cap.out
    assert "device time over 4 run(s), inputs and outputs on the device" in cap.out
    assert not list(d.glob("*.npz.tmp"))  # -o not given: nothing written

    # given inputs: no notice, and top-k = PyTorch's top classes of each row
    assert main(["run", str(d / "r18.npubin"), "--weights", str(res.weights_path), "--input", f"x={d / 'x.npy'}",
                 "--iters", "2", "--top-k", "3", "--json"]) == 0
    cap = capsys.readouterr()
    rep = json.loads(cap.out)
    assert rep["generated_inputs"] == [] and "generated" not in cap.err
    t = rep["timing"]
    assert t["runs"] == 2 and t["min_s"] <= t["median_s"] <= t["p90_s"] <= t["p99_s"] <= t["max_s"]
    dev = rep["device_timing"]
    assert dev["runs"] == 2 and 0 < dev["min_s"] <= dev["median_s"] <= dev["max_s"]
    rows = rep["outputs"]["linear"]["top_k"]
    for r, row in enumerate(rows):
        assert row["indices"] == list(np.argsort(-golden[r])[:3])
        np.testing.assert_allclose(row["values"], np.sort(golden[r])[::-1][:3], rtol=1e-4, atol=1e-5)
    s = rep["outputs"]["linear"]
    assert s["shape"] == [2, 12] and abs(s["mean"] - float(golden.mean())) < 1e-4


def test_run_rejects_unknown_input_names(net, capsys):
    _, res, d, _, _ = net
    assert main(["run", str(d / "r18.npubin"), "--weights", str(res.weights_path), "--input",
                 f"image={d / 'x.npy'}"]) == 1
    assert "--input image: no such input; the model's inputs are x float32[2, 3, 32, 32]" in capsys.readouterr().err


def test_verify_prints_the_tolerance_and_takes_the_users(net, capsys):
    _, res, d, _, _ = net
    assert main(["verify", str(res.ir_path), "--weights", str(res.weights_path)]) == 0
    out = capsys.readouterr().out
    assert "compute dtype float32 (auto: the weights are float32, which target config 'cpu' computes)" in out
    assert "tolerance: pearson >= 0.99999, max|err|/max|ref| <= 0.001 (float32 default)" in out
    base = ["verify", str(res.ir_path), "--weights", str(res.weights_path), "--dtype", "float16"]
    assert main(base) == 0
    out = capsys.readouterr().out
    assert "tolerance: pearson >= 0.999, max|err|/max|ref| <= 0.03 (float16 default)" in out
    # an elementwise bound no fp16 result can meet fails, and says how many elements missed
    assert main([*base, "--atol", "0", "--rtol", "1e-9", "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert rep["tolerance"]["atol"] == 0 and rep["tolerance"]["max_rel"] is None
    assert rep["outputs"][0]["mismatched"] > 0 and not rep["passed"]
    assert main([*base, "--min-pearson", "1.5"]) == 1  # r <= 1 always
    assert "with --min-pearson 1.5" in capsys.readouterr().out
    assert main([*base[:-2], "--dtype", "float32", "--atol", "1e-4", "--rtol", "1e-4"]) == 0
    assert "every element |err| <= 0.0001 + 0.0001*|ref|" in capsys.readouterr().out


def test_verify_against_golden_outputs(net, capsys, tmp_path):
    model, res, d, x, golden = net
    art, w, xin = str(d / "r18.npubin"), str(res.weights_path), f"x={d / 'x.npy'}"
    assert main(["verify", art, "--weights", w, "--input", xin, "--expected", str(d / "golden.npz")]) == 0
    out = capsys.readouterr().out
    assert "against " + str(d / "golden.npz") in out and "PASS" in out
    wrong = golden.copy()
    wrong[0, 0] += 10 * np.abs(golden).max()
    np.savez(tmp_path / "wrong.npz", anything=wrong)  # one array for one output: its name does not matter
    assert main(["verify", art, "--weights", w, "--input", xin, "--expected", str(tmp_path / "wrong.npz")]) == 1
    assert "FAIL" in capsys.readouterr().out
    # the IR path takes golden outputs too
    assert main(["verify", str(res.ir_path), "--weights", w, "--input", xin, "--expected",
                 str(d / "golden.npz")]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("extra, words", [
    ([], ["give x with --input"]),
    (["--input", "X"], ["--input expects NAME=FILE.npy"]),
])
def test_expected_needs_the_inputs(net, capsys, extra, words):
    _, res, d, _, _ = net
    assert main(["verify", str(d / "r18.npubin"), "--weights", str(res.weights_path), "--expected",
                 str(d / "golden.npz"), *extra]) in (1, 2)
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


def test_verify_an_artifact_without_golden_outputs_says_what_to_give(net, capsys):
    _, res, d, _, _ = net
    assert main(["verify", str(d / "r18.npubin"), "--weights", str(res.weights_path)]) == 2
    assert "--expected FILE.npz" in capsys.readouterr().err
    assert main(["verify", str(d / "r18.npubin"), "--weights", str(res.weights_path), "--input", f"x={d / 'x.npy'}",
                 "--expected", str(d / "golden.npz"), "--dtype", "float16"]) == 2
    assert "--dtype set how an IR is compiled" in capsys.readouterr().err


def test_profile_share_is_of_its_own_run_and_names_are_whole(net, capsys):
    """Every kernel interval lies inside its run: the share is at most 100%; no group name is cut."""
    _, res, d, _, _ = net
    assert main(["profile", str(d / "r18.npubin"), "--weights", str(res.weights_path), "--iters", "3", "--warmup",
                 "1", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert 0.5 < rep["kernel_share_of_profiled_run"] <= 1.0
    assert len(rep["iteration_totals_s"]) == 3 and all(t > 0 for t in rep["iteration_totals_s"])
    assert rep["plain_run"]["runs"] == 3 and rep["run_wall_s"] == rep["plain_run"]["median_s"]
    assert main(["profile", str(d / "r18.npubin"), "--weights", str(res.weights_path), "--iters", "2", "--top",
                 "0"]) == 0
    out = capsys.readouterr().out
    assert "of which kernels" in out
    table = out.split("nodes\n", 1)[1].split("by fusion group")[0]
    assert "adaptive_avg_pool2d.default " in table, table
    assert main(["verify", str(res.ir_path), "--weights", str(res.weights_path), "--per-node"]) == 0
    table = capsys.readouterr().out.split("result\n")[-1]
    assert "adaptive_avg_pool2d.default " in table, table
