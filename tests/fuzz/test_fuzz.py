"""The fuzz suite in CI: a short run from fixed seeds, and every case a run ever found (tests/fuzz/corpus/), each
in worker processes that show crashes and hangs. Nothing may end as a raw exception, a crash, a hang, an invalid
input accepted, or code run. The long run is `PYTHONPATH=. python tests/fuzz/runner.py` (docs/robustness.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import runner

CORPUS = Path(__file__).resolve().parent / "corpus"
SHORT = {"ir": 120, "ir_cli": 8, "artifact": 80, "weights": 30, "cli": 50}


@pytest.fixture(scope="module")
def seed_dir(tmp_path_factory) -> Path:
    cached = os.environ.get("NPUSIM_FUZZ_SEEDS")
    return runner.build_seeds(Path(cached) if cached else tmp_path_factory.mktemp("fuzz-seeds"))


def _run(seed_dir: Path, cases: list[dict], tmp_path: Path) -> list[runner.Result]:
    pool = runner.Pool(seed_dir, workers=2, timeout=120, log=tmp_path / "workers.log")
    return pool.run(cases, progress=False)


def _report(results: list[runner.Result]) -> str:
    lines = [runner.table(results)]
    for r in runner.failures(results)[:20]:
        lines.append(f"{r.kind}: {json.dumps({k: v for k, v in r.case.items() if k != 'found'})[:300]}\n    {r.detail}")
    return "\n".join(lines)


def test_short_run(seed_dir: Path, tmp_path: Path) -> None:
    cases = []
    for kind, n in SHORT.items():
        cases += runner.make_cases(kind, n, 2026, seed_dir)
    results = _run(seed_dir, cases, tmp_path)
    assert len(results) == len(cases)
    kinds = {r.kind for r in results}
    assert {"clean", "valid"} <= kinds, "the short run must exercise both refusals and accepted inputs"
    assert not runner.failures(results), _report(results)


def test_corpus_cases_stay_fixed(seed_dir: Path, tmp_path: Path) -> None:
    """Every crash, hang, raw exception, invalid input accepted or code run a fuzz run found is replayed: each must
    now be a clean error or an accepted valid input (and still apply to its seed: "stale" fails too)."""
    files = sorted(CORPUS.glob("*.json"))
    assert files, "the corpus is empty"
    cases = []
    for f in files:
        case = json.loads(f.read_text())
        case.pop("found", None)
        case["_file"] = f.name
        cases.append(case)
    results = _run(seed_dir, cases, tmp_path)
    bad = [f"{r.case['_file']}: {r.kind} {r.detail}" for r in results if r.kind not in ("clean", "valid")
           or r.code_run]
    assert not bad, "\n".join(bad)
