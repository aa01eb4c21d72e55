"""`torch.einsum` equations: parsed and bound to the operands' shapes, by ATen's rules.

Labels are letters; `...` stands for the dims a term does not name (right-aligned across operands and broadcast).
Without `->` the output is the ellipsis dims, then every label that occurs once, in ASCII order (upper case first).
A label repeated within a term takes that term's diagonal; a label absent from the output is summed. Sizes of one
label (and of the ellipsis dims) must agree across operands or be 1 (broadcast).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ELLIPSIS = "..."


class EinsumError(ValueError):
    """The equation does not fit the operands."""


@dataclass(frozen=True)
class Einsum:
    terms: tuple[tuple[str, ...], ...]  # per operand, one label per dim (ellipsis dims named "0", "1", ...)
    output: tuple[str, ...]
    sizes: dict[str, int]  # the broadcast size of every label

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(self.sizes[label] for label in self.output)


def _letters(term: str, where: str) -> list[str]:
    """The term's labels with the ellipsis as one "..." entry."""
    if term.count(ELLIPSIS) > 1:
        raise EinsumError(f"{where} has more than one ellipsis")
    out: list[str] = []
    rest = term
    while rest:
        if rest.startswith(ELLIPSIS):
            out.append(ELLIPSIS)
            rest = rest[3:]
            continue
        ch, rest = rest[0], rest[1:]
        if not ("a" <= ch <= "z" or "A" <= ch <= "Z"):
            raise EinsumError(f"{where} holds {ch!r}; subscripts are letters and '...'")
        out.append(ch)
    return out


def parse_einsum(equation: str, shapes: Sequence[tuple[int, ...]]) -> Einsum:
    eq = "".join(equation.split())
    lhs, arrow, rhs = eq.partition("->")
    if "->" in rhs:
        raise EinsumError("the equation has more than one '->'")
    raw = lhs.split(",")
    if len(raw) != len(shapes):
        raise EinsumError(f"the equation has {len(raw)} operand term(s) for {len(shapes)} operand(s)")
    parsed = [_letters(t, f"operand term {i} {t!r}") for i, t in enumerate(raw)]
    ell_rank = 0
    for i, (labels, shape) in enumerate(zip(parsed, shapes)):
        named = len([x for x in labels if x != ELLIPSIS])
        if (ELLIPSIS in labels and named > len(shape)) or (ELLIPSIS not in labels and named != len(shape)):
            raise EinsumError(f"operand {i} has {len(shape)} dims, its term {raw[i]!r} names {named}")
        if ELLIPSIS in labels:
            ell_rank = max(ell_rank, len(shape) - named)
    ell = tuple(str(k) for k in range(ell_rank))
    terms = []
    for labels, shape in zip(parsed, shapes):
        k = len(shape) - (len(labels) - (ELLIPSIS in labels))
        expanded: list[str] = []
        for x in labels:
            expanded.extend(ell[ell_rank - k:] if x == ELLIPSIS else [x])
        terms.append(tuple(expanded))
    sizes: dict[str, int] = {}
    for i, (term, shape) in enumerate(zip(terms, shapes)):
        seen: dict[str, int] = {}
        for label, n in zip(term, shape):
            if label in seen and seen[label] != n:
                raise EinsumError(f"operand {i} repeats subscript {label} over dims of sizes {seen[label]} and {n}")
            seen[label] = n
            if sizes.get(label, 1) != 1 and n != 1 and sizes[label] != n:
                what = "an ellipsis dim" if label.isdigit() else f"subscript {label}"
                raise EinsumError(f"{what} has size {n} in operand {i}, which does not broadcast with {sizes[label]}")
            sizes[label] = n if sizes.get(label, 1) == 1 else sizes[label]
    if arrow:
        out_labels = _letters(rhs, f"the output term {rhs!r}")
        output: list[str] = []
        for x in out_labels:
            if x == ELLIPSIS:
                output.extend(ell)
                continue
            if x in output:
                raise EinsumError(f"the output repeats subscript {x}")
            if x not in sizes:
                raise EinsumError(f"the output subscript {x} occurs in no operand")
            output.append(x)
    else:
        counts: dict[str, int] = {}
        for term in terms:
            for x in term:
                counts[x] = counts.get(x, 0) + 1
        output = list(ell) + sorted(x for x, c in counts.items() if c == 1 and not x.isdigit())
    return Einsum(tuple(terms), tuple(output), sizes)


def contraction_pairs(path: Sequence[int] | None, n: int) -> list[tuple[int, int]]:
    """The pairs of operand positions ATen's einsum contracts, in order, for `n` operands: `path`'s pairs (each
    sorted; the two operands are removed and their result appended), or (0, 1) each time without one (left to
    right). EinsumError for a path that is not n - 1 pairs of distinct positions in range."""
    if path is None:
        return [(0, 1)] * (n - 1)
    if len(path) != 2 * (n - 1):
        raise EinsumError(f"path {list(path)} must hold {n - 1} pair(s) of operand positions for {n} operand(s)")
    pairs = []
    for k in range(n - 1):
        i, j = sorted((path[2 * k], path[2 * k + 1]))
        if i == j or i < 0 or j >= n - k:
            raise EinsumError(f"path pair ({path[2 * k]}, {path[2 * k + 1]}) is not two of the {n - k} operands "
                              "left at that step")
        pairs.append((i, j))
    return pairs
