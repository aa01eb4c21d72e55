"""npusim verify IR.json --weights W.safetensors: compile, run, and compare with torch_ir.IRExecutor; or compare an
artifact's outputs with golden outputs the user brings (--expected FILE.npz)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .. import argtypes
from ..common import (
    CLIError,
    add_compile_options,
    add_force_cpu_option,
    add_quiet_option,
    add_run_options,
    check_output_folder,
    check_weights_digest,
    collect_inputs,
    compile_kwargs,
    device_line,
    dtype_line,
    parse_inputs,
    planned_device,
    resolve_weights,
)


def register(sub) -> None:
    p = sub.add_parser(
        "verify", help="compile, run and compare with PyTorch (torch_ir.IRExecutor) or with golden outputs",
        description="Compile the IR, run it on a backend and compare every output with the independent reference "
                    "(torch_ir.IRExecutor, ATen op by op): max abs/rel error, Pearson r, top-k agreement. Prints the "
                    "tolerance it applies; exit status 0 only within it.\n\n"
                    "  npusim verify model.json --weights model.safetensors\n"
                    "  npusim verify model.json --weights model.safetensors --atol 1e-2 --rtol 1e-2\n"
                    "  npusim verify model.npubin --weights model.safetensors --input x=x.npy --expected golden.npz\n\n"
                    "Default tolerance per compute dtype (docs/tolerances.md): " + _default_tolerances())
    p.add_argument("ir", metavar="MODEL", help="IR JSON file; or a .npubin artifact together with --expected")
    add_run_options(p)
    p.add_argument("--expected", metavar="FILE.npz", default=None,
                   help="compare with these golden outputs (arrays named like the model's outputs) instead of "
                        "running the PyTorch reference; needs every input given with --input")
    tol = p.add_argument_group("tolerance (default: the compute dtype's, see above)")
    tol.add_argument("--atol", type=argtypes.non_negative, default=None,
                     help="elementwise: every |out - ref| <= atol + rtol * |ref| (replaces the max|err|/max|ref| "
                          "bound unless --max-rel is given too; default: no elementwise bound)")
    tol.add_argument("--rtol", type=argtypes.non_negative, default=None,
                     help="elementwise relative bound, with --atol (default: no elementwise bound)")
    tol.add_argument("--max-rel", type=argtypes.non_negative, default=None,
                     help="bound on max|err| / max|ref| (default: the compute dtype's)")
    tol.add_argument("--min-pearson", type=argtypes.number(name="correlation"), default=None,
                     help="lowest Pearson r between output and reference (default: the compute dtype's)")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument("-o", "--output", metavar="X.npubin", default=None,
                   help="when it passes, write the verified program (an IR compiled as one program) with the SHA-256 "
                        "of the weights it passed with, which `npusim run` checks (default: nothing written)")
    p.add_argument("--per-node", action="store_true",
                   help="also compare every intermediate that survives fusion with the reference value of its IR "
                        "node (cpu and webgpu backends, dtype default tolerance) and name the first kernel outside it")
    p.add_argument("--dump-repro", metavar="DIR", default=None,
                   help="implies --per-node: write the first failing kernel's inputs, expected output and a script "
                        "(repro.py) that reruns just that kernel")
    add_quiet_option(p)
    add_force_cpu_option(p)
    add_compile_options(p)
    p.set_defaults(func=run)


def _default_tolerances() -> str:
    from npu_runtime.metrics import MODEL_TOLERANCE, model_tolerance

    return "; ".join(f"{dt}: {model_tolerance(dt).describe().split(' (')[0]}" for dt in MODEL_TOLERANCE) + "."


def reference_weights(prog, ws) -> tuple[dict, dict]:
    """Checkpoint keys the program (or programs) resolved by itself (a tied lm_head, a computed rotary inv_freq), for
    the reference, which reads the checkpoint by key only. `ws`: the weight set, or the weight report."""
    report = getattr(ws, "report", ws)
    extra = dict(report.fallbacks)
    computed = {}
    for spec in [w for p in (prog if isinstance(prog, list) else [prog]) for w in p.weights]:
        if spec.recipe.kind == "rope_inv_freq":
            from npu_runtime.weights import TensorSource, WeightReport, make_weight

            computed[spec.key] = make_weight(spec, TensorSource({}), WeightReport())
    return extra, computed


def _tolerance(args: argparse.Namespace, compute: str):
    from npu_runtime.metrics import model_tolerance

    return model_tolerance(compute, min_pearson=args.min_pearson, max_rel=args.max_rel, atol=args.atol,
                           rtol=args.rtol)


def _check_combinations(args: argparse.Namespace, artifact: bool) -> None:
    per_node = args.per_node or args.dump_repro
    if per_node and args.expected:
        raise CLIError("--per-node compares every kernel with the PyTorch reference; --expected replaces that "
                       "reference with golden outputs: use one or the other")
    if artifact and not args.expected:
        raise CLIError(f"{args.ir} is an artifact: comparing with PyTorch needs the IR JSON it came from; give the "
                       "IR, or golden outputs with --expected FILE.npz")
    if artifact and (per_node or args.force_cpu):
        raise CLIError("--per-node, --dump-repro and --force-cpu need the IR JSON, not an artifact (--per-node "
                       "compares every kernel with the IR's nodes; --force-cpu decides how the IR is compiled)")
    compile_opts = [f for f, on in (("--dtype", args.dtype != "auto"), ("--disable-pass", args.disable_pass),
                                    ("--no-fusion", args.no_fusion), ("--rope-theta", args.rope_theta is not None))
                    if on]
    if artifact and compile_opts:
        raise CLIError(f"{', '.join(compile_opts)} set how an IR is compiled; {args.ir} is compiled already "
                       "(compile again with them, or verify the IR JSON)")


def run(args: argparse.Namespace) -> int:
    import npu_compiler
    import npu_runtime

    from ..llm_contract import find_contract
    from ..partition_path import check_force_cpu, needs_partition, partition_notice

    artifact = not args.ir.endswith(".json")
    _check_combinations(args, artifact)
    resolve_weights(args, args.ir)
    if args.output is not None:
        if artifact:
            raise CLIError("-o writes the program verify compiles from an IR; an artifact is written already")
        check_output_folder(args.output)
    if args.dump_repro:
        from npu_runtime.inspect import check_repro_folder

        check_repro_folder(args.dump_repro)
    backend = npu_runtime.get_backend(args.backend)
    contract = find_contract(args.ir)
    if contract is not None and args.rope_theta is None:
        args.rope_theta = contract.rope_theta  # the export knows the rotary base its graphs were made with
    if artifact:
        prog = npu_compiler.load_artifact(args.ir)
        check_weights_digest(prog, args.weights)
        if isinstance(prog, npu_compiler.PartitionedProgram):
            return _verify_partitioned(args, backend, prog, [], contract)
    else:
        check_force_cpu(args.ir, args.force_cpu)
        fallback = needs_partition(args.ir, backend.compile_target(), args.force_cpu)
        if fallback:
            print(partition_notice(fallback, backend.compile_target()), file=sys.stderr)
            kw = planned_device(compile_kwargs(args), backend.compile_target(), backend)
            art = npu_compiler.compile_artifact(args.ir, backend.compile_target(), force_cpu=args.force_cpu,
                                                partitioned=True, **kw)
            return _verify_partitioned(args, backend, art, fallback, contract)
        kw = planned_device(compile_kwargs(args), backend.compile_target(), backend)
        prog = npu_compiler.compile(args.ir, backend.compile_target(), **kw)
    given = parse_inputs(args.input)
    expected = None
    if args.expected:
        _require_inputs(prog.inputs, given)
        expected = _load_expected(args.expected, [(s.name, tuple(s.shape)) for s in prog.outputs], prog.model_name)
    inp = collect_inputs(prog, given, args.seed, contract)
    _notice(args, inp)
    from ..progress import Progress

    with Progress("loading weights", quiet=args.quiet or args.json) as bar:
        ws = npu_runtime.load_weights(prog, args.weights, backend, progress=bar.callback,
                                      allow_nonfinite=args.allow_nonfinite_weights)
    executor = backend.create_executor(prog)
    outs = executor.run_numpy(inp.arrays, ws)

    per_node = None
    if expected is not None:
        ref, against = expected, args.expected
    else:
        sd = _reference_state_dict(args, prog, ws)
        against = "torch_ir.IRExecutor"
        if args.per_node or args.dump_repro:
            per_node, ref = _per_node(args, prog, executor, inp.arrays, ws, sd)
        else:
            from npu_export.reference import run_reference

            ref = run_reference(args.ir, sd, inp.arrays)
    from npu_runtime.inspect import tolerance_dtype

    tol = _tolerance(args, tolerance_dtype(prog.compute_dtype, [prog]))
    from npu_runtime.metrics import compare

    classes = set(prog.stats.get("class_outputs", ()))
    rows = [compare(name, outs[name], ref[name], prog.compute_dtype, tol, class_axis=name in classes) for name in ref]
    ok = all(r.passed for r in rows)
    report = {"model": prog.model_name, "backend": backend.name, "device": backend.describe(), "target": prog.target,
              "compute_dtype": prog.compute_dtype, "compute_dtype_reason": prog.stats.get("compute_dtype_reason"),
              "kernels": len(prog.kernels), "reference": against,
              "tolerance": {**tol.to_dict(), "text": tol.describe()}, "generated_inputs": inp.generated,
              "passed": ok, "outputs": [r.to_dict() for r in rows], "weights": ws.report.summary()}
    if per_node is not None:
        report["per_node"] = per_node
        ok = ok and per_node["first_failure"] is None
        report["passed"] = ok
    if args.json:
        print(json.dumps(report, indent=1))
        _write_verified(args, prog, ok)
        return 0 if ok else 1
    print(f"verify {prog.model_name} on {backend.name} ({prog.compute_dtype}, {len(prog.kernels)} kernels) "
          f"against {against}")
    if device_line(backend):
        print(device_line(backend))
    if not artifact:
        print(dtype_line(prog))
    print(f"tolerance: {tol.describe()}")
    if report["weights"] != "all weights present":
        print(f"weights: {report['weights']}")
    _print_rows(rows)
    if per_node is not None:
        _print_per_node(args, per_node)
    print("PASS" if ok else f"FAIL: outside the tolerance ({tol.describe()})")
    _write_verified(args, prog, ok)
    return 0 if ok else 1


def _write_verified(args: argparse.Namespace, prog, ok: bool) -> None:
    """-o: the program that passed, with the SHA-256 of the weights it passed with."""
    if args.output is None:
        return
    out = sys.stderr if args.json else sys.stdout
    if not ok:
        print(f"-o {args.output}: not written (the program did not pass)", file=out)
        return
    from npu_compiler.digest import short, weights_digest

    prog.weights_sha256 = weights_digest(args.weights) if os.path.exists(args.weights) else None
    prog.save(args.output)
    print(f"verified program written: {args.output} (weights sha256 {short(prog.weights_sha256)})", file=out)


def _notice(args: argparse.Namespace, inp) -> None:
    text = inp.notice(args.seed)
    if text and not args.json:
        print(text, file=sys.stderr)


def _reference_state_dict(args: argparse.Namespace, prog, ws) -> dict:
    import numpy as np

    from npu_export.reference import load_state_dict, to_torch

    sd = load_state_dict(args.weights)
    aliases, computed = reference_weights(prog, ws)
    for key, src in aliases.items():
        sd.setdefault(key, sd[src])
    for key, arr in computed.items():
        sd.setdefault(key, to_torch(np.asarray(arr, dtype=np.float32)))
    return sd


def _require_inputs(specs, given: dict) -> None:
    missing = [s.name for s in specs if s.name not in given]
    if missing:
        raise CLIError(f"--expected: golden outputs belong to specific inputs; give {', '.join(missing)} with "
                       "--input NAME=FILE.npy")


def _load_expected(path: str, outputs: list[tuple[str, tuple[int, ...]]], model: str) -> dict:
    """Golden outputs by output name, checked against the model's outputs (name, shape)."""
    import os

    import numpy as np

    from npu_compiler.atomic import note_input
    from npu_runtime.errors import InputError

    if not os.path.isfile(path):
        raise InputError(f"--expected: file not found: {path}")
    try:
        note_input(path)
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise ValueError("it holds one array, not an archive of named arrays")
        with loaded as z:
            arrays = {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError) as e:
        raise InputError(f"--expected {path}: not a .npz file of arrays ({e})") from e
    names = [n for n, _ in outputs]
    if len(arrays) == 1 and len(names) == 1 and names[0] not in arrays:
        arrays = {names[0]: next(iter(arrays.values()))}  # one array for one output: its name does not matter
    unknown = sorted(set(arrays) - set(names))
    if unknown or not arrays:
        raise InputError(f"--expected {path}: arrays {unknown or '(none)'} are not outputs of {model}; its outputs: "
                         f"{', '.join(names)}")
    for name, shape in outputs:
        if name in arrays and tuple(arrays[name].shape) != tuple(shape):
            raise InputError(f"--expected {path}: '{name}' has shape {list(arrays[name].shape)}, the model's output "
                             f"is {list(shape)}")
    absent = [n for n in names if n not in arrays]
    if absent:
        print(f"--expected {path}: no golden value for {', '.join(absent)}; not compared", file=sys.stderr)
    return arrays


def _print_rows(rows) -> None:
    w = max([len("output"), *(len(r.name) for r in rows)])
    elementwise = any(r.mismatched is not None for r in rows)
    print(f"  {'output':<{w}} {'shape':<18} {'max_abs':>10} {'max_rel':>10} {'pearson':>10} {'top1':>6} "
          f"{'top5':>6}" + (f" {'mismatched':>12}" if elementwise else "") + "  result")
    for r in rows:
        t1 = f"{r.top1_equal:.2f}" if r.top1_equal is not None else "-"
        t5 = f"{r.top5_overlap:.2f}" if r.top5_overlap is not None else "-"
        pr = f"{r.pearson:.6f}" if r.pearson is not None else "-"
        mm = ""
        if elementwise:
            n = 1
            for d in r.shape:
                n *= d
            mm = f" {f'{r.mismatched}/{n}' if r.mismatched is not None else '-':>12}"
        print(f"  {r.name:<{w}} {str(list(r.shape)):<18} {r.max_abs:>10.3g} {r.max_rel:>10.3g} "
              f"{pr:>10} {t1:>6} {t5:>6}{mm}  {'ok' if r.passed else 'FAIL'}")
    for r in rows:
        if not r.passed:
            print(f"  {r.name}: {r.why}")


def _print_per_node(args: argparse.Namespace, per_node: dict) -> None:
    print(per_node["table"])
    bad = per_node["first_failure"]
    if bad is None:
        print(f"per-node: all {per_node['compared']} compared kernels within the tolerance")
        if args.dump_repro:
            print(f"--dump-repro: nothing written to {args.dump_repro} (no kernel outside the tolerance)")
    else:
        where = f"segment {bad['segment']} " if "segment" in bad else ""
        print(f"per-node: first kernel outside the tolerance: {where}#{bad['index']} {bad['name']} "
              f"(group {bad['group']}; IR nodes {', '.join(bad['nodes'])}; IR value {bad['value']})")
        if per_node.get("repro"):
            print(f"repro written: python {per_node['repro']}")
        else:
            print("next: add --dump-repro DIR for a standalone script that reruns just that kernel")


def _verify_partitioned(args: argparse.Namespace, backend, art, fallback, contract=None) -> int:
    """A partitioned program (an artifact, or the IR compiled into one): its segments on the backend and the CPU,
    compared with the reference or golden outputs; with --per-node, every kernel of every program segment and every
    torch_ir segment's outputs against the reference's values of their IR nodes."""
    from npu_runtime.dag_executor import DAGExecutor
    from npu_runtime.metrics import compare

    given = parse_inputs(args.input)
    if args.expected:
        _require_inputs(art.inputs, given)
    inp = collect_inputs(art.inputs, given, args.seed, contract)
    _notice(args, inp)
    dag = DAGExecutor(art, backend, weights=args.weights, allow_nonfinite=args.allow_nonfinite_weights)
    per_node = None
    if args.expected:
        outs = dag.run(inp.arrays)
        ref = _load_expected(args.expected, [(t.name, tuple(t.shape)) for t in art.outputs], art.model_name)
        against = args.expected
    else:
        from npu_export.reference import run_reference

        sd = _reference_state_dict(args, art.programs, dag.pool.report)
        against = "torch_ir.IRExecutor"
        if args.per_node or args.dump_repro:
            per_node, ref = _per_node_partitioned(args, dag, inp.arrays, sd)
            outs = dag.host_outputs()
        else:
            outs = dag.run(inp.arrays)
            ref = run_reference(args.ir, sd, inp.arrays)
    from npu_runtime.inspect import tolerance_dtype

    compute = art.compute_dtype
    tol = _tolerance(args, tolerance_dtype(compute, art.programs))
    classes = set(art.stats.get("class_outputs", ()))
    rows = [compare(name, outs[name], ref[name], compute, tol, class_axis=name in classes) for name in ref]
    ok = all(r.passed for r in rows) and (per_node is None or per_node["first_failure"] is None)
    report = {"model": art.model_name, "backend": backend.name, "device": backend.describe(), "target": art.target,
              "compute_dtype": compute, "compute_dtype_reason": art.stats.get("compute_dtype_reason"),
              "partition_path": True, "partitions": len(art.segments), "segments": len(art.segments),
              "transfers": dag.num_transfers, "kernels": art.kernel_count, "reference": against,
              "tolerance": {**tol.to_dict(), "text": tol.describe()}, "generated_inputs": inp.generated,
              "fallback_nodes": [{"name": f.name, "op": f.op, "reason": f.reason, "runner": f.runner}
                                 for f in art.fallback],
              "passed": ok, "outputs": [r.to_dict() for r in rows], "weights": dag.pool.report.summary()}
    if per_node is not None:
        report["per_node"] = per_node
    if args.json:
        print(json.dumps(report, indent=1))
        _write_verified(args, art, ok)
        return 0 if ok else 1
    cpu = sum(s.device == "cpu" for s in art.segments)
    print(f"verify {art.model_name} on {backend.name} ({compute}, {len(art.segments)} segments: {cpu} on the CPU, "
          f"{art.kernel_count} kernels, {dag.num_transfers} transfers) against {against}")
    if device_line(backend):
        print(device_line(backend))
    print(dtype_line(art))
    print(f"tolerance: {tol.describe()}")
    _print_rows(rows)
    if per_node is not None:
        _print_per_node(args, per_node)
    print("PASS" if ok else f"FAIL: outside the tolerance ({tol.describe()})")
    _write_verified(args, art, ok)
    return 0 if ok else 1


def _per_node_partitioned(args: argparse.Namespace, dag, inputs, sd) -> tuple[dict, dict]:
    """Every kernel of every program segment and every torch_ir segment's outputs against the reference values of
    their IR nodes, from one reference run; the graph outputs come from the same run."""
    from npu_export.reference import run_reference, run_reference_all
    from npu_runtime import inspect as npi

    values, node_outputs = run_reference_all(args.ir, sd, inputs)
    names = [t.name for t in dag.program.outputs]
    ref = {n: values[n] for n in names if n in values}
    if len(ref) != len(names):
        ref = run_reference(args.ir, sd, inputs)
    captured = npi.capture_partitioned(dag, inputs)
    rows = npi.check_partitioned(dag, captured, values, node_outputs)
    bad = npi.first_failure(rows)
    result = {"kernels": [r.to_dict() for r in rows], "compared": sum(r.comparison is not None for r in rows),
              "first_failure": bad.to_dict() if bad else None, "table": npi.format_table(rows), "repro": None}
    if bad is not None and args.dump_repro and bad.segment is not None and bad.kind != "torch_ir":
        st = dag.stages[bad.segment]
        result["repro"] = npi.dump_repro(args.dump_repro, st.executor, captured[bad.segment][0], st.weights, bad,
                                         values[bad.value], values, node_outputs,
                                         npi.partitioned_tolerance_dtype(dag))
    if args.json:
        del result["table"]
    return result, ref


def _per_node(args: argparse.Namespace, prog, executor, inputs, ws, sd) -> tuple[dict, dict]:
    """Every kernel's output against the reference value of its IR node; the graph outputs come from the same
    reference run."""
    from npu_export.reference import run_reference, run_reference_all
    from npu_runtime import inspect as npi

    if not hasattr(executor, "run_observed"):
        raise CLIError(f"--per-node needs a backend that can stop after every kernel (cpu, webgpu); "
                       f"{executor.backend.name} cannot yet: add --backend cpu")
    values, node_outputs = run_reference_all(args.ir, sd, inputs)
    names = [s.name for s in prog.outputs]
    ref = {n: values[n] for n in names if n in values}
    if len(ref) != len(names):
        ref = run_reference(args.ir, sd, inputs)
    captured = npi.capture_outputs(executor, inputs, ws)
    rows = npi.check_kernels(prog, captured, values, node_outputs, executor.backend)
    bad = npi.first_failure(rows)
    result = {"kernels": [r.to_dict() for r in rows], "compared": sum(r.comparison is not None for r in rows),
              "first_failure": bad.to_dict() if bad else None, "table": npi.format_table(rows), "repro": None}
    if bad is not None and args.dump_repro:
        result["repro"] = npi.dump_repro(args.dump_repro, executor, inputs, ws, bad, values[bad.value], values,
                                         node_outputs)
    if args.json:
        del result["table"]
    return result, ref
