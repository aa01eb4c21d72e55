"""CPU fallback: runs a partition's sub-IR through `torch_ir.IRExecutor`, and converts tensors between NumPy and
torch without losing bf16.

This is the only module of the runtime that imports torch, and only inside functions: importing `npu_runtime`
(or this module) never loads torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from .errors import NPURuntimeError

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["to_torch", "to_numpy", "CpuFallback"]

_BF16 = np.dtype(ml_dtypes.bfloat16)


def to_torch(array: Any, copy: bool = True) -> torch.Tensor:
    """NumPy (ml_dtypes bf16 included) -> torch tensor of the same dtype. torch cannot read ml_dtypes arrays, so
    bf16 travels as its bit pattern (int16 view) and is reinterpreted on the other side: no rounding."""
    import torch

    if isinstance(array, torch.Tensor):
        return array.clone() if copy else array
    a = np.asarray(array)
    if a.dtype == _BF16:
        bits = np.ascontiguousarray(a).view(np.int16)
        return torch.from_numpy(bits.copy() if copy else bits).view(torch.bfloat16)
    a = np.ascontiguousarray(a)
    # A copy, so an in-place ATen op of the fallback (relu_, index_copy_) never writes into the caller's array.
    return torch.from_numpy(a.copy() if copy else a)


def to_numpy(tensor: Any) -> np.ndarray:
    """torch tensor -> NumPy array of the same dtype (bf16 as ml_dtypes.bfloat16)."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        return np.asarray(tensor)
    t = tensor.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().copy().view(_BF16)
    return t.numpy().copy()


class CpuFallback:
    """One CPU partition: its sub-IR loaded once into an `IRExecutor` with the weights it reads (torch tensors
    keyed by state-dict key)."""

    def __init__(self, sub_ir: Mapping[str, Any], weights: Mapping[str, Any], name: str = "cpu partition") -> None:
        from torch_ir import IRExecutor

        from npu_export.ir_io import load_ir_for_executor

        self.name = name
        self.ir_dict = sub_ir
        self.input_names = [t["name"] for t in sub_ir["graph_inputs"]]
        self.output_names = [t["name"] for t in sub_ir["graph_outputs"]]
        self._out_dtypes = {t["name"]: str(t["dtype"]) for t in sub_ir["graph_outputs"]}
        ir = load_ir_for_executor(sub_ir)
        tensors = {k: to_torch(v, copy=False) for k, v in weights.items()}
        self.executor = IRExecutor(ir, weights=tensors)

    def run(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Inputs and outputs by tensor name, as torch tensors (NumPy inputs are converted)."""
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise NPURuntimeError(f"{self.name}: missing input tensor(s) {missing}")
        args = tuple(to_torch(inputs[n], copy=False) for n in self.input_names)
        try:
            outs = self.executor.execute(args)
        except Exception as e:  # torch_ir wraps op failures; its message names the node and op
            raise NPURuntimeError(f"{self.name}: CPU fallback failed: {e}") from e
        result = dict(zip(self.output_names, outs))
        for n, t in result.items():
            want = self._out_dtypes[n]
            if str(t.dtype).removeprefix("torch.") != want:
                raise NPURuntimeError(f"{self.name}: output tensor '{n}' came back as {t.dtype}, the IR says {want}")
        return result
