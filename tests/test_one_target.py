"""One notion of the target (issue 53): `compile` defaults to the target of the backend `run` picks and says so, a
program of another target is refused with the fix in the CLI's own syntax, and no message tells a CLI user to write
Python."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from test_hardening import small_ir, small_weights, write_safetensors

from npu_compiler.program import CompiledProgram
from npu_runtime.backend import default_backend_name, get_backend
from npusim.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def model(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps(small_ir()))
    write_safetensors(tmp_path / "m.safetensors",
                      {k: ("F32", v.shape, v.tobytes()) for k, v in small_weights().items()})
    return tmp_path / "m.json"


def test_compile_defaults_to_the_target_run_uses(model, capsys):
    """The newcomer's walkthrough: `compile` then `run`, no options. On any machine the artifact runs as it is."""
    out = model.with_suffix(".npubin")
    assert main(["compile", str(model), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    want = get_backend(default_backend_name()).compile_target()
    assert CompiledProgram.load(out).target == want
    assert f"target {want} (the default: the target of backend '{default_backend_name()}'" in text
    assert main(["run", str(out), "--iters", "1", "--warmup", "0"]) == 0


def test_the_default_follows_npusim_backend(model, capsys, monkeypatch):
    monkeypatch.setenv("NPUSIM_BACKEND", "cpu")
    assert main(["compile", str(model), "-o", str(model.with_suffix(".npubin"))]) == 0
    assert "target cpu (the default" in capsys.readouterr().out


def test_another_targets_program_says_how_in_the_clis_words(model, capsys):
    out = model.with_suffix(".npubin")
    assert main(["compile", str(model), "-o", str(out), "--target", "cuda"]) == 0
    capsys.readouterr()
    assert main(["run", str(out), "--backend", "cpu", "--iters", "1"]) == 1
    err = capsys.readouterr().err
    assert "npusim compile IR.json --target cpu -o X.npubin" in err and "--backend cuda" in err, err
    assert "target='" not in err


# A hint that tells the user to write Python: a keyword argument in a call (`compile with target='cuda'`,
# `load_weights(..., allow_nan=True)`). Allowed where the CLI's own option is named in the same message, or where the
# fix is another library's own Python (transformers' save_pretrained: npusim has no command for it).
_PYTHON_HINT = re.compile(r"\b[a-z_]+\((?:\.\.\., )?[a-z_]+=|\b[a-z_]+='")
_NOT_OURS = ("save_pretrained(",)


def _message_text(node: ast.AST) -> str:
    """The literal text of a string or f-string (formatted values as {})."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_message_text(v) if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _message_text(node.left) + _message_text(node.right)
    return ""


def test_no_error_or_warning_hints_in_python_syntax_alone():
    problems = []
    for pkg in ("npu_compiler", "npu_runtime", "npu_export", "npusim"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                call = node.exc if isinstance(node, ast.Raise) else node if isinstance(node, ast.Call) and \
                    isinstance(node.func, ast.Attribute) and node.func.attr == "warn" else None
                if not isinstance(call, ast.Call):
                    continue
                text = " ".join(_message_text(a) for a in call.args)
                if _PYTHON_HINT.search(text) and "--" not in text and not any(w in text for w in _NOT_OURS):
                    problems.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text[:120]}")
    assert not problems, "\n".join(problems)
