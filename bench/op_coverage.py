"""Op coverage: every ATen op the model zoo (`npu_export.zoo`) uses, whether each target runs it and how, and the
coverage of PyTorch's core ATen op set (the ops torch tags `torch.Tag.core`, read from torch itself).

    python bench/op_coverage.py -o docs/op_coverage.md     # what docs/op_coverage.md is
    python bench/op_coverage.py --models llama-eager,vit   # a few models, to stdout

No GPU needed: op support is a property of the compiler and of each target's library kernels
(`npu_compiler.op_support`).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from npu_compiler.decompose import DECOMPOSITIONS  # noqa: E402
from npu_compiler.expr.aten_table import ELEMENTWISE  # noqa: E402
from npu_compiler.ir.schema import short_op  # noqa: E402
from npu_compiler.lowering.lower import SUPPORTED_OPS, VIEW_OPS  # noqa: E402
from npu_compiler.lowering.registry import KERNELS_OF, LOWERINGS  # noqa: E402
from npu_compiler.op_support import STRUCTURAL_OPS, unsupported_reason  # noqa: E402
from npu_compiler.passes.dead_code import is_random  # noqa: E402
from npu_compiler.targets.codegen import TARGET_MODULES  # noqa: E402

# Core ATen ops that have no place in an inference graph of static shapes, each with the reason (by rule where one
# covers a family, so that a new op of the family is classified without an entry here).
_EXCLUDED = {
    "_local_scalar_dense.default": "reads a tensor's value into Python (`.item()`): data-dependent control flow, "
                                   "not a tensor result",
    "nonzero.default": "its output's size depends on the input's values (a data-dependent shape)",
    "_fft_r2c.default": "complex tensors (the compiler has no complex dtype)",
    "_fft_c2r.default": "complex tensors (the compiler has no complex dtype)",
    "resize_.default": "changes a tensor's storage size in place: a functional graph of static shapes has none",
    "atan2.out": "an `out=` overload: torch.export functionalises it into `atan2.default` (which runs)",
}


def excluded_reason(op: str) -> str | None:
    """Why a core ATen op cannot appear in an inference graph (None where it can)."""
    base = op.partition(".")[0]
    if base.endswith("_backward"):
        return "a backward (gradient) op"
    if is_random(op):
        return "random: no two runs agree, and nothing in an inference graph draws numbers"
    if base.startswith("sym_"):
        return "a symbolic-size query: every size is static here"
    return _EXCLUDED.get(op)


def core_aten_ops() -> list[str]:
    """PyTorch's core ATen op set: every registered aten overload that torch tags `core` (torch._C's list of
    registered operators, each resolved through torch.ops.aten and kept where `torch.Tag.core` is among its
    tags)."""
    import torch

    out = set()
    for full in torch._C._dispatch_get_all_op_names():
        if not full.startswith("aten::"):
            continue
        base, _, overload = full[len("aten::"):].partition(".")
        packet = getattr(torch.ops.aten, base, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is not None and torch.Tag.core in getattr(op, "tags", ()):
            out.add(f"{base}.{overload or 'default'}")
    return sorted(out)


def how(op: str) -> str:
    """How the compiler runs an op: a no-op, a generated (expression) kernel, or library kernels, and where."""
    if op in STRUCTURAL_OPS:
        return "no-op (removed by normalisation)"
    canon = op if op in SUPPORTED_OPS or op in DECOMPOSITIONS else op.replace("_.", ".", 1)
    if canon not in LOWERINGS and canon not in DECOMPOSITIONS:
        return ""
    if canon in DECOMPOSITIONS and canon not in LOWERINGS:
        module = DECOMPOSITIONS[canon].rewrite.__module__.removeprefix("npu_compiler.").replace(".", "/") + ".py"
        return f"decomposition into lowered ops (`{module}`)"
    if canon in VIEW_OPS:
        return "view: a strided alias, a copy only where a kernel needs the layout (`lowering/views.py`)"
    if canon in ELEMENTWISE:
        return "expression, defined once in `expr/aten_table.py`"
    module = LOWERINGS[canon].__module__.removeprefix("npu_compiler.").replace(".", "/") + ".py"
    kinds = KERNELS_OF[canon]
    what = "library " + "/".join(kinds) if kinds else "expression"
    return f"{what} (`{module}`)"


def status(target: str, op: str) -> str:
    reason = unsupported_reason(target, op)
    return "yes" if reason is None else f"no: {reason}"


def zoo_ops(models: list[str]) -> tuple[dict[str, set[str]], dict[str, int], list[str]]:
    """op -> the models using it, model -> IR nodes (float32 export), models skipped (missing classes)."""
    from npu_export.zoo import ZOO, ZooUnavailable, export_zoo_model, half_dtype

    ops: dict[str, set[str]] = defaultdict(set)
    nodes: dict[str, int] = {}
    skipped = []
    for name in models:
        try:
            exports = [export_zoo_model(name, dt) for dt in ("float32", half_dtype(ZOO[name].family))]
        except ZooUnavailable as e:
            skipped.append(str(e))
            continue
        nodes[name] = len(exports[0].ir["nodes"])
        for ex in exports:
            for n in ex.ir["nodes"]:
                ops[short_op(n["op_type"])].add(name)
    return ops, nodes, skipped


def render(models: list[str]) -> str:
    import torch
    import torch_ir
    import transformers

    targets = sorted(TARGET_MODULES)
    ops, nodes, skipped = zoo_ops(models)
    core = core_aten_ops()
    lines = [
        "# Op coverage",
        "",
        "Generated by `python bench/op_coverage.py -o docs/op_coverage.md` (torch "
        f"{torch.__version__}, transformers {transformers.__version__}, pytorch-ir "
        f"{getattr(torch_ir, '__version__', '?')}); targets: {', '.join(targets)}. A target runs an op when the "
        "compiler lowers it and the target provides the library kernels the lowering emits "
        "(`npu_compiler/op_support.py`); what it does not run goes to the CPU through the partition path "
        "(`npusim partition` names each such node).",
        "",
        f"## The ops of the model zoo ({len(nodes)} models, float32 and half-dtype exports)",
        "",
        "The zoo: `npu_export/zoo.py`, verified by `tests/test_zoo.py`.",
        "",
        "| op | models | " + " | ".join(targets) + " | how |",
        "| --- | ---: | " + " | ".join("---" for _ in targets) + " | --- |",
    ]
    for op in sorted(ops):
        cells = [status(t, op) for t in targets]
        lines.append(f"| `{op}` | {len(ops[op])} | " + " | ".join(cells) + f" | {how(op)} |")
    lines += ["", "| model | IR nodes | ops | " + " | ".join(f"on {t}" for t in targets) + " |",
              "| --- | ---: | ---: | " + " | ".join("---:" for _ in targets) + " |"]
    for name, n in nodes.items():
        mine = [op for op in ops if name in ops[op]]
        cells = []
        for t in targets:
            missing = [op for op in mine if unsupported_reason(t, op) is not None]
            cells.append("all" if not missing else f"not {', '.join(missing)}")
        lines.append(f"| {name} | {n} | {len(mine)} | " + " | ".join(cells) + " |")
    if skipped:
        lines += ["", "Not in this run (the installed transformers lacks them): " + "; ".join(skipped) + "."]
    supported = {t: [op for op in core if unsupported_reason(t, op) is None] for t in targets}
    inference = [op for op in core if excluded_reason(op) is None]
    lines += [
        "",
        f"## PyTorch's core ATen op set ({len(core)} overloads)",
        "",
        "The overloads torch tags `torch.Tag.core` (the decomposed op set a backend is expected to cover after "
        "`run_decompositions()`), read from torch itself: every operator in `torch._C._dispatch_get_all_op_names()` "
        "resolved through `torch.ops.aten` and kept where `torch.Tag.core` is among its tags. The compiler reads "
        "pre-dispatch graphs (torch_ir's export does not decompose), so several core ops reach it only from "
        "decomposed exports. Composite ops are rewritten into lowered ones by one table "
        "(`npu_compiler/decompose/`).",
        "",
        f"{len(inference)} of them can appear in an inference graph of static shapes; the rest are listed below "
        "with the reason.",
        "",
        "| target | inference core ops run | share |",
        "| --- | ---: | ---: |",
    ]
    for t in targets:
        n = sum(op in supported[t] for op in inference)
        lines.append(f"| {t} | {n} of {len(inference)} | {100 * n / len(inference):.0f}% |")
    lines += ["", "| core op | " + " | ".join(targets) + " | how |",
              "| --- | " + " | ".join("---" for _ in targets) + " | --- |"]
    for op in inference:
        lines.append(f"| `{op}` | " + " | ".join("yes" if op in supported[t] else "no" for t in targets)
                     + f" | {how(op)} |")
    lines += ["", "Not in an inference graph:", "", "| core op | why |", "| --- | --- |"]
    for op in core:
        why = excluded_reason(op)
        if why is not None:
            lines.append(f"| `{op}` | {why} |")
    decomposed = sorted(op for op in DECOMPOSITIONS if op not in core)
    lines += ["", f"## Composite ops rewritten before lowering ({len(decomposed)} beyond the core set)", "",
              "The non-core ops `torch_ir` leaves in real models, each an entry of the decomposition table "
              "(`npu_compiler/decompose/`): " + ", ".join(f"`{op}`" for op in decomposed) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from npu_export.zoo import zoo_names

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", default=None, help="write the Markdown here (default: stdout)")
    ap.add_argument("--models", default=None, help="comma-separated zoo models (default: all)")
    args = ap.parse_args(argv)
    try:
        models = zoo_names(args.models)
    except ValueError as e:
        ap.error(str(e))
    text = render(models)
    if args.output:
        from npu_export._atomic import atomic_write_text

        atomic_write_text(args.output, text)
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
