"""Fold quantize/dequantize patterns into integer kernels: the compiler's half of reading a quantized graph (PT2E's
or `npusim quantize`'s, which write the same ops, `ir/quant_ops.py`).

    dq(x_q) -> conv2d(., dq_c(w_q), bias) [-> relu | hardtanh | clamp] -> q   =>  npu.qconv2d   (kernel qconv2d)
    dq(x_q) -> linear(., dq_c(w_q), bias) [-> relu | hardtanh | clamp] -> q   =>  npu.qlinear   (kernel qgemm)
    dq(a_q) + dq(b_q) [-> relu | hardtanh | clamp] -> q                       =>  npu.qadd      (kernel qadd)
    dq(x_q) -> max_pool2d | a view op -> q, the same parameters on both sides  =>  the op on x_q (exact)
    dq(x_q) -> conv2d | linear, a float32 result no quantize takes                 =>  the same, dequantizing

`dq` is a per-tensor dequantize of an int8/uint8 value, `dq_c` a per-channel (axis 0) or per-tensor dequantize of
an int8 weight with zero points 0 (a weight quantized at load, `quantize_per_channel` of a float weight, too), `q` a
per-tensor quantize to int8/uint8. A fused activation becomes the output clamp: quantizing is monotonic, so
q(relu(y)) = max(q(y), q(0)) and q(clamp(y, a, b)) = clamp(q(y), q(a), q(b)), exactly.

The integer bias and the requantization multipliers are weights made at load time by recipes from the checkpoint's
float bias and weight scales (`quant_bias`, `requant_scale`: npu_runtime/weights.py), as BatchNorm folding makes its
weights. Whatever is not folded runs as the graph says: a dequantize, the float op, a quantize (mixed precision).

`integer_groups` finds the patterns without changing the graph: the partition path asks it which nodes a target
without integer kernels must run elsewhere (`op_support.SupportPredicate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..fusion.match import GraphIndex, replace_node_group
from ..ir.graph import Graph, Node, TensorType, Value
from ..ir.quant_ops import DEQUANTIZE, DEQUANTIZE_CHANNEL, QUANT_DTYPES, QUANTIZE, QUANTIZE_CHANNEL
from ..recipes import Recipe
from .fixed_point import quantize_multiplier

ACTIVATIONS = ("relu.default", "hardtanh.default", "clamp.default")
EXACT_OPS = ("max_pool2d.default", "view.default", "reshape.default", "_unsafe_view.default", "flatten.using_ints",
             "unsqueeze.default", "squeeze.dim", "squeeze.dims", "permute.default", "transpose.int")
_CHANNEL_ATTRS = ("axis", "quant_min", "quant_max", "dtype")
ADD_LEFT_SHIFT = 20  # TFLite's int8 ADD: inputs shifted left 20 bits before rescaling


@dataclass(frozen=True)
class QParams:
    """A per-tensor quantize/dequantize's parameters."""

    scale: float
    zero_point: int
    qmin: int
    qmax: int
    dtype: str

    @classmethod
    def of(cls, node: Node) -> QParams:
        a = node.attrs
        return cls(float(a["scale"]), int(a["zero_point"]), int(a["quant_min"]), int(a["quant_max"]), str(a["dtype"]))

    def quantize(self, x: float) -> int:
        """What the quantize op makes of the number x (float32 arithmetic, as the kernel)."""
        y = float(np.rint(np.float32(x) * np.float32(1.0 / self.scale)))
        return int(min(max(y + self.zero_point, self.qmin), self.qmax))


@dataclass
class Group:
    """One pattern found: its kind (the kernel it becomes, or "exact" for an op that runs on the integers as they
    are), the nodes it replaces (the quantize last) and what the rewrite needs."""

    kind: str
    nodes: list[Node]
    out: Node | None  # the quantize whose value the folded node produces (None: a float result, dequantized)
    core: Node
    act: Node | None = None
    info: dict = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [o for n in self.nodes for o in n.origin]


def _dequantized(gi: GraphIndex, v: Value) -> Node | None:
    """The per-tensor dequantize of an int8/uint8 value producing `v` (float32), or None."""
    n = gi.prod(v, DEQUANTIZE)
    if n is None or str(n.attrs.get("dtype")) not in QUANT_DTYPES or v.dtype != "float32":
        return None
    return n


def _weight_dequantize(gi: GraphIndex, v: Value) -> tuple[list[Node], dict] | None:
    """An int8 weight read through a dequantize along axis 0 (per channel) or per tensor, zero points 0 (checked at
    load where they are a tensor): the nodes and what the recipes need."""
    n = gi.prod(v)
    if n is None or str(n.attrs.get("dtype")) != "int8" or v.dtype != "float32":
        return None
    w = n.inputs[0]
    nodes = [n]
    quantize = None
    if w.kind != "weight":
        quantize = gi.prod(w, QUANTIZE_CHANNEL)
        if quantize is None or n.op != DEQUANTIZE_CHANNEL or quantize.inputs[0].kind != "weight" or \
                quantize.inputs[1:] != n.inputs[1:] or any(quantize.attrs[k] != n.attrs[k] for k in _CHANNEL_ATTRS):
            return None
        nodes.insert(0, quantize)
    if n.op == DEQUANTIZE:
        if int(n.attrs["zero_point"]) != 0 or w.kind != "weight":
            return None
        return nodes, {"w": w, "per_channel": False, "scale": float(n.attrs["scale"])}
    if n.op != DEQUANTIZE_CHANNEL or int(n.attrs["axis"]) % len(w.shape) != 0:
        return None
    if any(x.kind != "weight" for x in n.inputs[1:]):
        return None
    return nodes, {"w": w, "per_channel": True, "scales": n.inputs[1], "zero_points": n.inputs[2]
                   if len(n.inputs) > 2 else None, "quantize": quantize}


def _activation_bounds(act: Node | None, out: QParams) -> tuple[int, int]:
    lo, hi = out.qmin, out.qmax
    if act is None:
        return lo, hi
    if act.op == "relu.default":
        return max(lo, out.quantize(0.0)), hi
    a = act.attrs
    lo_v, hi_v = (a.get("min_val", -1.0), a.get("max_val", 1.0)) if act.op == "hardtanh.default" else \
        (a.get("min"), a.get("max"))
    if lo_v is not None:
        lo = max(lo, out.quantize(float(lo_v)))
    if hi_v is not None:
        hi = min(hi, out.quantize(float(hi_v)))
    return lo, max(lo, hi)


def _tail(gi: GraphIndex, q: Node) -> tuple[Node | None, Node | None]:
    """(the op producing q's input, an activation between them or None), each read only by the next."""
    p = gi.prod(q.inputs[0])
    act = None
    if p is not None and p.op in ACTIVATIONS and gi.single_use(p.outputs[0]):
        act, p = p, gi.prod(p.inputs[0])
    if p is None or not gi.single_use(p.outputs[0]):
        return None, None
    return p, act


def integer_groups(graph: Graph) -> list[Group]:
    """Every pattern of the module's docstring in the graph (without changing it)."""
    gi = GraphIndex(graph)
    groups = []
    for q in graph.nodes:
        if q.op != QUANTIZE or q.outputs[0].dtype not in QUANT_DTYPES or q.inputs[0].dtype != "float32":
            continue
        g = _match(gi, q)
        if g is not None:
            groups.append(g)
    taken = {id(g.core) for g in groups}
    for core in graph.nodes:  # a contraction of quantized operands whose float result no quantize takes
        if core.op in ("conv2d.default", "linear.default") and id(core) not in taken and \
                core.outputs[0].dtype == "float32":
            g = _contraction_group(gi, core, None, None)
            if g is not None:
                groups.append(g)
    return groups


def _match(gi: GraphIndex, q: Node) -> Group | None:
    core, act = _tail(gi, q)
    if core is None:
        return None
    out = QParams.of(q)
    if core.op in EXACT_OPS and act is None:
        dq = _dequantized(gi, core.inputs[0])
        if dq is not None and QParams.of(dq) == out and len(core.inputs) == 1:
            return Group("exact", [dq, core, q], q, core, info={"x": dq.inputs[0]})
        return None
    if core.op in ("conv2d.default", "linear.default"):
        return _contraction_group(gi, core, act, q)
    if core.op == "add.Tensor" and len(core.inputs) == 2 and float(core.attrs.get("alpha", 1)) == 1.0:
        da, db = _dequantized(gi, core.inputs[0]), _dequantized(gi, core.inputs[1])
        if da is None or db is None:
            return None
        nodes = [da, db, core, *([act] if act else []), q]
        return Group("qadd", nodes, q, core, act, {"a": da, "b": db})
    return None


def node_formats(graph: Graph) -> dict[str, str]:
    """The number format of every IR node of a quantized graph, by name: int8 where a pattern folds into an integer
    kernel (or runs on the integers as they are), the quantize/dequantize ops' conversions, and the dtype a float op
    computes in (between a dequantize and a quantize). Empty for a graph with no quantize op."""
    if not any(n.op == QUANTIZE for n in graph.nodes):
        return {}
    formats: dict[str, str] = {}
    for g in integer_groups(graph):
        for name in g.names:
            formats.setdefault(name, f"int8 ({g.kind})")
    for n in graph.nodes:
        if n.op in (QUANTIZE, QUANTIZE_CHANNEL):
            text = f"{n.inputs[0].dtype} -> {n.outputs[0].dtype} (quantize)"
        elif n.op in (DEQUANTIZE, DEQUANTIZE_CHANNEL):
            text = f"{n.inputs[0].dtype} -> {n.outputs[0].dtype} (dequantize)"
        else:
            text = n.outputs[0].dtype if n.outputs else "-"
        for name in n.origin:
            formats.setdefault(name, text)
    return formats


def _contraction_group(gi: GraphIndex, core: Node, act: Node | None, q: Node | None) -> Group | None:
    """A conv2d or linear of a dequantized activation and an int8 weight; `q` the quantize of its result (None: the
    result stays float, and the kernel dequantizes it)."""
    dq = _dequantized(gi, core.inputs[0])
    wq = _weight_dequantize(gi, core.inputs[1]) if len(core.inputs) > 1 else None
    if dq is None or wq is None:
        return None
    bias = core.inputs[2] if len(core.inputs) > 2 else None
    if bias is not None and (bias.kind != "weight" or bias.dtype != "float32"):
        return None
    if core.op == "conv2d.default" and (len(core.inputs[0].shape) != 4 or not isinstance(core.attrs.get("padding"),
                                                                                        list | tuple)):
        return None
    kind = "qconv2d" if core.op == "conv2d.default" else "qgemm"
    nodes = [dq, *wq[0], core, *([act] if act else []), *([q] if q else [])]
    return Group(kind, nodes, q, core, act, {"x": dq.inputs[0], "x_params": QParams.of(dq), "bias": bias, **wq[1]})


def fold_quantized(graph: Graph, recipes: dict[str, Recipe], kinds: frozenset[str] | set[str]
                   ) -> tuple[int, list[Group]]:
    """Rewrite every pattern whose kernel kind is in `kinds` (the target's); returns how many it folded and the
    groups it did not fold because the target lacks their kernel (the caller refuses them by name)."""
    missing: list[Group] = []
    folded = 0
    for g in integer_groups(graph):
        if g.kind != "exact" and g.kind not in kinds:
            missing.append(g)
            continue
        new = _rewrite(graph, g, recipes)
        sink = g.out or g.core
        replace_node_group(graph, [n for n in (g.core, g.act, g.out) if n is not None], new, sink)
        new.origin = list(dict.fromkeys(g.names))  # the dequantizes too: the kernel stands for the whole pattern
        folded += 1
    graph.remove_dead()
    return folded, missing


def _new(name: str, op: str, inputs: list[Value], out: Value, attrs: dict) -> Node:
    """A node producing the quantize's own output value (later groups and readers keep their references)."""
    node = Node(name, op, inputs, [out], attrs)
    out.producer = node
    return node


def _weight(graph: Graph, name: str, shape: tuple[int, ...], dtype: str, key: str, recipe: Recipe,
            recipes: dict[str, Recipe]) -> Value:
    v = Value(name, TensorType(shape, dtype), "weight")
    graph.weights[name] = v
    graph.weight_keys[name] = key
    recipes[name] = recipe
    return v


def _rewrite(graph: Graph, g: Group, recipes: dict[str, Recipe]) -> Node:
    if g.out is None:
        return _contraction(graph, g, None, {"dequantize": True}, recipes)
    out = QParams.of(g.out)
    lo, hi = _activation_bounds(g.act, out)
    qattrs = {"out_zero_point": out.zero_point, "lo": lo, "hi": hi, "rounding": "single", "dequantize": False}
    if g.kind == "exact":
        return _new(g.core.name, g.core.op, [g.info["x"]], g.out.outputs[0], dict(g.core.attrs))
    if g.kind == "qadd":
        return _qadd(g, out, qattrs)
    return _contraction(graph, g, out, qattrs, recipes)


def _qadd(g: Group, out: QParams, qattrs: dict) -> Node:
    a, b = QParams.of(g.info["a"]), QParams.of(g.info["b"])
    twice_max = 2 * max(a.scale, b.scale)
    ma, na = quantize_multiplier(a.scale / twice_max)
    mb, nb = quantize_multiplier(b.scale / twice_max)
    mo, no = quantize_multiplier(twice_max / ((1 << ADD_LEFT_SHIFT) * out.scale))
    attrs = {**qattrs, "a_zero_point": a.zero_point, "b_zero_point": b.zero_point, "left_shift": ADD_LEFT_SHIFT,
             "a_multiplier": ma, "a_shift": na, "b_multiplier": mb, "b_shift": nb, "out_multiplier": mo,
             "out_shift": no}
    return _new(g.core.name, "npu.qadd", [g.info["a"].inputs[0], g.info["b"].inputs[0]], g.out.outputs[0], attrs)


def _contraction(graph: Graph, g: Group, out: QParams | None, qattrs: dict, recipes: dict[str, Recipe]) -> Node:
    info, core = g.info, g.core
    x: QParams = info["x_params"]
    w: Value = info["w"]
    channels = w.shape[0]
    dequantize = out is None
    params = {"input_scale": x.scale} if dequantize else {"input_scale": x.scale, "output_scale": out.scale}
    sources: dict[str, str] = {}
    if info["per_channel"]:
        sources["weight_scale"] = graph.weight_keys[info["scales"].name]
        if info["zero_points"] is not None:
            sources["weight_zero_point"] = graph.weight_keys[info["zero_points"].name]
    else:
        params["weight_scale"] = info["scale"]
    if info.get("quantize") is not None:  # a float weight quantized at load
        qn = info["quantize"]
        src = {"weight": graph.weight_keys[qn.inputs[0].name], **sources}
        w = _weight(graph, f"{core.name}.weight_int8", w.shape, "int8", f"quantize({src['weight']})",
                    Recipe("quantize_weight", src, {"quant_min": int(qn.attrs["quant_min"]),
                                                    "quant_max": int(qn.attrs["quant_max"])}), recipes)
    rows = channels if info["per_channel"] else 1
    if dequantize:
        scale = _weight(graph, f"{core.name}.dequant_scale", (rows,), "float32", f"dequant_scale({core.name})",
                        Recipe("dequant_scale", dict(sources), dict(params)), recipes)
    else:
        scale = _weight(graph, f"{core.name}.requant", (rows, 2), "int32", f"requant({core.name})",
                        Recipe("requant_scale", dict(sources), dict(params)), recipes)
    inputs = [info["x"], w]
    if info["bias"] is not None and dequantize:
        inputs.append(info["bias"])  # added in float after the sum is scaled
    elif info["bias"] is not None:
        bsrc = {"bias": graph.weight_keys[info["bias"].name], **sources}
        inputs.append(_weight(graph, f"{core.name}.bias_int32", (channels,), "int32", f"quant_bias({core.name})",
                              Recipe("quant_bias", bsrc, dict(params)), recipes))
    inputs.append(scale)
    attrs = {**qattrs, "x_zero_point": x.zero_point, "has_bias": info["bias"] is not None}
    result = (g.out or core).outputs[0]
    if g.kind == "qconv2d":
        a = core.attrs
        attrs.update(stride=list(a["stride"]), padding=list(a["padding"]), dilation=list(a["dilation"]),
                     groups=int(a["groups"]))
        return _new(core.name, "npu.qconv2d", inputs, result, attrs)
    return _new(core.name, "npu.qlinear", inputs, result, attrs)
