"""The weight-only GEMV's folds on the GPU (tests/wgemm_folds.py's layer: norm prologues, SiLU * up over column
groups, residual epilogues): against PyTorch on the dequantized weights within the bf16 tolerance, and against the
CPU reference of the same records within a few bf16 ulps."""

from __future__ import annotations

import pytest
from wgemm_folds import check_layer

SIZES = [(256, 384), (512, 5120)]  # small; larger (K split over warps, two rounds of column tiles a block)


@pytest.mark.parametrize("h,inter", SIZES, ids=[f"{h}x{i}" for h, i in SIZES])
@pytest.mark.parametrize("wd,bits", [("int8", 8), ("int4", 4)])
def test_folded_wgemv_on_cuda(cuda_backend, wd, bits, h, inter):
    check_layer(cuda_backend, "cuda", wd, bits, {"prologue": 2, "groups": 1, "epilogue": 3, "wgemm": 4}, h, inter)
