"""The hardware mechanisms the silicon presets describe, each against a reference worked out independently of the
model: Eyeriss's run-length coding of activations on its DRAM link (against an encoder written here from the
paper's description), its zero gating of the PE datapath, the partial sums' networks that bound its array when a
layer takes many passes over its channels (worked by hand), the energy of every cycle (clock, control, leakage),
and the TPU's weights moved as whole 256 x 256 tiles (against the paper's own 600 x 600 example).

References: Chen et al., "Eyeriss", IEEE JSSC 2017, sections IV-B (run-length coding, Fig. 8) and V-C (data gating);
Jouppi et al., "In-Datacenter Performance Analysis of a Tensor Processing Unit", ISCA 2017, section 7.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from conftest import export_ir

import npu_compiler
from npu_compiler.npu import ConvWork, GemmWork, Operand, estimate, estimate_program, load_npu
from npu_compiler.npu.model import rlc_ratio


def _encoded_bits(values: np.ndarray, max_run: int = 31, pairs_per_word: int = 3, word_bits: int = 64) -> int:
    """Eyeriss's run-length code, as section IV-B describes it: zeros before a value are counted as the pair's run
    (5 bits, at most 31); a run that reaches 31 with another zero next is closed by a pair whose value is that zero;
    three pairs (and a last-word flag) fill a 64-bit word. Returns the coded bits, whole words."""
    pairs = run = 0
    for v in values:
        if v == 0 and run < max_run:
            run += 1
        else:
            pairs += 1
            run = 0
    pairs += run > 0  # the trailing zeros: one more pair
    return -(-pairs // pairs_per_word) * word_bits


@pytest.mark.parametrize("zeros", [0.0, 0.387, 0.776, 0.97])
def test_run_length_coding_matches_an_encoder(zeros):
    rng = np.random.default_rng(7)
    values = (rng.random(200_000) >= zeros).astype(np.int16)
    coded = _encoded_bits(values) / (16 * values.size)
    expected = rlc_ratio(float((values == 0).mean()), 2, load_npu("eyeriss"))
    assert coded == pytest.approx(expected, rel=0.01)
    if zeros == 0.0:
        assert expected == pytest.approx(64 / 3 / 16)  # nothing to gain: a pair a value, 21.3 bits for 16


def _relu_program():
    ir = export_ir(lambda: torch.nn.ReLU(), [torch.empty(4, 64, 32, 32)])
    return npu_compiler.compile(ir, "cpu", dtype="float16")


def test_named_activations_move_coded_on_eyeriss_and_dense_elsewhere():
    prog = _relu_program()
    x, y = (b.name for b in prog.buffers if b.kind in ("input", "output"))
    eyeriss, dense = load_npu("eyeriss"), load_npu("edge-4tops")
    nbytes = 4 * 64 * 32 * 32 * 2
    coded = estimate_program(prog, eyeriss, zeros={x: 0.5, y: 0.75})
    plain = estimate_program(prog, eyeriss)
    assert plain.dram_bytes == 2 * nbytes
    assert coded.dram_bytes == pytest.approx(nbytes * (rlc_ratio(0.5, 2, eyeriss) + rlc_ratio(0.75, 2, eyeriss)),
                                             abs=1)
    assert estimate_program(prog, dense, zeros={x: 0.5, y: 0.75}).dram_bytes == 2 * nbytes  # no coding there
    with pytest.raises(ValueError, match="no tensor named 'nope'"):
        estimate_program(prog, eyeriss, zeros={"nope": 0.5})
    with pytest.raises(ValueError, match="between 0 and 1"):
        estimate_program(prog, eyeriss, zeros={x: 1.5})


def test_zero_gating_saves_the_mac_and_the_weight_read_of_zero_inputs():
    eyeriss = load_npu("eyeriss")

    def conv(zeros):
        return ConvWork(1, 64, 13, 13, 64, 3, 3, 13, 13, Operand(64 * 169 * 2, zeros=zeros, elem=2),
                        Operand(64 * 64 * 9 * 2, constant=True), Operand(64 * 169 * 2), (1, 1), (1, 1),
                        dtypes=("int16", "int16"), out_dtype="int16")

    dense, gated = estimate(conv(None), eyeriss), estimate(conv(0.5), eyeriss)
    macs = 64 * 64 * 9 * 169
    assert gated.energy_pj["mac"] == pytest.approx(0.5 * macs * eyeriss.mac_pj)
    # each MAC reads an input, a weight and a partial sum from its scratchpads and writes the sum back (2 bytes
    # each); a zero input skips the weight read
    assert dense.register_bytes == macs * 8 and gated.register_bytes == macs * 8 - 0.5 * macs * 2
    assert gated.compute_cycles == dense.compute_cycles  # gating saves energy, not time (the coded input moves less)
    assert estimate(conv(0.5), dataclasses.replace(eyeriss, zero_gating=False)).energy_pj["mac"] == \
        pytest.approx(dense.energy_pj["mac"])


def test_partial_sums_bound_a_row_stationary_array_through_their_networks():
    """AlexNet's CONV3 at batch 4 on Eyeriss, by hand: a PE interleaves q = 12 // 3 = 4 channels (its 12-entry
    input scratchpad holds a 3-wide window of each), so every partial sum that leaves a 3 x 3 filter's PE column
    carries R S q = 36 MACs, and 256 channels take 64 passes. The partial sums' networks carry four 16-bit sums a
    cycle each way, so the array does at most 4 x 36 = 144 MACs a cycle, fewer than its 156 active PEs: 598 M MACs
    take 4,153,344 cycles, 20.8 ms at 200 MHz (Table V: 21.8 ms of processing). Without the networks' limit the
    layer is compute-bound at 98,304 waves of 13 x 3 cycles. A product (a fully connected layer) likewise."""
    eyeriss = load_npu("eyeriss")
    conv = ConvWork(4, 256, 15, 15, 384, 3, 3, 13, 13, Operand(4 * 256 * 225 * 2, elem=2),
                    Operand(384 * 256 * 9 * 2, constant=True), Operand(4 * 384 * 169 * 2), (1, 1), (0, 0),
                    dtypes=("int16", "int16"), out_dtype="int16")
    e = estimate(conv, eyeriss)
    macs = 4 * 384 * 256 * 9 * 169
    assert e.macs == macs and e.detail["psum_passes"] == 64
    assert e.compute_cycles == 98_304 * 13 * 3
    assert e.onchip_cycles == pytest.approx(macs / (4 * 36)) == 4_153_344
    assert e.bound == "on-chip"
    unlimited = estimate(conv, dataclasses.replace(eyeriss, psum_bytes_per_cycle=0.0))
    assert unlimited.bound == "compute" and unlimited.onchip_cycles < e.compute_cycles

    # A product on the same array is 1 x 1 convolutions: a PE interleaves 12 channels (one input entry each), so a
    # partial sum carries 12 MACs and the networks cap the array at 48 MACs a cycle: 1024 x 256 x 240 MACs in 20
    # passes of 1024 x 256 partial sums, 1,310,720 cycles.
    gemm = GemmWork(1024, 256, 240, Operand(1024 * 240 * 2), Operand(240 * 256 * 2, constant=True),
                    Operand(1024 * 256 * 2), dtypes=("int16", "int16"), out_dtype="int16")
    e = estimate(gemm, eyeriss)
    assert e.onchip_cycles == pytest.approx(1024 * 256 * 240 / 48) == 1_310_720 and e.bound == "on-chip"
    assert estimate(gemm, dataclasses.replace(eyeriss, psum_bytes_per_cycle=0.0)).onchip_cycles < 1_310_720


def test_every_cycle_costs_the_static_energy():
    eyeriss = load_npu("eyeriss")
    est = estimate_program(_relu_program(), eyeriss)
    for k in est.kernels:
        assert k.est.energy_pj["static"] == pytest.approx(k.est.cycles * eyeriss.static_pj_per_cycle)
    # Eyeriss: 45% of the 278 mW it drew on AlexNet at 200 MHz (JSSC 2017, section VI-A)
    assert eyeriss.static_pj_per_cycle * 200e6 * 1e-12 == pytest.approx(0.45 * 0.278, rel=0.01)


def test_tpu_weights_move_as_whole_tiles_as_the_papers_600_by_600_example():
    """ISCA 2017, section 7: "Consider the 600x600 matrix used in LSTM1. With a 256x256 matrix unit, it takes 9 steps
    to tile 600x600, for a total of 18 us of time." """
    ir = export_ir(lambda: torch.nn.Linear(600, 600, bias=False), [torch.empty(96, 600)])
    prog = npu_compiler.compile(ir, "cpu", dtype="float16")
    tpu = load_npu("tpu-v1")
    (k,) = estimate_program(prog, tpu, number_format="int8").kernels
    tile_bytes = k.est.constant_dram_cycles / tpu.clock_hz * tpu.dram_gb_s * 1e9
    assert tile_bytes == pytest.approx(9 * 256 * 256)  # nine int8 tiles, the edge ones padded
    assert k.est.constant_dram_cycles / tpu.clock_hz == pytest.approx(18e-6, rel=0.05)  # 9 x 1.93 us at 34 GB/s
    unpadded = estimate_program(prog, dataclasses.replace(tpu, whole_weight_tiles=False), number_format="int8")
    assert unpadded.kernels[0].est.constant_dram_cycles == pytest.approx(k.est.constant_dram_cycles * 600**2
                                                                         / (9 * 256**2))


def test_cli_zeros_option(tmp_path, capsys):
    from npusim.cli import main

    prog = _relu_program()
    x, y = (b.name for b in prog.buffers if b.kind in ("input", "output"))
    art = tmp_path / "relu.npubin"
    prog.save(art)
    eyeriss, nbytes = load_npu("eyeriss"), 4 * 64 * 32 * 32 * 2

    def dram(*zeros: str) -> float:
        assert main(["estimate", str(art), "--npu", "eyeriss", "--json", *(f"--zeros={z}" for z in zeros)]) == 0
        return json.loads(capsys.readouterr().out)["totals"]["dram_bytes"]

    assert dram() == 2 * nbytes
    # a bare fraction: every tensor the program computes (the output), not its input
    assert dram("0.75") == pytest.approx(nbytes * (1 + rlc_ratio(0.75, 2, eyeriss)), abs=1)
    assert dram("0.75", f"{x}=0.5") == pytest.approx(
        nbytes * (rlc_ratio(0.5, 2, eyeriss) + rlc_ratio(0.75, 2, eyeriss)), abs=1)
    for bad, says in (("1.5", "between 0 and 1"), ("nope=0.5", "no tensor named 'nope'"), ("=0.5", "no tensor name"),
                      ("half", "expected FRACTION or NAME=FRACTION")):
        assert main(["estimate", str(art), "--npu", "eyeriss", f"--zeros={bad}"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("npusim estimate: error: --zeros: ") and says in err and err.count("\n") == 1, err
    assert dram(f"{y}=0.75") == dram("0.75")
