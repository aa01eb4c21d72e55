"""A reduction whose reads step through memory along the output and not along the reduction (a global average pool
over channels-last activations) runs one output a thread, its neighbours' reads next to its own; one along
contiguous memory keeps the row kernel (threads of a row read a row's neighbouring elements). Against PyTorch on
every available backend, and the choice checked in the rendered CUDA source (no GPU needed)."""

from __future__ import annotations

import pytest
import torch
from conftest import run_module
from tolerances import assert_close

import npu_compiler
from npu_compiler.targets.clike import SERIAL_MIN_OUTPUTS, SERIAL_REDUCE_MAX, SERIAL_STRIDED_REDUCE_MAX
from npu_compiler.targets.cuda import CudaTarget


class MeanOver(torch.nn.Module):
    def __init__(self, dims: tuple[int, ...]) -> None:
        super().__init__()
        self.dims = dims

    def forward(self, x):
        return x.mean(self.dims)


# (dims, input shape, one thread an output?)
CASES = {
    # [n, h, w, c] over (h, w): 16 x 2048 outputs, 49 values each a row of c apart (ResNet's pool, channels-last)
    "channels_last_pool": ((1, 2), (16, 7, 7, 2048), True),
    # too few outputs to fill a GPU one a thread: the row kernel spreads each over a warp
    "few_outputs": ((1, 2), (2, 7, 7, 2048), False),
    # over the last dim: contiguous, a row kernel's threads read neighbours
    "contiguous": ((3,), (16, 2048, 1, 49), False),
}


def _source(name: str) -> str:
    from fused_cases import ir_dict

    dims, shape, _ = CASES[name]
    program = npu_compiler.compile(ir_dict(MeanOver(dims), [torch.zeros(shape)], name), "cuda", dtype="float32")
    (k,) = program.kernels
    return CudaTarget().kernel_sources(k, program)[0]


def test_the_cases_sit_on_both_sides_of_the_rule() -> None:
    for dims, shape, serial in CASES.values():
        n_red = 1
        for d in dims:
            n_red *= shape[d]
        assert SERIAL_REDUCE_MAX < n_red <= SERIAL_STRIDED_REDUCE_MAX
        n_out = 1
        for d, n in enumerate(shape):
            n_out *= 1 if d in dims else n
        assert (n_out >= SERIAL_MIN_OUTPUTS) == (serial or dims == (3,))


@pytest.mark.parametrize("name", sorted(CASES))
def test_cuda_source_picks_the_form(name: str) -> None:
    src = _source(name)
    serial = CASES[name][2]
    assert ("npu_block_reduce" not in src) == serial, src
    assert ("for (int r = 0; r < 49; ++r)" in src) == serial, src


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch(name: str, backend) -> None:
    dims, shape, _ = CASES[name]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    _, got, ref = run_module(backend, lambda: MeanOver(dims), [x])
    assert_close(got[0], ref[0].numpy(), "float32", "accumulate", backend.name, what=name)
