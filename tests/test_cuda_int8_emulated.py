"""The cuda target's integer kernels give the CPU reference's integers, run on the CPU by tests/cuda_emulator.py (g++
and threads; CI has no GPU): the tile loop, the loaders, the zero-point sums and the requantizing epilogue, on the
H200's plan (small tiles for these sizes) and on a one-SM profile's (the largest tiles, one block walking them all).
The hardware's own run is tests/gpu/test_int8_cuda.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from cuda_emulator import available, run_emulated
from int8_cases import assert_weight_only, integer_cases, reference, wgemm_cases

from npu_compiler.devices import get_profile

pytestmark = pytest.mark.skipif(not available(), reason="g++ is absent")

PICKED = {"qgemm uint8 acts, k%4", "qgemm odd tiles", "qgemm dequantize", "qgemm b zero point", "qconv2d 3x3 pad",
          "qconv2d stride 2 relu", "qconv2d groups dilation", "qconv2d 16-byte weight rows", "qadd uint8 wide shift"}
CASES = [c for c in integer_cases() if c.name in PICKED or "channels-last" in c.name or "16-byte rows" in c.name
         or "residual" in c.name or "relu broadcast" in c.name]


@pytest.mark.parametrize("device", ["h200", "one_sm"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_emulated_cuda_kernel_is_bit_exact(case, device, tmp_path):
    dev = dataclasses.replace(get_profile("a100"), multiprocessors=1) if device == "one_sm" else get_profile(device)
    np.testing.assert_array_equal(run_emulated(case, dev, tmp_path), reference(case))


WGEMM = [c for c in wgemm_cases() if c.name != "wgemm int8 odd k"]  # the 16-byte GEMV (wgemv.py); odd K reads codes


# on one SM a block walks several column tiles of these (the next tile's codes loaded while this one's are used)
TILED = {"wgemm int8 split k", "wgemm int4 many tiles"}
WGEMM_RUNS = [(c, "h200") for c in WGEMM] + [(c, "one_sm") for c in WGEMM if c.name in TILED]


@pytest.mark.parametrize("case,device", WGEMM_RUNS, ids=[f"{c.name}-{d}" for c, d in WGEMM_RUNS])
def test_emulated_cuda_wgemv_matches_reference(case, device, tmp_path):
    """The weight-only GEMV on the H200's plan (split along K for the wide case; four rows at a time, a tail of
    one, for the int4 case) and on a one-SM profile's (a block walking several column tiles, the next tile's codes
    loaded while this one's are used), within float32 summation-order error of the reference."""
    dev = dataclasses.replace(get_profile("a100"), multiprocessors=1) if device == "one_sm" else get_profile(device)
    assert_weight_only(run_emulated(case, dev, tmp_path), case)


SPLIT = [c for c in CASES if c.name in ("qconv2d channels-last 3x3 pad", "qconv2d channels-last many tiles",
                                        "qconv2d residual channels-last 1x1 relu", "qgemm 16-byte rows, tiles",
                                        "qconv2d 3x3 pad")]


@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.parametrize("case", SPLIT, ids=[c.name for c in SPLIT])
def test_emulated_split_k_is_bit_exact(case, splits, tmp_path):
    """K split across blocks (the plan's int32 scratch parts, summed by a second launch) gives the same integers."""
    from int8_cases import program_of, with_split

    dev = get_profile("h200")
    program = with_split(program_of(case, "cuda"), dev, splits)
    np.testing.assert_array_equal(run_emulated(case, dev, tmp_path, program), reference(case))
