"""The command line: compile -> describe -> run, verify's exit status, and failed runs leaving nothing behind."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from npu_export import resnet
from npu_export.cnn import export_cnn
from npusim.cli import main


@pytest.fixture(scope="module")
def small_resnet(tmp_path_factory):
    torch.manual_seed(0)
    m = resnet.resnet18(num_classes=10, width=8).eval()
    d = tmp_path_factory.mktemp("cli")
    res = export_cnn(m, (1, 3, 32, 32), d, "r18")
    return m, res, d


def test_compile_describe_run(small_resnet, capsys):
    model, res, d = small_resnet
    art = d / "r18.npubin"
    assert main(["compile", str(res.ir_path), "-o", str(art), "--dtype", "float32"]) == 0
    capsys.readouterr()
    assert main(["describe", str(art), "--json"]) == 0
    desc = json.loads(capsys.readouterr().out)
    for key in ("kernel_count", "buffer_bytes", "weight_bytes", "inputs", "outputs", "peak_intermediate_bytes"):
        assert key in desc
    assert desc["inputs"][0]["shape"] == [1, 3, 32, 32] and desc["kernel_count"] == len(desc["kernels"])
    assert main(["describe", str(art)]) == 0
    assert "kernels:" in capsys.readouterr().out
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.save(d / "x.npy", x)
    out = d / "out.npz"
    assert main(["run", str(art), "--weights", str(res.weights_path), "--input", f"x={d / 'x.npy'}",
                 "-o", str(out), "--backend", "cpu"]) == 0
    got = np.load(out)
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got[list(got.keys())[0]], ref, rtol=1e-4, atol=1e-5)


def test_verify_passes_and_fails(small_resnet, capsys, tmp_path):
    _, res, _ = small_resnet
    assert main(["verify", str(res.ir_path), "--weights", str(res.weights_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # an fp32 model on a target that computes fp32 stays fp32 unless asked (npu_compiler/passes/dtype.py)
    assert report["passed"] and report["compute_dtype"] == "float32"
    assert report["compute_dtype_reason"].startswith("auto: the weights are float32")
    assert main(["verify", str(res.ir_path), "--weights", str(res.weights_path), "--dtype", "float16"]) == 0
    assert "compute dtype float16 (asked for)" in capsys.readouterr().out


def test_verify_fails_on_a_wrong_kernel(small_resnet, capsys, monkeypatch):
    """A kernel that computes the wrong thing must turn verify's exit status non-zero."""
    from npu_compiler.kernels import Conv2dKernel

    _, res, _ = small_resnet
    right = Conv2dKernel.reference

    def wrong(self, call, arrays):
        run, out = right(self, call, arrays), arrays.view(call.outs[0])

        def step():
            run()
            out[...] *= 1.25

        return step

    monkeypatch.setattr(Conv2dKernel, "reference", wrong)
    assert main(["verify", str(res.ir_path), "--weights", str(res.weights_path), "--backend", "cpu"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_compile_error_is_clean_and_leaves_no_artifact(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    out = tmp_path / "x.npubin"
    assert main(["compile", str(bad), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "malformed JSON" in err and "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob(".npubin-*"))


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for cmd in ("compile", "describe", "run", "verify", "export", "demo"):
        assert cmd in text


def test_verify_and_run_take_the_partition_path(tmp_path, capsys):
    """An op without a lowering (logcumsumexp) sends verify and run through the partition path, and they say so."""
    import torch
    from helpers import export_ir
    from safetensors.torch import save_file

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            return torch.logcumsumexp(self.fc(x), -1).relu()

    ir = tmp_path / "m.json"
    ir.write_text(json.dumps(export_ir(M, [((2, 8), torch.float32)])))
    torch.manual_seed(0)
    save_file(M().state_dict(), str(tmp_path / "w.safetensors"))
    assert main(["verify", str(ir), "--weights", str(tmp_path / "w.safetensors"), "--dtype", "float32",
                 "--json"]) == 0
    cap = capsys.readouterr()
    report = json.loads(cap.out)
    assert report["partition_path"] and report["transfers"] == 2 and report["passed"]
    assert "logcumsumexp" in cap.err and "partition path" in cap.err
    assert main(["run", str(ir), "--weights", str(tmp_path / "w.safetensors"), "-o", str(tmp_path / "o.npz")]) == 0
    assert "logcumsumexp" in capsys.readouterr().err and (tmp_path / "o.npz").exists()
