"""bench/bench_cnn.py on the CPU backend (its smoke run): it checks our output against PyTorch eager's and fails when
they differ."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture()
def bench_cnn(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.setenv("NPUSIM_BACKEND", "cpu")
    import bench_cnn

    return bench_cnn


ARGS = ["--model", "resnet18", "--batches", "1", "--image-size", "32", "--iters", "1", "--no-compile"]


def test_the_benchmark_checks_our_output(bench_cnn, tmp_path, capsys) -> None:
    out = tmp_path / "cnn.json"
    assert bench_cnn.main([*ARGS, "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["backend"] == "cpu" and row["check_passed"] and row["max_rel"] < 1e-2 and row["pearson"] > 0.999
    assert " ok" in capsys.readouterr().out


def test_a_wrong_output_fails_the_benchmark(bench_cnn, monkeypatch, capsys) -> None:
    import npu_runtime

    real = npu_runtime.load_weights

    def scrambled(prog, tensors, backend, **kw):  # the classifier's weight reversed: plausible numbers, wrong logits
        tensors = dict(tensors)
        tensors["fc.weight"] = np.ascontiguousarray(np.asarray(tensors["fc.weight"])[::-1])
        return real(prog, tensors, backend, **kw)

    monkeypatch.setattr(npu_runtime, "load_weights", scrambled)
    assert bench_cnn.main(ARGS) == 1
    assert "FAILED" in capsys.readouterr().out
