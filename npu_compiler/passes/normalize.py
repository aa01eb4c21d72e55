"""Normalisation: drop no-ops, make in-place ops out-of-place, resolve getitem."""

from __future__ import annotations

from ..errors import UnsupportedOpError
from ..ir.graph import Graph, Node, Value

# Ops that return their input unchanged (in an inference graph).
_IDENTITY = {"alias.default", "detach.default", "detach_.default", "contiguous.default", "lift_fresh_copy.default",
             "getitem"}
_CASTS = {"to.dtype", "to.device", "to.dtype_layout", "_to_copy.default", "type_as.default", "clone.default"}
_METADATA = {"_assert_tensor_metadata.default"}
# View ops that are identities where their result has the input's shape (HF's attention reshapes its output to the
# shape it has before the transpose that puts the heads back: kept, it would hide that transpose from the attention
# lowering, which then writes [b, h, t, d] and a copy follows)
_SAME_SHAPE_VIEWS = {"reshape.default", "view.default", "_unsafe_view.default", "expand.default"}
# Ops that compute nothing in an inference graph (eval-mode dropout included): normalisation removes them, and on the
# partition path they follow their producer instead of forcing a partition split.
STRUCTURAL_OPS = frozenset(_IDENTITY | _METADATA | {"dropout.default"})


def _is_noop(node: Node) -> bool:
    if node.op in _METADATA or node.op in _IDENTITY:
        return True
    if node.op == "dropout.default":
        if node.attrs.get("train"):
            raise UnsupportedOpError(node.name, "aten.dropout.default", "any",
                                     "dropout with train=True is random; export the model in eval mode")
        return True
    if (node.op in _CASTS or node.op in _SAME_SHAPE_VIEWS) and node.outputs and node.inputs:
        return node.inputs[0].type == node.outputs[0].type
    return False


def remove_noops(graph: Graph) -> int:
    kept: list = []
    new_for: dict[int, Value] = {}  # a no-op's output -> what it passes through (chains followed: graph order)
    for node in graph.nodes:
        if _is_noop(node):
            if node.outputs:
                src = node.inputs[0]
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
        base, _, overload = node.op.partition(".")
        if not base.endswith("_") or base.startswith("_"):
            continue
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
