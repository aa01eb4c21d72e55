"""Weights: safetensors -> device buffers through the program's recipes, with a report of missing, unexpected and
mis-shaped weights.

What a checkpoint may hold, and what happens to it (the dtype rules):
- a float weight (fp32/fp16/bf16/fp64 on the device) is read from F32, F16, BF16 or F64 and rounded to the
  device dtype, as compiling for that dtype means; from F8_E4M3 or F8_E5M2 it is widened exactly (with a notice);
  from an integer or bool tensor it is refused (a checkpoint of quantised integers needs its scales, which the
  program does not have);
- an integer weight is read from an integer or bool tensor whose values all fit the device dtype (another integer
  dtype with a notice), and refused from a float tensor or when a value does not fit;
- a bool weight is read from BOOL, or from an integer tensor of 0s and 1s (with a notice).
A non-finite float weight is an error naming the tensor, how many values and the first one: NaN or an infinity in
the checkpoint (no trained weight holds one; every output it reaches would be NaN or infinite), a value that becomes
infinite when rounded to the device dtype (1e6 in float16), and a folded weight a recipe makes non-finite.
`load_weights(..., allow_nonfinite=True)` (`--allow-nonfinite-weights`) loads such a weight with a warning instead
(an attention mask stored as a weight may hold -inf on purpose). Notices and warnings are `NPUSimWarning`s (the CLI
prints each as one line) and are listed in `WeightReport`.
"""

from __future__ import annotations

import glob
import math
import os
import warnings
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from npu_compiler.collector import collector_paused
from npu_compiler.dtypes import FLOAT_DTYPES
from npu_compiler.errors import NPUSimWarning, entry_point
from npu_compiler.limits import Limits, format_bytes
from npu_compiler.program import CompiledProgram, Recipe, WeightSpec
from npu_compiler.text import shown

from .backend import Backend, DeviceBuffer
from .dtypes import convert, np_dtype
from .errors import WeightError
from .metrics import nonfinite
from .quant_recipes import make_quant_weight
from .safetensors_file import SafetensorsFile


@dataclass
class WeightReport:
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    computed: list[str] = field(default_factory=list)
    fallbacks: dict[str, str] = field(default_factory=dict)  # key -> the key it was read from
    notices: list[str] = field(default_factory=list)  # conversions a dtype rule made
    warnings: list[str] = field(default_factory=list)  # non-finite values loaded because they were allowed

    def merge(self, other: WeightReport) -> None:
        """Add another report's entries (one weight's, made on a worker thread) after this one's, listing each key
        once as a single report would."""
        self.missing.extend(k for k in other.missing if k not in self.missing)
        self.mismatched.extend(m for m in other.mismatched if all(k != m[0] for k, _, _ in self.mismatched))
        self.computed.extend(other.computed)
        self.fallbacks.update(other.fallbacks)
        for text in other.notices:
            self.notice(text)
        for text in other.warnings:
            self.warn(text)

    def notice(self, text: str) -> None:
        if text not in self.notices:
            self.notices.append(text)

    def warn(self, text: str) -> None:
        if text not in self.warnings:
            self.warnings.append(text)

    @property
    def ok(self) -> bool:
        return not self.missing and not self.mismatched

    def summary(self) -> str:
        """One line (every key from the checkpoint escaped: `npu_compiler.text.shown`)."""
        parts = []
        if self.missing:
            parts.append(f"missing {len(self.missing)}: {', '.join(map(shown, self.missing[:10]))}"
                         + (" ..." if len(self.missing) > 10 else ""))
        if self.mismatched:
            parts.append("mis-shaped: " + ", ".join(f"{shown(k)} expected {list(e)} got {list(g)}"
                                                    for k, e, g in self.mismatched[:10]))
        if self.unexpected:
            parts.append(f"unexpected (ignored) {len(self.unexpected)}: {', '.join(map(shown, self.unexpected[:10]))}"
                         + (" ..." if len(self.unexpected) > 10 else ""))
        if self.fallbacks:
            parts.append("read from another key: " + ", ".join(f"{shown(k)} <- {shown(v)}"
                                                                for k, v in self.fallbacks.items()))
        if self.computed:
            parts.append(f"computed: {', '.join(map(shown, self.computed))}")
        if self.notices:
            parts.append("converted: " + "; ".join(self.notices[:5]) + (" ..." if len(self.notices) > 5 else ""))
        if self.warnings:
            parts.append("warnings: " + "; ".join(self.warnings[:5]) + (" ..." if len(self.warnings) > 5 else ""))
        return shown("; ".join(parts) or "all weights present")


class TensorSource:
    """State-dict tensors by key, read lazily from safetensors files (a file, a folder of shards, or a dict)."""

    def __init__(self, source: str | os.PathLike | Mapping[str, np.ndarray] | list) -> None:
        self._arrays: dict[str, np.ndarray] = {}
        self._files: dict[str, SafetensorsFile] = {}
        if isinstance(source, Mapping):
            for k, v in source.items():
                if not isinstance(k, str):
                    raise WeightError(f"weight keys must be strings, got {k!r}")
                self._arrays[k] = _to_numpy(v, k)
            return
        if not isinstance(source, str | os.PathLike | list):
            raise WeightError(f"weights must be a safetensors file, a folder of them or a dict of arrays, got "
                              f"{type(source).__name__}")
        paths: list[str] = []
        for s in source if isinstance(source, list) else [source]:
            s = os.fspath(s)
            if os.path.isdir(s):
                found = sorted(glob.glob(os.path.join(glob.escape(s), "*.safetensors")))
                if not found:
                    raise WeightError(f"no *.safetensors files in folder {s}")
                paths.extend(found)
            elif os.path.exists(s):
                paths.append(s)
            else:
                raise WeightError(f"weights file not found: {s}")
        limit = Limits().max_bytes
        for p in paths:
            f = SafetensorsFile(p, limit)
            for k in f.keys():
                if k in self._files:
                    raise WeightError(f"tensor '{k}' is in both {self._files[k].path} and {p}")
                self._files[k] = f

    def keys(self) -> set[str]:
        return set(self._arrays) | set(self._files)

    def __contains__(self, key: str) -> bool:
        return key in self._arrays or key in self._files

    def get(self, key: str) -> np.ndarray:
        if key in self._arrays:
            return self._arrays[key]
        return self._files[key].get(key)

    def where(self, key: str) -> str:
        f = self._files.get(key)
        return f"'{key}' in {f.path}" if f is not None else f"'{key}'"


def _to_numpy(v, key: str) -> np.ndarray:
    if isinstance(v, np.ndarray):
        a = v
    elif hasattr(v, "detach"):  # a torch tensor handed in by a test or the partition path
        import ml_dtypes

        t = v.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            return t.view(dtype=__import__("torch").int16).numpy().view(ml_dtypes.bfloat16)
        a = t.numpy()
    else:
        try:
            a = np.asarray(v)
        except (ValueError, TypeError) as e:
            raise WeightError(f"weight '{key}': not an array ({e})") from None
    if a.dtype.kind not in "biuf" and a.dtype.name not in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        raise WeightError(f"weight '{key}': arrays of {a.dtype} cannot be weights")
    return a


@dataclass
class WeightSet:
    """Device buffers for a program's weights, by weight (placeholder) name."""

    buffers: dict[str, DeviceBuffer]
    report: WeightReport
    backend: str


def _f32(a: np.ndarray) -> np.ndarray:
    return convert(a, "float32") if a.dtype != np.float32 else a


_F8 = ("float8_e4m3fn", "float8_e5m2")


ALLOW_HINT = "--allow-nonfinite-weights, or load_weights(..., allow_nonfinite=True), to load it anyway"


def adapt(a: np.ndarray, dtype: str, what: str, report: WeightReport, allow_nonfinite: bool = False
          ) -> np.ndarray:
    """A checkpoint tensor as the device dtype `dtype`, by the module's dtype rules (WeightError where there is
    none), with non-finite values refused (or, allowed, reported)."""
    src = a.dtype.name
    if src in _F8:
        report.notice(f"{what} is {src} in the checkpoint: widened exactly to {dtype}")
        a = a.astype(np.float32)
        src = "float32"
    if dtype in FLOAT_DTYPES:
        if a.dtype.kind not in "f" and src != "bfloat16":
            raise WeightError(f"{what} is {src} in the checkpoint, the program needs floating-point values ({dtype});"
                              " integer and bool tensors are not converted to floats (quantised weights need their "
                              "scales)")
        check_finite(a, what, report, allow_nonfinite)
        with np.errstate(over="ignore"):  # an overflow to infinity is reported below, as one line
            out = convert(a, dtype)
        if out.dtype != a.dtype and a.size and not _all_finite(out):
            with np.errstate(all="ignore"):
                grown = np.isinf(out.astype(np.float32)) & np.isfinite(a.astype(np.float32))
            n = int(np.count_nonzero(grown))
            if n:
                first = list(np.unravel_index(int(np.argmax(grown.reshape(-1))), a.shape)) if a.ndim else []
                text = (f"{what}: {n} value(s) are too large for {dtype} and become infinite (the first at "
                        f"{[int(i) for i in first]})")
                if not allow_nonfinite:
                    raise WeightError(f"{text}; compile in a wider dtype (--dtype float32 or bfloat16), or "
                                      f"{ALLOW_HINT}")
                report.warn(text)
        return out
    if dtype == "bool":
        if a.dtype == np.bool_:
            return a
        if a.dtype.kind in "iu" and np.isin(a, (0, 1)).all():
            report.notice(f"{what} is {src} in the checkpoint: read as bool (it holds only 0 and 1)")
            return a.astype(np.bool_)
        raise WeightError(f"{what} is {src} in the checkpoint, the program needs bool values")
    # an integer device dtype
    if a.dtype.kind not in "biu":
        raise WeightError(f"{what} is {src} in the checkpoint, the program needs integers ({dtype})")
    target = np_dtype(dtype)
    if a.dtype == target:
        return a
    info = np.iinfo(target)
    if a.size and (int(a.min()) < info.min or int(a.max()) > info.max):
        raise WeightError(f"{what} is {src} in the checkpoint and holds values outside {dtype}'s range "
                          f"[{info.min}, {info.max}]")
    report.notice(f"{what} is {src} in the checkpoint: converted to {dtype} (every value fits)")
    return a.astype(target)


# Per float dtype: its bits as an unsigned integer, the mask of the magnitude bits, and the all-ones exponent that
# infinities and NaNs have. Multi-GB checkpoints are checked on integer views (no widening to fp32 copies).
_SPECIAL_BITS = {"float16": (np.uint16, 0x7FFF, 0x7C00), "bfloat16": (np.uint16, 0x7FFF, 0x7F80),
                 "float32": (np.uint32, 0x7FFFFFFF, 0x7F800000),
                 "float64": (np.uint64, 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000)}
_CHUNK = 1 << 22


def _all_finite(a: np.ndarray) -> bool:
    """True when no element is an infinity or NaN; False also where the dtype has no fast test."""
    bits = _SPECIAL_BITS.get(a.dtype.name)
    if bits is None:
        return False
    utype, magnitude, special = bits
    u = np.require(a, requirements="C").reshape(-1).view(utype)
    return all(int((u[i:i + _CHUNK] & utype(magnitude)).max()) < special for i in range(0, u.size, _CHUNK))


def nonfinite_text(a: np.ndarray) -> str | None:
    """None when every value of a float array is finite (tested on its bits first: checkpoints are large); else
    `metrics.NonFinite.describe`."""
    if not a.size or a.dtype.kind not in "fV" and a.dtype.name != "bfloat16" or _all_finite(a):
        return None
    found = nonfinite(a)
    return found.describe() if found is not None else None


def check_finite(a: np.ndarray, what: str, report: WeightReport, allow_nonfinite: bool) -> None:
    """A WeightError naming `what` when `a` holds NaN or an infinity (a warning in `report` when allowed)."""
    found = nonfinite_text(a)
    if found is None:
        return
    text = f"{what} holds {found}"
    if not allow_nonfinite:
        raise WeightError(f"{text}; every output it reaches would be NaN or infinite ({ALLOW_HINT})")
    report.warn(text)


def make_weight(spec: WeightSpec, src: TensorSource, report: WeightReport, allow_nonfinite: bool = False
                ) -> np.ndarray | None:
    r: Recipe = spec.recipe

    def fetch(key: str, expect: tuple[int, ...] | None = None, fallbacks: list[str] = (),
              dtype: str | None = None) -> np.ndarray | None:
        """The tensor `key` (or the first fallback present) in `dtype` (default: fp32, what recipes compute in)."""
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
        return adapt(a, dtype or "float32", f"weight {src.where(used)}", report, allow_nonfinite)

    if r.kind == "load":
        return fetch(r.sources["weight"], spec.source_shape, r.fallback_keys, spec.dtype)
    if r.kind == "concat":
        # Horizontally fused GEMMs (q/k/v, gate/up): the parts, concatenated along `axis`, in order.
        parts = [fetch(r.sources[str(i)], tuple(shape), dtype=spec.dtype) for i, shape in enumerate(r.params["shapes"])]
        if any(a is None for a in parts):
            return None
        return np.concatenate(parts, axis=int(r.params["axis"]))
    if r.kind == "rope_inv_freq":
        for k in r.fallback_keys:
            if k in src:
                return fetch(k, spec.source_shape, dtype=spec.dtype)
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
        with np.errstate(all="ignore"):
            scale = gamma / np.sqrt(var + np.float32(r.params["eps"]))
        if np.isnan(scale).any():
            raise WeightError(f"batch norm folded into {spec.name}: running_var {src.where(s['var'])} + eps is "
                              "negative or NaN for some channels (gamma / sqrt(var + eps) is NaN)")
        # a missing conv weight is reported missing (fetch), never folded as if it were the bias
        if r.kind == "bn_fold_weight":
            w = fetch(s["weight"], spec.shape)
            if w is None:
                return None
            with np.errstate(all="ignore"):
                made = (w * scale.reshape(-1, *([1] * (w.ndim - 1)))).astype(np.float32)
        else:
            b = fetch(s["bias"], (out_ch,)) if "bias" in s else np.zeros(out_ch, np.float32)
            if b is None:
                return None
            with np.errstate(all="ignore"):
                made = ((b - mean) * scale + beta).astype(np.float32)
        # finite inputs can still fold to an infinity (running_var + eps == 0) or overflow the device dtype
        return adapt(made, spec.dtype, f"weight '{spec.name}' (batch norm folded by its {r.kind} recipe)", report,
                     allow_nonfinite)
    if r.kind in ("quantize_weight", "quant_bias", "requant_scale", "dequant_scale", "wo_quantize"):
        return make_quant_weight(spec, fetch)
    raise WeightError(f"weight {spec.name}: unknown recipe '{r.kind}' (artifact from a newer compiler?)")


# Weights are read, checked and converted on worker threads (NumPy and the page faults of the mapped file run without
# the GIL) while the caller uploads the ones before them; a few ahead bound the host memory held at once.
_WORKERS = min(8, os.cpu_count() or 1)
_AHEAD = _WORKERS + 1


def _made_in_order(specs: list[WeightSpec], src: TensorSource, allow_nonfinite: bool
                   ) -> Iterator[tuple[WeightSpec, np.ndarray | None, WeightReport]]:
    """Each weight made from its recipe, in the program's order, with its own report; an error is raised when its
    weight's turn comes, as reading them one by one would."""

    def one(spec: WeightSpec) -> tuple[WeightSpec, np.ndarray | None, WeightReport]:
        rep = WeightReport()
        return spec, make_weight(spec, src, rep, allow_nonfinite), rep

    if _WORKERS < 2:
        yield from map(one, specs)
        return
    with ThreadPoolExecutor(_WORKERS, thread_name_prefix="npusim-weights") as pool:
        pending: deque = deque()
        try:
            for spec in specs:
                pending.append(pool.submit(one, spec))
                if len(pending) >= _AHEAD:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:  # an error (or a caller that stopped) leaves the rest unread
                f.cancel()


@entry_point("loading the weights")
@collector_paused()
def load_weights(program: CompiledProgram, source, backend: Backend, *, strict: bool = True,
                 progress: Callable[[int, int, str], None] | None = None, allow_nonfinite: bool = False,
                 names: Collection[str] | None = None) -> WeightSet:
    """Read, transform (recipes) and upload every weight the program needs (the dtype rules and NaN policy are in
    the module's docstring). `names`: only the weights of these names (the rest loaded already for another program
    of the same checkpoint); checkpoint keys none of them reads are then not reported as unexpected."""
    src = source if isinstance(source, TensorSource) else TensorSource(source)
    report = WeightReport()
    limit = Limits().max_bytes
    specs = program.weights if names is None else [w for w in program.weights if w.name in names]
    for spec in specs:
        nbytes = program.buffers[spec.buffer].nbytes
        if nbytes > limit:
            raise WeightError(f"weight '{spec.name}' needs {format_bytes(nbytes)}, above the limit of "
                              f"{format_bytes(limit)} ($NPUSIM_MAX_BYTES)")
    buffers: dict[str, DeviceBuffer] = {}
    used_keys: set[str] = set()
    total = len(specs)
    for i, (spec, arr, one) in enumerate(_made_in_order(specs, src, allow_nonfinite)):
        used_keys.update(spec.recipe.sources.values())
        used_keys.update(spec.recipe.fallback_keys)
        report.merge(one)
        if arr is not None:
            if arr.size != math.prod(spec.shape):  # a recipe's result must fill the buffer the program gives it
                raise WeightError(f"weight '{spec.name}': its {spec.recipe.kind} recipe made {arr.size} values from "
                                  f"{sorted(spec.recipe.sources.values())}, the program's buffer holds "
                                  f"{math.prod(spec.shape)} (shape {list(spec.shape)})")
            arr = arr.reshape(spec.shape)
            if spec.layout:
                arr = arr.transpose(spec.layout)
            buffers[spec.name] = backend.upload(np.require(arr, requirements="C"), spec.dtype)
        if progress:
            progress(i + 1, total, spec.key)
    if names is None:
        report.unexpected = sorted(k for k in src.keys() - used_keys if not k.endswith("num_batches_tracked"))
    if strict and not report.ok:
        raise WeightError(f"weights do not match the program '{program.model_name}': {report.summary()}", report)
    for text in report.notices + report.warnings:
        warnings.warn(text, NPUSimWarning, stacklevel=2)
    return WeightSet(buffers, report, backend.name)
