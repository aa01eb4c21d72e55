"""The GEMV of decoding on the webgpu backend (targets/webgpu/gemv.py) against PyTorch eager in the same dtype: weights
read in 16-byte words, partial sums meeting through subgroup operations where the adapter has them and through
workgroup memory otherwise ($NPUSIM_WEBGPU_SUBGROUPS=0 forces the latter), with a bias, column groups (SiLU(gate) *
up) and an operand a that is not read in words. Sizes are small: lavapipe runs them on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fused_cases import TORCH_DTYPES, ir_dict
from gpu.util import to_np
from helpers import NormLinear, glu_case
from tolerances import assert_close

import npu_compiler
import npu_runtime
from npu_compiler.devices import CHIPS
from npu_compiler.targets.webgpu import DeviceCaps, WebGPUTarget, gemv
from npu_compiler.targets.webgpu.gemv import schedule
from npu_compiler.targets.webgpu.library import SKINNY_M
from npu_export.cnn import model_tensors

DTYPES = ["float32", "bfloat16", "float16"]
PATHS = ["subgroups", "workgroup"]


class ShiftedLinear(torch.nn.Module):
    """A linear over columns 1.. of its input: operand a starts one element into its buffer (not a whole word)."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(k, n, bias=True)

    def forward(self, x):
        return self.lin(x[..., 1:])


def _run(webgpu, module, x, dtype, path, monkeypatch, device=None) -> tuple[np.ndarray, list[str]]:
    if path == "workgroup":
        monkeypatch.setenv("NPUSIM_WEBGPU_SUBGROUPS", "0")
    elif webgpu.state.subgroup_min_size == 0:
        pytest.skip("the adapter has no subgroup operations")
    program = npu_compiler.compile(ir_dict(module, [x], "gemv"), "webgpu", dtype=dtype, device=device)
    ex = webgpu.create_executor(program)
    weights = npu_runtime.load_weights(program, model_tensors(module), webgpu)
    got = ex.run_numpy({program.inputs[0].name: to_np(x)}, weights)[program.outputs[0].name]
    return got.astype(np.float32), list(ex.rendered.sources.values())


def _gemv_sources(sources: list[str], path: str) -> list[str]:
    gemvs = [s for s in sources if "ldv_a1" in s]
    assert gemvs, "no kernel read the weights in 16-byte words"
    assert all(("subgroupAdd" in s) == (path == "subgroups") for s in gemvs)
    return gemvs


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", [(1, 320, 37), (3, 64, 9)])
def test_linear_matches_torch(webgpu, dtype, path, m, k, n, monkeypatch) -> None:
    gen = torch.Generator().manual_seed(k + n)
    module = torch.nn.Linear(k, n, bias=True).to(TORCH_DTYPES[dtype]).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_((torch.randn(p.shape, generator=gen) * 0.1).to(p.dtype))
    x = torch.randn((m, k), generator=gen).to(TORCH_DTYPES[dtype])
    got, sources = _run(webgpu, module, x, dtype, path, monkeypatch)
    _gemv_sources(sources, path)
    with torch.no_grad():
        ref = module(x).float().numpy()
    assert_close(got, ref, dtype, "accumulate", "webgpu", what=f"linear {m}x{k}x{n} {dtype} {path}")


def test_weights_in_chunks_are_read_in_words(webgpu, monkeypatch) -> None:
    """A weight larger than one storage binding is bound in chunks; its 16-byte words are read from the right one."""
    monkeypatch.setenv("NPUSIM_WEBGPU_MAX_BINDING", "8192")
    module = torch.nn.Linear(256, 40, bias=False).to(torch.bfloat16).eval()  # 20 KiB of weights: three chunks
    x = torch.randn((1, 256), generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    got, sources = _run(webgpu, module, x, "bfloat16", "workgroup", monkeypatch)
    (src,) = _gemv_sources(sources, "workgroup")
    assert "case 1i" in src.split("fn ldv_a1")[1].split("\n}")[0]
    with torch.no_grad():
        ref = module(x).float().numpy()
    assert_close(got, ref, "bfloat16", "accumulate", "webgpu", what="chunked weights")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_column_groups_and_unaligned_operand(webgpu, dtype, path, monkeypatch) -> None:
    """SiLU(gate) * up over the two halves of one projection (each workgroup with both groups of its columns), and a
    linear whose input starts mid-word (operand a read element by element, the weights still in words)."""
    module, x = glu_case(96, 24, 2, "silu", True, False, TORCH_DTYPES[dtype])
    got, sources = _run(webgpu, module, x, dtype, path, monkeypatch)
    (src,) = _gemv_sources(sources, path)
    assert "ldv_a0" in src  # the activations in words too
    with torch.no_grad():
        ref = module(x).float().numpy()
    assert_close(got, ref, dtype, "accumulate", "webgpu", what=f"glu {dtype} {path}")

    shifted = ShiftedLinear(64, 12).to(TORCH_DTYPES[dtype]).eval()
    x = torch.randn((1, 65), generator=torch.Generator().manual_seed(5)).to(TORCH_DTYPES[dtype])
    got, sources = _run(webgpu, shifted, x, dtype, path, monkeypatch)
    (src,) = _gemv_sources(sources, path)
    assert "ldv_a0" not in src
    with torch.no_grad():
        ref = shifted(x).float().numpy()
    assert_close(got, ref, dtype, "accumulate", "webgpu", what=f"shifted linear {dtype} {path}")


class BatchedProduct(torch.nn.Module):
    """relu(x @ y^T) + 1 over a batch, both operands inputs: a batched GEMV whose matrix is no weight."""

    def forward(self, x, y):
        return torch.relu(x @ y.transpose(-1, -2)) + 1


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_batched_product_of_inputs(webgpu, dtype, path, monkeypatch) -> None:
    if path == "workgroup":
        monkeypatch.setenv("NPUSIM_WEBGPU_SUBGROUPS", "0")
    gen = torch.Generator().manual_seed(2)
    x, y = (torch.randn(shape, generator=gen).to(TORCH_DTYPES[dtype]) for shape in ((3, 2, 64), (3, 24, 64)))
    program = npu_compiler.compile(ir_dict(BatchedProduct(), [x, y], "bmm"), "webgpu", dtype=dtype)
    ex = webgpu.create_executor(program)
    _gemv_sources(list(ex.rendered.sources.values()), path if webgpu.state.subgroup_min_size else "workgroup")
    got = ex.run_numpy({program.inputs[0].name: to_np(x), program.inputs[1].name: to_np(y)})
    ref = BatchedProduct()(x, y).float().numpy()
    assert_close(got[program.outputs[0].name].astype(np.float32), ref, dtype, "accumulate", "webgpu",
                 what=f"batched product {dtype} {path}")


@pytest.mark.parametrize("columns", ["few", "many"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_norm_prologue_computed_by_the_gemv(webgpu, dtype, path, columns, monkeypatch) -> None:
    """lin(rmsnorm(x)) + r of 2 rows, the norm folded into the GEMM (which the target does only when asked): the
    GEMV computes the norm's rows into workgroup memory itself (no plan, no scratch, one dispatch), each value
    rounded as the graph stores it; with "many", each workgroup takes as many
    columns as a workgroup with a prologue may (the last one partly past N)."""
    if columns == "many":
        monkeypatch.setattr(gemv, "WAVES", 0)
    monkeypatch.setattr(WebGPUTarget, "gemm_prologue_rows", SKINNY_M)  # (the target keeps norms apart by default)
    if path == "workgroup":
        monkeypatch.setenv("NPUSIM_WEBGPU_SUBGROUPS", "0")
    gen = torch.Generator().manual_seed(4)
    module = NormLinear(96, 40).to(TORCH_DTYPES[dtype]).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_((torch.randn(p.shape, generator=gen) * 0.2 + (1 if p.dim() == 1 else 0)).to(p.dtype))
    args = [torch.randn((2, n), generator=gen).to(TORCH_DTYPES[dtype]) for n in (96, 40)]
    program = npu_compiler.compile(ir_dict(module, args, "norm"), "webgpu", dtype=dtype)
    (gemm,) = [k for k in program.kernels if k.kind == "gemm"]
    assert gemm.spec.prologue is not None and gemm.plan is None and not gemm.scratch
    ex = webgpu.create_executor(program)
    (src,) = WebGPUTarget(program.device).kernel_sources(gemm, program)
    assert "npu_xs" in src and "ldv_a0" in src
    if columns == "many":
        assert ex.rendered.steps[program.kernels.index(gemm)][0].grid[0] == -(-40 // gemv.PROLOGUE_ROWS)
    weights = npu_runtime.load_weights(program, model_tensors(module), webgpu)
    got = ex.run_numpy({spec.name: to_np(a) for spec, a in zip(program.inputs, args, strict=True)}, weights)
    with torch.no_grad():
        ref = module(*args).float().numpy()
    assert_close(got[program.outputs[0].name].astype(np.float32), ref, dtype, "accumulate", "webgpu",
                 what=f"norm prologue {dtype} {path}")


@pytest.mark.parametrize("device", ["webgpu", "h200"])
def test_schedule_follows_the_device(device) -> None:
    """The workgroup is whole subgroups of the profile, within its invocations and the adapter's workgroup memory,
    narrower where K leaves invocations idle, and each workgroup takes fewer columns where the columns are few."""
    dev = CHIPS[device]
    module, x = glu_case(1536, 4480, 1, "silu", False, False, torch.float32)
    spec = npu_compiler.compile(ir_dict(module, [x], "glu"), "cpu", dtype="float32").kernels[0].spec
    for sub in (0, dev.warp_width // 4, dev.warp_width):
        caps = DeviceCaps(subgroup_min_size=sub)
        s = schedule(spec, 4, dev, caps)
        assert s.subgroups == (sub > 0)
        assert s.threads % dev.warp_width == 0 and s.threads <= dev.max_threads_per_block
        slots = -(-s.threads // sub) if sub else s.threads
        assert 4 * spec.m * spec.acc_groups * s.rows * slots <= caps.max_workgroup_storage
        assert s.rows > 1 and s.unroll >= 1
    short = schedule(spec.__class__(m=1, n=64, k=24, batch=()), 4, dev, DeviceCaps())
    assert short.threads == dev.warp_width and short.rows == 1


@pytest.mark.parametrize("path", PATHS)
def test_gpu_sized_schedule(webgpu, path, monkeypatch) -> None:
    """Planned for the `webgpu` row (a GPU's sizes: 32-wide subgroups, 132 compute units), on whatever adapter runs
    the tests: a SiLU(gate) * up projection of 1536 -> 2 x 1056 (4 columns of both groups a workgroup, 64
    invocations, 3 words of each of 8 rows in flight) and a 4096 -> 1056 one (128 invocations, 4 words), bfloat16."""
    dev = CHIPS["webgpu"]
    glu, x_glu = glu_case(1536, 1056, 1, "silu", False, False, torch.bfloat16, scale=0.05)
    down = torch.nn.Linear(4096, 1056, bias=False).to(torch.bfloat16).eval()
    x_down = torch.randn((1, 4096), generator=torch.Generator().manual_seed(11)).to(torch.bfloat16)
    for mod, x, want in ((glu, x_glu, (64, 4, 3)), (down, x_down, (128, 4, 4))):
        spec = npu_compiler.compile(ir_dict(mod, [x], "g"), "cpu", dtype="bfloat16").kernels[0].spec
        s = schedule(spec, 8, dev, DeviceCaps(subgroup_min_size=8))
        assert (s.threads, s.rows, s.unroll) == want
        got, sources = _run(webgpu, mod, x, "bfloat16", path, monkeypatch, device="webgpu")
        (src,) = _gemv_sources(sources, path)
        assert f"@workgroup_size({want[0]})" in src
        with torch.no_grad():
            ref = mod(x).float().numpy()
        assert_close(got, ref, "bfloat16", "accumulate", "webgpu", what=f"{type(mod).__name__} {path}")
