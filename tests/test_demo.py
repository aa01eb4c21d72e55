"""`npusim demo`, the README's first command, passes its own checks against PyTorch (on the CPU backend here)."""

from __future__ import annotations

from npusim.cli import main


def test_demo_passes(capsys):
    assert main(["demo", "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "demo: all checks passed" in out and "FAIL" not in out
    assert "ResNet-18" in out and "Qwen2" in out
