"""Design sweeps (`npusim estimate --sweep`): every combination is the single run on that configuration, the Pareto
front is the set no other design beats in every objective, the chart and the JSON are written, bad sweeps are one
line."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import export_ir

import npu_compiler
from npu_compiler.npu import NPUConfigError, estimate_program, load_npu
from npu_compiler.npu.sweep import parse_axes
from npusim.cli import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(8, 32, 3, padding=1)
            self.fc = torch.nn.Linear(32 * 8 * 8, 64)

        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).flatten(1))

    prog = npu_compiler.compile(export_ir(Tiny, [torch.empty(2, 8, 8, 8)]), "cpu", dtype="float16")
    path = tmp_path_factory.mktemp("sweep") / "tiny.npubin"
    prog.save(path)
    return prog, path


def test_every_point_is_the_single_run(tiny, tmp_path, capsys):
    prog, art = tiny
    chart = tmp_path / "sweep.svg"
    assert main(["estimate", str(art), "--npu", "tpu-v1", "--format", "int8", "--sweep", "rows=32,64,128",
                 "--sweep", "buffers.weights_kib=16,256", "--json", "--chart", str(chart)]) == 0
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert "sweep 6/6" in out.err  # progress
    assert report["objectives"] == ["time_s", "energy_pj", "area_mm2"]  # tpu-v1 gives per-component area
    points = report["points"]
    assert [(p["params"]["array.rows"], p["params"]["buffers.weights_kib"]) for p in points] == [
        (32, 16.0), (32, 256.0), (64, 16.0), (64, 256.0), (128, 16.0), (128, 256.0)]
    tpu = load_npu("tpu-v1")
    for p in points:
        cfg = dataclasses.replace(tpu, array_rows=p["params"]["array.rows"],
                                  weight_buffer_kib=p["params"]["buffers.weights_kib"])
        single = estimate_program(prog, cfg, number_format="int8")
        assert (p["time_s"], p["energy_pj"], p["dram_bytes"]) == (single.time_s, single.energy_pj, single.dram_bytes)
        assert p["area_mm2"] == pytest.approx(cfg.area_mm2)
    # the same point as a user's NPU file through the command line
    f = tmp_path / "mine.toml"
    f.write_text('base = "tpu-v1"\n[array]\nrows = 64\n[buffers]\nweights_kib = 16\n')
    assert main(["estimate", str(art), "--npu", str(f), "--format", "int8", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)["totals"]
    assert alone["time_s"] == points[2]["time_s"] and alone["energy_pj"] == points[2]["energy_pj"]
    # the front: no other point at least as good everywhere and better somewhere
    objectives = [(p["time_s"], p["energy_pj"], p["area_mm2"]) for p in points]
    for p, mine in zip(points, objectives):
        beaten = any(all(o <= m for o, m in zip(other, mine)) and other != mine for other in objectives)
        assert p["pareto"] == (not beaten)
    assert any(p["pareto"] for p in points)
    assert chart.read_text().lstrip().startswith(("<?xml", "<svg"))


def test_sweep_table_and_png(tiny, tmp_path, capsys):
    _, art = tiny
    chart = tmp_path / "s.png"
    assert main(["estimate", str(art), "--npu", "edge-4tops", "--sweep", "dram.bandwidth_gb_s=6.4,25.6",
                 "--chart", str(chart)]) == 0
    out = capsys.readouterr().out
    assert "sweep of edge-4tops: 2 designs" in out and "latency ms" in out and "*" in out
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("spec, message", [
    ("rowz=1,2", r"--sweep 'rowz': unknown NPU key"),
    ("rows=64,-1", r"--sweep: array\.rows: expected a positive integer, got -1"),
    ("rows", r"expected KEY=V1,V2"),
    ("dataflow=ws,diagonal", r"expected one of"),
])
def test_bad_sweeps_are_one_line(spec, message):
    with pytest.raises(NPUConfigError, match=message):
        parse_axes([spec])


def test_too_many_combinations_and_repeated_keys(tiny, capsys):
    with pytest.raises(NPUConfigError, match="given twice"):
        parse_axes(["rows=1,2", "array.rows=3"])
    with pytest.raises(NPUConfigError, match="combinations"):
        parse_axes(["rows=" + ",".join(map(str, range(1, 101))), "cols=" + ",".join(map(str, range(1, 101)))])
    _, art = tiny
    assert main(["estimate", str(art), "--sweep", "rows=1,2", "--trace", "t.json"]) == 2
    assert "--sweep takes neither" in capsys.readouterr().err
