"""npusim verify IR.json --weights W.safetensors: compile, run, and compare with torch_ir.IRExecutor."""

from __future__ import annotations

import argparse
import json
import sys

from ..common import (
    add_compile_options,
    add_run_options,
    compile_kwargs,
    complete_inputs,
    input_specs_from_ir,
    parse_inputs,
)


def register(sub) -> None:
    p = sub.add_parser("verify", help="compile, run and compare with PyTorch (torch_ir.IRExecutor)",
                       description="Compile the IR, run it on a backend and compare every output with the "
                                   "independent reference (torch_ir.IRExecutor, ATen op by op): max abs/rel error, "
                                   "Pearson r, top-k agreement. Exit status 0 only within the tolerance of the "
                                   "compute dtype.")
    p.add_argument("ir", help="IR JSON file")
    add_run_options(p)
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument("--per-node", action="store_true",
                   help="also compare every intermediate that survives fusion with the reference value of its IR "
                        "node (cpu backend) and name the first kernel outside the tolerance")
    p.add_argument("--dump-repro", metavar="DIR", default=None,
                   help="with --per-node: write the first failing kernel's inputs, expected output and a "
                        "script (repro.py) that reruns just that kernel")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--force-cpu", action="append", default=[], metavar="OP",
                   help="run these ops (or node names) on the CPU through the partition path (repeatable)")
    add_compile_options(p)
    p.set_defaults(func=run)


def reference_weights(prog, ws) -> dict:
    """Checkpoint keys the program resolved by itself (a tied lm_head, a computed rotary inv_freq), for the
    reference, which reads the checkpoint by key only."""
    extra = {}
    for key, used in ws.report.fallbacks.items():
        extra[key] = used
    computed = {}
    for spec in prog.weights:
        if spec.recipe.kind == "rope_inv_freq":
            from npu_runtime.weights import TensorSource, WeightReport, make_weight

            computed[spec.key] = make_weight(spec, TensorSource({}), WeightReport())
    return extra, computed


def run(args: argparse.Namespace) -> int:
    import numpy as np

    import npu_compiler
    import npu_runtime
    from npu_export.reference import load_state_dict, run_reference, to_torch
    from npu_runtime.metrics import compare

    from ..partition_path import needs_partition

    backend = npu_runtime.get_backend(args.backend)
    fallback = needs_partition(args.ir, backend.compile_target(), args.force_cpu)
    if fallback:
        return _verify_partitioned(args, backend, fallback)
    prog = npu_compiler.compile(args.ir, backend.compile_target(), **compile_kwargs(args))
    compute = prog.compute_dtype
    inputs = complete_inputs(prog, parse_inputs(args.input), args.seed)
    from ..progress import Progress

    with Progress("loading weights", quiet=args.quiet or args.json) as bar:
        ws = npu_runtime.load_weights(prog, args.weights, backend, progress=bar.callback)
    executor = backend.create_executor(prog)
    outs = executor.run_numpy(inputs, ws)

    sd = load_state_dict(args.weights)
    aliases, computed = reference_weights(prog, ws)
    for key, src in aliases.items():
        sd.setdefault(key, sd[src])
    for key, arr in computed.items():
        sd.setdefault(key, to_torch(np.asarray(arr, dtype=np.float32)))
    per_node = None
    if args.per_node or args.dump_repro:
        per_node, ref = _per_node(args, prog, executor, inputs, ws, sd)
    else:
        ref = run_reference(args.ir, sd, inputs)

    rows = [compare(name, outs[name], ref[name], prog.compute_dtype) for name in ref]
    ok = all(r.passed for r in rows)
    report = {"model": prog.model_name, "backend": backend.name, "target": prog.target,
              "compute_dtype": prog.compute_dtype, "kernels": len(prog.kernels), "passed": ok,
              "outputs": [r.to_dict() for r in rows], "weights": ws.report.summary()}
    if per_node is not None:
        report["per_node"] = per_node
        ok = ok and per_node["first_failure"] is None
        report["passed"] = ok
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"verify {prog.model_name} on {backend.name} ({compute}, {len(prog.kernels)} kernels) "
              "against torch_ir.IRExecutor")
        _print_rows(rows)
        if per_node is not None:
            print(per_node["table"])
            bad = per_node["first_failure"]
            if bad is None:
                print(f"per-node: all {per_node['compared']} compared kernels within the tolerance")
            else:
                print(f"per-node: first kernel outside the tolerance: #{bad['index']} {bad['name']} "
                      f"(group {bad['group']}; IR nodes {', '.join(bad['nodes'])}; IR value {bad['value']})")
            if per_node.get("repro"):
                print(f"repro written: python {per_node['repro']}")
        print("PASS" if ok else "FAIL: outside the tolerance of " + compute)
    return 0 if ok else 1


def _print_rows(rows) -> None:
    print(f"  {'output':<20} {'shape':<18} {'max_abs':>10} {'max_rel':>10} {'pearson':>10} {'top1':>6} "
          f"{'top5':>6}  result")
    for r in rows:
        t1 = f"{r.top1_equal:.2f}" if r.top1_equal is not None else "-"
        t5 = f"{r.top5_overlap:.2f}" if r.top5_overlap is not None else "-"
        print(f"  {r.name:<20} {str(list(r.shape)):<18} {r.max_abs:>10.3g} {r.max_rel:>10.3g} "
              f"{r.pearson:>10.6f} {t1:>6} {t5:>6}  {'ok' if r.passed else 'FAIL'}")


def _verify_partitioned(args: argparse.Namespace, backend, fallback) -> int:
    """Ops without a lowering for the target run on the CPU (torch_ir) through the partition path; say so."""
    from npu_compiler.ir.reader import read_ir
    from npu_compiler.passes.dtype import choose_compute_dtype
    from npu_compiler.targets.config import default_config
    from npu_export.reference import load_state_dict, run_reference
    from npu_runtime.metrics import compare

    from ..partition_path import partition_notice, run_partitioned

    target = backend.compile_target()
    print(partition_notice(fallback, target), file=sys.stderr)
    kw = compile_kwargs(args)
    compute = choose_compute_dtype(read_ir(args.ir), default_config(target), kw["dtype"])
    inputs = complete_inputs(input_specs_from_ir(args.ir), parse_inputs(args.input), args.seed)
    sd = load_state_dict(args.weights)
    outs, dag = run_partitioned(args.ir, sd, inputs, backend, kw["dtype"], args.force_cpu, return_executor=True)
    ref = run_reference(args.ir, sd, inputs)
    rows = [compare(name, outs[name], ref[name], compute) for name in ref]
    ok = all(r.passed for r in rows)
    report = {"backend": backend.name, "target": target, "compute_dtype": compute, "partition_path": True,
              "partitions": len(dag.plan.partitions), "transfers": dag.num_transfers,
              "fallback_nodes": [{"name": f.name, "op": f.op, "reason": f.reason} for f in fallback],
              "passed": ok, "outputs": [r.to_dict() for r in rows]}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"verify {args.ir} on {backend.name} + cpu fallback ({compute}, {report['partitions']} partitions, "
              f"{report['transfers']} transfers) against torch_ir.IRExecutor")
        _print_rows(rows)
        print("PASS" if ok else "FAIL: outside the tolerance of " + compute)
    return 0 if ok else 1


def _per_node(args: argparse.Namespace, prog, executor, inputs, ws, sd) -> tuple[dict, dict]:
    """Every kernel's output against the reference value of its IR node; the graph outputs come from the same
    reference run."""
    from npu_export.reference import run_reference, run_reference_all
    from npu_runtime import inspect as npi

    if not hasattr(executor, "run_observed"):
        from npu_runtime.errors import NPURuntimeError

        raise NPURuntimeError(f"--per-node needs a backend that can stop after every kernel (cpu); "
                              f"{executor.backend.name} cannot yet")
    values, node_outputs = run_reference_all(args.ir, sd, inputs)
    names = [s.name for s in prog.outputs]
    ref = {n: values[n] for n in names if n in values}
    if len(ref) != len(names):
        ref = run_reference(args.ir, sd, inputs)
    captured = npi.capture_outputs(executor, inputs, ws)
    rows = npi.check_kernels(prog, captured, values, node_outputs)
    bad = npi.first_failure(rows)
    result = {"kernels": [r.to_dict() for r in rows], "compared": sum(r.comparison is not None for r in rows),
              "first_failure": bad.to_dict() if bad else None, "table": npi.format_table(rows), "repro": None}
    if bad is not None and args.dump_repro:
        result["repro"] = npi.dump_repro(args.dump_repro, executor, inputs, ws, bad, values[bad.value])
    if args.json:
        del result["table"]
    return result, ref
