"""Inputs that respect a static-KV-cache LLM graph's contract, for `verify` and `run` when they generate inputs.

The project's LLM export (`npusim export qwen2`, `export-llm`) writes `cache_map.json` beside its graphs: which
inputs are the token ids, the position ids, the cache positions, the additive mask and the caches, and the rule that
ties them together ("the query at position p sees cache slots 0..p"). Random values for each input on its own break
that rule (a mask that lets a query see slots nobody wrote, repeated cache positions), and a correct compiler then
disagrees with the reference on inputs no model run can produce. Here the step starts at a random slot s: cache
positions and position ids are s..s+T-1, the mask follows the rule, the caches hold random keys and values in slots
below s (earlier steps) and their initial value from s on, and token ids lie in the vocabulary.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from npu_compiler.program import TensorSpec
from npu_runtime.dtypes import convert

__all__ = ["LLMContract", "find_contract"]


@dataclass(frozen=True)
class LLMContract:
    cache_map: dict[str, Any]
    kind: str  # "prefill" or "decode"
    source: str  # the cache_map.json it comes from

    @property
    def graph(self) -> dict[str, Any]:
        return self.cache_map["graphs"][self.kind]

    @property
    def rope_theta(self) -> float | None:
        theta = (self.cache_map.get("rope") or {}).get("theta")
        return float(theta) if theta is not None else None

    def generate(self, specs: Sequence[TensorSpec], given: dict[str, np.ndarray], rng: np.random.Generator
                 ) -> tuple[dict[str, np.ndarray], list[str]]:
        """Arrays for the contract's inputs the user did not give, and one line per input saying how."""
        specs_by = {s.name: s for s in specs}
        names = self.graph["inputs"]
        T = int(self.graph["seq_len"])
        L = int(self.cache_map["model"]["max_cache_len"])
        vocab = int(self.cache_map["model"]["vocab_size"])
        start = int(rng.integers(0, L - T + 1))
        slots = np.arange(start, start + T, dtype=np.int64)
        out: dict[str, np.ndarray] = {}
        lines: list[str] = []
        why = f"{Path(self.source).name}'s rule, a step at slots {start}..{start + T - 1}"

        def put(name: str, value: np.ndarray, how: str) -> None:
            spec = specs_by.get(name)
            if spec is None or name in given:
                return
            out[name] = convert(np.asarray(value).reshape(spec.shape), spec.dtype)
            lines.append(f"{name} {spec.dtype}{list(spec.shape)}: {how}")

        put(names["input_ids"], rng.integers(0, vocab, size=(1, T)), f"token ids in [0, {vocab}) ({why})")
        put(names["position_ids"], slots.reshape(1, T), f"positions {start}..{start + T - 1} ({why})")
        put(names["cache_position"], slots, f"cache positions {start}..{start + T - 1} ({why})")
        masked = float(self.cache_map["attention_mask"]["masked"])
        visible = np.arange(L)[None, :] <= slots[:, None]
        mask = np.where(visible, np.float32(0.0), np.float32(masked)).astype(np.float32)
        put(names["attention_mask"], mask.reshape(1, 1, T, L), f"0 where slot <= position, {masked:g} elsewhere "
                                                                 f"({why})")
        init = float(self.cache_map["cache"].get("initial_value", 0.0))
        for layer in self.graph["layers"]:
            for kv in ("k_input", "v_input"):
                spec = specs_by.get(layer[kv])
                if spec is None:
                    continue
                cache = np.full(spec.shape, init, np.float32)
                cache[:, :, :start] = rng.standard_normal(cache[:, :, :start].shape).astype(np.float32)
                put(layer[kv], cache, f"random in slots < {start} (written by earlier steps), {init:g} from slot "
                                      f"{start} on ({why})")
        return out, lines


def find_contract(path: str | os.PathLike[str]) -> LLMContract | None:
    """The contract of an IR or artifact of the project's LLM export: the `cache_map.json` in its folder, when that
    names the file (as a graph, or through the folder's manifest.json). None for any other model."""
    p = Path(path)
    cmap_path = p.parent / "cache_map.json"
    if not cmap_path.is_file():
        return None
    try:
        cache_map = json.loads(cmap_path.read_text())
        graphs = cache_map["graphs"]
        files = {g["file"]: kind for kind, g in graphs.items()}
        man = p.parent / "manifest.json"
        if man.is_file():
            listed = json.loads(man.read_text()).get("files") or {}
            files.update({f: kind for kind, f in listed.items() if kind in graphs})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # not the export's format: no contract, plain generated inputs
    kind = files.get(p.name)
    return LLMContract(cache_map, kind, str(cmap_path)) if kind else None
