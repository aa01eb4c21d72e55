"""`PartitionedProgram`: the artifact of a graph whose ops the target does not all run, in the same `.npubin`
container as a plain `CompiledProgram` (header, checksum, msgpack payload; `program.pack_artifact`).

Its payload holds the graph's inputs and outputs, the segments in the order they run and the partition report (every
node that runs on the CPU, why, and what runs it). A segment is one of:
- `target`: a `CompiledProgram` for the artifact's target (on the accelerator);
- `reference`: a `CompiledProgram` for target 'cpu', run by the CPU reference (NumPy);
- `torch`: the IR of the nodes nothing here implements (op, attributes, tensor specs, its weights' placeholders and
  state-dict keys), run by `torch_ir.IRExecutor` where torch is installed.
The transfers between the accelerator and the host follow from the segments' inputs and outputs and are not stored.

All of it is data, checked on load as strictly as a plain program: each program by the same reader, each torch
segment's IR by the IR reader (`read_ir`) plus a rule for the op names a torch segment may hold, and the dataflow
between them (every segment input made before it is read, every tensor made once, the graph outputs made). A crafted
or damaged file gets an `ArtifactError` naming the segment and the field.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from .atomic import write_bytes
from .buffers import TensorSpec
from .collector import collector_paused
from .errors import ArtifactError, NPUCompileError, entry_point
from .partition import (
    CPU,
    NPU,
    REFERENCE,
    RUNNERS,
    TARGET,
    TORCH,
    FallbackNode,
    Partition,
    PartitionPlan,
    TensorInfo,
    TransferOp,
    plan_stats,
    transfer_steps,
)
from .program import (
    FORMAT_VERSION,
    MAX_ITEMS,
    CompiledProgram,
    _Reader,
    pack_artifact,
    read_artifact_file,
    unpack_artifact,
)

__all__ = ["Segment", "PartitionedProgram", "load_artifact", "artifact_from_bytes", "torch_op_problem"]

MAX_SEGMENTS = 1 << 16
# A torch segment's op: an ATen op by its qualified name (the runtime resolves it under torch.ops.aten and runs it only
# if it is an operator overload there), or getitem. Dunder names only where ATen has such an operator.
_OP_RE = re.compile(r"aten\.([A-Za-z_][A-Za-z0-9_]{0,127})\.([A-Za-z_][A-Za-z0-9_]{0,127})")
_ATEN_DUNDERS = frozenset(f"__{p}{n}__" for n in ("and", "or", "xor", "lshift", "rshift") for p in ("", "i"))
GETITEM_OPS = ("<built-in function getitem>", "getitem")


def torch_op_problem(op_type: Any) -> str | None:
    """Why `op_type` may not be in a torch segment (None: it may)."""
    if op_type in GETITEM_OPS:
        return None
    m = _OP_RE.fullmatch(op_type) if isinstance(op_type, str) else None
    if m is None:
        return f"{_short(op_type)} is not an ATen op name (aten.NAME.OVERLOAD)"
    if any(p.startswith("__") and p not in _ATEN_DUNDERS for p in m.groups()):
        return f"{op_type!r} names a Python attribute, not an ATen op"
    return None


@dataclass
class Segment:
    index: int
    device: str  # NPU (the artifact's target) or CPU
    runner: str  # TARGET, REFERENCE or TORCH
    nodes: list[str]  # the IR nodes it computes
    inputs: list[TensorInfo]  # boundary tensors it reads (producer: the segment that makes them, -1 a graph input)
    outputs: list[TensorInfo]  # tensors it makes that a later segment or the graph's outputs read
    flops: int = 0
    program: CompiledProgram | None = None  # TARGET and REFERENCE
    ir: dict[str, Any] | None = field(default=None, repr=False)  # TORCH: a pytorch-ir dict of its nodes

    @property
    def name(self) -> str:
        who = {TARGET: "target", REFERENCE: "cpu reference", TORCH: "cpu torch_ir"}.get(self.runner, self.runner)
        return f"segment {self.index} ({who}, {len(self.nodes)} node(s))"

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "device": self.device, "runner": self.runner, "nodes": list(self.nodes),
                "inputs": [_tensor(t) for t in self.inputs], "outputs": [_tensor(t) for t in self.outputs],
                "flops": self.flops, "program": self.program.to_dict() if self.program is not None else None,
                "ir": self.ir}


@dataclass
class PartitionedProgram:
    model_name: str
    target: str
    compute_dtype: str
    inputs: list[TensorSpec]  # the graph's (buffer -1: each segment that reads one binds it)
    outputs: list[TensorSpec]
    segments: list[Segment]
    fallback: list[FallbackNode]  # every node on the CPU: why it is not on the target, what runs it
    stats: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    # SHA-256 of the checkpoint it was compiled or verified with (npu_compiler.digest), or None
    weights_sha256: str | None = None
    formats: dict[str, str] = field(default_factory=dict)  # node -> number format, in a quantized graph
    dead: list[str] = field(default_factory=list)  # nodes whose outputs nothing reads: removed, run nowhere

    # ---- the plan it was made from -----------------------------------------------------------------------------
    def partitions(self) -> list[Partition]:
        return [Partition(s.index, s.device, list(s.nodes), list(s.inputs), list(s.outputs), {}, s.flops, s.runner)
                for s in self.segments]

    @property
    def transfers(self) -> list[TransferOp]:
        return [s for s in transfer_steps(self.partitions()) if isinstance(s, TransferOp)]

    def plan(self) -> PartitionPlan:
        """The partition plan (without sub-IRs): what `npu_compiler.partition.format_report` prints."""
        parts = self.partitions()
        steps = transfer_steps(parts)
        made = {t.name: s.index for s in self.segments for t in s.outputs}
        return PartitionPlan(self.model_name, self.target,
                             [TensorInfo(t.name, list(t.shape), t.dtype, -1) for t in self.inputs],
                             [TensorInfo(t.name, list(t.shape), t.dtype, made.get(t.name, -1)) for t in self.outputs],
                             parts, steps, list(self.fallback), plan_stats(parts, steps), dict(self.formats),
                             list(self.dead))

    @property
    def programs(self) -> list[CompiledProgram]:
        return [s.program for s in self.segments if s.program is not None]

    @property
    def weight_bytes(self) -> int:
        return sum(p.weight_bytes for p in self.programs)

    @property
    def kernel_count(self) -> int:
        return sum(len(p.kernels) for p in self.programs)

    # ---- serialisation ------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"format_version": self.format_version, "model_name": self.model_name, "target": self.target,
                "compute_dtype": self.compute_dtype, "inputs": [asdict(t) for t in self.inputs],
                "outputs": [asdict(t) for t in self.outputs], "segments": [s.to_dict() for s in self.segments],
                "fallback": [asdict(f) for f in self.fallback], "stats": self.stats,
                "weights_sha256": self.weights_sha256, "formats": dict(self.formats), "dead": list(self.dead)}

    @classmethod
    @entry_point("reading the artifact")
    @collector_paused()
    def from_dict(cls, d: Any, where: str = "<artifact>") -> PartitionedProgram:
        return _SegmentsReader(where).artifact(d)

    def to_bytes(self) -> bytes:
        return pack_artifact(self.to_dict())

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically, readable as the user's umask allows (as `CompiledProgram.save`)."""
        write_bytes(path, self.to_bytes())

    @classmethod
    @entry_point("reading the artifact")
    def load(cls, path: str | os.PathLike) -> PartitionedProgram:
        got = load_artifact(path)
        if not isinstance(got, PartitionedProgram):
            raise ArtifactError(f"{os.fspath(path)}: one program, not a partitioned artifact")
        return got

    # ---- inspection ---------------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """A JSON-able summary: I/O, each segment (what runs it, its nodes, its program's kernels or its ops), the
        transfers and the partition report."""
        plan = self.plan()
        segs = []
        for s in self.segments:
            d = {"index": s.index, "device": s.device, "runner": s.runner, "nodes": s.nodes, "flops": s.flops,
                 "inputs": [_tensor(t) for t in s.inputs], "outputs": [_tensor(t) for t in s.outputs]}
            if s.program is not None:
                d.update(target=s.program.target, kernel_count=len(s.program.kernels),
                         kernels=[{"index": i, "name": k.name, "kind": k.kind, "group": k.group, "nodes": k.nodes}
                                  for i, k in enumerate(s.program.kernels)],
                         weight_bytes=s.program.weight_bytes, buffer_bytes=s.program.buffer_bytes)
            else:
                d["ops"] = [str(n["op_type"]) for n in (s.ir or {}).get("nodes", [])]
            segs.append(d)
        return {"model_name": self.model_name, "target": self.target, "compute_dtype": self.compute_dtype,
                "format_version": self.format_version, "partitioned": True,
                "inputs": [_spec(t) for t in self.inputs], "outputs": [_spec(t) for t in self.outputs],
                "segments": segs, "transfers": [asdict(t) for t in plan.transfers],
                "fallback": [asdict(f) for f in self.fallback], "partition_stats": plan.stats.to_dict(),
                "kernel_count": self.kernel_count, "weight_bytes": self.weight_bytes, "stats": self.stats}


def _tensor(t: TensorInfo) -> dict[str, Any]:
    return {"name": t.name, "shape": list(t.shape), "dtype": t.dtype}


def _spec(t: TensorSpec) -> dict[str, Any]:
    d: dict[str, Any] = {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "device_dtype": t.device_dtype}
    if t.alias_of:
        d["alias_of"] = t.alias_of
    if t.value_range:
        d["value_range"] = list(t.value_range)
    return d


# ---- reading any artifact -----------------------------------------------------------------------------------------


@entry_point("reading the artifact")
def artifact_from_bytes(blob: bytes, where: str = "<bytes>") -> CompiledProgram | PartitionedProgram:
    """A `.npubin`'s bytes as what they hold: one program, or a partitioned program."""
    d = unpack_artifact(blob, where)
    if isinstance(d, dict) and "segments" in d:
        return PartitionedProgram.from_dict(d, where)
    return CompiledProgram.from_dict(d, where)


@entry_point("reading the artifact")
def load_artifact(path: str | os.PathLike) -> CompiledProgram | PartitionedProgram:
    """Read a `.npubin`: a `CompiledProgram` when the whole graph is one program for its target, else a
    `PartitionedProgram`; every field checked (ArtifactError naming the file and field otherwise)."""
    path = os.fspath(path)
    return artifact_from_bytes(read_artifact_file(path), path)


class _SegmentsReader(_Reader):
    """Reads a partitioned artifact's data form; each program through the plain program reader."""

    def artifact(self, d: Any) -> PartitionedProgram:
        if not isinstance(d, dict):
            raise self.fail("payload", f"expected a mapping, got {type(d).__name__}")
        version = self.int_(self.get(d, "format_version", ""), "format_version", 0, 2**32)
        if version != FORMAT_VERSION:
            raise ArtifactError(f"{self.where}: format version {version}; recompile the model with this version")
        target = self.str_(self.get(d, "target", ""), "target")
        inputs = self.each(self.get(d, "inputs", ""), "inputs", self.graph_input)
        outputs = self.each(self.get(d, "outputs", ""), "outputs", self.graph_output)
        names = [t.name for t in inputs]
        if len(set(names)) != len(names):
            raise self.fail("inputs", "two inputs share a name")
        for i, t in enumerate(outputs):
            if t.alias_of is not None and t.alias_of not in names:
                raise self.fail(f"outputs[{i}].alias_of", f"{t.alias_of!r} is not an input")
        segments = self.each(self.get(d, "segments", ""), "segments", lambda v, p: self.segment(v, p, target))
        if not segments or len(segments) > MAX_SEGMENTS:
            raise self.fail("segments", f"{len(segments)} segments (1 to {MAX_SEGMENTS})")
        self.dataflow(inputs, outputs, segments)
        self.device_dtypes(inputs, segments, "inputs")
        self.device_dtypes(outputs, segments, "outputs")
        fallback = self.each(self.get(d, "fallback", ""), "fallback", lambda v, p: self.fallback_node(v, p, segments))
        stats = self.mapping(self.get(d, "stats", ""), "stats")
        return PartitionedProgram(
            model_name=self.str_(self.get(d, "model_name", ""), "model_name"), target=target,
            compute_dtype=self.dtype(self.get(d, "compute_dtype", ""), "compute_dtype"), inputs=inputs,
            outputs=outputs, segments=segments, fallback=fallback, stats=stats, format_version=version,
            weights_sha256=self.sha256(self.get(d, "weights_sha256", ""), "weights_sha256"),
            formats=self.node_formats(self.get(d, "formats", "")), dead=self.strs(self.get(d, "dead", ""), "dead"))

    def node_formats(self, v: Any) -> dict[str, str]:
        """node -> number format, both names."""
        got = self.mapping(v, "formats")
        if len(got) > MAX_ITEMS:
            raise self.fail("formats", f"{len(got)} entries (at most {MAX_ITEMS})")
        return {self.str_(k, "formats (a key)"): self.str_(f, f"formats[{k!r}]") for k, f in got.items()}

    # ---- fields -------------------------------------------------------------------------------------------------
    def name(self, v: Any, path: str) -> str:
        text = self.str_(v, path)
        if not text or len(text) > 4096:
            raise self.fail(path, "expected a name of 1 to 4096 characters")
        return text

    def tensor(self, v: Any, path: str) -> TensorInfo:
        return TensorInfo(self.name(self.get(v, "name", path), f"{path}.name"),
                          list(self.ints(self.get(v, "shape", path), f"{path}.shape")),
                          self.dtype(self.get(v, "dtype", path), f"{path}.dtype"))

    def unbound(self, v: Any, path: str, absent: str) -> None:
        """A graph tensor's fields that only a program's tensors fill: no buffer (each segment binds its own) and
        no `absent` (an input's alias, an output's value range). Written, so required: a file that lacks them is
        not one this version wrote."""
        if self.get(v, "buffer", path) != -1:
            raise self.fail(f"{path}.buffer", f"{_short(v['buffer'])}: a graph tensor of a partitioned artifact has no "
                            "buffer (-1)")
        if self.get(v, absent, path) is not None:
            raise self.fail(f"{path}.{absent}", f"{_short(v[absent])}: expected null here")

    def graph_input(self, v: Any, path: str) -> TensorSpec:
        t = self.tensor(v, path)
        self.unbound(v, path, "alias_of")
        spec = TensorSpec(t.name, tuple(t.shape), t.dtype,
                          self.dtype(self.get(v, "device_dtype", path), f"{path}.device_dtype"), -1)
        vr = self.get(v, "value_range", path)
        if vr is not None:
            bounds = self.ints(vr, f"{path}.value_range", -(2**63), 2**63, 2)
            if len(bounds) != 2 or bounds[0] >= bounds[1]:
                raise self.fail(f"{path}.value_range", f"expected [lo, hi) with lo < hi, got {_short(vr)}")
            spec.value_range = (bounds[0], bounds[1])
        return spec

    def graph_output(self, v: Any, path: str) -> TensorSpec:
        t = self.tensor(v, path)
        self.unbound(v, path, "value_range")
        alias = self.get(v, "alias_of", path)
        return TensorSpec(t.name, tuple(t.shape), t.dtype,
                          self.dtype(self.get(v, "device_dtype", path), f"{path}.device_dtype"), -1,
                          alias_of=self.name(alias, f"{path}.alias_of") if alias is not None else None)

    def fallback_node(self, v: Any, path: str, segments: list[Segment]) -> FallbackNode:
        seg = self.int_(self.get(v, "partition", path), f"{path}.partition", 0, len(segments) - 1)
        f = FallbackNode(self.name(self.get(v, "name", path), f"{path}.name"),
                         self.str_(self.get(v, "op", path), f"{path}.op"),
                         self.str_(self.get(v, "reason", path), f"{path}.reason"),
                         self.int_(self.get(v, "flops", path), f"{path}.flops", 0, 2**63),
                         seg, self.str_(self.get(v, "runner", path), f"{path}.runner", (REFERENCE, TORCH)))
        s = segments[seg]
        if s.device != CPU or f.name not in s.nodes or f.runner != s.runner:
            raise self.fail(path, f"node {f.name!r} ({f.runner}) is not a node of segment {seg} ({s.runner})")
        return f

    # ---- segments -----------------------------------------------------------------------------------------------
    def segment(self, v: Any, path: str, target: str) -> Segment:
        index = self.int_(self.get(v, "index", path), f"{path}.index", 0, MAX_SEGMENTS)
        if path != f"segments[{index}]":
            raise self.fail(f"{path}.index", f"{index} (segments are numbered in order)")
        device = self.str_(self.get(v, "device", path), f"{path}.device", (NPU, CPU))
        runner = self.str_(self.get(v, "runner", path), f"{path}.runner", RUNNERS)
        if (device == NPU) != (runner == TARGET):
            raise self.fail(path, f"runner {runner!r} on device {device!r} (the target runs on the accelerator, the "
                            "reference and torch_ir on the host)")
        seg = Segment(index, device, runner, self.strs(self.get(v, "nodes", path), f"{path}.nodes"),
                      self.each(self.get(v, "inputs", path), f"{path}.inputs", self.tensor),
                      self.each(self.get(v, "outputs", path), f"{path}.outputs", self.tensor),
                      self.int_(self.get(v, "flops", path), f"{path}.flops", 0, 2**63))
        program, ir = self.get(v, "program", path), self.get(v, "ir", path)
        if runner == TORCH:
            if program is not None:
                raise self.fail(f"{path}.program", "a torch_ir segment holds IR nodes, not a program")
            seg.ir = self.torch_ir(ir, f"{path}.ir", seg)
        else:
            if ir is not None:
                raise self.fail(f"{path}.ir", f"a {runner} segment holds a program, not IR nodes")
            seg.program = self.program_of(program, path, seg, target if runner == TARGET else "cpu")
        return seg

    def device_dtypes(self, specs: list[TensorSpec], segments: list[Segment], side: str) -> None:
        """A graph input or output is held on the accelerator as each target program that reads or makes it holds
        it (a caller binds buffers of that dtype)."""
        for i, t in enumerate(specs):
            for s in segments:
                got = next((x for x in getattr(s.program, side) if x.name == t.name), None) \
                    if s.runner == TARGET else None
                if got is not None and got.device_dtype != t.device_dtype:
                    raise self.fail(f"{side}[{i}].device_dtype", f"{t.device_dtype}, but segment {s.index} holds "
                                    f"{t.name!r} as {got.device_dtype}")

    def program_of(self, v: Any, path: str, seg: Segment, target: str) -> CompiledProgram:
        prog = _Reader(f"{self.where}: {path}.program").program(v)
        if prog.target != target:
            raise self.fail(f"{path}.program.target", f"{prog.target!r}; a {seg.runner} segment runs a program for "
                            f"target {target!r}")
        for what, specs, infos in (("inputs", prog.inputs, seg.inputs), ("outputs", prog.outputs, seg.outputs)):
            have = {s.name: (list(s.shape), s.dtype) for s in specs}
            want = {t.name: (list(t.shape), t.dtype) for t in infos}
            if have != want:
                raise self.fail(f"{path}.program.{what}", f"{_short(have)} are not the segment's {what} "
                                f"{_short(want)}")
        return prog

    def torch_ir(self, v: Any, path: str, seg: Segment) -> dict[str, Any]:
        from .ir.reader import load_ir_dict, read_ir

        if not isinstance(v, dict):
            raise self.fail(path, f"expected the segment's IR (a mapping), got {_short(v)}")
        try:
            data = load_ir_dict(v)  # JSON types only, nesting bounded
            read_ir(data)  # every field, attribute and declared type, as for an IR file
        except NPUCompileError as e:
            raise self.fail(path, str(e)) from None
        for i, nd in enumerate(data["nodes"]):
            problem = torch_op_problem(nd["op_type"])
            if problem:
                raise self.fail(f"{path}.nodes[{i}].op_type", problem)
            problem = _sizes_problem(nd)
            if problem:
                raise self.fail(f"{path}.nodes[{i}].attrs", problem)
        for key, infos in (("graph_inputs", seg.inputs), ("graph_outputs", seg.outputs)):
            got = [(t["name"], list(t["shape"]), str(t["dtype"])) for t in data[key]]
            if got != [(t.name, list(t.shape), t.dtype) for t in infos]:
                raise self.fail(f"{path}.{key}", f"{_short(got)} are not the segment's boundary tensors")
        nodes = [nd["name"] for nd in data["nodes"]]
        if nodes != seg.nodes:
            raise self.fail(f"{path}.nodes", f"the IR's nodes {_short(nodes)} are not the segment's "
                            f"{_short(seg.nodes)}")
        return data

    def dataflow(self, inputs: list[TensorSpec], outputs: list[TensorSpec], segments: list[Segment]) -> None:
        """Every segment input is a graph input or made by an earlier segment, with its shape and dtype; every tensor
        is made once; every graph output is made (or is an input)."""
        made: dict[str, tuple[list[int], str, int]] = {t.name: (list(t.shape), t.dtype, -1) for t in inputs}
        if len(made) > MAX_ITEMS:
            raise self.fail("inputs", f"{len(made)} entries (at most {MAX_ITEMS})")
        for s in segments:
            for i, t in enumerate(s.inputs):
                src = made.get(t.name)
                if src is None:
                    raise self.fail(f"segments[{s.index}].inputs[{i}]", f"{t.name!r} is neither a graph input nor "
                                    "made by an earlier segment")
                if (src[0], src[1]) != (list(t.shape), t.dtype):
                    raise self.fail(f"segments[{s.index}].inputs[{i}]", f"{t.name!r} read as {t.dtype}{t.shape}, "
                                    f"made as {src[1]}{src[0]}")
                t.producer = src[2]
            for i, t in enumerate(s.outputs):
                if t.name in made:
                    raise self.fail(f"segments[{s.index}].outputs[{i}]", f"{t.name!r} is made twice")
                made[t.name] = (list(t.shape), t.dtype, s.index)
                t.producer = s.index
        for i, t in enumerate(outputs):
            src = made.get(t.name)
            if src is None or (src[0], src[1]) != (list(t.shape), t.dtype):
                raise self.fail(f"outputs[{i}]", f"{t.name!r} {t.dtype}{list(t.shape)} is made by no segment")


# The smallest bound on a torch node's integer attributes (a kernel size, an FFT length): what no small model exceeds.
SMALL_INTS = 1 << 16


def _sizes_problem(nd: dict[str, Any]) -> str | None:
    """Of a node whose op the IR reader has no schema for (so no rule ties its attributes to its declared tensors):
    an integer attribute, or the product of a list of them, beyond every element count the node declares (and
    beyond SMALL_INTS). ATen would allocate (or loop) by such a number: a crafted `size` could ask for terabytes
    behind a one-element declared output."""
    from .ir.schema import lookup

    if nd["op_type"] in GETITEM_OPS or lookup(str(nd["op_type"])) is not None:
        return None
    bound = SMALL_INTS
    for t in [*nd.get("inputs", []), *nd.get("outputs", [])]:
        n = 1
        for d in t["shape"]:
            n *= d
        bound = max(bound, n)
    stack = list((nd.get("attrs") or {}).items())
    while stack:
        name, v = stack.pop()
        ints = v if isinstance(v, list) and all(type(x) is int for x in v) else [v] if type(v) is int else None
        if ints is not None:
            n = 1
            for x in ints:
                n *= max(abs(x), 1)
                if n > bound:
                    return (f"'{name}' = {_short(v)} reaches {bound + 1} or more, beyond every tensor of the node "
                            f"({bound} elements at most); an artifact may not ask for more than it declares")
        elif isinstance(v, list):
            stack.extend((name, x) for x in v)
        elif isinstance(v, dict):
            stack.extend(v.items())
    return None


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."
