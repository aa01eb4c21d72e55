"""The reference (`npu_export.reference`, torch_ir.IRExecutor) must not depend on the host's instruction set: in bf16
and fp16 it runs ATen's own CPU kernels, not oneDNN's, whose bf16 convolutions on AVX512-BF16/AMX CPUs compute some
strided shapes wrong (pytorch/pytorch#169688). wav2vec2's strided feature convs in bf16 got a reference there that
every backend "missed" by Pearson 0.96, while an AVX2 host agreed with them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import export_ir, state_dict_numpy
from torch.utils._python_dispatch import TorchDispatchMode

from npu_export.reference import run_reference, run_reference_all, to_numpy


def _feature_convs() -> torch.nn.Module:
    # wav2vec2's feature encoder: strided convs over a 1-channel waveform
    nn = torch.nn
    return nn.Sequential(nn.Conv1d(1, 16, 10, stride=5), nn.GELU(), nn.Conv1d(16, 16, 3, stride=2))


def _case(dtype: torch.dtype):
    torch.manual_seed(0)
    model = _feature_convs().to(dtype).eval()
    ir = export_ir(lambda: _feature_convs().to(dtype), [((1, 1, 400), dtype)])
    x = torch.randn(1, 1, 400).to(dtype)
    return model, ir, state_dict_numpy(model), {ir["graph_inputs"][0]["name"]: to_numpy(x)}, x


class _OneDnnAtConv(TorchDispatchMode):
    """Whether oneDNN was enabled at each convolution the reference ran."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[bool] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "convolution" in str(func):
            self.seen.append(torch.backends.mkldnn.enabled)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype,onednn", [(torch.bfloat16, False), (torch.float16, False), (torch.float32, True)])
@pytest.mark.parametrize("run", [run_reference, run_reference_all])
def test_half_float_references_run_atens_own_kernels(dtype, onednn, run) -> None:
    _, ir, weights, inputs, _ = _case(dtype)
    with _OneDnnAtConv() as mode:
        run(ir, weights, inputs)
    assert mode.seen == [onednn, onednn], "oneDNN only for float32 (its bf16/fp16 convs depend on the host's ISA)"
    assert torch.backends.mkldnn.enabled, "the setting is restored after the reference ran"


def test_bf16_strided_conv_reference_is_fp32_accumulated() -> None:
    """Against float64 over the same bf16 weights and input: a bf16 rounding of each conv's output, on any host (the
    check that fails on an AVX512-BF16/AMX host whose oneDNN bf16 conv is wrong for these shapes)."""
    model, ir, weights, inputs, x = _case(torch.bfloat16)
    got = run_reference(ir, weights, inputs)[ir["graph_outputs"][0]["name"]].astype(np.float64)
    with torch.no_grad():
        want = model.double()(x.double()).numpy()
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 2 ** -6, f"bf16 reference off float64 by {err:.3g} of the largest output"


@pytest.mark.parametrize("dtype,onednn", [(torch.bfloat16, False), (torch.float32, True)])
def test_cpu_partitions_run_atens_own_kernels(dtype, onednn) -> None:
    """A CPU partition of a program (the fallback) computes as the reference does: its bf16 convs are not oneDNN's,
    so a program's CPU segments give the same values on every host."""
    from npu_runtime.fallback import CpuFallback

    _, ir, weights, inputs, _ = _case(dtype)
    part = CpuFallback(ir, weights)
    with _OneDnnAtConv() as mode:
        part.run(inputs)
    assert mode.seen == [onednn, onednn]
    assert torch.backends.mkldnn.enabled, "the setting is restored after the partition ran"
