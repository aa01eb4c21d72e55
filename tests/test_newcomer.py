"""What a new user runs into first (issue 53): a TorchScript module or archive gets told to export the nn.Module, and
`run` finds the weights `export` wrote beside the model."""

from __future__ import annotations

import textwrap

import pytest
import torch

from npusim.cli import main

MODULE = textwrap.dedent("""
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return torch.relu(self.fc(x))

    def scripted():
        return torch.jit.script(Net())

    def traced():
        return torch.jit.trace(Net(), torch.randn(2, 4))

    def plain():
        return Net()
""")


@pytest.mark.parametrize("factory", ["scripted", "traced"])
def test_a_torchscript_module_is_told_to_export_the_nn_module(tmp_path, capsys, monkeypatch, factory):
    (tmp_path / "net.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    assert main(["export", f"net.py:{factory}", "--input-shape", "2,4", "-o", "out"]) == 1
    err = capsys.readouterr().err
    assert "is a TorchScript module" in err and "export the nn.Module itself, not a ScriptModule" in err, err
    assert "meta device" not in err


def test_a_torchscript_archive_as_checkpoint_is_named(tmp_path, capsys, monkeypatch):
    (tmp_path / "net.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        import net

        torch.jit.save(torch.jit.script(net.Net()), str(tmp_path / "net.pt"))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("net", None)
    assert main(["export", "net.py:plain", "--input-shape", "2,4", "--checkpoint", "net.pt", "-o", "out"]) == 1
    err = capsys.readouterr().err
    assert "is a TorchScript archive (torch.jit.save), not a state dict" in err, err


def test_export_then_run_without_weights_option(tmp_path, capsys, monkeypatch):
    """The walkthrough's commands without --weights: export writes out/net.safetensors beside out/net.json, and
    compile, run and verify find it, saying so."""
    (tmp_path / "net.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    assert main(["export", "net.py:plain", "--input-shape", "2,4", "-o", "out"]) == 0
    assert main(["verify", "out/plain.json"]) == 0
    assert main(["compile", "out/plain.json", "-o", "out/plain.npubin"]) == 0
    assert main(["run", "out/plain.npubin", "--iters", "1", "--warmup", "0"]) == 0
    err = capsys.readouterr().err
    assert "weights: out/plain.safetensors (beside out/plain.npubin; --weights to give others)" in err
    assert "weights: out/plain.safetensors (beside out/plain.json" in err
