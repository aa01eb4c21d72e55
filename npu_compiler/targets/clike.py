"""The renderer base of C-like kernel languages (CUDA C now, WGSL next): the walk over an expression tree, common
subexpressions, casts, where each value is computed (per row, per element, inside a reduction), the reduction
scaffolding and the launch shape. A language adds a `Language` (its types, literals, loads and stores, statements,
thread indices, block reduction and kernel wrapper) and its prelude; nothing here is specific to one of them.

A generated kernel runs in one of three shapes:
- elementwise: one thread per output element, a grid-stride loop over the flat output index;
- serial reduction: the same, each thread running its (small) reductions alone;
- rows: one block per row (the output dims before the row dims; a row of one element when `row_dims` is 0); the
  block's threads reduce cooperatively, every thread gets the results, then they share out the row's elements.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..dtypes import HALF_DTYPES, INT_DTYPES
from ..errors import NPUCompileError
from ..expr import nodes as X
from ..tensor import memory_order

if TYPE_CHECKING:
    from ..kernels import KernelCall
    from ..tensor import TensorRef

SERIAL_REDUCE_MAX = 32  # a reduction this small (with no row) runs inside one thread per output element
# ... and one up to this size whose reads step through memory along the output, not along the reduction (a global
# average pool over channels-last activations), where the outputs are enough to fill the GPU: threads of one output
# would each read a different line, one thread an output reads the lines its neighbours read (ResNet-50's pool at
# batch 64 on the H100: 82 us for 13 MB with a warp an output)
SERIAL_STRIDED_REDUCE_MAX = 4096
# a one-thread reduction of at most this many values whose body reads whole vectors once written out (a channels-last
# pool's window: each position's gather a run of 8 channels) is written out so that it takes the 16-byte form
# (`_unrolled`). On the H100, ResNet-50's 3x3 max pool at batch 64: 71.7 -> 54.0 us, the outputs the same to the bit
UNROLL_REDUCE_MAX = 16
SERIAL_MIN_OUTPUTS = 32768
ELEMENTWISE_BLOCK = 256

OUTER, ROW, RED = 1, 2, 4  # what a value depends on: the row's index, the element's index in the row, the reduction


@dataclass
class Launch:
    """How the runtime launches one source: grid (blocks or workgroups per dim), threads per block, dynamic shared
    memory, the pointer arguments in order (each ("out", i) or ("arg", i): the base of that buffer; ("maps", 0): where
    the runtime put the launch's `tensor_maps`), and whether it should start early (`early`)."""

    grid: tuple[int, int, int]
    block: int
    ptrs: list[tuple[str, int]]
    smem: int = 0
    # work before the wait for the launch before it (weights, L2 prefetches) that pays off when this launch starts
    # early: the launch before it then lets it launch before waiting itself (cuda: target._early_triggers)
    early: bool = False
    # cuda: the tensor maps (Hopper's tensor memory accelerator) the runtime encodes over the launch's buffers once it
    # knows their addresses, 128 bytes each, in order, in device memory: each {"ref": ("arg" or "out", i), "offset":
    # elements, "dtype", "dims": (inner, outer) elements, "pitch": elements between outer rows, "box": (inner, outer)
    # elements a copy}, the 128-byte swizzle, zero fill past the edges
    tensor_maps: tuple = ()


def ptrs_of(k: KernelCall) -> list[tuple[str, int]]:
    """A launch's pointer arguments for a record's buffers: its outputs, then its arguments, in order."""
    return [("out", i) for i in range(len(k.writes))] + [("arg", i) for i in range(len(k.args))]


class Language:
    """What a C-like language supplies. Types: every float computes in a float register (`reg`), integers in the
    language's integer register, bools as bool; storage types are the buffer's own."""

    name = ""
    kernel_name = "npu_kernel"
    max_grid = 65535
    max_block = 256  # threads per block a row kernel may take (WebGPU's guaranteed workgroup size)
    # threads of one warp (wavefront, subgroup): a row or reduction block is at least this wide, so that a block
    # reduction's shuffles span whole warps (HIP on CDNA: 64)
    warp_width = 32
    # elements a thread of a large elementwise kernel works on at once, a grid stride apart (each warp's accesses stay
    # coalesced): a thread's loads of them are in flight together. 1: one at a time
    elementwise_ilp = 1
    unroll_hint = ""  # a line before a loop the compiler should unroll, or none
    # a line before a row kernel's loops over a row (strided by the block: a trip count unknown at compile time), so
    # that a thread's loads of several elements issue together, or none
    row_loop_hint = ""
    # a 32-bit signed integer type a gather's index arithmetic may compute in where every value of it provably fits
    # (`_Narrower`), or none: the language's int64 arithmetic throughout
    int32_type = ""
    # bytes of one vector load or store (`vector_load`, `vector_store`), or 0: an elementwise kernel over 2-byte
    # elements then moves this many bytes at a time where its loads and its store allow (`_vector_width`)
    vector_bytes = 0

    def reg(self, dtype: str) -> str: raise NotImplementedError
    def storage(self, dtype: str) -> str: raise NotImplementedError
    def index_type(self, extent: int) -> str: raise NotImplementedError
    def literal(self, value: float | int | bool, dtype: str) -> str: raise NotImplementedError
    def load(self, arg: str, index: str, dtype: str) -> str: raise NotImplementedError
    def store(self, out: str, index: str, dtype: str, value: str, value_dtype: str) -> str: raise NotImplementedError
    def cast(self, x: str, src: str, dst: str) -> str: raise NotImplementedError
    def unary(self, op: str, dtype: str, a: str) -> str: raise NotImplementedError
    def binary(self, op: str, dtype: str, a: str, b: str) -> str: raise NotImplementedError
    def select(self, cond: str, a: str, b: str) -> str: raise NotImplementedError
    def to_index(self, x: str, ityp: str) -> str: raise NotImplementedError
    def index_value(self, var: str, ityp: str) -> str: raise NotImplementedError
    def index_literal(self, value: int, ityp: str) -> str: return str(value)

    # statements
    def decl(self, name: str, ty: str, value: str, mutable: bool = False) -> str: raise NotImplementedError
    def assign(self, name: str, value: str) -> str: return f"{name} = {value};"
    def loop(self, var: str, ty: str, start: str, end: str, step: str) -> str: raise NotImplementedError
    def if_(self, cond: str) -> str: return f"if ({cond}) {{"
    def end(self) -> str: return "}"

    # threads
    block_id = thread_id = block_dim = grid_dim = ""

    def reduce_init(self, op: str, dtype: str) -> str: raise NotImplementedError
    def combine(self, op: str, dtype: str, acc: str, v: str) -> str: raise NotImplementedError
    def block_reduce(self, acc: str, op: str, dtype: str, kernel: KernelText) -> list[str]: raise NotImplementedError

    def kernel(self, text: KernelText) -> str:
        """The whole source of one kernel."""
        raise NotImplementedError

    def vector_load(self, arg: str, index: str, dtype: str, out: str) -> list[str]:
        """Statements declaring `out`, an array of the register values of the `vector_bytes` of `dtype` elements at
        `arg[index]` (aligned)."""
        raise NotImplementedError

    def vector_store(self, out: str, index: str, dtype: str, values: list[str], value_dtype: str) -> list[str]:
        """Statements storing `values` (of `value_dtype`) as `dtype` elements at `out[index]` in one vector store."""
        raise NotImplementedError

    def vector_load_if(self, arg: str, index: str, dtype: str, out: str, cond: str, fill: str) -> list[str]:
        """As `vector_load`, but only where `cond` holds; `fill` (a literal) in every element where it does not."""
        raise NotImplementedError


@dataclass
class KernelText:
    """What a renderer has gathered for one kernel: parameters (name, dtype, written), threads per block, body
    lines, and anything the language must declare around the kernel (helpers, shared memory)."""

    params: list[tuple[str, str, bool]]
    block: int
    body: list[str] = field(default_factory=list)
    helpers: set[str] = field(default_factory=set)
    shared: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (type, count)
    restrict: bool = True


@dataclass
class Scope:
    """Statements of one loop body and the values computed in it. Values of enclosing scopes are visible."""

    indent: str
    parent: Scope | None = None
    lines: list[str] = field(default_factory=list)
    names: dict[tuple, str] = field(default_factory=dict)

    def find(self, key: tuple) -> str | None:
        s: Scope | None = self
        while s is not None:
            if key in s.names:
                return s.names[key]
            s = s.parent
        return None


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def is_flat_map(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Does the map equal the contiguous row-major one (ignoring size-1 dims)? Then the flat index is the offset."""
    return all(n == 1 or s == c for n, s, c in zip(shape, strides, contiguous_strides(shape)))


def affine(terms: list[tuple[str, int]], offset: int = 0) -> str:
    """`offset + sum(var * stride)` with zero strides dropped."""
    parts = [str(offset)] if offset else []
    for var, stride in terms:
        if stride == 0:
            continue
        parts.append(var if stride == 1 else f"{var} * {stride}")
    return " + ".join(parts) if parts else "0"


def pad4(ref: TensorRef, target: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape and strides left-padded to rank 4 (missing leading dims have size 1)."""
    lead = 4 - len(ref.shape)
    if lead < 0:
        raise NPUCompileError(f"{target} target: expected a tensor of rank <= 4, got shape {list(ref.shape)}")
    return (1,) * lead + tuple(ref.shape), (0,) * lead + tuple(ref.strides)


@dataclass
class AttentionGeometry:
    """What every renderer of an attention record starts from: its operands, the sizes (left-padded to [b, h, t, d]),
    the grouped-query heads, and the index maps over the loop variables bi, hi, ti, kvh, j, dd (`v_at(j)` with the
    key index a renderer names)."""

    q: TensorRef
    k: TensorRef
    v: TensorRef
    out: TensorRef
    mask: TensorRef | None
    pos: TensorRef | None
    b: int
    h: int
    t: int
    d: int
    kv_heads: int
    kv_len: int
    v_dim: int
    group: int
    q_at: str
    k_at: str
    o_at: str
    m_at: str
    target: str

    def v_at(self, j: str) -> str:
        _, vs = pad4(self.v, self.target)
        return affine([("bi", vs[0]), ("kvh", vs[1]), (j, vs[2]), ("dd", vs[3])], self.v.offset)


def attention_geometry(k: KernelCall, target: str) -> AttentionGeometry:
    p = k.spec
    q, kk, v = k.args[:3]
    mask = k.args[3] if p.mask != "none" else None
    out = k.outs[0]
    (b, h, t, d), qs = pad4(q, target)
    _, ks = pad4(kk, target)
    _, os_ = pad4(out, target)
    if h % p.kv_heads:
        raise NPUCompileError(f"kernel {k.name}: {h} query heads are not a multiple of {p.kv_heads} kv heads")
    m_at = ""
    if mask is not None:
        _, ms = pad4(mask, target)
        m_at = affine([("bi", ms[0]), ("hi", ms[1]), ("ti", ms[2]), ("j", ms[3])], mask.offset)
    return AttentionGeometry(
        q, kk, v, out, mask, k.args[-1] if p.valid_len else None, b, h, t, d, p.kv_heads, p.kv_len, p.v_dim,
        h // p.kv_heads,
        q_at=affine([("bi", qs[0]), ("hi", qs[1]), ("ti", qs[2]), ("dd", qs[3])], q.offset),
        k_at=affine([("bi", ks[0]), ("kvh", ks[1]), ("j", ks[2]), ("dd", ks[3])], kk.offset),
        o_at=affine([("bi", os_[0]), ("hi", os_[1]), ("ti", os_[2]), ("dd", os_[3])], out.offset),
        m_at=m_at, target=target)


def max_extent(shape: tuple[int, ...], strides: tuple[int, ...], offset: int = 0) -> int:
    if any(n == 0 for n in shape):
        return offset
    return offset + sum((n - 1) * abs(s) for n, s in zip(shape, strides)) + 1


def grid_for(n: int, block: int, cap: int) -> int:
    """Blocks for a grid-stride loop over n items (capped: the loop covers the rest)."""
    return max(1, min(cap, -(-n // block)))


FEW_ROWS = 128  # fewer rows than this leave most of a large GPU's SMs idle


def _row_block(n: int, n_rows: int, cap: int) -> int:
    """Threads per row. With few rows (a decode step's norms: one row of 1536) the row's latency is the kernel's
    time, so the row spreads over up to `cap` threads and each thread's chain of dependent loads stays short."""
    block = 32 if n <= 256 else 128 if n <= 2048 else 256
    if n_rows < FEW_ROWS:
        while block * 2 <= min(cap, n):
            block *= 2
    return block


def _reduce_block(n: int) -> int:
    if n <= 1024:
        return 32
    if n <= 8192:
        return 128
    return 256


class ExprRenderer:
    """Renders expression values into scopes. Output indices are `o{d}`, reduction indices `r{d}`; the flat output
    index `i` stands in for a load whose map is the contiguous one (elementwise shapes only)."""

    def __init__(self, lang: Language, text: KernelText, arg_names: list[str], arg_dtypes: list[str],
                 out_shape: tuple[int, ...], ityp: str, reduce_shape: tuple[int, ...] = (), row_dims: int = 0,
                 block_reduce: bool = False, flat_index: bool = False, acc: str | Sequence[str] | None = None,
                 prefix: str = "", loop_hint: str = "") -> None:
        self.lang = lang
        self.prefix = prefix
        self.loop_hint = loop_hint  # a line before each reduction loop (a language's unroll pragma), or none
        self.text = text
        self.arg_names = arg_names
        self.arg_dtypes = arg_dtypes
        self.out_shape = out_shape
        self.outer_rank = len(out_shape) - row_dims
        self.ityp = ityp
        self.reduce_shape = reduce_shape
        self.block_reduce = block_reduce
        self.flat_index = flat_index
        self.acc = [acc] if isinstance(acc, str) else acc  # the value of each Acc group
        self.count = 0
        self.deps: dict[int, int] = {}
        # structural keys by node identity, each subtree's built once; the node is held so that its id stays its own
        self.keys: dict[int, tuple[X.Expr, tuple]] = {}
        self.row_scope: Scope | None = None
        self.elem_scope: Scope | None = None
        self.reduce_width = 0  # a block reduction's values a thread loads at once (`_row_vector_width`); 0: one

    def fresh(self, prefix: str = "t") -> str:
        self.count += 1
        return f"{self.prefix}{prefix}{self.count}"

    # ---- dependencies: where a value can be computed -------------------------------------------------------------
    def dep(self, e: X.Expr) -> int:
        hit = self.deps.get(id(e))
        if hit is not None:
            return hit
        for n in X.walk(e, self.deps):
            if isinstance(n, X.Load):
                d = 0
                for k, s in enumerate(n.strides):
                    if s:
                        d |= OUTER if k < self.outer_rank else ROW
                if n.rstrides:
                    d |= RED
            elif isinstance(n, X.Index):
                d = OUTER if n.dim < self.outer_rank else ROW
            elif isinstance(n, X.RIndex):
                d = RED
            elif isinstance(n, X.Acc):
                d = OUTER | ROW
            else:
                d = 0
                for c in X.children(n):
                    d |= self.deps[id(c)]
                if isinstance(n, X.Reduce):
                    d &= ~RED
            self.deps[id(n)] = d
        return self.deps[id(e)]

    def key(self, e: X.Expr) -> tuple:
        hit = self.keys.get(id(e))
        if hit is None:
            for n in X.walk(e, self.keys):
                self.keys[id(n)] = (n, _key(n, tuple(self.keys[id(c)][1] for c in X.children(n))))
            hit = self.keys[id(e)]
        return hit[1]

    def scope_for(self, e: X.Expr, current: Scope) -> Scope:
        """The outermost scope a value can live in: the row's when it depends on the row index at most."""
        if self.row_scope is None or self.dep(e) & (ROW | RED):
            return current
        return self.row_scope

    # ---- the walk -----------------------------------------------------------------------------------------------
    def emit(self, e: X.Expr, scope: Scope, in_reduce: bool = False) -> str:
        key = self.key(e)
        target = self.scope_for(e, scope)
        hit = target.find(key) if target is scope else (scope.find(key) or target.find(key))
        if hit is not None:
            return hit
        if isinstance(e, X.Reduce):
            name = self._reduce(e, target)
        elif isinstance(e, X.Gather):
            name = self._gather(e, target, in_reduce)
        elif isinstance(e, X.Const):
            return self.lang.literal(e.value, e.dtype)
        else:
            text = self._text(e, target, in_reduce)
            name = self.fresh()
            target.lines.append(target.indent + self.lang.decl(name, self.lang.reg(e.dtype), text))
        target.names[key] = name
        return name

    def _text(self, e: X.Expr, scope: Scope, in_reduce: bool) -> str:
        lang = self.lang
        if isinstance(e, X.Load):
            return self._load(e, in_reduce)
        if isinstance(e, X.Index):
            return lang.index_value(f"o{e.dim}", self.ityp)
        if isinstance(e, X.RIndex):
            return lang.index_value(f"r{e.dim}", self.ityp)
        if isinstance(e, X.Acc):
            if self.acc is None:
                raise NPUCompileError(f"{lang.name} target: 'acc' outside an epilogue")
            if not 0 <= e.group < len(self.acc):
                raise NPUCompileError(f"{lang.name} target: 'acc' of group {e.group} in a kernel that computes "
                                      f"{len(self.acc)}")
            return self.acc[e.group]
        if isinstance(e, X.Unary):
            return lang.unary(e.op, e.x.dtype, self.emit(e.x, scope, in_reduce))
        if isinstance(e, X.Binary):
            a = self.emit(e.a, scope, in_reduce)
            b = self.emit(e.b, scope, in_reduce)
            # Comparisons and logic compute in the operands' type; arithmetic in the result's register type (the
            # builders already cast operands to it; a stray mismatch is converted here, as the reference does).
            if e.op in X.COMPARE_OPS or e.op in X.LOGIC_OPS:
                od = e.a.dtype
                if lang.reg(e.a.dtype) != lang.reg(e.b.dtype):
                    od = _common(e.a.dtype, e.b.dtype)
                    a, b = lang.cast(a, e.a.dtype, od), lang.cast(b, e.b.dtype, od)
                return lang.binary(e.op, od, a, b)
            if lang.reg(e.a.dtype) != lang.reg(e.dtype):
                a = lang.cast(a, e.a.dtype, e.dtype)
            if lang.reg(e.b.dtype) != lang.reg(e.dtype):
                b = lang.cast(b, e.b.dtype, e.dtype)
            return lang.binary(e.op, e.dtype, a, b)
        if isinstance(e, X.Where):
            c = self.emit(e.cond, scope, in_reduce)
            a = self.emit(e.a, scope, in_reduce)
            b = self.emit(e.b, scope, in_reduce)
            if e.cond.dtype != "bool":
                c = lang.cast(c, e.cond.dtype, "bool")
            if lang.reg(e.a.dtype) != lang.reg(e.dtype):
                a = lang.cast(a, e.a.dtype, e.dtype)
            if lang.reg(e.b.dtype) != lang.reg(e.dtype):
                b = lang.cast(b, e.b.dtype, e.dtype)
            return lang.select(c, a, b)
        if isinstance(e, X.Cast):
            return lang.cast(self.emit(e.x, scope, in_reduce), e.x.dtype, e.dtype)
        raise NPUCompileError(f"{lang.name} target: unknown expression {type(e).__name__}")

    def _load(self, e: X.Load, in_reduce: bool) -> str:
        if not 0 <= e.arg < len(self.arg_names):
            raise NPUCompileError(f"{self.lang.name} target: load of argument {e.arg}, the kernel has "
                                  f"{len(self.arg_names)}")
        terms = [(f"o{d}", s) for d, s in enumerate(e.strides)]
        if e.rstrides:
            if not in_reduce:
                raise NPUCompileError(f"{self.lang.name} target: a load with reduction strides outside a reduction")
            terms += [(f"r{d}", s) for d, s in enumerate(e.rstrides)]
        if not e.rstrides and self.flat_index and is_flat_map(self.out_shape, e.strides):
            where = f"i + {e.offset}" if e.offset else "i"  # the flat output index is the element offset
        else:
            where = affine(terms, e.offset)
        return self.lang.load(self.arg_names[e.arg], where, self.arg_dtypes[e.arg])

    def gather_address(self, g: X.Gather, scope: Scope, in_reduce: bool = False) -> tuple[str, str]:
        """Into `scope`: a gather's index arithmetic; returns whether it reads (its indices in range, its guard) and
        the element it reads."""
        lang = self.lang
        # index arithmetic whose every value provably fits in int32 (a window's rows and columns, a rotated half's
        # position) is computed in int32, and the address too where the whole gathered view fits: 64-bit index math
        # was most of the instructions of a max pool (ResNet-50's at batch 64: 122 us for 128 MB)
        narrow = _Narrower(self, scope, in_reduce)
        span = abs(g.offset) + sum((n - 1) * abs(s) for n, s in zip(g.shape, g.strides))
        small = bool(lang.int32_type) and span <= _INT32_MAX and all(narrow.fits(i) for i in g.indices)
        conds = []
        parts = [str(g.offset)] if g.offset else []
        if small:
            for i, n, s in zip((narrow.name(i) for i in g.indices), g.shape, g.strides):
                conds.append(f"{i} >= 0 && {i} < {n}")
                if s:
                    parts.append(i if s == 1 else f"{i} * {s}")
        else:
            idx = [self.emit(i, scope, in_reduce) for i in g.indices]
            for d, (i, n, s) in enumerate(zip(idx, g.shape, g.strides)):
                iv = i if lang.reg(g.indices[d].dtype) == lang.reg("int64") else lang.cast(i, g.indices[d].dtype,
                                                                                            "int64")
                conds.append(f"{iv} >= {lang.literal(0, 'int64')} && {iv} < {lang.literal(n, 'int64')}")
                if s:
                    parts.append(iv if s == 1 else f"{iv} * {lang.literal(s, 'int64')}")
        if g.guard is not None:
            conds.append(narrow.condition(g.guard) if lang.int32_type else self.emit(g.guard, scope, in_reduce))
        ok = " && ".join(f"({c})" for c in conds) or "true"
        return ok, lang.to_index(" + ".join(parts) or "0", lang.int32_type if small else lang.reg("int64"))

    def _gather(self, g: X.Gather, scope: Scope, in_reduce: bool) -> str:
        lang = self.lang
        ok, where = self.gather_address(g, scope, in_reduce)
        name = self.fresh("g")
        scope.lines.append(scope.indent + lang.decl(name, lang.reg(g.dtype), lang.literal(g.fill, g.dtype),
                                                     mutable=True))
        scope.lines.append(scope.indent + lang.if_(ok) + " " + lang.assign(
            name, lang.load(self.arg_names[g.arg], where, self.arg_dtypes[g.arg])) + " " + lang.end())
        return name

    def _reduce(self, e: X.Reduce, scope: Scope) -> str:
        lang = self.lang
        if not self.reduce_shape:
            raise NPUCompileError(f"{lang.name} target: a reduction in a kernel without a reduction space")
        acc = self.fresh("acc")
        n = math.prod(self.reduce_shape)
        ind = scope.indent
        # The body first: values it hoists out of the loop land in `scope` before the loop is written.
        body = Scope(ind + "  ", parent=scope)
        width = self.reduce_width if self.block_reduce else 0
        if width:
            # a vector of `width` neighbouring values a step: the loads that move along the reduction's innermost
            # dim one vector load each, the body computed for each value in turn, in order
            body.lines.append(body.indent + lang.decl("rv", self.ityp, f"r * {lang.index_literal(width, self.ityp)}"))
            body.lines += decompose(lang, "rv", self.reduce_shape, "r", self.ityp, body.indent)
            moving = _loads_along(e.body, len(self.reduce_shape) - 1, True)
            values = _lanes(lang, self, e.body, body, moving, width, in_reduce=True)
            n //= width
        else:
            body.lines += decompose(lang, "r", self.reduce_shape, "r", self.ityp, body.indent)
            values = [self.emit(e.body, body, in_reduce=True)]
        for v in values:
            if lang.reg(e.body.dtype) != lang.reg(e.dtype):
                v = lang.cast(v, e.body.dtype, e.dtype)
            body.lines.append(body.indent + lang.assign(acc, lang.combine(e.op, e.dtype, acc, v)))
        start, step = (lang.thread_id, lang.block_dim) if self.block_reduce else ("0", "1")
        scope.lines.append(ind + lang.decl(acc, lang.reg(e.dtype), lang.reduce_init(e.op, e.dtype), mutable=True))
        if self.loop_hint:
            scope.lines.append(ind + self.loop_hint)
        scope.lines.append(ind + lang.loop("r", self.ityp, start, str(n), step))
        scope.lines += body.lines
        scope.lines.append(ind + lang.end())
        if self.block_reduce:
            scope.lines += [ind + line for line in lang.block_reduce(acc, e.op, e.dtype, self.text)]
        return acc


_INT32_MAX = 2**31 - 1
_NARROW_OPS = ("add", "sub", "mul", "max", "min")


class _Narrower:
    """A gather's int64 index arithmetic computed in the language's 32-bit type where interval arithmetic proves every
    value of it fits: output and reduction indices range over their shapes, constants are themselves, an
    int64-to-int64 cast is its operand, and sums, differences, products, minima and maxima combine their operands'
    ranges. Anything else (a loaded value, a division) keeps its int64 form, rendered as usual."""

    def __init__(self, r: ExprRenderer, scope: Scope, in_reduce: bool = False) -> None:
        self.r, self.scope, self.in_reduce = r, scope, in_reduce
        self.ranges: dict[int, tuple[int, int] | None] = {}

    def range(self, e: X.Expr) -> tuple[int, int] | None:
        if id(e) in self.ranges:
            return self.ranges[id(e)]
        out_shape, reduce_shape = self.r.out_shape, self.r.reduce_shape
        r = None
        if isinstance(e, X.Index) and 0 <= e.dim < len(out_shape):
            r = (0, out_shape[e.dim] - 1)
        elif isinstance(e, X.RIndex) and 0 <= e.dim < len(reduce_shape):
            r = (0, reduce_shape[e.dim] - 1)
        elif isinstance(e, X.Const) and e.dtype == "int64" and not isinstance(e.value, bool | float):
            r = (int(e.value), int(e.value))
        elif isinstance(e, X.Cast) and e.dtype == "int64" and e.x.dtype == "int64":
            r = self.range(e.x)
        elif isinstance(e, X.Binary) and e.dtype == "int64" and e.op in _NARROW_OPS:
            a, b = self.range(e.a), self.range(e.b)
            if a is not None and b is not None:
                if e.op == "add":
                    r = (a[0] + b[0], a[1] + b[1])
                elif e.op == "sub":
                    r = (a[0] - b[1], a[1] - b[0])
                elif e.op == "mul":
                    ends = [x * y for x in a for y in b]
                    r = (min(ends), max(ends))
                elif e.op == "max":
                    r = (max(a[0], b[0]), max(a[1], b[1]))
                else:
                    r = (min(a[0], b[0]), min(a[1], b[1]))
        if r is not None and not (-_INT32_MAX - 1 <= r[0] and r[1] <= _INT32_MAX):
            r = None
        self.ranges[id(e)] = r
        return r

    def text(self, e: X.Expr) -> str:
        """The 32-bit text of an expression whose range is known."""
        lang = self.r.lang
        if isinstance(e, X.Index | X.RIndex):
            return f"({lang.int32_type}){'o' if isinstance(e, X.Index) else 'r'}{e.dim}"
        if isinstance(e, X.Const):
            return str(int(e.value))
        if isinstance(e, X.Cast):
            return self.text(e.x)
        a, b = self.text(e.a), self.text(e.b)
        if e.op in ("max", "min"):
            return f"{e.op}({a}, {b})"
        return f"({a} {_INFIX[e.op]} {b})"

    def fits(self, e: X.Expr) -> bool:
        """Whether `e` is int64 index arithmetic whose every value fits in 32 bits."""
        return e.dtype == "int64" and self.range(e) is not None

    def name(self, e: X.Expr) -> str | None:
        """A 32-bit variable holding `e`, declared in the scope (once for the same tree), or None where it may not
        fit."""
        if not self.fits(e):
            return None
        key = ("int32", self.r.key(e))
        hit = self.scope.find(key)
        if hit is not None:
            return hit
        name = self.r.fresh("n")
        self.scope.lines.append(self.scope.indent + self.r.lang.decl(name, self.r.lang.int32_type, self.text(e)))
        self.scope.names[key] = name
        return name

    def condition(self, e: X.Expr) -> str:
        """A guard's text: its and/or of comparisons, those of two int64 operands that fit in 32 bits."""
        if isinstance(e, X.Binary) and e.op in X.LOGIC_OPS and e.dtype == "bool":
            op = "&&" if e.op == "and" else "||"
            return f"({self.condition(e.a)} {op} {self.condition(e.b)})"
        if isinstance(e, X.Binary) and e.op in X.COMPARE_OPS and e.a.dtype == "int64" == e.b.dtype:
            a, b = self.name(e.a), self.name(e.b)
            if a is not None and b is not None:
                return f"({a} {_INFIX[e.op]} {b})"
        return self.r.emit(e, self.scope, self.in_reduce)


_INFIX = {"add": "+", "sub": "-", "mul": "*", "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _key(e: X.Expr, kids: tuple) -> tuple:
    """A structural key of a node given its children's (constants by repr, so 0.0 and -0.0 differ)."""
    fields = []
    for name in e.__dataclass_fields__:
        v = getattr(e, name)
        if isinstance(v, X.Expr) or (isinstance(v, tuple) and v and all(isinstance(x, X.Expr) for x in v)):
            continue
        fields.append(repr(v) if isinstance(v, float) else v)
    return (type(e).__name__, *fields, kids)


def _common(a: str, b: str) -> str:
    if "float64" in (a, b):
        return "float64"
    floats = ("float32", "float16", "bfloat16")
    if a in floats or b in floats:
        return "float32"
    return "int64"


def decompose(lang: Language, var: str, shape: tuple[int, ...], prefix: str, ityp: str, indent: str,
              first: int = 0, order: list[int] | None = None) -> list[str]:
    """Lines that split a flat index `var` into per-dim indices `{prefix}{first + d}` (size-1 dims are 0): row-major,
    or with the dims nested in `order` (outermost first)."""
    lines: list[str] = []
    dims = [d for d in (order if order is not None else range(len(shape))) if shape[d] != 1]
    for d, n in enumerate(shape):
        if n == 1:
            lines.append(indent + lang.decl(f"{prefix}{first + d}", ityp, lang.index_literal(0, ityp)))
    if not dims:
        return lines
    rem = f"{prefix}_rem{first or ''}"
    lines.append(indent + lang.decl(rem, ityp, var, mutable=True))
    for j, d in enumerate(reversed(dims)):
        if j == len(dims) - 1:
            lines.append(indent + lang.decl(f"{prefix}{first + d}", ityp, rem))
        else:
            n = shape[d]
            lines.append(indent + lang.decl(f"{prefix}{first + d}", ityp, f"{rem} % {lang.index_literal(n, ityp)}")
                         + " " + lang.assign(rem, f"{rem} / {lang.index_literal(n, ityp)}"))
    return lines


# ---- whole kernels ------------------------------------------------------------------------------------------------


@dataclass
class Store:
    """Where a kernel writes: the output's index map, or (a scatter) the map with a position read from data along
    one dim."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    dtype: str
    scatter_dim: int | None = None
    scatter_index: X.Expr | None = None
    scatter_size: int = 0


def render_expression(lang: Language, expr: X.Expr, arg_dtypes: list[str], arg_extents: list[int], store: Store,
                      iteration: tuple[int, ...], reduce_shape: tuple[int, ...], row_dims: int,
                      ptrs: list[tuple[str, int]], restrict: bool = True, device=None) -> tuple[str, Launch]:
    """The source of one expression kernel and its launch. `iteration` is the index space (the output's shape, or
    a scatter's source shape); `restrict=False` when an argument may be the output buffer itself; `device` the
    DeviceProfile the launch is shaped for."""
    text, launch = expression_text(lang, expr, arg_dtypes, arg_extents, store, iteration, reduce_shape, row_dims, ptrs,
                                   restrict, device=device)
    return lang.kernel(text), launch


def elementwise_ilp(lang: Language, n_out: int, device=None) -> int:
    """Elements a thread of an elementwise kernel of `n_out` elements works on at once: the language's count where
    the kernel is large enough to fill the device (a DeviceProfile) many times over (as many threads as it holds,
    each that many elements), else 1 (a small kernel is latency-bound: its elements spread over as many threads as
    there are; so is every kernel rendered for no device)."""
    ilp = lang.elementwise_ilp
    return ilp if ilp > 1 and device is not None and n_out >= device.resident_threads * ilp else 1


def expression_text(lang: Language, expr: X.Expr, arg_dtypes: list[str], arg_extents: list[int], store: Store,
                    iteration: tuple[int, ...], reduce_shape: tuple[int, ...], row_dims: int,
                    ptrs: list[tuple[str, int]], restrict: bool = True, names: str = "",
                    blocks: tuple[str, str] | None = None,
                    side: tuple[X.Expr, Store] | None = None, device=None) -> tuple[KernelText, Launch]:
    """`render_expression`'s kernel before the language wraps it: its parameters (named with the prefix `names`),
    body, helpers and shared arrays. `blocks` (elementwise kernels only): the block index and the grid size the
    body runs over, where it is one part of a larger grid. `side` (row kernels only: `GeneratedKernel.side`): a
    second value stored at each element of the row into `out1`, a parameter after `out0`."""
    shape = tuple(iteration)
    n_out = math.prod(shape)
    n_red = math.prod(reduce_shape) if reduce_shape else 1
    has_reduce = any(isinstance(x, X.Reduce) for x in X.walk(expr))
    # (the loops' indices run to n_out and n_red, never to their product: a row kernel's rows and a reduction's
    # values are separate loops, and every address stays inside its buffer; the last: an elementwise loop's index,
    # which passes n_out by up to its elements a thread times the grid)
    extents = [n_out, n_red, max_extent(store.shape, store.strides, store.offset), *arg_extents,
               *([max_extent(side[1].shape, side[1].strides, side[1].offset)] if side is not None else []),
               n_out + elementwise_ilp(lang, n_out, device) * ELEMENTWISE_BLOCK * lang.max_grid]
    ityp = lang.index_type(max(extents))
    order = memory_order(shape, tuple(store.strides)) if tuple(store.shape) == shape else None
    serial = (n_red <= SERIAL_REDUCE_MAX
              or (n_red <= SERIAL_STRIDED_REDUCE_MAX and n_out >= SERIAL_MIN_OUTPUTS
                  and _reads_along_output(expr, order[-1] if order else _innermost(shape))))
    rows_mode = has_reduce and (row_dims > 0 or not serial)
    if store.scatter_dim is not None and rows_mode:
        raise NPUCompileError(f"{lang.name} target: a scatter kernel with a reduction")
    if side is not None and not (rows_mode and row_dims and blocks is None and tuple(side[1].shape) == shape):
        raise NPUCompileError(f"{lang.name} target: a side output outside a row kernel's elements")
    params = [(f"{names}out0", store.dtype, True)]
    if side is not None:
        params.append((f"{names}out1", side[1].dtype, True))
    params += [(f"{names}a{i}", dt, False) for i, dt in enumerate(arg_dtypes)]
    arg_names = [f"{names}a{i}" for i in range(len(arg_dtypes))]
    outer = shape[:len(shape) - row_dims]
    row = shape[len(shape) - row_dims:]
    n_rows, row_n = math.prod(outer), math.prod(row)
    if rows_mode:
        block = _row_block(max(row_n, n_red), n_rows, lang.max_block) if row_dims else _reduce_block(n_red)
        block = max(block, lang.warp_width)
    else:
        block = ELEMENTWISE_BLOCK
    text = KernelText(params, block, restrict=restrict)
    # One element per thread, consecutive threads on consecutive addresses of the output: where the output is a
    # dense view in another order of dims (a channels-last or channel-major activation), the flat index walks its
    # memory, not its logical row-major order (whose neighbours would be a channel apart)
    if rows_mode or store.scatter_dim is not None:
        order = None
    r = ExprRenderer(lang, text, arg_names, arg_dtypes, shape, ityp, tuple(reduce_shape), row_dims,
                     block_reduce=rows_mode, flat_index=not rows_mode and order is None,
                     loop_hint=lang.row_loop_hint if rows_mode else "")
    body: list[str] = []
    if rows_mode:
        if blocks is not None:
            raise NPUCompileError(f"{lang.name} target: a row kernel as part of a larger grid")
        grid = grid_for(n_rows, 1, lang.max_grid)
        body.append("  " + lang.loop("row", ityp, lang.block_id, str(n_rows), lang.grid_dim))
        row_scope = Scope("    ")
        r.row_scope = row_scope
        row_scope.lines += decompose(lang, "row", tuple(outer), "o", ityp, row_scope.indent)
        r.reduce_width = _row_vector_width(lang, expr, reduce_shape, arg_dtypes)
        width = (_vector_width(lang, expr, store, shape, None, arg_dtypes, outside_reduce=True)
                 if row_dims and shape[-1] > 1 else 0)
        if side is not None and width and _vector_width(lang, side[0], side[1], shape, None, arg_dtypes,
                                                        outside_reduce=True) != width:
            width = 0  # both stores a vector at a time, or neither
        if width:
            # a vector of `width` neighbouring row elements a step (`_vector_width`): a thread's loads that move along
            # the row one vector load each, its values the row shares (its reductions) computed once
            elem = Scope("      ", parent=row_scope)
            r.elem_scope = elem
            elem.lines.append(elem.indent + lang.decl("e", ityp, f"ev * {lang.index_literal(width, ityp)}"))
            elem.lines += decompose(lang, "e", row, "o", ityp, elem.indent, first=len(outer))
            exprs = [expr] if side is None else [expr, side[0]]
            moving = list(dict.fromkeys(ld for e in exprs for ld in _loads_along(e, len(shape) - 1, False)))
            values = _lanes_of(lang, r, exprs, elem, moving, width)
            elem.lines += [elem.indent + line
                           for line in lang.vector_store(f"{names}out0", _store_where(store), store.dtype, values[0],
                                                         expr.dtype)]
            if side is not None:
                elem.lines += [elem.indent + line
                               for line in lang.vector_store(f"{names}out1", _store_where(side[1]), side[1].dtype,
                                                             values[1], side[0].dtype)]
            body += row_scope.lines
            body.append("    " + lang.loop("ev", ityp, lang.thread_id, str(row_n // width), lang.block_dim))
            body += elem.lines
            body.append("    " + lang.end())
        elif row_dims:
            elem = Scope("      ", parent=row_scope)
            r.elem_scope = elem
            elem.lines += decompose(lang, "e", row, "o", ityp, elem.indent, first=len(outer))
            value = r.emit(expr, elem)
            elem.lines.append(elem.indent + _store_line(lang, r, store, value, expr.dtype, elem, names))
            if side is not None:
                side_value = r.emit(side[0], elem)
                elem.lines.append(elem.indent + lang.store(f"{names}out1", _store_where(side[1]), side[1].dtype,
                                                           side_value, side[0].dtype))
            body += row_scope.lines
            body += ["    " + lang.row_loop_hint] if lang.row_loop_hint else []
            body.append("    " + lang.loop("e", ityp, lang.thread_id, str(row_n), lang.block_dim))
            body += elem.lines
            body.append("    " + lang.end())
        else:
            value = r.emit(expr, row_scope)
            body += row_scope.lines
            body.append("    " + lang.if_(f"{lang.thread_id} == 0") + " "
                        + _store_line(lang, r, store, value, expr.dtype, row_scope, names).strip() + " " + lang.end())
        body.append("  " + lang.end())
    elif vec := _vector_width(lang, expr, store, shape, order, arg_dtypes):
        grid = _vector_body(lang, r, expr, store, shape, order, ityp, vec, block, body, names, blocks, device)
    elif (has_reduce and lang.vector_bytes and n_red <= UNROLL_REDUCE_MAX
          and (unrolled := _unrolled(expr, tuple(reduce_shape))) is not None
          and (vec := _vector_width(lang, unrolled, store, shape, order, arg_dtypes))):
        grid = _vector_body(lang, r, unrolled, store, shape, order, ityp, vec, block, body, names, blocks, device)
    else:
        ilp = elementwise_ilp(lang, n_out, device)
        grid = grid_for(-(-n_out // ilp), block, lang.max_grid)
        block_id, grid_dim = blocks or (lang.block_id, lang.grid_dim)
        start = f"{lang.to_index(block_id, ityp)} * {lang.block_dim} + {lang.thread_id}"
        step = f"{lang.to_index(grid_dim, ityp)} * {lang.block_dim}"
        if ilp == 1:
            body.append("  " + lang.loop("i", ityp, start, str(n_out), step))
            scope = Scope("    ")
        else:
            # `ilp` elements a grid stride apart, the loop over them unrolled. An element past the end computes the
            # last one again and stores nothing: its loads need no guard, so the compiler can issue every element's
            # loads before the first element's store (guarded loads stay in their branches, one element at a time)
            last = lang.index_literal(n_out - 1, ityp)
            body.append("  " + lang.loop("i0", ityp, start, str(n_out), f"{step} * {lang.index_literal(ilp, ityp)}"))
            body += ["    " + lang.unroll_hint] if lang.unroll_hint else []
            body.append("    " + lang.loop("e", ityp, lang.index_literal(0, ityp), lang.index_literal(ilp, ityp),
                                           lang.index_literal(1, ityp)))
            body.append("      " + lang.decl("ie", ityp, f"i0 + e * {step}"))
            body.append("      " + lang.decl("i", ityp, lang.select(f"ie < {last}", "ie", last)))
            scope = Scope("      ")
        r.row_scope = scope  # one element per thread: its scope is the row's (a reduction is computed before use)
        scope.lines += decompose(lang, "i", shape, "o", ityp, scope.indent, order=order)
        value = r.emit(expr, scope)
        stored = _store_line(lang, r, store, value, expr.dtype, scope, names)
        if ilp > 1:
            stored = f"{lang.if_(f'ie <= {last}')} {stored} {lang.end()}"
        scope.lines.append(scope.indent + stored)
        body += scope.lines
        if ilp > 1:
            body.append("    " + lang.end())
        body.append("  " + lang.end())
    text.body = body
    launch = Launch((grid if n_out else 0, 1, 1), block, ptrs)
    return text, launch


def _unrolled(expr: X.Expr, reduce_shape: tuple[int, ...]) -> X.Expr | None:
    """`expr` with each float32 reduction written out: its initial value, then the operation with the body at each
    position of the reduction space in the loop's order (the reduction index a constant there), so that it computes
    what the loop computes, to the bit; None where a reduction is of another dtype. A small window written out this
    way has no loop, and its gathers can take the 16-byte form (`_vector_width`)."""
    if any(isinstance(n, X.Reduce) and n.dtype != "float32" for n in X.walk(expr)):
        return None
    positions = list(itertools.product(*(range(n) for n in reduce_shape)))  # (row-major: the loop's order)

    def written_out(e: X.Expr) -> X.Expr | None:
        if not isinstance(e, X.Reduce):
            return None
        acc: X.Expr = X.Const(e.dtype, 0.0 if e.op == "sum" else float("-inf"))
        for pos in positions:
            v = X.substitute(e.body, lambda n, pos=pos: X.Const(n.dtype, pos[n.dim]) if isinstance(n, X.RIndex)
                             else None)
            acc = X.Binary(e.dtype, "add" if e.op == "sum" else "max", acc,
                           v if v.dtype == e.dtype else X.Cast(e.dtype, v))
        return acc
    return X.substitute(expr, written_out)


def _vector_width(lang: Language, expr: X.Expr, store: Store, shape: tuple[int, ...], order: list[int] | None,
                  arg_dtypes: list[str], outside_reduce: bool = False) -> int:
    """Elements a thread of this elementwise kernel moves in one vector load or store (0: one at a time). Its store
    is dense over 2-byte elements, along its innermost memory dim in whole aligned vectors, and every load either
    reads the same run of 2-byte elements aligned alike (stride 1 along that dim) or does not move along it (one
    value for the vector). Output indices are computed for each element (`_lanes`); a gather either reads the same
    element for the whole vector or a run of it (`_vector_gather_ok`); a row kernel's part outside its reductions
    has neither, and an elementwise kernel no reduction. Measured on the H100 (Qwen2.5-1.5B prefill, 2,048 tokens;
    its elementwise kernels are SiLU(gate) * up into 2,048 x 8,960 bf16 and the residual adds): the elementwise
    kernels 1.81 -> 1.13 ms a prefill, the call 14.9 -> 14.0 ms (`bench_generate.py --no-compile --profile`)."""
    scatter = store.scatter_dim
    if not lang.vector_bytes or not shape or len(store.shape) != len(shape) or store.dtype not in ("float16",
                                                                                                  "bfloat16"):
        return 0
    if any(n != m for d, (n, m) in enumerate(zip(store.shape, shape)) if d != scatter):
        return 0
    width = lang.vector_bytes // 2
    # rows written at positions read from data (a cache update): whole rows a vector, the position read once a vector
    # (prefill's value-cache writes on the H100: 0.367 -> 0.319 ms over 28 layers)
    if scatter is not None:
        inner = _innermost(shape)
        if inner == scatter or store.scatter_index is None or any(
                isinstance(n, X.Gather | X.Reduce) or (isinstance(n, X.Load | X.Index) and _moves_along(n, inner))
                for n in X.walk(store.scatter_index)):
            return 0
    elif order is None:
        if not is_flat_map(shape, tuple(store.strides)):
            return 0
        inner = _innermost(shape)
    else:
        inner = order[-1]
    if shape[inner] % width or store.strides[inner] != 1 or store.offset % width:
        return 0
    if any(s % width for d, s in enumerate(store.strides) if d != inner and (shape[d] != 1 or d == scatter)):
        return 0
    for n in _outside_reduces(expr) if outside_reduce else X.walk(expr):
        if outside_reduce and isinstance(n, X.Gather | X.Index):
            return 0
        # an output index is computed for each element (`_lanes`); a gather either reads the same element for the
        # whole vector or a run of it in one vector load (`_vector_gather_ok`)
        if isinstance(n, X.Gather) and not (_vector_gather_ok(n, inner, shape, width, arg_dtypes)
                                           or _lane_step(n, inner, shape, width) == (0, None)):
            return 0
        if isinstance(n, X.RIndex | X.Acc) or (isinstance(n, X.Reduce) and not outside_reduce):
            return 0
        if isinstance(n, X.Load) and not _vector_load_ok(n, inner, shape, width, arg_dtypes, False):
            return 0
        # a reduction that moves with the element (its body reads along the row) is computed for each one
        if isinstance(n, X.Reduce) and any(isinstance(m, X.Load | X.Gather | X.Index) and _moves_along(m, inner)
                                           for m in X.walk(n.body)):
            return 0
    return width


def _lane_step(e: X.Expr, inner: int, shape: tuple[int, ...], width: int) -> tuple[int, int | None] | None:
    """How an integer or boolean expression varies over an aligned vector of `width` neighbouring outputs along the
    output dim `inner` (whose first element's index there is a multiple of `width`): (c, m) where its value at the
    vector's element L is B + c * L and B mod width is m (None: not known); a value the same for every element has
    c = 0 (m None for booleans and floats). None where it varies otherwise: a loaded value that moves along the
    vector, a product of two moving values, a comparison that flips inside the vector. A comparison of a value that
    moves by one an element with one that does not is the same for the whole vector where their difference is a
    multiple of `width` at its first element (RoPE's `d < 64` over vectors of 8 columns). The nodes are taken
    children first, each distinct one once and without recursion (a deep or shared tree costs its nodes)."""
    memo: dict[int, tuple[int, int | None] | None] = {}
    for node in X.walk(e):
        memo[id(node)] = _lane_step_of(node, inner, shape, width, memo)
    return memo[id(e)]


def _lane_step_of(e: X.Expr, inner: int, shape: tuple[int, ...], width: int,
                  memo: dict[int, tuple[int, int | None] | None]) -> tuple[int, int | None] | None:
    """`_lane_step` of one node, its operands' already in the memo."""
    def step(x: X.Expr) -> tuple[int, int | None] | None:
        return memo[id(x)]

    def known(a: int | None, b: int | None, f) -> int | None:
        return None if a is None or b is None else f(a, b) % width

    if isinstance(e, X.Index):
        return (1, 0) if e.dim == inner and shape[inner] != 1 else (0, None)
    if isinstance(e, X.Const):
        exact = e.dtype in INT_DTYPES and not isinstance(e.value, bool | float)
        return (0, int(e.value) % width if exact else None)
    if isinstance(e, X.Load):
        moves = inner < len(e.strides) and e.strides[inner] != 0 and shape[inner] != 1
        return None if moves or e.rstrides else (0, None)
    if isinstance(e, X.Gather):
        parts = [step(i) for i in e.indices] + ([step(e.guard)] if e.guard is not None else [])
        return (0, None) if all(q is not None and q[0] == 0 for q in parts) else None
    if isinstance(e, X.Cast):
        q = step(e.x)
        if q is None or (q[0] and not (e.dtype in INT_DTYPES and e.x.dtype in INT_DTYPES)):
            return None
        return q if e.dtype in INT_DTYPES else (0, None)
    if isinstance(e, X.Unary):
        q = step(e.x)
        if q is not None and e.op == "neg" and e.dtype in INT_DTYPES:
            return (-q[0], None if q[1] is None else -q[1] % width)
        return (0, None) if q is not None and q[0] == 0 else None
    if isinstance(e, X.Where):
        c, a, b = step(e.cond), step(e.a), step(e.b)
        if c is None or a is None or b is None or c[0] or a[0] != b[0]:
            return None
        return (a[0], a[1] if a[1] == b[1] else None)
    if isinstance(e, X.Binary):
        a, b = step(e.a), step(e.b)
        if a is None or b is None:
            return None
        if e.op in ("add", "sub") and e.dtype in INT_DTYPES:
            sign = 1 if e.op == "add" else -1
            return (a[0] + sign * b[0], known(a[1], b[1], lambda x, y: x + sign * y))
        if e.op == "mul" and e.dtype in INT_DTYPES:
            for (c1, m1), k in ((a, e.b), (b, e.a)):
                if isinstance(k, X.Const) and not isinstance(k.value, bool | float):
                    return (c1 * int(k.value), None if m1 is None else m1 * int(k.value) % width)
        if e.op in ("lt", "le", "gt", "ge") and e.a.dtype in INT_DTYPES and e.b.dtype in INT_DTYPES:
            # as y < 0 with y = a - b (lt), a - b - 1 (le), b - a (gt), b - a - 1 (ge)
            c = a[0] - b[0] if e.op in ("lt", "le") else b[0] - a[0]
            m = known(a[1], b[1], (lambda x, y: x - y) if e.op in ("lt", "le") else (lambda x, y: y - x))
            if m is not None and e.op in ("le", "ge"):
                m = (m - 1) % width
            # y over the vector spans [lo, lo + width - 1]: the same sign throughout where lo is a multiple of width
            if c == 0 or (c == 1 and m == 0) or (c == -1 and m is not None and (m + 1) % width == 0):
                return (0, None)
            return None
        return (0, None) if a[0] == 0 and b[0] == 0 else None
    return None


def _vector_gather_ok(g: X.Gather, inner: int, shape: tuple[int, ...], width: int, arg_dtypes: list[str]) -> bool:
    """Whether a gather reads, for an aligned vector of `width` neighbouring outputs along `inner`, a run of `width`
    neighbouring 2-byte elements, aligned, all or none of them (`_lane_step`): exactly one index moves, by one an
    element from a multiple of `width`, along a unit-stride dim of the gathered view whose extent is a multiple of
    `width` (so the first element's range test holds for all); every other index and the guard stay put, and the
    other strides and the offset keep the run aligned. RoPE's rotated half (the column d + 64 or d - 64) is one."""
    steps = [_lane_step(i, inner, shape, width) for i in g.indices]
    if any(q is None for q in steps) or (g.guard is not None and _lane_step(g.guard, inner, shape, width) != (0, None)):
        return False
    moving = [d for d, q in enumerate(steps) if q[0]]
    if len(moving) != 1:
        return False
    d = moving[0]
    return (steps[d] == (1, 0) and g.strides[d] == 1 and g.shape[d] % width == 0
            and _aligned_run(g.dtype, arg_dtypes[g.arg], g.offset, [st for k, st in enumerate(g.strides) if k != d],
                             width))


def _moves_along(n: X.Expr, dim: int) -> bool:
    """Whether a load, gather or index node may change along the output dim `dim`."""
    if isinstance(n, X.Load):
        return dim < len(n.strides) and n.strides[dim] != 0
    if isinstance(n, X.Index):
        return n.dim == dim
    return True


def _outside_reduces(expr: X.Expr) -> list[X.Expr]:
    """The nodes of `expr` that are not inside a reduction (a reduction itself is listed, its body not)."""
    out, stack, seen = [], [expr], set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        out.append(n)
        if not isinstance(n, X.Reduce):
            stack.extend(X.children(n))
    return out


def _vector_load_ok(n: X.Load, inner: int, shape: tuple[int, ...], width: int, arg_dtypes: list[str],
                    along_reduce: bool) -> bool:
    """Whether a load can be one vector load for `width` neighbours along the output dim `inner` (or the innermost
    reduction dim), or stays put along it (one value for the vector)."""
    if along_reduce:
        if not n.rstrides or not any(n.rstrides):
            return True  # the same value at every step of the reduction
        steps, others = n.rstrides[-1], list(n.strides) + list(n.rstrides[:-1])
    else:
        if n.rstrides or len(n.strides) != len(shape):
            return False
        steps, others = n.strides[inner], [st for d, st in enumerate(n.strides) if d != inner and shape[d] != 1]
    if steps == 0:
        return True
    return steps == 1 and _aligned_run(n.dtype, arg_dtypes[n.arg], n.offset, others, width)


def _aligned_run(dtype: str, arg_dtype: str, offset: int, other_strides: list[int], width: int) -> bool:
    """Whether a read that moves by one element along the vector reads whole aligned runs of `width` 2-byte
    elements: a 2-byte dtype read as stored, its offset and every other stride a multiple of `width`."""
    return (dtype in HALF_DTYPES and arg_dtype == dtype and offset % width == 0
            and all(st % width == 0 for st in other_strides))


def _row_vector_width(lang: Language, expr: X.Expr, reduce_shape: tuple[int, ...], arg_dtypes: list[str]) -> int:
    """Values a thread of a row kernel's block reductions loads at once: every reduction's loads that move with it
    move along its innermost dim in aligned vectors of 2-byte elements (`_vector_load_ok`), and nothing in a
    reduction's body depends on the reduction's position otherwise; else 0. A thread then sums its vector's values
    in order before the block's reduction (another order of the same fp32 sum). With the row's elements 16 bytes at
    a time as well, Qwen2.5-1.5B prefill's 57 RMSNorms on the H100: 0.74 -> 0.57 ms."""
    width = lang.vector_bytes // 2
    if not width or not reduce_shape or reduce_shape[-1] % width:
        return 0
    reduces = [n for n in X.walk(expr) if isinstance(n, X.Reduce)]
    for red in reduces:
        for n in X.walk(red.body):
            if isinstance(n, X.Gather | X.RIndex | X.Reduce | X.Acc):
                return 0
            if isinstance(n, X.Load) and not _vector_load_ok(n, 0, (), width, arg_dtypes, True):
                return 0
    return width if reduces else 0


def _loads_along(expr: X.Expr, dim: int, along_reduce: bool) -> list[X.Load]:
    """The loads of `expr` that move by one element along the output dim `dim` (outside its reductions) or along
    the innermost reduction dim (inside them), once each."""
    if along_reduce:
        return list(dict.fromkeys(n for n in X.walk(expr) if isinstance(n, X.Load) and n.rstrides
                                  and n.rstrides[-1] == 1))
    return list(dict.fromkeys(n for n in _outside_reduces(expr) if isinstance(n, X.Load) and not n.rstrides
                              and dim < len(n.strides) and n.strides[dim] == 1))


def _lanes(lang: Language, r: ExprRenderer, expr: X.Expr, scope: Scope, moving: list[X.Load], width: int,
           in_reduce: bool = False, inner: int | None = None) -> list[str]:
    return _lanes_of(lang, r, [expr], scope, moving, width, in_reduce, inner)[0]


def _lanes_of(lang: Language, r: ExprRenderer, exprs: list[X.Expr], scope: Scope, moving: list[X.Load], width: int,
              in_reduce: bool = False, inner: int | None = None) -> list[list[str]]:
    """Into `scope`: one vector load for each load of `moving` (at the scope's first element), then each of `exprs`
    for each of the vector's elements in turn, its moving loads replaced by that element; returns each expression's
    element values. Values that do not depend on the element are computed once, where the renderer puts them (and
    values the expressions share, once for them all). With `inner` (the output dim the vector runs along), a gather
    that reads a run of the vector's width (`_vector_gather_ok`) is one guarded vector load at the first element's
    address, and the output index along `inner` is the element's own."""
    for k, ld in enumerate(moving):
        terms = [(f"o{d}", st) for d, st in enumerate(ld.strides)] + [(f"r{d}", st) for d, st in enumerate(ld.rstrides)]
        scope.lines += [scope.indent + line
                        for line in lang.vector_load(r.arg_names[ld.arg], affine(terms, ld.offset), ld.dtype,
                                                     f"{r.prefix}v{k}")]
    sub: dict[X.Expr, X.Expr] = {ld: X.Acc(ld.dtype, k) for k, ld in enumerate(moving)}
    if inner is not None:
        runs = [n for expr in exprs for n in X.walk(expr) if isinstance(n, X.Gather) and n not in sub
                and _vector_gather_ok(n, inner, r.out_shape, width, r.arg_dtypes)]
        for g in dict.fromkeys(runs):
            ok, where = r.gather_address(g, scope)
            fill = lang.literal(g.fill, "float32")
            scope.lines += [scope.indent + line for line in lang.vector_load_if(
                r.arg_names[g.arg], where, g.dtype, f"{r.prefix}v{len(sub)}", ok, fill)]
            sub[g] = X.Acc(g.dtype, len(sub))
    lane_exprs = [X.substitute(expr, lambda n: sub.get(n) if isinstance(n, X.Load | X.Gather) else None)
                  for expr in exprs]
    values: list[list[str]] = [[] for _ in exprs]
    saved = r.acc  # a vectorized reduction rendered inside an element's expression keeps the element's values
    for lane in range(width):
        lane_scope = Scope(scope.indent, parent=scope)
        r.acc = [f"{r.prefix}v{k}[{lane}]" for k in range(len(sub))]
        for j, lane_expr in enumerate(lane_exprs):
            here = lane_expr
            if inner is not None and lane:
                def own(n: X.Expr, lane: int = lane) -> X.Expr | None:
                    if isinstance(n, X.Index) and n.dim == inner:
                        return X.Binary(n.dtype, "add", n, X.Const(n.dtype, lane))
                    return None
                here = X.substitute(lane_expr, own)
            values[j].append(r.emit(here, lane_scope, in_reduce=in_reduce))
        scope.lines += lane_scope.lines
        r.acc = saved
    return values


def _vector_body(lang: Language, r: ExprRenderer, expr: X.Expr, store: Store, shape: tuple[int, ...],
                 order: list[int] | None, ityp: str, width: int, block: int, body: list[str], names: str,
                 blocks: tuple[str, str] | None = None, device=None) -> int:
    """The loop of a vectorized elementwise kernel (`_vector_width`) into `body`; returns its grid. A thread takes
    `elementwise_ilp` vectors a grid stride apart, as the scalar loop takes elements: each load that moves along the
    vector is one vector load, and the expression is computed for each of its elements in turn (its values that do
    not move along the vector once), then stored in one vector store."""
    n_vec = math.prod(shape) // width
    ilp = elementwise_ilp(lang, n_vec, device)
    grid = grid_for(-(-n_vec // ilp), block, lang.max_grid)
    block_id, grid_dim = blocks or (lang.block_id, lang.grid_dim)  # (a part of a merged launch: its own blocks)
    start = f"{lang.to_index(block_id, ityp)} * {lang.block_dim} + {lang.thread_id}"
    step = f"{lang.to_index(grid_dim, ityp)} * {lang.block_dim}"
    last = lang.index_literal(n_vec - 1, ityp)
    body.append("  " + lang.loop("g0", ityp, start, str(n_vec), f"{step} * {lang.index_literal(ilp, ityp)}"))
    body += ["    " + lang.unroll_hint] if lang.unroll_hint else []
    body.append("    " + lang.loop("e", ityp, lang.index_literal(0, ityp), lang.index_literal(ilp, ityp),
                                   lang.index_literal(1, ityp)))
    scope = Scope("      ")
    # a vector past the end computes the last one again and stores nothing (its loads need no guard)
    scope.lines.append(scope.indent + lang.decl("ge", ityp, f"g0 + e * {step}"))
    scope.lines.append(scope.indent + lang.decl("i", ityp, f"{lang.select(f'ge < {last}', 'ge', last)} * "
                                                            f"{lang.index_literal(width, ityp)}"))
    r.row_scope = scope
    r.flat_index = False
    scope.lines += decompose(lang, "i", shape, "o", ityp, scope.indent, order=order)
    inner = order[-1] if order else _innermost(shape)
    values = _lanes(lang, r, expr, scope, _loads_along(expr, inner, False), width, inner=inner)
    cond = f"ge <= {last}"
    if store.scatter_dim is None:
        where = _store_where(store)
    else:
        where, inside = _scatter_target(lang, r, store, scope)
        cond = f"{cond} && {inside}"
    stores = lang.vector_store(f"{names}out0", where, store.dtype, values, expr.dtype)
    scope.lines.append(scope.indent + lang.if_(cond))
    scope.lines += [scope.indent + "  " + line for line in stores]
    scope.lines.append(scope.indent + lang.end())
    body += scope.lines
    body.append("    " + lang.end())
    body.append("  " + lang.end())
    return grid


def _innermost(shape: tuple[int, ...]) -> int:
    """The last dim of more than one element (the one consecutive flat indices step along)."""
    return max((d for d, n in enumerate(shape) if n != 1), default=len(shape) - 1)


def _reads_along_output(expr: X.Expr, inner: int) -> bool:
    """Whether every read that moves with a reduction of `expr` is a plain load that moves by one element along
    the output dim `inner` (the one consecutive threads step through) and by more than one along every reduction
    dim: consecutive outputs' reductions then read neighbouring elements at each step."""
    moving = [n for red in X.walk(expr) if isinstance(red, X.Reduce) for n in X.reads(red)
              if not isinstance(n, X.Load) or any(n.rstrides)]
    return bool(moving) and all(
        isinstance(n, X.Load) and inner < len(n.strides) and abs(n.strides[inner]) == 1
        and all(abs(s) != 1 for s in n.rstrides) for n in moving)


def _store_line(lang: Language, r: ExprRenderer, store: Store, value: str, value_dtype: str, scope: Scope,
                names: str = "") -> str:
    if store.scatter_dim is None:
        if r.flat_index and is_flat_map(store.shape, store.strides) and tuple(store.shape) == r.out_shape:
            where = f"i + {store.offset}" if store.offset else "i"
        else:
            where = _store_where(store)
        return lang.store(f"{names}out0", where, store.dtype, value, value_dtype)
    where, cond = _scatter_target(lang, r, store, scope)
    stored = lang.store(f"{names}out0", where, store.dtype, value, value_dtype)
    return lang.if_(cond) + " " + stored + " " + lang.end()


def _store_where(store: Store) -> str:
    """The element offset a (non-scatter) store writes, from the output indices `o{d}`."""
    return affine([(f"o{d}", s) for d, s in enumerate(store.strides)], store.offset)


def _scatter_target(lang: Language, r: ExprRenderer, store: Store, scope: Scope) -> tuple[str, str]:
    """A scatter's address for this element (its position along the scatter dim read from data) and the condition
    that the position lies inside the output (a position outside writes nothing)."""
    dim = store.scatter_dim
    pos = r.emit(store.scatter_index, scope)
    ltyp = lang.reg("int64")
    pv = pos if lang.reg(store.scatter_index.dtype) == ltyp else lang.cast(pos, store.scatter_index.dtype, "int64")
    terms = [(f"o{d}", s) for d, s in enumerate(store.strides) if d != dim]
    base = affine(terms, store.offset)
    stride = store.strides[dim]
    where = lang.to_index(f"{pv} * {lang.literal(stride, 'int64')}", ltyp) if stride != 1 else lang.to_index(pv, ltyp)
    cond = f"{pv} >= {lang.literal(0, 'int64')} && {pv} < {lang.literal(store.scatter_size, 'int64')}"
    return f"{base} + {where}", cond
