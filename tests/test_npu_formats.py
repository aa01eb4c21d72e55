"""Number formats, overlap and the row-stationary dataflow of the NPU model, on records and programs built here with
counts worked out by hand.

- Formats: a preset's `array.formats` gives MACs per cell per cycle (TPU v1: int8 1, int16 1/4); int8 records are
  costed at int8's rate, bytes and energy; a float program on an int8/int16 array is costed at the nearest format
  and flagged; `--format` costs a float program's tensors in another format.
- Overlap: fill/drain between folds (`array.fold_overlap`), DRAM loads that add to the computation where the
  hardware does not double-buffer them (`dram.double_buffered = false`), layer-to-layer pipelining.
- Row stationary: the PE sets of Eyeriss's mapping (R x E sets, segments of at most `cols` output rows, as many side
  by side as fit).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import export_ir

import npu_compiler
from npu_compiler.npu import ConvWork, GemmWork, Operand, array_cycles, estimate, estimate_program, load_npu
from npu_compiler.npu.formats import mac_rate, resolve
from npu_compiler.npu.rowstationary import RSLayer, rs_map
from npusim.cli import main


def _int8_gemv(k: int = 1024, n: int = 1024, dtypes=("int8", "int8")) -> GemmWork:
    a, b = (1 if d == "int8" else 2 for d in dtypes)
    return GemmWork(64, n, k, Operand(64 * k * a), Operand(k * n * b), Operand(64 * n), a, b, 1,
                    dtypes=dtypes, out_dtype="int8")


def test_tpu_rates_by_format():
    tpu = load_npu("tpu-v1")
    assert mac_rate(tpu, "int8", "int8")[:2] == (1.0, ("int8", "int8"))
    assert mac_rate(tpu, "int16", "int16")[0] == 0.25  # four passes of the 8-bit multipliers
    assert mac_rate(tpu, "int8", "int16")[0] == 0.5  # the paper's half speed for 8 x 16 bits
    rate, formats, note = mac_rate(tpu, "float16", "float16")
    assert (rate, formats) == (0.25, ("int16", "int16")) and "array takes int16, int8" in note
    assert resolve({"int8": 1.0}, "fp32") == ("int8", 1.0)  # nothing as wide: the widest it takes
    assert mac_rate(load_npu("edge-4tops"), "float16", "float16")[:2] == (0.5, ("fp16", "fp16"))


def test_int8_macs_bytes_and_energy_are_costed_as_int8():
    tpu = load_npu("tpu-v1")
    i8, i16 = estimate(_int8_gemv(), tpu), estimate(_int8_gemv(dtypes=("int16", "int16")), tpu)
    # 4 x 4 folds of 64 vectors; folds overlap: 16 x max(64, 256) + 256 + 256 - 2 + 256 (the first preload)
    assert i8.array_cycles == 16 * 256 + 510 + 256
    assert i16.array_cycles == 4 * i8.array_cycles
    assert i8.energy_pj["mac"] == pytest.approx(64 * 1024 * 1024 * 0.3)
    assert i16.energy_pj["mac"] == pytest.approx(64 * 1024 * 1024 * 1.2)
    assert "format_note" not in i8.detail and "format_note" not in i16.detail


def test_a_float_program_on_an_int8_preset_is_flagged_and_format_costs_it_quantized(tmp_path, capsys):
    ir = export_ir(lambda: torch.nn.Linear(256, 512), [torch.empty(4, 256)])
    prog = npu_compiler.compile(ir, "cpu", dtype="float16")
    tpu = load_npu("tpu-v1")
    fp16 = estimate_program(prog, tpu)
    assert any("fp16 MACs: tpu-v1's array takes int16, int8; costed as int16" in n for n in fp16.notes)
    i8 = estimate_program(prog, tpu, number_format="int8")
    assert not any("costed as int16" in n for n in i8.notes) and "costed as int8" in i8.notes[0]
    assert i8.dram_bytes * 2 == pytest.approx(fp16.dram_bytes, rel=0.01)  # every tensor half the bytes
    assert i8.kernels[0].est.array_cycles * 4 == pytest.approx(fp16.kernels[0].est.array_cycles)
    art = tmp_path / "lin.npubin"
    prog.save(art)
    assert main(["estimate", str(art), "--npu", "tpu-v1"]) == 0
    assert "costed as int16" in capsys.readouterr().out
    assert main(["estimate", str(art), "--npu", "tpu-v1", "--format", "int8", "--json"]) == 0
    assert not any("costed as int16" in n for n in json.loads(capsys.readouterr().out)["notes"])


def test_fill_and_drain_overlap_between_folds_by_hand():
    # 2 x 2 weight-stationary array, A 3 x 2, B 2 x 4: two column folds of 3 vectors. Not overlapped: each fold
    # streams 3, fills and drains 2 + 2 - 2, and (weights double-buffered) the first tile shifts in: 2 x 5 + 2.
    # Overlapped: the second fold's vectors enter right behind the first's (3 >= 2 cycles: its tile has shifted in
    # meanwhile), fill and drain once: 2 x 3 + 2 + 2.
    npu = dataclasses.replace(load_npu("tpu-v1"), array_rows=2, array_cols=2, array_formats={})
    assert array_cycles(3, 4, 2, dataclasses.replace(npu, fold_overlap=False))[0] == 12
    assert array_cycles(3, 4, 2, dataclasses.replace(npu, fold_overlap=True))[0] == 10
    # a fold shorter than a tile's shift waits for it: 1 vector per fold, R = 2 cycles per fold
    assert array_cycles(1, 4, 2, dataclasses.replace(npu, fold_overlap=True))[0] == 2 * 2 + 2 + 2


def test_loads_that_are_not_double_buffered_add_to_the_computation():
    base = dataclasses.replace(load_npu("tpu-v1"), dram_gb_s=1.0)
    w = _int8_gemv()
    over = estimate(w, base)
    serial = estimate(w, dataclasses.replace(base, dram_overlap=False))
    assert over.cycles == pytest.approx(max(over.compute_cycles, over.onchip_cycles, over.dram_cycles)
                                        + over.latency_cycles)
    assert serial.cycles == pytest.approx(max(serial.compute_cycles, serial.onchip_cycles) + serial.dram_cycles
                                          + serial.latency_cycles)
    assert serial.cycles > over.cycles


def test_layer_pipelining_hides_weight_loads_behind_the_kernel_before():
    class TwoLayers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(512, 512), torch.nn.Linear(512, 512)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    prog = npu_compiler.compile(export_ir(TwoLayers, [torch.empty(512, 512)]), "cpu", dtype="float16")
    npu = dataclasses.replace(load_npu("edge-4tops"), dram_gb_s=100.0)  # compute-bound layers: DRAM idles
    plain = estimate_program(prog, npu, number_format="int8")
    piped = estimate_program(prog, npu, number_format="int8", pipeline=True)
    assert [k.kind for k in prog.kernels] == ["gemm", "generated", "gemm"]
    second = piped.kernels[2].est
    # its 512 x 512 int8 weights and 512 biases (2627 cycles at 100 GB/s and 1 GHz) load while the ReLU kernel runs,
    # so its first tile does not wait for DRAM: the latency (120 ns) is gone, the rest was compute-bound anyway
    assert second.detail["prefetched_cycles"] == pytest.approx((512 * 512 + 512) / 100e9 * 1e9)
    assert second.cycles == pytest.approx(plain.kernels[2].est.cycles - 120.0)
    assert piped.kernels[0].est.cycles == plain.kernels[0].est.cycles  # nothing before the first kernel
    assert piped.dram_bytes == plain.dram_bytes and "pipelining" in piped.notes[-1]


@pytest.mark.parametrize("layer, active, slots", [
    # AlexNet CONV1 (R 11, E 55): one 11-row set, in segments of 14 output rows: 11 x 14 PEs
    (RSLayer(4, 96, 3, 11, 11, 55, 55, 227), 154, 1),
    # CONV2 (R 5, E 27): two segments (14 + 13) side by side in the 12 rows: 5 x 27 PEs
    (RSLayer(4, 256, 48, 5, 5, 27, 27, 31), 135, 2),
    # CONV3 (R 3, E 13): four 3 x 13 sets: 156 PEs
    (RSLayer(4, 384, 256, 3, 3, 13, 13, 15), 156, 4),
    # VGG-16 CONV1-1 (R 3, E 224): four sets of 3 x 14 segments fill the array
    (RSLayer(3, 64, 3, 3, 3, 224, 224, 226), 168, 4),
    # a fully connected layer (R = S = E = 1): every PE holds a (filter, channel) pair
    (RSLayer(1, 4096, 9216, 1, 1, 1, 4, 4), 168, 168),
])
def test_row_stationary_mapping(layer, active, slots):
    eyeriss = load_npu("eyeriss")
    m = rs_map(layer, eyeriss, 2, 2)
    assert (m.active_pes, m.slots) == (active, slots)
    macs = layer.n * layer.m * layer.c * layer.r * layer.s * layer.e * layer.f
    segments = -(-layer.e // min(layer.e, 14))
    assert m.cycles == -(-layer.n * layer.m * layer.c * segments // slots) * layer.f * layer.s
    assert macs / (168 * m.cycles) <= active / 168 + 1e-9  # never more work than the active PEs can do


def test_eyeriss_conv_runs_row_stationary():
    conv = ConvWork(4, 256, 13, 13, 384, 3, 3, 13, 13, Operand(4 * 256 * 169 * 2),
                    Operand(384 * 256 * 9 * 2, constant=True), Operand(4 * 384 * 169 * 2), (1, 1), (1, 1),
                    dtypes=("int16", "int16"), out_dtype="int16")
    eyeriss = load_npu("eyeriss")
    e = estimate(conv, eyeriss)
    assert e.detail["active_pes"] == 156 and e.detail["order"] == "RS"
    assert e.compute_cycles == (4 * 384 * 256 // 4) * 13 * 3  # 98,304 units of 13 x 3 MACs, 4 at a time
    # the filters load during the computation (prefetched into the global buffer), the inputs and outputs stop it
    assert 0 < e.constant_dram_cycles < e.dram_cycles
    acts = e.dram_cycles - e.constant_dram_cycles
    assert e.cycles == pytest.approx(max(e.compute_cycles, e.onchip_cycles, e.constant_dram_cycles) + acts
                                     + e.latency_cycles)
    # without the filter prefetch every transfer adds to the computation
    plain = estimate(conv, dataclasses.replace(eyeriss, weights_prefetched=False))
    assert plain.cycles == pytest.approx(max(e.compute_cycles, e.onchip_cycles) + e.dram_cycles + e.latency_cycles)
    # every input, weight and output crosses the link at least once
    assert e.dram_bytes >= conv.x.bytes + conv.weight.bytes + conv.out.bytes
