"""Dead code: nodes whose outputs no node and no graph output reads, removed before op support is asked and before
lowering, whatever their op. A model may compute what it never uses (transformers' wav2vec2 draws `torch.rand([])`
for layer drop even in eval mode and reads it only in training): such a node must not make a graph fall back or be
refused. A node whose op has an effect beyond its outputs stays: an in-place op (its input changes), one marked
`_side_effect`, one without outputs (an assertion: the no-op pass judges those), and one whose op the compiler does
not know (nothing says what it does: refused, or run by torch_ir, as a live one)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

from ..ir.graph import Graph
from ..ir.schema import lookup, short_op

# ATen's random ops (and their in-place and `_like` forms): what op support and the coverage report say of one
RANDOM_OPS = frozenset({"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like",
                        "bernoulli", "normal", "uniform", "multinomial", "poisson", "exponential", "geometric",
                        "cauchy", "log_normal", "random"})
RANDOM_REASON = ("random: no two runs agree, and nothing in an inference graph draws numbers (a random op whose "
                 "result nothing reads is removed as dead code)")


def is_random(op: str) -> bool:
    """An ATen random op, by its short name (`rand.default`, `bernoulli_.float`, ...)."""
    base = op.partition(".")[0]
    return base in RANDOM_OPS or (base.endswith("_") and base[:-1] in RANDOM_OPS)


def random_reason(op: str) -> str | None:
    """Why a random op cannot run (None for any other op): op support and the lowering say the same."""
    return f"aten.{op} is {RANDOM_REASON}" if is_random(op) else None


def has_effect(op: str, attrs: Mapping[str, Any], n_outputs: int) -> bool:
    """Whether a node must stay although nothing reads its outputs."""
    if op == "getitem":
        return False
    base, _, overload = op.partition(".")
    return (n_outputs == 0 or bool(attrs.get("_side_effect")) or lookup(op) is None or overload == "out"
            or (base.endswith("_") and not base.startswith("_")))


def unread_nodes(nodes: Sequence[tuple[bool, Sequence[Hashable], Sequence[Hashable]]],
                 outputs: Iterable[Hashable]) -> set[int]:
    """The indices of the dead nodes, given each node as (has an effect, what it reads, what it writes) in
    topological order and what the graph returns: a node is live when it has an effect or a live node or the graph
    reads one of its outputs."""
    read = set(outputs)
    dead = set()
    for i in range(len(nodes) - 1, -1, -1):
        effect, ins, outs = nodes[i]
        if effect or any(o in read for o in outs):
            read.update(ins)
        else:
            dead.add(i)
    return dead


def remove_unread(graph: Graph) -> int:
    """Drop the dead nodes of `graph` (and the weights and constants only they read). Returns how many."""
    dead = unread_nodes([(has_effect(n.op, n.attrs, len(n.outputs)), [id(v) for v in n.inputs],
                          [id(v) for v in n.outputs]) for n in graph.nodes], [id(v) for v in graph.outputs])
    if not dead:
        return 0
    graph.keep_nodes([n for i, n in enumerate(graph.nodes) if i not in dead])
    return len(dead)


def remove_unread_nodes(data: dict[str, Any]) -> list[str]:
    """Drop the dead nodes of an IR dict (checked by `read_ir`) in place; returns their names, in graph order."""
    nodes = data["nodes"]
    dead = unread_nodes([(has_effect(short_op(str(nd["op_type"])), nd.get("attrs") or {}, len(nd["outputs"])),
                          [t["name"] for t in nd["inputs"]], [t["name"] for t in nd["outputs"]]) for nd in nodes],
                        [t["name"] for t in data["graph_outputs"]])
    data["nodes"] = [nd for i, nd in enumerate(nodes) if i not in dead]
    return [nd["name"] for i, nd in enumerate(nodes) if i in dead]
