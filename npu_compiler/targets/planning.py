"""What the GPU targets' planners share: decisions that read only a record and a device profile (targets make their
plans in `CodegenTarget.plan`; kernels/plans.py holds what a plan is)."""

from __future__ import annotations

from ..kernels import AttentionKernel

DECODE_MIN_KEYS_PER_SPLIT = 16
DECODE_BLOCKS_PER_UNIT = 2  # blocks (workgroups) in flight a multiprocessor that a split decode attention aims for
MAX_SPLIT_V_DIM = 1024


def decode_splits(spec: AttentionKernel, dev) -> int:
    """How many key splits an attention of few query rows gets on the device `dev` (0: one block a query row). A
    GPU wants a few hundred blocks, and decode attention has one query row a head: split the keys of each KV-head
    group (the query heads that share a KV head read its keys once, together) so that groups x splits reaches two
    blocks a multiprocessor, keeping at least DECODE_MIN_KEYS_PER_SPLIT keys a split."""
    blocks = DECODE_BLOCKS_PER_UNIT * dev.multiprocessors
    groups = spec.batch * spec.kv_heads * spec.q_len
    if groups == 0 or groups >= blocks or spec.v_dim > MAX_SPLIT_V_DIM:
        return 0
    splits = min(-(-blocks // groups), spec.kv_len // DECODE_MIN_KEYS_PER_SPLIT)
    return splits if splits >= 2 else 0


__all__ = ["decode_splits", "DECODE_MIN_KEYS_PER_SPLIT"]
