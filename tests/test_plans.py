"""Records say what, plans say how: a kernel record is the computation (the same on every target), its plan the
schedule its target chose on the program's device (kernels/plans.py), stored beside it in the artifact with the
scratch it works in, and checked on load like the record."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

torch = pytest.importorskip("torch")

from fused_cases import ir_dict  # noqa: E402

import npu_compiler  # noqa: E402
from npu_compiler.devices import CHIPS  # noqa: E402
from npu_compiler.errors import ArtifactError  # noqa: E402
from npu_compiler.kernels import AttentionPlan, Conv2dPlan  # noqa: E402
from npu_compiler.program import _HEADER, CompiledProgram  # noqa: E402


class Decode(torch.nn.Module):
    """One decode step's attention over a 4096-key cache, 8 heads of 64 over 2 KV heads (grouped-query)."""

    def forward(self, q, k, v):
        k = k.repeat_interleave(4, dim=1)
        v = v.repeat_interleave(4, dim=1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def _decode_ir() -> dict:
    args = [torch.zeros(1, 8, 1, 64, dtype=torch.bfloat16), torch.zeros(1, 2, 4096, 64, dtype=torch.bfloat16),
            torch.zeros(1, 2, 4096, 64, dtype=torch.bfloat16)]
    return ir_dict(Decode(), args, "decode_attention")


def _conv_ir() -> dict:
    model = torch.nn.Sequential(torch.nn.Conv2d(512, 512, 3, padding=1), torch.nn.ReLU()).eval().half()
    return ir_dict(model, [torch.zeros(1, 512, 7, 7, dtype=torch.float16)], "deep_conv")


def _only(program, kind: str):
    (k,) = [k for k in program.kernels if k.kind == kind]
    return k


def test_the_record_is_the_same_on_every_target_and_device() -> None:
    """An attention of one query row: cpu, webgpu and cuda on three devices build the same record; the plans
    split its keys for each device's multiprocessors (two blocks a multiprocessor), the cpu reference plans
    nothing."""
    ir = _decode_ir()
    calls = {"cpu": _only(npu_compiler.compile(ir, "cpu"), "attention"),
             "webgpu": _only(npu_compiler.compile(ir, "webgpu"), "attention")}
    for device in ("h100", "a100", "l4"):
        calls[device] = _only(npu_compiler.compile(ir, "cuda", device=device), "attention")
    assert len({c.spec for c in calls.values()}) == 1
    assert calls["cpu"].plan is None and not calls["cpu"].scratch
    for device in ("h100", "a100", "l4"):
        plan = calls[device].plan
        # (the repeated K/V make 8 KV heads: splits for two blocks an SM over 8 groups of rows)
        assert isinstance(plan, AttentionPlan) and plan.splits == -(-2 * CHIPS[device].multiprocessors // 8)
        assert len(calls[device].scratch) == 1 and calls[device].scratch[0].numel >= 8 * plan.splits * 66
    assert calls["webgpu"].plan == AttentionPlan(-(-2 * CHIPS["webgpu"].multiprocessors // 8))


def test_conv_splits_are_a_plan() -> None:
    """A deep conv of few tiles: the record is the conv, the plan splits its K (more ways on the A100, whose split
    parts sum through a scratch, than the 8 of a Hopper cluster), the scratch holding one part a split."""
    ir = _conv_ir()
    h100, a100 = (_only(npu_compiler.compile(ir, "cuda", dtype="float16", device=d), "conv2d")
                  for d in ("h100", "a100"))
    cpu = _only(npu_compiler.compile(ir, "cpu", dtype="float16"), "conv2d")
    assert h100.spec == a100.spec and cpu.plan is None
    assert isinstance(h100.plan, Conv2dPlan) and h100.plan.splits == 8 < a100.plan.splits
    assert a100.scratch[0].numel == a100.plan.splits * a100.outs[0].numel


def _payload(program) -> dict:
    return msgpack.unpackb(program.to_bytes()[_HEADER.size:], raw=False)


def _kernel(d: dict, kind: str) -> dict:
    return next(k for k in d["kernels"] if k["kind"] == kind)


@pytest.mark.parametrize("edit,message", [
    (lambda k: k["plan"].update(splits=k["plan"]["splits"] + 1), "split_scratch"),
    (lambda k: k["plan"].update(splits=-1), r"plan\.splits: -1 is outside"),
    (lambda k: k["plan"].update(scratch_extra=5), "split_scratch"),
    (lambda k: k["plan"].update(tile_table=64), "tile table without"),
    (lambda k: k["plan"].update(lanes=4), r"unknown field\(s\) \['lanes'\]"),
    (lambda k: k.update(plan="fast"), "expected a mapping"),
    (lambda k: k.update(plan={"splits": 0, "scratch_extra": 0, "tile_table": 0}),
     "0 scratch buffers, expected 1|1 scratch buffers, expected 0"),
    (lambda k: k.update(scratch=[]), "0 scratch buffers, expected 1"),
    (lambda k: k["scratch"][0].update(offset=10**9), "view reaches element"),
    (lambda k: k.update(plan=None), "scratch buffers without a plan"),
])
def test_a_crafted_plan_is_refused_by_name(edit, message) -> None:
    d = _payload(npu_compiler.compile(_decode_ir(), "cuda"))
    edit(_kernel(d, "attention"))
    with pytest.raises(ArtifactError, match=message):
        CompiledProgram.from_dict(d)


def test_a_plan_that_does_not_fit_its_record_is_refused() -> None:
    """A plan of another kind's fields, or one that computes apart a part its record does not have."""
    d = _payload(npu_compiler.compile(_conv_ir(), "cuda", dtype="float16"))
    gen = next(k for k in d["kernels"] if k["kind"] == "generated")
    gen["plan"] = {"splits": 2}
    with pytest.raises(ArtifactError, match=r"unknown field\(s\) \['splits'\]"):
        CompiledProgram.from_dict(d)
    gen["plan"] = {"side_apart": True}
    with pytest.raises(ArtifactError, match="side output its record does not have"):
        CompiledProgram.from_dict(d)
    conv = _kernel(d, "conv2d")
    conv["plan"]["side_apart"] = True
    gen["plan"] = None
    with pytest.raises(ArtifactError, match="a side conv computed apart by a conv2d without a side conv"):
        CompiledProgram.from_dict(d)
    conv = _kernel(_payload(npu_compiler.compile(_conv_ir(), "cuda", dtype="float16")), "conv2d")
    assert conv["plan"]["splits"] == 8 and len(conv["scratch"]) == 1


def test_plans_round_trip_and_the_cpu_reference_ignores_them() -> None:
    """A cuda program's plans come back from its artifact as they were; the same program's records run on the CPU
    reference (a cuda program's kernels, the cpu target's way: plans and scratch dropped) give the cpu program's
    outputs bit for bit."""
    import ml_dtypes
    import numpy as np

    import npu_runtime

    prog = npu_compiler.compile(_decode_ir(), "cuda")
    back = CompiledProgram.from_bytes(prog.to_bytes())
    assert [(k.plan, k.scratch) for k in back.kernels] == [(k.plan, k.scratch) for k in prog.kernels]
    cpu = npu_compiler.compile(_decode_ir(), "cpu")
    as_cpu = dataclasses.replace(prog, target="cpu", device=None,
                                 kernels=[dataclasses.replace(k, plan=None, scratch=[]) for k in prog.kernels])
    rng = np.random.default_rng(0)
    feeds = {s.name: rng.standard_normal(s.shape).astype(ml_dtypes.bfloat16) for s in cpu.inputs}
    backend = npu_runtime.get_backend("cpu")
    got = [backend.create_executor(p).run_numpy(feeds, None) for p in (cpu, as_cpu)]
    for name in got[0]:
        np.testing.assert_array_equal(np.asarray(got[0][name], np.float32), np.asarray(got[1][name], np.float32))
