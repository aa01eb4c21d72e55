"""Check the graph against the simulated accelerator's constraints (`TargetConfig`) and plan channel padding."""

from __future__ import annotations

import math

from ..dtypes import is_float, itemsize
from ..errors import ConstraintError
from ..ir.graph import Graph
from ..targets.config import TargetConfig


def check_constraints(graph: Graph, config: TargetConfig) -> None:
    for n in graph.nodes:
        for v in n.outputs:
            if len(v.shape) > config.max_rank:
                raise ConstraintError(f"node '{n.name}' ({n.op}): output '{v.name}' has rank {len(v.shape)}, "
                                      f"target '{config.name}' allows at most {config.max_rank}")
            if is_float(v.dtype) and v.dtype not in config.compute_dtypes:
                raise ConstraintError(f"node '{n.name}' ({n.op}): output '{v.name}' is {v.dtype}, which target "
                                      f"'{config.name}' cannot compute (supported: {', '.join(config.compute_dtypes)})"
                                      "; compile with --dtype float16 or bfloat16")


def plan_channel_padding(graph: Graph, config: TargetConfig) -> list[dict]:
    """For every 4-D activation and conv weight, the channel count padded to the target's alignment and the bytes
    the padding costs. The plan is reported; targets whose alignment is 1 byte need none."""
    align = config.channel_alignment_bytes
    if align <= 1:
        return []
    plan = []
    values = [*graph.inputs, *graph.weights.values(), *(o for n in graph.nodes for o in n.outputs)]
    for v in values:
        if len(v.shape) != 4 or not is_float(v.dtype):
            continue
        per = max(1, align // itemsize(v.dtype))
        axis = 1 if v.kind != "weight" else 0
        c = v.shape[axis]
        cp = -(-c // per) * per
        if cp != c:
            extra = (cp - c) * math.prod(v.shape) // c * itemsize(v.dtype)
            plan.append({"tensor": v.name, "axis": axis, "channels": c, "padded": cp, "extra_bytes": extra})
    return plan
