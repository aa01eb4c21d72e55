"""Graph partitioning: split an IR into contiguous accelerator ("npu") and CPU-fallback ("cpu") partitions.

`partition(ir, is_supported)` walks the nodes in topological order and places each node in the earliest
partition of its device that comes at or after every partition its inputs come from (greedy merge: independent
branches of the same device share a partition instead of alternating). Structural no-ops (getitem, alias,
metadata asserts, eval dropout) follow their producer, so they never cause a split or a transfer.

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
from .op_support import is_structural, support_predicate

__all__ = [
    "NPU", "CPU", "TensorInfo", "TransferOp", "RunPartition", "Partition", "FallbackNode", "PartitionStats",
    "PartitionPlan", "partition", "node_flops", "format_report",
]

NPU, CPU = "npu", "cpu"  # the accelerator backend (compiled programs) and the torch CPU fallback

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

    @property
    def name(self) -> str:
        return f"partition {self.index} ({self.device}, {len(self.nodes)} nodes: {self.nodes[0]}..{self.nodes[-1]})" \
            if self.nodes else f"partition {self.index} ({self.device}, empty)"


@dataclass
class FallbackNode:
    name: str
    op: str
    reason: str
    flops: int
    partition: int


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
            d = {"index": p.index, "device": p.device, "nodes": p.nodes, "flops": p.flops,
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
        }

    def to_json(self, include_ir: bool = True, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(include_ir), indent=indent)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PartitionPlan:
        parts = [Partition(p["index"], p["device"], list(p["nodes"]), [TensorInfo(**t) for t in p["inputs"]],
                           [TensorInfo(**t) for t in p["outputs"]], p.get("ir") or {}, p.get("flops", 0))
                 for p in d["partitions"]]
        steps: list[TransferOp | RunPartition] = []
        for s in d["steps"]:
            s = dict(s)
            steps.append(TransferOp(**s) if s.pop("kind") == "transfer" else RunPartition(**s))
        stats = {k: v for k, v in d["stats"].items() if k not in ("node_coverage", "flop_coverage")}
        return cls(d["model_name"], d.get("target"), [TensorInfo(**t) for t in d["graph_inputs"]],
                   [TensorInfo(**t) for t in d["graph_outputs"]], parts, steps,
                   [FallbackNode(**f) for f in d["fallback"]], PartitionStats(**stats))


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


def partition(ir: str | os.PathLike | Mapping[str, Any], is_supported: IsSupported | str) -> PartitionPlan:
    """Split `ir` (path, JSON string or dict) into NPU/CPU partitions. `is_supported(node_dict) -> bool` decides
    placement (a target name uses `op_support.support_predicate(target)`); when it has a `reason(node)` method
    (like `SupportPredicate`), the report says why each node falls back."""
    pred: IsSupported = support_predicate(is_supported) if isinstance(is_supported, str) else is_supported
    reason_of: Callable[[Mapping[str, Any]], str | None] | None = getattr(pred, "reason", None)
    data = copy.deepcopy(checked_ir_dict(ir))  # every field checked (read_ir) before the JSON form is read here
    for key in ("graph_inputs", "graph_outputs", "nodes"):
        if not isinstance(data.get(key), list):
            raise IRFormatError(f"IR is missing the list '{key}'; is this a pytorch-ir JSON file?")
    nodes: list[dict[str, Any]] = data["nodes"]
    graph_inputs = {t["name"]: t for t in data["graph_inputs"]}

    # Tensor identity is (producer node, output index); graph inputs are their own producer.
    tensor_name: dict[tuple[str, int], str] = {(n, 0): n for n in graph_inputs}
    tensor_meta: dict[str, tuple[list[int], str]] = {n: _meta(t) for n, t in graph_inputs.items()}
    producer_of: dict[str, str] = {}  # tensor name -> node name (node outputs only)
    node_part: dict[str, int] = {}
    parts_dev: list[str] = []
    parts_nodes: list[list[dict[str, Any]]] = []
    fallback_nodes: list[tuple[dict[str, Any], str]] = []
    pending: list[dict[str, Any]] = []  # output-less structural nodes on graph inputs only (metadata asserts)

    def new_partition(dev: str) -> int:
        parts_dev.append(dev)
        parts_nodes.append([])
        return len(parts_dev) - 1

    for ni, nd in enumerate(nodes):
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
        deps: list[int] = []
        for i, t in enumerate(nd.get("inputs", [])):
            prod = t.get("producer_node")
            if prod is None:
                continue  # a weight or constant placeholder
            key = (prod, int(t.get("producer_output_idx", 0)))
            if key not in tensor_name:
                raise IRFormatError(f"{where} input #{i} '{t.get('name')}': producer '{prod}' output {key[1]} "
                                    "does not exist before this node")
            if prod in node_part:
                deps.append(node_part[prod])
        k = max(deps, default=-1)
        if is_structural(op_type, nd.get("attrs")):
            if k >= 0:
                chosen = k  # a no-op stays with its producer: no split, no transfer
            elif not nd.get("outputs"):
                pending.append(nd)
                chosen = -1
            else:
                chosen = next((j for j in range(len(parts_dev)) if parts_dev[j] == NPU), -1)
                chosen = chosen if chosen >= 0 else new_partition(NPU)
        else:
            try:
                dev = NPU if pred(nd) else CPU
                why = ((reason_of(nd) if reason_of else None) or "not supported by the target") if dev == CPU else ""
            except (ValueError, TypeError, KeyError, AttributeError) as e:  # an attr of the wrong kind
                raise IRFormatError(f"{where}: {type(e).__name__}: {e}") from e
            if dev == CPU:
                fallback_nodes.append((nd, why))
            chosen = next((j for j in range(max(k, 0), len(parts_dev)) if parts_dev[j] == dev), -1)
            if chosen < 0:
                chosen = new_partition(dev)
        if chosen >= 0:
            parts_nodes[chosen].append(nd)
            node_part[name] = chosen
        for oi, t in enumerate(nd.get("outputs", [])):
            tensor_name[(name, oi)] = t["name"]
            tensor_meta[t["name"]] = _meta(t)
            producer_of[t["name"]] = name
    if pending:
        target_part = 0 if parts_dev else new_partition(NPU)
        parts_nodes[target_part][:0] = pending
        for nd in pending:
            node_part[nd["name"]] = target_part

    def part_of_tensor(t: str) -> int:
        return node_part[producer_of[t]] if t in producer_of else -1

    # Who reads what: partition -> boundary inputs (in first-use order), tensor -> partitions reading it.
    reads: list[list[str]] = [[] for _ in parts_dev]
    for p, pnodes in enumerate(parts_nodes):
        seen: set[str] = set()
        for nd in pnodes:
            for t in nd.get("inputs", []):
                prod = t.get("producer_node")
                if prod is None:
                    continue
                tname = tensor_name[(prod, int(t.get("producer_output_idx", 0)))]
                if part_of_tensor(tname) != p and tname not in seen:
                    seen.add(tname)
                    reads[p].append(tname)
    out_names = [t["name"] for t in data["graph_outputs"]]
    for t in out_names:
        if t not in tensor_meta:
            raise IRFormatError(f"graph output '{t}': not produced by any node nor a graph input")
    writes: list[list[str]] = [[] for _ in parts_dev]
    needed_outside = {t for r in reads for t in r} | set(out_names)
    for p, pnodes in enumerate(parts_nodes):
        for nd in pnodes:
            for t in nd.get("outputs", []):
                if t["name"] in needed_outside and t["name"] not in writes[p]:
                    writes[p].append(t["name"])

    def info(t: str) -> TensorInfo:
        shape, dtype = tensor_meta[t]
        return TensorInfo(t, shape, dtype, part_of_tensor(t))

    # Steps: a tensor moves to a device once; later readers on that device reuse it.
    steps: list[TransferOp | RunPartition] = []
    resident: dict[str, set[str]] = {}
    for p, dev in enumerate(parts_dev):
        for t in reads[p]:
            src_part = part_of_tensor(t)
            if src_part < 0:
                continue  # graph inputs are bound on whichever device reads them
            where = resident.setdefault(t, {parts_dev[src_part]})
            if dev not in where:
                shape, dtype = tensor_meta[t]
                steps.append(TransferOp(t, parts_dev[src_part], dev, src_part, p, shape, dtype))
                where.add(dev)
        steps.append(RunPartition(p))
        for t in writes[p]:
            resident.setdefault(t, {dev})

    weight_meta = {w["name"]: w for w in data.get("weights") or []}
    mapping: dict[str, str] = dict(data.get("weight_name_mapping") or {})
    constants: dict[str, Any] = dict(data.get("constants") or {})
    used_anywhere = {mapping.get(t["name"], t["name"]) for nd in nodes for t in nd.get("inputs", [])
                     if t.get("producer_node") is None}

    partitions: list[Partition] = []
    for p, dev in enumerate(parts_dev):
        sub = _sub_ir(data, p, parts_nodes[p], reads[p], writes[p], tensor_name, tensor_meta, part_of_tensor,
                      weight_meta, mapping, constants, used_anywhere)
        flops = sum(node_flops(nd) for nd in parts_nodes[p])
        partitions.append(Partition(p, dev, [nd["name"] for nd in parts_nodes[p]], [info(t) for t in reads[p]],
                                    [info(t) for t in writes[p]], sub, flops))

    fallback = [FallbackNode(nd["name"], str(nd["op_type"]), why, node_flops(nd), node_part[nd["name"]])
                for nd, why in fallback_nodes]
    flops_total = sum(p.flops for p in partitions)
    flops_npu = sum(p.flops for p in partitions if p.device == NPU)
    n_total = sum(len(p.nodes) for p in partitions)
    n_npu = sum(len(p.nodes) for p in partitions if p.device == NPU)
    transfers = [s for s in steps if isinstance(s, TransferOp)]
    stats = PartitionStats(
        nodes_total=n_total, nodes_npu=n_npu, nodes_cpu=n_total - n_npu, flops_total=flops_total,
        flops_npu=flops_npu, flops_cpu=flops_total - flops_npu,
        partitions_npu=sum(d == NPU for d in parts_dev), partitions_cpu=sum(d == CPU for d in parts_dev),
        transfers=len(transfers), transfer_bytes=sum(t.nbytes for t in transfers),
    )
    return PartitionPlan(
        model_name=str(data.get("model_name") or "model"),
        target=getattr(pred, "target", None),
        graph_inputs=[info(t) for t in graph_inputs],
        graph_outputs=[info(t) for t in out_names],
        partitions=partitions,
        steps=steps,
        fallback=fallback,
        stats=stats,
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


def format_report(plan: PartitionPlan, max_nodes: int = 6) -> str:
    """The human-readable support report: coverage, every fallback node, the plan step by step."""
    s = plan.stats
    target = plan.target or "?"

    def where(device: str) -> str:
        # "npu" is the plan's name for the target's side; with --target cpu both sides run on the CPU, so say which
        return f"target '{target}'" if device == "npu" else "the CPU fallback (torch_ir)"

    def side(device: str) -> str:
        return target if device == "npu" else "fallback"

    lines = [
        f"model {plan.model_name}: target '{target}'",
        f"coverage: {s.nodes_npu}/{s.nodes_total} nodes on the target ({100 * s.node_coverage:.1f}%), "
        f"{_human(s.flops_npu)}/{_human(s.flops_total)} FLOPs ({100 * s.flop_coverage:.1f}%)",
        f"plan: {len(plan.partitions)} partition(s) ({s.partitions_npu} on target '{target}', {s.partitions_cpu} on "
        f"the CPU fallback), {s.transfers} transfer(s), {_human(s.transfer_bytes)}B moved",
    ]
    if plan.fallback:
        lines.append(f"fallback to CPU ({len(plan.fallback)} node(s)):")
        nw = max(len(f.name) for f in plan.fallback)
        ow = max(len(f.op) for f in plan.fallback)
        for f in plan.fallback:
            lines.append(f"  {f.name:<{nw}} {f.op:<{ow}} partition {f.partition}  {_human(f.flops)} FLOPs  "
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
            lines.append(f"  run partition {p.index} on {where(p.device)}: {len(p.nodes)} node(s) [{shown}], "
                         f"in {[t.name for t in p.inputs]}, out {[t.name for t in p.outputs]}")
    return "\n".join(lines)
