"""bench/bench_llm.py on the CPU backend (its smoke run, a tiny config, no torch.compile): every peer's column,
the gpt-fast-style peer computing the same logits as the Hugging Face model, and the bench failing when it does
not."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"
ARGS = ["--config", "tiny", "--positions", "3,40", "--max-cache-len", "64", "--iters", "2", "--no-compile",
        "--backends", "cpu"]


@pytest.fixture
def bench_llm(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_llm

    return bench_llm


def test_the_gptfast_peer_runs_and_matches_transformers(bench_llm, tmp_path, capsys) -> None:
    out = tmp_path / "llm.json"
    assert bench_llm.main([*ARGS, "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["gptfast_mode"] == "eager" and len(rep["gptfast_checks"]) == 2
    assert all(c["passed"] and c["pearson"] >= 0.999 for c in rep["gptfast_checks"])
    assert [r["kv_position"] for r in rep["rows"]] == [3, 40]
    assert all(r["gptfast_ms"] > 0 and r["eager_ms"] > 0 and r["ours_ms"] > 0 for r in rep["rows"])
    assert "gpt-fast ms" in capsys.readouterr().out


def test_a_wrong_gptfast_peer_fails_the_benchmark(bench_llm, monkeypatch, capsys) -> None:
    import gptfast_qwen2

    real = gptfast_qwen2.GptFastQwen2.from_hf

    def broken(model, max_len):
        fast = real(model, max_len)
        with torch.no_grad():
            fast.layers[0].feed_forward.w2.weight.mul_(-1.0)  # a wrong weight: other logits
        return fast

    monkeypatch.setattr(gptfast_qwen2.GptFastQwen2, "from_hf", staticmethod(broken))
    assert bench_llm.main(ARGS) == 1
    assert "FAILED" in capsys.readouterr().out
    sys.modules.pop("bench_llm", None)
