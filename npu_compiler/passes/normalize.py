"""Normalisation: drop no-ops, make in-place ops out-of-place, resolve getitem."""

from __future__ import annotations

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


def remove_noops(graph: Graph) -> int:
    kept: list = []
    new_for: dict[int, Value] = {}  # a no-op's output -> what it passes through (chains followed: graph order)
    mutated = {id(n.inputs[0]) for n in graph.nodes if n.inputs and _is_inplace(n.op)}
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


def inplace_to_outofplace(graph: Graph) -> int:
    """`relu_(x)` -> `relu(x)`; later readers of `x` (which would see the mutation) read the result instead."""
    count = 0
    for i, node in enumerate(graph.nodes):
        if not _is_inplace(node.op):
            continue
        base, _, overload = node.op.partition(".")
        node.op = f"{base[:-1]}.{overload}"
        count += 1
        if not node.inputs or not node.outputs:
            continue
        mutated, result = node.inputs[0], node.outputs[0]
        for later in graph.nodes[i + 1:]:
            later.inputs = [result if v is mutated else v for v in later.inputs]
        graph.outputs = [result if v is mutated else v for v in graph.outputs]
    return count


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
