"""`CompiledProgram`: everything a backend needs to run a model, and its `.npubin` serialisation.

File layout: MAGIC (8 bytes) | format version (u32 LE) | payload length (u64 LE) | CRC-32 of payload (u32 LE)
| payload (msgpack, no pickle). Every field is checked on load, so a truncated, corrupted or foreign file
gives a clear error instead of a wrong program.
"""

from __future__ import annotations

import dataclasses
import math
import os
import struct
import tempfile
import zlib
from dataclasses import dataclass, field
from typing import Any

import msgpack

from .dtypes import itemsize
from .errors import ArtifactError

MAGIC = b"NPUBIN\x00\x1a"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sIQI")


def contiguous_strides(shape: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


@dataclass
class TensorRef:
    """A strided view (in elements) of one planned buffer."""

    buffer: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        return all(s == c for d, s, c in zip(self.shape, self.strides, contiguous_strides(self.shape)) if d != 1)


@dataclass
class BufferSpec:
    """kind: 'input' | 'output' | 'weight' | 'constant' | 'arena' (an intermediate placed in the arena)."""

    id: int
    name: str
    kind: str
    dtype: str
    numel: int
    offset: int = -1  # byte offset inside the arena (arena buffers only)
    data: bytes | None = None  # constants only (little-endian raw)

    @property
    def nbytes(self) -> int:
        return self.numel * itemsize(self.dtype)


@dataclass
class TensorSpec:
    """A graph input or output as the user sees it (`dtype`) and as the device holds it (`device_dtype`)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    device_dtype: str
    buffer: int
    alias_of: str | None = None  # an output that is an input updated in place (the KV cache)
    value_range: tuple[int, int] | None = None  # integer inputs: the valid [lo, hi) (e.g. token ids < vocab)


@dataclass
class Recipe:
    """How a device weight is made from the checkpoint. kind: 'load' | 'bn_fold_weight' | 'bn_fold_bias' |
    'rope_inv_freq'. `sources` maps a role to a state-dict key; `fallback_keys` are tried in order when the
    key is absent (a tied lm_head read from the embedding)."""

    kind: str
    sources: dict[str, str] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    fallback_keys: list[str] = field(default_factory=list)


@dataclass
class WeightSpec:
    name: str  # the placeholder name in the graph (or a compiler-made name for folded weights)
    key: str  # the state-dict key it is bound to (or a description for computed weights)
    shape: tuple[int, ...]
    dtype: str  # on the device
    source_shape: tuple[int, ...]
    buffer: int
    recipe: Recipe


@dataclass
class KernelCall:
    """One launch. kind: 'generated' (an expression kernel) or a library kernel ('gemm', 'conv2d', 'softmax',
    'attention', 'embedding', 'index_copy', 'max_pool2d', 'avg_pool2d', 'adaptive_avg_pool2d', 'rmsnorm', ...).
    `nodes` are the IR nodes it came from; `group` names the fusion pattern (or the single op)."""

    name: str
    kind: str
    args: list[TensorRef]
    outs: list[TensorRef]
    params: dict[str, Any] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)
    group: str = ""
    expr: list | None = None  # generated kernels: nodes.to_data(expression)
    reduce_shape: tuple[int, ...] = ()
    source: str | None = None  # name of the rendered source in CompiledProgram.sources
    # IR value names of the node being lowered when this kernel was emitted (per-node verify maps the kernel's
    # output back to the reference with it); empty in artifacts written before the field existed.
    out_values: list[str] = field(default_factory=list)


@dataclass
class CompiledProgram:
    model_name: str
    target: str
    compute_dtype: str
    config: dict[str, Any]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    weights: list[WeightSpec]
    buffers: list[BufferSpec]
    kernels: list[KernelCall]
    arena_bytes: int
    sources: dict[str, str] = field(default_factory=dict)  # rendered kernel sources for the target, by name
    passes: list[str] = field(default_factory=list)
    fusion_groups: list[dict[str, Any]] = field(default_factory=list)
    padding_plan: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    # ---- lookup -------------------------------------------------------------------------------------------
    def buffer(self, bid: int) -> BufferSpec:
        return self.buffers[bid]

    @property
    def weight_bytes(self) -> int:
        return sum(self.buffers[w.buffer].nbytes for w in self.weights)

    @property
    def buffer_bytes(self) -> int:
        """Device memory the program needs besides weights: arena, inputs, outputs and constants."""
        own = sum(b.nbytes for b in self.buffers if b.kind in ("input", "output", "constant"))
        return self.arena_bytes + own

    # ---- serialisation -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompiledProgram:
        def ref(r: dict) -> TensorRef:
            return TensorRef(r["buffer"], tuple(r["shape"]), tuple(r["strides"]), r["offset"])

        def tspec(t: dict) -> TensorSpec:
            vr = t.get("value_range")
            return TensorSpec(t["name"], tuple(t["shape"]), t["dtype"], t["device_dtype"], t["buffer"],
                              t.get("alias_of"), tuple(vr) if vr else None)

        return cls(
            model_name=d["model_name"],
            target=d["target"],
            compute_dtype=d["compute_dtype"],
            config=d["config"],
            inputs=[tspec(t) for t in d["inputs"]],
            outputs=[tspec(t) for t in d["outputs"]],
            weights=[
                WeightSpec(w["name"], w["key"], tuple(w["shape"]), w["dtype"], tuple(w["source_shape"]), w["buffer"],
                           Recipe(**w["recipe"]))
                for w in d["weights"]
            ],
            buffers=[BufferSpec(**b) for b in d["buffers"]],
            kernels=[
                KernelCall(k["name"], k["kind"], [ref(a) for a in k["args"]], [ref(o) for o in k["outs"]], k["params"],
                           k["nodes"], k["group"], k["expr"], tuple(k["reduce_shape"]), k["source"],
                           list(k.get("out_values") or []))
                for k in d["kernels"]
            ],
            arena_bytes=d["arena_bytes"],
            sources=d["sources"],
            passes=d["passes"],
            fusion_groups=d["fusion_groups"],
            padding_plan=d["padding_plan"],
            stats=d["stats"],
            format_version=d["format_version"],
        )

    def to_bytes(self) -> bytes:
        payload = msgpack.packb(self.to_dict(), use_bin_type=True)
        return _HEADER.pack(MAGIC, FORMAT_VERSION, len(payload), zlib.crc32(payload)) + payload

    @classmethod
    def from_bytes(cls, blob: bytes, where: str = "<bytes>") -> CompiledProgram:
        if len(blob) < _HEADER.size:
            raise ArtifactError(f"{where}: not a .npubin artifact (only {len(blob)} bytes, truncated?)")
        magic, version, length, crc = _HEADER.unpack_from(blob)
        if magic != MAGIC:
            raise ArtifactError(f"{where}: not a .npubin artifact (bad magic {magic!r})")
        if version != FORMAT_VERSION:
            raise ArtifactError(f"{where}: .npubin format version {version}, this build reads version "
                                f"{FORMAT_VERSION}; recompile the model with this version of npusim")
        payload = blob[_HEADER.size:]
        if len(payload) != length:
            raise ArtifactError(f"{where}: truncated .npubin: header says {length} payload bytes, file has "
                                f"{len(payload)}")
        if zlib.crc32(payload) != crc:
            raise ArtifactError(f"{where}: corrupted .npubin: checksum mismatch")
        try:
            d = msgpack.unpackb(payload, raw=False, strict_map_key=False)
            return cls.from_dict(d)
        except (ValueError, KeyError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
            raise ArtifactError(f"{where}: corrupted .npubin payload: {e}") from e

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically: a failed write leaves no half-written artifact behind."""
        path = os.fspath(path)
        blob = self.to_bytes()
        folder = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".npubin-", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike) -> CompiledProgram:
        path = os.fspath(path)
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except FileNotFoundError as e:
            raise ArtifactError(f"artifact not found: {path}") from e
        return cls.from_bytes(blob, path)

    # ---- inspection ----------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """A JSON-able summary: I/O, weights and recipes, buffers and memory, kernels with their source nodes."""
        arena = [b for b in self.buffers if b.kind == "arena"]
        return {
            "model_name": self.model_name,
            "target": self.target,
            "compute_dtype": self.compute_dtype,
            "format_version": self.format_version,
            "config": self.config,
            "passes": self.passes,
            "inputs": [_io(t) for t in self.inputs],
            "outputs": [_io(t) for t in self.outputs],
            "kernel_count": len(self.kernels),
            "kernels_by_kind": _count(k.kind for k in self.kernels),
            "buffer_bytes": self.buffer_bytes,
            "arena_bytes": self.arena_bytes,
            "peak_intermediate_bytes": self.arena_bytes,
            "unplanned_intermediate_bytes": sum(b.nbytes for b in arena),
            "weight_bytes": self.weight_bytes,
            "weights": [
                {"name": w.name, "key": w.key, "shape": list(w.shape), "dtype": w.dtype, "recipe": w.recipe.kind,
                 "sources": w.recipe.sources}
                for w in self.weights
            ],
            "buffers": [
                {"id": b.id, "name": b.name, "kind": b.kind, "dtype": b.dtype, "numel": b.numel, "bytes": b.nbytes,
                 "offset": b.offset}
                for b in self.buffers
            ],
            "kernels": [
                {"index": i, "name": k.name, "kind": k.kind, "group": k.group, "nodes": k.nodes,
                 "out_shape": list(k.outs[0].shape) if k.outs else []}
                for i, k in enumerate(self.kernels)
            ],
            "fusion_groups": self.fusion_groups,
            "padding_plan": self.padding_plan,
            "stats": self.stats,
        }


def _io(t: TensorSpec) -> dict[str, Any]:
    d = {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "device_dtype": t.device_dtype}
    if t.alias_of:
        d["alias_of"] = t.alias_of
    if t.value_range:
        d["value_range"] = list(t.value_range)
    return d


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for it in items:
        out[it] = out.get(it, 0) + 1
    return out
