"""The weight-only GEMV's folds on the GPU (tests/wgemm_folds.py's layer: norm prologues, SiLU * up over column
groups, residual epilogues): against PyTorch on the dequantized weights within the bf16 tolerance, and against the
CPU reference of the same records within a few bf16 ulps (a float32 sum in another order rounds to bf16 the other way
here and there, and the layer's second half reads that)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from wgemm_folds import assert_close_bf16, folds, make_layer, reference, run

from npu_runtime.cpu.backend import CpuBackend

SIZES = [(256, 384), (512, 5120)]  # small; larger (K split over warps, two rounds of column tiles a block)


@pytest.mark.parametrize("h,inter", SIZES, ids=[f"{h}x{i}" for h, i in SIZES])
@pytest.mark.parametrize("wd,bits", [("int8", 8), ("int4", 4)])
def test_folded_wgemv_on_cuda(cuda_backend, wd, bits, h, inter):
    x = torch.randn(1, 1, h, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    layer = make_layer(bias=bits == 8, h=h, inter=inter)
    got, program = run(layer, x, wd, "cuda", cuda_backend)
    assert folds(program) == {"prologue": 2, "groups": 1, "epilogue": 3, "wgemm": 4}
    assert_close_bf16(got, reference(layer, x, bits))
    spec, _ = run(layer, x, wd, "cuda", CpuBackend())
    for g, s in zip(got, spec, strict=True):
        np.testing.assert_allclose(g, s, rtol=2 ** -7, atol=2 ** -7 * np.abs(s).max())
