"""The command line behaves like a toolchain's: --version, `python -m npusim`, every default in --help, one name per
option across commands, and every stumble a newcomer met is a clear one-line error (never a traceback, never a
silently ignored option)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import export_ir

from npusim.cli import build_parser, main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_version_and_python_m(capsys):
    import npusim

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(f"npusim {npusim.__version__} ")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "npusim", "--version"], capture_output=True, text=True, env=env,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0 and proc.stdout.startswith("npusim "), proc.stderr


def test_pyproject_takes_the_version_from_npusim():
    text = open(os.path.join(REPO, "pyproject.toml")).read()
    assert 'dynamic = ["version"]' in text and 'version = {attr = "npusim.__version__"}' in text


# Options whose absence means "not done" (no file written, no alternative source): nothing to say by default.
NOT_DONE_WHEN_ABSENT = {"--model-dir", "--config", "--graph", "--expected", "--dump-repro", "--trace", "--chart",
                        "--prompt", "--prompt-ids"}


def test_every_default_is_in_help(capsys):
    """Every option with a value default shows it in --help; an option without one says what happens by default."""
    parser = build_parser()
    for name, sub in _subparsers(parser).items():
        text = " ".join(sub.format_help().split())  # help text is wrapped at the terminal width
        for a in sub._actions:
            if not a.option_strings or a.help == argparse.SUPPRESS or isinstance(a, argparse._HelpAction):
                continue
            flag = a.option_strings[-1]
            d = a.default
            if not (d is None or d is False or (isinstance(d, list | tuple) and not d)):
                assert f"(default: {a.default})" in text or "default" in (a.help or ""), (name, flag)
            elif a.default is None and not a.required and a.nargs != 0 and flag not in NOT_DONE_WHEN_ABSENT:
                assert "default" in (a.help or ""), f"npusim {name} {flag}: say what happens when it is not given"


def test_one_dtype_option_name_everywhere():
    """`--dtype` on every command that takes a dtype; the old `export --llm-dtype` is a hidden deprecated alias.
    `export-llm --weights-dtype` (and `--lm-head-dtype`, the LM head's) is another thing: how the weights are stored
    (weight-only int8/int4), not a dtype the model computes in."""
    subs = _subparsers(build_parser())
    for name in ("export", "compile", "verify", "export-llm"):
        flags = {f for a in subs[name]._actions for f in a.option_strings}
        assert "--dtype" in flags, name
    assert "--llm-dtype" not in subs["export"].format_help()
    shown = {name for name, sub in subs.items() for a in sub._actions for f in a.option_strings
             if "dtype" in f and a.help != argparse.SUPPRESS}
    storage = {("export-llm", "--weights-dtype"), ("export-llm", "--lm-head-dtype")}
    assert all(f == "--dtype" or (name, f) in storage for name, sub in subs.items()
               for a in sub._actions for f in a.option_strings if "dtype" in f and a.help != argparse.SUPPRESS), shown


def test_deprecated_llm_dtype_still_works(tmp_path, capsys):
    assert main(["export", "resnet18", "--width", "8", "--image-size", "16", "--num-classes", "5",
                 "--llm-dtype", "float16", "-o", str(tmp_path)]) == 0
    cap = capsys.readouterr()
    assert "--llm-dtype is deprecated; use --dtype" in cap.err
    ir = json.loads((tmp_path / "resnet18.json").read_text())
    assert ir["graph_inputs"][0]["dtype"].removeprefix("torch.") == "float16"


# ---- stumbles: one line, the right exit status, nothing ignored ----------------------------------------------------


def _one_line_error(err: str, *words: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip() and "generated" not in ln and not ln.startswith("  ")]
    assert "Traceback" not in err, err
    assert len(lines) == 1 and "error:" in lines[0], err
    for w in words:
        assert w in lines[0], (w, err)


class _Lin(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.fc(x)) + 1.0


@pytest.fixture(scope="module")
def small_ir(tmp_path_factory):
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("opts")
    (d / "m.json").write_text(json.dumps(export_ir(_Lin, [((2, 8), torch.float32)])))
    torch.manual_seed(0)
    save_file(_Lin().state_dict(), str(d / "w.safetensors"))
    return d


def test_partition_force_cpu_takes_one_op_per_flag_and_keeps_the_file(small_ir, capsys):
    ir = str(small_ir / "m.json")
    assert main(["partition", "--force-cpu", "relu", ir]) == 0
    out = capsys.readouterr().out
    assert "forced to the CPU" in out and "relu" in out
    assert main(["partition", "--force-cpu", "relu,add.Tensor", ir, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {f["op"] for f in plan["fallback"]} == {"aten.relu.default", "aten.add.Tensor"}


@pytest.mark.parametrize("cmd", ["partition", "verify", "run"])
def test_unknown_force_cpu_op_is_an_error(small_ir, capsys, cmd):
    argv = [cmd, str(small_ir / "m.json"), "--force-cpu", "nosuchop"]
    if cmd != "partition":
        argv += ["--weights", str(small_ir / "w.safetensors")]
    assert main(argv) == 1
    _one_line_error(capsys.readouterr().err, "nosuchop", "no such op or node", "relu.default")


def test_per_node_with_force_cpu_checks_every_segment(small_ir, capsys):
    """--force-cpu makes a partitioned program; --per-node compares the kernels of each of its segments."""
    assert main(["verify", str(small_ir / "m.json"), "--weights", str(small_ir / "w.safetensors"), "--per-node",
                 "--force-cpu", "relu", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["per_node"]["kernels"]
    assert report["passed"] and {r["segment"] for r in rows} == {0, 1, 2}
    assert all(r["comparison"]["passed"] for r in rows)


def test_dump_repro_says_when_nothing_failed(small_ir, capsys, tmp_path):
    assert main(["verify", str(small_ir / "m.json"), "--weights", str(small_ir / "w.safetensors"), "--dump-repro",
                 str(tmp_path / "repro"), "--dtype", "float32"]) == 0
    assert "--dump-repro: nothing written" in capsys.readouterr().out
    assert not (tmp_path / "repro").exists()


def test_options_of_another_model_family_are_errors(tmp_path, capsys):
    assert main(["export", "resnet18", "--config", "tiny", "-o", str(tmp_path)]) == 2
    _one_line_error(capsys.readouterr().err, "--config", "does not apply to resnet18")
    assert main(["export", "qwen2", "--config", "tiny", "--width", "8", "-o", str(tmp_path)]) == 2
    _one_line_error(capsys.readouterr().err, "--width")
    assert not list(tmp_path.iterdir())


def test_unknown_qwen2_config_is_one_line(tmp_path, capsys):
    for argv in (["export", "qwen2", "--config", "huge", "-o", str(tmp_path)],
                 ["export-llm", "--config", "huge", "-o", str(tmp_path)]):
        assert main(argv) == 1
        _one_line_error(capsys.readouterr().err, "unknown Qwen2 config 'huge'", "tiny")


def test_compile_to_a_missing_folder_fails_before_compiling(small_ir, capsys, monkeypatch):
    import npu_compiler

    monkeypatch.setattr(npu_compiler, "compile", lambda *a, **k: pytest.fail("compiled before checking -o"))
    assert main(["compile", str(small_ir / "m.json"), "-o", "/nonexistent-npusim/dir/a.npubin"]) == 2
    _one_line_error(capsys.readouterr().err, "/nonexistent-npusim/dir", "does not exist")


def test_traceback_on_request(small_ir, capsys):
    with pytest.raises(Exception, match="does not exist"):
        main(["--traceback", "compile", str(small_ir / "m.json"), "-o", "/nonexistent-npusim/a.npubin"])


def test_partition_report_names_the_target_not_npu(tmp_path, capsys):
    from safetensors.torch import save_file

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.logcumsumexp(x, -1).relu()

    (tmp_path / "m.json").write_text(json.dumps(export_ir(M, [((2, 8), torch.float32)])))
    save_file({}, str(tmp_path / "w.safetensors"))
    assert main(["partition", str(tmp_path / "m.json"), "--target", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "on npu" not in out and "npu ->" not in out
    assert "run partition 0 on the CPU fallback (torch_ir)" in out and "on target 'cpu'" in out


def test_describe_and_generate_agree_on_a_half_open_range(tmp_path, capsys):
    class Emb(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.e = torch.nn.Embedding(256, 8)

        def forward(self, ids):
            return self.e(ids)

    import npu_compiler

    prog = npu_compiler.compile(export_ir(Emb, [((1, 4), torch.int64)]), "cpu")
    prog.save(tmp_path / "e.npubin")
    assert main(["describe", str(tmp_path / "e.npubin")]) == 0
    out = capsys.readouterr().out
    assert "valid range [0, 256)" in out and "[0, 256]" not in out


def test_weight_mismatch_is_listed_once(tmp_path, capsys):
    """A folded batch norm's statistics feed two recipes (the conv's weight and bias): one entry each."""
    from safetensors.numpy import load_file, save_file

    from npu_export import resnet
    from npu_export.cnn import export_cnn

    torch.manual_seed(0)
    res = export_cnn(resnet.resnet18(num_classes=5, width=8).eval(), (1, 3, 16, 16), tmp_path, "r")
    w = load_file(str(res.weights_path))
    w["bn1.weight"] = np.zeros(3, np.float32)
    del w["bn1.bias"]
    save_file(w, str(tmp_path / "bad.safetensors"))
    assert main(["run", str(res.ir_path), "--weights", str(tmp_path / "bad.safetensors"), "--iters", "1"]) == 1
    err = capsys.readouterr().err
    _one_line_error(err, "bn1.weight", "bn1.bias")
    line = next(ln for ln in err.splitlines() if "error:" in ln)
    assert line.count("bn1.weight") == 1 and line.count("bn1.bias") == 1, line


@pytest.mark.parametrize("argv, words", [
    (["export", "qwen2", "--config", "tiny", "--seed", "3", "-o", "OUT"], ["--seed does not apply to qwen2"]),
    (["export-llm", "--config", "tiny", "--seed", "3", "-o", "OUT"], ["--seed applies to --random-weights only"]),
    (["generate", "OUT", "--prompt-ids", "1,2", "--chat"], ["--chat", "--prompt-ids"]),
    (["generate", "OUT", "--prompt-ids", "1,2", "--top-k", "5"], ["--top-k", "--temperature > 0"]),
    (["generate", "OUT", "--prompt-ids", "1,2", "--seed", "1"], ["--seed", "--temperature > 0"]),
])
def test_options_that_would_do_nothing_are_errors(tmp_path, capsys, argv, words):
    argv = [str(tmp_path / "o") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    _one_line_error(capsys.readouterr().err, *words)
    assert not (tmp_path / "o").exists()
