"""Every kernel kind, defined once: its typed record, its check against the tensors it is given, its cost and its
reference semantics. The lowering builds records, renderers and backends read them, artifacts store them as data.

Kinds: `generated` (an expression: elementwise work, reductions, norms, softmax, RoPE, gathers, pooling, the cache
write), the library kernels `gemm`, `conv2d` and `attention`, the integer ones `qgemm`, `qconv2d` and `qadd`
(int8 with fixed-point requantization), and `wgemm` (weight-only int8/int4 GEMM); each says why it is a library
kernel in its `library_reason`.
"""

from __future__ import annotations

from typing import Any

from .attention import AttentionKernel, attention_flops
from .base import KernelCall, KernelCost, KernelSpec
from .conv2d import Conv2dKernel, conv_flops, conv_out_size
from .gemm import GemmKernel, gemm_flops
from .generated import GeneratedKernel, Scatter
from .plans import (
    PLANS,
    AttentionPlan,
    Conv2dPlan,
    GemmPlan,
    GeneratedPlan,
    Int8TilePlan,
    Plan,
    QConv2dPlan,
    QGemmPlan,
    Scratch,
    plan_from_data,
    plan_of,
)
from .qadd import QAddKernel, ResidualAdd
from .qconv2d import QConv2dKernel
from .qgemm import QGemmKernel
from .requant import Requant
from .wgemm import WGemmKernel

KINDS: dict[str, type[KernelSpec]] = {cls.kind: cls for cls in (GeneratedKernel, GemmKernel, Conv2dKernel,
                                                                  AttentionKernel, QGemmKernel, QConv2dKernel,
                                                                  QAddKernel, WGemmKernel)}
# The integer kinds: a target that runs none of them leaves them out of its `library_kernels`, and the ops folded into
# them then run on the CPU (the partition path) or are refused by name.
INTEGER_KINDS = frozenset({"qgemm", "qconv2d", "qadd"})
# Weight-only quantized GEMMs (int8/int4 weights, float activations): decoding's memory-bound projections.
WEIGHT_ONLY_KINDS = frozenset({"wgemm"})
LIBRARY_KINDS = frozenset(k for k, cls in KINDS.items() if cls.library_reason)


def spec_from_data(kind: Any, data: Any, where: str) -> KernelSpec:
    """A kernel record from an artifact (ValueError naming `where` and the field when it is not one)."""
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"{where}: unknown kernel kind {kind!r} (known: {', '.join(sorted(KINDS))})")
    return cls.from_data(data, where)


__all__ = [
    "KINDS", "LIBRARY_KINDS", "KernelCall", "KernelSpec", "KernelCost", "GeneratedKernel", "Scatter", "GemmKernel",
    "Conv2dKernel", "AttentionKernel", "QGemmKernel", "QConv2dKernel", "QAddKernel", "ResidualAdd", "Requant",
    "INTEGER_KINDS",
    "WGemmKernel", "WEIGHT_ONLY_KINDS",
    "spec_from_data", "gemm_flops", "conv_flops", "conv_out_size", "attention_flops",
    "PLANS", "Plan", "AttentionPlan", "Conv2dPlan", "GemmPlan", "GeneratedPlan", "Int8TilePlan", "QConv2dPlan",
    "QGemmPlan", "Scratch", "plan_from_data", "plan_of",
]
