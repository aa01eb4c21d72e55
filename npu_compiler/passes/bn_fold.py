"""Fold eval-mode BatchNorm into the preceding conv: the conv gets a new weight and bias, made at load time
by recipes from the checkpoint's conv weight (and bias) and the BN statistics."""

from __future__ import annotations

from ..ir.graph import Graph, TensorType
from ..recipes import Recipe, derived_weight, is_checkpoint_weight

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
        if len(bn.inputs) != 5 or not all(is_checkpoint_weight(graph, v, recipes) for v in bn.inputs[1:]):
            continue  # affine-less BN (fewer inputs) stays an elementwise kernel
        w = conv.inputs[1]
        if not is_checkpoint_weight(graph, w, recipes):
            continue
        gamma, beta, mean, var = (graph.weight_keys[v.name] for v in bn.inputs[1:])
        conv_b = conv.inputs[2] if len(conv.inputs) > 2 else None
        if conv_b is not None and not is_checkpoint_weight(graph, conv_b, recipes):
            continue
        eps = float(bn.attrs["eps"])
        src = {"weight": graph.weight_keys[w.name], "gamma": gamma, "beta": beta, "mean": mean, "var": var}
        if conv_b is not None:
            src["bias"] = graph.weight_keys[conv_b.name]
        # Named by their sources: a conv and BN pair applied twice (shared modules) folds into one weight.
        what = ",".join(f"{k}={v}" for k, v in src.items()) + f",eps={eps!r}"
        fw = derived_weight(graph, recipes, f"bn_fold_weight({what})", w.type, Recipe("bn_fold_weight", src,
                                                                                      {"eps": eps}))
        # The bias exists even when the conv had none: the folded bias is beta - mean * gamma / sqrt(var + eps).
        fb = derived_weight(graph, recipes, f"bn_fold_bias({what})", TensorType((w.shape[0],), w.dtype),
                            Recipe("bn_fold_bias", src, {"eps": eps}))
        conv.inputs = [conv.inputs[0], fw, fb]
        conv.origin = conv.origin + bn.origin
        graph.replace_uses(bn.outputs[0], conv.outputs[0])
        # The conv's output now carries the BN's (identical) type; keep the conv's Value.
        drop.add(id(bn))
        folded += 1
    graph.nodes = [n for n in graph.nodes if id(n) not in drop]
    graph.remove_dead()
    return folded


