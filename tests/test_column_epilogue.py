"""Column-group epilogues (lowering/column_epilogues.py): act(a) * b over the two halves of one GEMM's result becomes
that GEMM's epilogue where the target runs it (the cpu reference always; cuda for GEMVs of at most 8 rows; webgpu
for skinny GEMMs of at most 4 rows of two groups), checked
against PyTorch eager and against the same program compiled without the fold, which must agree to the bit (the
epilogue reads the same rounded values the elementwise kernel read from memory). Where the result is read by
anything else, or not at its own row, nothing is folded."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fused_cases import TORCH_DTYPES, ir_dict
from gpu.util import to_np
from helpers import GluProjection, glu_case
from tolerances import assert_close

import npu_compiler
import npu_runtime
from npu_export.cnn import model_tensors

CPU = npu_runtime.get_backend("cpu")


def _run(program, module, args) -> np.ndarray:
    weights = npu_runtime.load_weights(program, model_tensors(module), CPU)
    feeds = {s.name: to_np(a) for s, a in zip(program.inputs, args, strict=True)}
    return CPU.create_executor(program).run_numpy(feeds, weights)[program.outputs[0].name]


def _folded(program) -> list:
    return [k for k in program.kernels if k.kind == "gemm" and k.spec.acc_groups > 1]


CASES = [("silu", False, False, 1), ("gelu", True, False, 3), ("relu", False, True, 8), ("silu", True, True, 16)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("act,bias,swap,m", CASES, ids=[f"{a}{'_bias' if b else ''}{'_swap' if s else ''}_m{m}"
                                                         for a, b, s, m in CASES])
def test_glu_folds_and_matches_torch(act, bias, swap, m, dtype) -> None:
    module, x = glu_case(96, 40, m, act, bias, swap, TORCH_DTYPES[dtype], scale=0.2)
    args = [x]
    ir = ir_dict(module, args, "glu")
    folded = npu_compiler.compile(ir, "cpu", dtype=dtype)
    plain = npu_compiler.compile(ir, "cpu", dtype=dtype, disable_passes=["column_epilogue"])
    (gemm,) = _folded(folded)
    assert len(folded.kernels) == 1 and gemm.spec.acc_groups == 2 and gemm.spec.n == 80
    assert tuple(gemm.outs[0].shape) == (m, 40) and {"mul"} <= {n.split("_")[0] for n in gemm.nodes}
    assert not _folded(plain) and len(plain.kernels) == 2
    assert any(p.startswith("column_epilogue(1)") for p in folded.passes)
    got, unfolded = _run(folded, module, args), _run(plain, module, args)
    np.testing.assert_array_equal(got, unfolded)
    with torch.no_grad():
        ref = module(*args).float().numpy()
    assert_close(got.astype(np.float32), ref, dtype, "accumulate", what=f"{act} glu {dtype}")


def test_cuda_folds_gemvs_and_hopper_tiles() -> None:
    """On cuda the fold needs the GEMV (at most 8 rows) or, for more rows, the grouped kernel on Hopper
    (`grouped_gemm.grouped_fits`: 16-bit operands, no bias, rows of 16-byte multiples); a float32 prefill's GEMM, one
    with a bias or one whose rows the tensor memory accelerator cannot copy runs on cuBLAS and keeps its kernel after.
    """
    cases = [  # rows, k, dtype, bias, folds
        (1, 256, "bfloat16", False, True), (8, 256, "bfloat16", False, True), (9, 256, "bfloat16", False, True),
        (64, 256, "bfloat16", False, True), (64, 256, "float16", False, True), (1, 256, "float32", False, True),
        (9, 256, "float32", False, False), (64, 256, "bfloat16", True, False), (64, 100, "bfloat16", False, False),
    ]
    for m, k, dtype, bias, folds in cases:
        ir = ir_dict(GluProjection(k, 128, bias=bias), [torch.randn(m, k)], "glu")
        prog = npu_compiler.compile(ir, "cuda", dtype=dtype)
        assert bool(_folded(prog)) == folds, (m, k, dtype, bias, [k.name for k in prog.kernels])
        assert len(prog.kernels) == (1 if folds else 2)


def test_webgpu_folds_what_its_skinny_gemm_holds() -> None:
    """The skinny GEMM keeps rows x groups x 4 columns of partial sums in 16 KB of workgroup memory: 4 rows of 2."""
    for m, folds in ((1, True), (4, True), (5, False), (64, False)):
        prog = npu_compiler.compile(ir_dict(GluProjection(64, 32), [torch.randn(m, 64)], "glu"), "webgpu",
                                    dtype="float32")
        assert bool(_folded(prog)) == folds and len(prog.kernels) == (1 if folds else 2), m


class _AlsoReturnsProduct(GluProjection):
    def forward(self, x):
        h = self.lin(x)
        a, b = h.chunk(2, dim=-1)
        return self.act(a) * b, h


class _OtherRows(GluProjection):
    def forward(self, x):
        a, b = self.lin(x).chunk(2, dim=-1)
        return self.act(a[1:]) * b[:-1]  # row i with row i + 1: not at the output's own row


class _Unequal(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(64, 48, bias=False)

    def forward(self, x):
        h = self.lin(x)
        return torch.nn.functional.silu(h[:, :16]) * h[:, 16:32] + h[:, 32:]  # three groups of 16: folds into 3


@pytest.mark.parametrize("make,groups", [(_AlsoReturnsProduct, 0), (_OtherRows, 0), (_Unequal, 3)])
def test_fold_only_where_the_result_is_read_at_its_own_row(make, groups) -> None:
    module = make(64, 24) if make is not _Unequal else make()
    module = module.eval()
    args = [torch.randn(4, 64)]
    prog = npu_compiler.compile(ir_dict(module, args, "glu"), "cpu", dtype="float32")
    assert [k.spec.acc_groups for k in _folded(prog)] == ([groups] if groups else [])
    with torch.no_grad():
        ref = module(*args)
    ref = ref[0] if isinstance(ref, tuple) else ref
    assert_close(_run(prog, module, args), ref.numpy(), "float32", "accumulate", what=make.__name__)
