"""Weight-free copies of models for `torch_ir.extract_ir(strict=True)`, which needs meta-device models."""

from __future__ import annotations

import copy
import itertools

import torch
from torch import nn

__all__ = ["meta_clone", "first_float_dtype"]


def meta_clone(model: nn.Module) -> nn.Module:
    """A deep copy of `model` whose parameters and buffers live on the meta device.

    The memo hands deepcopy a meta stand-in for every tensor, so no weight data is ever copied; tensors shared
    between modules (tied embeddings) stay shared in the copy.
    """
    memo: dict[int, object] = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        if id(t) in memo:
            continue
        meta = torch.empty_like(t, device="meta")
        memo[id(t)] = nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else meta
    return copy.deepcopy(model, memo)


def first_float_dtype(model: nn.Module) -> torch.dtype:
    for p in itertools.chain(model.parameters(), model.buffers()):
        if p.is_floating_point():
            return p.dtype
    return torch.get_default_dtype()


def lifted_constants(model: nn.Module, example_inputs: tuple[torch.Tensor, ...], keys: set[str]
                     ) -> dict[str, torch.Tensor]:
    """The values of tensors a model's forward creates (`torch.tensor(0.0)` in transformers' mask code), which
    torch.export lifts into constants: a weight-free (meta) export records their shape but not their data, and no
    state dict holds them. One export of the real model (non-strict, real inputs) gives them, by the same keys."""
    if not keys:
        return {}
    with torch.no_grad():
        ep = torch.export.export(model, tuple(example_inputs), strict=False)
    return {k: v.detach().clone() for k, v in ep.constants.items() if k in keys and isinstance(v, torch.Tensor)}
