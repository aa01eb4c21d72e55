"""The CPU target: generated kernels rendered as NumPy functions (float math in fp32, rounding per `Cast`)."""

from __future__ import annotations

from ..expr import nodes as X
from ..program import CompiledProgram, KernelCall
from .codegen import CodegenTarget, register_target

# Each primitive once. `{a}`, `{b}` are operand expressions.
UNARY = {
    "neg": "np.negative({a})",
    "exp": "np.exp({a})",
    "log": "np.log({a})",
    "sqrt": "np.sqrt({a})",
    "rsqrt": "(1.0 / np.sqrt({a}))",
    "sin": "np.sin({a})",
    "cos": "np.cos({a})",
    "tanh": "np.tanh({a})",
    "erf": "_erf({a})",
    "abs": "np.abs({a})",
    "not": "np.logical_not({a})",
    "floor": "np.floor({a})",
    "trunc": "np.trunc({a})",
}
BINARY = {
    "add": "({a} + {b})",
    "sub": "({a} - {b})",
    "mul": "({a} * {b})",
    "div": "_div({a}, {b})",
    "max": "_maximum({a}, {b})",
    "min": "_minimum({a}, {b})",
    "pow": "np.power({a}, {b})",
    "eq": "({a} == {b})",
    "ne": "({a} != {b})",
    "lt": "({a} < {b})",
    "le": "({a} <= {b})",
    "gt": "({a} > {b})",
    "ge": "({a} >= {b})",
    "and": "np.logical_and({a}, {b})",
    "or": "np.logical_or({a}, {b})",
}
# Register types: every float computes in fp32 (fp64 in fp64), ints in int64, bools as bool.
REG = {"float32": "np.float32", "float16": "np.float32", "bfloat16": "np.float32", "float64": "np.float64",
       "bool": "np.bool_"}


def reg(dtype: str) -> str:
    return REG.get(dtype, "np.int64")


@register_target
class NumpyTarget(CodegenTarget):
    name = "cpu"
    library_kernels = frozenset({
        "gemm", "conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "embedding", "index_copy",
        "softmax", "attention", "rmsnorm", "rope",
    })

    def render_generated(self, kernel: KernelCall, program: CompiledProgram) -> str:
        expr = X.from_data(kernel.expr)
        lines: list[str] = []
        names: dict[int, str] = {}

        def emit(e: X.Expr) -> str:
            if id(e) in names:
                return names[id(e)]
            if isinstance(e, X.Load):
                text = f"L[{len(names)}]"  # placeholder; loads are bound by the executor in order
                raise AssertionError(text)
            if isinstance(e, X.Const):
                v = e.value
                text = f"{reg(e.dtype)}({v!r})" if not isinstance(v, float) or v == v and abs(v) != float("inf") \
                    else f"{reg(e.dtype)}(float('{v}'))"
            elif isinstance(e, X.Index):
                text = f"I[{e.dim}]"
            elif isinstance(e, X.Unary):
                text = UNARY[e.op].format(a=emit(e.x))
            elif isinstance(e, X.Binary):
                text = BINARY[e.op].format(a=emit(e.a), b=emit(e.b))
                if e.op in X.COMPARE_OPS or e.op in ("and", "or"):
                    pass
                else:
                    text = f"_as({text}, {reg(e.dtype)})"
            elif isinstance(e, X.Where):
                text = f"np.where({emit(e.cond)}, {emit(e.a)}, {emit(e.b)})"
            elif isinstance(e, X.Cast):
                text = f"_cast({emit(e.x)}, {e.dtype!r})"
            elif isinstance(e, X.Reduce):
                axes = tuple(range(-len(kernel.reduce_shape), 0))
                fn = "np.sum" if e.op == "sum" else "np.max"
                text = f"{fn}({emit(e.body)}, axis={axes}, dtype={reg(e.dtype)})" if e.op == "sum" else \
                    f"{fn}({emit(e.body)}, axis={axes})"
            else:
                raise TypeError(e)
            name = f"t{len(names)}"
            lines.append(f"    {name} = {text}")
            names[id(e)] = name
            return name

        load_list = X.loads(expr)
        for i, ld in enumerate(load_list):
            names[id(ld)] = f"a{i}"
            lines.append(f"    a{i} = _up(L[{i}])")
        result = emit(expr)
        head = "def kernel(L, I, out):"
        body = "\n".join(lines) if lines else "    pass"
        return f"{head}\n{body}\n    _store(out, {result})\n"
