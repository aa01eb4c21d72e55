"""Normalisation: drop no-ops, make in-place ops out-of-place, resolve getitem."""

from __future__ import annotations

from ..decompose.registry import Rewriter
from ..errors import UnsupportedOpError
from ..ir.graph import Graph, Node, Value

# Ops that return their input unchanged (in an inference graph).
_IDENTITY = {"alias.default", "detach.default", "detach_.default", "detach_copy.default", "contiguous.default",
             "lift_fresh_copy.default", "getitem"}
_CASTS = {"to.dtype", "to.device", "to.dtype_layout", "_to_copy.default", "type_as.default", "clone.default"}
# Assertions: about metadata (checked when the IR is read) or about values (a static program cannot stop on one:
# dropped, as torch.export's own inference runs drop them). The functional forms return their dependency token.
_METADATA = {"_assert_tensor_metadata.default", "_assert_async.default", "_assert_async.msg", "_assert_scalar.default"}
_TOKEN_PASSING = {"_functional_assert_async.msg", "_functional_assert_scalar.default"}
# Dropout in eval mode (train=False, or p=0) is the identity; every spelling, in place or not.
DROPOUTS = frozenset(f"{base}{inplace}.default" for base in ("dropout", "feature_dropout", "alpha_dropout",
                                                             "feature_alpha_dropout") for inplace in ("", "_"))
# View ops that are identities where their result has the input's shape (HF's attention reshapes its output to the
# shape it has before the transpose that puts the heads back: kept, it would hide that transpose from the attention
# lowering, which then writes [b, h, t, d] and a copy follows)
_SAME_SHAPE_VIEWS = {"reshape.default", "view.default", "_unsafe_view.default", "expand.default"}
# Ops that compute nothing in an inference graph (eval-mode dropout included): normalisation removes them, and on the
# partition path they follow their producer instead of forcing a partition split.
STRUCTURAL_OPS = frozenset(_IDENTITY | _METADATA | _TOKEN_PASSING | DROPOUTS)


def random_dropout(op: str, attrs: dict) -> str | None:
    """Why a dropout node is not the identity (None when it is: eval mode, or p = 0)."""
    if op in DROPOUTS and attrs.get("train") and float(attrs.get("p") or 0.0) > 0.0:
        return (f"{op.partition('.')[0]} with train=True and p={attrs.get('p')} is random: export the model in eval "
                "mode (F.dropout defaults to training=True: pass training=self.training)")
    return None


def _is_noop(node: Node) -> bool:
    if node.op in _METADATA or node.op in _IDENTITY or node.op in _TOKEN_PASSING:
        return True
    if node.op in DROPOUTS:
        why = random_dropout(node.op, node.attrs)
        if why:
            raise UnsupportedOpError(node.name, f"aten.{node.op}", "any", why)
        return True
    if (node.op in _CASTS or node.op in _SAME_SHAPE_VIEWS) and node.outputs and node.inputs:
        return node.inputs[0].type == node.outputs[0].type
    return False


# Ops that return a new tensor even when it equals their input: where the result is then changed in place
# (`y = x.clone(); y.fill_(v)`), the copy is what keeps the input unchanged, so it stays (as a clone).
_COPIES = {"clone.default", "_to_copy.default", "lift_fresh_copy.default", "detach_copy.default"}


def _is_inplace(op: str) -> bool:
    base = op.partition(".")[0]
    return base.endswith("_") and not base.startswith("_")


def _changed_in_place(graph: Graph) -> set[int]:
    """The values an in-place op changes: its input, and through views, every value that input is a view of."""
    producer = {id(o): n for n in graph.nodes for o in n.outputs}
    out: set[int] = set()
    for n in graph.nodes:
        if not (n.inputs and _is_inplace(n.op)):
            continue
        v = n.inputs[0]
        out.add(id(v))
        p = producer.get(id(v))
        while p is not None and p.inputs and (p.op in VIEWS or p.op in _IDENTITY or p.op in _SAME_SHAPE_VIEWS):
            v = p.inputs[0]
            out.add(id(v))
            p = producer.get(id(v))
    return out


def remove_noops(graph: Graph) -> int:
    kept: list = []
    new_for: dict[int, Value] = {}  # a no-op's output -> what it passes through (chains followed: graph order)
    mutated = _changed_in_place(graph)
    for node in graph.nodes:
        copy = node.op in _COPIES or (node.op.startswith("to.") and node.attrs.get("copy"))
        if copy and node.outputs and id(node.outputs[0]) in mutated and node.inputs[0].type == node.outputs[0].type:
            node.op, node.attrs = "clone.default", {"memory_format": None}
            kept.append(node)
            continue
        if _is_noop(node):
            if node.outputs and node.inputs:
                src = node.inputs[-1] if node.op in _TOKEN_PASSING else node.inputs[0]
                new_for[id(node.outputs[0])] = new_for.get(id(src), src)
            continue
        kept.append(node)
    removed = len(graph.nodes) - len(kept)
    graph.nodes = kept
    if new_for:
        graph.replace_all(new_for)
    return removed


# View ops (after `remove_noops`, which drops the identities): their result shares its input's elements, so an
# in-place op on it changes the input too. Functionalisation writes such a change back with the view's inverse.
_RESHAPES = frozenset({"view.default", "reshape.default", "_unsafe_view.default", "flatten.using_ints", "unflatten.int",
                       "unsqueeze.default", "squeeze.default", "squeeze.dim", "squeeze.dims"})
_SELF_INVERSE = frozenset({"transpose.int", "t.default", "numpy_T.default", "mT.default", "mH.default",
                           "adjoint.default", "matrix_H.default"})
_SPLITS = frozenset({"split.Tensor", "split_with_sizes.default", "chunk.default"})
VIEWS = _RESHAPES | _SELF_INVERSE | _SPLITS | {"permute.default", "select.int", "slice.Tensor", "diagonal.default",
                                                "unbind.int"}


def inplace_to_outofplace(graph: Graph) -> int:
    """`relu_(x)` -> `relu(x)`, and every later read of x, or of a view of x, reads the result. An in-place op on a
    view (`x[:, 0] = v` is `copy_` into a select of x; `x[1].relu_()`) writes its result back into the view's base
    through the view's inverse (select_scatter, slice_scatter, diagonal_scatter, the inverse reshape or
    permutation), as torch's functionalisation does; views of that base made before the write are made again from
    the new base where they are read after it."""
    return _Functionalizer(graph).run()


class _Functionalizer:
    """Walks the graph in order, keeping for each value that in-place ops change (a *base*, named by its original
    value) how many writes it has seen and the value that holds it now, and for each view its input and node."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.parent: dict[int, tuple[Value, Node, int]] = {}  # a view -> (its input, its node, its output index)
        self.base_of: dict[int, Value] = {}  # a view -> its base
        self.origin: dict[int, Value] = {}  # a value that holds a written base now -> that base
        self.made_at: dict[int, int] = {}  # a view -> how many writes its base had seen when it was made
        self.writes: dict[int, int] = {}  # a base -> how many writes it has seen
        self.latest: dict[int, Value] = {}  # a written base -> the value that holds it now
        self.remade: dict[tuple[int, int], Value] = {}  # (view, writes) -> the view made again from the new base
        self.out: list[Node] = []

    def run(self) -> int:
        count = 0
        for node in self.graph.nodes:
            mutated = node.inputs[0] if node.inputs and _is_inplace(node.op) else None
            node.inputs = [self.current(v) for v in node.inputs]
            self.out.append(node)
            if node.op in VIEWS and node.inputs:
                for k, o in enumerate(node.outputs):
                    self._register(o, node.inputs[0], node, k)
            if mutated is None:
                continue
            base, _, overload = node.op.partition(".")
            node.op = f"{base[:-1]}.{overload}"
            count += 1
            if node.outputs:
                self._write_back(node, mutated, node.outputs[0])
        self.graph.nodes = self.out
        self.graph.outputs = [self.current(v) for v in self.graph.outputs]
        return count

    def _root(self, v: Value) -> Value:
        b = self.base_of.get(id(v), v)
        return self.origin.get(id(b), b)

    def _register(self, view: Value, parent: Value, node: Node, k: int) -> None:
        base = self._root(parent)
        self.parent[id(view)] = (parent, node, k)
        self.base_of[id(view)] = base
        self.made_at[id(view)] = self.writes.get(id(base), 0)

    def current(self, v: Value) -> Value:
        """What a read of `v` reads now: a written base's latest value; a view of a base written since the view was
        made, made again from it."""
        if id(v) not in self.parent:
            return self.latest.get(id(self._root(v)), v)
        seen = self.writes.get(id(self.base_of[id(v)]), 0)
        if self.made_at[id(v)] == seen:
            return v
        hit = self.remade.get((id(v), seen))
        if hit is None:
            parent, node, k = self.parent[id(v)]
            p = self.current(parent)
            rw = Rewriter(self.graph, node)
            hit = rw.ops(node.op, p, *node.inputs[1:], **node.attrs)[k]
            self.out.extend(rw.nodes)
            self._register(hit, p, rw.nodes[-1], k)
            self.remade[(id(v), seen)] = hit
        return hit

    def _write_back(self, node: Node, mutated: Value, result: Value) -> None:
        """`result` is the new value of `mutated`: through its views up to their base, each view's input becomes its
        inverse applied to the new value. The result is itself a view where `mutated` is one (an in-place op returns
        its input)."""
        rw = Rewriter(self.graph, node)
        cur, new = mutated, result
        while id(cur) in self.parent:
            parent, view, k = self.parent[id(cur)]
            new = _unview(rw, view, k, self.current(parent), new)
            cur = parent
        self.out.extend(rw.nodes)
        base = self._root(cur)
        self.writes[id(base)] = self.writes.get(id(base), 0) + 1
        self.latest[id(base)] = new
        self.origin[id(new)] = base
        if id(mutated) in self.parent:
            parent, view, k = self.parent[id(mutated)]
            self._register(result, parent, view, k)
        else:
            self.origin[id(result)] = base


def _unview(rw: Rewriter, view: Node, k: int, parent: Value, new: Value) -> Value:
    """`parent` with the elements `view` (output k) selects replaced by `new`."""
    op, a = view.op, view.attrs
    if op in _RESHAPES:
        return rw.op("reshape.default", new, shape=list(parent.shape))
    if op in _SELF_INVERSE:
        return rw.op(op, new, **a)
    if op == "permute.default":
        dims = [d % max(len(parent.shape), 1) for d in a["dims"]]
        return rw.op("permute.default", new, dims=[dims.index(i) for i in range(len(dims))])
    if op == "select.int":
        return rw.op("select_scatter.default", parent, new, dim=a["dim"], index=a["index"])
    if op == "unbind.int":
        return rw.op("select_scatter.default", parent, new, dim=a["dim"], index=k)
    if op == "slice.Tensor":
        return rw.op("slice_scatter.default", parent, new, dim=a["dim"], start=a["start"], end=a["end"],
                     step=a["step"])
    if op == "diagonal.default":
        return rw.op("diagonal_scatter.default", parent, new, offset=a["offset"], dim1=a["dim1"], dim2=a["dim2"])
    # a split's k-th piece: the rows after the pieces before it
    d = a.get("dim", 0) % len(parent.shape)
    start = sum(o.shape[d] for o in view.outputs[:k])
    return rw.op("slice_scatter.default", parent, new, dim=d, start=start, end=start + new.shape[d], step=1)


def string_padding(node: Node, mode: str, kernel: list[int], dilation: list[int], stride: list[int]
                   ) -> list[tuple[int, int]]:
    """(before, after) per spatial dim of a conv's string padding, by ATen's rule: "valid" is none; "same" pads
    dilation * (kernel - 1) in all, the odd one at the end, and needs stride 1."""
    if mode == "valid":
        return [(0, 0)] * len(kernel)
    if mode != "same":
        raise UnsupportedOpError(node.name, f"aten.{node.op}", "any", f"padding {mode!r} (ATen knows 'same', 'valid')")
    if any(s != 1 for s in stride):
        raise UnsupportedOpError(node.name, f"aten.{node.op}", "any", f"padding 'same' with stride {stride}")
    return [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for k, d in zip(kernel, dilation)]


def canonicalize_conv_padding(graph: Graph) -> int:
    """A conv with padding "valid", or "same" that pads both sides alike, becomes the overload with numeric padding:
    BN folding and the conv epilogues then see an ordinary conv. The rest ("same" with an even kernel) lowers as
    its own op."""
    count = 0
    for node in graph.nodes:
        if node.op not in ("conv2d.padding", "conv1d.padding") or not isinstance(node.attrs.get("padding"), str):
            continue
        w = node.inputs[1]
        a = node.attrs
        pads = string_padding(node, a["padding"], list(w.shape[2:]), list(a["dilation"]), list(a["stride"]))
        if any(lo != hi for lo, hi in pads):
            continue
        node.op = node.op.replace(".padding", ".default")
        a["padding"] = [lo for lo, _ in pads]
        count += 1
    return count
