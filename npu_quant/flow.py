"""Post-training quantization end to end: the float program run on the calibration inputs (the CPU reference, fusion
off so that every tensor to quantize is some kernel's output), each tensor's statistics, the parameters the method
picks, and the rewrite (`rewrite.py`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import npu_compiler
from npu_compiler.errors import InternalError
from npu_compiler.ir.reader import checked_ir_dict
from npu_compiler.ir.schema import short_op
from npu_runtime.cpu.backend import CpuBackend
from npu_runtime.inspect import kernel_values
from npu_runtime.weights import load_weights

from . import rewrite
from .adjust import WEIGHT_ROUNDINGS, LayerInputs, LayerWeights, quantize_layer
from .calibration import METHODS, QParams, TensorStats, qparams_for


@dataclass
class Options:
    method: str = "minmax"  # minmax | percentile | entropy | mse
    symmetric: bool = True  # activations: symmetric (zero point 0) or asymmetric
    percentile: float = 99.99
    keep_float: tuple[str, ...] = ()  # tensors never quantized: the integer ops that read them stay float
    weight_rounding: str = "nearest"  # nearest | gptq (adjust.py)
    bias_correction: bool = False  # subtract each layer's mean output shift from weight rounding (adjust.py)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"calibration method {self.method!r} is not one of {', '.join(METHODS)}")
        if self.weight_rounding not in WEIGHT_ROUNDINGS:
            raise ValueError(f"weight rounding {self.weight_rounding!r} is not one of {', '.join(WEIGHT_ROUNDINGS)}")
        if not 50.0 < self.percentile <= 100.0:
            raise ValueError(f"percentile {self.percentile} is outside (50, 100]")


@dataclass
class Quantized:
    ir: dict[str, Any]
    weights: dict[str, np.ndarray]
    qparams: dict[str, QParams]
    plan: rewrite.Plan
    samples: int
    stats: dict[str, TensorStats] = field(default_factory=dict)
    layers: dict[str, LayerWeights] = field(default_factory=dict)  # conv/linear node -> its int8 weight (adjusted)


def node_outputs(ir: Mapping[str, Any]) -> dict[str, list[str]]:
    return {n["name"]: [o["name"] for o in n.get("outputs", [])] for n in ir["nodes"]}


def float_program(ir: Mapping[str, Any]) -> npu_compiler.CompiledProgram:
    """The float model as the observers see it: float32 on the CPU, one kernel per op."""
    return npu_compiler.compile(ir, "cpu", dtype="float32", fusion=False)


class Observer:
    """A program on the CPU reference whose chosen tensors are handed to a callback as each kernel writes them (a
    view's through the tensor it views). `node_outputs` (IR node -> its output names) maps a kernel to the IR value it
    holds (a conv with its BatchNorm folded holds the BatchNorm's)."""

    def __init__(self, program, weights: Any, names: Iterable[str], alias_of: Mapping[str, str],
                 node_outputs: Mapping[str, list[str]] | None = None) -> None:
        backend = CpuBackend()
        self.program = program
        self.weights = load_weights(program, weights, backend)
        self.executor = backend.create_executor(program)
        self.values = kernel_values(program, node_outputs)
        held = set(self.values)
        self.by_root: dict[str, list[str]] = {}
        for t in dict.fromkeys(names):  # a view some kernel copies (a reshape after a permute) is read from that copy
            self.by_root.setdefault(t if t in held else alias_of.get(t, t), []).append(t)

    def run(self, sample: Mapping[str, np.ndarray], visit: Callable[[str, np.ndarray], None]) -> None:
        for name in self.by_root.keys() & sample.keys():
            for t in self.by_root[name]:
                visit(t, np.asarray(sample[name]))

        def after(i: int) -> None:
            v = self.values[i]
            if v in self.by_root:
                data = np.array(self.executor.view(self.program.kernels[i].outs[0]))
                for t in self.by_root[v]:
                    visit(t, data)

        self.executor.run_observed(dict(sample), self.weights, after=after)


def quantize(ir: Any, weights: Mapping[str, np.ndarray], samples: Iterable[Mapping[str, np.ndarray]],
             options: Options | None = None) -> Quantized:
    """The quantized IR and weights of `ir` (a path, JSON string or dict) for these calibration samples (dicts of
    graph input name -> array)."""
    options = options or Options()
    data = checked_ir_dict(ir)
    p = rewrite.plan(data, set(options.keep_float))
    stats = {t: TensorStats() for t in p.observed}
    inputs = _layer_inputs(data, weights, p, options)
    program = float_program(data)
    watched = {t: [] for t in stats}
    for t, layers in inputs.items():
        watched.setdefault(t, []).extend(layers.values())

    def visit(t: str, v: np.ndarray) -> None:
        if t in stats:
            stats[t].update(v)
        for acc in watched[t]:
            acc.update(v)

    observer = Observer(program, weights, list(watched), p.alias_of, node_outputs(data))
    _check_layouts(data, inputs, set(observer.values))
    n = 0
    for sample in samples:
        observer.run(sample, visit)
        n += 1
    if n == 0:
        raise ValueError("no calibration samples")
    blind = [t for t, s in stats.items() if s.count == 0]
    if blind:
        raise InternalError("calibrating", f"no kernel of the float program holds {blind[:3]}")
    qparams = {t: qparams_for(s, options.method, options.symmetric, options.percentile) for t, s in stats.items()}
    for t, src in p.same_as.items():
        qparams[t] = qparams[src]
    layers = _layer_weights(data, weights, p, inputs, options)
    qir, qweights = rewrite.apply(data, weights, p, qparams, layers)
    qir["model_name"] = f"{data.get('model_name') or 'model'}_int8"
    return Quantized(qir, qweights, qparams, p, n, stats, layers)


def _layer_inputs(ir: Mapping[str, Any], weights: Mapping[str, np.ndarray], p: rewrite.Plan, options: Options
                  ) -> dict[str, dict[str, LayerInputs]]:
    """Input tensor -> {node: its accumulator} for every integer conv and linear, where an option needs them."""
    if options.weight_rounding == "nearest" and not options.bias_correction:
        return {}
    ix = rewrite.Index(ir)
    mapping = ir.get("weight_name_mapping") or {}
    out: dict[str, dict[str, LayerInputs]] = {}
    for name, ph in p.weights.items():
        node = ix.by_name[name]
        shape = tuple(np.shape(weights[mapping.get(ph, ph)]))
        acc = LayerInputs(short_op(str(node["op_type"])), node.get("attrs") or {}, shape,
                          gram=options.weight_rounding == "gptq", input_shape=tuple(node["inputs"][0]["shape"]))
        out.setdefault(ix.tensor_of(node["inputs"][0]), {})[name] = acc
    return out


RESHAPES = ("view.default", "reshape.default", "_unsafe_view.default", "flatten.using_ints", "unsqueeze.default",
            "squeeze.default", "squeeze.dim", "squeeze.dims")


def _check_layouts(ir: Mapping[str, Any], inputs: Mapping[str, Mapping[str, LayerInputs]], held: set[str]) -> None:
    """Mark the accumulators whose tensor the observer reads through a view that changes the layout (a permute's
    root): a reshape of the values it is handed would not be the layer's input."""
    if not inputs:
        return
    ix = rewrite.Index(ir)
    keeps_layout = set(RESHAPES) | set(rewrite.STRUCTURAL_OPS) | set(rewrite.SAME_DTYPE_CASTS)
    for t, layers in inputs.items():
        u, same = t, True
        while u not in held and u in ix.producer:
            n = ix.producer[u]
            ins = n.get("inputs") or []
            if short_op(str(n["op_type"])) not in keeps_layout or not ins or ins[0].get("producer_node") is None:
                same = False  # a permute, a slice, ...: the values handed over are another tensor's layout
                break
            u = ix.tensor_of(ins[0])
        for acc in layers.values():
            acc.same_layout = same


def _layer_weights(ir: Mapping[str, Any], weights: Mapping[str, np.ndarray], p: rewrite.Plan,
                   inputs: Mapping[str, Mapping[str, LayerInputs]], options: Options) -> dict[str, LayerWeights]:
    """The adjusted int8 weight of every integer conv and linear (none where rounding to nearest is all asked)."""
    if not inputs:
        return {}
    ix = rewrite.Index(ir)
    mapping = ir.get("weight_name_mapping") or {}
    by_node = {name: acc for layers in inputs.values() for name, acc in layers.items()}
    out = {}
    for name in p.weights:
        w, b = rewrite.layer_weight(ix.by_name[name], p, weights, mapping)
        out[name] = quantize_layer(w, b, by_node.get(name), options.weight_rounding, options.bias_correction)
    return out
