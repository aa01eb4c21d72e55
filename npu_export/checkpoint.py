"""Loading a user's checkpoint into their model before export: a safetensors file or a PyTorch state dict.

    model = load_checkpoint(MyNet(), "mynet.pt")   # strict: every key must match, or one clear error
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from npu_compiler.atomic import note_input

from .errors import ExportError, first_line

__all__ = ["load_checkpoint", "read_state_dict"]

# Where training scripts commonly nest the state dict inside a saved dict (Lightning, many example scripts).
_NESTED_KEYS = ("state_dict", "model_state_dict", "model")


def read_state_dict(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Tensors by key from a .safetensors file or a torch.save'd state dict (.pt, .pth, .bin; read with
    `weights_only=True`, so no code in the file runs). A state dict nested under "state_dict" / "model" is found,
    and a "module." prefix on every key (DataParallel) is removed."""
    p = Path(path)
    if not p.is_file():
        raise ExportError(f"checkpoint not found: {p}")
    note_input(p)
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(p))
        except Exception as e:  # safetensors raises its own error types for damaged files
            raise ExportError(f"{p}: not a readable safetensors file: {e}") from e
    if _is_torchscript(p):
        raise ExportError(f"{p} is a TorchScript archive (torch.jit.save), not a state dict: save the nn.Module's "
                          "weights with torch.save(model.state_dict(), path) and export the nn.Module itself")
    try:
        obj: Any = torch.load(str(p), map_location="cpu", weights_only=True)
    except Exception as e:  # pickle and zip errors of every kind
        raise ExportError(f"{p}: cannot read it as a PyTorch state dict ({first_line(e)})") from e
    for key in _NESTED_KEYS:
        if isinstance(obj, Mapping) and isinstance(obj.get(key), Mapping):
            obj = obj[key]
            break
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ExportError(f"{p}: holds {type(obj).__name__}, not a state dict of tensors (save one with "
                          "torch.save(model.state_dict(), path))")
    sd = dict(obj)
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k.removeprefix("module."): v for k, v in sd.items()}
    return sd


def _is_torchscript(p: Path) -> bool:
    """A zip archive with TorchScript code in it (torch.jit.save writes `<name>/code/...`; torch.save does not)."""
    import zipfile

    try:
        with zipfile.ZipFile(p) as z:
            return any("/code/" in n for n in z.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


def load_checkpoint(model: nn.Module, path: str | os.PathLike[str]) -> nn.Module:
    """Load `path` into `model` strictly (every parameter and persistent buffer, nothing extra, same shapes);
    returns the model. A mismatch is one ExportError that lists what is missing, unexpected or mis-shaped."""
    sd = read_state_dict(path)
    own = model.state_dict()
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    misshaped = [f"{k} (model {list(own[k].shape)}, checkpoint {list(sd[k].shape)})"
                 for k in own if k in sd and tuple(own[k].shape) != tuple(sd[k].shape)]
    problems = []
    for what, keys in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)):
        if keys:
            problems.append(f"{what} {len(keys)}: {', '.join(keys[:6])}" + (" ..." if len(keys) > 6 else ""))
    if problems:
        raise ExportError(f"{path} does not fit {type(model).__name__}: " + "; ".join(problems))
    model.load_state_dict(sd, strict=True)
    return model
