"""Graph partitioning: split an IR into contiguous accelerator ("npu") and CPU ("cpu") partitions.

`partition(ir, is_supported)` walks the nodes in topological order and places each node in the earliest
partition of its device that comes at or after every partition its inputs come from (greedy merge: independent
branches of the same device share a partition instead of alternating). Structural no-ops (getitem, alias,
metadata asserts, eval dropout) follow their producer, so they never cause a split or a transfer. A CPU partition
runs on the CPU reference (`runner` REFERENCE: compiled for target 'cpu') where that has every one of its ops, else
through torch_ir (TORCH): the two kinds of CPU node go to partitions of their own.

The plan lists, per partition, its boundary inputs and outputs and a valid pytorch-ir sub-IR (graph inputs =
boundary inputs, graph outputs = boundary outputs, weights/constants restricted to what it reads), and the
ordered steps: `TransferOp`s where a tensor changes device (once per tensor and device, however many later
partitions read it) and `RunPartition`s. Graph inputs are bound on either device like any program input and
graph outputs are read back like any program output; neither counts as a transfer.

Imports neither torch nor the runtime: the plan is computed on a build machine and shown before anything runs.
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import IRFormatError
from .ir.reader import checked_ir_dict
from .ir.schema import short_op
from .kernels import attention_flops, conv_flops, gemm_flops
from .op_support import SupportPredicate, is_structural, support_predicate
from .passes.dead_code import remove_unread_nodes

__all__ = [
    "NPU", "CPU", "TARGET", "REFERENCE", "TORCH", "TensorInfo", "TransferOp", "RunPartition", "Partition",
    "FallbackNode", "PartitionStats", "PartitionPlan", "partition", "node_flops", "format_report", "plan_stats",
    "transfer_steps", "runner_text",
]

NPU, CPU = "npu", "cpu"  # the accelerator backend (compiled programs) and the host
# Who runs a partition: the target's compiled program (NPU), the CPU reference's compiled program, or torch_ir
TARGET, REFERENCE, TORCH = "target", "reference", "torch"
RUNNERS = (TARGET, REFERENCE, TORCH)

IsSupported = Callable[[Mapping[str, Any]], bool]


@dataclass
class TensorInfo:
    name: str
    shape: list[int]
    dtype: str
    producer: int = -1  # index of the producing partition; -1 for a graph input


@dataclass
class TransferOp:
    """Move `tensor` (produced by partition `producer`) from device `src` to `dst` before partition `before`."""

    tensor: str
    src: str
    dst: str
    producer: int
    before: int
    shape: list[int]
    dtype: str
    kind: str = "transfer"

    @property
    def nbytes(self) -> int:
        from .dtypes import itemsize

        return math.prod(self.shape) * itemsize(self.dtype)


@dataclass
class RunPartition:
    partition: int
    kind: str = "run"


@dataclass
class Partition:
    index: int
    device: str  # NPU or CPU
    nodes: list[str]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    ir: dict[str, Any] = field(repr=False)
    flops: int = 0
    runner: str = TARGET  # TARGET on the NPU; REFERENCE or TORCH on the CPU

    @property
    def name(self) -> str:
        side = self.device if self.runner == TARGET else f"{self.device}, {self.runner}"
        return f"partition {self.index} ({side}, {len(self.nodes)} nodes: {self.nodes[0]}..{self.nodes[-1]})" \
            if self.nodes else f"partition {self.index} ({side}, empty)"


@dataclass
class FallbackNode:
    name: str
    op: str
    reason: str
    flops: int
    partition: int
    runner: str = TORCH  # what runs it on the CPU: REFERENCE or TORCH


@dataclass
class PartitionStats:
    nodes_total: int
    nodes_npu: int
    nodes_cpu: int
    flops_total: int
    flops_npu: int
    flops_cpu: int
    partitions_npu: int
    partitions_cpu: int
    transfers: int
    transfer_bytes: int

    @property
    def node_coverage(self) -> float:
        return self.nodes_npu / self.nodes_total if self.nodes_total else 1.0

    @property
    def flop_coverage(self) -> float:
        return self.flops_npu / self.flops_total if self.flops_total else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "node_coverage": self.node_coverage, "flop_coverage": self.flop_coverage}


@dataclass
class PartitionPlan:
    model_name: str
    target: str | None
    graph_inputs: list[TensorInfo]
    graph_outputs: list[TensorInfo]  # producer = partition index, -1 when the output is a graph input
    partitions: list[Partition]
    steps: list[TransferOp | RunPartition]
    fallback: list[FallbackNode]
    stats: PartitionStats
    formats: dict[str, str] = field(default_factory=dict)  # node -> number format, in a quantized graph
    dead: list[str] = field(default_factory=list)  # nodes whose outputs nothing reads: removed, run nowhere

    @property
    def transfers(self) -> list[TransferOp]:
        return [s for s in self.steps if isinstance(s, TransferOp)]

    @property
    def num_transfers(self) -> int:
        return len(self.transfers)

    @property
    def fully_supported(self) -> bool:
        return not self.fallback

    def to_dict(self, include_ir: bool = True) -> dict[str, Any]:
        parts = []
        for p in self.partitions:
            d = {"index": p.index, "device": p.device, "runner": p.runner, "nodes": p.nodes, "flops": p.flops,
                 "inputs": [asdict(t) for t in p.inputs], "outputs": [asdict(t) for t in p.outputs]}
            if include_ir:
                d["ir"] = p.ir
            parts.append(d)
        return {
            "model_name": self.model_name,
            "target": self.target,
            "graph_inputs": [asdict(t) for t in self.graph_inputs],
            "graph_outputs": [asdict(t) for t in self.graph_outputs],
            "partitions": parts,
            "steps": [asdict(s) for s in self.steps],
            "fallback": [asdict(f) for f in self.fallback],
            "stats": self.stats.to_dict(),
            **({"formats": self.formats} if self.formats else {}),
            **({"dead": self.dead} if self.dead else {}),
        }

    def to_json(self, include_ir: bool = True, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(include_ir), indent=indent)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PartitionPlan:
        parts = [Partition(p["index"], p["device"], list(p["nodes"]), [TensorInfo(**t) for t in p["inputs"]],
                           [TensorInfo(**t) for t in p["outputs"]], p.get("ir") or {}, p.get("flops", 0),
                           p.get("runner", TARGET if p["device"] == NPU else TORCH))
                 for p in d["partitions"]]
        steps: list[TransferOp | RunPartition] = []
        for s in d["steps"]:
            s = dict(s)
            steps.append(TransferOp(**s) if s.pop("kind") == "transfer" else RunPartition(**s))
        stats = {k: v for k, v in d["stats"].items() if k not in ("node_coverage", "flop_coverage")}
        return cls(d["model_name"], d.get("target"), [TensorInfo(**t) for t in d["graph_inputs"]],
                   [TensorInfo(**t) for t in d["graph_outputs"]], parts, steps,
                   [FallbackNode(**f) for f in d["fallback"]], PartitionStats(**stats), dict(d.get("formats") or {}),
                   [str(n) for n in d.get("dead") or []])


# ---- FLOP model -------------------------------------------------------------------------------------------------

_ZERO_FLOP = {
    "view.default", "reshape.default", "_unsafe_view.default", "flatten.using_ints", "unsqueeze.default",
    "squeeze.dim", "squeeze.dims", "transpose.int", "t.default", "permute.default", "expand.default",
    "slice.Tensor", "select.int", "split.Tensor", "split_with_sizes.default", "chunk.default", "getitem",
    "_assert_tensor_metadata.default", "alias.default", "detach.default", "detach_.default", "dropout.default",
    "lift_fresh_copy.default", "contiguous.default", "diagonal.default",
}


def node_flops(node: Mapping[str, Any]) -> int:
    """An IR node's FLOPs by the cost model of the kernel it becomes (`npu_compiler.kernels`): GEMM and conv 2 per
    multiply-add, attention its two contractions and softmax, views 0, everything else (elementwise, reductions,
    unknown ops) the element count of its largest operand or result."""
    op = short_op(str(node.get("op_type", "")))
    ins = [list(t.get("shape", [])) for t in node.get("inputs", [])]
    outs = [list(t.get("shape", [])) for t in node.get("outputs", [])]
    out_numel = math.prod(outs[0]) if outs else 0
    if op in _ZERO_FLOP:
        return 0
    if op == "linear.default" and len(ins) >= 2 and ins[1]:
        return gemm_flops(out_numel // max(ins[1][0], 1), ins[1][0], ins[1][-1])
    if op in ("matmul.default", "mm.default", "bmm.default") and ins and ins[0]:
        return 2 * out_numel * ins[0][-1]
    if op == "addmm.default" and len(ins) >= 2 and ins[1]:
        return 2 * out_numel * ins[1][-1] + out_numel
    if op.startswith("conv") and len(ins) >= 2 and len(ins[1]) >= 2:
        return conv_flops(out_numel, ins[1][1], math.prod(ins[1][2:]), 1)  # weight [Cout, Cin/groups, k...]
    if op == "scaled_dot_product_attention.default" and len(ins) >= 3 and ins[0] and ins[1] and ins[2]:
        q, k, v = ins[0], ins[1], ins[2]
        rows = math.prod(q[:-1]) if len(q) > 1 else 1
        return attention_flops(rows, k[-2] if len(k) > 1 else 1, q[-1], v[-1])
    return max([math.prod(s) for s in ins + outs] or [0])


# ---- partitioning -------------------------------------------------------------------------------------------------


def _meta(t: Mapping[str, Any]) -> tuple[list[int], str]:
    return list(t.get("shape", [])), str(t.get("dtype", ""))


def partition(ir: str | os.PathLike | Mapping[str, Any], is_supported: IsSupported | str,
              host_supported: IsSupported | None = None) -> PartitionPlan:
    """Split `ir` (path, JSON string or dict) into NPU/CPU partitions. `is_supported(node_dict) -> bool` decides
    placement (a target name uses `op_support.support_predicate(target)`); when it has a `reason(node)` method
    (like `SupportPredicate`), the report says why each node falls back. `host_supported` decides which of the CPU
    nodes the CPU reference runs (compiled for target 'cpu'); the others run through torch_ir. Default: the cpu
    target's support where `is_supported` is a target name or a `SupportPredicate`, else none (torch_ir for all)."""
    pred: IsSupported = support_predicate(is_supported) if isinstance(is_supported, str) else is_supported
    if host_supported is None and isinstance(pred, SupportPredicate):
        host_supported = support_predicate("cpu")
    data = copy.deepcopy(checked_ir_dict(ir))  # every field checked (read_ir) before the JSON form is read here
    for key in ("graph_inputs", "graph_outputs", "nodes"):
        if not isinstance(data.get(key), list):
            raise IRFormatError(f"IR is missing the list '{key}'; is this a pytorch-ir JSON file?")
    dead = remove_unread_nodes(data)  # placed nowhere: a dead node's op never makes the graph fall back
    if hasattr(pred, "prepare"):
        pred.prepare(data)  # what only the whole graph shows (quantized patterns)
    walk = _Walk(data, pred, host_supported)
    for ni, nd in enumerate(data["nodes"]):
        walk.place(ni, nd)
    walk.place_pending()
    plan = walk.plan()
    plan.dead = dead
    return plan


class _Walk:
    """One pass over the nodes in order (placement), then the boundaries, steps, sub-IRs and stats of the plan."""

    def __init__(self, data: dict[str, Any], pred: IsSupported, host: IsSupported | None) -> None:
        self.data = data
        self.pred = pred
        self.host = host
        self.reason_of: Callable[[Mapping[str, Any]], str | None] | None = getattr(pred, "reason", None)
        self.graph_inputs = {t["name"]: t for t in data["graph_inputs"]}
        # Tensor identity is (producer node, output index); graph inputs are their own producer.
        self.tensor_name: dict[tuple[str, int], str] = {(n, 0): n for n in self.graph_inputs}
        self.tensor_meta: dict[str, tuple[list[int], str]] = {n: _meta(t) for n, t in self.graph_inputs.items()}
        self.producer_of: dict[str, str] = {}  # tensor name -> node name (node outputs only)
        self.node_part: dict[str, int] = {}
        self.labels: list[tuple[str, str]] = []  # per partition: (device, runner)
        self.parts_nodes: list[list[dict[str, Any]]] = []
        self.fallback_nodes: list[tuple[dict[str, Any], str, str]] = []  # (node, reason, runner)
        self.pending: list[dict[str, Any]] = []  # output-less structural nodes on graph inputs only (metadata asserts)

    # ---- placement ----------------------------------------------------------------------------------------------
    def new_partition(self, label: tuple[str, str]) -> int:
        self.labels.append(label)
        self.parts_nodes.append([])
        return len(self.labels) - 1

    def _deps(self, nd: Mapping[str, Any], where: str) -> list[int]:
        deps: list[int] = []
        for i, t in enumerate(nd.get("inputs", [])):
            prod = t.get("producer_node")
            if prod is None:
                continue  # a weight or constant placeholder
            key = (prod, int(t.get("producer_output_idx", 0)))
            if key not in self.tensor_name:
                raise IRFormatError(f"{where} input #{i} '{t.get('name')}': producer '{prod}' output {key[1]} "
                                    "does not exist before this node")
            if prod in self.node_part:
                deps.append(self.node_part[prod])
        return deps

    def _label(self, nd: Mapping[str, Any], where: str) -> tuple[tuple[str, str], str]:
        """Where a node that does work runs, and why it is not on the target (empty when it is)."""
        try:
            if self.pred(nd):
                return (NPU, TARGET), ""
            why = (self.reason_of(nd) if self.reason_of else None) or "not supported by the target"
            runner = REFERENCE if self.host is not None and self.host(nd) else TORCH
        except (ValueError, TypeError, KeyError, AttributeError) as e:  # an attr of the wrong kind
            raise IRFormatError(f"{where}: {type(e).__name__}: {e}") from e
        return (CPU, runner), why

    def place(self, ni: int, nd: Any) -> None:
        if not isinstance(nd, Mapping) or not isinstance(nd.get("name"), str) or "op_type" not in nd:
            raise IRFormatError(f"node #{ni}: needs a 'name' and an 'op_type', got {str(nd)[:80]}")
        name, op_type = nd["name"], str(nd["op_type"])
        where = f"node '{name}' ({op_type})"
        for key, kind in (("inputs", list), ("outputs", list), ("attrs", dict)):
            if not isinstance(nd.get(key, kind()), kind):
                raise IRFormatError(f"{where}: '{key}' must be a {kind.__name__}")
        if any(not isinstance(t, Mapping) or not isinstance(t.get("name"), str) for t in
               [*nd.get("inputs", []), *nd.get("outputs", [])]):
            raise IRFormatError(f"{where}: every input and output needs a 'name'")
        k = max(self._deps(nd, where), default=-1)
        if is_structural(op_type, nd.get("attrs")):
            if k >= 0:
                chosen = k  # a no-op stays with its producer: no split, no transfer
            elif not nd.get("outputs"):
                self.pending.append(nd)
                chosen = -1
            else:
                chosen = next((j for j, lab in enumerate(self.labels) if lab[0] == NPU), -1)
                chosen = chosen if chosen >= 0 else self.new_partition((NPU, TARGET))
        else:
            label, why = self._label(nd, where)
            if label[0] == CPU:
                self.fallback_nodes.append((nd, why, label[1]))
            chosen = next((j for j in range(max(k, 0), len(self.labels)) if self.labels[j] == label), -1)
            if chosen < 0:
                chosen = self.new_partition(label)
        if chosen >= 0:
            self.parts_nodes[chosen].append(nd)
            self.node_part[name] = chosen
        for oi, t in enumerate(nd.get("outputs", [])):
            self.tensor_name[(name, oi)] = t["name"]
            self.tensor_meta[t["name"]] = _meta(t)
            self.producer_of[t["name"]] = name

    def place_pending(self) -> None:
        if self.pending:
            target_part = 0 if self.labels else self.new_partition((NPU, TARGET))
            self.parts_nodes[target_part][:0] = self.pending
            for nd in self.pending:
                self.node_part[nd["name"]] = target_part

    # ---- the plan -----------------------------------------------------------------------------------------------
    def part_of_tensor(self, t: str) -> int:
        return self.node_part[self.producer_of[t]] if t in self.producer_of else -1

    def _boundaries(self) -> tuple[list[list[str]], list[list[str]], list[str]]:
        """Per partition its boundary inputs (in first-use order) and outputs (read by another partition or a graph
        output), and the graph's output names."""
        reads: list[list[str]] = [[] for _ in self.labels]
        for p, pnodes in enumerate(self.parts_nodes):
            seen: set[str] = set()
            for nd in pnodes:
                for t in nd.get("inputs", []):
                    prod = t.get("producer_node")
                    if prod is None:
                        continue
                    tname = self.tensor_name[(prod, int(t.get("producer_output_idx", 0)))]
                    if self.part_of_tensor(tname) != p and tname not in seen:
                        seen.add(tname)
                        reads[p].append(tname)
        out_names = [t["name"] for t in self.data["graph_outputs"]]
        for t in out_names:
            if t not in self.tensor_meta:
                raise IRFormatError(f"graph output '{t}': not produced by any node nor a graph input")
        writes: list[list[str]] = [[] for _ in self.labels]
        needed_outside = {t for r in reads for t in r} | set(out_names)
        for p, pnodes in enumerate(self.parts_nodes):
            for nd in pnodes:
                for t in nd.get("outputs", []):
                    if t["name"] in needed_outside and t["name"] not in writes[p]:
                        writes[p].append(t["name"])
        return reads, writes, out_names

    def info(self, t: str) -> TensorInfo:
        shape, dtype = self.tensor_meta[t]
        return TensorInfo(t, shape, dtype, self.part_of_tensor(t))

    def plan(self) -> PartitionPlan:
        data = self.data
        reads, writes, out_names = self._boundaries()
        weight_meta = {w["name"]: w for w in data.get("weights") or []}
        mapping: dict[str, str] = dict(data.get("weight_name_mapping") or {})
        constants: dict[str, Any] = dict(data.get("constants") or {})
        used_anywhere = {mapping.get(t["name"], t["name"]) for nd in data["nodes"] for t in nd.get("inputs", [])
                         if t.get("producer_node") is None}
        partitions: list[Partition] = []
        for p, (dev, runner) in enumerate(self.labels):
            sub = _sub_ir(data, p, self.parts_nodes[p], reads[p], writes[p], self.tensor_name, self.tensor_meta,
                          self.part_of_tensor, weight_meta, mapping, constants, used_anywhere)
            flops = sum(node_flops(nd) for nd in self.parts_nodes[p])
            partitions.append(Partition(p, dev, [nd["name"] for nd in self.parts_nodes[p]],
                                        [self.info(t) for t in reads[p]], [self.info(t) for t in writes[p]], sub,
                                        flops, runner))
        fallback = [FallbackNode(nd["name"], str(nd["op_type"]), why, node_flops(nd), self.node_part[nd["name"]],
                                 runner) for nd, why, runner in self.fallback_nodes]
        steps = transfer_steps(partitions)
        return PartitionPlan(
            model_name=str(data.get("model_name") or "model"),
            target=getattr(self.pred, "target", None),
            graph_inputs=[self.info(t) for t in self.graph_inputs],
            graph_outputs=[self.info(t) for t in out_names],
            partitions=partitions,
            steps=steps,
            fallback=fallback,
            stats=plan_stats(partitions, steps),
            formats=dict(getattr(self.pred, "formats", {})),
        )


def transfer_steps(partitions: list[Partition]) -> list[TransferOp | RunPartition]:
    """The partitions in order, each after the transfers it needs: a tensor moves to a device once, and later readers
    on that device reuse it. Graph inputs (producer -1) are bound on whichever device reads them."""
    steps: list[TransferOp | RunPartition] = []
    resident: dict[str, set[str]] = {}
    for p in partitions:
        for t in p.inputs:
            if t.producer < 0:
                continue
            src = partitions[t.producer].device
            where = resident.setdefault(t.name, {src})
            if p.device not in where:
                steps.append(TransferOp(t.name, src, p.device, t.producer, p.index, list(t.shape), t.dtype))
                where.add(p.device)
        steps.append(RunPartition(p.index))
    return steps


def plan_stats(partitions: list[Partition], steps: list[TransferOp | RunPartition]) -> PartitionStats:
    """Coverage by nodes and FLOPs, partitions per side, transfers and their bytes."""
    flops_total = sum(p.flops for p in partitions)
    flops_npu = sum(p.flops for p in partitions if p.device == NPU)
    n_total = sum(len(p.nodes) for p in partitions)
    n_npu = sum(len(p.nodes) for p in partitions if p.device == NPU)
    transfers = [s for s in steps if isinstance(s, TransferOp)]
    return PartitionStats(
        nodes_total=n_total, nodes_npu=n_npu, nodes_cpu=n_total - n_npu, flops_total=flops_total,
        flops_npu=flops_npu, flops_cpu=flops_total - flops_npu,
        partitions_npu=sum(p.device == NPU for p in partitions),
        partitions_cpu=sum(p.device == CPU for p in partitions),
        transfers=len(transfers), transfer_bytes=sum(t.nbytes for t in transfers),
    )


def _sub_ir(data: Mapping[str, Any], p: int, pnodes: list[dict[str, Any]], reads: list[str], writes: list[str],
            tensor_name: dict[tuple[str, int], str], tensor_meta: dict[str, tuple[list[int], str]],
            part_of_tensor: Callable[[str], int], weight_meta: dict[str, Any], mapping: dict[str, str],
            constants: dict[str, Any], used_anywhere: set[str]) -> dict[str, Any]:
    """A valid pytorch-ir dict for one partition: tensors from elsewhere become graph inputs (each input then names
    itself as its producer, as pytorch-ir does for graph inputs)."""
    sub_nodes = []
    placeholders: list[str] = []
    for nd in pnodes:
        nd = copy.deepcopy(nd)
        for t in nd.get("inputs", []):
            prod = t.get("producer_node")
            if prod is None:
                placeholders.append(t["name"])
                continue
            tname = tensor_name[(prod, int(t.get("producer_output_idx", 0)))]
            if part_of_tensor(tname) != p:
                t["name"], t["producer_node"], t["producer_output_idx"] = tname, tname, 0
        sub_nodes.append(nd)
    sub_mapping = {ph: mapping[ph] for ph in dict.fromkeys(placeholders) if ph in mapping}
    keys = {mapping.get(ph, ph) for ph in placeholders}
    # Unused entries of the same shape stay: a tied lm_head reads the embedding's key when its own is missing.
    used_shapes = {tuple(weight_meta[k].get("shape", [])) for k in keys if k in weight_meta}
    weights = [w for name, w in weight_meta.items()
               if name in keys or (name not in used_anywhere and tuple(w.get("shape", [])) in used_shapes)]
    sub: dict[str, Any] = {
        "model_name": f"{data.get('model_name') or 'model'}.p{p}",
        "pytorch_version": data.get("pytorch_version", ""),
        "graph_inputs": [{"name": t, "shape": tensor_meta[t][0], "dtype": tensor_meta[t][1]} for t in reads],
        "graph_outputs": [{"name": t, "shape": tensor_meta[t][0], "dtype": tensor_meta[t][1]} for t in writes],
        "weights": copy.deepcopy(weights),
        "weight_name_mapping": sub_mapping,
        "nodes": sub_nodes,
    }
    if "constants" in data:
        sub["constants"] = {k: copy.deepcopy(v) for k, v in constants.items() if k in keys or k in placeholders}
    return sub


# ---- report ---------------------------------------------------------------------------------------------------


def _human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


RUNNER_TEXT = {TARGET: "target '{target}'", REFERENCE: "the CPU reference", TORCH: "the CPU fallback (torch_ir)"}


def runner_text(runner: str, target: str) -> str:
    """Who runs a partition, in words."""
    return RUNNER_TEXT.get(runner, runner).format(target=target)


def _formats_line(formats: Mapping[str, str]) -> str:
    """How many nodes of a quantized graph compute in which number format."""
    counts: dict[str, int] = {}
    for f in formats.values():
        counts[f] = counts.get(f, 0) + 1
    shown = ", ".join(f"{n} {f}" for f, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return f"number formats (nodes): {shown}"


def format_report(plan: PartitionPlan, max_nodes: int = 6) -> str:
    """The human-readable support report: coverage, every fallback node and what runs it, the plan step by step."""
    s = plan.stats
    target = plan.target or "?"

    def side(device: str) -> str:
        # "npu" is the plan's name for the target's side; with --target cpu both sides run on the CPU, so say which
        return f"target '{target}'" if device == NPU else "host"

    cpu_runners = [p.runner for p in plan.partitions if p.device == CPU]
    lines = [
        f"model {plan.model_name}: target '{target}'",
        f"coverage: {s.nodes_npu}/{s.nodes_total} nodes on the target ({100 * s.node_coverage:.1f}%), "
        f"{_human(s.flops_npu)}/{_human(s.flops_total)} FLOPs ({100 * s.flop_coverage:.1f}%)",
        f"plan: {len(plan.partitions)} partition(s) ({s.partitions_npu} on target '{target}', "
        f"{cpu_runners.count(REFERENCE)} on the CPU reference, {cpu_runners.count(TORCH)} through torch_ir), "
        f"{s.transfers} transfer(s), {_human(s.transfer_bytes)}B moved",
    ]
    if plan.formats:
        lines.append(_formats_line(plan.formats))
    if plan.dead:
        shown = ", ".join(plan.dead[:8]) + (f" and {len(plan.dead) - 8} more" if len(plan.dead) > 8 else "")
        lines.append(f"removed, their outputs unread ({len(plan.dead)} node(s)): {shown}")
    if plan.fallback:
        lines.append(f"on the CPU ({len(plan.fallback)} node(s)):")
        nw = max(len(f.name) for f in plan.fallback)
        ow = max(len(f.op) for f in plan.fallback)
        for f in plan.fallback:
            by = "reference" if f.runner == REFERENCE else "torch_ir"
            lines.append(f"  {f.name:<{nw}} {f.op:<{ow}} partition {f.partition} ({by})  {_human(f.flops)} FLOPs  "
                         f"({f.reason})")
    else:
        lines.append("every op is supported: one program, no fallback")
    lines.append("steps:")
    for step in plan.steps:
        if isinstance(step, TransferOp):
            lines.append(f"  transfer {step.tensor} {step.dtype}{step.shape}: {side(step.src)} -> {side(step.dst)} "
                         f"(from partition {step.producer})")
        else:
            p = plan.partitions[step.partition]
            shown = ", ".join(p.nodes[:max_nodes]) + (f", ... (+{len(p.nodes) - max_nodes})"
                                                      if len(p.nodes) > max_nodes else "")
            lines.append(f"  run partition {p.index} on {runner_text(p.runner, target)}: {len(p.nodes)} node(s) "
                         f"[{shown}], in {[t.name for t in p.inputs]}, out {[t.name for t in p.outputs]}")
    return "\n".join(lines)
