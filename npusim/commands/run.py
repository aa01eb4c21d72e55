"""npusim run MODEL --weights W [--input NAME=FILE.npy ...] [-o out.npz] [--warmup N --iters N] [--top-k K]"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from npu_runtime.metrics import nonfinite

from .. import argtypes
from ..common import (
    add_force_cpu_option,
    add_quiet_option,
    add_run_options,
    add_timing_options,
    check_output_folder,
    check_weights_digest,
    collect_inputs,
    dtype_line,
    parse_inputs,
    resolve_weights,
    warn_nonfinite,
)


def register(sub) -> None:
    p = sub.add_parser(
        "run", help="run a compiled artifact: timings (median/p90/p99, throughput) and a summary of the outputs",
        description="Run a .npubin artifact (or an IR JSON, compiled on the fly) with weights and inputs. Inputs "
                    "not given are generated, and the command says how. Runs --warmup untimed and --iters timed "
                    "times and reports the latency (inputs in, outputs out, end to end) as min/mean/median/p90/"
                    "p99/max and the throughput, and the device time of --iters more runs with the inputs and "
                    "outputs on the device (the program's own work, as trtexec's GPU compute time); summarises "
                    "every output (--top-k for classifiers) and writes them to an .npz with -o.\n\n"
                    "  npusim run model.npubin --weights model.safetensors --input x=x.npy --top-k 5 -o out.npz")
    p.add_argument("artifact", metavar="MODEL", help=".npubin file (or an IR JSON, compiled on the fly)")
    add_run_options(p)
    p.add_argument("-o", "--output", default=None, help="write the outputs of the last run to this .npz "
                                                        "(default: not written)")
    add_timing_options(p)
    p.add_argument("--top-k", type=argtypes.integer(0, name="count"), default=0, metavar="K",
                   help="for each row of each float output, the K largest values and their indices (classes; K "
                        "above the row's length shows the whole row); 0 = off")
    p.add_argument("--json", action="store_true", help="machine-readable report (timings and output summaries)")
    add_force_cpu_option(p)
    add_quiet_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import npu_compiler
    import npu_runtime

    from ..timing import LatencyStats, time_runs

    if args.output is not None:
        check_output_folder(args.output)
    resolve_weights(args, args.artifact)
    backend = npu_runtime.get_backend(args.backend)
    is_ir = args.artifact.endswith(".json")
    if args.force_cpu and not is_ir:
        from ..common import CLIError

        raise CLIError("--force-cpu decides how an IR is compiled; an artifact is compiled already (compile it again "
                       "with `npusim compile --force-cpu`)")
    given = parse_inputs(args.input)
    from ..llm_contract import find_contract

    contract = find_contract(args.artifact)
    theta = contract.rope_theta if contract is not None else None
    if is_ir:
        from ..partition_path import check_force_cpu, needs_partition, partition_notice

        check_force_cpu(args.artifact, args.force_cpu)
        fallback = needs_partition(args.artifact, backend.compile_target(), args.force_cpu)
        if fallback:
            print(partition_notice(fallback, backend.compile_target()), file=sys.stderr)
        art = npu_compiler.compile_artifact(args.artifact, backend.compile_target(), force_cpu=args.force_cpu,
                                            rope_theta=theta)
        if not args.json:
            print(dtype_line(art))
    else:
        art = npu_compiler.load_artifact(args.artifact)
        check_weights_digest(art, args.weights)
    if isinstance(art, npu_compiler.PartitionedProgram):
        return _run_partitioned(args, art, backend, given, contract)
    prog = art
    inp = collect_inputs(prog, given, args.seed, contract)
    _notice(args, inp)
    from ..progress import Progress

    with Progress("loading weights", quiet=args.quiet or args.json) as bar:
        ws = npu_runtime.load_weights(prog, args.weights, backend, progress=bar.callback,
                                      allow_nonfinite=args.allow_nonfinite_weights)
    ex = backend.create_executor(prog)
    stats, outs = time_runs(lambda: ex.run_numpy(inp.arrays, ws), args.warmup, args.iters)
    device = LatencyStats.of(ex.device_seconds(inp.arrays, ws, args.iters), 0)
    title = f"run {prog.model_name} on {backend.name} ({prog.compute_dtype}, {len(prog.kernels)} kernels)"
    return _report(args, title, stats, outs, inp, backend, device)


def _run_partitioned(args: argparse.Namespace, art, backend, given: dict, contract) -> int:
    """A partitioned program: its segments on the backend and the CPU, the boundaries moved between them."""
    from npu_runtime.dag_executor import DAGExecutor

    from ..timing import time_runs

    inp = collect_inputs(art.inputs, given, args.seed, contract)
    _notice(args, inp)
    dag = DAGExecutor(art, backend, weights=args.weights, allow_nonfinite=args.allow_nonfinite_weights)
    stats, outs = time_runs(lambda: dag.run(inp.arrays), args.warmup, args.iters)
    cpu = sum(s.device == "cpu" for s in art.segments)
    title = (f"run {art.model_name} on {backend.name} ({art.compute_dtype}, {len(art.segments)} segments: {cpu} on "
             f"the CPU, {art.kernel_count} kernels, {dag.num_transfers} transfers)")
    return _report(args, title, stats, outs, inp, backend)


def _notice(args: argparse.Namespace, inp) -> None:
    text = inp.notice(args.seed)
    if text and not args.json:
        print(text, file=sys.stderr)


def _report(args: argparse.Namespace, title: str, stats, outs: dict[str, np.ndarray], inp, backend,
            device=None) -> int:
    """`device`: the device-time statistics (`Executor.device_seconds`), where measured (one program, not a
    partitioned one, whose boundaries cross between devices)."""
    from ..common import device_line

    summaries = {name: summarize(arr, args.top_k) for name, arr in outs.items()}
    warn_nonfinite("output", outs)
    if args.output is not None:
        save_npz(args.output, outs)
    if args.json:
        print(json.dumps({"title": title, "device": backend.describe(), "timing": stats.to_dict(),
                          "device_timing": device.to_dict() if device is not None else None,
                          "generated_inputs": inp.generated, "outputs": summaries, "written": args.output}, indent=1))
        return 0
    print(title)
    if device_line(backend):
        print(device_line(backend))
    print(stats.format())
    if device is not None:
        print(device.format_device())
    print("outputs:")
    for name, s in summaries.items():
        print(f"  {name} {s['dtype']}{s['shape']}: {_stats_text(s)}")
        for row in s.get("top_k", []):
            pairs = ", ".join(f"{i} ({v:.4g})" for i, v in zip(row["indices"], row["values"]))
            print(f"    row {row['row']}: top-{len(row['indices'])} {pairs}")
        if s.get("rows_not_shown"):
            print(f"    ... {s['rows_not_shown']} more row(s)")
    if args.output:
        print(f"outputs written: {args.output}")
    return 0


def _stats_text(s: dict) -> str:
    if "mean" not in s:
        return f"min {s['min']}, max {s['max']}, first {s['first']}"
    nf = s.get("nonfinite")
    kinds = (("nan", "NaN"), ("posinf", "+inf"), ("neginf", "-inf"))
    bad = (", ".join(f"{nf[k]} {label}" for k, label in kinds if nf[k]) + f" (the first at {nf['first']})"
           if nf else "")
    if s["mean"] is None:  # not one finite value: no statistic to show
        return f"no finite value: {bad}"
    text = f"min {s['min']:.4g}, max {s['max']:.4g}, mean {s['mean']:.4g}, std {s['std']:.4g}"
    return text + (f" over the finite values; {bad}" if bad else "")


def summarize(arr: np.ndarray, top_k: int = 0, max_rows: int = 4) -> dict:
    """min/max/mean/std of an output (float), or min/max/first values (integers, bools); with `top_k`, the largest
    values of each row along the last axis (the classes of a classifier)."""
    a = np.asarray(arr)
    d: dict = {"dtype": a.dtype.name, "shape": list(a.shape)}
    if a.size == 0:
        return {**d, "min": None, "max": None, "first": []}
    if a.dtype.kind in "iub":
        return {**d, "min": a.min().item(), "max": a.max().item(), "first": a.ravel()[:8].tolist()}
    f = a.astype(np.float64)
    finite = np.isfinite(f)
    found = nonfinite(a)
    if finite.any():
        vals = f[finite]
        d.update(min=float(vals.min()), max=float(vals.max()), mean=float(vals.mean()), std=float(vals.std()))
    else:  # statistics of no values are none, not zeros
        d.update(min=None, max=None, mean=None, std=None)
    d["nonfinite"] = found.to_dict() if found is not None else None
    if top_k > 0 and a.ndim >= 1:
        rows = f.reshape(-1, a.shape[-1])
        k = min(top_k, rows.shape[-1])
        d["top_k"] = []
        for r in range(min(len(rows), max_rows)):
            idx = np.argsort(-np.nan_to_num(rows[r], nan=-np.inf), kind="stable")[:k]
            d["top_k"].append({"row": r, "indices": idx.tolist(), "values": rows[r][idx].tolist()})
        d["rows_not_shown"] = max(len(rows) - max_rows, 0)
    return d


def save_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Atomic, with the user's umask: a failed run leaves no half-written file. bf16 is stored as float32 (npz has no
    bf16)."""
    from npu_compiler.atomic import atomic_path

    plain = {k: (v.astype(np.float32) if v.dtype.name == "bfloat16" else v) for k, v in arrays.items()}
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        # a file object, not a name: np.savez would add ".npz" to a temporary name that lacks it
        np.savez(f, **plain)
