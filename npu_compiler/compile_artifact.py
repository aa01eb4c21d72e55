"""`compile_artifact()`: IR JSON -> one artifact for any graph.

Where the target runs every node, the artifact is the plain `CompiledProgram` `compile()` makes (the same bytes).
Otherwise the graph is partitioned by the target's support (`partition`), and each partition is compiled into a
segment of a `PartitionedProgram`: the target's program, a program for the CPU reference where the target lacks an
op that the reference has, or the IR nodes of the ops nothing here implements (run by torch_ir). Every partition is
compiled with the whole graph's compute dtype, chosen once. With `fallback=False` a graph the target does not run
whole is refused, naming every node it lacks.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from .collector import collector_paused
from .compiler import compile as compile_program
from .errors import NPUCompileError, entry_point
from .ir.reader import read_ir
from .ir.schema import short_op
from .limits import Limits
from .op_support import is_structural, support_predicate
from .output_roles import class_outputs
from .partition import CPU, NPU, REFERENCE, TARGET, TORCH, FallbackNode, Partition, PartitionPlan, node_flops, partition
from .partitioned_program import PartitionedProgram, Segment
from .passes.dtype import explain_compute_dtype
from .program import CompiledProgram, TensorSpec
from .targets.config import TargetConfig, default_config

__all__ = ["compile_artifact", "compile_plan"]

CompileFn = Callable[[Mapping[str, Any], str], CompiledProgram]  # (sub-IR, target) -> program


@entry_point("compiling the IR")
@collector_paused()
def compile_artifact(ir: str | os.PathLike | Mapping[str, Any], target: str = "cpu", *, fallback: bool = True,
                     force_cpu: Iterable[str] = (), force_torch: Iterable[str] = (), dtype: str | None = None,
                     config: TargetConfig | None = None, disable_passes: Iterable[str] = (), fusion: bool = True,
                     rope_theta: float | None = None, limits: Limits | None = None, partitioned: bool = False,
                     weights_dtype: str | None = None, lm_head_dtype: str | None = None, device=None
                     ) -> CompiledProgram | PartitionedProgram:
    """Compile `ir` for `target` into one artifact whatever its ops (see the module's docstring).

    `force_cpu` names ops or nodes to run on the CPU although the target has them (the CPU reference runs them);
    `force_torch` ones to run through torch_ir although the CPU reference has them. `partitioned`: a
    `PartitionedProgram` even where the target runs every node (one segment). `device` (compile()'s) reaches the
    target's programs; the other keywords are `compile()`'s and reach every program of the artifact."""
    lim = limits or Limits()
    force_torch = list(force_torch)
    forced = [*force_cpu, *force_torch]
    graph = read_ir(ir, lim)  # everything checked once, before the JSON form is split
    plan = partition(ir, support_predicate(target, forced), support_predicate("cpu", force_torch))
    if plan.fallback and not fallback:
        raise NPUCompileError(_refusal(plan, target))
    options = {"disable_passes": list(disable_passes), "fusion": fusion, "rope_theta": rope_theta, "limits": lim,
               "weights_dtype": weights_dtype, "lm_head_dtype": lm_head_dtype}
    if not plan.fallback and not partitioned:
        return compile_program(graph, target, dtype=dtype, config=config, device=device, **options)  # (read above)
    cfg = config or default_config(target)
    choice = explain_compute_dtype(graph, cfg, dtype)

    def compile_fn(sub_ir: Mapping[str, Any], for_target: str) -> CompiledProgram:
        mine = for_target == target
        return compile_program(sub_ir, for_target, dtype=choice.dtype, config=config if mine else None,
                               device=device if mine else None, **options)

    from .compiler import _value_range  # the same valid ranges a plain program's integer inputs get

    ranges = {v.name: _value_range(graph, v) for v in graph.inputs}
    return compile_plan(plan, target, choice.dtype, compile_fn, fallback=fallback, value_ranges=ranges,
                        stats={"compute_dtype_reason": choice.reason, "ir_nodes": len(graph.nodes),
                               "class_outputs": class_outputs(graph)})


def compile_plan(plan: PartitionPlan, target: str, compute_dtype: str, compile_fn: CompileFn, *,
                 fallback: bool = True, value_ranges: Mapping[str, tuple[int, int] | None] | None = None,
                 stats: Mapping[str, Any] | None = None) -> PartitionedProgram:
    """A partition plan's segments compiled: `compile_fn(sub_ir, target)` for the target's partitions and
    `compile_fn(sub_ir, 'cpu')` for the CPU reference's; torch_ir partitions keep their IR. A partition that fails
    to compile (an NPUCompileError) runs on the CPU instead (the reference, else torch_ir), with a RuntimeWarning
    naming it and the reason in the report; with `fallback=False` the error is raised."""
    segments: list[Segment] = []
    moved: list[FallbackNode] = []  # the nodes of target partitions that did not compile for the target
    for p in plan.partitions:
        seg, failed = _segment(p, target, compile_fn, fallback)
        if failed and p.runner == TARGET:
            moved += [FallbackNode(nd["name"], str(nd["op_type"]), failed, node_flops(nd), p.index, seg.runner)
                      for nd in p.ir.get("nodes", []) if not is_structural(str(nd["op_type"]), nd.get("attrs"))]
        segments.append(seg)
    nodes = [replace(f, runner=segments[f.partition].runner) for f in plan.fallback] + moved
    inputs = [TensorSpec(t.name, tuple(t.shape), t.dtype, _device_dtype(segments, t.name, t.dtype, "inputs"), -1,
                         value_range=(value_ranges or {}).get(t.name)) for t in plan.graph_inputs]
    made = {t.name: p for p in plan.partitions for t in p.outputs}
    names = {t.name for t in plan.graph_inputs}
    outputs = [TensorSpec(t.name, tuple(t.shape), t.dtype, _device_dtype(segments, t.name, t.dtype, "outputs"), -1,
                          alias_of=_alias(made.get(t.name), segments, t.name, names)) for t in plan.graph_outputs]
    return PartitionedProgram(plan.model_name, target, compute_dtype, inputs, outputs, segments,
                              sorted(nodes, key=lambda f: f.partition), dict(stats or {}),
                              formats=dict(plan.formats), dead=list(plan.dead))


def _segment(p: Partition, target: str, compile_fn: CompileFn, fallback: bool) -> tuple[Segment, str]:
    """One partition as a segment, and why it does not run where the plan put it ("" when it does)."""
    seg = Segment(p.index, p.device, p.runner, list(p.nodes), list(p.inputs), list(p.outputs), p.flops)
    if p.runner == TORCH:
        seg.ir = p.ir
        return seg, ""
    attempts = [(REFERENCE, "cpu")]
    if p.runner == TARGET:
        attempts = [(TARGET, target)] + (attempts if target != "cpu" else [])
    failures = []
    for runner, for_target in attempts:
        try:
            seg.program = compile_fn(p.ir, for_target)
        except NPUCompileError as e:
            if not fallback:
                raise
            failures.append(f"failed to compile for target '{for_target}': {e}")
            continue
        seg.device, seg.runner = (NPU if runner == TARGET else CPU), runner
        break
    if seg.program is None:
        seg.device, seg.runner, seg.ir = CPU, TORCH, p.ir
    if failures:
        where = "the CPU reference" if seg.runner == REFERENCE else "the CPU fallback (torch_ir)"
        warnings.warn(f"{p.name} {failures[0]}; it runs on {where} instead", RuntimeWarning, stacklevel=4)
    return seg, failures[0] if failures else ""


def _device_dtype(segments: list[Segment], name: str, dtype: str, side: str) -> str:
    """How the accelerator holds a graph input or output: as the target's programs that read or make it do (the
    compute dtype for a float tensor), else in the IR's dtype."""
    for s in segments:
        if s.runner == TARGET:
            spec = next((t for t in getattr(s.program, side) if t.name == name), None)
            if spec is not None:
                return spec.device_dtype
    return dtype


def _alias(p: Partition | None, segments: list[Segment], name: str, inputs: set[str]) -> str | None:
    """The graph input an output updates in place (a KV cache): where the program that makes it says so, or where
    the IR makes it as `index_copy` of a graph input (an LLM's cache write, whoever runs it)."""
    if p is None:
        return None
    prog = segments[p.index].program
    spec = next((s for s in prog.outputs if s.name == name), None) if prog is not None else None
    if spec is not None and spec.alias_of:
        return spec.alias_of
    node = next((nd for nd in p.ir.get("nodes", []) for t in nd.get("outputs", []) if t["name"] == name), None)
    if node is not None and short_op(str(node["op_type"])) in ("index_copy.default", "index_copy_.default"):
        target = node["inputs"][0]["name"] if node.get("inputs") else None
        return target if target in inputs else None
    return None


def _refusal(plan: PartitionPlan, target: str, limit: int = 12) -> str:
    shown = "; ".join(f"{f.name} ({f.op}: {f.reason})" for f in plan.fallback[:limit])
    more = f"; ... (+{len(plan.fallback) - limit})" if len(plan.fallback) > limit else ""
    return (f"--no-fallback asks for a pure accelerator program, but {len(plan.fallback)} node(s) would not run on "
            f"target '{target}': {shown}{more}. Without --no-fallback they run on the CPU as segments of the same "
            "artifact (`npusim partition` shows the plan)")
