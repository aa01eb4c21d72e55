"""Row kernels that store a side output (`GeneratedKernel.side`): a pending elementwise result that a norm reads at
its own elements and a later kernel reads too is written by the norm, not by a pass of its own; on cuda a cuBLAS
GEMM's residual epilogue is left pending for it (`CodegenTarget.gemm_epilogue_apart`). The program must give the
unfused one's bits and PyTorch's result within the dtype's tolerance; a record whose side output does not fit its
kernel is refused with what is wrong."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from fused_cases import TORCH_DTYPES, ir_dict
from gpu.util import to_np
from tolerances import assert_close

import npu_compiler
import npu_runtime
from npu_compiler.kernels import GeneratedKernel
from npu_compiler.targets.cuda import CudaTarget
from npu_compiler.targets.cuda.target import SourceLaunch
from npu_export.cnn import model_tensors

CPU = npu_runtime.get_backend("cpu")


class ResidualNorm(torch.nn.Module):
    """A pre-norm block's residual stream: h = x + y; y2 = lin(rmsnorm(h)); out = h + y2 (h read by the norm and by
    the second add)."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.lin = torch.nn.Linear(d, d, bias=False)
        self.eps = eps

    def forward(self, x, y):
        h = x + y
        v = h.to(torch.float32)
        v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + self.eps)
        return h + self.lin(self.weight * v.to(h.dtype))


class LinearNormStream(torch.nn.Module):
    """Two residual linears, each followed by a LayerNorm that reads the sum the next residual add reads again."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.a = torch.nn.Linear(d, d)
        self.b = torch.nn.Linear(d, d)
        self.na = torch.nn.LayerNorm(d)
        self.nb = torch.nn.LayerNorm(d)

    def forward(self, x):
        h = self.a(x) + x
        h2 = self.b(self.na(h)) + h
        return self.nb(h2)


def _module(cls, d: int, dtype: str) -> torch.nn.Module:
    torch.manual_seed(d)
    m = cls(d)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape) * (d ** -0.5 if p.dim() == 2 else 0.5) + (1.0 if p.dim() == 1 else 0.0))
    return m.to(TORCH_DTYPES[dtype]).eval()


def _run(program, module, args) -> np.ndarray:
    weights = npu_runtime.load_weights(program, model_tensors(module), CPU)
    feeds = {s.name: to_np(a) for s, a in zip(program.inputs, args, strict=True)}
    return CPU.create_executor(program).run_numpy(feeds, weights)[program.outputs[0].name]


def _sides(program) -> list:
    return [k for k in program.kernels if isinstance(k.spec, GeneratedKernel) and k.spec.side is not None]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_norm_writes_the_sum_it_reads(dtype) -> None:
    module = _module(ResidualNorm, 96, dtype)
    gen = torch.Generator().manual_seed(1)
    args = [torch.randn((3, 40, 96), generator=gen).to(TORCH_DTYPES[dtype]) for _ in range(2)]
    ir = ir_dict(module, args, "residual_norm")
    fused = npu_compiler.compile(ir, "cpu", dtype=dtype)
    apart = npu_compiler.compile(ir, "cpu", dtype=dtype, disable_passes=["elementwise_fusion"])
    (norm,) = _sides(fused)
    assert len(norm.outs) == 2 and norm.spec.row_dims == 1 and not _sides(apart)
    assert len(fused.kernels) < len(apart.kernels), ([k.name for k in fused.kernels], [k.name for k in apart.kernels])
    got = _run(fused, module, args)
    np.testing.assert_array_equal(got, _run(apart, module, args))  # the sum rounded where the graph rounds it
    with torch.no_grad():
        ref = module(*args)
    assert_close(got.astype(np.float32), ref.float().numpy(), dtype, "accumulate", "cpu", what=f"residual norm {dtype}")


def test_cuda_leaves_cublas_residual_epilogues_to_the_norms() -> None:
    """On cuda (more rows than a GEMV takes), each residual linear is a bare cuBLAS GEMM and the LayerNorm after it
    stores the sum the next add reads; the rendered norm stores both outputs, each 16 bytes at a time."""
    module = _module(LinearNormStream, 256, "bfloat16")
    x = torch.randn((300, 256)).to(torch.bfloat16)
    program = npu_compiler.compile(ir_dict(module, [x], "linear_norms"), "cuda", dtype="bfloat16")
    gemms = [k for k in program.kernels if k.kind == "gemm"]
    assert len(gemms) == 2 and all(k.spec.epilogue is None for k in gemms)
    (side,) = _sides(program)  # the last norm's sum is read by nothing after it: not stored
    assert side.outs[1].buffer not in {g.outs[0].buffer for g in gemms}
    rendered = CudaTarget(90).render_program(program)
    (launch,) = rendered.steps[program.kernels.index(side)]
    assert isinstance(launch, SourceLaunch) and launch.launch.ptrs[:2] == [("out", 0), ("out", 1)]
    text = rendered.sources[launch.source]
    assert "out1" in text and "reinterpret_cast<uint4*>(&out1[" in text
    # every GEMM step is cuBLAS alone (no epilogue launch after it)
    for g in gemms:
        steps = rendered.steps[program.kernels.index(g)]
        assert [type(s).__name__ for s in steps][-1] == "Cublas", steps


def test_side_output_survives_the_artifact(tmp_path) -> None:
    module = _module(ResidualNorm, 64, "float32")
    args = [torch.randn((2, 17, 64)) for _ in range(2)]
    program = npu_compiler.compile(ir_dict(module, args, "residual_norm"), "cpu", dtype="float32")
    path = tmp_path / "m.npubin"
    program.save(path)
    loaded = npu_compiler.CompiledProgram.load(path)
    assert [k.spec for k in loaded.kernels] == [k.spec for k in program.kernels] and _sides(loaded)
    np.testing.assert_array_equal(_run(loaded, module, args), _run(program, module, args))


def test_a_side_output_that_does_not_fit_is_refused() -> None:
    module = _module(ResidualNorm, 64, "float32")
    args = [torch.randn((2, 17, 64)) for _ in range(2)]
    program = npu_compiler.compile(ir_dict(module, args, "residual_norm"), "cpu", dtype="float32")
    (k,) = _sides(program)
    buffers = program.buffers
    cases = {
        "row kernel": dataclasses.replace(k.spec, row_dims=0),
        "elementwise": dataclasses.replace(k.spec, side=k.spec.expr),  # has the norm's reduction in it
    }
    for what, spec in cases.items():
        with pytest.raises(ValueError, match=what):
            spec.check(dataclasses.replace(k, spec=spec), buffers)
    with pytest.raises(ValueError, match="side output"):
        k.spec.check(dataclasses.replace(k, outs=k.outs[:1]), buffers)
    with pytest.raises(ValueError, match="shares the output's buffer"):
        k.spec.check(dataclasses.replace(k, outs=[k.outs[0], k.outs[0]]), buffers)
