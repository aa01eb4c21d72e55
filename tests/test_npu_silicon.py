"""The NPU model against published silicon (bench/npu_silicon.py): the table in docs/npu_model.md is what the
presets predict today for the workloads the papers measured, each row's verdict is its error against the tolerance
written there (25% end to end), and the figures the model reproduces stay reproduced.

References: the published figures (Eyeriss, JSSC 2017; TPU v1, ISCA 2017), cited per row in the table.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def silicon():
    from helpers import load_bench

    return load_bench("npu_silicon")


def _doc_rows(silicon) -> list[list[str]]:
    text = (ROOT / "docs" / "npu_model.md").read_text()
    assert silicon.BEGIN in text and silicon.END in text, "silicon table missing from docs/npu_model.md"
    table = text.split(silicon.BEGIN, 1)[1].split(silicon.END, 1)[0]
    assert f"tolerance {silicon.TOLERANCE:.0%} end to end" in table
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| chip") and not line.startswith("| ---")]


def test_docs_table_is_what_the_presets_predict(silicon):
    rows = silicon.table_rows()
    doc = _doc_rows(silicon)
    assert len(doc) == len(rows) == len(silicon.FIGURES)
    for r, d in zip(rows, doc):
        f = r.figure
        assert d[:4] == [f.chip, f.workload, f.metric, silicon._fmt(f.published)], d
        assert d[4] == silicon._fmt(r.predicted) and d[5] == f"{100 * r.error:+.0f}%", (d, r.predicted)
        assert d[6] == ("yes" if r.within else "**no**") and d[7] == f.source
        assert re.search(r"(JSSC|ISCA) 2017", f.source)


def test_reproduced_figures_stay_within_the_tolerance(silicon):
    """The figures the docs list as reproduced (Eyeriss's AlexNet frame rate, the TPU's MLPs, LSTM0 and CNN0): a
    change to the model that moves one of them outside 25% fails here, not silently in the docs."""
    reproduced = {("eyeriss", "AlexNet CONV1-5, batch 4", "fps"), ("eyeriss", "VGG-16 CONV1-13, batch 3", "mW"),
                  ("tpu-v1", "MLP0", "TOPS"), ("tpu-v1", "MLP1", "TOPS"), ("tpu-v1", "LSTM0", "TOPS"),
                  ("tpu-v1", "CNN0", "TOPS")}
    rows = {(r.figure.chip, r.figure.workload, r.figure.metric): r for r in silicon.table_rows()}
    for key in reproduced:
        assert abs(rows[key].error) <= silicon.TOLERANCE, (key, rows[key].predicted)


def test_workloads_have_the_papers_sizes(silicon):
    """The programs are the networks the papers ran: MAC counts and weights as published (AlexNet 666 M MACs an
    image, VGG-16 15.3 G; the TPU's Table 1: weights and MACs per weight byte)."""
    macs = {w: silicon.predicted("eyeriss" if w in silicon.BATCH else "tpu-v1", w)["macs"] for w in silicon.WORKLOADS}
    assert macs["AlexNet CONV1-5, batch 4"] / 4 == pytest.approx(666e6, rel=0.002)
    assert macs["VGG-16 CONV1-13, batch 3"] / 3 == pytest.approx(15.35e9, rel=0.002)
    table1 = {"MLP0": (20e6, 200), "MLP1": (5e6, 168), "LSTM0": (52e6, 64), "LSTM1": (34e6, 96), "CNN0": (8e6, 2888),
              "CNN1": (100e6, 1750)}
    for w, (weights, per_byte) in table1.items():
        n = sum(math.prod(ws.shape) for ws in silicon.program(w).weights if len(ws.shape) > 1)  # not the biases
        assert n == pytest.approx(weights, rel=0.01), w
        assert macs[w] / n == pytest.approx(per_byte, rel=0.06), w  # int8: one byte a weight
