"""Weight rounding and bias correction of post-training quantization (`npu_quant/adjust.py`, `npusim quantize
--weight-rounding gptq --bias-correction`): each on a case where its effect is known."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import export_ir, to_numpy

import npu_compiler
import npu_runtime
from npu_quant.adjust import LayerInputs, bias_shift, round_gptq, round_nearest, weight_scales
from npu_quant.flow import Options, quantize
from npu_runtime.cpu.backend import CpuBackend


def test_gptq_with_uncorrelated_inputs_rounds_to_nearest():
    """With H the identity no rounding error can be traded against another column: GPTQ is rounding to nearest."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 40)).astype(np.float32)
    s = weight_scales(w)
    assert np.array_equal(round_gptq(w, s, np.eye(40), damp=0.0), round_nearest(w, s))


def test_gptq_lowers_the_output_error_on_correlated_inputs():
    """Inputs that share a component: GPTQ's codes move W x less than nearest rounding's on those inputs and on
    others from the same distribution."""
    rng = np.random.default_rng(1)
    k = 64
    mix = rng.standard_normal((k, 8)) @ rng.standard_normal((8, k)) + 0.3 * np.eye(k)
    x_cal, x_new = (rng.standard_normal((n, k)) @ mix for n in (2000, 2000))
    w = rng.standard_normal((16, k)).astype(np.float32)
    s = weight_scales(w)

    def err(codes, x):
        return float(np.mean((x @ (codes * s[:, None] - w).T) ** 2))

    near = round_nearest(w, s)
    g = round_gptq(w, s, x_cal.T @ x_cal / len(x_cal))
    assert err(g, x_cal) < 0.5 * err(near, x_cal), (err(g, x_cal), err(near, x_cal))
    assert err(g, x_new) < 0.5 * err(near, x_new)


def test_conv_inputs_are_the_taps_im2col_sees():
    """The tap means and the Gram matrix of a strided, padded, dilated conv's input are its im2col columns' (torch's
    unfold, the columns of the weight's [C, KH, KW] flattening)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32) + 1.0
    attrs = {"stride": [2, 1], "padding": [1, 2], "dilation": [1, 2], "groups": 1}
    acc = LayerInputs("conv2d.default", attrs, (4, 3, 3, 2), gram=True)
    acc.update(x[:1])
    acc.update(x[1:])
    cols = torch.nn.functional.unfold(torch.from_numpy(x), (3, 2), dilation=(1, 2), padding=(1, 2), stride=(2, 1))
    cols = cols.permute(1, 0, 2).reshape(3 * 3 * 2, -1).double().numpy()
    np.testing.assert_allclose(acc.mean().reshape(-1), cols.mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(acc.hessian(), cols @ cols.T / cols.shape[1], rtol=1e-5, atol=1e-5)


def test_bias_shift_of_a_grouped_conv():
    """Each output channel's shift reads its own group's input means."""
    dw = np.ones((4, 1, 1, 1))
    mean = np.array([1.0, 2.0]).reshape(2, 1, 1)
    assert bias_shift(dw, mean, groups=2).tolist() == [1.0, 1.0, 2.0, 2.0]


class _Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(64, 8)

    def forward(self, x):
        return self.fc(x)


def _biased_linear() -> tuple[_Linear, float]:
    """A linear whose weights all round down by 0.3 of a step but one per row (which sets the row's scale)."""
    rng = np.random.default_rng(3)
    model = _Linear().eval()
    scale = rng.uniform(0.001, 0.004, 8)
    steps = rng.integers(-100, 100, (8, 64)) + 0.3
    steps[:, 0] = 127
    with torch.no_grad():
        model.fc.weight.copy_(torch.from_numpy(steps * scale[:, None]))
        model.fc.bias.zero_()
    return model, scale


@pytest.mark.parametrize("correct", [False, True])
def test_bias_correction_removes_the_mean_shift_of_weight_rounding(correct):
    """Inputs of mean 3: rounding every weight but one a row down by 0.3 of its step shifts row c's output by
    -0.3 s_c 63 x 3 on average. Bias correction measures that on the calibration inputs and takes it off; what is
    left on other inputs is the activations' rounding, unbiased."""
    model, scale = _biased_linear()
    ir = export_ir(_Linear, [torch.zeros(32, 64)])
    weights = {k: to_numpy(v) for k, v in model.state_dict().items()}
    name = ir["graph_inputs"][0]["name"]
    rng = np.random.default_rng(4)
    calib = [{name: (3 + 0.2 * rng.standard_normal((32, 64))).astype(np.float32)} for _ in range(4)]
    x = (3 + 0.2 * rng.standard_normal((32 * 8, 64))).astype(np.float32)
    q = quantize(ir, weights, calib, Options(bias_correction=correct))
    program = npu_compiler.compile(q.ir, "cpu")
    assert "qgemm" in {k.kind for k in program.kernels}
    be = CpuBackend()
    ex = be.create_executor(program)
    w = npu_runtime.load_weights(program, q.weights, be)
    got = np.concatenate([list(ex.run_numpy({name: x[i:i + 32]}, w).values())[0] for i in range(0, len(x), 32)])
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    shift = (got - ref).mean(0)
    known = -0.3 * scale * 63 * 3
    if correct:
        assert np.all(np.abs(shift) < 0.05 * np.abs(known)), (shift, known)
        assert q.layers and all(lw.bias is not None for lw in q.layers.values())
    else:
        np.testing.assert_allclose(shift, known, rtol=0.05)


def test_cli_takes_the_adjustment_options(tmp_path):
    import json
    import subprocess
    import sys

    from safetensors.numpy import save_file

    model, _ = _biased_linear()
    ir = export_ir(_Linear, [torch.zeros(4, 64)])
    (tmp_path / "m.json").write_text(json.dumps(ir))
    save_file({k: to_numpy(v) for k, v in model.state_dict().items()}, str(tmp_path / "m.safetensors"))
    r = subprocess.run([sys.executable, "-m", "npusim", "quantize", str(tmp_path / "m.json"), "--weights",
                        str(tmp_path / "m.safetensors"), "--calibration-random", "4", "--weight-rounding", "gptq",
                        "--bias-correction", "-o", str(tmp_path / "q")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    table = json.loads((tmp_path / "q" / "m_int8.quant.json").read_text())
    assert table["weight_rounding"] == "gptq" and table["bias_correction"] is True
    assert [v["rounding"] for v in table["layers"].values()] == ["gptq"]


class _Heads(torch.nn.Module):
    """Attention's output projection: heads [B, H, S, D] transposed and merged, then a linear."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(32, 8)

    def forward(self, x):
        b, h, s, d = x.shape
        return self.proj((x * 2.0).transpose(1, 2).reshape(b, s, h * d))


def test_bias_correction_reads_a_merged_heads_input_in_its_own_layout():
    """The linear reads a reshape of a transpose; its tap means are those of the merged [B, S, H*D] tensor, whatever
    layout the observer holds the values in."""
    torch.manual_seed(0)
    model = _Heads().eval()
    ir = export_ir(_Heads, [torch.zeros(2, 4, 3, 8)])
    weights = {k: to_numpy(v) for k, v in model.state_dict().items()}
    name = ir["graph_inputs"][0]["name"]
    rng = np.random.default_rng(5)
    # each head and feature a different mean, so that a wrong layout gives other means
    xs = [(rng.standard_normal((2, 4, 3, 8)) * 0.1 + np.arange(32).reshape(1, 4, 1, 8) / 8).astype(np.float32)
          for _ in range(3)]
    q = quantize(ir, weights, [{name: x} for x in xs], Options(bias_correction=True))
    (lw,) = q.layers.values()
    merged = np.concatenate([(2 * x).transpose(0, 2, 1, 3).reshape(-1, 32) for x in xs]).mean(0)
    w = weights["proj.weight"]
    dw = lw.codes.astype(np.float64) * lw.scales[:, None] - w
    np.testing.assert_allclose(lw.bias, weights["proj.bias"] - dw @ merged, rtol=1e-4, atol=1e-6)
