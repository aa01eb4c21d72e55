"""`einsum` as views, sums and batched GEMMs, for any equation (`ir/einsum.py` parses it).

Each operand first takes its diagonals (a repeated subscript) and sums the subscripts no other operand and not the
output names. Operands are then combined in pairs as ATen's einsum does: in the node's `path` where it has one (the
pairs of operand positions to contract, each result appended to the operands: what `torch.einsum` records when the
opt_einsum package chose the order), left to right otherwise; in a half dtype every pairwise result is rounded, so
the order is part of the answer. Each pair is combined as ATen's `sumproduct_pair` does: subscripts both share and
a later operand or the output needs are batch dims, the rest of the shared ones are contracted. A contraction of
floating tensors is one `bmm` over [batch, rows, K] x [batch, K, cols] views (a copy only where the permuted operand
is not a view of that shape); an outer product, or integers, is a broadcast multiply and a sum. The result is
permuted into the output's order.
"""

from __future__ import annotations

import math

from ..dtypes import FLOAT_DTYPES
from ..ir.einsum import contraction_pairs, parse_einsum
from ..ir.graph import Node, Value
from .registry import Rewriter, decomposes

_EMITS = ("diagonal.default", "sum.dim_IntList", "permute.default", "expand.default", "reshape.default",
          "bmm.default", "mul.Tensor", "to.dtype")


class _Term:
    """An operand with one subscript per dim."""

    def __init__(self, value: Value, labels: tuple[str, ...]) -> None:
        self.value, self.labels = value, list(labels)

    def size(self, label: str) -> int:
        return self.value.shape[self.labels.index(label)]


def _diagonals(rw: Rewriter, t: _Term) -> _Term:
    """A subscript repeated within one term: that term's diagonal (the pair of dims becomes one, at the end)."""
    while len(set(t.labels)) < len(t.labels):
        label = next(x for x in t.labels if t.labels.count(x) > 1)
        p = t.labels.index(label)
        q = t.labels.index(label, p + 1)
        t = _Term(rw.op("diagonal.default", t.value, offset=0, dim1=p, dim2=q),
                  tuple([x for i, x in enumerate(t.labels) if i not in (p, q)] + [label]))
    return t


def _sum_out(rw: Rewriter, t: _Term, labels: list[str], keepdim: bool = False) -> _Term:
    if not labels:
        return t
    dims = [t.labels.index(x) for x in labels]
    v = rw.op("sum.dim_IntList", t.value, dim=dims, keepdim=keepdim)
    if v.dtype != t.value.dtype:  # an integer sum is int64: back to the operands' dtype, as ATen's einsum gives
        v = rw.op("to.dtype", v, dtype=t.value.dtype)
    return _Term(v, tuple(t.labels) if keepdim else tuple(x for x in t.labels if x not in labels))


def _permute(rw: Rewriter, t: _Term, order: list[str]) -> _Term:
    if order == t.labels:
        return t
    return _Term(rw.op("permute.default", t.value, dims=[t.labels.index(x) for x in order]), tuple(order))


def _as_3d(rw: Rewriter, t: _Term, sizes: dict[str, int], groups: tuple[list[str], list[str], list[str]]) -> Value:
    """`t` permuted to the groups' order, its batch dims broadcast to their full size, seen as [B, M, N]."""
    batch = groups[0]
    t = _permute(rw, t, [x for g in groups for x in g])
    v = t.value
    full = [sizes[x] if x in batch else n for x, n in zip(t.labels, v.shape)]
    if list(v.shape) != full:
        v = rw.op("expand.default", v, size=full)
    shape3 = [math.prod(sizes[x] if x in batch else t.size(x) for x in g) for g in groups]
    return rw.op("reshape.default", v, shape=shape3) if list(v.shape) != shape3 else v


def _combine(rw: Rewriter, a: _Term, b: _Term, needed: set[str], sizes: dict[str, int]) -> _Term:
    shared = [x for x in a.labels if x in b.labels]
    batch = [x for x in shared if x in needed]
    contract = [x for x in shared if x not in needed]
    # a contracted subscript of size 1 in one operand only: sum the other over it first (both then have size 1)
    a = _sum_out(rw, a, [x for x in contract if a.size(x) != b.size(x) and a.size(x) != 1], keepdim=True)
    b = _sum_out(rw, b, [x for x in contract if a.size(x) != b.size(x) and b.size(x) != 1], keepdim=True)
    a_only = [x for x in a.labels if x not in b.labels]
    b_only = [x for x in b.labels if x not in a.labels]
    dtype = a.value.dtype
    if contract and dtype in FLOAT_DTYPES and math.prod(a.size(x) for x in contract) > 1:
        lhs = _as_3d(rw, a, sizes, (batch, a_only, contract))
        rhs = _as_3d(rw, b, sizes, (batch, contract, b_only))
        prod = rw.op("bmm.default", lhs, rhs)
        shape = [sizes[x] for x in batch] + [a.size(x) for x in a_only] + [b.size(x) for x in b_only]
        if list(prod.shape) != shape:
            prod = rw.op("reshape.default", prod, shape=shape)
        return _Term(prod, tuple(batch + a_only + b_only))
    # a broadcast product over [batch, a_only, contract, b_only], then the sum over contract
    order = batch + a_only + contract + b_only
    pa = _permute(rw, a, [x for x in order if x in a.labels])
    pb = _permute(rw, b, [x for x in order if x in b.labels])
    va = rw.op("reshape.default", pa.value, shape=[pa.size(x) if x in pa.labels else 1 for x in order])
    vb = rw.op("reshape.default", pb.value, shape=[pb.size(x) if x in pb.labels else 1 for x in order])
    return _sum_out(rw, _Term(rw.op("mul.Tensor", va, vb), tuple(order)), contract)


@decomposes("einsum.default", emits=_EMITS)
def _einsum(rw: Rewriter, node: Node) -> Value:
    spec = parse_einsum(node.attrs["equation"], [v.shape for v in node.inputs])
    terms = [_diagonals(rw, _Term(v, labels)) for v, labels in zip(node.inputs, spec.terms)]
    out = list(spec.output)
    for i, t in enumerate(terms):
        elsewhere = {x for j, u in enumerate(terms) if j != i for x in u.labels} | set(out)
        terms[i] = _sum_out(rw, t, [x for x in dict.fromkeys(t.labels) if x not in elsewhere])
    for i, j in contraction_pairs(node.attrs.get("path"), len(terms)):
        a, b = terms[i], terms[j]
        del terms[j], terms[i]
        needed = {x for u in terms for x in u.labels} | set(out)
        terms.append(_combine(rw, a, b, needed, spec.sizes))
    acc = _sum_out(rw, terms[0], [x for x in terms[0].labels if x not in out])
    acc = _permute(rw, acc, out)
    want = list(node.outputs[0].shape)
    if list(acc.value.shape) != want:  # a broadcast subscript that only one operand of size 1 carried
        return rw.op("expand.default", acc.value, size=want)
    return acc.value
