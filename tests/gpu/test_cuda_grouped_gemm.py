"""GEMMs whose epilogue combines two column groups (act(a) * b over the halves of one projection: SwiGLU, GeGLU,
ReGLU) with more rows than a GEMV takes: on Hopper one kernel on the tensor memory accelerator and the warpgroup MMA
(targets/cuda/grouped_gemm.py) writes act(a) * b, against PyTorch eager on the CPU in the same dtype. The shapes
cover a tile's edges: rows and columns that are not multiples of the 128 of a tile, a K that is not a multiple of
the 64 of a stage, K shorter than one stage, output rows that do not start on 16 bytes (stored element by element),
and more tiles than the grid has blocks (each block walks several).
Where a GPU cannot run that kernel (older than the program was compiled for), the same record runs on the plain
kernel (`gemm_direct`), checked here by rendering without it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fused_cases import TORCH_DTYPES, ir_dict
from helpers import GluProjection
from tolerances import assert_close

import npu_compiler
import npu_runtime
from npu_export.cnn import model_tensors

from .util import rendered_for, to_np

SHAPES = [  # m, k, n (each group's columns), activation, swap
    (300, 1536, 1000, "silu", False),
    (2048, 1536, 8960, "silu", False),
    (129, 520, 384, "gelu", True),
    (200, 40, 130, "relu", False),
    (150, 64, 129, "silu", False),
    (1000, 256, 4096, "silu", True),
]


def _case(m, k, n, act, swap, dtype):
    tdt = TORCH_DTYPES[dtype]
    gen = torch.Generator().manual_seed(m + k + n)
    module = GluProjection(k, n, act, False, swap)
    with torch.no_grad():
        module.lin.weight.copy_(torch.randn((2 * n, k), generator=gen) * k ** -0.5)
    module = module.to(tdt).eval()
    args = [torch.randn((m, k), generator=gen).to(tdt)]
    program = npu_compiler.compile(ir_dict(module, args, "grouped_gemm"), "cuda", dtype=dtype)
    if not (program.device.tma and program.device.warpgroup_mma) and len(program.kernels) > 1:
        # planned for a GPU without the grouped kernel (`--npu-device a100`): the GEMM and its GLU stay apart
        pytest.skip(f"the program was planned for {program.device.name}, which has no grouped kernel for a prefill's "
                    "GEMM: the column epilogue is not folded")
    (gemm,) = program.kernels
    assert gemm.kind == "gemm" and gemm.spec.acc_groups == 2, [k.name for k in program.kernels]
    return module, args, program


def _run(program, module, args, backend):
    weights = npu_runtime.load_weights(program, model_tensors(module), backend)
    ex = backend.create_executor(program)
    feeds = {s.name: to_np(a) for s, a in zip(program.inputs, args, strict=True)}
    return ex, ex.run_numpy(feeds, weights)[program.outputs[0].name]


def _reference(module, args) -> np.ndarray:
    with torch.no_grad():
        return module(*args).float().numpy()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m,k,n,act,swap", SHAPES, ids=[f"{m}x{k}x{n}_{a}{'_swap' if s else ''}"
                                                        for m, k, n, a, s in SHAPES])
def test_grouped_gemm_matches_torch(m, k, n, act, swap, dtype, cuda_backend) -> None:
    module, args, program = _case(m, k, n, act, swap, dtype)
    if rendered_for(program, cuda_backend).compute_capability < 90:
        pytest.skip("the grouped kernel needs Hopper (sm_90): this GPU, or the device the program was planned for, "
                    "runs the plain kernel, tested below")
    ex, got = _run(program, module, args, cuda_backend)
    (steps,) = ex.rendered.steps
    assert len(steps) == 1 and len(steps[0].launch.tensor_maps) == 2, steps  # the grouped kernel ran
    assert_close(got.astype(np.float32), _reference(module, args), dtype, "accumulate", "cuda",
                 what=f"{m}x{k}x{n} {act} {dtype}")


def test_grouped_gemm_falls_back_to_the_plain_kernel(cuda_backend, monkeypatch) -> None:
    """A GPU without the grouped kernel (rendered here as if so) runs the same record on `gemm_direct`."""
    from npu_compiler.targets.cuda import target as T

    module, args, program = _case(200, 520, 384, "silu", False, "bfloat16")
    monkeypatch.setattr(T, "grouped_fits", lambda *a, **kw: False)  # (at render time: the record stays folded)
    ex, got = _run(program, module, args, cuda_backend)
    (steps,) = ex.rendered.steps
    assert len(steps) == 1 and not steps[0].launch.tensor_maps
    assert_close(got.astype(np.float32), _reference(module, args), "bfloat16", "accumulate", "cuda",
                 what="grouped gemm on the plain kernel")


def test_grouped_gemm_profile_reuses_its_tensor_maps(cuda_backend) -> None:
    """`profile` resolves the launches again over the same buffers: it reads the tensor maps encoded at load (no new
    device copy, no synchronisation per call) and computes what the graph run computed, to the bit."""
    module, args, program = _case(300, 1536, 1000, "silu", False, "bfloat16")
    if rendered_for(program, cuda_backend).compute_capability < 90:
        pytest.skip("the grouped kernel needs Hopper (sm_90)")
    weights = npu_runtime.load_weights(program, model_tensors(module), cuda_backend)
    ex = cuda_backend.create_executor(program)
    feeds = {s.name: to_np(a) for s, a in zip(program.inputs, args, strict=True)}
    plain = ex.run_numpy(feeds, weights)[program.outputs[0].name]
    maps = {key: int(buf.data.ptr) for key, buf in ex._maps.items()}
    assert len(maps) == 1, maps
    for _ in range(2):
        (timing,) = ex.profile(feeds, weights)
        assert timing.dur_s > 0
        assert {key: int(buf.data.ptr) for key, buf in ex._maps.items()} == maps
        profiled = ex.outputs()[program.outputs[0].name].to_numpy()
        np.testing.assert_array_equal(profiled, plain)
