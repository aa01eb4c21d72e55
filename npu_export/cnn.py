"""Export of a CNN (any single-input nn.Module): IR JSON extracted on the meta device + safetensors weights."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from torch_ir import IR, extract_ir

from ._atomic import atomic_path
from ._meta import first_float_dtype, meta_clone
from .ir_io import save_ir_json

__all__ = ["ExportResult", "export_cnn", "model_tensors"]


@dataclass(frozen=True)
class ExportResult:
    ir_path: Path
    weights_path: Path
    ir: IR = field(repr=False, compare=False)


def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor the IR may reference: the state dict plus non-persistent buffers, keyed by state-dict name."""
    tensors = {**model.state_dict(), **dict(model.named_buffers())}
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int]] = set()
    for name, t in tensors.items():
        t = t.detach().to("cpu")
        # safetensors refuses tensors that share storage; a shared tensor is written once per key instead.
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        out[name] = t.clone() if key in seen else t.contiguous()
        seen.add(key)
    return out


def export_cnn(
    model: nn.Module,
    input_shape: Sequence[int],
    out_dir: str | os.PathLike[str],
    name: str,
    *,
    dtype: torch.dtype | None = None,
) -> ExportResult:
    """Write `<out_dir>/<name>.json` (IR) and `<out_dir>/<name>.safetensors` (all weights and buffers).

    The model is put in eval mode; the IR is extracted from a meta-device copy, so no weights are traced.
    """
    model.eval()
    dtype = dtype or first_float_dtype(model)
    meta_model = meta_clone(model).eval()
    example = (torch.empty(tuple(input_shape), dtype=dtype, device="meta"),)
    # no_grad: otherwise any @torch.no_grad() region becomes an opaque wrap_with_set_grad_enabled node
    with torch.no_grad():
        ir = extract_ir(meta_model, example, model_name=name)

    out = Path(out_dir)
    weights_path = out / f"{name}.safetensors"
    with atomic_path(weights_path) as tmp:
        save_file(model_tensors(model), str(tmp), metadata={"format": "pt", "model_name": name})
    ir_path = save_ir_json(ir, out / f"{name}.json")
    return ExportResult(ir_path=ir_path, weights_path=weights_path, ir=ir)
