"""How a device weight is made from the checkpoint (`Recipe`: data in the artifact, carried out by the runtime at
load), and the weights the compiler derives from the checkpoint (concatenated projections, BatchNorm folded into a
conv): one graph value per distinct recipe, however many nodes read it.

A parameter can be read by several nodes (ALBERT runs one layer's weights in every layer; tied embeddings; an
unrolled recurrent layer reads its hidden weights at every step), so two rewrites can ask for the same derived
weight. Each is named by what it is made of; asking again for a name returns the value made the first time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import InternalError
from .ir.graph import Graph, TensorType, Value


@dataclass
class Recipe:
    """How a device weight is made from the checkpoint. kind: 'load' | 'concat' | 'bn_fold_weight' | 'bn_fold_bias'
    | 'rope_inv_freq'. `sources` maps a role to a state-dict key; `fallback_keys` are tried in order when the key is
    absent (a tied lm_head read from the embedding)."""

    kind: str
    sources: dict[str, str] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    fallback_keys: list[str] = field(default_factory=list)




def derived_weight(graph: Graph, recipes: dict[str, Recipe], name: str, ttype: TensorType, recipe: Recipe) -> Value:
    """The weight `name` made by `recipe`: the existing value where an earlier rewrite made it, else a new one."""
    known = graph.weights.get(name)
    if known is not None:
        if known.type != ttype or recipes.get(name) != recipe:
            raise InternalError("deriving a weight", f"'{name}' is asked for as {ttype} by {recipe.kind} but was made "
                                                     f"as {known.type} by {getattr(recipes.get(name), 'kind', None)}")
        return known
    v = Value(name, ttype, "weight")
    graph.weights[name] = v
    graph.weight_keys[name] = name
    recipes[name] = recipe
    return v


def is_checkpoint_weight(graph: Graph, v: Value, recipes: dict[str, Recipe]) -> bool:
    """A weight loaded as the checkpoint holds it (not one the compiler derives): what a recipe may take as a
    source key."""
    return v.kind == "weight" and v.name not in recipes and v.name in graph.weight_keys
