"""The weight-only GEMM's folds (`wgemm` prologue, column groups, epilogue) as the cuda target's lowering makes them,
their CPU reference (the spec) against PyTorch on the dequantized weights, and the cuda kernels' sources through
NVRTC (tests/gpu/test_wgemm_folds_cuda.py runs them)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from wgemm_folds import assert_close_bf16, folds, make_layer, reference, run

from npu_runtime.cpu.backend import CpuBackend

X = torch.randn(1, 1, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)


@pytest.mark.parametrize("wd,bits", [("int8", 8), ("int4", 4)])
def test_folded_records_reference_matches_pytorch(wd, bits):
    """Compiled for cuda (norms in the projections' prologues, SiLU * up over column groups, residual epilogues) and
    run by the CPU reference: PyTorch's layer on the dequantized weights, within the bf16 tolerance; and the records
    without folds (the cpu target's program) within a few bf16 ulps of it."""
    layer = make_layer(bias=bits == 8)
    got, program = run(layer, X, wd, "cuda", CpuBackend())
    assert folds(program) == {"prologue": 2, "groups": 1, "epilogue": 3, "wgemm": 4}
    want = reference(layer, X, bits)
    assert_close_bf16(got, want)
    plain, cpu_program = run(layer, X, wd, "cpu", CpuBackend())
    assert folds(cpu_program)["prologue"] == 0
    for g, p in zip(got, plain, strict=True):
        np.testing.assert_allclose(g, p, rtol=2 ** -7, atol=2 ** -7 * np.abs(p).max())


def test_cuda_program_has_as_many_kernels_as_bf16():
    """The weight-only program launches what the bf16 one does: the norms and SiLU * up fold alike."""
    from conftest import export_ir
    from wgemm_folds import Layer

    import npu_compiler

    ir = export_ir(Layer, [X])
    counts = {wd: len(npu_compiler.compile(ir, "cuda", dtype="bfloat16", weights_dtype=wd).kernels)
              for wd in (None, "int8", "int4")}
    assert counts["int8"] == counts["int4"] == counts[None], counts


def test_a_prologue_the_gemv_cannot_hold_is_not_folded():
    """K not a multiple of a 16-byte chunk of codes: the norm stays a kernel, the wgemm reads its rows."""
    from wgemm_folds import Layer

    class Odd(Layer):
        def __init__(self, bias: bool = False) -> None:
            super().__init__(h=200, inter=120, bias=bias)

    from conftest import export_ir

    import npu_compiler

    x = torch.randn(1, 1, 200).to(torch.bfloat16)
    program = npu_compiler.compile(export_ir(Odd, [x]), "cuda", dtype="bfloat16", weights_dtype="int8")
    assert folds(program)["prologue"] == 0 and folds(program)["groups"] == 0


def test_folded_wgemm_sources_compile_with_nvrtc():
    from helpers import assert_waits_first

    from npu_compiler.targets.cuda import CudaTarget, nvrtc
    from npu_compiler.targets.cuda.common import WEIGHTS_BEGIN

    if not nvrtc.available():
        pytest.skip("NVRTC is absent (the project's cuda extra installs it)")
    from conftest import export_ir
    from wgemm_folds import Layer

    import npu_compiler

    ir = export_ir(lambda: Layer(bias=True), [X])
    target = CudaTarget("h200")
    ptxas = nvrtc.ptxas_path()
    seen = 0
    for wd in ("int8", "int4"):
        program = npu_compiler.compile(ir, "cuda", dtype="bfloat16", weights_dtype=wd)
        for k in program.kernels:
            if k.kind != "wgemm":
                continue
            for text in target.kernel_sources(k, program):
                # decoded in registers without conversions; the first weights loaded before the wait, nothing else
                assert "__byte_perm" in text and WEIGHTS_BEGIN in text
                assert_waits_first(text)
                ptx = nvrtc.compile_source(text, "compute_90", name=f"{k.name}.cu")
                if ptxas:
                    nvrtc.ptxas_check(ptx, "sm_90")
                seen += 1
    assert seen == 8


def _records(wd: str):
    from conftest import export_ir
    from wgemm_folds import Layer

    import npu_compiler

    program = npu_compiler.compile(export_ir(Layer, [X]), "cuda", dtype="bfloat16", weights_dtype=wd)
    return program, [k for k in program.kernels if k.kind == "wgemm"]


def test_a_folded_record_that_does_not_fit_its_call_is_refused():
    """A record's folds are checked against its call: column groups without an epilogue, a prologue of another dtype
    than the output, a prologue reading the codes."""
    import dataclasses

    from npu_compiler.expr import nodes as Xn

    program, ks = _records("int8")
    grouped = next(k for k in ks if k.spec.acc_groups > 1)
    pro = next(k for k in ks if k.spec.prologue is not None and k.spec.acc_groups == 1)
    for spec, match in [
        (dataclasses.replace(grouped.spec, epilogue=None), "needs an epilogue"),
        (dataclasses.replace(pro.spec, prologue=Xn.Cast("float32", pro.spec.prologue)), "prologue of dtype float32"),
        (dataclasses.replace(pro.spec, prologue=Xn.Load("bfloat16", 0, (0, 1), 0)), "reads argument 0"),
    ]:
        with pytest.raises(ValueError, match=match):
            spec.check(dataclasses.replace(grouped if spec.acc_groups > 1 else pro, spec=spec), program.buffers)


def test_the_cuda_fallback_refuses_a_fold_it_cannot_compute():
    """The element-at-a-time wgemm (codes not in 16-byte rows) computes no prologue: refused by name, not rendered
    wrong."""
    import dataclasses

    from npu_compiler.errors import NPUCompileError
    from npu_compiler.targets.cuda import CudaTarget

    program, ks = _records("int8")
    pro = next(k for k in ks if k.spec.prologue is not None)
    q = pro.args[0]
    odd = dataclasses.replace(q, strides=(q.strides[0], 2))  # codes no longer contiguous along K
    call = dataclasses.replace(pro, args=[odd, *pro.args[1:]])
    with pytest.raises(NPUCompileError, match="prologue or column groups only in its GEMV"):
        CudaTarget("h200").kernel_sources(call, program)
