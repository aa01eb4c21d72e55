"""`CompiledProgram`: everything a backend needs to run a model, and its `.npubin` serialisation.

File layout: MAGIC (8 bytes) | format version (u32 LE) | payload length (u64 LE) | SHA-256 of the payload (32 bytes)
| payload (msgpack, no pickle). The payload is data: specs, recipes, the buffer plan and the kernels as typed records
and expression trees. Nothing in it is executed as host code, and every field is checked on load (types, ranges,
every view inside its buffer, every kernel record against its tensors), so a truncated, corrupted, crafted or foreign
file gives a clear `ArtifactError` naming the field instead of a wrong program or a crash.

The digest finds damage; anyone can recompute it after editing the payload. What keeps an edited artifact from
running with other answers is the reader: every field is required (a field the file lacks is an error, never a
default: a kernel record read with a default would compute something else), of its type and in its range. The
payload also records the SHA-256 of the weights the program was compiled or verified with, when they were given
(`weights_sha256`, `npu_compiler.digest.weights_digest`), so that `run` can say when other weights are bound.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from .atomic import note_input, write_bytes
from .buffers import BufferSpec, TensorSpec
from .collector import collector_paused
from .devices import DeviceProfile
from .dtypes import ITEMSIZE
from .errors import ArtifactError, entry_point
from .kernels import KINDS, KernelCall, plan_from_data, spec_from_data
from .limits import Limits
from .memory_check import check_memory
from .recipes import Recipe
from .tensor import TensorRef, contiguous_strides, memory_order
from .text import shown, unsafe_char

MAGIC = b"NPUBIN\x00\x1a"
# 2: kernels are typed records and expression trees; no rendered sources, no host code (CRC-32 of the payload)
# 3: SHA-256 of the payload; every field required; the weights' SHA-256 when known
# 4: schedules are plans beside the records (a kernel's `plan` and `scratch`), and the artifact records the device it
# was planned for
FORMAT_VERSION = 4
_HEADER = struct.Struct("<8sIQ32s")
_PREFIX = struct.Struct("<8sI")  # magic and version: the same in every format
HEADER_BYTES = _HEADER.size
MAX_ARTIFACT_BYTES = 1 << 34  # an artifact holds no weights: anything this large is not one
MAX_ELEMENTS = 1 << 40
MAX_RANK = 16
MAX_ITEMS = 1 << 20  # buffers, kernels, specs: far above any real model, far below what would exhaust memory
BUFFER_KINDS = ("input", "output", "weight", "constant", "arena")
RECIPE_KINDS = ("load", "concat", "bn_fold_weight", "bn_fold_bias", "rope_inv_freq", "quantize_weight", "quant_bias",
                "requant_scale", "dequant_scale", "wo_quantize")

__all__ = ["CompiledProgram", "KernelCall", "TensorRef", "TensorSpec", "BufferSpec", "WeightSpec", "Recipe",
           "contiguous_strides", "full_ref", "FORMAT_VERSION", "pack_payload", "HEADER_BYTES"]




@dataclass
class WeightSpec:
    name: str  # the placeholder name in the graph (or a compiler-made name for folded weights)
    key: str  # the state-dict key it is bound to (or a description for computed weights)
    shape: tuple[int, ...]
    dtype: str  # on the device
    source_shape: tuple[int, ...]
    buffer: int
    recipe: Recipe
    # the device buffer holds the weight with its dims in this order (`np.transpose`); () keeps them as they are.
    # A conv weight [O, C, kh, kw] stored as [O, kh, kw, C] (0, 2, 3, 1) for an implicit GEMM over channels-last
    # activations; every kernel reads it through the strided view the lowering binds.
    layout: tuple[int, ...] = ()

    @property
    def device_shape(self) -> tuple[int, ...]:
        """The shape of the buffer as uploaded (the shape with the layout's order of dims)."""
        return tuple(self.shape[d] for d in self.layout) if self.layout else tuple(self.shape)


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
    passes: list[str] = field(default_factory=list)
    fusion_groups: list[dict[str, Any]] = field(default_factory=list)
    padding_plan: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    # SHA-256 of the checkpoint the program was compiled or verified with (npu_compiler.digest), or None
    weights_sha256: str | None = None
    # the device profile (devices.py) the program was planned for; None for a target that renders for no
    # GPU (cpu)
    device: DeviceProfile | None = None

    # ---- lookup -------------------------------------------------------------------------------------------------
    def buffer(self, bid: int) -> BufferSpec:
        return self.buffers[bid]

    def dtype_of(self, ref: TensorRef) -> str:
        return self.buffers[ref.buffer].dtype

    @property
    def weight_bytes(self) -> int:
        return sum(self.buffers[w.buffer].nbytes for w in self.weights)

    @property
    def buffer_bytes(self) -> int:
        """Device memory the program needs besides weights: arena, inputs, outputs and constants."""
        own = sum(b.nbytes for b in self.buffers if b.kind in ("input", "output", "constant"))
        return self.arena_bytes + own

    def kernel_cost(self, k: KernelCall):
        """FLOPs and bytes of one kernel (its kind's cost model)."""
        return k.spec.cost(k, self.buffers)

    # ---- serialisation ------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["inputs"] = [dataclasses.asdict(t) for t in self.inputs]
        d["outputs"] = [dataclasses.asdict(t) for t in self.outputs]
        d["weights"] = [dataclasses.asdict(w) for w in self.weights]
        d["buffers"] = [dataclasses.asdict(b) for b in self.buffers]
        d["kernels"] = [k.to_dict() for k in self.kernels]
        d["device"] = self.device.to_dict() if self.device is not None else None
        return d

    @classmethod
    @entry_point("reading the artifact")
    @collector_paused()
    def from_dict(cls, d: Any, where: str = "<artifact>") -> CompiledProgram:
        """A program from its data form; every field checked (ArtifactError naming the field otherwise)."""
        return _Reader(where).program(d)

    def to_bytes(self) -> bytes:
        return pack_artifact(self.to_dict())

    @classmethod
    @entry_point("reading the artifact")
    def from_bytes(cls, blob: bytes, where: str = "<bytes>") -> CompiledProgram:
        return cls.from_dict(unpack_artifact(blob, where), where)

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically (a failed write leaves no half-written artifact behind), readable as the user's umask
        allows; an OutputError when the folder does not exist."""
        write_bytes(path, self.to_bytes())

    @classmethod
    @entry_point("reading the artifact")
    def load(cls, path: str | os.PathLike) -> CompiledProgram:
        path = os.fspath(path)
        return cls.from_bytes(read_artifact_file(path), path)

    # ---- inspection ---------------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """A JSON-able summary: I/O, weights and recipes, buffers and memory, kernels with their source nodes."""
        arena = [b for b in self.buffers if b.kind == "arena"]
        return {
            "model_name": self.model_name,
            "target": self.target,
            "compute_dtype": self.compute_dtype,
            "format_version": self.format_version,
            "weights_sha256": self.weights_sha256,
            "planned_for": self.device.to_dict() if self.device is not None else None,
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
                 "sources": w.recipe.sources, **({"layout": list(w.layout)} if w.layout else {})}
                for w in self.weights
            ],
            "buffers": [
                {"id": b.id, "name": b.name, "kind": b.kind, "dtype": b.dtype, "numel": b.numel, "bytes": b.nbytes,
                 "offset": b.offset}
                for b in self.buffers
            ],
            "kernels": [_kernel_row(i, k, self.buffers) for i, k in enumerate(self.kernels)],
            "fusion_groups": self.fusion_groups,
            "padding_plan": self.padding_plan,
            "stats": self.stats,
        }


# ---- the container: header, checksum, msgpack payload (shared by every kind of artifact) ----------------------------


def pack_artifact(data: dict[str, Any]) -> bytes:
    """An artifact's bytes: the header and the payload (`data` as msgpack)."""
    return pack_payload(msgpack.packb(data, use_bin_type=True))


def pack_payload(payload: bytes) -> bytes:
    """A `.npubin` of `payload` (msgpack bytes): the header with the payload's length and SHA-256, then the payload."""
    return _HEADER.pack(MAGIC, FORMAT_VERSION, len(payload), hashlib.sha256(payload).digest()) + payload


def unpack_artifact(blob: bytes, where: str) -> Any:
    """The payload of an artifact's bytes, after the header's magic, version, length and SHA-256 are checked."""
    if len(blob) < _PREFIX.size:
        raise ArtifactError(f"{where}: not a .npubin artifact (only {len(blob)} bytes, truncated?)")
    magic, version = _PREFIX.unpack_from(blob)
    if magic != MAGIC:
        raise ArtifactError(f"{where}: not a .npubin artifact (bad magic {magic!r})")
    if version != FORMAT_VERSION:
        raise ArtifactError(f"{where}: .npubin format version {version}, this build reads version "
                            f"{FORMAT_VERSION}{_version_note(version)}; recompile it from its IR with this version of "
                            "npusim (npusim compile IR.json -o X.npubin; an export-llm folder: npusim export-llm "
                            "again)")
    if len(blob) < _HEADER.size:
        raise ArtifactError(f"{where}: truncated .npubin (only {len(blob)} bytes, the header alone has "
                            f"{_HEADER.size})")
    _, _, length, digest = _HEADER.unpack_from(blob)
    payload = blob[_HEADER.size:]
    if len(payload) != length:
        raise ArtifactError(f"{where}: truncated .npubin: header says {length} payload bytes, file has "
                            f"{len(payload)}")
    if hashlib.sha256(payload).digest() != digest:
        raise ArtifactError(f"{where}: corrupted .npubin: the payload's SHA-256 is not the one its header records")
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError,
            UnicodeDecodeError) as e:
        raise ArtifactError(f"{where}: corrupted .npubin payload: {e}") from e


def _version_note(version: int) -> str:
    if version < FORMAT_VERSION:
        return " (written by an older npusim: its fields and checksum are not this version's)"
    return " (written by a newer npusim)"


def read_artifact_file(path: str) -> bytes:
    """An artifact file's bytes (its size bounded first); ArtifactError when it cannot be read."""
    try:
        size = os.path.getsize(path)
        if size > MAX_ARTIFACT_BYTES:
            raise ArtifactError(f"{path}: {size} bytes is too large for a .npubin artifact")
        with open(path, "rb") as f:
            note_input(path)
            return f.read()
    except FileNotFoundError as e:
        raise ArtifactError(f"artifact not found: {path}") from e
    except IsADirectoryError as e:
        raise ArtifactError(f"{path} is a folder, not a .npubin artifact") from e
    except OSError as e:
        raise ArtifactError(f"cannot read {path}: {e.strerror or e}") from e


def full_ref(buf: BufferSpec, shape: tuple[int, ...] | None = None) -> TensorRef:
    """The whole of `buf`, contiguous (as `shape`, or flat)."""
    shape = tuple(shape) if shape is not None else (buf.numel,)
    return TensorRef(buf.id, shape, contiguous_strides(shape), 0)


def number_format(k: KernelCall, buffers: list[BufferSpec]) -> str:
    """What a kernel computes in: int8 with int32 sums for the integer kinds, else its operands' dtypes and its
    result's ("int8 -> float32" for a dequantize, "float32" for a float kernel)."""
    from .kernels import INTEGER_KINDS

    out = buffers[k.outs[0].buffer].dtype if k.outs else "-"
    if k.kind in INTEGER_KINDS:
        return f"{out} (int32 acc)" if k.kind != "qadd" else f"{out} (rescaled)"
    ins = list(dict.fromkeys(buffers[r.buffer].dtype for r in k.args if buffers[r.buffer].kind != "weight"))
    return out if not ins or ins == [out] else f"{'/'.join(ins)} -> {out}"


def _kernel_row(i: int, k: KernelCall, buffers: list[BufferSpec]) -> dict[str, Any]:
    row = {"index": i, "name": k.name, "kind": k.kind, "group": k.group, "nodes": k.nodes,
           "out_shape": list(k.outs[0].shape) if k.outs else [], "format": number_format(k, buffers)}
    order = memory_order(tuple(k.outs[0].shape), tuple(k.outs[0].strides)) if k.outs else None
    if order is not None:  # the output is stored with its dims in another order (channels-last: [0, 2, 3, 1])
        row["out_order"] = order
    splits = getattr(k.plan, "splits", 0)
    if splits and splits > 1:
        row["splits"] = splits
    return row


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


# ---- reading an artifact: every field checked ---------------------------------------------------------------------


class _Reader:
    """Reads a program's data form field by field; the first problem is an ArtifactError naming the file and field."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, path: str, what: str) -> ArtifactError:
        return ArtifactError(f"{self.where}: invalid artifact: {path}: {what}")

    # scalars
    def get(self, d: Any, key: str, path: str) -> Any:
        if not isinstance(d, dict):
            raise self.fail(path, f"expected a mapping, got {type(d).__name__}")
        if key not in d:
            raise self.fail(f"{path}.{key}" if path else key, "missing")
        return d[key]

    def int_(self, v: Any, path: str, lo: int = 0, hi: int = MAX_ELEMENTS) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(path, f"expected an integer, got {_short(v)}")
        if not lo <= v <= hi:
            raise self.fail(path, f"{v} is outside [{lo}, {hi}]")
        return v

    def str_(self, v: Any, path: str, choices: tuple[str, ...] | None = None) -> str:
        if not isinstance(v, str):
            raise self.fail(path, f"expected a string, got {_short(v)}")
        bad = unsafe_char(v)
        if bad is not None:  # every string of an artifact is a name or a keyword, and names are printed
            raise self.fail(path, f"'{shown(v)}' holds the control character {bad}")
        if choices is not None and v not in choices:
            raise self.fail(path, f"{v!r} is not one of {', '.join(choices)}")
        return v

    def dtype(self, v: Any, path: str) -> str:
        return self.str_(v, path, tuple(ITEMSIZE))

    def list_(self, v: Any, path: str, limit: int = MAX_ITEMS) -> list:
        if not isinstance(v, list | tuple):
            raise self.fail(path, f"expected a list, got {_short(v)}")
        if len(v) > limit:
            raise self.fail(path, f"{len(v)} entries (at most {limit})")
        return list(v)

    def ints(self, v: Any, path: str, lo: int = 0, hi: int = MAX_ELEMENTS, limit: int = MAX_RANK) -> tuple[int, ...]:
        items = self.list_(v, path, limit)
        if all(type(x) is int and lo <= x <= hi for x in items):  # the common case, without a path per item
            return tuple(items)
        return tuple(self.int_(x, f"{path}[{i}]", lo, hi) for i, x in enumerate(items))

    def strs(self, v: Any, path: str) -> list[str]:
        return [self.str_(x, f"{path}[{i}]") for i, x in enumerate(self.list_(v, path))]

    def each(self, v: Any, path: str, fn: Callable[[Any, str], Any]) -> list:
        return [fn(x, f"{path}[{i}]") for i, x in enumerate(self.list_(v, path))]

    # records
    def program(self, d: Any) -> CompiledProgram:
        if not isinstance(d, dict):
            raise self.fail("payload", f"expected a mapping, got {type(d).__name__}")
        if "segments" in d:
            raise ArtifactError(f"{self.where}: a partitioned artifact (accelerator and CPU segments), not one "
                                "program: read it with npu_compiler.load_artifact")
        version = self.int_(self.get(d, "format_version", ""), "format_version", 0, 2**32)
        if version != FORMAT_VERSION:
            raise ArtifactError(f"{self.where}: format version {version}; recompile the model with this version")
        buffers = self.each(self.get(d, "buffers", ""), "buffers", self.buffer_spec)
        for i, b in enumerate(buffers):
            if b.id != i:
                raise self.fail(f"buffers[{i}].id", f"{b.id} (buffers are numbered in order)")
        arena = self.int_(self.get(d, "arena_bytes", ""), "arena_bytes", 0, MAX_ELEMENTS)
        for b in buffers:
            if b.kind == "arena" and b.numel and (b.offset < 0 or b.offset + b.nbytes > arena):
                raise self.fail(f"buffers[{b.id}]", f"arena bytes [{b.offset}, {b.offset + b.nbytes}) outside the "
                                f"arena of {arena} bytes")
        self.buffers = buffers
        inputs = self.each(self.get(d, "inputs", ""), "inputs", lambda v, p: self.tensor_spec(v, p, ("input",)))
        names = {t.name for t in inputs}
        if len(names) != len(inputs):
            raise self.fail("inputs", "two inputs share a name")
        outputs = self.each(self.get(d, "outputs", ""), "outputs",
                            lambda v, p: self.tensor_spec(v, p, ("output", "input", "weight", "constant", "arena")))
        for i, t in enumerate(outputs):
            if t.alias_of is not None and t.alias_of not in names:
                raise self.fail(f"outputs[{i}].alias_of", f"{t.alias_of!r} is not an input")
        weights = self.each(self.get(d, "weights", ""), "weights", self.weight_spec)
        # each input and weight buffer is filled by exactly one spec (by name): a buffer two specs claim, or none,
        # would be run unfilled
        for what, specs, kind in (("inputs", inputs, "input"), ("weights", weights, "weight")):
            claimed = [t.buffer for t in specs]
            if len(set(claimed)) != len(claimed) or len({t.name for t in specs}) != len(specs):
                raise self.fail(what, "two entries share a name or a buffer")
            unfilled = [b.id for b in buffers if b.kind == kind and b.id not in set(claimed)]
            if unfilled:
                raise self.fail(what, f"{kind} buffer {unfilled[0]} belongs to none of them")
        kernels = self.each(self.get(d, "kernels", ""), "kernels", self.kernel)
        target = self.str_(self.get(d, "target", ""), "target")
        try:
            # an expression kernel's iteration space is memory only on a backend that interprets it whole (the cpu
            # one, which bounds it before running: npu_runtime/cpu/executor.py), never in the artifact itself
            check_memory(buffers, kernels, outputs, Limits().max_bytes, iteration_space=False)
        except ValueError as e:
            raise self.fail("memory plan", str(e)) from None
        opaque = {k: self.get(d, k, "") for k in ("config", "stats")}
        for k, v in opaque.items():
            if not isinstance(v, dict):
                raise self.fail(k, f"expected a mapping, got {type(v).__name__}")
        return CompiledProgram(
            model_name=self.str_(self.get(d, "model_name", ""), "model_name"),
            target=target,
            compute_dtype=self.dtype(self.get(d, "compute_dtype", ""), "compute_dtype"),
            config=opaque["config"],
            inputs=inputs,
            outputs=outputs,
            weights=weights,
            buffers=buffers,
            kernels=kernels,
            arena_bytes=arena,
            passes=self.strs(self.get(d, "passes", ""), "passes"),
            fusion_groups=self.each(self.get(d, "fusion_groups", ""), "fusion_groups", self.fusion_group),
            padding_plan=self.each(self.get(d, "padding_plan", ""), "padding_plan", self.mapping),
            stats=opaque["stats"],
            format_version=version,
            weights_sha256=self.sha256(self.get(d, "weights_sha256", ""), "weights_sha256"),
            device=self.device(self.get(d, "device", ""), target),
        )

    def sha256(self, v: Any, path: str) -> str | None:
        if v is None:
            return None
        text = self.str_(v, path)
        if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
            raise self.fail(path, f"expected null or 64 lowercase hex digits, got {_short(v)}")
        return text

    def device(self, v: Any, target: str) -> DeviceProfile | None:
        """The device profile the program was planned for (null: none, the target's default chip), checked field by
        field and against the target."""
        if v is None:
            return None
        try:
            profile = DeviceProfile.from_dict(v, "device")
        except ArtifactError as e:
            raise ArtifactError(f"{self.where}: invalid artifact: {e}") from None
        if target == "cpu" or (target == "cuda" and profile.vendor != "nvidia") or (target == "hip"
                                                                                   and profile.vendor != "amd"):
            raise self.fail("device", f"a {profile.vendor} device ({profile.title}) for target {target!r}")
        return profile

    def mapping(self, v: Any, path: str) -> dict:
        if not isinstance(v, dict):
            raise self.fail(path, f"expected a mapping, got {type(v).__name__}")
        return v

    def fusion_group(self, v: Any, path: str) -> dict:
        self.str_(self.get(v, "kernel", path), f"{path}.kernel")
        self.str_(self.get(v, "group", path), f"{path}.group")
        self.strs(self.get(v, "nodes", path), f"{path}.nodes")
        return v

    def buffer_spec(self, v: Any, path: str) -> BufferSpec:
        b = BufferSpec(
            id=self.int_(self.get(v, "id", path), f"{path}.id", 0, MAX_ITEMS),
            name=self.str_(self.get(v, "name", path), f"{path}.name"),
            kind=self.str_(self.get(v, "kind", path), f"{path}.kind", BUFFER_KINDS),
            dtype=self.dtype(self.get(v, "dtype", path), f"{path}.dtype"),
            numel=self.int_(self.get(v, "numel", path), f"{path}.numel"),
            offset=self.int_(self.get(v, "offset", path), f"{path}.offset", -1, MAX_ELEMENTS),
        )
        if b.nbytes > MAX_ELEMENTS:
            raise self.fail(f"{path}.numel", f"{b.numel} elements of {b.dtype} is too large")
        data = self.get(v, "data", path)
        if b.kind == "constant":
            if not isinstance(data, bytes) or len(data) != b.nbytes:
                raise self.fail(f"{path}.data", f"a constant of {b.nbytes} bytes needs exactly that many bytes of "
                                "data")
            b.data = data
        elif data is not None:
            raise self.fail(f"{path}.data", "only constants carry data")
        return b

    def buffer_id(self, v: Any, path: str, kinds: tuple[str, ...] | None = None) -> int:
        bid = self.int_(v, path, 0, max(len(self.buffers) - 1, 0))
        if not self.buffers:
            raise self.fail(path, "the program has no buffers")
        if kinds is not None and self.buffers[bid].kind not in kinds:
            raise self.fail(path, f"buffer {bid} is a {self.buffers[bid].kind} buffer, expected {'/'.join(kinds)}")
        return bid

    def tensor_spec(self, v: Any, path: str, kinds: tuple[str, ...]) -> TensorSpec:
        shape = self.ints(self.get(v, "shape", path), f"{path}.shape")
        vr = self.get(v, "value_range", path)
        t = TensorSpec(
            name=self.str_(self.get(v, "name", path), f"{path}.name"),
            shape=shape,
            dtype=self.dtype(self.get(v, "dtype", path), f"{path}.dtype"),
            device_dtype=self.dtype(self.get(v, "device_dtype", path), f"{path}.device_dtype"),
            buffer=self.buffer_id(self.get(v, "buffer", path), f"{path}.buffer", kinds),
            alias_of=None,
            value_range=None,
        )
        alias = self.get(v, "alias_of", path)
        t.alias_of = self.str_(alias, f"{path}.alias_of") if alias is not None else None
        if vr is not None:
            bounds = self.ints(vr, f"{path}.value_range", -(2**63), 2**63, 2)
            if len(bounds) != 2:
                raise self.fail(f"{path}.value_range", f"expected [lo, hi), got {list(bounds)}")
            lo, hi = bounds
            if lo >= hi:
                raise self.fail(f"{path}.value_range", f"[{lo}, {hi}) is empty")
            t.value_range = (lo, hi)
        b = self.buffers[t.buffer]
        n = 1
        for s in shape:
            n *= s
        if n != b.numel:
            raise self.fail(path, f"shape {list(shape)} ({n} elements) on buffer {b.id} of {b.numel} elements")
        if b.dtype != t.device_dtype:
            raise self.fail(path, f"device dtype {t.device_dtype} on a {b.dtype} buffer")
        return t

    def weight_spec(self, v: Any, path: str) -> WeightSpec:
        r = self.get(v, "recipe", path)
        rp = f"{path}.recipe"
        sources = self.mapping(self.get(r, "sources", rp), f"{rp}.sources")
        for k, s in sources.items():
            self.str_(k, f"{rp}.sources key")
            self.str_(s, f"{rp}.sources[{k}]")
        recipe = Recipe(self.str_(self.get(r, "kind", rp), f"{rp}.kind", RECIPE_KINDS), dict(sources),
                        self.mapping(self.get(r, "params", rp), f"{rp}.params"),
                        self.strs(self.get(r, "fallback_keys", rp), f"{rp}.fallback_keys"))
        shape = self.ints(self.get(v, "shape", path), f"{path}.shape")
        self.recipe(recipe, shape, rp)
        w = WeightSpec(
            name=self.str_(self.get(v, "name", path), f"{path}.name"),
            key=self.str_(self.get(v, "key", path), f"{path}.key"),
            shape=self.ints(self.get(v, "shape", path), f"{path}.shape"),
            dtype=self.dtype(self.get(v, "dtype", path), f"{path}.dtype"),
            source_shape=self.ints(self.get(v, "source_shape", path), f"{path}.source_shape"),
            buffer=self.buffer_id(self.get(v, "buffer", path), f"{path}.buffer", ("weight",)),
            recipe=recipe,
            layout=self.ints(self.get(v, "layout", path), f"{path}.layout", hi=MAX_RANK),
        )
        if w.layout and sorted(w.layout) != list(range(len(w.shape))):
            raise self.fail(f"{path}.layout", f"{list(w.layout)} is not an order of the {len(w.shape)} dims of "
                            f"{list(w.shape)}")
        b = self.buffers[w.buffer]
        n = 1
        for s in w.shape:
            n *= s
        if n != b.numel or b.dtype != w.dtype:
            raise self.fail(path, f"{w.dtype}{list(w.shape)} on buffer {b.id} ({b.dtype}, {b.numel} elements)")
        return w

    def recipe(self, r: Recipe, shape: tuple[int, ...], path: str) -> None:
        """A recipe's sources and parameters, against the weight it makes (what `npu_runtime.weights` reads)."""
        need = {"load": {"weight"}, "rope_inv_freq": set(),
                "bn_fold_weight": {"weight", "gamma", "beta", "mean", "var"},
                "bn_fold_bias": {"gamma", "beta", "mean", "var"}}.get(r.kind)
        if need is not None and not need <= set(r.sources):
            raise self.fail(f"{path}.sources", f"a {r.kind} recipe needs {', '.join(sorted(need))}")
        p = r.params
        # an integer program's scale recipes carry the per-tensor weight scale as a parameter where no per-channel
        # source gives it (quant/fold.py)
        per_tensor = set() if "weight_scale" in r.sources else {"weight_scale"}
        params = {"load": set(), "concat": {"axis", "shapes"}, "bn_fold_weight": {"eps"}, "bn_fold_bias": {"eps"},
                  "rope_inv_freq": {"base", "dim"},
                  "wo_quantize": {"bits", "group", "part"} | ({"rows"} if "rows" in p else set()),
                  "quantize_weight": {"quant_min", "quant_max"},
                  "quant_bias": {"input_scale", "output_scale"} | per_tensor,
                  "requant_scale": {"input_scale", "output_scale"} | per_tensor,
                  "dequant_scale": {"input_scale"} | per_tensor}[r.kind]
        if set(p) != params:
            raise self.fail(f"{path}.params", f"a {r.kind} recipe takes exactly "
                            f"{', '.join(sorted(params)) or 'no parameters'}, got {sorted(map(str, p))}")
        if r.kind == "load" and set(r.sources) != {"weight"}:
            raise self.fail(f"{path}.sources", f"a load recipe reads one source, 'weight'; got {sorted(r.sources)}")
        if r.kind in ("bn_fold_weight", "bn_fold_bias"):
            eps = p.get("eps")
            if not isinstance(eps, int | float) or isinstance(eps, bool) or not 0 <= eps < float("inf"):
                raise self.fail(f"{path}.params.eps", f"expected a finite number >= 0, got {_short(eps)}")
            if not shape or (r.kind == "bn_fold_bias" and len(shape) != 1):
                raise self.fail(path, f"a {r.kind} weight of shape {list(shape)}")
        elif r.kind == "rope_inv_freq":
            base, dim = p.get("base"), p.get("dim")
            if not isinstance(base, int | float) or isinstance(base, bool) or not 0 < base < float("inf"):
                raise self.fail(f"{path}.params.base", f"expected a finite number > 0, got {_short(base)}")
            if len(shape) != 1 or dim != 2 * shape[0] or isinstance(dim, bool):
                raise self.fail(f"{path}.params.dim", f"{_short(dim)} for an inv_freq weight of shape {list(shape)} "
                                "(dim is twice its length)")
        elif r.kind == "wo_quantize":
            bits, group, part = p.get("bits"), p.get("group"), p.get("part")
            ok_group = isinstance(group, int) and not isinstance(group, bool) and 0 <= group <= 1 << 20
            parts = ("qweight", "scale", "zero")
            if bits not in (4, 8) or isinstance(bits, bool) or not ok_group or part not in parts or \
                    "weight" not in r.sources:
                raise self.fail(f"{path}.params", f"a wo_quantize recipe needs bits 4 or 8, a group and a part "
                                f"(qweight, scale, zero) and a weight source, got {_short(p)}")
            if bits == 4 and (group <= 0 or group % 2):
                raise self.fail(f"{path}.params.group", f"{group} for int4 weights (an even number > 0)")
            self.wo_parts(r, shape, path)
        elif r.kind in ("quantize_weight", "quant_bias", "requant_scale", "dequant_scale"):
            self.quant_recipe(r, shape, path)
        elif r.kind == "concat":
            axis, shapes = p.get("axis"), p.get("shapes")
            parts = [self.ints(sh, f"{path}.params.shapes[{i}]") for i, sh in
                     enumerate(self.list_(shapes, f"{path}.params.shapes", 4096))]
            if not isinstance(axis, int) or isinstance(axis, bool) or not 0 <= axis < max(len(shape), 1):
                raise self.fail(f"{path}.params.axis", f"{_short(axis)} for a weight of shape {list(shape)}")
            ok = parts and all(len(q) == len(shape) and all(a == b for i, (a, b) in enumerate(zip(q, shape))
                                                               if i != axis) for q in parts)
            if not ok or sum(q[axis] for q in parts) != shape[axis]:
                raise self.fail(f"{path}.params.shapes", f"{[list(q) for q in parts]} do not concatenate to "
                                f"{list(shape)} along axis {axis}")
            if set(r.sources) != {str(i) for i in range(len(parts))}:
                raise self.fail(f"{path}.sources", f"a concat of {len(parts)} parts needs sources '0' to "
                                f"'{len(parts) - 1}'")

    def wo_parts(self, r: Recipe, shape: tuple[int, ...], path: str) -> None:
        """A wo_quantize recipe's sources: "weight", or with `rows` (the linears of one input, concatenated) one
        source a part ("weight", "weight1", ...) whose rows add up to the weight's."""
        rows = r.params.get("rows")
        if rows is None:
            if set(r.sources) != {"weight"}:
                raise self.fail(f"{path}.sources", f"a wo_quantize recipe reads 'weight', got {sorted(r.sources)}")
            return
        rows = self.ints(rows, f"{path}.params.rows", limit=4096)
        names = {"weight" if i == 0 else f"weight{i}" for i in range(len(rows))}
        if not rows or any(n <= 0 for n in rows) or not shape or sum(rows) != shape[0] or set(r.sources) != names:
            raise self.fail(f"{path}.params.rows", f"{list(rows)} with sources {sorted(r.sources)} for a weight of "
                            f"{list(shape)} (one source a part, 'weight', 'weight1', ..., the rows adding up)")

    def quant_recipe(self, r: Recipe, shape: tuple[int, ...], path: str) -> None:
        """The recipes of an integer program (quant/fold.py): scales finite and > 0, an int32 [C, 2] or [C] result."""
        p = r.params
        names = {"quantize_weight": ("quant_min", "quant_max"), "quant_bias": ("input_scale",),
                 "requant_scale": ("input_scale", "output_scale"), "dequant_scale": ("input_scale",)}[r.kind]
        if "weight_scale" not in r.sources:
            names += ("weight_scale",)
        for name in names:
            v = p.get(name)
            ok = isinstance(v, int | float) and not isinstance(v, bool) and (
                abs(v) <= 1 << 31 if name.startswith("quant_") else 0 < v < float("inf"))
            if not ok:
                raise self.fail(f"{path}.params.{name}", f"expected a finite number{'' if 'quant_' in name else ' > 0'}"
                                f", got {_short(v)}")
        need = {"quantize_weight": {"weight", "weight_scale"}, "quant_bias": {"bias"}}.get(r.kind, set())
        if not need <= set(r.sources):
            raise self.fail(f"{path}.sources", f"a {r.kind} recipe needs {', '.join(sorted(need))}")
        rank = {"quantize_weight": None, "quant_bias": 1, "requant_scale": 2, "dequant_scale": 1}[r.kind]
        if rank is not None and (len(shape) != rank or (rank == 2 and shape[1] != 2)):
            raise self.fail(path, f"a {r.kind} weight of shape {list(shape)}")

    def ref(self, v: Any, path: str) -> TensorRef:
        r = TensorRef(self.buffer_id(self.get(v, "buffer", path), f"{path}.buffer"),
                      self.ints(self.get(v, "shape", path), f"{path}.shape"),
                      self.ints(self.get(v, "strides", path), f"{path}.strides"),
                      self.int_(self.get(v, "offset", path), f"{path}.offset"))
        if len(r.shape) != len(r.strides):
            raise self.fail(path, f"shape {list(r.shape)} with strides {list(r.strides)}")
        numel = self.buffers[r.buffer].numel
        if r.extent() > numel:
            raise self.fail(path, f"view reaches element {r.extent() - 1} of buffer {r.buffer}, which has {numel}")
        return r

    def rows(self, v: Any, path: str) -> list[int]:
        """A kernel's `out_rows`: none, or [dim, start, stop] with start < stop."""
        got = list(self.ints(v, path))
        if got and (len(got) != 3 or got[0] >= MAX_RANK or not got[1] < got[2]):
            raise self.fail(path, f"expected [] or [dim, start, stop] with start < stop, got {_short(v)}")
        return got

    def kernel(self, v: Any, path: str) -> KernelCall:
        name = self.str_(self.get(v, "name", path), f"{path}.name")
        kpath = f"kernel {name!r} ({path})"
        kind = self.get(v, "kind", path)
        if not isinstance(kind, str) or kind not in KINDS:
            raise self.fail(f"{path}.kind", f"unknown kernel kind {kind!r} (known: {', '.join(sorted(KINDS))})")
        try:
            spec = spec_from_data(kind, self.get(v, "spec", path), "spec")
        except ValueError as e:
            raise self.fail(kpath, str(e)) from None
        call = KernelCall(name, spec,
                          self.each(self.get(v, "args", path), f"{path}.args", self.ref),
                          self.each(self.get(v, "outs", path), f"{path}.outs", self.ref),
                          self.strs(self.get(v, "nodes", path), f"{path}.nodes"),
                          self.str_(self.get(v, "group", path), f"{path}.group"),
                          self.strs(self.get(v, "out_values", path), f"{path}.out_values"),
                          self.rows(self.get(v, "out_rows", path), f"{path}.out_rows"))
        try:
            spec.check(call, self.buffers)
        except (ValueError, IndexError, KeyError, TypeError, ZeroDivisionError, OverflowError) as e:
            raise self.fail(kpath, str(e) or type(e).__name__) from None
        self.plan(call, v, path, kpath)
        return call

    def plan(self, call: KernelCall, v: Any, path: str, kpath: str) -> None:
        """The call's plan and its scratch, checked against the record (a crafted plan is refused here)."""
        try:
            call.plan = plan_from_data(call.kind, self.get(v, "plan", path), "plan")
        except ValueError as e:
            raise self.fail(kpath, str(e)) from None
        call.scratch = self.each(self.get(v, "scratch", path), f"{path}.scratch", self.ref)
        try:
            if call.plan is not None:
                call.plan.check(call, self.buffers)
            elif call.scratch:
                raise ValueError("scratch buffers without a plan")
        except (ValueError, IndexError, KeyError, TypeError, ZeroDivisionError, OverflowError) as e:
            raise self.fail(kpath, f"plan: {e}" if str(e) else type(e).__name__) from None


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
