"""Export of a single-input model (a CNN) by input shape: `export_model` with one example input."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch import nn

from .model_export import ExportResult, export_model, model_tensors

__all__ = ["ExportResult", "export_cnn", "model_tensors"]


def export_cnn(
    model: nn.Module,
    input_shape: Sequence[int],
    out_dir: str | os.PathLike[str],
    name: str,
    *,
    dtype: torch.dtype | None = None,
) -> ExportResult:
    """Write `<out_dir>/<name>.json` (IR) and `<out_dir>/<name>.safetensors` (all weights and buffers) for one
    input of `input_shape` (in `dtype`, default the model's floating dtype; the model is not cast)."""
    return export_model(model, [(tuple(input_shape), dtype) if dtype is not None else tuple(input_shape)],
                        out_dir, name)
