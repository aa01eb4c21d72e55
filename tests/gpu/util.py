"""Helpers of the GPU tests."""

from __future__ import annotations

import numpy as np
import torch


def rendered_for(program, cuda_backend):
    """The device profile the cuda executor renders `program` for on this GPU (the one it was planned for where this
    GPU runs that plan: `pytest tests/gpu --npu-device a100`), which the tests' expectations of kernels follow."""
    from npu_compiler.devices import render_device

    return render_device(program.device, cuda_backend.state.profile)


def to_np(t) -> np.ndarray:
    """A torch tensor as a NumPy array of the same dtype (bf16 through ml_dtypes)."""
    import ml_dtypes

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
