"""Where each weight placeholder of an exported Qwen2 graph gets its data.

The IR's weight_name_mapping joins placeholders to state-dict keys, but a checkpoint is not a state dict:
- tied embeddings: HF tied checkpoints store only `model.embed_tokens.weight`, while the graph's embedding and
  final linear both read the `lm_head.weight` placeholder;
- rotary `inv_freq` is a non-persistent buffer found in no checkpoint: the runtime computes it from rope_theta.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from safetensors import safe_open
from torch_ir import IR

__all__ = ["EMBED_KEY", "LM_HEAD_KEY", "checkpoint_keys", "resolve_weights"]

EMBED_KEY = "model.embed_tokens.weight"
LM_HEAD_KEY = "lm_head.weight"
_INDEX_FILE = "model.safetensors.index.json"


def checkpoint_keys(model_dir: Path) -> dict[str, str]:
    """Checkpoint key -> safetensors file name (relative to `model_dir`); reads headers only."""
    index = model_dir / _INDEX_FILE
    if index.is_file():
        return dict(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
    keys: dict[str, str] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            keys.update(dict.fromkeys(f.keys(), file.name))
    if not keys:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors checkpoint found")
    return keys


def _used_weights(ir: IR) -> dict[str, tuple[list[int], str]]:
    """Placeholders that nodes actually read (the IR's weight list also names unused ones)."""
    used = {}
    for node in ir.nodes:
        for t in node.inputs:
            if t.producer_node is None and t.name in ir.weight_name_mapping:
                used[t.name] = (list(t.shape), t.dtype)
    return used


def _source(key: str, tied: bool) -> str:
    if key.endswith("inv_freq"):
        return "rope_inv_freq"
    if tied and key == LM_HEAD_KEY:
        return "tied"
    return "checkpoint"


def resolve_weights(
    irs: Sequence[IR], *, tied: bool, checkpoint: dict[str, str] | None = None, graph_names: Sequence[str] = ()
) -> dict[str, Any]:
    """The `weights` section of cache_map.json for the placeholders used by `irs`."""
    names = list(graph_names) or ["prefill", "decode"][: len(irs)]
    placeholders: dict[str, dict[str, Any]] = {}
    for graph, ir in zip(names, irs, strict=True):
        for placeholder, (shape, dtype) in _used_weights(ir).items():
            if placeholder in placeholders:
                placeholders[placeholder]["graphs"].append(graph)
                continue
            key = ir.weight_name_mapping[placeholder]
            source = _source(key, tied)
            ckpt_key: str | None = None
            if source == "checkpoint":
                ckpt_key = key
            elif source == "tied":
                # Some tied checkpoints do store lm_head.weight; prefer it when present.
                ckpt_key = LM_HEAD_KEY if checkpoint is not None and LM_HEAD_KEY in checkpoint else EMBED_KEY
            if checkpoint is not None and ckpt_key is not None and ckpt_key not in checkpoint:
                raise KeyError(f"placeholder {placeholder} needs checkpoint key {ckpt_key!r}, absent from the model")
            placeholders[placeholder] = {
                "placeholder": placeholder,
                "state_dict_key": key,
                "checkpoint_key": ckpt_key,
                "checkpoint_file": checkpoint.get(ckpt_key) if checkpoint is not None and ckpt_key else None,
                "source": source,
                "shape": shape,
                "dtype": dtype,
                "graphs": [graph],
            }
    return {
        "note": "weights are not copied; load checkpoint_key from the model's safetensors (cast to dtype), "
        "compute rope_inv_freq placeholders from the rope section",
        "checkpoint_files": sorted(set(checkpoint.values())) if checkpoint is not None else None,
        "placeholders": placeholders,
    }
