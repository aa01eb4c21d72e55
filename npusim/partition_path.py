"""The partition path for `npusim verify` and `npusim run` on an IR: when a graph has ops the target lacks, compile it
into a partitioned artifact (accelerator + CPU segments, `npu_compiler.compile_artifact`) and run that.

    unsupported = needs_partition(ir, target, force_cpu)
    if unsupported:
        print(partition_notice(unsupported, target))
        outputs = run_partitioned(ir, weights, inputs, backend, dtype, force_cpu)
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from npu_compiler.ir.reader import checked_ir_dict
from npu_compiler.op_support import support_predicate
from npu_compiler.partition import FallbackNode, PartitionPlan, partition

__all__ = ["check_force_cpu", "needs_partition", "partition_notice", "make_plan", "run_partitioned"]

IRSource = str | os.PathLike | Mapping[str, Any]


def check_force_cpu(ir: IRSource, force_cpu: Iterable[str]) -> None:
    """Every --force-cpu entry must name an op or a node of the graph: a typo must not be silently ignored."""
    from npu_compiler.ir.schema import short_op
    from npu_runtime.errors import InputError

    force_cpu = list(force_cpu)
    if not force_cpu:
        return
    nodes = checked_ir_dict(ir)["nodes"]
    # the predicate's own matching (op in any spelling, or node name), one entry at a time
    unmatched = [e for e in force_cpu
                 if not any(support_predicate("cpu", [e])._forced(nd) for nd in nodes)]
    if unmatched:
        ops = sorted({short_op(str(nd.get("op_type", ""))) for nd in nodes})
        raise InputError(f"--force-cpu {', '.join(unmatched)}: no such op or node in the graph; its ops: "
                         f"{', '.join(ops)}")


def make_plan(ir: IRSource, target: str, force_cpu: Iterable[str] = ()) -> PartitionPlan:
    return partition(ir, support_predicate(target, force_cpu))


def needs_partition(ir: IRSource, target: str, force_cpu: Iterable[str] = ()) -> list[FallbackNode]:
    """The nodes that must run on the CPU for `target` (name, op, reason); empty when one program runs it all."""
    data = checked_ir_dict(ir)  # the partition path reads the JSON form: read_ir checks all of it first
    pred = support_predicate(target, force_cpu)
    pred.prepare(data)
    return [FallbackNode(nd["name"], str(nd["op_type"]), pred.reason(nd) or "", 0, -1)
            for nd in data.get("nodes", []) if not pred(nd)]


def partition_notice(unsupported: list[FallbackNode], target: str, limit: int = 8) -> str:
    """One line for the user: why the partition path is taken and which nodes fall back."""
    from collections import Counter

    shown = ", ".join(f"{f.name} ({f.op})" for f in unsupported[:limit])
    more = f", ... (+{len(unsupported) - limit})" if len(unsupported) > limit else ""
    reasons = "; ".join(f"{n} {why}" for why, n in Counter(f.reason for f in unsupported).most_common(3))
    return (f"{len(unsupported)} node(s) run on the CPU instead of target '{target}' ({reasons}): {shown}{more}; "
            "taking the partition path (the CPU reference runs those it has, torch_ir the rest; see `npusim "
            "partition` for the plan)")


def run_partitioned(ir: IRSource, weights: Any, inputs: Mapping[str, Any], backend: Any, dtype: str | None = None,
                    force_cpu: Iterable[str] = (), *, compile_options: Mapping[str, Any] | None = None,
                    return_executor: bool = False, allow_nonfinite: bool = False) -> Any:
    """Compile `ir` for `backend` (a Backend or its name) into a partitioned artifact (in memory), run it once and
    return the outputs by name (NumPy, IR dtypes). Every program of it is compiled with `dtype` (None: the whole
    graph's choice, made once) and `compile_options` (the keywords of `npu_compiler.compile`: `disable_passes`,
    `fusion`, `rope_theta`). With `return_executor`, returns (outputs, DAGExecutor) so a caller can time more runs or
    read `executor.plan` / `executor.num_transfers`."""
    from npu_compiler.compile_artifact import compile_artifact
    from npu_runtime import get_backend
    from npu_runtime.dag_executor import DAGExecutor

    be = get_backend(backend) if isinstance(backend, str) or backend is None else backend
    art = compile_artifact(ir, be.compile_target(), force_cpu=force_cpu, dtype=None if dtype == "auto" else dtype,
                           partitioned=True, **dict(compile_options or {}))
    ex = DAGExecutor(art, be, weights=weights, allow_nonfinite=allow_nonfinite)
    outputs: dict[str, np.ndarray] = ex.run(inputs)
    return (outputs, ex) if return_executor else outputs
