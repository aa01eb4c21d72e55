"""Weights: safetensors (fp32/fp16/bf16) -> device buffers through the program's recipes, with a report of
missing, unexpected and mis-shaped weights."""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from npu_compiler.program import CompiledProgram, Recipe, WeightSpec

from .backend import Backend, DeviceBuffer
from .dtypes import convert
from .errors import WeightError


@dataclass
class WeightReport:
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    computed: list[str] = field(default_factory=list)
    fallbacks: dict[str, str] = field(default_factory=dict)  # key -> the key it was read from

    @property
    def ok(self) -> bool:
        return not self.missing and not self.mismatched

    def summary(self) -> str:
        parts = []
        if self.missing:
            parts.append(f"missing {len(self.missing)}: {', '.join(self.missing[:10])}"
                         + (" ..." if len(self.missing) > 10 else ""))
        if self.mismatched:
            parts.append("mis-shaped: " + ", ".join(f"{k} expected {list(e)} got {list(g)}"
                                                    for k, e, g in self.mismatched[:10]))
        if self.unexpected:
            parts.append(f"unexpected (ignored) {len(self.unexpected)}: {', '.join(self.unexpected[:10])}"
                         + (" ..." if len(self.unexpected) > 10 else ""))
        if self.fallbacks:
            parts.append("read from another key: " + ", ".join(f"{k} <- {v}" for k, v in self.fallbacks.items()))
        if self.computed:
            parts.append(f"computed: {', '.join(self.computed)}")
        return "; ".join(parts) or "all weights present"


class TensorSource:
    """State-dict tensors by key, read lazily from safetensors files (a file, a folder of shards, or a dict)."""

    def __init__(self, source: str | os.PathLike | Mapping[str, np.ndarray] | list) -> None:
        self._arrays: dict[str, np.ndarray] = {}
        self._files: dict[str, str] = {}
        if isinstance(source, Mapping):
            self._arrays = {k: _to_numpy(v) for k, v in source.items()}
            return
        paths: list[str] = []
        for s in source if isinstance(source, list) else [source]:
            s = os.fspath(s)
            if os.path.isdir(s):
                found = sorted(glob.glob(os.path.join(s, "*.safetensors")))
                if not found:
                    raise WeightError(f"no *.safetensors files in folder {s}")
                paths.extend(found)
            elif os.path.exists(s):
                paths.append(s)
            else:
                raise WeightError(f"weights file not found: {s}")
        from safetensors import safe_open

        for p in paths:
            try:
                with safe_open(p, framework="numpy") as f:
                    for k in f.keys():
                        self._files[k] = p
            except Exception as e:  # safetensors raises its own error types for a bad header
                raise WeightError(f"cannot read safetensors file {p}: {e}") from e

    def keys(self) -> set[str]:
        return set(self._arrays) | set(self._files)

    def __contains__(self, key: str) -> bool:
        return key in self._arrays or key in self._files

    def get(self, key: str) -> np.ndarray:
        if key in self._arrays:
            return self._arrays[key]
        from safetensors import safe_open

        with safe_open(self._files[key], framework="numpy") as f:
            return f.get_tensor(key)


def _to_numpy(v) -> np.ndarray:
    if isinstance(v, np.ndarray):
        return v
    if hasattr(v, "detach"):  # a torch tensor handed in by a test or the partition path
        import ml_dtypes

        t = v.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            return t.view(dtype=__import__("torch").int16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()
    return np.asarray(v)


@dataclass
class WeightSet:
    """Device buffers for a program's weights, by weight (placeholder) name."""

    buffers: dict[str, DeviceBuffer]
    report: WeightReport
    backend: str


def _f32(a: np.ndarray) -> np.ndarray:
    return convert(a, "float32") if a.dtype != np.float32 else a


def make_weight(spec: WeightSpec, src: TensorSource, report: WeightReport) -> np.ndarray | None:
    r: Recipe = spec.recipe

    def fetch(key: str, expect: tuple[int, ...] | None = None, fallbacks: list[str] = ()) -> np.ndarray | None:
        used = key
        if key not in src:
            used = next((k for k in fallbacks if k in src), None)
            if used is None:
                if key not in report.missing:  # a key two recipes read (a folded BN's stats) is listed once
                    report.missing.append(key)
                return None
            report.fallbacks[key] = used
        a = src.get(used)
        if expect is not None and tuple(a.shape) != tuple(expect):
            if all(k != key for k, _, _ in report.mismatched):
                report.mismatched.append((key, tuple(expect), tuple(a.shape)))
            return None
        return a

    if r.kind == "load":
        a = fetch(r.sources["weight"], spec.source_shape, r.fallback_keys)
        return None if a is None else convert(a, spec.dtype)
    if r.kind == "concat":
        # Horizontally fused GEMMs (q/k/v, gate/up): the parts, concatenated along `axis`, in order.
        parts = [fetch(r.sources[str(i)], tuple(shape)) for i, shape in enumerate(r.params["shapes"])]
        if any(a is None for a in parts):
            return None
        return np.concatenate([convert(a, spec.dtype) for a in parts], axis=int(r.params["axis"]))
    if r.kind == "rope_inv_freq":
        for k in r.fallback_keys:
            if k in src:
                return convert(fetch(k, spec.source_shape), spec.dtype)
        dim, base = int(r.params["dim"]), float(r.params["base"])
        report.computed.append(f"{spec.key} (rope_theta={base:g})")
        inv = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))
        return convert(inv.astype(np.float32), spec.dtype)
    if r.kind in ("bn_fold_weight", "bn_fold_bias"):
        s = r.sources
        out_ch = spec.shape[0]
        gamma = fetch(s["gamma"], (out_ch,))
        beta = fetch(s["beta"], (out_ch,))
        mean = fetch(s["mean"], (out_ch,))
        var = fetch(s["var"], (out_ch,))
        if any(x is None for x in (gamma, beta, mean, var)):
            return None
        scale = _f32(gamma) / np.sqrt(_f32(var) + np.float32(r.params["eps"]))
        if r.kind == "bn_fold_weight":
            w = fetch(s["weight"], spec.shape)
            if w is None:
                return None
            return convert((_f32(w) * scale.reshape(-1, *([1] * (w.ndim - 1)))).astype(np.float32), spec.dtype)
        b = _f32(fetch(s["bias"], (out_ch,))) if "bias" in s else np.zeros(out_ch, np.float32)
        return convert(((b - _f32(mean)) * scale + _f32(beta)).astype(np.float32), spec.dtype)
    raise WeightError(f"weight {spec.name}: unknown recipe '{r.kind}' (artifact from a newer compiler?)")


def load_weights(program: CompiledProgram, source, backend: Backend, *, strict: bool = True,
                 progress: Callable[[int, int, str], None] | None = None) -> WeightSet:
    """Read, transform (recipes) and upload every weight the program needs."""
    src = source if isinstance(source, TensorSource) else TensorSource(source)
    report = WeightReport()
    buffers: dict[str, DeviceBuffer] = {}
    used_keys: set[str] = set()
    total = len(program.weights)
    for i, spec in enumerate(program.weights):
        used_keys.update(spec.recipe.sources.values())
        used_keys.update(spec.recipe.fallback_keys)
        arr = make_weight(spec, src, report)
        if arr is not None:
            buffers[spec.name] = backend.upload(np.ascontiguousarray(arr.reshape(spec.shape)), spec.dtype)
        if progress:
            progress(i + 1, total, spec.key)
    report.unexpected = sorted(k for k in src.keys() - used_keys if not k.endswith("num_batches_tracked"))
    if strict and not report.ok:
        raise WeightError(f"weights do not match the program '{program.model_name}': {report.summary()}", report)
    return WeightSet(buffers, report, backend.name)
