"""The README's walkthrough and the user guides run as written on a GPU machine (issue 53: `compile` defaulted to
target cpu while `run` took cuda, and the README's command-line walkthrough failed at `npusim run`). The same run
as tests/test_docs.py, without forcing the cpu backend: every command takes the machine's best backend by itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from doc_runner import run_guide

from npu_compiler.program import CompiledProgram

REPO = Path(__file__).resolve().parents[2]
GUIDES = [REPO / "README.md"] + [REPO / "docs" / g for g in ("compile-your-own-model.md",
                                                              "bring-your-own-checkpoint.md", "read-a-profile.md",
                                                              "bisect-a-numerical-bug.md")]


@pytest.mark.parametrize("doc", GUIDES, ids=lambda p: p.name)
def test_walkthrough_runs_as_written_on_the_gpu(doc, tmp_path, monkeypatch):
    monkeypatch.delenv("NPUSIM_BACKEND", raising=False)
    results = run_guide(doc, tmp_path)  # fails at the first command whose exit status is not the guide's
    ran = [r for r in results if r.command.startswith("npusim ")]
    assert len(ran) >= 5, f"{doc.name}: only {len(ran)} npusim commands ran"
    # what `compile` wrote without --target is for the backend the other commands took: cuda here
    for r in ran:
        argv = r.command.split()
        if argv[1] == "compile" and "--target" not in argv:
            out = argv[argv.index("-o") + 1]
            assert CompiledProgram.load(tmp_path / out).target == "cuda", (doc.name, r.command)
    profiles = [r for r in ran if r.command.startswith("npusim profile") and "--backend" not in r.command]
    assert all("on cuda" in r.output for r in profiles), [r.output[:200] for r in profiles]
