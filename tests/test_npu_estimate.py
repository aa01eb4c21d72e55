"""The NPU model (npu_compiler.npu) and `npusim estimate`.

References: a register-level simulation of a systolic array written here (values and cycles, for each dataflow);
SCALE-Sim v3 when it is installed (the `npu-model` extra); the compiler itself for the fusion invariant (the same
IR compiled with and without fusion). Tolerances: array cycles are exact (SCALE-Sim counts the last cycle's index,
one less than the count, so 1 cycle per simulated run is allowed against it); the docs table within 10%.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import re
from itertools import product
from pathlib import Path

import numpy as np
import pytest
import torch

import npu_compiler
from npu_compiler.npu import (
    GemmWork,
    NPUConfigError,
    Operand,
    array_cycles,
    estimate,
    estimate_program,
    kernel_work,
    load_npu,
    preset_names,
)
from npu_compiler.npu.model import gemm_dram
from npusim.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _npu(rows: int, cols: int, dataflow: str, overlap: bool = False, **kw):
    """The tpu-v1 preset's array reshaped, folds not overlapped, one MAC per cell per cycle in every format."""
    full = {"ws": "weight_stationary", "os": "output_stationary", "is": "input_stationary"}[dataflow]
    kw = {"fold_overlap": False, "array_formats": {}, **kw}
    return dataclasses.replace(load_npu("tpu-v1"), array_rows=rows, array_cols=cols, dataflow=full,
                               preload_overlap=overlap, **kw)


# ---- a register-level systolic array, for the hand-checked cases ------------------------------------------------


def _stationary_fold(held: np.ndarray, stream: np.ndarray) -> tuple[np.ndarray, int]:
    """One fold of a weight- (or input-) stationary R x C array. Cell (r, c) holds held[r, c]; vector t enters row r
    at the left edge at cycle t + r and moves one cell right per cycle; partial sums move one cell down per cycle
    and leave the bottom row. Returns (out[t, c], cycles until the last result has left the array)."""
    rows, cols = held.shape
    steps = stream.shape[0]
    a = np.full((rows, cols), np.nan)
    psum = np.zeros((rows, cols))
    out = np.zeros((steps, cols))
    done, cycle = 0, 0
    while done < steps * cols:
        a = np.concatenate([np.array([[stream[cycle - r, r] if 0 <= cycle - r < steps else np.nan]
                                      for r in range(rows)]), a[:, :-1]], axis=1)
        above = np.concatenate([np.zeros((1, cols)), psum[:-1]], axis=0)
        psum = above + np.nan_to_num(a) * held
        for c in range(cols):  # the bottom row's partial sum is complete: it leaves the array
            t = cycle - (rows - 1) - c  # the vector it belongs to entered row 0 at cycle t
            if 0 <= t < steps:
                out[t, c] = psum[rows - 1, c]
                done += 1
        cycle += 1
    return out, cycle


def _output_stationary_fold(a: np.ndarray, b: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, int]:
    """One fold of an output-stationary array: cell (r, c) accumulates C[r, c]; a[r, k] enters row r at cycle
    k + r from the left, b[k, c] enters column c at cycle k + c from the top, both move one cell per cycle."""
    kk = a.shape[1]
    ap = np.zeros((rows, kk))
    bp = np.zeros((kk, cols))
    ap[: a.shape[0]] = a
    bp[:, : b.shape[1]] = b
    acc = np.zeros((rows, cols))
    last = 0
    for cycle in range(kk + rows + cols):
        for r, c in product(range(rows), range(cols)):
            k = cycle - r - c  # the operand pair that meets in cell (r, c) this cycle
            if 0 <= k < kk:
                acc[r, c] += ap[r, k] * bp[k, c]
                last = cycle
    return acc[: a.shape[0], : b.shape[1]], last + 1


def _simulated_gemm(a: np.ndarray, b: np.ndarray, rows: int, cols: int, dataflow: str,
                    overlap: bool) -> tuple[np.ndarray, int]:
    """C = A @ B fold by fold on the simulated array; a stationary tile takes `rows` cycles to shift in before its
    fold (only before the first fold when the next tile shifts in during the current one)."""
    m, k = a.shape
    n = b.shape[1]
    out = np.zeros((m, n))
    cycles, loads = 0, 0
    if dataflow == "os":
        for m0, n0 in product(range(0, m, rows), range(0, n, cols)):
            part, cyc = _output_stationary_fold(a[m0:m0 + rows], b[:, n0:n0 + cols], rows, cols)
            out[m0:m0 + rows, n0:n0 + cols] = part
            cycles += cyc
        return out, cycles
    # weight stationary holds B[k, n] and streams A's rows; input stationary holds A^T[k, m] and streams B's columns
    held_full, stream_full = (b, a) if dataflow == "ws" else (a.T, b.T)
    for k0, c0 in product(range(0, k, rows), range(0, held_full.shape[1], cols)):
        held = np.zeros((rows, cols))
        tile = held_full[k0:k0 + rows, c0:c0 + cols]
        held[: tile.shape[0], : tile.shape[1]] = tile
        stream = np.zeros((stream_full.shape[0], rows))
        stream[:, : tile.shape[0]] = stream_full[:, k0:k0 + rows]
        part, cyc = _stationary_fold(held, stream)
        part = part[:, : tile.shape[1]]
        if dataflow == "ws":
            out[:, c0:c0 + cols] += part
        else:
            out[c0:c0 + cols, :] += part.T
        cycles += cyc
        loads += 1
    return out, cycles + (rows if overlap else loads * rows)


@pytest.mark.parametrize("dataflow", ["ws", "os", "is"])
@pytest.mark.parametrize("shape", [(3, 2, 2, 4, 4), (5, 3, 7, 2, 3), (1, 6, 5, 4, 2), (8, 8, 8, 4, 4)])
@pytest.mark.parametrize("overlap", [False, True])
def test_small_gemms_match_a_register_level_array(dataflow, shape, overlap):
    m, n, k, rows, cols = shape
    rng = np.random.default_rng(m * 100 + n * 10 + k)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    value, cycles = _simulated_gemm(a, b, rows, cols, dataflow, overlap)
    np.testing.assert_allclose(value, a @ b, rtol=1e-12, atol=1e-12)  # the simulated array computes the product
    assert array_cycles(m, n, k, _npu(rows, cols, dataflow, overlap))[0] == cycles


def test_one_fold_by_hand():
    # 2 x 2 weight-stationary array, A 3 x 2, B 2 x 2: the weights shift in (2 cycles); the 3 input rows enter
    # skewed; the last one enters row 1 at cycle 3, passes column 1 at cycle 4 and leaves at the end of that cycle:
    # 3 + 2 + 2 - 2 = 5 cycles of streaming, 7 in all.
    assert array_cycles(3, 2, 2, _npu(2, 2, "ws")) == (7, 1)
    # Output stationary, same product: K = 2 operand pairs; the last pair reaches cell (1, 1) at cycle 1 + 1 + 1.
    assert array_cycles(3, 2, 2, _npu(2, 2, "os")) == (2 * (2 + 2 + 2 - 2), 2)  # M = 3 rows: two row folds


# ---- invariants ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """A small ResNet-18 and a tiny Qwen2 decode graph (random configs on the meta device), each compiled with and
    without fusion: every kernel kind the compiler emits for CNNs and LLMs."""
    from npu_export import resnet
    from npu_export.cnn import export_cnn
    from npu_export.qwen2 import export_qwen2, tiny_qwen2_config

    d = tmp_path_factory.mktemp("npu")
    torch.manual_seed(0)
    res = export_cnn(resnet.resnet18(num_classes=10, width=8).eval(), (1, 3, 32, 32), d, "r18")
    exp = export_qwen2(tiny_qwen2_config(), d / "qwen", max_cache_len=32, prefill_len=8, dtype="float32")
    theta = exp.cache_map["rope"]["theta"]
    out = {}
    for name, ir, kw in (("resnet", res.ir_path, {"dtype": "float16"}),
                         ("decode", exp.decode_path, {"rope_theta": theta}),
                         ("prefill", exp.prefill_path, {"rope_theta": theta})):
        out[name] = (npu_compiler.compile(ir, "cpu", **kw), npu_compiler.compile(ir, "cpu", fusion=False, **kw))
    out["_paths"] = (res, d)
    return out


def _all_programs(programs):
    return [p for k, v in programs.items() if k != "_paths" for p in v]


def test_every_kernel_kind_is_modelled(programs):
    kinds, groups = set(), set()
    for prog in _all_programs(programs):
        est = estimate_program(prog, load_npu("tpu-v1"))
        for k, call in zip(est.kernels, prog.kernels):
            kinds.add(k.kind)
            groups.add(call.group)
            assert k.est.cycles > 0 and k.time_s > 0 and math.isfinite(k.est.energy_total_pj)
            assert k.est.dram_bytes >= 0 and 0 <= k.utilization <= 1
    assert {"gemm", "conv2d", "attention", "generated"} <= kinds
    # the expression kernels of norms, gathers and the cache write are modelled too
    assert {"npu.rmsnorm", "embedding.default", "index_copy.default"} <= groups


@pytest.mark.parametrize("preset", ["tpu-v1", "eyeriss", "edge-4tops"])
def test_doubling_dram_bandwidth_never_slows_a_kernel(programs, preset):
    npu = load_npu(preset)
    fast = dataclasses.replace(npu, dram_gb_s=2 * npu.dram_gb_s)
    for prog in _all_programs(programs):
        for resident in (False, True):
            slow_est = estimate_program(prog, npu, arena_on_chip=resident)
            fast_est = estimate_program(prog, fast, arena_on_chip=resident)
            for s, f in zip(slow_est.kernels, fast_est.kernels):
                assert f.est.cycles <= s.est.cycles, (preset, s.name, s.work)
                assert f.est.dram_bytes == s.est.dram_bytes  # bandwidth changes time, not traffic


@pytest.mark.parametrize("dataflow", ["ws", "os", "is"])
def test_a_larger_array_never_raises_compute_cycles_of_a_layer_that_fills_it(dataflow):
    # A layer fills an array when every fold is full: its spatial dimensions are multiples of the array's.
    for (r, c), scale in product([(8, 8), (8, 16), (16, 4)], [(1, 2), (2, 1), (2, 2), (4, 2)]):
        small, big = _npu(r, c, dataflow), _npu(r * scale[0], c * scale[1], dataflow)
        for mult in product([1, 2, 3], repeat=3):
            lr, lc = big.array_rows * mult[0], big.array_cols * mult[1]
            stream = [1, 7, 64][mult[2] - 1]
            m, n, k = {"ws": (stream, lc, lr), "os": (lr, lc, stream), "is": (lc, stream, lr)}[dataflow]
            assert array_cycles(m, n, k, big)[0] <= array_cycles(m, n, k, small)[0], (r, c, scale, m, n, k)


def test_a_layer_that_does_not_fill_a_larger_array_can_get_slower():
    # The reason for the condition above (docs/npu_model.md): K = 300 on 128 rows takes 3 folds of 383 + 1 cycles,
    # on 256 rows 2 folds of 767 + 1: fewer, longer folds.
    assert array_cycles(1, 128, 300, _npu(256, 128, "ws"))[0] > array_cycles(1, 128, 300, _npu(128, 128, "ws"))[0]


def _dram_by_kernel(prog, npu, resident):
    return {k.index: k.est.dram_bytes for k in estimate_program(prog, npu, arena_on_chip=resident).kernels}


@pytest.mark.parametrize("preset", ["tpu-v1", "edge-4tops"])
def test_fused_groups_never_move_more_dram_bytes_than_their_parts(programs, preset):
    npu = load_npu(preset)
    for name in ("resnet", "decode", "prefill"):
        fused, unfused = programs[name]
        for resident in (False, True):
            f_bytes = _dram_by_kernel(fused, npu, resident)
            u_bytes = _dram_by_kernel(unfused, npu, resident)
            if not resident:
                # With intermediates on chip the program total may not hold: a producer that greedy fusion inlines
                # into several consumers is recomputed by each, and reads its DRAM inputs once per consumer (the
                # RoPE angles: both halves of `cat` read position_ids and inv_freq). Each group still holds.
                assert sum(f_bytes.values()) <= sum(u_bytes.values()), name
            checked = 0
            for i, k in enumerate(fused.kernels):
                if len(k.nodes) < 2:
                    continue
                nodes = set(k.nodes)
                parts = [j for j, u in enumerate(unfused.kernels) if u.nodes and set(u.nodes) <= nodes]
                assert parts, (name, k.name, k.nodes)
                # a decode attention reads the cache positions (a few bytes) to skip the cache past them
                control = k.spec.cost(k, fused.buffers).read_of(len(k.args) - 1) if getattr(
                    k.spec, "valid_len", False) else 0
                assert f_bytes[i] <= sum(u_bytes[j] for j in parts) + control, (name, k.name, k.group, resident)
                checked += 1
            assert checked > 0


def test_gemm_traffic_reads_each_operand_once_when_the_buffers_hold_it():
    npu = _npu(16, 16, "ws", weight_buffer_kib=64.0, activation_buffer_kib=64.0)
    # A 32 x 64 fp16 (4 KiB), B 64 x 128 (16 KiB): both fit half a buffer: A + B + C once.
    g = GemmWork(32, 128, 64, Operand(32 * 64 * 2), Operand(64 * 128 * 2), Operand(32 * 128 * 2))
    assert gemm_dram(g, npu)[0] == 32 * 64 * 2 + 64 * 128 * 2 + 32 * 128 * 2
    # B of 64 x 2048 (256 KiB) does not fit 32 KiB: 8 column panels of 256 columns, each read once; A fits and is
    # read once: the same bytes, in 8 passes.
    g = GemmWork(32, 2048, 64, Operand(32 * 64 * 2), Operand(64 * 2048 * 2), Operand(32 * 2048 * 2))
    dram, tiles = gemm_dram(g, npu)
    assert dram == 32 * 64 * 2 + 64 * 2048 * 2 + 32 * 2048 * 2 and tiles["panels"] == 8
    # Neither fits: A (128 KiB) is read once per B panel (8), or B once per A panel (4 panels of 1024 rows): the
    # cheaper order wins.
    g = GemmWork(4096, 2048, 16, Operand(4096 * 16 * 2), Operand(16 * 2048 * 2), Operand(4096 * 2048 * 2))
    dram, tiles = gemm_dram(g, npu)
    a, b, c = 4096 * 16 * 2, 16 * 2048 * 2, 4096 * 2048 * 2
    assert dram == min(a * 1 + b * 4, a * 2 + b * 1) + c  # B (64 KiB) needs 2 panels of 32 KiB
    # An operand held on chip between kernels costs no DRAM at all.
    g = dataclasses.replace(g, a=Operand(a, on_chip=True), out=Operand(c, on_chip=True))
    assert gemm_dram(g, npu)[0] == b


def test_kernel_time_is_the_longest_of_compute_on_chip_and_dram():
    npu = load_npu("tpu-v1")
    w = GemmWork(1, 8960, 1536, Operand(1536), Operand(1536 * 8960), Operand(8960), 1, 1, 1,
                 dtypes=("int8", "int8"), out_dtype="int8")
    e = estimate(w, npu)
    assert e.bound == "DRAM"  # a decode GEMV streams its int8 weights once: 13.8 MB at 34 GB/s
    expected = (w.b.bytes + w.a.bytes + w.out.bytes) / 34e9 * 700e6 + 100e-9 * 700e6
    assert e.cycles == pytest.approx(expected, rel=1e-9)
    assert e.energy_pj["dram"] == pytest.approx(e.dram_bytes * 160.0)
    assert e.energy_pj["mac"] == pytest.approx(1536 * 8960 * 0.3)  # an int8 MAC (the preset's Horowitz figure)


def test_gemm_orientation_puts_the_weight_in_the_array():
    """A 1x1 convolution lowered to a GEMM has the weight as its left operand: the model turns the product around
    so that the weight is the stationary operand and the pixels stream (M = images x pixels, N = out channels)."""
    from conftest import export_ir

    ir = export_ir(lambda: torch.nn.Conv2d(8, 16, 1), [torch.empty(2, 8, 6, 5)])
    prog = npu_compiler.compile(ir, "cpu", dtype="float32")
    (k,) = [k for k in prog.kernels if k.kind == "gemm"]
    assert prog.buffers[k.args[0].buffer].kind == "weight" and (k.spec.m, k.spec.n) == (16, 30)
    w = kernel_work(prog, k)
    assert (w.m, w.n, w.k, w.batch) == (2 * 30, 16, 8, 1)
    assert w.b.bytes == 16 * 8 * 4 and w.a.bytes == 2 * 8 * 30 * 4 and w.out.bytes == 2 * 16 * 30 * 4


# ---- NPU files ------------------------------------------------------------------------------------------------------


def test_presets_load():
    assert {"tpu-v1", "eyeriss", "edge-4tops"} <= set(preset_names())
    tpu = load_npu("tpu-v1")
    assert (tpu.array_rows, tpu.array_cols, tpu.dataflow, tpu.clock_mhz) == (256, 256, "weight_stationary", 700.0)
    assert tpu.activation_buffer_kib == 24 * 1024 and tpu.dram_gb_s == 34.0
    edge = load_npu("edge-4tops")
    assert 3e12 <= 2 * edge.peak_macs_per_s <= 5e12  # "an edge NPU of a few TOPS"


def test_user_file_with_base(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('base = "tpu-v1"\nname = "mine"\n[array]\nrows = 128\ndataflow = "os"\n[dram]\nbandwidth_gb_s = 68\n')
    npu = load_npu(f)
    assert (npu.name, npu.array_rows, npu.array_cols, npu.dataflow, npu.dram_gb_s) == (
        "mine", 128, 256, "output_stationary", 68.0)


@pytest.mark.parametrize("text, message", [
    ('base = "tpu-v1"\n[array]\nrowz = 3\n', r"unknown key 'array\.rowz'"),
    ('base = "tpu-v1"\n[array]\nrows = -3\n', r"array\.rows: expected a positive integer, got -3"),
    ('base = "tpu-v1"\n[buffers]\nweights_kib = -1.5\n', r"buffers\.weights_kib: expected a positive number"),
    ('base = "tpu-v1"\n[array]\nrows = "256"\n', r"array\.rows: expected an integer, got '256'"),
    ('base = "tpu-v1"\n[array]\nrows = 2.5\n', r"array\.rows: expected an integer, got 2\.5"),
    ('base = "tpu-v1"\n[array]\npreload_overlap = 1\n', r"array\.preload_overlap: expected true or false"),
    ('base = "tpu-v1"\n[array]\ndataflow = "diagonal"\n', r"array\.dataflow: expected one of"),
    ('base = "tpu-v1"\n[dram]\nlatency_ns = -1\n', r"dram\.latency_ns: expected a number >= 0"),
    ('base = "tpu-v1"\n[array]\nformats = { int7 = 1 }\n', r"array\.formats\.int7: unknown number format"),
    ('base = "tpu-v1"\n[array]\nformats = { int8 = -1 }\n', r"array\.formats\.int8: expected a number >= 0"),
    ('base = "tpu-v1"\n[array]\nformats = 1\n', r"array\.formats: expected a table of number formats"),
    ('base = "nope"\n', r"base: unknown preset 'nope'"),
    ('name = "x"\n', r"missing 'array\.rows'"),
    ('[array\nrows = 3\n', r"not valid TOML"),
])
def test_bad_npu_files_get_one_line_naming_the_file_and_field(tmp_path, text, message):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(NPUConfigError, match=message) as e:
        load_npu(f)
    assert str(f) in str(e.value) and "\n" not in str(e.value)


def test_unknown_preset_and_missing_file():
    with pytest.raises(NPUConfigError, match="unknown NPU preset 'tpu-v9'; presets: "):
        load_npu("tpu-v9")
    with pytest.raises(NPUConfigError, match="NPU file not found"):
        load_npu("/nonexistent/npu.toml")


# ---- the command ----------------------------------------------------------------------------------------------------


def test_cli_table_json_trace_chart(programs, tmp_path, capsys):
    res, d = programs["_paths"]
    art = tmp_path / "r18.npubin"
    programs["resnet"][0].save(art)
    assert main(["estimate", str(art), "--npu", "edge-4tops", "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "estimate r18 on edge-4tops" in out and "bound" in out and "fusion group" in out
    assert len([ln for ln in out.splitlines() if re.match(r"\s+\d+ k\d+_", ln)]) == 5

    trace, chart = tmp_path / "t.json", tmp_path / "c.png"
    assert main(["estimate", str(art), "--npu", "tpu-v1", "--json", "--trace", str(trace), "--chart",
                 str(chart)]) == 0
    report = json.loads(capsys.readouterr().out)
    prog = programs["resnet"][0]
    assert len(report["kernels"]) == len(prog.kernels)
    assert report["totals"]["time_s"] == pytest.approx(sum(k["time_s"] for k in report["kernels"]))
    assert {k["bound"] for k in report["kernels"]} <= {"compute", "on-chip", "DRAM"}
    assert sum(g["kernels"] for g in report["by_group"].values()) == len(prog.kernels)
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert [e["args"]["index"] for e in events] == list(range(len(prog.kernels)))
    for e, k in zip(events, report["kernels"]):
        assert e["name"] == k["name"] and e["args"]["index"] == k["index"] and e["args"]["nodes"] == k["nodes"]
        assert e["dur"] == pytest.approx(k["time_s"] * 1e6) and e["args"]["bound"] == k["bound"]
    assert all(a["ts"] + a["dur"] == pytest.approx(b["ts"]) for a, b in zip(events, events[1:]))  # back to back
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_compare_gpu_on_the_available_backend(programs, tmp_path, capsys):
    res, d = programs["_paths"]
    art = tmp_path / "r18.npubin"
    npu_compiler.compile(res.ir_path, "cpu", dtype="float32").save(art)
    trace = tmp_path / "t.json"
    assert main(["estimate", str(art), "--compare-gpu", "--weights", str(res.weights_path), "--backend", "cpu",
                 "--iters", "1", "--warmup", "0", "--json", "--trace", str(trace)]) == 0
    report = json.loads(capsys.readouterr().out)
    measured = report["measured"]
    assert measured["backend"] == "cpu" and len(measured["kernels"]) == len(report["kernels"])
    assert all(t > 0 for t in measured["kernels"].values())
    pids = {e["pid"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"}
    assert pids == {0, 1}  # predicted and measured rows
    assert main(["estimate", str(art), "--compare-gpu", "--weights", str(res.weights_path), "--backend", "cpu",
                 "--iters", "1", "--warmup", "0", "--top", "3"]) == 0
    assert "measured(us)" in capsys.readouterr().out
    assert main(["estimate", str(art), "--compare-gpu"]) == 2
    assert "needs --weights" in capsys.readouterr().err


def test_cli_llm_folder_predicts_ttft_and_decode_rate(tmp_path, capsys):
    assert main(["export-llm", "--config", "tiny", "-o", str(tmp_path), "--max-cache-len", "32",
                 "--prefill-len", "8", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["estimate", str(tmp_path), "--npu", "edge-4tops", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    llm = rep["llm"]
    assert llm["ttft_s"] == pytest.approx(rep["prefill"]["totals"]["time_s"])
    assert llm["decode_tokens_per_s"] == pytest.approx(1 / rep["decode"]["totals"]["time_s"])
    # A shorter context means less of the cache to read: never slower.
    assert main(["estimate", str(tmp_path), "--npu", "edge-4tops", "--json", "--context", "4"]) == 0
    short = json.loads(capsys.readouterr().out)
    assert short["llm"]["decode_step_s"] <= llm["decode_step_s"]
    assert main(["estimate", str(tmp_path), "--top", "3"]) == 0
    assert "time to first token" in capsys.readouterr().out


def test_cli_bad_inputs_are_one_line_errors(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[array]\nrows = -1\n")
    art = tmp_path / "x.npubin"
    art.write_bytes(b"nope")
    assert main(["estimate", str(art), "--npu", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("npusim estimate: error:") and str(bad) in err and "\n" not in err
    assert main(["estimate", str(art)]) == 1
    assert "not a .npubin artifact" in capsys.readouterr().err
    assert main(["estimate", str(tmp_path)]) == 1
    assert "manifest.json" in capsys.readouterr().err


# ---- the docs and SCALE-Sim ---------------------------------------------------------------------------------------


def _validate_module():
    from helpers import load_bench

    return load_bench("npu_validate")


def test_docs_validation_table_matches_the_model():
    """Every row of the SCALE-Sim table in docs/npu_model.md: the model's cycles are what the model computes today
    (so the table cannot go stale) and within 10% of SCALE-Sim's."""
    text = (ROOT / "docs" / "npu_model.md").read_text()
    head = re.search(r"SCALE-Sim 3\.0\.0 vs the model: (\d+) x (\d+) array, ([a-z-]+),", text)
    assert head, "validation table missing from docs/npu_model.md"
    rows, cols, df = int(head[1]), int(head[2]), {"weight-stationary": "ws", "output-stationary": "os",
                                                   "input-stationary": "is"}[head[3]]
    npu = _npu(rows, cols, df)
    lines = re.findall(r"^\| (ResNet-50|Qwen2\.5-1\.5B decode) \|.*\| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|"
                       r" ([+-][\d.]+)% \|$", text, flags=re.M)
    assert len(lines) >= 20
    for _, m, n, k, ref, ours, _err in lines:
        assert array_cycles(int(m), int(n), int(k), npu)[0] == int(ours)
        assert abs(int(ours) - int(ref)) <= 0.10 * int(ref)


scalesim_missing = importlib.util.find_spec("scalesim") is None


@pytest.mark.skipif(scalesim_missing, reason="scalesim is not installed (pip install -e '.[npu-model]')")
@pytest.mark.parametrize("dataflow", ["ws", "os", "is"])
def test_model_matches_scalesim_on_small_layers(dataflow):
    V = _validate_module()
    from npu_compiler.npu import ConvWork

    conv = ConvWork(1, 5, 9, 9, 6, 3, 3, 5, 5, Operand(0), Operand(0), Operand(0), (2, 2), (1, 1))
    layers = [V.layer_of(GemmWork(20, 12, 30, Operand(0), Operand(0), Operand(0)), "gemm"),
              V.layer_of(GemmWork(1, 17, 9, Operand(0), Operand(0), Operand(0)), "gemv"),
              V.layer_of(conv, "conv")]
    npu = _npu(8, 4, dataflow)
    for layer in layers:
        ours = array_cycles(layer.m, layer.n, layer.k, npu)[0]
        ref = V.scalesim_cycles(layer, 8, 4, dataflow)
        assert abs(ours - ref) <= 1, (layer, ours, ref)


@pytest.mark.skipif(scalesim_missing, reason="scalesim is not installed (pip install -e '.[npu-model]')")
def test_model_matches_scalesim_on_a_resnet50_layer_on_the_tpu_array():
    V = _validate_module()
    layer = V.layer_of(GemmWork(196, 256, 1024, Operand(0), Operand(0), Operand(0)), "layer3 1x1 reduce")
    assert abs(array_cycles(196, 256, 1024, _npu(256, 256, "ws"))[0] - V.scalesim_cycles(layer, 256, 256, "ws")) <= 1


@pytest.mark.skipif(scalesim_missing, reason="scalesim is not installed (pip install -e '.[npu-model]')")
def test_scalesim_column_slices_add_up_to_one_run(monkeypatch):
    V = _validate_module()
    layer = V.layer_of(GemmWork(3, 40, 10, Operand(0), Operand(0), Operand(0)), "g")
    whole = V.scalesim_cycles(layer, 4, 4, "ws")
    monkeypatch.setattr(V, "MAX_LINES_PER_RUN", 60)
    parts = V._slices(layer, 4, 4, "ws")
    assert len(parts) > 1 and sum(p.n for p in parts) == 40
    assert abs(sum(V._scalesim_run(p, 4, 4, "ws") for p in parts) - whole) <= len(parts)


def test_a_gemm_prologue_is_vector_work_before_the_array():
    """A GEMV that computes its operand (RMSNorm folded in, as cuda compiles decode's projections): the NPU's
    vector unit makes A from the operands the prologue reads and hands it to the array on chip, so A costs no DRAM
    bytes, the prologue's operations count as vector work, and the norm's input and weight are read once."""
    from conftest import export_ir
    from helpers import NormLinear

    k_, n_, m_ = 64, 48, 2
    ir = export_ir(lambda: NormLinear(k_, n_), [torch.empty(m_, k_), torch.empty(m_, n_)])
    prog = npu_compiler.compile(ir, "cuda", dtype="float32")
    (k,) = [k for k in prog.kernels if k.kind == "gemm"]
    assert k.spec.prologue is not None
    w = kernel_work(prog, k)
    assert isinstance(w, GemmWork) and (w.m, w.n, w.k) == (m_, n_, k_)
    assert w.a.on_chip and w.a.bytes == m_ * k_ * 4 and w.b.bytes == n_ * k_ * 4
    # the prologue reads x [m, k] and the norm's weight [k]; the epilogue the residual [m, n]
    assert sorted(o.bytes for o in w.extra) == sorted([m_ * k_ * 4, k_ * 4, m_ * n_ * 4])
    # square, sum, divide, scale by the weight: per element of A; the residual add per output element
    assert w.vector_ops >= 4 * m_ * k_ + m_ * n_
    npu = load_npu("tpu-v1")
    assert estimate(w, npu).vector_ops == w.vector_ops
