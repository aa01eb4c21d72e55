"""On-chip residency per tensor (npu_compiler/npu/residency.py): small programs whose DRAM traffic per kernel is
worked out by hand for activation buffers that hold everything, force a spill, or hold nothing."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import export_ir

import npu_compiler
from npu_compiler.npu import estimate_program, load_npu
from npu_compiler.npu.residency import plan_residency

S = 16 * 64 * 4  # bytes of every tensor below: float32 [16, 64]


def _program(forward):
    module = type("M", (torch.nn.Module,), {"forward": lambda self, x: forward(x)})
    return npu_compiler.compile(export_ir(module, [torch.empty(16, 64)]), "cpu", fusion=False)


def _traffic(prog, capacity):
    npu = dataclasses.replace(load_npu("tpu-v1"), activation_buffer_kib=capacity / 1024)
    return [k.est.dram_bytes for k in estimate_program(prog, npu).kernels]


def chain(x):
    a = torch.relu(x)  # k0: reads x (input), writes a
    b = a * 2  # k1: reads a, writes b
    return b + a  # k2: reads b and a, writes the output


@pytest.mark.parametrize("capacity, expected", [
    # everything fits: x read and the output written, a and b never leave the chip
    (4 * S, [S, 0, S]),
    # two tensors and a staging share fit: a and b stay from k0/k1 to their first use; at k2 the output needs its
    # staging, so a cannot stay to its second use: k1 spills it (S) and k2 reads it back (S)
    (2 * S, [S, S, 2 * S]),
    # a tensor and its staging do not fit: every operand streams from DRAM
    (S, [2 * S, 2 * S, 3 * S]),
])
def test_a_chain_by_hand(capacity, expected):
    prog = _program(chain)
    assert [k.group for k in prog.kernels] == ["relu.default", "mul.Tensor", "add.Tensor"]
    assert _traffic(prog, capacity) == expected


def test_the_spill_is_the_kernel_after_which_the_tensor_leaves():
    prog = _program(chain)
    plan = plan_residency(prog, 2 * S)
    a = prog.kernels[0].outs[0].buffer
    assert [p.spilled for p in plan.kernels] == [(), (a,), ()]
    assert plan.kernels[2].reads_on_chip == {prog.kernels[1].outs[0].buffer}  # b, not a
    assert (plan.resident_tensors, plan.spilled_tensors) == (2, 1)


def test_an_input_read_twice_stays_after_its_first_load():
    def twice(x):
        a = torch.relu(x)  # k0 reads x from DRAM
        b = a * 2  # k1
        return b + x  # k2 reads x again: on chip if it stayed

    prog = _program(twice)
    # all fits: x loaded once (k0), a and b on chip, the output written: S, 0, S
    assert _traffic(prog, 8 * S) == [S, 0, S]
    # nothing fits: x is read twice from DRAM
    assert _traffic(prog, S) == [2 * S, 2 * S, 3 * S]


def test_an_output_read_later_is_written_once_and_kept():
    def out_then_used(x):
        a = torch.relu(x)  # k0: a is a graph output and k1's operand
        return a, a * 2  # k1 writes a second output

    prog = _program(out_then_used)
    # k0 reads x and writes a to DRAM (an output) while keeping it; k1 reads a on chip and writes its output
    assert _traffic(prog, 8 * S) == [2 * S, S]
    assert _traffic(prog, S) == [2 * S, 2 * S]


def test_forced_policies_bound_the_plan():
    prog = _program(chain)
    npu = dataclasses.replace(load_npu("tpu-v1"), activation_buffer_kib=2 * S / 1024)
    planned = estimate_program(prog, npu).dram_bytes
    assert estimate_program(prog, npu, arena_on_chip=True).dram_bytes == 2 * S <= planned
    assert estimate_program(prog, npu, arena_on_chip=False).dram_bytes == 7 * S >= planned
