"""Which graph outputs are class-like: their last axis holds classes (a classifier's [batch, classes] logits, a
language model's [batch, tokens, vocab] logits or probabilities), so that top-1/top-5 agreement along it means
something. `verify` reports top-k for those only: an argmax along the last axis of an NCHW map (its width) or of a
1-D score vector (all of its values) answers no question about the model.

The rule, from the IR: an output of rank 2 or 3 whose last axis is the output features of a linear layer (linear,
addmm, mm, matmul, bmm, baddbmm), possibly followed by ops that keep that axis as it is: a softmax or log-softmax
along it, elementwise arithmetic with a bias or a scale, casts, copies, and views or slices that leave it alone.
"""

from __future__ import annotations

from .ir.graph import Graph, Value

__all__ = ["class_outputs", "MIN_CLASSES"]

MIN_CLASSES = 2
# ops whose last output axis is a linear layer's output features
_LINEAR = frozenset({"linear.default", "addmm.default", "mm.default", "matmul.default", "bmm.default",
                     "baddbmm.default"})
# ops that keep the last axis of their first input as it is (each index along it stays that index)
_KEEPS_LAST = frozenset({"add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor", "add.Scalar", "sub.Scalar",
                         "mul.Scalar", "div.Scalar", "to.dtype", "_to_copy.default", "clone.default",
                         "contiguous.default", "alias.default", "detach.default", "view.default", "reshape.default",
                         "_unsafe_view.default", "squeeze.dim", "squeeze.dims", "unsqueeze.default",
                         "flatten.using_ints", "getitem", "type_as.default", "float.default"})
_ALONG_LAST = frozenset({"softmax.int", "_softmax.default", "log_softmax.int", "_log_softmax.default"})
_NOT_LAST = frozenset({"slice.Tensor", "select.int"})  # keep the last axis when they cut another
MAX_STEPS = 64


def class_outputs(graph: Graph) -> list[str]:
    """The names of the graph outputs that are class-like (see the module's docstring)."""
    return [v.name for v in graph.outputs if _is_class_like(v)]


def _is_class_like(v: Value) -> bool:
    if v.type.rank not in (2, 3) or v.type.shape[-1] < MIN_CLASSES or not v.type.dtype.startswith(("float", "bf")):
        return False
    classes = v.type.shape[-1]
    for _ in range(MAX_STEPS):
        node = v.producer
        if node is None:
            return False
        if node.op in _LINEAR:
            return True
        src = next((x for x in node.inputs if x.type.rank >= 1 and x.type.shape[-1] == classes), None)
        if src is None or not _keeps_last_axis(node.op, node.attrs, v, src):
            return False
        v = src
    return False


def _keeps_last_axis(op: str, attrs: dict, out: Value, src: Value) -> bool:
    if op in _KEEPS_LAST:
        return True
    rank = src.type.rank
    dim = attrs.get("dim")
    if not isinstance(dim, int) or isinstance(dim, bool) or rank == 0:
        return False
    last = dim % rank == rank - 1
    if op in _ALONG_LAST:
        return last
    if op in _NOT_LAST:
        return not last
    return False
