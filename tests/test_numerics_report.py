"""What `run` and `verify` say about numbers (issue 53): an infinity in a weight is refused unless asked for, NaN
and infinities in inputs and outputs are reported (how many, the first), `verify` fails on them, a one-element
output is judged by its absolute and relative error (not a Pearson r of one value), and top-k agreement is reported
for class-like outputs only."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import export_ir
from test_hardening import small_ir, small_weights, write_safetensors

import npu_compiler
from npu_compiler.ir.reader import read_ir
from npu_compiler.output_roles import class_outputs
from npu_runtime.metrics import compare, nonfinite
from npusim.cli import main


def _files(tmp_path, weights: dict[str, np.ndarray], ir: dict | None = None):
    (tmp_path / "m.json").write_text(json.dumps(ir or small_ir()))
    write_safetensors(tmp_path / "w.safetensors", {k: ("F32", v.shape, v.astype(np.float32).tobytes())
                                                   for k, v in weights.items()})
    assert main(["compile", str(tmp_path / "m.json"), "-o", str(tmp_path / "m.npubin")]) == 0
    return tmp_path / "m.json", tmp_path / "m.npubin", tmp_path / "w.safetensors"


def test_an_infinite_weight_is_refused_unless_asked_for(tmp_path, capsys):
    """The attack: one inf in a weight made every output NaN, with a warning and exit 0."""
    w = small_weights()
    w["fc.weight"][1, 3] = np.inf
    ir, art, ws = _files(tmp_path, w)
    capsys.readouterr()
    run = ["run", str(art), "--weights", str(ws), "--iters", "1", "--warmup", "0"]
    assert main(run) == 1
    err = capsys.readouterr().err
    assert "'fc.weight'" in err and "holds 1 +inf value(s) of 24 (the first at [1, 3])" in err
    assert "--allow-nonfinite-weights" in err
    assert main([*run, "--allow-nonfinite-weights", "--json"]) == 0
    out, err = capsys.readouterr()
    assert "warning: weight 'fc.weight'" in err and "warning: output 'relu' holds" in err
    summary = json.loads(out)["outputs"]["relu"]
    assert summary["nonfinite"]["count"] > 0 and summary["nonfinite"]["first"][1] == 1
    assert main(["verify", str(ir), "--weights", str(ws)]) == 1
    assert main(["verify", str(ir), "--weights", str(ws), "--allow-nonfinite-weights"]) == 1  # and the verdict
    out = capsys.readouterr().out
    assert "FAIL" in out and "the output holds" in out


def test_a_nan_input_is_reported_not_summarised_as_zeros(tmp_path, capsys):
    ir, art, ws = _files(tmp_path, small_weights())
    x = np.full((2, 6), np.nan, np.float32)
    np.save(tmp_path / "x.npy", x)
    capsys.readouterr()
    assert main(["run", str(art), "--weights", str(ws), "--input", f"x={tmp_path / 'x.npy'}", "--iters", "1",
                 "--warmup", "0"]) == 0
    out, err = capsys.readouterr()
    assert "input 'x' holds 12 NaN value(s) of 12 (the first at [0, 0])" in err
    assert "output 'relu' holds 8 NaN" in err
    line = next(s for s in out.splitlines() if s.strip().startswith("relu"))
    assert "no finite value: 8 NaN (the first at [0, 0])" in line and "min 0" not in line, line
    x[0, 2] = 1.0
    x[1] = 0.5
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(art), "--weights", str(ws), "--input", f"x={tmp_path / 'x.npy'}", "--iters", "1",
                 "--warmup", "0"]) == 0
    out, err = capsys.readouterr()
    line = next(s for s in out.splitlines() if s.strip().startswith("relu"))
    assert "over the finite values; 4 NaN (the first at [0, 0])" in line, line


def test_nonfinite_counts_each_kind_and_the_first():
    a = np.array([[1.0, np.nan], [-np.inf, np.inf]], np.float16)
    nf = nonfinite(a)
    assert (nf.nan, nf.posinf, nf.neginf, nf.first) == (1, 1, 1, (0, 1))
    assert nf.describe() == "1 NaN and 1 +inf and 1 -inf value(s) of 4 (the first at [0, 1])"
    assert nonfinite(np.arange(4)) is None and nonfinite(np.float32(np.nan)).first == ()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_one_element_output_is_judged_by_its_error(dtype):
    """The case of issue 53: an error of 1e-4 on a one-element output failed (a Pearson r of one value)."""
    ref = np.array([0.73], np.float32)
    c = compare("loss", ref + np.float32(1e-4), ref, dtype)
    assert c.passed and c.pearson is None, c
    bad = compare("loss", ref * np.float32(1.2), ref, dtype)
    assert not bad.passed and "too few values" in bad.why
    zero = compare("s", np.array(1e-7, np.float32), np.array(0.0, np.float32), dtype)  # 0-d, near zero: the floor
    assert zero.passed and zero.shape == ()


def test_a_constant_reference_is_judged_by_its_error():
    ref = np.full((16,), 2.0, np.float32)
    assert compare("c", ref + np.float32(1e-5), ref, "float32").passed
    c = compare("c", ref + np.float32(0.1), ref, "float32")
    assert not c.passed and c.pearson is None


def test_one_element_output_through_verify(tmp_path, capsys):
    """verify on a model whose output is one value: Pearson shown as '-', judged by the error, PASS."""
    ir = export_ir(lambda: torch.nn.Sequential(torch.nn.Linear(6, 1), torch.nn.Flatten(0)), [torch.randn(1, 6)],
                   "one")
    torch.manual_seed(0)
    sd = {k: v.numpy() for k, v in torch.nn.Sequential(torch.nn.Linear(6, 1)).state_dict().items()}
    _, _, ws = _files(tmp_path, sd, ir)
    assert main(["verify", str(tmp_path / "m.json"), "--weights", str(ws), "--dtype", "float16"]) == 0
    row = next(s for s in capsys.readouterr().out.splitlines() if "[1]" in s)
    assert row.split()[4] == "-" and row.endswith("ok"), row


# ---- top-k only for class-like outputs ----------------------------------------------------------------------------


class _Cnn(torch.nn.Module):
    def __init__(self, head: str) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 10)
        self.head = head

    def forward(self, x):
        y = self.conv(x)
        if self.head == "nchw_softmax":
            return torch.softmax(y, dim=1)
        z = self.fc(y.mean((2, 3)))
        if self.head == "logits":
            return z
        if self.head == "probs":
            return torch.log_softmax(z / 2.0, dim=-1)
        if self.head == "batch_softmax":
            return torch.softmax(z, dim=0)
        return z.reshape(-1)  # "scores": one vector of every value


@pytest.mark.parametrize("head, expected", [("logits", True), ("probs", True), ("nchw_softmax", False),
                                            ("batch_softmax", False), ("scores", False)])
def test_class_like_outputs(head, expected):
    ir = export_ir(lambda: _Cnn(head), [torch.randn(2, 3, 8, 8)], head)
    assert bool(class_outputs(read_ir(ir))) == expected
    prog = npu_compiler.compile(ir)
    assert bool(prog.stats["class_outputs"]) == expected


def test_lm_logits_are_class_like():
    class Lm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(32, 8)
            self.head = torch.nn.Linear(8, 32, bias=False)

        def forward(self, ids):
            return self.head(self.emb(ids))

    ir = export_ir(Lm, [torch.zeros(1, 5, dtype=torch.long)], "lm")
    assert class_outputs(read_ir(ir)) == [ir["graph_outputs"][0]["name"]]


def test_topk_is_reported_for_class_like_outputs_only():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((4, 10)).astype(np.float32)
    c = compare("y", logits, logits, "float32", class_axis=True)
    assert c.top1_equal == 1.0 and c.top5_overlap == 1.0
    assert compare("y", logits, logits, "float32").top1_equal is None
    fmap = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    assert compare("fmap", fmap, fmap, "float32").top5_overlap is None
    two = rng.standard_normal((4, 3)).astype(np.float32)  # three classes: top-1 yes, top-5 of three no
    c = compare("y", two, two, "float32", class_axis=True)
    assert c.top1_equal == 1.0 and c.top5_overlap is None
