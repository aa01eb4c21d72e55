"""The typed graph the compiler works on: `Graph` of `Node`s over `Value`s."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Graph.meta key: the name of a value that holds only some rows of the IR's value it stands for -> [dim, start, stop]
# (slice hoisting computes no others); per-node verify compares such a kernel with those rows of the reference
HOISTED_ROWS = "hoisted_rows"


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


@dataclass(eq=False)
class Value:
    """A tensor in the graph. kind: 'input' (graph input), 'weight' (a placeholder bound to a state-dict key),
    'node' (produced by a node), 'constant' (data embedded in the program)."""

    name: str
    type: TensorType
    kind: str
    producer: Node | None = None
    index: int = 0
    data: object = None  # constants only: a nested list or a scalar

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    def __repr__(self) -> str:
        return f"Value({self.name}: {self.type}, {self.kind})"


@dataclass(eq=False)
class Node:
    name: str
    op: str  # short ATen name: "add.Tensor", "conv2d.default", or a compiler-made op ("npu.conv_bias_act", ...)
    inputs: list[Value]
    outputs: list[Value]
    attrs: dict[str, object] = field(default_factory=dict)
    origin: list[str] = field(default_factory=list)  # names of the IR nodes this node stands for

    def __post_init__(self) -> None:
        if not self.origin:
            self.origin = [self.name]

    @property
    def output(self) -> Value:
        return self.outputs[0]

    def __repr__(self) -> str:
        return f"Node({self.name}: {self.op})"


@dataclass(eq=False)
class Graph:
    name: str
    inputs: list[Value]
    outputs: list[Value]
    weights: dict[str, Value]  # placeholder name -> value
    weight_keys: dict[str, str]  # placeholder name -> state-dict key
    nodes: list[Node]
    constants: dict[str, Value] = field(default_factory=dict)
    output_names: list[str] = field(default_factory=list)  # the IR's names of the graph outputs, in order
    meta: dict[str, object] = field(default_factory=dict)

    def users(self) -> dict[int, list[Node]]:
        """id(Value) -> nodes that read it."""
        out: dict[int, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                out.setdefault(id(v), []).append(n)
        return out

    def replace_uses(self, old: Value, new: Value) -> None:
        self.replace_all({id(old): new})

    def replace_all(self, new_for: dict[int, Value]) -> None:
        """Every read of a value whose id is a key of `new_for` reads the value it maps to instead: one pass over
        the graph for any number of replacements (a pass per replacement made the rewrites quadratic)."""
        get = new_for.get
        for n in self.nodes:
            ins = n.inputs
            for v in ins:
                if id(v) in new_for:
                    n.inputs = [get(id(x), x) for x in ins]
                    break
        self.outputs = [get(id(v), v) for v in self.outputs]

    def remove_dead(self) -> int:
        """Drop nodes none of whose outputs reach a graph output. Returns how many were dropped."""
        live: set[int] = {id(v) for v in self.outputs}
        kept: list[Node] = []
        for n in reversed(self.nodes):
            if any(id(o) in live for o in n.outputs) or n.attrs.get("_side_effect"):
                kept.append(n)
                live.update(id(v) for v in n.inputs)
        dropped = len(self.nodes) - len(kept)
        self.keep_nodes(list(reversed(kept)))
        return dropped

    def keep_nodes(self, nodes: list[Node]) -> None:
        """Keep only `nodes` (in order), and the weights and constants they or the outputs read."""
        self.nodes = nodes
        used = {id(v) for n in self.nodes for v in n.inputs} | {id(v) for v in self.outputs}
        self.weights = {k: v for k, v in self.weights.items() if id(v) in used}
        self.constants = {k: v for k, v in self.constants.items() if id(v) in used}
