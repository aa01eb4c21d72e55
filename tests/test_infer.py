"""Shape and dtype inference (`npu_compiler.ir.infer`) against PyTorch itself: for random operands and attributes of
every supported op, a one-node IR is built; where ATen (called the way torch_ir's reference executor calls it, on
small CPU tensors) computes a result, the reader must accept the IR that declares exactly that result and refuse one
that declares another shape or dtype; where ATen refuses the operands, the reader must refuse them too."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest
import torch
from aten_reference import ReferenceError, resolve, run_node

from npu_compiler.decompose import DECOMPOSED_OPS
from npu_compiler.errors import ConstraintError, IRFormatError
from npu_compiler.ir.aliases import ALIASES
from npu_compiler.ir.infer import RULES, has_rule
from npu_compiler.ir.reader import read_ir
from npu_compiler.lowering.lower import SUPPORTED_OPS
from npu_compiler.passes.normalize import STRUCTURAL_OPS

DTYPES = ["float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool"]
FLOATS = ["float32", "float16", "bfloat16"]
INT64_MAX = 2**63 - 1


def test_every_supported_op_has_a_rule() -> None:
    """An op the compiler lowers (or drops as structural) must have its outputs checked: add a rule with
    `@infers(op)` in npu_compiler/ir/infer.py."""
    missing = sorted(op for op in SUPPORTED_OPS | DECOMPOSED_OPS | (STRUCTURAL_OPS - {"getitem"}) if not has_rule(op))
    assert not missing, f"ops without a shape/dtype inference rule: {missing}"


def test_every_rule_has_cases() -> None:
    assert not sorted(set(RULES) - set(CASES)), "add cases for these rules to tests/test_infer.py"


# ---- random operands per op ----------------------------------------------------------------------------------------

Case = tuple[list[tuple[tuple[int, ...], str]], dict]  # inputs (shape, dtype), attrs
Gen = Callable[[random.Random], Case]


def _shape(r: random.Random, rank: int | None = None, lo: int = 0) -> tuple[int, ...]:
    rank = r.randint(0, 3) if rank is None else rank
    return tuple(r.choice([lo, 1, 2, 3, 4]) if r.random() < 0.9 else lo for _ in range(rank))


def _bshape(r: random.Random, s: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with `s` most of the time."""
    out = [d if r.random() < 0.6 else r.choice([1, d, d + 1]) for d in s]
    if r.random() < 0.3:
        out = out[r.randint(0, len(out)):]
    if r.random() < 0.2:
        out = [r.choice([1, 2])] + out
    return tuple(out)


def _dt(r: random.Random, pool=DTYPES) -> str:
    return r.choice(pool)


def _scalar(r: random.Random):
    return r.choice([True, False, 0, 1, 2, -3, 0.5, -1.25, 2.0, float("inf"), 1e308, -7e4, 1000, 2**40])


def unary(**attrs: Callable[[random.Random], object]) -> Gen:
    def gen(r):
        return [(_shape(r), _dt(r))], {k: f(r) for k, f in attrs.items() if r.random() < 0.7}
    return gen


def binary(names=("self", "other")) -> Gen:
    def gen(r):
        s = _shape(r)
        if r.random() < 0.25:
            return [(s, _dt(r))], {names[1]: _scalar(r)}
        return [(s, _dt(r)), (_bshape(r, s), _dt(r))], {}
    return gen


def scalar_op(name: str) -> Gen:
    return lambda r: ([(_shape(r), _dt(r))], {name: _scalar(r)})


def _where(r):
    s = _shape(r)
    ins = [(_bshape(r, s), r.choice(["bool", "bool", "float32"])), (s, _dt(r))]
    if r.random() < 0.3:
        return ins, {"other": _scalar(r)}
    return ins + [(_bshape(r, s), _dt(r))], {}


def _masked_fill(r):
    s = _shape(r)
    return [(s, _dt(r)), (_bshape(r, s), r.choice(["bool", "bool", "int64"]))], {"value": _scalar(r)}


def _dtype_attr(r):
    return "torch." + _dt(r)


def _view(key):
    def gen(r):
        s = _shape(r, lo=1)
        n = math.prod(s)
        size = []
        rest = n
        for _ in range(r.randint(0, 3)):
            d = r.choice([x for x in (1, 2, 3, 4) if rest % x == 0])
            size.append(d)
            rest //= d
        size.append(rest)
        if r.random() < 0.3:
            size[r.randrange(len(size))] = -1
        if r.random() < 0.15:
            size[0] += 1
        r.shuffle(size)
        return [(s, _dt(r))], {key: size}
    return gen


def _dim(r, rank):
    return r.randint(-rank - 1, rank)


def _flatten(r):
    s = _shape(r)
    return [(s, _dt(r))], {"start_dim": _dim(r, len(s)), "end_dim": _dim(r, len(s))}


def _unsqueeze(r):
    s = _shape(r)
    return [(s, _dt(r))], {"dim": r.randint(-len(s) - 2, len(s) + 1)}


def _squeeze_dim(r):
    s = _shape(r)
    return [(s, _dt(r))], {"dim": _dim(r, len(s))}


def _squeeze_dims(r):
    s = _shape(r)
    return [(s, _dt(r))], {"dim": [_dim(r, len(s)) for _ in range(r.randint(0, 2))]}


def _transpose(r):
    s = _shape(r)
    return [(s, _dt(r))], {"dim0": _dim(r, len(s)), "dim1": _dim(r, len(s))}


def _permute(r):
    s = _shape(r)
    dims = list(range(len(s)))
    r.shuffle(dims)
    if r.random() < 0.2 and dims:
        dims[0] = dims[-1]
    if r.random() < 0.3:
        dims = [d - len(s) for d in dims]
    return [(s, _dt(r))], {"dims": dims}


def _expand(r):
    s = _shape(r)
    size = [r.choice([-1, d, 1 if d == 1 else d, d + 1]) if d != 1 else r.choice([1, 3, -1]) for d in s]
    size = [r.choice([1, 2]) for _ in range(r.randint(0, 2))] + size
    return [(s, _dt(r))], {"size": size}


def _slice(r):
    s = _shape(r, r.randint(1, 3))
    return [(s, _dt(r))], {"dim": _dim(r, len(s)), "start": r.choice([None, 0, 1, -1, -7, 5]),
                           "end": r.choice([None, 0, 2, -1, 9, INT64_MAX]), "step": r.choice([1, 1, 2, 3])}


def _select(r):
    s = _shape(r)
    return [(s, _dt(r))], {"dim": _dim(r, len(s)), "index": r.randint(-4, 4)}


def _split(r):
    s = _shape(r, r.randint(1, 3))
    return [(s, _dt(r))], {"split_size": r.choice([0, 1, 2, 3]), "dim": _dim(r, len(s))}


def _split_sizes(r):
    s = _shape(r, r.randint(1, 3), lo=1)
    d = r.randrange(len(s))
    n = s[d]
    cut = sorted(r.randint(0, n) for _ in range(r.randint(0, 2)))
    sizes = [b - a for a, b in zip([0, *cut], [*cut, n])]
    if r.random() < 0.2:
        sizes[-1] += 1
    return [(s, _dt(r))], {"split_sizes": sizes, "dim": d}


def _chunk(r):
    s = _shape(r, r.randint(1, 3))
    return [(s, _dt(r))], {"chunks": r.randint(1, 5), "dim": _dim(r, len(s))}


def _cat(r):
    s = list(_shape(r, r.randint(1, 3)))
    d = r.randrange(len(s))
    ins = []
    for _ in range(r.randint(1, 3)):
        t = list(s)
        t[d] = r.randint(0, 3)
        if r.random() < 0.1:
            t = [0]
        ins.append((tuple(t), _dt(r)))
    return ins, {"dim": r.choice([d, d - len(s)]), "_tensor_list_sizes": [len(ins)]}


def _mat(r):
    a = _shape(r, r.randint(1, 4), lo=1)
    k = a[-1]
    b = list(_shape(r, r.randint(1, 4), lo=1))
    if len(b) == 1:
        b[0] = k
    else:
        b[-2] = k if r.random() < 0.9 else k + 1
    dt = _dt(r, FLOATS + ["float64"])
    return [(a, dt), (tuple(b), dt if r.random() < 0.9 else _dt(r))], {}


def _mm(r):
    m, k, n = r.randint(1, 4), r.randint(1, 4), r.randint(1, 4)
    dt = _dt(r, FLOATS)
    return [((m, k), dt), ((k if r.random() < 0.9 else k + 1, n), dt)], {}


def _bmm(r):
    b, m, k, n = r.randint(1, 3), r.randint(1, 4), r.randint(1, 4), r.randint(1, 4)
    dt = _dt(r, FLOATS)
    return [((b, m, k), dt), ((b if r.random() < 0.9 else b + 1, k, n), dt)], {}


def _addmm(r):
    m, k, n = r.randint(1, 4), r.randint(1, 4), r.randint(1, 4)
    dt = _dt(r, FLOATS)
    bias = r.choice([(n,), (m, n), (1, n), (m, 1), (n + 1,)])
    scalars = {"alpha": r.choice([1, 0.5, 1e308]), "beta": r.choice([1, 2.0, 7e4])}
    return [(bias, dt), ((m, k), dt), ((k, n), dt)], scalars


def _linear(r):
    x = _shape(r, r.randint(1, 3), lo=1)
    n = r.randint(1, 4)
    dt = _dt(r, FLOATS)
    w = (n, x[-1] if r.random() < 0.9 else x[-1] + 1)
    ins = [(x, dt), (w, dt if r.random() < 0.9 else "float64")]
    if r.random() < 0.6:
        ins.append(((n if r.random() < 0.9 else n + 1,), dt))
    return ins, {}


def _conv(r):
    n, g = r.randint(1, 2), r.choice([1, 1, 2])
    c, o = g * r.randint(1, 2), g * r.randint(1, 2)
    k = r.randint(1, 3)
    h, w = r.randint(1, 7), r.randint(1, 7)
    dt = _dt(r, FLOATS + ["float64"])
    x = (n, c, h, w) if r.random() < 0.85 else (c, h, w)
    ins = [(x, dt), ((o, c // g if r.random() < 0.95 else c // g + 1, k, k), dt)]
    if r.random() < 0.5:
        ins.append(((o,), dt))
    return ins, {"stride": [r.randint(1, 3)] * 2, "padding": [r.randint(0, 2), r.randint(0, 2)],
                 "dilation": [r.randint(1, 2)] * 2, "groups": g}


def _pool(avg: bool) -> Gen:
    def gen(r):
        x = (r.randint(1, 2), r.randint(1, 3), r.randint(1, 8), r.randint(1, 8))
        if r.random() < 0.2:
            x = x[1:]
        k = [r.randint(1, 3), r.randint(1, 3)]
        a = {"kernel_size": k, "stride": r.choice([[], [1, 1], [2, 2], [2]]),
             "padding": [r.randint(0, 1), r.randint(0, 1)], "ceil_mode": r.random() < 0.4}
        if avg:
            a["count_include_pad"] = r.random() < 0.5
            if r.random() < 0.2:
                a["divisor_override"] = r.randint(1, 3)
        else:
            a["dilation"] = [r.randint(1, 2)] * 2
        return [(x, _dt(r, FLOATS + ["float64", "int64"]))], a
    return gen


def _adaptive(r):
    x = (r.randint(1, 2), r.randint(1, 3), r.randint(1, 8), r.randint(1, 8))
    return [(x, _dt(r, FLOATS + ["int64"]))], {"output_size": [r.randint(1, 4), r.randint(1, 4)]}


def _reduce(dim: bool, keep: bool = True, dtype: bool = True) -> Gen:
    def gen(r):
        s = _shape(r)
        a: dict = {}
        if dim:
            a["dim"] = r.choice([[], [_dim(r, len(s))], [_dim(r, len(s)), _dim(r, len(s))]])
        if keep:
            a["keepdim"] = r.random() < 0.5
        if dtype and r.random() < 0.3:
            a["dtype"] = "torch." + _dt(r, FLOATS + ["int64"])
        return [(s, _dt(r))], a
    return gen


def _softmax(r):
    s = _shape(r)
    a = {"dim": _dim(r, len(s))}
    if r.random() < 0.3:
        a["dtype"] = "torch." + _dt(r, FLOATS)
    return [(s, _dt(r, FLOATS + ["int64"]))], a


def _softmax_internal(r):
    s = _shape(r)
    return [(s, _dt(r, FLOATS))], {"dim": _dim(r, len(s)), "half_to_float": r.random() < 0.3}


def _layer_norm(r):
    s = _shape(r, r.randint(1, 3), lo=1)
    k = r.randint(1, len(s))
    ns = list(s[len(s) - k:]) if r.random() < 0.9 else [s[-1] + 1]
    dt = _dt(r, FLOATS)
    ins = [(s, dt)] + [(tuple(ns), dt)] * r.choice([0, 1, 2])
    return ins, {"normalized_shape": ns, "eps": 1e-5}


def _bn(r):
    c = r.randint(1, 3)
    x = (r.randint(1, 2), c, r.randint(1, 3), r.randint(1, 3))
    dt = _dt(r, FLOATS[:1] + ["float64"])
    p = ((c if r.random() < 0.95 else c + 1,), dt)
    return [(x, dt)] + [p] * r.choice([2, 4, 4]), {"eps": 1e-5, "momentum": 0.1}


def _embedding(r):
    w = (r.randint(1, 5), r.randint(1, 4))
    return [(w, _dt(r, FLOATS)), (_shape(r), r.choice(["int64", "int32", "float32"]))], {}


def _index_copy(r):
    s = _shape(r, r.randint(1, 4), lo=1)
    d = r.randrange(len(s))
    n = r.randint(0, s[d])
    src = list(s)
    src[d] = n if r.random() < 0.9 else n + 1
    dt = _dt(r, FLOATS)
    index = ((n,), r.choice(["int64", "int64", "int32"]))
    return [(s, dt), index, (tuple(src), dt)], {"dim": r.choice([d, d - len(s)])}


def _sdpa(r):
    b, h, lq, lk, e = r.randint(1, 2), r.choice([1, 2, 4]), r.randint(1, 4), r.randint(1, 4), r.choice([2, 4])
    hk = r.choice([h, 1]) if r.random() < 0.3 else h
    dt = _dt(r, FLOATS[:1] + ["float64"])
    ins = [((b, h, lq, e), dt), ((b, hk, lk, e), dt), ((b, hk, lk, r.choice([e, 3])), dt)]
    a: dict = {}
    if r.random() < 0.4:
        ins.append(((1, 1, lq, lk), r.choice([dt, "bool"])))
    elif r.random() < 0.3:
        a["is_causal"] = True
    if hk != h:
        a["enable_gqa"] = r.random() < 0.7
    if r.random() < 0.3:
        a["scale"] = 0.5
    return ins, a


def _factory(name: str) -> Gen:
    def gen(r):
        a: dict = {"size": [r.choice([0, 1, 2, 3]) for _ in range(r.randint(0, 3))]}
        if name == "full":
            a["fill_value"] = _scalar(r)
        if r.random() < 0.3:
            a["dtype"] = "torch." + _dt(r)
        return [], a
    return gen


def _arange(kind: str) -> Gen:
    def gen(r):
        num = lambda: r.choice([0, 1, 3, 5, -2, 2.5, 0.5])  # noqa: E731
        a: dict = {"end": num()}
        if kind != "default":
            a["start"] = num()
        if kind == "start_step":
            a["step"] = r.choice([1, 2, -1, 0.5, 3])
        if r.random() < 0.3:
            a["dtype"] = "torch." + _dt(r, FLOATS + ["int64"])
        return [], a
    return gen


def _assert(r):
    s = _shape(r)
    dt = _dt(r)
    return [(s, dt)], {"dtype": "torch." + r.choice([dt, dt, "float32"]), "size": list(s) if r.random() < 0.8 else
                       [*s, 1]}


# ---- the model zoo's ops -------------------------------------------------------------------------------------------


def _like(fill: bool) -> Gen:
    def gen(r):
        a: dict = {"fill_value": _scalar(r)} if fill else {}
        if r.random() < 0.4:
            a["dtype"] = _dtype_attr(r)
        return [(_shape(r), _dt(r))], a
    return gen


def _new(fill: bool) -> Gen:
    def gen(r):
        ins, a = _like(fill)(r)
        a["size"] = [r.choice([0, 1, 2, 3, -1]) if r.random() < 0.1 else r.choice([0, 1, 2, 3])
                     for _ in range(r.randint(0, 3))]
        return ins, a
    return gen


def _scalar_tensor(r):
    a: dict = {"s": _scalar(r) if r.random() < 0.8 else r.choice([300, -129, 70000, 1e39])}
    if r.random() < 0.5:
        a["dtype"] = _dtype_attr(r)
    return [], a


def _where_scalar(kind: str) -> Gen:
    def gen(r):
        s = _shape(r)
        cond = (_bshape(r, s), r.choice(["bool", "bool", "uint8", "float32"]))
        if kind == "Scalar":
            return [cond], {"self": _scalar(r), "other": _scalar(r)}
        return [cond, (s, _dt(r))], {"other" if kind == "ScalarOther" else "self": _scalar(r)}
    return gen


def _masked_fill_tensor(r):
    s = _shape(r)
    value = (r.choice([(), (), (1,)]), _dt(r))
    return [(s, _dt(r)), (_bshape(r, s), r.choice(["bool", "bool", "int64"])), value], {}


def _copy(r):
    s = _shape(r)
    return [(s, _dt(r)), (_bshape(r, s), _dt(r))], {}


def _arith_scalar(alpha: bool) -> Gen:
    def gen(r):
        ins, a = scalar_op("other")(r)
        if alpha and r.random() < 0.3:
            a["alpha"] = r.choice([2, 0.5, True])
        return ins, a
    return gen


def _div_scalar_mode(r):
    ins, a = scalar_op("other")(r)
    return ins, {**a, "rounding_mode": r.choice([None, "trunc", "floor"])}


def _pow_scalar_base(r):
    return [(_shape(r), _dt(r))], {"self": _scalar(r)}


def _rounding_decimals(r):
    return [(_shape(r), _dt(r))], {"decimals": r.choice([0, 1, 2, -1])}


def _roll(r):
    s = _shape(r)
    k = r.randint(0, 2)
    dims = [_dim(r, len(s)) for _ in range(k)]
    shifts = [r.randint(-3, 3) for _ in range(max(k, 1) + (1 if r.random() < 0.1 else 0))]
    a = {"shifts": shifts}
    if dims or r.random() < 0.5:
        a["dims"] = dims
    return [(s, _dt(r))], a


def _flip(r):
    s = _shape(r)
    return [(s, _dt(r))], {"dims": [_dim(r, len(s)) for _ in range(r.randint(0, 2))]}


def _group_norm(r):
    n, c = r.randint(1, 2), r.choice([1, 2, 4, 6])
    x = (n, c) + tuple(r.randint(1, 3) for _ in range(r.randint(0, 2)))
    if r.random() < 0.1:
        x = (c,)
    dt = _dt(r, FLOATS + ["float64", "int64"])
    ins = [(x, dt)] + [((c if r.random() < 0.95 else c + 1,), dt)] * r.choice([0, 2])
    return ins, {"num_groups": r.choice([1, 2, 3, c, 0, -1]), "eps": 1e-5}


def _gather(r):
    s = _shape(r, r.randint(0, 3), lo=1)
    ix = tuple(r.randint(0, n + (1 if r.random() < 0.1 else 0)) for n in s)
    if r.random() < 0.1:
        ix = ix + (1,)
    return [(s, _dt(r)), (ix, r.choice(["int64", "int64", "int32"]))], {"dim": _dim(r, len(s))}


def _index_select(r):
    s = _shape(r, r.randint(0, 3), lo=1)
    ix = r.choice([(r.randint(0, 4),), (r.randint(0, 4),), (), (2, 2)])
    return [(s, _dt(r)), (ix, r.choice(["int64", "int64", "int32", "float32"]))], {"dim": _dim(r, len(s))}


def _index_tensor(r):
    s = _shape(r, r.randint(1, 4), lo=1)
    k = r.randint(1, len(s))
    none = [r.random() < 0.4 for _ in range(k)]
    if all(none):
        none[r.randrange(k)] = False
    b = _shape(r, r.randint(0, 2), lo=1)
    ins = [(s, _dt(r))]
    d = 0
    out_none = []
    for is_none in none:
        if is_none:
            out_none.append(True)
            d += 1
            continue
        if r.random() < 0.15 and d < len(s):
            m = s[d:d + r.randint(1, 2)]
            ins.append((m, "bool"))
            d += len(m)
        else:
            ins.append((_bshape(r, b) if r.random() < 0.3 else b, r.choice(["int64", "int64", "int32", "float32"])))
            d += 1
        out_none.append(False)
    a: dict = {"_tensor_list_sizes": [len(ins) - 1]}
    if any(out_none) or r.random() < 0.5:
        a["_tensor_list_none_masks"] = [out_none]
    return ins, a


def _repeat(r):
    s = _shape(r)
    n = len(s) + r.choice([0, 0, 1, 2, -1])
    return [(s, _dt(r))], {"repeats": [r.choice([0, 1, 2, 3, -1]) if r.random() < 0.1 else r.choice([1, 2, 3])
                                       for _ in range(max(n, 0))]}


def _repeat_interleave(r):
    s = _shape(r)
    a: dict = {"repeats": r.choice([0, 1, 2, 3, -1])}
    if r.random() < 0.7:
        a["dim"] = _dim(r, len(s))
    return [(s, _dt(r))], a


def _stack(r):
    s = _shape(r)
    ins = [(s if r.random() < 0.9 else _bshape(r, s), _dt(r)) for _ in range(r.randint(1, 3))]
    return ins, {"dim": r.randint(-len(s) - 2, len(s) + 1), "_tensor_list_sizes": [len(ins)]}


def _pads(r, n: int, lo: int = -1) -> list[int]:
    return [r.choice([0, 1, 2, lo]) for _ in range(n)]


def _pad(r):
    s = _shape(r, r.randint(1, 4), lo=1)
    mode = r.choice(["constant", "constant", "reflect", "replicate", "circular", "wrap"])
    k = r.choice([1, 2, 3]) if mode != "constant" else r.randint(0, len(s))
    a: dict = {"pad": _pads(r, 2 * k + (1 if r.random() < 0.05 else 0)), "mode": mode}
    if r.random() < 0.3:
        a["value"] = r.choice([0.5, 1.0])
    return [(s, _dt(r, FLOATS + ["int64"]))], a


def _constant_pad_nd(r):
    s = _shape(r, r.randint(0, 3))
    return [(s, _dt(r))], {"pad": _pads(r, 2 * r.randint(0, len(s) + 1), -2), "value": _scalar(r)}


def _edge_pad(k: int) -> Gen:
    def gen(r):
        s = _shape(r, k + r.choice([1, 2, 2, 0]), lo=1)
        return [(s, _dt(r, FLOATS + ["int64", "bool"]))], {"padding": _pads(r, 2 * k, 0)}
    return gen


def _diff(r):
    s = _shape(r)
    d = _dim(r, len(s))
    ins = [(s, _dt(r))]
    for _ in range(r.choice([0, 0, 1, 2])):
        t = list(s)
        if t and -len(t) <= d < len(t):
            t[d] = r.randint(0, 2)
        ins.append((tuple(t), _dt(r) if r.random() < 0.3 else ins[0][1]))
    return ins, {"n": r.choice([0, 1, 1, 2, 3]), "dim": d}


def _diagonal(r):
    s = _shape(r, r.randint(1, 4))
    return [(s, _dt(r))], {"offset": r.randint(-3, 3), "dim1": _dim(r, len(s)), "dim2": _dim(r, len(s))}


def _cumsum(r):
    s = _shape(r)
    a = {"dim": _dim(r, len(s))}
    if r.random() < 0.3:
        a["dtype"] = _dtype_attr(r)
    return [(s, _dt(r))], a


def _topk(r):
    s = _shape(r)
    a = {"k": r.randint(0, 4)}
    if r.random() < 0.7:
        a["dim"] = _dim(r, len(s))
    return [(s, _dt(r))], a


def _one_dim_only(r):
    s = _shape(r)
    return [(s, _dt(r))], {"dim": _dim(r, len(s))}


def _one_dim(r):
    s = _shape(r)
    return [(s, _dt(r))], {"dim": _dim(r, len(s)), "keepdim": r.random() < 0.5}


def _opt_dim(listed: bool) -> Gen:
    def gen(r):
        s = _shape(r)
        a: dict = {"keepdim": r.random() < 0.5}
        if listed:
            a["dim"] = r.choice([None, [], [_dim(r, len(s))], [_dim(r, len(s)), _dim(r, len(s))]])
        else:
            a["dim"] = r.choice([None, _dim(r, len(s))])
        return [(s, _dt(r))], a
    return gen


def _var(kind: str) -> Gen:
    def gen(r):
        ins, a = _opt_dim(True)(r)
        if kind == "dim":
            a["unbiased"] = r.random() < 0.5
        elif r.random() < 0.5:
            a["correction"] = r.choice([0, 1, 2])
        return ins, a
    return gen


def _conv1d(string: bool) -> Gen:
    def gen(r):
        n, g = r.randint(1, 2), r.choice([1, 1, 2])
        c, o = g * r.randint(1, 2), g * r.randint(1, 2)
        k = r.randint(1, 3)
        x = (n, c, r.randint(1, 7)) if r.random() < 0.85 else (c, r.randint(1, 7))
        dt = _dt(r, FLOATS + ["float64"])
        ins = [(x, dt), ((o, c // g if r.random() < 0.95 else c // g + 1, k), dt)]
        if r.random() < 0.5:
            ins.append(((o,), dt))
        pad = r.choice(["same", "valid", "full"]) if string else [r.randint(0, 2)]
        return ins, {"stride": [r.choice([1, 1, 2])], "padding": pad, "dilation": [r.randint(1, 2)], "groups": g}
    return gen


def _conv2d_padding(r):
    ins, a = _conv(r)
    a["padding"] = r.choice(["same", "valid", "full"])
    if r.random() < 0.6:
        a["stride"] = [1, 1]
    return ins, a


def _baddbmm(r):
    b, m, k, n = r.randint(1, 3), r.randint(1, 4), r.randint(1, 4), r.randint(1, 4)
    dt = _dt(r, FLOATS[:1] + ["float64"])
    bias = r.choice([(b, m, n), (n,), (m, 1), (1, m, n), (m + 1, n)])
    return [(bias, dt), ((b, m, k), dt), ((b if r.random() < 0.9 else b + 1, k, n), dt)], {
        "alpha": r.choice([1, 0.5]), "beta": r.choice([1, 2.0])}


def _upsample(kind: str, vec: bool) -> Gen:
    def gen(r):
        x = (r.randint(1, 2), r.randint(1, 3), r.randint(1, 5), r.randint(1, 5))
        if r.random() < 0.1:
            x = x[1:]
        a: dict = {}
        if kind == "bilinear":
            a["align_corners"] = r.random() < 0.5
        size = [r.choice([0, 1, 3, 8]), r.choice([1, 3, 8])]
        if vec:
            pick = r.random()
            a["output_size"] = size if pick < 0.5 or pick > 0.9 else None
            a["scale_factors"] = [r.choice([0.5, 1.0, 2.0, 1.7, 0.1]) for _ in range(2)] if pick >= 0.5 else None
        else:
            a["output_size"] = size
        return [(x, _dt(r, FLOATS + ["float64", "uint8", "int64"]))], a
    return gen


def _adaptive1d(r):
    x = (r.randint(1, 2), r.randint(1, 3), r.randint(1, 8))
    if r.random() < 0.2:
        x = x[1:]
    return [(x, _dt(r, FLOATS + ["int64"]))], {"output_size": [r.randint(1, 4)]}


def _avg_pool1d(r):
    x = (r.randint(1, 2), r.randint(1, 3), r.randint(1, 8))
    if r.random() < 0.2:
        x = x[1:]
    k = r.randint(1, 3)
    return [(x, _dt(r, FLOATS + ["float64", "int64"]))], {
        "kernel_size": [k], "stride": r.choice([[], [1], [2]]), "padding": [r.randint(0, 1)],
        "ceil_mode": r.random() < 0.4, "count_include_pad": r.random() < 0.5}


# ---- decomposed ops (npu_compiler/decompose/) and the no-op pass's ops ----------------------------------------------


def _one_element(r):
    return (), r.choice(FLOATS + ["bool", "int64"])


def _asserts(op: str) -> Gen:
    def gen(r):
        a = {"assert_msg": "m"} if op != "_assert_async.default" else {}
        if op.startswith("_functional"):
            ins = [] if "scalar" in op else [_one_element(r) if r.random() < 0.9 else ((2,), "bool")]
            ins.append(((r.choice([0, 1, 2]),), _dt(r)))
            if "scalar" in op:
                a["self"] = r.choice([True, 1, 2.5])
            return ins, a
        if op == "_assert_scalar.default":
            return [], {**a, "self": r.choice([True, 1, 2.5, False, 0])}
        return [_one_element(r) if r.random() < 0.9 else ((2,), "bool")], a
    return gen


def _eval_dropout(r):
    return [(_shape(r), _dt(r, FLOATS))], {"p": r.choice([0.0, 0.5]), "train": False}


def _clamp_tensor(r):
    s = _shape(r)
    ins = [(s, _dt(r))] + [(_bshape(r, s), _dt(r)) for _ in range(r.choice([1, 2, 2]))]
    return ins, {}


def _prelu(r):
    s = _shape(r, r.randint(0, 4), lo=1)
    dt = _dt(r, FLOATS + ["int64"])
    c = s[1] if len(s) >= 2 else 1
    w = r.choice([(c,), (1,), (), (c + 1,), (c, 1)])
    return [(s, dt), (w, dt if r.random() < 0.9 else _dt(r, FLOATS))], {}


def _fill_tensor(r):
    return [(_shape(r), _dt(r)), (() if r.random() < 0.9 else (1,), _dt(r))], {}


def _unflatten(r):
    s = _shape(r, r.randint(1, 3), lo=1)
    d = r.randrange(len(s))
    n = s[d]
    sizes = r.choice([[n], [1, n], [n, 1], [-1, 1], [2, -1], [n, 2], []])
    return [(s, _dt(r))], {"dim": r.choice([d, d - len(s)]), "sizes": sizes}


def _expand_as(r):
    s = _shape(r)
    return [(s, _dt(r)), (_bshape(r, s) if r.random() < 0.3 else (r.choice([1, 2]),) + s, _dt(r))], {}


def _meshgrid(indexing: bool) -> Gen:
    def gen(r):
        dt = _dt(r)
        ins = [(r.choice([(), (1,), (2,), (3,), (2, 2)]), dt if r.random() < 0.95 else _dt(r))
               for _ in range(r.randint(1, 3))]
        a: dict = {"_tensor_list_sizes": [len(ins)]}
        if indexing:
            a["indexing"] = r.choice(["ij", "xy"])
        return ins, a
    return gen


def _vector_norm(r):
    ins, a = _opt_dim(True)(r)
    ins = [(ins[0][0], _dt(r, FLOATS + ["float64", "int64"]))]
    a["ord"] = r.choice([2, 1, 0, 3, 0.5, -1, float("inf"), float("-inf")])
    if r.random() < 0.3:
        a["dtype"] = "torch." + _dt(r, FLOATS + ["float64"])
    return ins, a


def _norm_except_dim(r):
    s = _shape(r, r.randint(1, 3), lo=1)
    return [(s, _dt(r, FLOATS))], {"pow": 2, "dim": r.choice([-1, 0, len(s) - 1, r.randrange(len(s))])}


def _weight_norm(interface: bool) -> Gen:
    def gen(r):
        s = _shape(r, r.randint(1, 3), lo=1)
        d = r.choice([0, len(s) - 1, r.randrange(len(s))] + ([] if interface else [-1]))
        g = () if d == -1 else tuple(n if i == d else 1 for i, n in enumerate(s))
        dt = _dt(r, FLOATS)
        return [(s, dt), (g, dt if r.random() < 0.85 else _dt(r, FLOATS))], {"dim": d}
    return gen


def _index_add(r):
    s = _shape(r, r.randint(1, 3), lo=1)
    d = r.randrange(len(s))
    n = r.randint(1, 3)
    src = list(s)
    src[d] = n if r.random() < 0.9 else n + 1
    dt = _dt(r, FLOATS + ["int64", "int32"])
    a = {"dim": r.choice([d, d - len(s)])}
    if r.random() < 0.4:
        a["alpha"] = r.choice([2, 0.5, -1])
    return [(s, dt), ((n,), r.choice(["int64", "int32"])), (tuple(src), dt if r.random() < 0.9 else _dt(r))], a


def _einsum(r):
    eq, shapes = r.choice([
        ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ii->i", [(3, 3)]), ("ij,jk", [(2, 3), (3, 4)]),
        ("...ij,...jk->...ik", [(2, 3, 4), (4, 1)]), ("i,j->ij", [(3,), (2,)]), ("ijk->", [(2, 3, 1)]),
        ("bij,bjk->bik", [(1, 3, 4), (2, 4, 5)]), ("ij,ij->ij", [(3, 1), (1, 4)]), ("ij,jk->ik", [(2, 3), (4, 5)]),
        ("ii", [(2, 3)]), ("i->ii", [(3,)]), ("a...b,c", [(2, 3, 4), (5,)]), ("ab,bc,cd->ad", [(2, 3), (3, 4), (4, 2)]),
        ("iij->ji", [(3, 3, 2)]), ("ij->k", [(2, 3)]), ("Ab,ba", [(2, 3), (3, 2)])])
    dt = _dt(r, FLOATS + ["float64", "int64"])
    return [(sh, dt) for sh in shapes], {"equation": eq, "_tensor_list_sizes": [len(shapes)]}


def _recurrent(kind: str) -> Gen:
    gates = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}[kind]

    def gen(r):
        t, b, i, h = r.randint(1, 3), r.randint(1, 2), r.randint(1, 3), r.randint(1, 3)
        layers, dirs, bias = r.choice([1, 1, 2]), r.choice([1, 2]), r.random() < 0.6
        proj = kind == "lstm" and r.random() < 0.3
        out = h - 1 if proj and h > 1 else h
        proj = proj and out < h
        dt = _dt(r, FLOATS)
        params = []
        for layer in range(layers):
            width = i if layer == 0 else dirs * out
            for _ in range(dirs):
                params += [((gates * h, width), dt), ((gates * h, out), dt)]
                params += [((gates * h,), dt)] * (2 * bias)
                params += [((out, h), dt)] if proj else []
        if r.random() < 0.1:
            params = params[:-1]
        batch_first = r.random() < 0.3
        x = (b, t, i) if batch_first else (t, b, i)
        hx = [((layers * dirs, b, out), dt)] + ([((layers * dirs, b, h), dt)] if kind == "lstm" else [])
        if r.random() < 0.1 and b > 1:  # (ATen broadcasts an input batch of 1 to the state's; nn.LSTM refuses)
            hx[0] = ((layers * dirs, b + 1, out), dt)
        a = {"has_biases": bias, "num_layers": layers, "dropout": 0.0, "train": False, "bidirectional": dirs == 2,
             "batch_first": batch_first,
             "_tensor_list_sizes": [len(hx), len(params)] if kind == "lstm" else [len(params)]}
        return [(x, dt)] + hx + params, a
    return gen


def _cell(kind: str) -> Gen:
    gates = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}[kind]

    def gen(r):
        b, i, h = r.randint(1, 2), r.randint(1, 3), r.randint(1, 3)
        dt = _dt(r, FLOATS)
        hx = [((b, h), dt)] * (2 if kind == "lstm" else 1)
        ws = [((gates * h, i), dt), ((gates * h, h if r.random() < 0.9 else h + 1), dt)]
        ws += [((gates * h,), dt)] * r.choice([0, 2])
        a = {"_tensor_list_sizes": [2]} if kind == "lstm" else {}
        return [((b, i), dt)] + hx + ws, a
    return gen


def _select_scatter(r):
    s = _shape(r, r.randint(1, 3), lo=1)
    d = r.randrange(len(s))
    src = s[:d] + s[d + 1:]
    if r.random() < 0.1:
        src = src + (2,)
    return [(s, _dt(r)), (src, _dt(r))], {"dim": r.choice([d, d - len(s)]), "index": r.randint(-s[d] - 1, s[d])}


def _slice_scatter(r):
    s = _shape(r, r.randint(1, 3), lo=1)
    d = r.randrange(len(s))
    start, end, step = r.choice([None, 0, 1, -1]), r.choice([None, 2, -1, 9]), r.choice([1, 1, 2, 3])
    from npu_compiler.tensor import slice_bounds

    lo, hi = slice_bounds(start, end, s[d])
    n = -(-(hi - lo) // step) + (1 if r.random() < 0.1 else 0)
    return [(s, _dt(r)), (s[:d] + (n,) + s[d + 1:], _dt(r))], {"dim": d, "start": start, "end": end, "step": step}


def _diagonal_scatter(r):
    s = _shape(r, r.randint(2, 3), lo=1)
    off, d1, d2 = r.randint(-2, 2), r.randrange(len(s)), r.randrange(len(s))
    n = min(s[d1], s[d2] - off) if off >= 0 else min(s[d1] + off, s[d2])
    rest = tuple(x for i, x in enumerate(s) if i not in (d1, d2))
    return [(s, _dt(r)), (rest + (max(n, 0),), _dt(r))], {"offset": off, "dim1": d1, "dim2": d2}


def _empty(strided: bool) -> Gen:
    def gen(r):
        size = [r.choice([0, 1, 2, 3]) for _ in range(r.randint(0, 3))]
        a: dict = {"size": size}
        if strided:
            a["stride"] = [1] * (len(size) if r.random() < 0.9 else len(size) + 1)
        if r.random() < 0.5:
            a["dtype"] = _dtype_attr(r)
        return [], a
    return gen


def _new_empty(strided: bool) -> Gen:
    def gen(r):
        ins, a = _empty(strided)(r)
        return [(_shape(r), _dt(r))], a
    return gen


def _native_layer_norm(r):
    ins, a = _layer_norm(r)
    while len(ins) == 2:  # (weight and bias are both given or both not: one alone is ambiguous in the IR)
        ins, a = _layer_norm(r)
    return ins, a


def _native_group_norm(r):
    n, g = r.randint(1, 2), r.choice([1, 2])
    c = g * r.randint(1, 2)
    s = (n, c) + _shape(r, r.randint(0, 2), lo=1)
    hxw = math.prod(s[2:])
    dt = _dt(r, FLOATS)
    ins = [(s, dt)] + [((c,), dt)] * r.choice([0, 2])
    return ins, {"N": n, "C": c if r.random() < 0.95 else c + 1, "HxW": hxw, "group": g, "eps": 1e-5}


def _bn_legit(stats: bool) -> Gen:
    def gen(r):
        c = r.randint(1, 3)
        x = (r.randint(1, 2), c, r.randint(1, 3), r.randint(1, 3))
        dt = _dt(r, FLOATS)
        p = ((c,), "float32" if dt != "float32" else dt)
        ins = [(x, dt)] + [((c,), dt)] * r.choice([0, 2]) + ([p, p] if stats else [])
        return ins, {"training": r.random() < 0.5 if stats else True, "momentum": 0.1, "eps": 1e-5}
    return gen


def _sort(stable: bool) -> Gen:
    def gen(r):
        a = {"dim": _dim(r, len(s := _shape(r))), "descending": r.random() < 0.5}
        if stable:
            a["stable"] = r.choice([None, True, False])
        return [(s, _dt(r))], a
    return gen


def _pool3d(avg: bool) -> Gen:
    def gen(r):
        x = (r.randint(1, 2), r.randint(1, 2), r.randint(1, 4), r.randint(1, 5), r.randint(1, 5))
        if r.random() < 0.2:
            x = x[1:]
        a = {"kernel_size": [r.randint(1, 3) for _ in range(3)], "stride": r.choice([[], [1, 1, 1], [2, 1, 2], [2]]),
             "padding": [r.randint(0, 1) for _ in range(3)], "ceil_mode": r.random() < 0.4}
        if avg:
            a["count_include_pad"] = r.random() < 0.5
        else:
            a["dilation"] = [r.randint(1, 2)] * 3
        return [(x, _dt(r, ["float32", "float64"] if avg else FLOATS + ["float64"]))], a
    return gen


def _adaptive3d(r):
    x = (r.randint(1, 2), r.randint(1, 3), r.randint(1, 4), r.randint(1, 5), r.randint(1, 5))
    return [(x if r.random() < 0.8 else x[1:], _dt(r, ["float32", "float64"]))], {
        "output_size": [r.randint(1, 4) for _ in range(3)]}


def _convolution(op: str) -> Gen:
    nd = {"convolution.default": None, "conv3d.default": 3, "conv_transpose1d.default": 1,
          "conv_transpose2d.input": 2, "conv_transpose3d.input": 3}[op]

    def gen(r):
        k = nd or r.randint(1, 3)
        transposed = "transpose" in op or (op == "convolution.default" and r.random() < 0.5)
        g = r.choice([1, 1, 2])
        c, o = g * r.randint(1, 2), g * r.randint(1, 2)
        x = (r.randint(1, 2), c) + tuple(r.randint(1, 4) for _ in range(k))
        if op != "convolution.default" and r.random() < 0.2:
            x = x[1:]
        ks = tuple(r.randint(1, 3) for _ in range(k))
        w = ((c, o // g) if transposed else (o, c // g if r.random() < 0.95 else c // g + 1)) + ks
        dt = _dt(r, FLOATS + ["float64"])
        ins = [(x, dt), (w, dt)] + ([((o,), dt)] if r.random() < 0.5 else [])
        a = {"stride": [r.randint(1, 2) for _ in range(k)], "padding": [r.randint(0, 1) for _ in range(k)],
             "dilation": [r.randint(1, 2) for _ in range(k)], "groups": g}
        if transposed:
            a["output_padding"] = [r.choice([0, 0, 1]) for _ in range(k)]
        if op == "convolution.default":
            a["transposed"] = transposed
            a.setdefault("output_padding", [0] * k)
        return ins, a
    return gen


def _col2im(r):
    c, kh, kw = r.randint(1, 2), r.randint(1, 2), r.randint(1, 3)
    h, w, s, p, d = r.randint(2, 5), r.randint(2, 5), [r.randint(1, 2), 1], [r.randint(0, 1), 0], [1, r.randint(1, 2)]
    lh = (h + 2 * p[0] - d[0] * (kh - 1) - 1) // s[0] + 1
    lw = (w + 2 * p[1] - d[1] * (kw - 1) - 1) // s[1] + 1
    x = (c * kh * kw, max(lh, 1) * max(lw, 1) + (1 if r.random() < 0.1 else 0))
    if r.random() < 0.7:
        x = (r.randint(1, 2),) + x
    return [(x, _dt(r, ["float32", "float64"]))], {"output_size": [h, w], "kernel_size": [kh, kw], "dilation": d,
                                                   "padding": p, "stride": s}


def _scatter_op(kind: str) -> Gen:
    def gen(r):
        s = _shape(r, r.randint(1, 3), lo=1)
        d = r.randrange(len(s))
        ix = tuple(r.randint(1, n) if i != d else r.randint(1, 3) for i, n in enumerate(s))
        if r.random() < 0.1:
            ix = ix[:-1] + (ix[-1] + 1,)
        dt = _dt(r, FLOATS + ["int64"])
        ins = [(s, dt), (ix, "int64" if r.random() < 0.9 else "int32")]
        a: dict = {"dim": r.choice([d, d - len(s)])}
        if kind == "value":
            a["value"] = r.choice([0.5, 2, -1])
        else:
            ins.append((tuple(n + r.choice([0, 0, 1]) for n in ix), dt if r.random() < 0.9 else _dt(r)))
        if kind == "reduce":
            a["reduce"] = r.choice(["sum", "prod", "mean", "amax", "amin", "max"])
            a["include_self"] = r.random() < 0.5
        return ins, a
    return gen


def _masked_scatter(r):
    s = _shape(r, r.randint(1, 3), lo=1)
    dt = _dt(r)
    m = _bshape(r, s) if r.random() < 0.3 else s
    try:
        n = math.prod(torch.broadcast_shapes(s, m))
    except RuntimeError:
        n = math.prod(s)
    return [(s, dt), (m, r.choice(["bool", "bool", "int64"])), ((n + r.randint(0, 2),), dt if r.random() < 0.9 else
                                                                  _dt(r))], {}


def _index_put(r):
    s = _shape(r, r.randint(1, 3), lo=1)
    dt = _dt(r, FLOATS + ["int64"])
    if r.random() < 0.3:  # a bool mask and one value
        return [(s, dt), (s, "bool"), ((), dt)], {"accumulate": r.random() < 0.5, "_tensor_list_sizes": [1]}
    k = r.randint(1, len(s))
    slots = [False] * k
    if k > 1 and r.random() < 0.4:
        slots[0] = True
    n = r.randint(1, 3)
    idx = [((n,), r.choice(["int64", "int32"])) for m in slots if not m]
    rest = s[k:]
    lead = [s[0]] if slots[0] else []
    values = tuple(lead) + (n,) + tuple(rest) if r.random() < 0.8 else tuple(rest)
    a = {"accumulate": r.random() < 0.5, "_tensor_list_sizes": [len(idx)]}
    if any(slots):
        a["_tensor_list_none_masks"] = [slots]
    return [(s, dt)] + idx + [(values, dt)], a


def _as_strided(r):
    s = _shape(r, r.randint(0, 3), lo=1)
    size = [r.randint(0, 3) for _ in range(r.randint(0, 3))]
    a = {"size": size, "stride": [r.randint(0, 3) for _ in size]}
    if r.random() < 0.4:
        a["storage_offset"] = r.randint(0, 2)
    return [(s, _dt(r))], a


def _cdist(r):
    m = r.randint(1, 3)
    b = tuple(r.randint(1, 2) for _ in range(r.randint(0, 1)))
    dt = _dt(r, FLOATS[:1] + ["float64"])
    return [(b + (r.randint(1, 3), m), dt), (b + (r.randint(1, 3), m if r.random() < 0.9 else m + 1), dt)], {
        "p": r.choice([0.0, 1.0, 2.0, 3.0])}


def _pdist(r):
    return [((r.randint(1, 4), r.randint(1, 3)), _dt(r, ["float32", "float64"]))], {"p": r.choice([1.0, 2.0, 0.5])}


def _bag(op: str) -> Gen:
    def gen(r):
        n, b = r.randint(1, 5), r.randint(1, 3)
        last = r.random() < 0.3
        a = {"mode": r.choice([0, 1, 2]), "include_last_offset": last}
        if op != "embedding_bag.default":
            a.update(scale_grad_by_freq=False, sparse=False, padding_idx=r.choice([-1, 0, 1]))
            if op == "embedding_bag.padding_idx" and r.random() < 0.3:
                a["padding_idx"] = None
        return [((6, 3), _dt(r, FLOATS[:1] + ["float64"])), ((n,), "int64"), ((b + last,), "int64")], a
    return gen


def _grid_sampler(r):
    n, c = r.randint(1, 2), r.randint(1, 2)
    dt = _dt(r, ["float32", "float64"])
    return [((n, c, r.randint(1, 4), r.randint(1, 4)), dt), ((n, r.randint(1, 3), r.randint(1, 3), 2), dt)], {
        "interpolation_mode": r.randint(0, 2), "padding_mode": r.randint(0, 2), "align_corners": r.random() < 0.5}


# ---- composite ops of real models: views, reductions, activations, resampling (decompose/views.py, reductions.py,
# pooling.py, normalization.py, aliases.py; expr/aten_table.py) ------------------------------------------------------


def _movedim(r):
    s = _shape(r)
    return [(s, _dt(r))], {"source": _dim(r, len(s)), "destination": _dim(r, len(s))}


def _narrow(r):
    s = _shape(r, r.randint(0, 3))
    n = s[-1] if s else 0
    return [(s, _dt(r))], {"dim": _dim(r, len(s)), "start": r.randint(-n - 1, n + 1), "length": r.randint(-1, 3)}


def _as_other(r):
    s = _shape(r, lo=1)
    other = r.choice([s, (math.prod(s),), tuple(reversed(s)), (math.prod(s) + 1,)])
    return [(s, _dt(r)), (other, _dt(r))], {}


def _image(r, rank_lo: int = 3) -> tuple[int, ...]:
    return tuple(r.choice([1, 2, 3, 4, 6, 8]) for _ in range(r.randint(rank_lo - 1, 5)))


def _factor(name: str) -> Gen:
    return lambda r: ([(_image(r), _dt(r))], {name: r.choice([1, 2, 3, 0])})


def _triangle(r):
    return [(_shape(r, r.randint(1, 4)), _dt(r))], {"diagonal": r.randint(-3, 3)}


def _count_nonzero(listed: bool) -> Gen:
    def gen(r):
        s = _shape(r)
        if listed:
            return [(s, _dt(r))], {"dim": r.choice([[], [_dim(r, len(s))], [_dim(r, len(s)), _dim(r, len(s))]])}
        return [(s, _dt(r))], {"dim": r.choice([None, _dim(r, len(s))])}
    return gen


def _aminmax(r):
    s = _shape(r)
    return [(s, _dt(r))], {"dim": r.choice([None, _dim(r, len(s))]), "keepdim": r.random() < 0.5}


def _logsumexp(r):
    s = _shape(r)
    return [(s, _dt(r))], {"dim": r.choice([[], [_dim(r, len(s))], [_dim(r, len(s)), _dim(r, len(s))]]),
                           "keepdim": r.random() < 0.5}


def _argsort(stable: bool) -> Gen:
    def gen(r):
        s = _shape(r)
        a = {"dim": _dim(r, len(s)), "descending": r.random() < 0.5}
        if stable:
            a["stable"] = r.random() < 0.5
        return [(s, _dt(r))], a
    return gen


def _glu(r):
    s = _shape(r)
    return [(s, _dt(r))], {"dim": _dim(r, len(s))}


def _rms_norm(r):
    s = _shape(r, r.randint(1, 3), lo=1)
    k = r.randint(1, len(s))
    ns = list(s[len(s) - k:]) if r.random() < 0.85 else [s[-1] + 1]
    ins = [(s, _dt(r, FLOATS + ["float64", "int64"]))]
    if r.random() < 0.6:
        ins.append((tuple(ns), ins[0][1] if r.random() < 0.8 else _dt(r, FLOATS)))
    a: dict = {"normalized_shape": ns}
    if r.random() < 0.5:
        a["eps"] = r.choice([1e-6, 1e-5])
    return ins, a


def _instance_norm(r):
    x = (r.randint(1, 2), r.randint(1, 3), r.randint(1, 4), r.randint(1, 3))[:r.randint(3, 4)]
    dt = _dt(r, FLOATS + ["float64"])
    c = x[1]
    stats = r.random() < 0.5  # (with weight and bias: three inputs with the running statistics are read positionally)
    ins = [(x, dt)] + [((c,), dt)] * (2 if r.random() < 0.5 or stats else 0) + [((c,), dt)] * (2 if stats else 0)
    return ins, {"use_input_stats": not stats or r.random() < 0.5, "momentum": 0.1, "eps": 1e-5,
                 "cudnn_enabled": False}


def _one_hot(r):
    s = _shape(r)
    return [(s, r.choice(["int64", "int64", "int32"]))], {"num_classes": r.choice([2, 3, 5])}  # (the data are 1s)


def _pair_of_floats(r):
    s = _shape(r, r.randint(1, 3), lo=1)
    dt = _dt(r, FLOATS + ["float64"])
    return [(s, dt), (_bshape(r, s), dt if r.random() < 0.9 else _dt(r, FLOATS))], {}


def _cosine_similarity(r):
    ins, _ = _pair_of_floats(r)
    return ins, {"dim": _dim(r, len(ins[0][0])), "eps": 1e-8}


def _pairwise_distance(r):
    ins, _ = _pair_of_floats(r)
    return ins, {"p": r.choice([2.0, 1.0, 3.0]), "eps": 1e-6, "keepdim": r.random() < 0.5}


def _outer(r):
    return [((r.randint(0, 4),), _dt(r)), ((r.randint(0, 4),) if r.random() < 0.9 else (2, 2), _dt(r))], {}


def _max_pool1d(r):
    x = (r.randint(1, 2), r.randint(1, 3), r.randint(1, 8))
    if r.random() < 0.2:
        x = x[1:]
    k = r.randint(1, 3)
    return [(x, _dt(r, FLOATS + ["int64"]))], {
        "kernel_size": [k], "stride": r.choice([[], [1], [2]]), "padding": [r.randint(0, 1)],
        "dilation": [r.randint(1, 2)], "ceil_mode": r.random() < 0.4}


def _adaptive_max(nd: int) -> Gen:
    def gen(r):
        x = (r.randint(1, 2), r.randint(1, 3)) + tuple(r.randint(1, 6) for _ in range(nd))
        if r.random() < 0.2:
            x = x[1:]
        return [(x, _dt(r, FLOATS + ["int64"]))], {"output_size": [r.randint(1, 4) for _ in range(nd)]}
    return gen


def _upsample_nd(nd: int, linear: bool = False) -> Gen:
    def gen(r):
        x = (r.randint(1, 2), r.randint(1, 3)) + tuple(r.randint(1, 5) for _ in range(nd))
        if r.random() < 0.1:
            x = x[1:]
        a: dict = {}
        if linear:
            a["align_corners"] = r.random() < 0.5
        if r.random() < 0.5:
            a["output_size"], a["scale_factors"] = [r.choice([1, 3, 8]) for _ in range(nd)], None
        else:
            a["output_size"], a["scale_factors"] = None, [r.choice([0.5, 1.0, 2.0, 1.7]) for _ in range(nd)]
        return [(x, _dt(r, FLOATS + ["float64", "uint8"]))], a
    return gen


def _im2col(r):
    x = (r.randint(1, 2), r.randint(1, 3), r.randint(1, 6), r.randint(1, 6))
    if r.random() < 0.2:
        x = x[1:]
    return [(x, _dt(r, FLOATS + ["int64"]))], {
        "kernel_size": [r.randint(1, 3), r.randint(1, 3)], "dilation": [r.randint(1, 2)] * 2,
        "padding": [r.randint(0, 1)] * 2, "stride": [r.randint(1, 2), r.randint(1, 2)]}


def _addc(r):
    s = _shape(r)
    ins = [(s, _dt(r)), (_bshape(r, s), _dt(r)), (_bshape(r, s), _dt(r))]
    return ins, ({"value": r.choice([1, 0.5, -2])} if r.random() < 0.5 else {})


def _lerp(tensor_weight: bool) -> Gen:
    def gen(r):
        s = _shape(r)
        dt = _dt(r)
        ins = [(s, dt), (_bshape(r, s), dt if r.random() < 0.9 else _dt(r))]
        if tensor_weight:
            return ins + [(_bshape(r, s), dt)], {}
        return ins, {"weight": r.choice([0.3, 0.7, 2])}
    return gen


def _threshold(r):
    return [(_shape(r), _dt(r))], {"threshold": r.choice([0, 0.5, -1, 300]), "value": r.choice([0, 2.5, -7, 1e5])}


def _as_alias(gen: Gen, names: dict[str, str]) -> Gen:
    """An alias op's operands: its target's, the attributes under the alias's names."""
    back = {v: k for k, v in names.items()}
    return lambda r: (lambda c: (c[0], {back.get(k, k): v for k, v in c[1].items()}))(gen(r))


DECOMPOSED_CASES: dict[str, Gen] = {
    "as_strided.default": _as_strided,
    "_cdist_forward.default": lambda r: (lambda c: (c[0], {**c[1], "compute_mode": None}))(_cdist(r)),
    "cdist.default": _cdist,
    "_pdist_forward.default": _pdist,
    "pdist.default": _pdist,
    **{op: _bag(op) for op in ("_embedding_bag.default", "embedding_bag.default", "embedding_bag.padding_idx")},
    "grid_sampler_2d.default": _grid_sampler,
    "grid_sampler.default": _grid_sampler,
    **{op: scalar_op("other") for op in ("bitwise_and.Scalar", "bitwise_or.Scalar", "bitwise_xor.Scalar",
                                          "__and__.Scalar", "__or__.Scalar", "__xor__.Scalar")},
    "scatter.src": _scatter_op("src"),
    "scatter.value": _scatter_op("value"),
    "scatter_add.default": _scatter_op("add"),
    "scatter_reduce.two": _scatter_op("reduce"),
    "masked_scatter.default": _masked_scatter,
    "index_put.default": _index_put,
    **{op: _convolution(op) for op in ("convolution.default", "conv3d.default", "conv_transpose1d.default",
                                       "conv_transpose2d.input", "conv_transpose3d.input")},
    "col2im.default": _col2im,
    "max_pool2d_with_indices.default": _pool(False),
    "max_pool3d_with_indices.default": _pool3d(False),
    "avg_pool3d.default": _pool3d(True),
    "_adaptive_avg_pool3d.default": _adaptive3d,
    "adaptive_avg_pool3d.default": _adaptive3d,
    "native_layer_norm.default": _native_layer_norm,
    "native_group_norm.default": _native_group_norm,
    "_native_batch_norm_legit.default": _bn_legit(True),
    "_native_batch_norm_legit.no_stats": _bn_legit(False),
    "prod.default": _reduce(False, False),
    "prod.dim_int": lambda r: (lambda c: (c[0], {**c[1], "dim": _dim(r, len(c[0][0][0]))}))(_reduce(False)(r)),
    "sort.default": _sort(False),
    "sort.stable": _sort(True),
    **{f"{op}.default": unary() for op in ("atan", "asin", "acos", "tan", "sinh", "cosh", "asinh", "acosh", "atanh")},
    "atan2.default": lambda r: (lambda c: ([i for i in c[0]] + ([(_shape(r), _dt(r))] if len(c[0]) == 1 else []),
                                           {}))(binary()(r)),
    "select_scatter.default": _select_scatter,
    "slice_scatter.default": _slice_scatter,
    "diagonal_scatter.default": _diagonal_scatter,
    "zero.default": unary(),
    "empty.memory_format": _empty(False),
    "empty_strided.default": _empty(True),
    "empty_like.default": _like(False),
    "new_empty.default": _new_empty(False),
    "new_empty_strided.default": _new_empty(True),
    **{op: binary() for op in ("fmod.Tensor", "remainder.Tensor", "floor_divide.default")},
    **{op: scalar_op("other") for op in ("fmod.Scalar", "remainder.Scalar", "floor_divide.Scalar")},
    "remainder.Scalar_Tensor": lambda r: ([(_shape(r), _dt(r))], {"self": _scalar(r)}),
    **{op: _asserts(op) for op in ("_assert_async.default", "_assert_async.msg", "_assert_scalar.default",
                                   "_functional_assert_async.msg", "_functional_assert_scalar.default")},
    **{op: _eval_dropout for op in ("feature_dropout.default", "alpha_dropout.default",
                                    "feature_alpha_dropout.default", "native_dropout.default")},
    "detach_copy.default": unary(),
    "clamp_min.default": scalar_op("min"),
    "clamp_max.default": scalar_op("max"),
    "clamp_min.Tensor": binary(("self", "min")),
    "clamp_max.Tensor": binary(("self", "max")),
    "clamp.Tensor": _clamp_tensor,
    "prelu.default": _prelu,
    "fill.Tensor": _fill_tensor,
    "unflatten.int": _unflatten,
    "expand_as.default": _expand_as,
    "unbind.int": _one_dim_only,
    **{op: unary() for op in ("numpy_T.default", "mT.default", "mH.default", "adjoint.default", "matrix_H.default")},
    "meshgrid.default": _meshgrid(False),
    "meshgrid.indexing": _meshgrid(True),
    "linalg_vector_norm.default": _vector_norm,
    "norm_except_dim.default": _norm_except_dim,
    "_weight_norm.default": _weight_norm(False),
    "_weight_norm_interface.default": _weight_norm(True),
    "index_add.default": _index_add,
    "einsum.default": _einsum,
    **{f"{k}.input": _recurrent(k) for k in ("lstm", "gru", "rnn_tanh", "rnn_relu")},
    **{f"{k}_cell.default": _cell(k) for k in ("lstm", "gru", "rnn_tanh", "rnn_relu")},
    "movedim.int": _movedim,
    "narrow.default": _narrow,
    "view_as.default": _as_other,
    "reshape_as.default": _as_other,
    "ravel.default": unary(),
    "positive.default": unary(),
    "square.default": unary(),
    "pixel_shuffle.default": _factor("upscale_factor"),
    "pixel_unshuffle.default": _factor("downscale_factor"),
    "channel_shuffle.default": _factor("groups"),
    "tril.default": _triangle,
    "triu.default": _triangle,
    "all.default": unary(),
    "all.dim": _one_dim,
    "all.dims": _opt_dim(True),
    "max.default": unary(),
    "min.default": unary(),
    "aminmax.default": _aminmax,
    "logsumexp.default": _logsumexp,
    "std.correction": _var("correction"),
    "std.dim": _var("dim"),
    "var_mean.correction": _var("correction"),
    "var_mean.dim": _var("dim"),
    "std_mean.correction": _var("correction"),
    "std_mean.dim": _var("dim"),
    "count_nonzero.default": _count_nonzero(False),
    "count_nonzero.dim_IntList": _count_nonzero(True),
    "argsort.default": _argsort(False),
    "argsort.stable": _argsort(True),
    "glu.default": _glu,
    "rms_norm.default": _rms_norm,
    "instance_norm.default": _instance_norm,
    "one_hot.default": _one_hot,
    "cosine_similarity.default": _cosine_similarity,
    "pairwise_distance.default": _pairwise_distance,
    "outer.default": _outer,
    "max_pool1d.default": _max_pool1d,
    "adaptive_max_pool1d.default": _adaptive_max(1),
    "adaptive_max_pool2d.default": _adaptive_max(2),
    "upsample_nearest1d.vec": _upsample_nd(1),
    "upsample_nearest3d.vec": _upsample_nd(3),
    "_upsample_nearest_exact1d.vec": _upsample_nd(1),
    "_upsample_nearest_exact2d.vec": _upsample_nd(2),
    "_upsample_nearest_exact3d.vec": _upsample_nd(3),
    "upsample_linear1d.vec": _upsample_nd(1, True),
    "im2col.default": _im2col,
    **{op: unary() for op in ("hardswish.default", "hardsigmoid.default", "relu6.default", "mish.default",
                              "selu.default", "log_sigmoid.default", "nan_to_num.default", "exp2.default")},
    "celu.default": unary(alpha=lambda r: r.choice([1.0, 0.5, 2.0])),
    "hardshrink.default": unary(lambd=lambda r: r.choice([0.5, 1.0, 0.0])),
    "softshrink.default": unary(lambd=lambda r: r.choice([0.5, 1.0, 0.0])),
    "logit.default": unary(eps=lambda r: r.choice([None, 1e-6, 0.1])),
    "threshold.default": _threshold,
    "addcmul.default": _addc,
    "addcdiv.default": _addc,
    "lerp.Scalar": _lerp(False),
    "lerp.Tensor": _lerp(True),
    "hypot.default": binary(),
    "xlogy.Tensor": binary(),
}


ZOO_CASES: dict[str, Gen] = {
    **{op: unary() for op in ("floor.default", "ceil.default", "trunc.default", "round.default", "sign.default",
                              "bitwise_not.default", "log1p.default", "expm1.default", "log2.default",
                              "log10.default", "isnan.default", "isinf.default")},
    "round.decimals": _rounding_decimals,
    "softplus.default": unary(beta=lambda r: r.choice([1, 2, 0.5]), threshold=lambda r: r.choice([20, 1])),
    "elu.default": unary(alpha=lambda r: r.choice([1, 0.5]), scale=lambda r: r.choice([1, 2]),
                         input_scale=lambda r: r.choice([1, 0.5])),
    "_log_softmax.default": _softmax_internal,
    "fill.Scalar": scalar_op("value"),
    "copy.default": _copy,
    "where.ScalarOther": _where_scalar("ScalarOther"),
    "where.ScalarSelf": _where_scalar("ScalarSelf"),
    "where.Scalar": _where_scalar("Scalar"),
    "masked_fill.Tensor": _masked_fill_tensor,
    **{op: binary() for op in ("logical_and.default", "logical_or.default", "logical_xor.default",
                               "bitwise_and.Tensor", "bitwise_or.Tensor", "bitwise_xor.Tensor", "__and__.Tensor",
                               "__or__.Tensor", "__xor__.Tensor", "min.other", "max.other")},
    "add.Scalar": _arith_scalar(True),
    "sub.Scalar": _arith_scalar(True),
    "mul.Scalar": _arith_scalar(False),
    "div.Scalar": _arith_scalar(False),
    "div.Scalar_mode": _div_scalar_mode,
    "pow.Scalar": _pow_scalar_base,
    "full_like.default": _like(True),
    "zeros_like.default": _like(False),
    "ones_like.default": _like(False),
    "new_full.default": _new(True),
    "new_zeros.default": _new(False),
    "new_ones.default": _new(False),
    "scalar_tensor.default": _scalar_tensor,
    "gather.default": _gather,
    "index_select.default": _index_select,
    "index.Tensor": _index_tensor,
    "repeat.default": _repeat,
    "repeat_interleave.self_int": _repeat_interleave,
    "stack.default": _stack,
    "pad.default": _pad,
    "constant_pad_nd.default": _constant_pad_nd,
    "reflection_pad1d.default": _edge_pad(1),
    "reflection_pad2d.default": _edge_pad(2),
    "reflection_pad3d.default": _edge_pad(3),
    "replication_pad2d.default": _edge_pad(2),
    "replication_pad3d.default": _edge_pad(3),
    "roll.default": _roll,
    "flip.default": _flip,
    "diff.default": _diff,
    "diagonal.default": _diagonal,
    "cumsum.default": _cumsum,
    "topk.default": _topk,
    "amin.default": _reduce(True, dtype=False),
    "any.default": unary(),
    "any.dim": _one_dim,
    "any.dims": _opt_dim(True),
    "var.correction": _var("correction"),
    "var.dim": _var("dim"),
    "argmax.default": _opt_dim(False),
    "argmin.default": _opt_dim(False),
    "max.dim": _one_dim,
    "min.dim": _one_dim,
    "group_norm.default": _group_norm,
    "conv1d.default": _conv1d(False),
    "conv1d.padding": _conv1d(True),
    "conv2d.padding": _conv2d_padding,
    "baddbmm.default": _baddbmm,
    "upsample_bilinear2d.vec": _upsample("bilinear", True),
    "upsample_nearest2d.vec": _upsample("nearest", True),
    "upsample_bilinear2d.default": _upsample("bilinear", False),
    "upsample_nearest2d.default": _upsample("nearest", False),
    "adaptive_avg_pool1d.default": _adaptive1d,
    "_adaptive_avg_pool2d.default": _adaptive,
    "avg_pool1d.default": _avg_pool1d,
}


def quantize(per_channel: bool, dequantize: bool) -> Gen:
    """PT2E's quantize/dequantize: valid parameters (a quantizer wrote them), the input's dtype sometimes not the
    declared one (ATen refuses that for a dequantize)."""
    def gen(r):
        dtype, lo, hi = r.choice([("int8", -128, 127), ("uint8", 0, 255), ("int8", -127, 127)])
        shape = _shape(r, r.randint(1, 3), lo=1)
        src = (dtype if r.random() < 0.8 else r.choice(["int8", "uint8", "int32"])) if dequantize else \
            r.choice(["float32", "float32", "bfloat16"])
        attrs = {"quant_min": lo, "quant_max": hi, "dtype": dtype}
        if not per_channel:
            return [(shape, src)], {**attrs, "scale": r.choice([0.01, 0.5, 3.0]), "zero_point": r.randint(lo, hi)}
        axis = r.randrange(len(shape))
        n = shape[axis] if r.random() < 0.9 else shape[axis] + 1
        return [(shape, src), ((n,), "float32"), ((n,), "int64")], {**attrs, "axis": axis}
    return gen


CASES: dict[str, Gen] = {
    "quantized_decomposed.quantize_per_tensor.default": quantize(False, False),
    "quantized_decomposed.dequantize_per_tensor.default": quantize(False, True),
    "quantized_decomposed.quantize_per_channel.default": quantize(True, False),
    "quantized_decomposed.dequantize_per_channel.default": quantize(True, True),
    **{op: unary() for op in ("abs.default", "relu.default", "neg.default", "rsqrt.default", "sqrt.default",
                              "exp.default", "log.default", "sin.default", "cos.default", "tanh.default",
                              "sigmoid.default", "erf.default", "reciprocal.default", "silu.default",
                              "logical_not.default", "clone.default", "alias.default", "detach.default",
                              "contiguous.default", "lift_fresh_copy.default")},
    "gelu.default": unary(approximate=lambda r: r.choice(["none", "tanh"])),
    "hardtanh.default": unary(min_val=lambda r: r.choice([-1, -0.5, -1e5]), max_val=lambda r: r.choice([1, 2.5, 300])),
    "leaky_relu.default": unary(negative_slope=lambda r: r.choice([0.01, 0.2, 1, 1e5, 1e308])),
    "clamp.default": unary(min=lambda r: r.choice([None, 0, -0.5, -1e39]), max=lambda r: r.choice([None, 1, 2.5, 300])),
    "dropout.default": lambda r: ([(_shape(r), _dt(r, FLOATS))], {"p": 0.0, "train": False}),
    "to.dtype": unary(dtype=_dtype_attr),
    "to.device": lambda r: ([(_shape(r), _dt(r))], {"device": "cpu", "dtype": _dtype_attr(r)}),
    "to.dtype_layout": unary(dtype=_dtype_attr),
    "_to_copy.default": unary(dtype=_dtype_attr),
    "type_as.default": lambda r: ([(_shape(r), _dt(r)), (_shape(r), _dt(r))], {}),
    **{op: binary() for op in ("add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor", "maximum.default",
                               "minimum.default", "rsub.Tensor", "eq.Tensor", "ne.Tensor", "lt.Tensor", "le.Tensor",
                               "gt.Tensor", "ge.Tensor")},
    "div.Tensor_mode": lambda r: (lambda c: (c[0], {**c[1], "rounding_mode": r.choice([None, "trunc", "floor"])}))(
        binary()(r)),
    "pow.Tensor_Tensor": binary(("self", "exponent")),
    **{op: scalar_op("other") for op in ("eq.Scalar", "ne.Scalar", "lt.Scalar", "le.Scalar", "gt.Scalar",
                                          "ge.Scalar", "rsub.Scalar")},
    "pow.Tensor_Scalar": scalar_op("exponent"),
    "where.self": _where,
    "masked_fill.Scalar": _masked_fill,
    "view.default": _view("size"),
    "_unsafe_view.default": _view("size"),
    "reshape.default": _view("shape"),
    "flatten.using_ints": _flatten,
    "unsqueeze.default": _unsqueeze,
    "squeeze.default": unary(),
    "squeeze.dim": _squeeze_dim,
    "squeeze.dims": _squeeze_dims,
    "transpose.int": _transpose,
    "t.default": unary(),
    "permute.default": _permute,
    "expand.default": _expand,
    "slice.Tensor": _slice,
    "select.int": _select,
    "split.Tensor": _split,
    "split_with_sizes.default": _split_sizes,
    "chunk.default": _chunk,
    "cat.default": _cat,
    "matmul.default": _mat,
    "mm.default": _mm,
    "bmm.default": _bmm,
    "addmm.default": _addmm,
    "linear.default": _linear,
    "conv2d.default": _conv,
    "max_pool2d.default": _pool(False),
    "avg_pool2d.default": _pool(True),
    "adaptive_avg_pool2d.default": _adaptive,
    "mean.default": _reduce(False, False),
    "sum.default": _reduce(False, False),
    "mean.dim": _reduce(True),
    "sum.dim_IntList": _reduce(True),
    "amax.default": _reduce(True, dtype=False),
    "softmax.int": _softmax,
    "log_softmax.int": _softmax,
    "_softmax.default": _softmax_internal,
    "layer_norm.default": _layer_norm,
    "batch_norm.default": lambda r: (lambda c: (c[0], {**c[1], "training": False, "cudnn_enabled": True}))(_bn(r)),
    "_native_batch_norm_legit_no_training.default": _bn,
    "embedding.default": _embedding,
    "index_copy.default": _index_copy,
    "scaled_dot_product_attention.default": _sdpa,
    "full.default": _factory("full"),
    "zeros.default": _factory("zeros"),
    "ones.default": _factory("ones"),
    "arange.default": _arange("default"),
    "arange.start": _arange("start"),
    "arange.start_step": _arange("start_step"),
    "_assert_tensor_metadata.default": _assert,
    **ZOO_CASES,
    **DECOMPOSED_CASES,
}

CASES.update({alias: _as_alias(CASES[target], names) for alias, (target, names) in ALIASES.items()})


# ---- the reference: ATen, arguments bound by name from PyTorch's own schema ------------------------------------

_TORCH = {n: getattr(torch, n) for n in DTYPES}

# Where the reader is stricter than ATen on purpose (it refuses what ATen computes): op -> the refusal's words.
STRICTER = {
    # ATen's CPU kernel reads the first C entries of longer per-channel parameters; no export writes that
    "_native_batch_norm_legit_no_training.default": "per-channel parameters",
    "batch_norm.default": "per-channel parameters",
    # averaging integers: ATen divides in integer arithmetic, the compiler's pooling averages in fp32
    "avg_pool2d.default": "floating-point",
    "avg_pool1d.default": "floating-point",
    # ATen lets a negative repeat through when the tensor is empty (nothing is repeated); the reader never does
    "repeat.default": "negative entry",
    # per-channel quantization broadcasts a channel dim of 1 to its scales in ATen; no quantizer writes that
    "quantized_decomposed.quantize_per_channel.default": "channels along axis",
    "quantized_decomposed.dequantize_per_channel.default": "channels along axis",
    # torch_ir drops the absent bound of a one-bound clamp.Tensor: which bound is lost, so the reader refuses it
    "clamp.Tensor": "does not say whether",
    # ATen's result dtype for integer einsums depends on its contraction path
    "einsum.default": "floating-point operands",
    # ATen multiplies by a weight of another dtype, rounding the product to the input's (an export never mixes them)
    "rms_norm.default": "the input",
    # a transposed convolution with no output rows: some of ATen's kernels give an empty tensor, others refuse
    **{op: "smaller than the kernel" for op in ("convolution.default", "conv_transpose1d.default",
                                                "conv_transpose2d.input", "conv_transpose3d.input")},
}


def _make(shape: tuple[int, ...], dtype: str, role: int, op: str) -> torch.Tensor:
    dt = _TORCH[dtype]
    if op == "index_copy.default" and role == 1:
        return torch.arange(shape[0]).to(dt) if shape else torch.zeros((), dtype=dt)
    if op in ("gather.default", "index_select.default", "index.Tensor", "index_add.default", "scatter.src",
              "scatter.value", "scatter_add.default", "scatter_reduce.two", "index_put.default") and role >= 1 \
            and dt != torch.bool and (op not in ("index_add.default", "scatter.src", "scatter_add.default",
                                                 "scatter_reduce.two") or role == 1):
        return torch.zeros(shape, dtype=dt)  # position 0: in range wherever the indexed dim is not empty
    if op == "masked_fill.Tensor" and role == 2:
        return torch.ones(shape, dtype=dt)  # the value's data, which must fit self's dtype: the reader cannot see it
    if dt.is_floating_point:
        return torch.randn(shape).to(dt)
    if op == "embedding.default":
        return torch.zeros(shape, dtype=dt)
    return torch.ones(shape, dtype=dt)  # nonzero: an integer division by zero is a data error, not a type error


def reference(op: str, ins: list[tuple[tuple[int, ...], str]], attrs: dict) -> list[tuple[tuple[int, ...], str]] | None:
    tensors = [_make(s, d, j, op) for j, (s, d) in enumerate(ins)]
    try:
        outs = run_node(f"aten.{op}", tensors, attrs)
    except ReferenceError:
        return None
    return [(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in outs]


def one_node_ir(op: str, ins, attrs: dict, outs) -> dict:
    return {
        "model_name": "m", "graph_inputs": [{"name": f"i{j}", "shape": list(s), "dtype": d} for j, (s, d) in
                                            enumerate(ins)],
        # an op without outputs (a metadata assert) in a graph that returns its first input
        "graph_outputs": [{"name": f"o{j}", "shape": list(s), "dtype": d} for j, (s, d) in enumerate(outs)]
        or [{"name": "i0", "shape": list(ins[0][0]), "dtype": ins[0][1]}],
        "weights": [], "weight_name_mapping": {},
        "nodes": [{"name": "n", "op_type": f"aten.{op}", "attrs": attrs,
                   "inputs": [{"name": f"i{j}", "shape": list(s), "dtype": d, "producer_node": f"i{j}",
                               "producer_output_idx": 0} for j, (s, d) in enumerate(ins)],
                   "outputs": [{"name": f"o{j}", "shape": list(s), "dtype": d} for j, (s, d) in enumerate(outs)]}],
    }


def _accepts(ir: dict) -> Exception | None:
    try:
        read_ir(ir)
    except (IRFormatError, ConstraintError) as e:
        return e
    return None


def _wrong(outs, r: random.Random, op: str):
    """The same outputs with one shape or dtype changed (batch norm's saved statistics may be [0] or [C])."""
    outs = [list(o) for o in outs]
    j = 0 if op.startswith("_native_batch_norm") else r.randrange(len(outs))
    s, d = outs[j]
    if s and r.random() < 0.5:
        s = list(s)
        s[r.randrange(len(s))] += 1
        outs[j][0] = tuple(s)
    else:
        outs[j][1] = r.choice([x for x in DTYPES if x != d])
    return [tuple(o) for o in outs]


N_CASES = 60


@pytest.mark.parametrize("op", sorted(CASES))
def test_rule_agrees_with_aten(op: str) -> None:
    r = random.Random(f"infer:{op}")
    problems = []
    for i in range(N_CASES):
        ins, attrs = CASES[op](r)
        ref = reference(op, ins, attrs)
        if ref is None:
            # ATen refuses: so must the reader (declaring any output at all)
            # (the declared output is invented: a refusal for not matching it means the rule took the operands)
            err = _accepts(one_node_ir(op, ins, attrs, [((1,), "float32")]))
            if err is None or "the op produces" in str(err):
                problems.append(f"case {i}: ATen refuses {ins} {attrs}, the reader accepts the operands")
            continue
        if not ref and op != "_assert_tensor_metadata.default":
            continue
        err = _accepts(one_node_ir(op, ins, attrs, ref))
        if err is not None and op in STRICTER and STRICTER[op] in str(err):
            continue
        if err is not None and any(0 in shape for shape, _ in ins) and "tensor" in str(err):
            continue  # ATen runs no kernel on an empty tensor, and skips the kernel's dtype checks with it
        if err is not None:
            problems.append(f"case {i}: ATen gives {ref} for {ins} {attrs}; the reader refuses: {err}")
            continue
        if ref:
            wrong = _wrong(ref, r, op)
            if _accepts(one_node_ir(op, ins, attrs, wrong)) is None:
                problems.append(f"case {i}: declared {wrong} instead of {ref} for {ins} {attrs}; the reader accepts")
    assert not problems, f"{op}:\n" + "\n".join(problems[:8])


def test_schema_table_matches_aten() -> None:
    """The reader's schema table (npu_compiler/ir/schema.py) says what ATen says: argument names in order, which
    are tensors, and which have defaults (with the same values)."""
    from npu_compiler.ir.schema import MISSING, SCHEMAS

    problems = []
    for op, s in sorted(SCHEMAS.items()):
        if op == "getitem":
            continue
        theirs = resolve(op)._schema.arguments
        if [a.name for a in s.args] != [a.name for a in theirs]:
            problems.append(f"{op}: arguments {[a.name for a in s.args]}, ATen {[a.name for a in theirs]}")
            continue
        for mine, a in zip(s.args, theirs):
            if mine.is_tensor != ("Tensor" in str(a.type)):
                problems.append(f"{op}.{a.name}: tensor-ness differs ({mine.type} vs {a.type})")
            if (mine.default is MISSING) != (not a.has_default_value()):
                theirs_default = repr(a.default_value) if a.has_default_value() else "none"
                problems.append(f"{op}.{a.name}: default {mine.default!r}, ATen {theirs_default}")
            elif a.has_default_value() and a.default_value is not None and not isinstance(a.default_value, str):
                want = a.default_value
                got = mine.default
                if isinstance(got, list) and not isinstance(want, list | tuple):
                    want = [want] * len(got)
                if list(want) != list(got) if isinstance(got, list) else float(want) != float(got):
                    problems.append(f"{op}.{a.name}: default {got!r}, ATen {a.default_value!r}")
    assert not problems, "\n".join(problems)
