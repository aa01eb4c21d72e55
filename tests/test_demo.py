"""`npusim demo`, the README's first command, passes its own checks against PyTorch (on the CPU backend here),
keeps its files and prints next steps that work on them."""

from __future__ import annotations

import shlex

from npusim.cli import main


def test_demo_passes_keeps_files_and_its_next_steps_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "demo: all checks passed" in out and "FAIL" not in out
    assert "ResNet-18" in out and "Qwen2" in out
    demo = tmp_path / "npusim-demo"
    assert (demo / "resnet18" / "resnet18_small.npubin").is_file()
    assert (demo / "qwen2-tiny" / "manifest.json").is_file() and (demo / "qwen2-tiny" / "tokenizer.json").is_file()
    steps = [line.strip() for line in out.split("next:\n", 1)[1].splitlines() if line.strip().startswith("npusim ")]
    assert any(s.startswith("npusim generate") for s in steps) and any(s.startswith("npusim run") for s in steps)
    for step in steps:
        if "MODULE:FACTORY" in step:
            continue  # a template for the user's own model
        argv = shlex.split(step)[1:]
        if argv[0] in ("run", "profile"):
            argv += ["--iters", "1", "--warmup", "0"]
        assert main(argv) == 0, step
    capsys.readouterr()
