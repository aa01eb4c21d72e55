"""Shape and dtype inference per ATen op: what each node must produce, given its operands and attributes, so that
an IR whose declared outputs disagree with what the op produces (a `linear` declared int64, an `add` whose broadcast
shape is wrong) is refused with a message naming the node, instead of being lowered on the IR's word.

One rule per op, registered with `@infers(op, ...)`. A rule gets the node (operands bound, attributes checked and
defaulted by the reader) and returns the output types; it raises `InferError` when the operands themselves are
invalid for the op (a dim outside the rank, shapes that do not broadcast). The rules follow ATen's own semantics
(type promotion of `c10::promoteTypes` with tensor/zero-dim/scalar priorities, the output size formulas of
convolution and pooling, the view and split rules); `tests/test_infer.py` checks them against PyTorch's meta
tensors, and fails for an op in `SUPPORTED_OPS` that has no rule. An op without a rule is not checked here (the
compiler does not fail on it; that test does).

The rules live by family: `core` (the registry, operands, promotion and shared helpers), `elementwise`,
`reductions`, `views`, `contractions`, `factories`, `quantized` and `recurrent`; importing the package registers them
all.
"""

from . import (  # noqa: F401  (registers their rules)
    contractions,
    elementwise,
    factories,
    quantized,
    recurrent,
    reductions,
    views,
)
from .core import RULES, InferError, broadcast, check_node, has_rule, infers, promote, register_aliases, result_type

register_aliases()

__all__ = ["RULES", "InferError", "broadcast", "check_node", "has_rule", "infers", "promote", "result_type"]
