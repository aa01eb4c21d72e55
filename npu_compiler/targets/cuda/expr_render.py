"""CUDA C for generated (expression) kernels: one table of primitives, one kernel per expression.

Elementwise kernels run a grid-stride loop over the flat output index. Kernels with a reduction run one block (or
one warp) per output element: the threads stride over the reduction space, accumulate in fp32 (int64 for
integers) and combine with warp shuffles; small reductions run serially inside one thread per output element.
Index maps (shapes, strides, offsets) are compile-time constants, so divisions by shapes become multiplications.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...errors import NPUCompileError
from ...expr import nodes as X
from ...program import CompiledProgram, KernelCall, TensorRef
from .common import (
    INT64_MIN,
    KERNEL_NAME,
    NEG_INF_F,
    PRELUDE,
    REDUCE_HELPERS,
    Launch,
    affine,
    cast_expr,
    decompose,
    grid_for,
    index_type,
    is_flat_map,
    literal,
    load_expr,
    max_extent,
    reg,
    storage,
    store_expr,
)

# Each primitive once, per register kind ("f": float, "d": double, "i": long long, "b": bool).
UNARY: dict[str, dict[str, str]] = {
    "neg": {"f": "(-{a})", "d": "(-{a})", "i": "(-{a})"},
    "exp": {"f": "expf({a})", "d": "exp({a})"},
    "log": {"f": "logf({a})", "d": "log({a})"},
    "sqrt": {"f": "sqrtf({a})", "d": "sqrt({a})"},
    # 1/sqrt (both correctly rounded) rather than rsqrtf (2 ulp): the same bits as the reference
    "rsqrt": {"f": "(1.0f / sqrtf({a}))", "d": "(1.0 / sqrt({a}))"},
    "sin": {"f": "sinf({a})", "d": "sin({a})"},
    "cos": {"f": "cosf({a})", "d": "cos({a})"},
    "tanh": {"f": "tanhf({a})", "d": "tanh({a})"},
    "erf": {"f": "erff({a})", "d": "erf({a})"},
    "abs": {"f": "fabsf({a})", "d": "fabs({a})", "i": "llabs({a})"},
    "not": {"b": "(!{a})", "i": "({a} == 0)", "f": "({a} == 0.0f)", "d": "({a} == 0.0)"},
    "floor": {"f": "floorf({a})", "d": "floor({a})", "i": "{a}"},
    "trunc": {"f": "truncf({a})", "d": "trunc({a})", "i": "{a}"},
}
BINARY: dict[str, dict[str, str]] = {
    "add": {"*": "({a} + {b})"},
    "sub": {"*": "({a} - {b})"},
    "mul": {"*": "({a} * {b})"},
    "div": {"*": "({a} / {b})"},
    "max": {"*": "npu_max({a}, {b})", "b": "({a} || {b})"},
    "min": {"*": "npu_min({a}, {b})", "b": "({a} && {b})"},
    "pow": {"f": "powf({a}, {b})", "d": "pow({a}, {b})", "i": "npu_ipow({a}, {b})"},
    "eq": {"*": "({a} == {b})"},
    "ne": {"*": "({a} != {b})"},
    "lt": {"*": "({a} < {b})"},
    "le": {"*": "({a} <= {b})"},
    "gt": {"*": "({a} > {b})"},
    "ge": {"*": "({a} >= {b})"},
    "and": {"*": "({a} && {b})"},
    "or": {"*": "({a} || {b})"},
}
_KIND = {"float": "f", "double": "d", "long long": "i", "bool": "b"}

SERIAL_REDUCE_MAX = 32  # a reduction this small runs inside one thread per output element
BLOCK = 256


def kind_of(dtype: str) -> str:
    return _KIND[reg(dtype)]


def primitive(table: dict[str, dict[str, str]], op: str, dtype: str) -> str:
    row = table.get(op)
    if row is None:
        raise NPUCompileError(f"cuda target: no primitive '{op}'")
    k = kind_of(dtype)
    text = row.get(k, row.get("*"))
    if text is None:
        raise NPUCompileError(f"cuda target: primitive '{op}' is not defined for {dtype}")
    return text


@dataclass
class _Scope:
    """Statements of one loop body and the names already computed in it (values are reused only in their scope:
    a reduction's body is a loop of its own)."""

    indent: str
    lines: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)


class ExprRenderer:
    """Renders one expression over output indices `o{d}` (and reduction indices `r{d}` inside a reduction)."""

    def __init__(self, args: list[TensorRef], arg_dtypes: list[str], out_rank: int, ityp: str,
                 reduce_shape: tuple[int, ...], block_reduce: bool) -> None:
        self.args = args
        self.arg_dtypes = arg_dtypes
        self.out_rank = out_rank
        self.ityp = ityp
        self.reduce_shape = reduce_shape
        self.block_reduce = block_reduce
        self.count = 0
        self.uses_reduce_types: set[str] = set()
        self.out_shape: tuple[int, ...] | None = None

    def fresh(self) -> str:
        self.count += 1
        return f"t{self.count}"

    def emit(self, e: X.Expr, scope: _Scope, in_reduce: bool) -> str:
        key = repr(X.to_data(e))
        hit = scope.names.get(key)
        if hit is not None:
            return hit
        if isinstance(e, X.Reduce):
            if in_reduce:
                raise NPUCompileError("cuda target: a reduction inside a reduction is not supported")
            name = self._reduce(e, scope)
            scope.names[key] = name
            return name
        text = self._text(e, scope, in_reduce)
        name = self.fresh()
        scope.lines.append(f"{scope.indent}const {reg(e.dtype)} {name} = {text};")
        scope.names[key] = name
        return name

    def _text(self, e: X.Expr, scope: _Scope, in_reduce: bool) -> str:
        if isinstance(e, X.Load):
            return self._load(e, in_reduce)
        if isinstance(e, X.Const):
            return literal(e.value, e.dtype)
        if isinstance(e, X.Index):
            if not 0 <= e.dim < self.out_rank:
                raise NPUCompileError(f"cuda target: index dim {e.dim} out of range for rank {self.out_rank}")
            return f"(long long)o{e.dim}"
        if isinstance(e, X.Unary):
            a = self.emit(e.x, scope, in_reduce)
            return primitive(UNARY, e.op, e.x.dtype).format(a=a)
        if isinstance(e, X.Binary):
            a = self.emit(e.a, scope, in_reduce)
            b = self.emit(e.b, scope, in_reduce)
            # Comparisons and logic compute in the operands' type; arithmetic in the result's register type
            # (the builders already cast operands to it; a stray mismatch is converted here, as the reference does).
            if e.op in X.COMPARE_OPS or e.op in ("and", "or"):
                od = e.a.dtype
                if reg(e.a.dtype) != reg(e.b.dtype):
                    od = "float64" if "double" in (reg(e.a.dtype), reg(e.b.dtype)) else "float32"
                    a, b = cast_expr(a, e.a.dtype, od), cast_expr(b, e.b.dtype, od)
                return primitive(BINARY, e.op, od).format(a=a, b=b)
            if reg(e.a.dtype) != reg(e.dtype):
                a = cast_expr(a, e.a.dtype, e.dtype)
            if reg(e.b.dtype) != reg(e.dtype):
                b = cast_expr(b, e.b.dtype, e.dtype)
            return primitive(BINARY, e.op, e.dtype).format(a=a, b=b)
        if isinstance(e, X.Where):
            c = self.emit(e.cond, scope, in_reduce)
            a = self.emit(e.a, scope, in_reduce)
            b = self.emit(e.b, scope, in_reduce)
            if e.cond.dtype != "bool":
                c = cast_expr(c, e.cond.dtype, "bool")
            if reg(e.a.dtype) != reg(e.dtype):
                a = cast_expr(a, e.a.dtype, e.dtype)
            if reg(e.b.dtype) != reg(e.dtype):
                b = cast_expr(b, e.b.dtype, e.dtype)
            return f"({c} ? {a} : {b})"
        if isinstance(e, X.Cast):
            x = self.emit(e.x, scope, in_reduce)
            return cast_expr(x, e.x.dtype, e.dtype)
        raise NPUCompileError(f"cuda target: unknown expression {type(e).__name__}")

    def _load(self, e: X.Load, in_reduce: bool) -> str:
        if not 0 <= e.arg < len(self.args):
            raise NPUCompileError(f"cuda target: load of argument {e.arg}, the kernel has {len(self.args)}")
        if len(e.strides) != self.out_rank:
            raise NPUCompileError(f"cuda target: load map of rank {len(e.strides)} for an output of rank "
                                  f"{self.out_rank}")
        terms = [(f"o{d}", s) for d, s in enumerate(e.strides)]
        if e.rstrides:
            if not in_reduce:
                raise NPUCompileError("cuda target: a load with reduction strides outside a reduction")
            if len(e.rstrides) != len(self.reduce_shape):
                raise NPUCompileError("cuda target: reduction strides do not match the reduction shape")
            terms += [(f"r{d}", s) for d, s in enumerate(e.rstrides)]
        dt = self.arg_dtypes[e.arg]
        if not e.rstrides and self.out_shape is not None and is_flat_map(self.out_shape, e.strides):
            where = f"i + {e.offset}" if e.offset else "i"  # the flat output index is the element offset
        else:
            where = affine(terms, e.offset)
        return load_expr(dt, f"a{e.arg}[{where}]")

    def _reduce(self, e: X.Reduce, scope: _Scope) -> str:
        acc_t = reg(e.dtype)
        if acc_t not in ("float", "long long", "double"):
            raise NPUCompileError(f"cuda target: reduction accumulating in {e.dtype}")
        if e.op == "sum":
            init = "0.0f" if acc_t == "float" else ("0.0" if acc_t == "double" else "0LL")
            combine = "{acc} + {v}"
            functor = "NpuSum()"
        elif e.op == "max":
            init = NEG_INF_F if acc_t == "float" else (INT64_MIN if acc_t == "long long" else "-__longlong_as_double("
                                                                                               "0x7ff0000000000000LL)")
            combine = "npu_max({acc}, {v})"
            functor = "NpuMax()"
        else:
            raise NPUCompileError(f"cuda target: unknown reduction '{e.op}'")
        self.count += 1
        acc = f"acc{self.count}"
        n = math.prod(self.reduce_shape)
        ind = scope.indent
        scope.lines.append(f"{ind}{acc_t} {acc} = {init};")
        if self.block_reduce:
            scope.lines.append(f"{ind}for ({self.ityp} r = threadIdx.x; r < {n}; r += blockDim.x) {{")
        else:
            scope.lines.append(f"{ind}for ({self.ityp} r = 0; r < {n}; ++r) {{")
        body = _Scope(ind + "  ")
        body.lines += decompose("r", self.reduce_shape, "r", self.ityp, body.indent)
        v = self.emit(e.body, body, in_reduce=True)
        if reg(e.body.dtype) != acc_t:
            v = cast_expr(v, e.body.dtype, e.dtype)
        body.lines.append(f"{body.indent}{acc} = {combine.format(acc=acc, v=v)};")
        scope.lines += body.lines
        scope.lines.append(f"{ind}}}")
        if self.block_reduce:
            sh = {"float": "npu_sh_f", "long long": "npu_sh_i", "double": "npu_sh_d"}[acc_t]
            self.uses_reduce_types.add(acc_t)
            scope.lines.append(f"{ind}{acc} = npu_block_reduce({acc}, {functor}, {sh});")
        return acc


def _reduce_block(n: int) -> int:
    if n <= 1024:
        return 32
    if n <= 8192:
        return 128
    return 256


def render_generated(kernel: KernelCall, program: CompiledProgram) -> tuple[str, Launch]:
    expr = X.from_data(kernel.expr)
    return render_expression(expr, kernel.args, [program.buffers[a.buffer].dtype for a in kernel.args],
                             kernel.outs[0], program.buffers[kernel.outs[0].buffer].dtype, kernel.reduce_shape,
                             [("out", 0)] + [("arg", i) for i in range(len(kernel.args))])


def render_expression(expr: X.Expr, args: list[TensorRef], arg_dtypes: list[str], out: TensorRef, out_dtype: str,
                      reduce_shape: tuple[int, ...], ptrs: list[tuple[str, int]], restrict: bool = True
                      ) -> tuple[str, Launch]:
    """The source of one expression kernel writing `out` (a strided view) and its launch. `restrict=False` when an
    argument may be the output buffer itself."""
    shape = tuple(out.shape)
    n_out = math.prod(shape)
    n_red = math.prod(reduce_shape) if reduce_shape else 1
    has_reduce = any(isinstance(x, X.Reduce) for x in X.walk(expr))
    extents = [n_out * max(n_red, 1), max_extent(shape, out.strides, out.offset)]
    for ld in X.loads(expr):
        full = shape + (tuple(reduce_shape) if ld.rstrides else ())
        extents.append(max_extent(full, tuple(ld.strides) + tuple(ld.rstrides), ld.offset))
    ityp = index_type(max(extents))
    block_reduce = has_reduce and n_red > SERIAL_REDUCE_MAX
    r = ExprRenderer(args, arg_dtypes, len(shape), ityp, tuple(reduce_shape), block_reduce)
    r.out_shape = shape

    if block_reduce:
        block = _reduce_block(n_red)
        loop = f"for ({ityp} i = blockIdx.x; i < {n_out}; i += gridDim.x) {{"
        grid = grid_for(n_out, 1, cap=65536)
    else:
        block = BLOCK
        loop = (f"for ({ityp} i = ({ityp})blockIdx.x * blockDim.x + threadIdx.x; i < {n_out}; "
                f"i += ({ityp})gridDim.x * blockDim.x) {{")
        grid = grid_for(n_out, block)
    body = _Scope("    ")
    body.lines += decompose("i", shape, "o", ityp, body.indent)
    value = r.emit(expr, body, in_reduce=False)
    if is_flat_map(shape, out.strides):
        where = f"i + {out.offset}" if out.offset else "i"
    else:
        where = affine([(f"o{d}", s) for d, s in enumerate(out.strides)], out.offset)
    store = f"out0[{where}] = {store_expr(out_dtype, value, expr.dtype)};"
    if block_reduce:
        body.lines.append(f"{body.indent}if (threadIdx.x == 0) {store}")
    else:
        body.lines.append(f"{body.indent}{store}")

    params = [f"{storage(out_dtype)}* out0"]
    for i, dt in enumerate(arg_dtypes):
        params.append(f"const {storage(dt)}* {'__restrict__ ' if restrict else ''}a{i}")
    lines = [PRELUDE]
    if block_reduce:
        lines.append(REDUCE_HELPERS)
    lines.append(f'extern "C" __global__ void __launch_bounds__({block}) {KERNEL_NAME}({", ".join(params)}) {{')
    for t in sorted(r.uses_reduce_types):
        sh = {"float": "npu_sh_f", "long long": "npu_sh_i", "double": "npu_sh_d"}[t]
        lines.append(f"  __shared__ {t} {sh}[32];")
    lines.append(f"  {loop}")
    lines += body.lines
    lines.append("  }")
    lines.append("}")
    src = "\n".join(lines) + "\n"
    launch = Launch((grid if n_out else 0, 1, 1), block, ptrs)
    return src, launch
