"""Large elementwise kernels on the cuda target: with more elements than a large GPU has resident threads, a thread
works on several elements a grid stride apart (`Language.elementwise_ilp`), and the loop's tail and the capped grid
(more elements than the grid's threads times that count) must still cover every element exactly once; where its
2-byte loads and store allow, a thread moves 16 bytes (8 elements) a load and a store (`clike._vector_width`), also
with a value read once for the whole vector. Against PyTorch eager on the CPU in the same dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fused_cases import SiluTimesUp, ir_dict
from tolerances import assert_close

import npu_compiler
from npu_compiler.targets.clike import ELEMENTWISE_BLOCK, elementwise_ilp
from npu_compiler.targets.cuda import CudaTarget
from npu_compiler.targets.cuda.common import CUDA

from .util import rendered_for, to_np


class BroadcastAdd(torch.nn.Module):
    def forward(self, a, b):
        return a + b


class ScaleRows(torch.nn.Module):
    """Each row scaled by its own value (read once for a vector of 8) plus a bias along the row."""

    def forward(self, x, s, b):
        return torch.relu(x * s + b)


CASES = {
    # 1,134,100 outputs: just past the threshold, a ragged tail in the last grid stride
    "silu_mul_bf16": ("bfloat16", SiluTimesUp(), [(1100, 2 * 1031)], "elementwise"),
    # 68,891,420 outputs: more than the capped grid covers in one pass of its unrolled loop
    "broadcast_add_fp32": ("float32", BroadcastAdd(), [(257, 1, 1031), (1, 260, 1031)], "exact"),
    # rows of a multiple of 8: 16-byte loads and stores, 8,704,000 outputs (1,088,000 vectors: just past the
    # threshold, a ragged tail)
    "vector_silu_mul_bf16": ("bfloat16", SiluTimesUp(), [(8500, 2 * 1024)], "elementwise"),
    "vector_scale_rows_fp16": ("float16", ScaleRows(), [(2200, 4000), (2200, 1), (4000,)], "elementwise"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_large_elementwise_matches_torch(name, cuda_backend) -> None:
    dtype, module, shapes, kind = CASES[name]
    gen = torch.Generator().manual_seed(0)
    args = [torch.randn(s, generator=gen).to(getattr(torch, dtype)) for s in shapes]
    program = npu_compiler.compile(ir_dict(module, args, name), "cuda", dtype=dtype)
    (k,) = program.kernels
    n = int(np.prod(k.outs[0].shape))
    per = 8 if name.startswith("vector") else 1  # a vectorized kernel's loop runs over vectors of 8
    dev = rendered_for(program, cuda_backend)  # the device whose resident threads size the grid
    assert elementwise_ilp(CUDA, n // per, dev) > 1, "the case does not reach the unrolled loop"
    src = CudaTarget(dev).kernel_sources(k, program)[0]
    vector = name.startswith("vector")
    assert ("g0 + e *" if vector else "i0 + e *") in src and CUDA.unroll_hint in src, src
    assert ("uint4" in src) == vector, src
    if name.startswith("broadcast"):
        assert n > elementwise_ilp(CUDA, n, dev) * ELEMENTWISE_BLOCK * CUDA.max_grid  # several passes of the grid
    ex = cuda_backend.create_executor(program)
    feeds = {s.name: to_np(a) for s, a in zip(program.inputs, args, strict=True)}
    got = ex.run_numpy(feeds, {})[program.outputs[0].name]
    with torch.no_grad():
        ref = module(*args)
    assert_close(got.astype(np.float32), ref.float().numpy(), dtype, kind, "cuda", what=name)


class RowNorms(torch.nn.Module):
    """A LayerNorm (two reductions over the row) and an RMSNorm with a weight, as transformer blocks have them."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(n)
        self.w = torch.nn.Parameter(torch.rand(n) + 0.5)

    def forward(self, x):
        y = self.ln(x)
        return y * torch.rsqrt(y.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(y.dtype) * self.w


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("n", [1024, 1004])
def test_row_kernels_match_torch(dtype, n, cuda_backend) -> None:
    """Row kernels (norms): rows of a multiple of 8 load their reductions' values and their elements 16 bytes at a
    time (`clike._row_vector_width`), rows of 1004 one element at a time; both against PyTorch on the CPU."""
    from fused_cases import module_weights

    from npu_runtime import load_weights

    tdt = getattr(torch, dtype)
    torch.manual_seed(0)
    model = RowNorms(n).eval().to(tdt)
    x = (torch.randn(300, n) * 3 + 1).to(tdt)
    program = npu_compiler.compile(ir_dict(model, [x], f"rows_{n}"), "cuda", dtype=dtype)
    sources = [src for k in program.kernels for src in CudaTarget().kernel_sources(k, program)]
    rows = [src for src in sources if "npu_block_reduce(" in src]
    assert rows and all(("uint4" in src) == (n % 8 == 0) for src in rows), [k.name for k in program.kernels]
    weights = load_weights(program, module_weights(model), cuda_backend)
    ex = cuda_backend.create_executor(program)
    got = ex.run_numpy({program.inputs[0].name: to_np(x)}, weights)[program.outputs[0].name]
    with torch.no_grad():
        ref = model(x)
    assert_close(got.astype(np.float32), ref.float().numpy(), dtype, "accumulate", "cuda", what=f"rows_{n}_{dtype}")


class Rope(torch.nn.Module):
    """HF's rotary embedding: x * cos + rotate_half(x) * sin, the rotated half a gather of the other half's columns."""

    def forward(self, x, cos, sin):
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin


@pytest.mark.parametrize("dtype,d,vector", [("bfloat16", 128, True), ("float16", 64, True),
                                            ("bfloat16", 136, False), ("float16", 12, False)])
def test_rope_gathers_match_torch(dtype, d, vector, cuda_backend) -> None:
    """The rotated half of a head of 128 or 64 columns is read 16 bytes at a time with the rest of the element (its
    column d +- half moves by one along a vector of 8 that starts on a multiple of 8, and d < half is the same for the
    whole vector: `clike._vector_gather_ok`); with 136 columns the comparison with 68 flips inside a vector, and 12
    columns are no whole vectors: those stay one element at a time. Against PyTorch eager on the CPU."""
    gen = torch.Generator().manual_seed(0)
    tdt = getattr(torch, dtype)
    args = [torch.randn(1, 12, 300, d, generator=gen).to(tdt), torch.randn(300, d, generator=gen).to(tdt),
            torch.randn(300, d, generator=gen).to(tdt)]
    module = Rope()
    program = npu_compiler.compile(ir_dict(module, args, f"rope{d}"), "cuda", dtype=dtype)
    (k,) = program.kernels
    src = CudaTarget().kernel_sources(k, program)[0]
    assert ("uint4" in src) == vector, src
    ex = cuda_backend.create_executor(program)
    got = ex.run_numpy({s.name: to_np(a) for s, a in zip(program.inputs, args, strict=True)}, {})
    with torch.no_grad():
        ref = module(*args)
    assert_close(got[program.outputs[0].name].astype(np.float32), ref.float().numpy(), dtype, "elementwise", "cuda",
                 what=f"rope d={d}")
