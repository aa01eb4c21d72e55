"""The decomposition table and the rewriter that applies an entry.

An entry rewrites one node of a composite op into nodes of ops the compiler lowers (or that have entries of their
own, applied in turn), the way torch's decomposition table works on FX graphs. `@decomposes(op, emits=...)`
registers it; `emits` names every op it may produce, so that op support answers for a composite op from the ops it
becomes (`op_support.unsupported_reason`) and the rewriter can refuse an entry that produces anything else.

Every node a rewrite makes is typed by its op's shape and dtype rule (`ir/infer`), which also checks its operands:
a rewrite that builds an invalid node, or whose results differ in shape or dtype from the node it replaces, is a
bug reported as an `InternalError` naming the node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InternalError, IRFormatError, UnsupportedOpError
from ..ir.attrs import check_attrs
from ..ir.graph import Graph, Node, TensorType, Value
from ..ir.infer.core import InferError, _rule
from ..ir.schema import lookup

Rewrite = Callable[["Rewriter", Node], "Value | list[Value]"]
Refuses = Callable[[Mapping[str, Any]], "str | None"]


@dataclass(frozen=True)
class Decomposition:
    op: str
    rewrite: Rewrite
    emits: tuple[str, ...]  # every op the rewrite may produce
    refuses: Refuses | None = None  # attributes the rewrite cannot take (why), known from the node alone

    def refusal(self, attrs: Mapping[str, Any]) -> str | None:
        return self.refuses(attrs) if self.refuses is not None else None


DECOMPOSITIONS: dict[str, Decomposition] = {}


def decomposes(*ops: str, emits: tuple[str, ...], refuses: Refuses | None = None) -> Callable[[Rewrite], Rewrite]:
    """Register `fn(rewriter, node)` as the decomposition of `ops`; it returns the values that replace the node's
    outputs, in order, or None to keep the node as it is (an op the compiler also lowers, decomposed only for some
    attributes: batch norm with batch statistics)."""

    def register(fn: Rewrite) -> Rewrite:
        for op in ops:
            if op in DECOMPOSITIONS:
                raise RuntimeError(f"two decompositions of {op}")  # a bug in the table, at import
            DECOMPOSITIONS[op] = Decomposition(op, fn, tuple(emits), refuses)
        return fn

    return register


class Rewriter:
    """Builds the nodes that replace one node. `op(...)` adds a node (its attributes checked and defaulted by the
    op's schema, its outputs typed by the op's rule) and returns its output, or its outputs for a multi-output op;
    an op with a decomposition of its own is decomposed in turn. Without an `entry` (a pass that adds nodes of its
    own: functionalisation's scatters) any op may be made."""

    def __init__(self, graph: Graph, node: Node, entry: Decomposition | None = None) -> None:
        self.graph, self.node = graph, node
        self.nodes: list[Node] = []
        self._entries = [entry]
        self._count = 0

    # ---- building ---------------------------------------------------------------------------------------------
    def op(self, op: str, *inputs: Value, **attrs: Any) -> Value:
        outs = self.ops(op, *inputs, **attrs)
        if len(outs) != 1:
            raise self._bug(f"aten.{op} gives {len(outs)} outputs where one was expected")
        return outs[0]

    def ops(self, op: str, *inputs: Value, **attrs: Any) -> list[Value]:
        entry = self._entries[-1]
        if entry is not None and op not in entry.emits:
            raise self._bug(f"the decomposition of aten.{entry.op} made aten.{op}, which it does not declare")
        node = self._make(op, list(inputs), attrs)
        inner = DECOMPOSITIONS.get(op)
        if inner is None:
            self.nodes.append(node)
            return node.outputs
        why = inner.refusal(node.attrs)
        if why:
            raise self._bug(f"made aten.{op} with attributes its decomposition refuses ({why})")
        self._entries.append(inner)
        try:
            got = expand(self, inner, node)
        finally:
            self._entries.pop()
        if got is None:  # kept as it is
            self.nodes.append(node)
            return node.outputs
        return got

    def constant(self, data: Any, dtype: str, shape: tuple[int, ...]) -> Value:
        """A constant tensor embedded in the program (nested lists of `shape`, or a scalar for a 0-d tensor)."""
        name = self._name("const")
        v = Value(name, TensorType(tuple(shape), dtype), "constant", data=data)
        self.graph.constants[name] = v
        return v

    # ---- internals --------------------------------------------------------------------------------------------
    def _name(self, what: str) -> str:
        self._count += 1
        return f"{self.node.name}~{what}{self._count}"

    def _make(self, op: str, inputs: list[Value], attrs: dict[str, Any]) -> Node:
        schema = lookup(op)
        if schema is None:
            raise self._bug(f"made aten.{op}, which has no schema")
        name = self._name(op.partition(".")[0].strip("_"))
        try:
            checked = check_attrs(schema, dict(attrs), len(inputs), f"node '{name}' (aten.{op})")
        except IRFormatError as e:
            raise self._bug(str(e)) from e
        node = Node(name, op, inputs, [], checked, origin=list(self.node.origin))
        rule = _rule(op)
        if rule is None:
            raise self._bug(f"made aten.{op}, which has no shape rule")
        try:
            types = rule(node)
        except InferError as e:
            raise self._bug(f"made aten.{op} of {', '.join(str(v.type) for v in inputs)} with {attrs}: {e}") from e
        node.outputs = [Value(name if len(types) == 1 else f"{name}_{i}", t, "node", producer=node, index=i)
                        for i, t in enumerate(types)]
        return node

    def _bug(self, what: str) -> InternalError:
        doing = "decomposing" if self._entries[0] is not None else "rewriting"
        return InternalError(f"{doing} node '{self.node.name}' (aten.{self.node.op})", what)


def expand(rw: Rewriter, entry: Decomposition, node: Node) -> list[Value] | None:
    """Run `entry` on `node` into `rw`, and check that what replaces each output has its shape and dtype (None: the
    entry keeps the node)."""
    saved, rw.node = rw.node, node
    try:
        got = entry.rewrite(rw, node)
    finally:
        rw.node = saved
    if got is None:
        return None
    results = [got] if isinstance(got, Value) else list(got)
    if len(results) != len(node.outputs) or any(r.type != o.type for r, o in zip(results, node.outputs)):
        raise rw._bug(f"the rewrite gives {', '.join(str(r.type) for r in results)} for "
                      f"{', '.join(str(o.type) for o in node.outputs)}")
    return results


def decompose(graph: Graph) -> int:
    """Replace every node of an op with a decomposition by the nodes it decomposes into (applied until only ops
    without one are left). Returns how many nodes were decomposed."""
    kept: list[Node] = []
    new_for: dict[int, Value] = {}
    count = 0
    for node in graph.nodes:
        if new_for:
            node.inputs = [new_for.get(id(v), v) for v in node.inputs]
        entry = DECOMPOSITIONS.get(node.op)
        if entry is None:
            kept.append(node)
            continue
        why = entry.refusal(node.attrs)
        if why:
            raise UnsupportedOpError(node.name, f"aten.{node.op}", "any", why)
        rw = Rewriter(graph, node, entry)
        results = expand(rw, entry, node)
        if results is None:
            kept.append(node)
            continue
        kept.extend(rw.nodes)
        for old, new in zip(node.outputs, results):
            new_for[id(old)] = new
        count += 1
    graph.nodes = kept
    if new_for:
        graph.outputs = [new_for.get(id(v), v) for v in graph.outputs]
    return count
