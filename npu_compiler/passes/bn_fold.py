"""Fold eval-mode BatchNorm into the preceding conv: the conv gets a new weight and bias, made at load time
by recipes from the checkpoint's conv weight (and bias) and the BN statistics."""

from __future__ import annotations

from ..ir.graph import Graph, Value
from ..program import Recipe

_BN = {"batch_norm.default", "_native_batch_norm_legit_no_training.default"}


def fold_batchnorm(graph: Graph, recipes: dict[str, Recipe]) -> int:
    users = graph.users()
    outputs = {id(v) for v in graph.outputs}
    folded = 0
    by_output = {id(o): n for n in graph.nodes for o in n.outputs}
    drop: set[int] = set()
    for bn in graph.nodes:
        if bn.op not in _BN or bn.attrs.get("training"):
            continue
        x = bn.inputs[0]
        conv = by_output.get(id(x))
        if conv is None or conv.op != "conv2d.default" or len(users.get(id(x), [])) != 1 or id(x) in outputs:
            continue
        if len(bn.inputs) != 5 or not all(v.kind == "weight" for v in bn.inputs[1:]):
            continue  # affine-less BN (fewer inputs) stays an elementwise kernel
        w = conv.inputs[1]
        if w.kind != "weight":
            continue
        gamma, beta, mean, var = (graph.weight_keys[v.name] for v in bn.inputs[1:])
        conv_b = conv.inputs[2] if len(conv.inputs) > 2 else None
        if conv_b is not None and conv_b.kind != "weight":
            continue
        eps = float(bn.attrs["eps"])
        src = {"weight": graph.weight_keys[w.name], "gamma": gamma, "beta": beta, "mean": mean, "var": var}
        if conv_b is not None:
            src["bias"] = graph.weight_keys[conv_b.name]
        fw = Value(f"{conv.name}.bn_folded_weight", w.type, "weight")
        # The bias exists even when the conv had none: the folded bias is beta - mean * gamma / sqrt(var + eps).
        fb = Value(f"{conv.name}.bn_folded_bias", type(w.type)((w.shape[0],), w.dtype), "weight")
        recipes[fw.name] = Recipe("bn_fold_weight", src, {"eps": eps})
        recipes[fb.name] = Recipe("bn_fold_bias", src, {"eps": eps})
        graph.weights[fw.name], graph.weights[fb.name] = fw, fb
        graph.weight_keys[fw.name] = f"bn_fold({src['weight']}, {bn.name})"
        graph.weight_keys[fb.name] = f"bn_fold_bias({bn.name})"
        conv.inputs = [conv.inputs[0], fw, fb]
        conv.origin = conv.origin + bn.origin
        graph.replace_uses(bn.outputs[0], conv.outputs[0])
        # The conv's output now carries the BN's (identical) type; keep the conv's Value.
        drop.add(id(bn))
        folded += 1
    graph.nodes = [n for n in graph.nodes if id(n) not in drop]
    graph.remove_dead()
    return folded


