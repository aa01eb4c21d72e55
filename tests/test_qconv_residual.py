"""A qconv2d with a fused residual add (QConv2dKernel.residual) computes what the conv and the qadd compute apart
(the CPU reference of each record, the spec), and the lowering fuses a ResNet block's add into its conv on a target
that computes it in the conv's epilogue (cuda), keeping it a kernel of its own elsewhere (cpu)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from int8_cases import Case, qconv_residual_cases, reference

from npu_compiler.kernels import QAddKernel

CASES = qconv_residual_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fused_add_equals_the_conv_then_the_add(case):
    spec = case.spec
    r = spec.residual
    conv = Case(case.name, dataclasses.replace(spec, residual=None), case.inputs[:4], case.out_shape, r.mid_dtype,
                case.refs[:4])
    mid = reference(conv)
    skip_ref = case.refs[4]
    skip = np.lib.stride_tricks.as_strided(case.inputs[4][1].astype(np.int64).reshape(-1), skip_ref.shape,
                                           [s * 8 for s in skip_ref.strides])
    add = QAddKernel(spec.requant.zero_point, r.b_zero_point, r.left_shift, r.a_multiplier, r.a_shift,
                     r.b_multiplier, r.b_shift, r.out_multiplier, r.out_shift, r.requant)
    apart = reference(Case("add", add, [("a", mid, r.mid_dtype), ("b", np.ascontiguousarray(skip), r.mid_dtype)],
                           case.out_shape, case.out_dtype))
    fused = reference(case)  # (the output buffer as laid out: channels-last for some cases)
    if case.out_strides:
        fused = np.lib.stride_tricks.as_strided(fused.reshape(-1), case.out_shape,
                                                [st * fused.itemsize for st in case.out_strides])
    np.testing.assert_array_equal(fused, apart)
    assert len(np.unique(fused)) > 10  # not saturated to a constant


def _block():
    from test_quant_fold import QConv, _dq, _q

    class Block(torch.nn.Module):
        """A bottleneck's tail: conv -> q, then dq + dq(skip) -> relu -> q (the add PT2E quantizes)."""

        def __init__(self):
            super().__init__()
            self.conv = QConv(16, 32, 1, x_zp=0, out_zp=3)

        def forward(self, x, skip):
            s = _dq(_q(skip, 0.04, -2, torch.int8), 0.04, -2, torch.int8)  # (computed before the conv)
            y = _dq(self.conv(x), 0.05, 3, torch.int8)
            return _q(torch.relu(y + s), 0.06, -1, torch.int8)

    return Block()


def test_cuda_fuses_the_block_add_into_its_conv_and_cpu_does_not():
    from conftest import export_ir

    import npu_compiler

    ir = export_ir(_block, [torch.randn(2, 16, 5, 5), torch.randn(2, 32, 5, 5)])
    cuda = npu_compiler.compile(ir, "cuda")
    kinds = [k.kind for k in cuda.kernels]
    assert "qadd" not in kinds, kinds
    (conv,) = [k for k in cuda.kernels if k.kind == "qconv2d"]
    assert conv.spec.residual is not None and conv.spec.residual.requant.lo == conv.spec.residual.requant.zero_point
    assert {k.kind for k in npu_compiler.compile(ir, "cpu").kernels} >= {"qconv2d", "qadd"}


def test_fused_block_runs_as_the_unfused_one_on_the_cpu_reference():
    """The cuda program's records (the add fused) run by the CPU backend give the cpu program's integers."""
    from conftest import export_ir, to_numpy

    import npu_compiler
    import npu_runtime
    from npu_compiler.program import CompiledProgram
    from npu_runtime.cpu.backend import CpuBackend

    torch.manual_seed(0)
    block = _block().eval()
    x, skip = torch.randn(2, 16, 5, 5), torch.randn(2, 32, 5, 5)
    ir = export_ir(_block, [x, skip])
    state = {k: to_numpy(v) for k, v in {**block.state_dict(), **dict(block.named_buffers())}.items()}
    be = CpuBackend()
    outs = []
    for target in ("cuda", "cpu"):
        program = npu_compiler.compile(ir, target)
        if target == "cuda":  # the same records, retargeted to the reference
            program = CompiledProgram.from_bytes(program.to_bytes())
            program.target = "cpu"
        feeds = {t["name"]: v.numpy() for t, v in zip(ir["graph_inputs"], (x, skip), strict=True)}
        ex = be.create_executor(program)
        outs.append(list(ex.run_numpy(feeds, npu_runtime.load_weights(program, state, be)).values())[0])
    np.testing.assert_array_equal(outs[0], outs[1])
    assert len(np.unique(outs[0])) > 10


def test_a_target_without_the_fused_add_refuses_it_by_name():
    """A crafted webgpu artifact with a fused residual: refused, not computed without the add."""
    from int8_cases import program_of

    from npu_compiler.errors import NPUCompileError
    from npu_compiler.targets.webgpu.int8_kernels import render_integer

    program = program_of(CASES[0], "webgpu")
    with pytest.raises(NPUCompileError, match="fused residual"):
        render_integer(program.kernels[0], program)
