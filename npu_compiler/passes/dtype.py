"""The compute dtype: which one a program computes in (the policy below), and the rewrite of the graph's float types
to it.

Policy (`choose_compute_dtype`), written once here and printed by the CLI as `compute dtype D (why)`:
1. A dtype the user asks for (`--dtype`, `compile(dtype=...)`), if the target config computes it.
2. Otherwise ("auto") the model's own float dtype: the dtype most weight elements have, else the float inputs', else
   float32. A target that computes it keeps it: an fp32 model stays fp32, a bf16 checkpoint stays bf16.
3. Otherwise the nearest dtype the target config computes: from float32 a half dtype, float16 for a model with
   convolutions (a CNN's activations fit its range; it keeps 3 more mantissa bits) and bfloat16 for the rest (an
   LLM's activations need fp32's range); from a half dtype float32 first, then the other half dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import normalize_dtype
from ..errors import ConstraintError
from ..ir.graph import Graph, TensorType, Value
from ..targets.config import TargetConfig

FLOATS = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class DtypeChoice:
    dtype: str
    reason: str  # "asked for" or "auto: ..."

    def describe(self) -> str:
        return f"compute dtype {self.dtype} ({self.reason})"


def weight_float_dtype(graph: Graph) -> str | None:
    """The dtype most of the weight elements have (None for a graph with no float weights)."""
    count: dict[str, int] = {}
    for v in graph.weights.values():
        if v.dtype in FLOATS:
            count[v.dtype] = count.get(v.dtype, 0) + v.type.numel
    return max(count, key=count.__getitem__) if count else None


def has_convolutions(graph: Graph) -> bool:
    return any(n.op.startswith(("conv1d.", "conv2d.")) for n in graph.nodes)


def _nearest(source: str, has_conv: bool) -> tuple[str, ...]:
    if source == "float32":
        return ("float16", "bfloat16") if has_conv else ("bfloat16", "float16")
    return ("float32", "bfloat16" if source == "float16" else "float16")


def explain_compute_dtype(graph: Graph, config: TargetConfig, requested: str | None) -> DtypeChoice:
    """The compute dtype by the policy above, and why."""
    if requested and requested != "auto":
        dt = normalize_dtype(requested, "compute dtype")
        if dt not in config.compute_dtypes:
            raise ConstraintError(f"compute dtype {dt} is not supported by target config '{config.name}' "
                                  f"(supported: {', '.join(config.compute_dtypes)})")
        return DtypeChoice(dt, "asked for")
    source, whose = weight_float_dtype(graph), "the weights are"
    if source is None:
        source, whose = _input_float_dtype(graph), "the float inputs are"
    if source is None:
        source, whose = "float32", "no float weights or inputs: the default is"
    if source in config.compute_dtypes:
        return DtypeChoice(source, f"auto: {whose} {source}, which target config '{config.name}' computes")
    for dt in _nearest(source, has_convolutions(graph)):
        if dt in config.compute_dtypes:
            why = "a model with convolutions" if source == "float32" and has_convolutions(graph) else "the nearest"
            return DtypeChoice(dt, f"auto: {whose} {source}, which target config '{config.name}' does not compute; "
                                   f"{dt} for {why}")
    raise ConstraintError(f"target config '{config.name}' computes none of {', '.join(FLOATS)}")


def choose_compute_dtype(graph: Graph, config: TargetConfig, requested: str | None) -> str:
    return explain_compute_dtype(graph, config, requested).dtype


def apply_compute_dtype(graph: Graph, compute: str) -> dict[str, str]:
    """Float tensors in the graph's source float dtype become `compute`; other dtypes (an LLM's fp32 RMSNorm and
    softmax inside a bf16 graph, integer ids) stay as the IR records them. Returns {from: to}."""
    source = weight_float_dtype(graph) or _input_float_dtype(graph) or "float32"
    if source == compute:
        return {}
    remap = {source: compute}

    def retype(v: Value) -> None:
        if v.dtype in remap:
            v.type = TensorType(v.shape, remap[v.dtype])

    seen: set[int] = set()
    for v in [*graph.inputs, *graph.weights.values(), *graph.constants.values()]:
        retype(v)
        seen.add(id(v))
    for n in graph.nodes:
        for v in n.outputs:
            if id(v) not in seen:
                retype(v)
                seen.add(id(v))
        if isinstance(n.attrs.get("dtype"), str) and n.attrs["dtype"] in remap:
            n.attrs["dtype"] = remap[n.attrs["dtype"]]
    return remap


def _input_float_dtype(graph: Graph) -> str | None:
    for v in graph.inputs:
        if v.dtype in FLOATS:
            return v.dtype
    return None
