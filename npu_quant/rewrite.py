"""The IR rewrite of post-training quantization, on the IR's JSON form: what to quantize (`plan`) and the quantized
IR and weights (`apply`), written as PT2E writes a quantized graph (`npu_compiler/ir/quant_ops.py`), so the compiler
reads ours and PyTorch's the same way and folds both into integer kernels (`npu_compiler/quant/fold.py`).

- BatchNorm after a convolution is folded into its weight and bias first (in float32, as the compiler folds it).
- Weights of convolutions and linears: int8 per output channel, symmetric ([-127, 127], scale max|w| / 127), read
  through `dequantize_per_channel`; their bias stays float (the compiler makes it int32 at load).
- Activations: where an integer op reads them: the inputs of conv2d and linear, the operands and result of an add of
  two int8 tensors (integer ops' results), and an integer op's result that one of those reads (after the ReLU or
  clamp that follows it, which the kernel fuses). Each gets a `quantize_per_tensor` after its producer and a
  `dequantize_per_tensor` before each integer reader; a float op reads the float value where one exists (a norm's
  output that is both a linear's input and a transformer's residual: only the linear reads int8, as PT2E's per-edge
  observers place it), a dequantize of the integers where the producer is an integer op. A conv's or linear's
  result that only float ops read stays float (the kernel dequantizes), an add whose result a layer norm reads (a
  transformer's residual) stays float, and so does a tensor computed only from integer inputs (an attention mask).
  An op that only moves or selects values (max_pool2d, views) between quantized tensors keeps its input's
  parameters, so it runs on the integers. Every other op (softmax, layer norm, GELU, mean, ...) computes in float:
  mixed precision, which `describe` shows.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from npu_compiler.errors import NPUCompileError
from npu_compiler.ir.quant_ops import DEQUANTIZE, DEQUANTIZE_CHANNEL, QUANTIZE
from npu_compiler.ir.schema import short_op
from npu_compiler.lowering.lower import VIEW_OPS
from npu_compiler.passes.normalize import STRUCTURAL_OPS

from .adjust import WEIGHT_RANGE, LayerWeights, round_nearest, weight_scales
from .calibration import QParams

CONTRACTIONS = ("conv2d.default", "linear.default")
ADDS = ("add.Tensor", "add_.Tensor")
ACTIVATIONS = ("relu.default", "relu_.default", "hardtanh.default", "hardtanh_.default", "clamp.default")
PASS_THROUGH = ("max_pool2d.default", "view.default", "reshape.default", "_unsafe_view.default", "flatten.using_ints",
                "unsqueeze.default", "squeeze.dim", "squeeze.dims", "permute.default", "transpose.int")
VIEWS = PASS_THROUGH[1:]
BN = "batch_norm.default"
NORMS = ("layer_norm.default", "native_layer_norm.default", "group_norm.default")
FLOATS = ("float32", "float16", "bfloat16", "float64")
SAME_DTYPE_CASTS = ("to.dtype", "_to_copy.default", "to.dtype_layout", "type_as.default")


@dataclass
class Plan:
    """What `apply` quantizes: the activation tensors (by name) in graph order, each either observed or taking the
    parameters of another (`same_as`: a pass-through op's output), and the weights of the integer ops."""

    tensors: list[str] = field(default_factory=list)
    same_as: dict[str, str] = field(default_factory=dict)
    weights: dict[str, str] = field(default_factory=dict)  # node name -> its weight placeholder
    bn: dict[str, dict] = field(default_factory=dict)  # conv node name -> its BatchNorm node (folded)
    alias_of: dict[str, str] = field(default_factory=dict)  # a view's tensor -> the tensor it views (for observers)
    views: dict[str, str] = field(default_factory=dict)  # a quantized view's tensor -> its (quantized) input
    produced: set[str] = field(default_factory=set)  # integer ops' results: no float value of them exists
    integer_readers: set[str] = field(default_factory=set)  # nodes that read int8 operands (integer ops, views)

    @property
    def observed(self) -> list[str]:
        return [t for t in self.tensors if t not in self.same_as]


class Index:
    def __init__(self, ir: Mapping[str, Any]) -> None:
        self.nodes = list(ir["nodes"])
        self.by_name = {n["name"]: n for n in self.nodes}
        self.inputs = {t["name"] for t in ir["graph_inputs"]}
        self.outputs = [t["name"] for t in ir["graph_outputs"]]
        self.readers: dict[str, list[dict]] = {}
        self.producer: dict[str, dict] = {}
        for n in self.nodes:
            for t in n.get("outputs", []):
                self.producer[t["name"]] = n
            for t in n.get("inputs", []):
                if t.get("producer_node") is not None:
                    self.readers.setdefault(self.tensor_of(t), []).append(n)

    def live(self) -> set[str]:
        """The names of the nodes whose results reach a graph output (the compiler drops the others)."""
        needed = set(self.outputs)
        alive: set[str] = set()
        for n in reversed(self.nodes):
            if any(t["name"] in needed for t in n.get("outputs", [])):
                alive.add(n["name"])
                needed.update(self.tensor_of(t) for t in n.get("inputs", []) if t.get("producer_node") is not None)
        return alive

    def activations(self, ir: Mapping[str, Any]) -> set[str]:
        """The tensors that depend on a float graph input or a float weight: activations. A tensor computed only from
        integer inputs and constants (an attention mask made from a 0/1 mask, with its -3.4e38 or -10000) is not one:
        quantizing it would spend every level on the mask."""
        float_inputs = {t["name"] for t in ir["graph_inputs"] if str(t["dtype"]) in FLOATS}
        out = set(float_inputs)
        for n in self.nodes:
            deps = n.get("inputs", [])
            if any((t.get("producer_node") is None and str(t.get("dtype")) in FLOATS) or
                   (t.get("producer_node") is not None and self.tensor_of(t) in out) for t in deps):
                out.update(t["name"] for t in n.get("outputs", []))
        return out

    def tensor_of(self, ref: Mapping[str, Any]) -> str:
        """The tensor name an input reference reads (a graph input names itself)."""
        prod = ref["producer_node"]
        if prod in self.inputs and prod not in self.by_name:
            return prod
        return self.by_name[prod]["outputs"][int(ref.get("producer_output_idx", 0))]["name"]

    def only_reader(self, tensor: str) -> dict | None:
        r = self.readers.get(tensor, [])
        return r[0] if len(r) == 1 and tensor not in self.outputs else None




def _aliases(op: str, node: Mapping[str, Any]) -> bool:
    """Does the node's output hold its input's values (a view, a no-op the compiler drops, a same-dtype cast), so
    that no kernel of the float program writes it and its statistics are its input's?"""
    if op in VIEW_OPS or op in STRUCTURAL_OPS:
        return bool(node.get("outputs"))
    ins, outs = node.get("inputs", []), node.get("outputs", [])
    return op in SAME_DTYPE_CASTS and len(ins) >= 1 and len(outs) == 1 and ins[0].get("dtype") == outs[0]["dtype"]


def _feeds_a_norm(ix: Index, n: Mapping[str, Any]) -> bool:
    """Is the node's result (through an activation) read by a layer or group norm? A transformer's residual add and
    the norm after it stay in float, as int8 deployments of BERT keep them: the norm divides by the spread of its
    input, which an int8 step of the residual's range is a large part of (all-MiniLM-L6-v2's embeddings: 15 dB)."""
    out = n["outputs"][0]["name"]
    act = ix.only_reader(out)
    if act is not None and short_op(str(act["op_type"])) in ACTIVATIONS:
        out = act["outputs"][0]["name"]
    return any(short_op(str(r["op_type"])) in NORMS for r in ix.readers.get(out, []))


def plan(ir: Mapping[str, Any], keep_float: Collection[str] = ()) -> Plan:
    """The tensors and weights to quantize (see the module's docstring): a tensor is quantized where an integer op
    reads it (a conv2d's or linear's input, an add's operands and result) or where it is an integer op's result that
    another integer op reads; a conv's or linear's result that only float ops read stays float (the kernel writes
    it dequantized)."""
    ix = Index(ir)
    p = Plan()
    live = ix.live()
    data = ix.activations(ir)

    def activation(ref: Mapping[str, Any]) -> bool:
        return ref.get("producer_node") is not None and str(ref.get("dtype")) == "float32" and \
            ix.tensor_of(ref) in data and ix.tensor_of(ref) not in keep_float

    quantized: dict[str, None] = {}  # must be int8: an integer op reads it, or an integer add writes it
    produced: set[str] = set()  # an integer op's result (after the activation it fuses)
    for n in ix.nodes:
        if n["name"] not in live:
            continue
        op = short_op(str(n["op_type"]))
        ins = n.get("inputs", [])
        if _aliases(op, n) and ins and ins[0].get("producer_node") is not None:
            p.alias_of[n["outputs"][0]["name"]] = p.alias_of.get(ix.tensor_of(ins[0]), ix.tensor_of(ins[0]))
        if op in CONTRACTIONS and len(ins) >= 2 and activation(ins[0]) and ins[1].get("producer_node") is None \
                and str(ins[1].get("dtype")) == "float32" and (op != "conv2d.default" or len(ins[0]["shape"]) == 4):
            p.weights[n["name"]] = ins[1]["name"]
            p.integer_readers.add(n["name"])
            quantized.setdefault(ix.tensor_of(ins[0]))
            produced.add(_result(ix, p, n))
    # pass-through ops (max pool, views) carry an integer result on: their results count as produced
    for n in ix.nodes:
        op = short_op(str(n["op_type"]))
        ins = n.get("inputs", [])
        if n["name"] in live and op in PASS_THROUGH and ins and ins[0].get("producer_node") is not None and \
                ix.tensor_of(ins[0]) in produced:
            produced.add(n["outputs"][0]["name"])
    # an add of two tensors that are int8 anyway (an integer op's results, a conv's input) is an integer add
    for n in ix.nodes:
        op = short_op(str(n["op_type"]))
        ins = n.get("inputs", [])
        if n["name"] in live and op in ADDS and len(ins) == 2 and all(activation(t) for t in ins) and \
                float(n.get("attrs", {}).get("alpha", 1)) == 1.0 and not _feeds_a_norm(ix, n) and \
                all(ix.tensor_of(t) in produced or ix.tensor_of(t) in quantized for t in ins):
            for t in ins:
                quantized.setdefault(ix.tensor_of(t))
            p.integer_readers.add(n["name"])
            out = _result(ix, p, n)
            quantized.setdefault(out)
            produced.add(out)
    # a pass-through op whose result is quantized runs on its input's integers, with the same parameters (walked
    # backwards, so a view of a max pool of a conv's result reaches the conv)
    for n in reversed(ix.nodes):
        op = short_op(str(n["op_type"]))
        ins = n.get("inputs", [])
        out = n["outputs"][0]["name"] if n.get("outputs") else None
        if out in quantized and op in PASS_THROUGH and ins and ins[0].get("producer_node") is not None:
            src = ix.tensor_of(ins[0])
            if src in produced or src in quantized:
                quantized.setdefault(src)
    for n in ix.nodes:  # parameters follow the input, in graph order
        op = short_op(str(n["op_type"]))
        ins = n.get("inputs", [])
        out = n["outputs"][0]["name"] if n.get("outputs") else None
        if out in quantized and op in PASS_THROUGH and ins and ins[0].get("producer_node") is not None and \
                ix.tensor_of(ins[0]) in quantized:
            src = ix.tensor_of(ins[0])
            p.same_as[out] = p.same_as.get(src, src)
            p.integer_readers.add(n["name"])
            if op in VIEWS:
                p.views[out] = src
    order = {name: i for i, name in enumerate(ix.inputs)}
    for i, n in enumerate(ix.nodes):
        for t in n.get("outputs", []):
            order[t["name"]] = len(ix.inputs) + i
    p.tensors = sorted((t for t in quantized if t not in ix.outputs or t not in ix.inputs), key=lambda t: order[t])
    p.produced = {t for t in produced if t in quantized}
    return p


def _result(ix: Index, p: Plan, n: Mapping[str, Any]) -> str:
    """An integer op's result: after the BatchNorm folded into a conv and the activation the kernel fuses."""
    out = n["outputs"][0]["name"]
    if short_op(str(n["op_type"])) == "conv2d.default":
        bn = ix.only_reader(out)
        if bn is not None and short_op(str(bn["op_type"])) == BN and not bn.get("attrs", {}).get("training"):
            p.bn[n["name"]] = bn
            out = bn["outputs"][0]["name"]
    act = ix.only_reader(out)
    if act is not None and short_op(str(act["op_type"])) in ACTIVATIONS:
        out = act["outputs"][0]["name"]
    return out


# ---- weights ----------------------------------------------------------------------------------------------------


def quantize_weight(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 per output channel (axis 0), symmetric, rounded to nearest: (q, scales). As quantize_per_channel computes
    it: w * (1 / s) in float32, rounded half to even."""
    scales = weight_scales(w)
    return round_nearest(w, scales), scales


def fold_batchnorm(w: np.ndarray, b: np.ndarray | None, bn: Mapping[str, Any], weights: Mapping[str, np.ndarray],
                   mapping: Mapping[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """Conv weight and bias with an eval BatchNorm folded in (float32, as the compiler's bn_fold recipes)."""
    keys = [mapping.get(t["name"], t["name"]) for t in bn["inputs"][1:5]]
    gamma, beta, mean, var = (np.asarray(weights[k], dtype=np.float32) for k in keys)
    scale = gamma / np.sqrt(var + np.float32(bn["attrs"].get("eps", 1e-5)))
    b = np.zeros(w.shape[0], np.float32) if b is None else np.asarray(b, dtype=np.float32)
    return (w * scale.reshape(-1, *([1] * (w.ndim - 1)))).astype(np.float32), ((b - mean) * scale + beta
                                                                                ).astype(np.float32)


# ---- the rewrite ----------------------------------------------------------------------------------------------------


def _ref(name: str, producer: str, shape: list[int], dtype: str, idx: int = 0) -> dict:
    return {"name": name, "shape": list(shape), "dtype": dtype, "producer_node": producer, "producer_output_idx": idx}


def _tensor(name: str, shape: list[int], dtype: str) -> dict:
    return {"name": name, "shape": list(shape), "dtype": dtype}


def _qattrs(q: QParams) -> dict:
    return {"scale": q.scale, "zero_point": q.zero_point, "quant_min": q.qmin, "quant_max": q.qmax, "dtype": q.dtype}


def apply(ir: Mapping[str, Any], weights: Mapping[str, np.ndarray], p: Plan, qparams: Mapping[str, QParams],
          layers: Mapping[str, LayerWeights] | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The quantized IR and its weights (the float weights that are still read, the int8 weights, their scales and
    zero points, folded biases). `qparams` has an entry for every tensor of the plan; `layers` (node name -> its
    int8 weight and corrected bias, `adjust.py`) replaces rounding to nearest where it has the node."""
    missing = [t for t in p.tensors if t not in qparams]
    if missing:
        raise NPUCompileError(f"no quantization parameters for {missing[:5]}")
    ix = Index(ir)
    out = copy.deepcopy(dict(ir))
    mapping: dict[str, str] = dict(out.get("weight_name_mapping") or {})
    meta = {w["name"]: w for w in out.get("weights") or []}
    new_weights: dict[str, np.ndarray] = {}
    quantized = set(p.tensors)
    qname = {t: f"{t}_quantize" for t in p.tensors}
    nodes: list[dict] = []
    # a folded BatchNorm's readers read its conv, which now produces the BatchNorm's tensor
    producer_of = {bn["name"]: conv for conv, bn in p.bn.items()}

    def add_quantize(t: str, src: dict) -> None:
        q = qparams[t]
        nodes.append({"name": qname[t], "op_type": QUANTIZE, "attrs": _qattrs(q),
                      "inputs": [src], "outputs": [_tensor(qname[t], src["shape"], q.dtype)]})

    def dequantized(t: str, shape: list[int], reader: str, name: str | None = None) -> dict:
        q = qparams[t]
        node_name = f"{t}_dequantize_{reader}"
        tensor = name or node_name
        nodes.append({"name": node_name, "op_type": DEQUANTIZE, "attrs": _qattrs(q),
                      "inputs": [_ref(qname[t], qname[t], shape, q.dtype)],
                      "outputs": [_tensor(tensor, shape, "float32")]})
        return _ref(tensor, node_name, shape, "float32")

    for t in ir["graph_inputs"]:
        if t["name"] in quantized:
            add_quantize(t["name"], _ref(t["name"], t["name"], t["shape"], str(t["dtype"])))
    dropped = {bn["name"] for bn in p.bn.values()}
    for n in out["nodes"]:
        if n["name"] in dropped:
            continue
        n = copy.deepcopy(n)
        ins = []
        for ref in n.get("inputs", []):
            if ref.get("producer_node") is not None:
                t = ix.tensor_of(ref)
                if t in quantized and (n["name"] in p.integer_readers or t in p.produced):
                    ref = dequantized(t, ref["shape"], n["name"])
                elif t in quantized and t not in ix.inputs:  # a float op reads the float value
                    ref = {**ref, "name": f"{t}_float"}
                elif ref["producer_node"] in producer_of:
                    ref = {**ref, "producer_node": producer_of[ref["producer_node"]]}
            ins.append(ref)
        n["inputs"] = ins
        if n["name"] in p.weights:
            _quantize_node_weights(n, p, weights, mapping, meta, new_weights, nodes, (layers or {}).get(n["name"]))
        nodes.append(n)
        for i, t in enumerate(n.get("outputs", [])):
            if t["name"] in quantized:  # the float value is renamed: every reader reads a dequantize of it
                name = t["name"]
                t["name"] = f"{name}_float"
                add_quantize(name, _ref(t["name"], n["name"], t["shape"], t["dtype"], i))
    for t in ix.outputs:
        if t in quantized:
            shape = next(o["shape"] for o in ir["graph_outputs"] if o["name"] == t)
            dequantized(t, shape, "output", name=t)
    out["nodes"] = nodes
    used = {r["name"] for n in nodes for r in n.get("inputs", []) if r.get("producer_node") is None}
    out["weight_name_mapping"] = {ph: k for ph, k in mapping.items() if ph in used}
    keys = set(out["weight_name_mapping"].values())
    out["weights"] = [m for k, m in meta.items() if k in keys]
    result = {k: np.asarray(weights[k]) for k in keys if k not in new_weights}
    result.update(new_weights)
    return out, result


def layer_weight(n: Mapping[str, Any], p: Plan, weights: Mapping[str, np.ndarray], mapping: Mapping[str, str]
                 ) -> tuple[np.ndarray, np.ndarray | None]:
    """A conv's or linear's float weight and bias as its integer kernel will compute with them: a folded
    BatchNorm's scale and shift applied (float32). The bias is None where the node has none."""
    ph = p.weights[n["name"]]
    w = np.asarray(weights[mapping.get(ph, ph)], dtype=np.float32)
    bias_ref = n["inputs"][2] if len(n["inputs"]) > 2 else None
    b = None if bias_ref is None else np.asarray(weights[mapping.get(bias_ref["name"], bias_ref["name"])], np.float32)
    if n["name"] in p.bn:
        return fold_batchnorm(w, b, p.bn[n["name"]], weights, mapping)
    return w, b


def _quantize_node_weights(n: dict, p: Plan, weights: Mapping[str, np.ndarray], mapping: dict[str, str],
                           meta: dict[str, dict], new_weights: dict[str, np.ndarray], nodes: list[dict],
                           layer: LayerWeights | None) -> None:
    """Replace a conv's or linear's float weight (and, with a folded BatchNorm or a corrected bias, its bias) by an
    int8 weight read through dequantize_per_channel."""
    ph = p.weights[n["name"]]
    key = mapping.get(ph, ph)
    w, b = layer_weight(n, p, weights, mapping)
    stem = key
    if n["name"] in p.bn:
        stem = f"{key}.bn_folded"
        n["outputs"] = copy.deepcopy(p.bn[n["name"]]["outputs"])  # the conv now produces what the BatchNorm did
    corrected = layer is not None and layer.bias is not None
    if corrected:
        b = layer.bias
    if b is not None and (n["name"] in p.bn or corrected):
        what = "bias_corrected" if corrected else "bn_folded"
        bkey, bph = f"{key}.{what}.bias", f"{ph}_{what}_bias"
        new_weights[bkey] = np.asarray(b, np.float32)
        mapping[bph] = bkey
        meta[bkey] = _tensor(bkey, [w.shape[0]], "float32")
        ref = {"name": bph, "shape": [w.shape[0]], "dtype": "float32"}
        n["inputs"] = n["inputs"][:2] + [ref] + n["inputs"][3:]
    q, scales = (layer.codes, layer.scales) if layer is not None else quantize_weight(w)
    parts = {"int8": (q, "int8", list(q.shape)), "scale": (scales, "float32", [q.shape[0]]),
             "zero_point": (np.zeros(q.shape[0], np.int64), "int64", [q.shape[0]])}
    refs = []
    for suffix, (array, dtype, shape) in parts.items():
        k, name = f"{stem}.{suffix}", f"{ph}_{suffix}"
        new_weights[k] = array
        mapping[name] = k
        meta[k] = _tensor(k, shape, dtype)
        refs.append({"name": name, "shape": shape, "dtype": dtype})
    dq = f"{n['name']}_weight_dequantize"
    nodes.append({"name": dq, "op_type": DEQUANTIZE_CHANNEL, "inputs": refs,
                  "attrs": {"axis": 0, "quant_min": WEIGHT_RANGE[0], "quant_max": WEIGHT_RANGE[1], "dtype": "int8"},
                  "outputs": [_tensor(dq, list(q.shape), "float32")]})
    n["inputs"][1] = _ref(dq, dq, list(q.shape), "float32")
