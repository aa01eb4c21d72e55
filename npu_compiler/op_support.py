"""Op support per target: the ONE place that answers "can target T run this IR node?".

Derived from the lowering's registry (`lowering.registry`: the ops the compiler lowers and the library kernel kinds
each may emit) and the target's `library_kernels`, so that adding a lowering or a target kernel changes the answer
here without a second list to keep in sync. The partition path (`npu_compiler.partition`) and the CLI ask this
module; nothing else should hard-code op lists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .decompose import DECOMPOSITIONS
from .errors import NPUCompileError
from .ir.schema import short_op
from .lowering.lower import SUPPORTED_OPS
from .lowering.registry import KERNELS_OF
from .passes.dead_code import random_reason
from .passes.normalize import STRUCTURAL_OPS, random_dropout
from .targets.codegen import target_class

__all__ = [
    "STRUCTURAL_OPS", "is_op_supported", "supported_ops", "unsupported_reason", "is_structural", "SupportPredicate",
    "support_predicate",
]


def _canonical(op: str) -> str:
    """In-place overloads lower as their out-of-place form (passes/normalize.py: `relu_` -> `relu`)."""
    base, dot, overload = op.partition(".")
    if base.endswith("_") and not base.startswith("_"):
        return f"{base[:-1]}{dot}{overload}"
    return op


def is_structural(op_type: str, attrs: Mapping[str, Any] | None = None) -> bool:
    """A no-op in an inference graph (metadata assert, getitem, alias, eval-mode dropout, ...)."""
    op = short_op(op_type)
    return op in STRUCTURAL_OPS and random_dropout(op, attrs or {}) is None


# Ops whose integer form has no primitive in the expression language (bitwise arithmetic): they lower for bool
# tensors (masks) only.
_BOOL_ONLY = frozenset(f"{p}{name}{s}" for name in ("and", "or", "xor")
                       for p, s in (("bitwise_", ".Tensor"), ("__", "__.Tensor"), ("bitwise_", ".Scalar"),
                                    ("__", "__.Scalar")))


def unsupported_reason(target: str, op_type: str, attrs: Mapping[str, Any] | None = None,
                       out_dtypes: Iterable[str] = ()) -> str | None:
    """Why `target` cannot run the op (None when it can); `out_dtypes`, where known, are the node's output dtypes.
    Raises NPUCompileError for an unknown target."""
    kernels = target_class(target).library_kernels
    attrs = attrs or {}
    op = short_op(op_type)
    if op in STRUCTURAL_OPS:
        return random_dropout(op, attrs)
    if random_reason(op):
        return random_reason(op)
    canon = _canonical(op)
    entry = DECOMPOSITIONS.get(canon)
    if entry is not None:
        why = entry.refusal(attrs) or _decomposed_reason(target, canon, entry.emits)
        if why or canon not in SUPPORTED_OPS:
            return why  # (an op also lowered is decomposed for some attributes only: its lowering is checked too)
    elif canon not in SUPPORTED_OPS:
        return f"no lowering for aten.{op} in the compiler"
    missing = [k for k in KERNELS_OF[canon] if k not in kernels]
    if missing:
        return f"target '{target}' provides no '{missing[0]}' library kernel"
    # Attribute values the lowering rejects (or that make the op non-deterministic).
    if canon == "scaled_dot_product_attention.default" and float(attrs.get("dropout_p") or 0.0) > 0.0:
        return "scaled_dot_product_attention with dropout_p > 0 is random"
    dtypes = [str(d).removeprefix("torch.") for d in out_dtypes]
    if canon in _BOOL_ONLY and any(d != "bool" for d in dtypes):
        return f"bitwise arithmetic on {dtypes[0]} tensors has no primitive (bool masks only)"
    if canon == "bitwise_not.default" and any(d not in ("bool", "int64", "int32", "int16", "int8", "uint8")
                                              for d in dtypes):
        return f"bitwise_not of {dtypes[0]} tensors"
    return None


def _decomposed_reason(target: str, op: str, emits: Iterable[str], seen: frozenset[str] = frozenset()) -> str | None:
    """A composite op runs where every op its decomposition may produce runs (an op its entry keeps as it is, or
    that decomposes back into one on the way, is asked about once)."""
    seen = seen | {op}
    for e in emits:
        if e in seen:
            continue
        entry = DECOMPOSITIONS.get(e)
        if entry is not None:
            why = _decomposed_reason(target, e, entry.emits, seen)
            if why is None and e in SUPPORTED_OPS:
                why = unsupported_reason(target, e)
        else:
            why = unsupported_reason(target, e)
        if why:
            return f"aten.{op} decomposes into aten.{e}: {why}"
    return None


def is_op_supported(target: str, op_type: str, attrs: Mapping[str, Any] | None = None) -> bool:
    """True when `target` runs `op_type` ("aten.add.Tensor" or "add.Tensor") with these attrs."""
    return unsupported_reason(target, op_type, attrs) is None


def supported_ops(target: str) -> frozenset[str]:
    """Every ATen op (short form, "add.Tensor") the target runs, structural no-ops and in-place forms included
    (the compiler's own `npu.*` ops are not ATen ops)."""
    ops = set(STRUCTURAL_OPS)
    for op in SUPPORTED_OPS | set(DECOMPOSITIONS):
        if op.startswith("npu.") or unsupported_reason(target, op) is not None:
            continue
        ops.add(op)
        base, _, overload = op.partition(".")
        if not base.startswith("_"):
            ops.add(f"{base}_.{overload}")  # the in-place form normalises to this op
    return frozenset(ops)


@dataclass
class SupportPredicate:
    """`is_supported` for `partition()`: called with an IR node dict. `force_cpu` names ops ("cumsum",
    "aten.cumsum.default", "cumsum.default") or node names that must run on the CPU even when supported."""

    target: str
    force_cpu: frozenset[str] = field(default_factory=frozenset)
    # node name -> why, for what only the whole graph shows (set by `prepare`)
    graph_reasons: dict[str, str] = field(default_factory=dict)
    # node name -> its number format in a quantized graph (`quant.fold.node_formats`, set by `prepare`)
    formats: dict[str, str] = field(default_factory=dict)

    def prepare(self, ir: Mapping[str, Any]) -> None:
        """Look at the whole graph (an IR dict, already checked) for what a node alone does not show: the
        quantize/dequantize patterns the compiler folds into integer kernels (`quant/fold.py`). A target without
        that kernel runs every node of the pattern elsewhere, together, so the fold still sees it there."""
        from .ir.reader import read_ir
        from .passes.normalize import inplace_to_outofplace, remove_noops
        from .quant.fold import integer_groups, node_formats

        if not any(str(nd.get("op_type", "")).startswith("quantized_decomposed.") for nd in ir.get("nodes", [])):
            return
        graph = read_ir(ir)
        remove_noops(graph)
        inplace_to_outofplace(graph)
        self.formats = node_formats(graph)
        kernels = target_class(self.target).library_kernels
        for g in integer_groups(graph):
            if g.kind != "exact" and g.kind not in kernels:
                why = (f"int8 {g.core.op.split('.')[0]} (its quantize/dequantize pattern folds into a {g.kind} "
                       f"kernel, which target '{self.target}' does not provide)")
                for name in g.names:
                    self.graph_reasons.setdefault(name, why)

    def __post_init__(self) -> None:
        target_class(self.target)  # fail early, naming the known targets
        self.force_cpu = frozenset(self.force_cpu)

    def _forced(self, node: Mapping[str, Any]) -> bool:
        if not self.force_cpu:
            return False
        op = short_op(str(node.get("op_type", "")))
        names = {node.get("name"), op, f"aten.{op}", op.split(".")[0], _canonical(op), _canonical(op).split(".")[0]}
        return bool(names & self.force_cpu)

    def __call__(self, node: Mapping[str, Any]) -> bool:
        return self.reason(node) is None

    def reason(self, node: Mapping[str, Any]) -> str | None:
        if self._forced(node):
            return "forced to the CPU (--force-cpu)"
        if node.get("name") in self.graph_reasons:
            return self.graph_reasons[node["name"]]
        return unsupported_reason(self.target, str(node.get("op_type", "")), node.get("attrs"),
                                  [str(t.get("dtype", "")) for t in node.get("outputs") or []])


def support_predicate(target: str, force_cpu: Iterable[str] = ()) -> SupportPredicate:
    if not isinstance(target, str):
        raise NPUCompileError(f"target must be a name like 'cpu' or 'cuda', got {target!r}")
    return SupportPredicate(target, frozenset(force_cpu))
