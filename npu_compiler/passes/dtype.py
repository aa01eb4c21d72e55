"""Choose the compute dtype and rewrite the graph's float types to it."""

from __future__ import annotations

from ..dtypes import normalize_dtype
from ..errors import ConstraintError
from ..ir.graph import Graph, TensorType, Value
from ..targets.config import TargetConfig


def weight_float_dtype(graph: Graph) -> str | None:
    """The dtype most of the weight elements have (None for a graph with no float weights)."""
    count: dict[str, int] = {}
    for v in graph.weights.values():
        if v.dtype in ("float32", "float16", "bfloat16"):
            count[v.dtype] = count.get(v.dtype, 0) + v.type.numel
    return max(count, key=count.__getitem__) if count else None


def choose_compute_dtype(graph: Graph, config: TargetConfig, requested: str | None) -> str:
    """Explicit request, else the weights' half dtype, else fp16 for CNNs (they have convs) and bf16 for the
    rest (LLMs), as an NPU toolchain does. A target that supports fp32 keeps fp32 only when asked."""
    if requested and requested != "auto":
        dt = normalize_dtype(requested, "compute dtype")
        if dt not in config.compute_dtypes:
            raise ConstraintError(f"compute dtype {dt} is not supported by target config '{config.name}' "
                                  f"(supported: {', '.join(config.compute_dtypes)})")
        return dt
    wd = weight_float_dtype(graph)
    if wd in ("float16", "bfloat16") and wd in config.compute_dtypes:
        return wd
    has_conv = any(n.op == "conv2d.default" for n in graph.nodes)
    return "float16" if has_conv else "bfloat16"


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
        if v.dtype in ("float32", "float16", "bfloat16"):
            return v.dtype
    return None
