"""Ops that move elements to computed places: `repeat`, `repeat_interleave`, `roll`, `flip`, `pad` /
`constant_pad_nd` (constant, reflect, replicate, circular), `stack` and `diff`. Each is a generated kernel whose
reads are gathers at positions computed from the output index (integer arithmetic only: no rounding anywhere)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import UnsupportedOpError
from ..expr import nodes as X
from ..expr.aten_table import build_elementwise, cast
from ..ir.graph import Node
from ..program import TensorRef
from . import views as V
from .registry import lowers

if TYPE_CHECKING:
    from .lower import Lowering

I64 = "int64"


def _i(v: int) -> X.Expr:
    return X.Const(I64, int(v))


def _b(op: str, a: X.Expr, b: X.Expr, dtype: str = I64) -> X.Expr:
    return X.Binary(dtype, op, a, b)


def _mod(i: X.Expr, n: int) -> X.Expr:
    """i mod n for i >= 0 (integer division truncates; exact)."""
    return _b("sub", i, _b("mul", _b("div", i, _i(n)), _i(n)))


def _flat(L: Lowering, ref: TensorRef) -> TensorRef:
    return V.reshape(ref, (ref.numel,)) or V.reshape(L.contiguous(ref), (ref.numel,))


@lowers("repeat.default")
def repeat(L: Lowering, node: Node) -> None:
    """out[p] = self[p mod self.shape] (self's dims aligned on the right of `repeats`)."""
    x_v, out_v = node.inputs[0], node.outputs[0]
    src = L.ref(x_v)
    out = L.fresh(out_v)
    lead = len(out_v.shape) - len(x_v.shape)

    def build(load) -> X.Expr:
        at = []
        for d, n in enumerate(x_v.shape):
            o = X.Index(I64, lead + d)
            at.append(o if out_v.shape[lead + d] == n else _i(0) if n == 1 else _mod(o, n))
        return cast(L.gather(src, tuple(at)), out_v.dtype)

    L.generated(out, build)


@lowers("repeat_interleave.self_int")
def repeat_interleave(L: Lowering, node: Node) -> None:
    """out[..., i, ...] = self[..., i // repeats, ...] along `dim` (no dim: over the flattened tensor)."""
    x_v, out_v = node.inputs[0], node.outputs[0]
    r = int(node.attrs["repeats"])
    dim = node.attrs.get("dim")
    src = L.ref(x_v)
    if dim is None:
        src, dim = _flat(L, src), 0
    dim = V.norm_dim(dim, len(src.shape))
    out = L.fresh(out_v)
    rank = len(src.shape)

    def build(load) -> X.Expr:
        at = tuple(_b("div", X.Index(I64, d), _i(r)) if d == dim else X.Index(I64, d) for d in range(rank))
        return cast(L.gather(src, at), out_v.dtype)

    L.generated(out, build)


@lowers("roll.default")
def roll(L: Lowering, node: Node) -> None:
    """out[..., i, ...] = self[..., (i - shift) mod n, ...] per rolled dim; no dims: over the flattened tensor."""
    x_v, out_v = node.inputs[0], node.outputs[0]
    shifts = list(node.attrs["shifts"])
    dims = list(node.attrs.get("dims") or [])
    src = L.ref(x_v)
    out = L.fresh(out_v)
    if not dims:
        if len(shifts) != 1:
            raise UnsupportedOpError(node.name, "aten.roll.default", L.target.name,
                                     f"{len(shifts)} shifts without dims")
        src, out, dims = _flat(L, src), V.reshape(out, (out.numel,)), [0]
    if len(shifts) != len(dims):
        raise UnsupportedOpError(node.name, "aten.roll.default", L.target.name,
                                 f"{len(shifts)} shifts for {len(dims)} dims")
    rank = len(src.shape)
    amount = {}
    for s, d in zip(shifts, dims):
        d = V.norm_dim(d, rank)
        n = src.shape[d]
        amount[d] = (amount.get(d, 0) + s) % n if n else 0

    def build(load) -> X.Expr:
        at = []
        for d in range(rank):
            i, s, n = X.Index(I64, d), amount.get(d, 0), src.shape[d]
            at.append(i if not s else X.Where(I64, _b("ge", i, _i(s), "bool"), _b("sub", i, _i(s)),
                                              _b("add", i, _i(n - s))))
        return cast(L.gather(src, tuple(at)), out_v.dtype)

    L.generated(out, build)


@lowers("flip.default")
def flip(L: Lowering, node: Node) -> None:
    x_v, out_v = node.inputs[0], node.outputs[0]
    rank = len(x_v.shape)
    dims = {V.norm_dim(d, rank) for d in node.attrs["dims"]}
    src = L.ref(x_v)

    def build(load) -> X.Expr:
        at = tuple(_b("sub", _i(x_v.shape[d] - 1), X.Index(I64, d)) if d in dims else X.Index(I64, d)
                   for d in range(rank))
        return cast(L.gather(src, at), out_v.dtype)

    L.generated(L.fresh(out_v), build)


_PAD_MODES = ("constant", "reflect", "replicate", "circular")
# The decomposed padding ops: their mode is their name, their amounts the `padding` attr.
_NAMED_PADS = {**{f"reflection_pad{n}d.default": "reflect" for n in (1, 2, 3)},
               **{f"replication_pad{n}d.default": "replicate" for n in (2, 3)}}


@lowers("pad.default", "constant_pad_nd.default", *_NAMED_PADS)
def pad(L: Lowering, node: Node) -> None:
    """`pad` lists (before, after) pairs from the last dim backwards; a negative amount crops. The source position
    along a padded dim is i - before: outside the input it is the fill (constant), mirrored (reflect), clamped
    (replicate) or wrapped (circular)."""
    x_v, out_v = node.inputs[0], node.outputs[0]
    a = node.attrs
    mode = a.get("mode", "constant") if node.op == "pad.default" else _NAMED_PADS.get(node.op, "constant")
    if mode not in _PAD_MODES:
        raise UnsupportedOpError(node.name, f"aten.{node.op}", L.target.name, f"padding mode {mode!r}")
    amounts = list(a["padding"] if node.op in _NAMED_PADS else a["pad"])
    rank = len(x_v.shape)
    if len(amounts) % 2 or len(amounts) // 2 > rank:
        raise UnsupportedOpError(node.name, f"aten.{node.op}", L.target.name,
                                 f"pad {amounts} for a tensor of rank {rank}")
    before = {rank - 1 - k: int(amounts[2 * k]) for k in range(len(amounts) // 2)}
    value = a.get("value")
    fill = 0 if value is None else value
    for d, b in before.items():
        n = x_v.shape[d]
        after = out_v.shape[d] - n - b
        if mode == "reflect" and (b >= n or after >= n):
            raise UnsupportedOpError(node.name, f"aten.{node.op}", L.target.name,
                                     f"reflect padding ({b}, {after}) of a dim of size {n}: must be below it")
        if mode == "circular" and (b > n or after > n):
            raise UnsupportedOpError(node.name, f"aten.{node.op}", L.target.name,
                                     f"circular padding ({b}, {after}) of a dim of size {n}: at most its size")
    src = L.ref(x_v)

    def build(load) -> X.Expr:
        at, guards = [], []
        for d in range(rank):
            i = X.Index(I64, d)
            b, n = before.get(d, 0), x_v.shape[d]
            if not b and out_v.shape[d] == n:
                at.append(i)
                continue
            s = _b("sub", i, _i(b)) if b else i
            lo, hi = _b("lt", s, _i(0), "bool"), _b("ge", s, _i(n), "bool")
            if mode == "constant":
                guards.append(_b("and", _b("ge", s, _i(0), "bool"), _b("lt", s, _i(n), "bool"), "bool"))
            elif mode == "reflect":
                s = X.Where(I64, lo, _b("sub", _i(0), s), X.Where(I64, hi, _b("sub", _i(2 * (n - 1)), s), s))
            elif mode == "replicate":
                s = _b("min", _b("max", s, _i(0)), _i(n - 1))
            else:
                s = X.Where(I64, lo, _b("add", s, _i(n)), X.Where(I64, hi, _b("sub", s, _i(n)), s))
            at.append(s)
        guard = None
        for g in guards:
            guard = g if guard is None else _b("and", guard, g, "bool")
        return cast(L.gather(src, tuple(at), guard, _fill(fill, x_v.dtype)), out_v.dtype)

    L.generated(L.fresh(out_v), build)


def _fill(value: float | int | bool, dtype: str) -> float | int | bool:
    if dtype == "bool":
        return bool(value)
    if dtype in ("float32", "float16", "bfloat16", "float64"):
        return float(value)
    return int(value)


@lowers("stack.default")
def stack(L: Lowering, node: Node) -> None:
    """Each input is copied into its slot of the new dim (as `cat` copies into its slices)."""
    out_v = node.outputs[0]
    dim = V.norm_dim(node.attrs.get("dim", 0), len(out_v.shape))
    out = L.fresh(out_v)
    for k, v in enumerate(node.inputs):
        src = L.ref(v, pending_ok=True)
        L.generated(V.select(out, dim, k), lambda load, src=src: cast(load(src), out_v.dtype))


@lowers("diff.default")
def diff(L: Lowering, node: Node) -> None:
    """out = y[1:] - y[:-1] along `dim`, n times, with y = cat(prepend, self, append) (for bool tensors: !=). The IR
    drops a missing optional tensor: with one extra input it is read as `prepend`, as torch_ir's executor reads it."""
    x_v, out_v = node.inputs[0], node.outputs[0]
    n = int(node.attrs.get("n", 1))
    rank = len(x_v.shape)
    if n == 0:  # ATen returns the input as it is: dim, prepend and append unread
        src0 = L.ref(x_v, pending_ok=True)
        L.generated(L.fresh(out_v), lambda load: cast(load(src0), out_v.dtype))
        return
    dim = V.norm_dim(node.attrs.get("dim", -1), rank)
    parts = [node.inputs[1], x_v, *node.inputs[2:]] if len(node.inputs) > 1 else [x_v]
    length = sum(v.shape[dim] for v in parts)
    if length - n != out_v.shape[dim]:
        raise UnsupportedOpError(node.name, "aten.diff.default", L.target.name,
                                 f"inputs of {length} along dim {dim} and n={n} for an output of "
                                 f"{out_v.shape[dim]}")
    if len(parts) == 1:
        cur = L.ref(x_v, pending_ok=True)
    else:
        shape = tuple(length if d == dim else s for d, s in enumerate(x_v.shape))
        # joined in the result's dtype: ATen's cat promotes the parts (an int32 input with a float prepend is float)
        cur = L.scratch(f"{node.name}.joined", out_v.dtype, shape)
        start = 0
        for v in parts:
            src = L.ref(v, pending_ok=True)
            region = V.slice_(cur, dim, start, start + v.shape[dim], 1)
            L.generated(region, lambda load, src=src: cast(load(src), out_v.dtype))
            start += v.shape[dim]
    op = "ne.Tensor" if out_v.dtype == "bool" else "sub.Tensor"
    for step in range(n):
        size = cur.shape[dim] - 1
        last = step == n - 1
        res = L.fresh(out_v) if last else L.scratch(f"{node.name}.diff{step}", out_v.dtype,
                                                    tuple(size if d == dim else s for d, s in enumerate(cur.shape)))
        hi, lo = V.slice_(cur, dim, 1, size + 1, 1), V.slice_(cur, dim, 0, size, 1)
        L.generated(res, lambda load, hi=hi, lo=lo: build_elementwise(op, [load(hi), load(lo)], {}, out_v.dtype))
        cur = res
