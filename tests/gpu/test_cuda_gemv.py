"""Decode GEMVs (targets/cuda/gemv.py) against PyTorch eager on the CPU in the same dtype: a few rows times a weight
matrix with its bias and a residual add in the epilogue, in the shapes that choose each layout: one warp per column
(a wide projection), each column's row split over 2, 4 or 8 warps (few columns, long rows: a decode step's down
projection), and a row length that 16-byte loads do not tile (the scalar loop, split the same way). The same GEMVs
computing their operand in a prologue: an RMSNorm (a row reduction) and SiLU-times-up (elementwise). GEMVs whose
epilogue combines two column groups (act(a) * b over the halves of one projection)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fused_cases import TORCH_DTYPES, ir_dict
from helpers import GatedLinear, GluProjection, LinearResidual, MatmulOfInputs, NormLinear
from tolerances import assert_close

import npu_compiler
import npu_runtime
from npu_compiler.targets.cuda import gemv as G
from npu_export.cnn import model_tensors

from .util import rendered_for, to_np

SHAPES = [(1, 4096, 64), (3, 1536, 2048), (1, 8960, 1536), (1, 64, 20000), (2, 1001, 64), (8, 512, 300)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("m,k,n", SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in SHAPES])
def test_gemv_matches_torch(m, k, n, dtype, cuda_backend) -> None:
    tdt = TORCH_DTYPES[dtype]
    gen = torch.Generator().manual_seed(k + n)
    module = LinearResidual(k, n)
    with torch.no_grad():
        module.lin.weight.copy_(torch.randn((n, k), generator=gen) * k ** -0.5)
        module.lin.bias.copy_(torch.randn((n,), generator=gen))
    module = module.to(tdt).eval()
    args = [torch.randn((m, k), generator=gen).to(tdt), torch.randn((m, n), generator=gen).to(tdt)]
    program = npu_compiler.compile(ir_dict(module, args, "gemv"), "cuda", dtype=dtype)
    (gemm,) = [c for c in program.kernels if c.kind == "gemm"]
    dev = rendered_for(program, cuda_backend)
    assert G.gemv_applies(gemm, program, dev) and gemm.spec.epilogue is not None, "the GEMV kernel was not chosen"
    _check_against_torch(program, module, args, dtype, cuda_backend,
                         f"{m}x{k}x{n} {dtype}, {G.splits_for(n, k // 8, dev)} warp(s) per column")


def _check_against_torch(program, module, args, dtype: str, backend, what: str) -> None:
    """The program's one output on the GPU against the module's in PyTorch eager (CPU, same dtype)."""
    weights = npu_runtime.load_weights(program, model_tensors(module), backend)
    ex = backend.create_executor(program)
    feeds = {s.name: to_np(a) for s, a in zip(program.inputs, args, strict=True)}
    got = ex.run_numpy(feeds, weights)[program.outputs[0].name]
    with torch.no_grad():
        ref = module(*args)
    assert_close(got.astype(np.float32), ref.float().numpy(), dtype, "accumulate", "cuda", what=what)


PROLOGUE_SHAPES = [(1, 1536, 2048), (1, 8960, 1536), (3, 1001, 300), (8, 512, 130)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("kind", ["rmsnorm", "silu_mul"])
@pytest.mark.parametrize("m,k,n", PROLOGUE_SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in PROLOGUE_SHAPES])
def test_gemv_prologue_matches_torch(m, k, n, kind, dtype, cuda_backend, monkeypatch) -> None:
    """The target folds norms only; an elementwise prologue (which an artifact may hold) is asked for here."""
    from npu_compiler.targets.cuda.target import CudaTarget

    if kind == "silu_mul":
        monkeypatch.setattr(CudaTarget, "gemm_prologue", lambda self, *a: G.prologue_applies(*a[:-1], self.profile))
    tdt = TORCH_DTYPES[dtype]
    gen = torch.Generator().manual_seed(k + n + m)
    module = NormLinear(k, n) if kind == "rmsnorm" else GatedLinear(k, n)
    with torch.no_grad():
        module.lin.weight.copy_(torch.randn((n, k), generator=gen) * k ** -0.5)
        if kind == "rmsnorm":
            module.weight.copy_(1 + 0.1 * torch.randn((k,), generator=gen))
    module = module.to(tdt).eval()
    operands = 1 if kind == "rmsnorm" else 2
    args = [(torch.randn((m, k), generator=gen) * 2).to(tdt) for _ in range(operands)]
    args.append(torch.randn((m, n), generator=gen).to(tdt))
    program = npu_compiler.compile(ir_dict(module, args, "gemv_prologue"), "cuda", dtype=dtype)
    (gemm,) = [c for c in program.kernels if c.kind == "gemm"]
    dev = rendered_for(program, cuda_backend)
    assert len(program.kernels) == 1 and gemm.spec.prologue is not None and G.gemv_applies(gemm, program, dev), \
        [c.name for c in program.kernels]
    assert bool(gemm.spec.prologue_reduce) == (kind == "rmsnorm")
    _check_against_torch(program, module, args, dtype, cuda_backend, f"{m}x{k}x{n} {dtype}, {kind} prologue")


@pytest.mark.parametrize("m", [1, 3])
def test_gemv_of_two_activations_matches_torch(m, cuda_backend) -> None:
    """A GEMV whose matrix is an input (not a weight) waits for the kernel ahead before it loads any of it."""
    gen = torch.Generator().manual_seed(m)
    args = [torch.randn((m, 1536), generator=gen).to(torch.bfloat16),
            (torch.randn((700, 1536), generator=gen) * 0.03).to(torch.bfloat16)]
    module = MatmulOfInputs()
    program = npu_compiler.compile(ir_dict(module, args, "gemv_act"), "cuda", dtype="bfloat16")
    (gemm,) = [c for c in program.kernels if c.kind == "gemm"]
    assert G.gemv_applies(gemm, program, rendered_for(program, cuda_backend))
    _check_against_torch(program, module, args, "bfloat16", cuda_backend, f"{m}x1536x700 activations")


GLU_SHAPES = [(1, 1536, 8960, "silu", False), (3, 1001, 300, "gelu", True), (8, 512, 130, "relu", False),
              (1, 8960, 64, "silu", True)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("m,k,n,act,bias", GLU_SHAPES, ids=[f"{m}x{k}x{n}_{a}{'_bias' if b else ''}"
                                                            for m, k, n, a, b in GLU_SHAPES])
def test_gemv_column_groups_match_torch(m, k, n, act, bias, dtype, cuda_backend) -> None:
    """One GEMV computes both halves and writes act(a) * b: a wide projection, rows 16-byte loads do not tile (the
    scalar loop), 8 rows, and few columns with long rows (each row split over several warps)."""
    tdt = TORCH_DTYPES[dtype]
    gen = torch.Generator().manual_seed(k + n + m)
    module = GluProjection(k, n, act, bias)
    with torch.no_grad():
        module.lin.weight.copy_(torch.randn((2 * n, k), generator=gen) * k ** -0.5)
        if bias:
            module.lin.bias.copy_(torch.randn((2 * n,), generator=gen) * 0.5)
    module = module.to(tdt).eval()
    args = [torch.randn((m, k), generator=gen).to(tdt)]
    program = npu_compiler.compile(ir_dict(module, args, "gemv_glu"), "cuda", dtype=dtype)
    (gemm,) = program.kernels
    assert gemm.spec.acc_groups == 2 and G.gemv_applies(gemm, program, rendered_for(program, cuda_backend))
    _check_against_torch(program, module, args, dtype, cuda_backend, f"{m}x{k}x{n} {act} {dtype}")
