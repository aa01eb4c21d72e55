"""Weight-only quantization for decoding (`compile(..., weights_dtype="int8" | "int4")`): every linear whose weight is
a checkpoint tensor [N, K] becomes `npu.wlinear` (kernel `wgemm`), its weight made at load time from the float
checkpoint by the recipe `wo_quantize`: int8 per output channel (symmetric, [-127, 127]) or int4 group-wise along K
(groups of 128, asymmetric: a scale and a zero point per group, min-max, as AWQ and GPTQ quantize), the codes packed
two a byte. Activations, the KV cache and every other op keep their dtype (bf16 for a bf16 model): W8A16, W4A16.
A tied LM head is quantized too (the embedding it shares its tensor with reads the float one).

The LM head (a linear whose result is a graph output: the logits) may take another format, `head_dtype`: int8 or
the model's own ("float"), as AWQ, GPTQ and TensorRT-LLM's int4 recipes keep it (fp16) and llama.cpp's 4-bit types
(6-bit): its rows are the logits, where an int4 row's error is a fixed bias of that token's logit at every step."""

from __future__ import annotations

from ..dtypes import is_float
from ..ir.graph import Graph, Node, TensorType, Value
from ..recipes import Recipe

WEIGHTS_DTYPES = {"int8": 8, "int4": 4}
HEAD_DTYPES = (*WEIGHTS_DTYPES, "float")
DEFAULT_GROUP = 128


def _sources(recipe: Recipe | None, key: str) -> tuple[dict[str, str], dict]:
    """A wo_quantize recipe's sources and extra parameters: the checkpoint tensor `key`, or where the weight is the
    concatenation of linears that read one input (concat_linears: q/k/v, gate/up) its parts in order ("weight",
    "weight1", ...) and their rows. Each output channel is quantized on its own (int8 per channel, int4 in groups
    along K), so the parts' codes concatenated are the concatenation's codes."""
    if recipe is None or recipe.kind != "concat" or int(recipe.params["axis"]) != 0:
        return {"weight": key}, {}
    keys = [recipe.sources[str(i)] for i in range(len(recipe.params["shapes"]))]
    return ({("weight" if i == 0 else f"weight{i}"): k for i, k in enumerate(keys)},
            {"rows": [int(shape[0]) for shape in recipe.params["shapes"]]})


def quantize_weights_only(graph: Graph, recipes: dict[str, Recipe], weights_dtype: str,
                          group: int = DEFAULT_GROUP, head_dtype: str | None = None) -> int:
    """Rewrite the graph's linears (see the module's docstring), concatenated ones included; returns how many. A
    linear whose K is not a
    multiple of the group (int4) keeps its float weight; the LM head takes `head_dtype` (default: `weights_dtype`)."""
    outputs = {v.name for v in graph.outputs}
    used = set(graph.weight_keys.values())
    shapes = graph.meta.get("ir_weights", {})
    count = 0
    for i, node in enumerate(graph.nodes):
        if node.op != "linear.default" or len(node.inputs) < 2:
            continue
        fmt = (head_dtype or weights_dtype) if any(o.name in outputs for o in node.outputs) else weights_dtype
        if fmt not in WEIGHTS_DTYPES:
            continue
        bits = WEIGHTS_DTYPES[fmt]
        w = node.inputs[1]
        if w.kind != "weight" or len(w.shape) != 2 or not is_float(w.dtype):
            continue
        n, k = w.shape
        if bits == 4 and (k % group or group % 2):
            continue
        key = graph.weight_keys[w.name]
        sources, params = _sources(recipes.get(w.name), key)
        # a tied LM head: the checkpoint may hold only the embedding, an unused tensor of the same shape
        fallback = [] if "rows" in params else [c for c, shape in shapes.items()
                                                 if c not in used and tuple(shape) == w.shape and c != key]
        params |= {"bits": bits, "group": group if bits == 4 else 0}
        parts = [("qweight", (n, k) if bits == 8 else (n, k // 2), "int8" if bits == 8 else "uint8"),
                 ("scale", (n,) if bits == 8 else (n, k // group), "float32")]
        if bits == 4:
            parts.append(("zero", (n, k // group), "uint8"))
        made = []
        for part, shape, dtype in parts:
            v = Value(f"{node.name}.{part}", TensorType(shape, dtype), "weight")
            graph.weights[v.name] = v
            graph.weight_keys[v.name] = f"{fmt}_{part}({key})"
            recipes[v.name] = Recipe("wo_quantize", sources, {**params, "part": part}, fallback)
            made.append(v)
        new = Node(node.name, "npu.wlinear", [node.inputs[0], *made, *node.inputs[2:]], node.outputs,
                   {"bits": bits, "group": params["group"], "has_bias": len(node.inputs) > 2}, list(node.origin))
        for o in new.outputs:
            o.producer = new
        graph.nodes[i] = new
        count += 1
    graph.remove_dead()
    return count
