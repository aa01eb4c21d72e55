"""Small helpers for matching patterns on the graph."""

from __future__ import annotations

from ..ir.graph import Graph, Node, Value


class GraphIndex:
    """Producers and users of every value, kept current by the pattern passes as they rewrite."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.refresh()

    def refresh(self) -> None:
        self.producer: dict[int, Node] = {id(o): n for n in self.graph.nodes for o in n.outputs}
        self.users: dict[int, list[Node]] = self.graph.users()
        self.outputs = {id(v) for v in self.graph.outputs}

    def prod(self, v: Value, *ops: str) -> Node | None:
        n = self.producer.get(id(v))
        if n is None or (ops and n.op not in ops):
            return None
        return n

    def single_use(self, v: Value) -> bool:
        return len(self.users.get(id(v), [])) == 1 and id(v) not in self.outputs

    def replace(self, group: list[Node], new: Node, result_of: Node) -> None:
        """`replace_node_group`, keeping the index current by updating only what the rewrite touches (a refresh
        after every rewrite made the pattern passes quadratic in the graph's size)."""
        g = self.graph
        old, newv = result_of.outputs[0], new.outputs[0]
        replace_node_group(g, group, new, result_of, users=self.users.get(id(old), []))
        for u in self.users.pop(id(old), []):
            self.users.setdefault(id(newv), []).append(u)
        if id(old) in self.outputs:
            self.outputs.discard(id(old))
            self.outputs.add(id(newv))
        for n in group:
            for o in n.outputs:
                self.producer.pop(id(o), None)
            for v in n.inputs:
                lst = self.users.get(id(v))
                if lst:
                    lst[:] = [u for u in lst if u is not n]
        for o in new.outputs:
            self.producer[id(o)] = new
        for v in new.inputs:
            self.users.setdefault(id(v), []).append(new)

    def only_used_by(self, v: Value, nodes: list[Node]) -> bool:
        ids = {id(n) for n in nodes}
        return id(v) not in self.outputs and all(id(u) in ids for u in self.users.get(id(v), []))


def scalar_operand(n: Node, name: str = "other") -> float | None:
    v = n.attrs.get(name)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def other_input(n: Node, v: Value) -> Value | None:
    """For a binary node with two tensor inputs, the one that is not `v`."""
    if len(n.inputs) != 2:
        return None
    a, b = n.inputs
    if a is v:
        return b
    if b is v:
        return a
    return None


def replace_node_group(graph: Graph, group: list[Node], new: Node, result_of: Node,
                       users: list[Node] | None = None) -> None:
    """Put `new` where `result_of` (the sink of `group`) was; `new`'s output replaces `result_of`'s output, and
    `new` stands for the IR nodes of the whole group, in graph order. `users`: the nodes that read `result_of`'s
    output, when the caller knows them (else every node is looked at)."""
    # the group's positions by list.index (identity compares in C): a Python loop over every node per fused group
    # made the fusion passes quadratic. Every member is a node of the graph (the index only yields live nodes).
    nodes = graph.nodes
    drop = sorted({nodes.index(n) for n in group})
    sink = nodes.index(result_of)
    new.origin = [o for i in drop for o in nodes[i].origin]
    kept = nodes[:sink + 1] + [new] + nodes[sink + 1:]
    for i in reversed(drop):  # (positions after the sink moved one up for `new`)
        del kept[i + (i > sink)]
    graph.nodes = kept
    old, newv = result_of.outputs[0], new.outputs[0]
    if users is None:
        graph.replace_uses(old, newv)
    else:
        for n in users:
            n.inputs = [newv if v is old else v for v in n.inputs]
        graph.outputs = [newv if v is old else v for v in graph.outputs]
