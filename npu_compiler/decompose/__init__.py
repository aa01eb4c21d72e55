"""Decompositions: composite ATen ops rewritten, before lowering, into ops the compiler lowers.

One table (`DECOMPOSITIONS`, filled by `@decomposes` in the modules below) serves the whole compiler, the way torch's
decomposition table serves torch.export: a composite op costs an entry, not a kernel, and every target that runs the
ops an entry produces runs the composite op too (`op_support` asks the entry). The pass runs after normalisation
(in-place forms are out-of-place by then: `index_add_`, `fill_`), on every program and every partition.

Modules: `aliases` (ATen's other names for ops: `multiply`, `swapaxes`, ...), `composite` (views under other names,
PReLU, norms and weight norm, index_add, meshgrid, fills), `convolution` (core ATen's convolution, 1-3 d, transposed;
col2im, im2col), `einsum`, `normalization` (norms with their statistics, batch norm with batch statistics, RMS and
instance norm, prod, sort), `pooling` (max pooling with indices, 1-d and adaptive max pooling, 3-d average and adaptive
pooling, nearest and linear resampling in 1-3 d), `recurrent` (LSTM, GRU, RNN and their cells, unrolled over the static
sequence length), `reductions` (all, logsumexp, std, argsort, glu, cosine similarity, one_hot, ...), `sampling`
(grid_sample), `scatters` (the scatters, index_put, masked_scatter, and a view's elements written back into its base:
what functionalisation makes of an in-place op on a view), `views` (movedim, narrow, pixel shuffle, tril/triu, ...).
"""

from . import (  # noqa: F401  (each registers its entries)
    aliases,
    composite,
    convolution,
    einsum,
    normalization,
    pooling,
    recurrent,
    reductions,
    sampling,
    scatters,
    views,
)
from .registry import DECOMPOSITIONS, Decomposition, Rewriter, decompose, decomposes

DECOMPOSED_OPS = frozenset(DECOMPOSITIONS)

__all__ = ["DECOMPOSITIONS", "DECOMPOSED_OPS", "Decomposition", "Rewriter", "decompose", "decomposes"]
