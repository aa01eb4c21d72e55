"""npusim profile X.npubin --weights W [--backend cpu] [--warmup N --iters N] [--trace t.json] [--chart c.png]

Why the kernels' share is taken of the profiled run itself: a profiled run launches kernel by kernel with a timer
around each, while a plain run may launch them otherwise (on cuda: one CUDA graph). A GPU kernel's event interval
then also holds event-record overhead and, whenever the GPU waits for the host, the launch latency. Measured on an
H100 with 77 small kernels: graph replay 0.096 ms, the same kernels launched one by one with events around each
sum to 0.84 ms of event time (880% of the replay), and still 0.32 ms when a spin kernel lets the host queue every
launch first. Dividing by the plain run gave shares above 100% (issue 15 saw 127%). Every kernel interval
lies inside its own run, so a share of the profiled run's wall time is at most 100%; the plain run is reported
beside it, with a note when the two differ much.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from .. import argtypes
from ..common import add_quiet_option, add_run_options, add_timing_options, collect_inputs, device_line, parse_inputs

# A profiled run this much slower than a plain one is worth a sentence (launch gaps, graph vs. kernel by kernel).
SLOWER_NOTE = 1.15
# Why a profiled run is slower than a plain one, per backend (what its plain run does that the profiled one cannot)
PROFILED_RUN = {
    "cuda": "it launches kernel by kernel with a timer around each, where a plain run replays one CUDA graph, and a "
            "kernel's time then also holds any wait for the host's launch.",
    "webgpu": "each kernel is a compute pass of its own between timestamp queries, where a plain run records every "
              "kernel in one pass of one submission.",
    "cpu": "each kernel is timed by reading the clock around it and the timings are kept, which a plain run (the same "
           "kernels, one after another) does not do; on a short program that bookkeeping is a visible share.",
    "*": "each kernel is launched and timed on its own.",
}


def register(sub) -> None:
    p = sub.add_parser(
        "profile", help="time every kernel of an artifact",
        description="Run an artifact several times with a timer around every kernel launch; print a table sorted by "
                    "time with the IR nodes and fusion group of each kernel, bytes moved, FLOPs, comparisons, GB/s "
                    "and GFLOP/s; optionally write a Chrome trace (Perfetto, chrome://tracing) and a bar chart. Plain "
                    "runs (timed like `npusim run`) are interleaved with the profiled ones and reported beside them.")
    p.add_argument("artifact", metavar="MODEL", help=".npubin file (or an IR JSON, compiled on the fly); a partitioned "
                                                    "one shows its CPU segments and transfers as rows of their own")
    add_run_options(p)
    add_timing_options(p, "timed runs (each: one plain run and one profiled run)")
    p.add_argument("--top", type=argtypes.integer(0, name="count"), default=30, help="rows of the table (0: all)")
    p.add_argument("--trace", metavar="FILE.json", default=None, help="write a Chrome trace of the timed runs")
    p.add_argument("--chart", metavar="FILE.png", default=None, help="bar chart of the slowest kernels (matplotlib)")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    add_quiet_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    import npu_compiler
    import npu_runtime

    from ..common import check_output_folder, check_weights_digest, resolve_weights
    from ..progress import Progress

    for path, flag in ((args.trace, "--trace"), (args.chart, "--chart")):
        if path is not None:
            check_output_folder(path, flag)
    resolve_weights(args, args.artifact)
    backend = npu_runtime.get_backend(args.backend)
    if args.artifact.endswith(".json"):
        art = npu_compiler.compile_artifact(args.artifact, backend.compile_target())
    else:
        art = npu_compiler.load_artifact(args.artifact)
        check_weights_digest(art, args.weights)
    inp = collect_inputs(art.inputs, parse_inputs(args.input), args.seed)
    quiet = args.quiet or args.json
    if inp.generated and not args.json:
        print(inp.notice(args.seed), file=sys.stderr)
    if isinstance(art, npu_compiler.PartitionedProgram):
        return _partitioned(args, art, backend, inp.arrays, quiet)
    prog = art
    with Progress("loading weights", quiet=quiet) as bar:
        ws = npu_runtime.load_weights(prog, args.weights, backend, progress=bar.callback,
                                      allow_nonfinite=args.allow_nonfinite_weights)
    ex = backend.create_executor(prog)
    inputs = inp.arrays
    plain, profiled, runs = _timed(lambda: ex.run(inputs, ws), lambda: ex.profile(inputs, ws), backend, args, quiet)
    from npu_runtime import profiling

    report = profiling.summarize(prog, runs, backend.name)
    title = f"profile {prog.model_name} on {backend.name}: {len(prog.kernels)} kernels"
    return _print(args, title, report, plain, profiled, getattr(ex, "profile_method", None), backend,
                  lambda path: profiling.write_trace(path, prog, report))


def _partitioned(args: argparse.Namespace, art, backend, inputs: dict, quiet: bool) -> int:
    """A partitioned program: the target's kernels, each CPU segment and each transfer as rows of their own."""
    from npu_runtime import profiling
    from npu_runtime.dag_executor import DAGExecutor

    dag = DAGExecutor(art, backend, weights=args.weights)
    plain, profiled, runs = _timed(lambda: dag.launch(inputs), lambda: dag.profile(inputs), backend, args, quiet)
    report = profiling.summarize_partitioned(art, runs, backend.name)
    cpu = sum(s.device == "cpu" for s in art.segments)
    title = (f"profile {art.model_name} on {backend.name}: {len(art.segments)} segments ({cpu} on the CPU, each a "
             f"row), {art.kernel_count} kernels, {len(art.transfers)} transfers (rows of their own)")
    method = next((getattr(st.executor, "profile_method", None) for st in dag.stages
                   if st is not None and st.device == "npu"), None)
    return _print(args, title, report, plain, profiled, method, backend,
                  lambda path: profiling.write_rows_trace(path, report))


def _timed(plain_run, profiled_run, backend, args: argparse.Namespace, quiet: bool):
    """Warm-up, then plain and profiled runs interleaved, so that both see the same cache and clock state: the plain
    runs' wall times, the profiled runs' wall times and the profiled runs' timings."""
    from ..progress import Progress

    for _ in range(args.warmup):
        plain_run()
        profiled_run()  # a profiled run may build its own launch path on first use
    backend.synchronize()
    plain, profiled, runs = [], [], []
    with Progress("profiling", args.iters, quiet=quiet) as bar:
        for i in range(args.iters):
            t0 = time.perf_counter()
            plain_run()
            backend.synchronize()
            plain.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            runs.append(profiled_run())
            backend.synchronize()
            profiled.append(time.perf_counter() - t0)
            bar.update(i + 1)
    return plain, profiled, runs


def _print(args: argparse.Namespace, title: str, report, plain: list[float], profiled: list[float],
           method: str | None, backend, write_trace) -> int:
    from npu_runtime import profiling

    from ..timing import LatencyStats, warn_if_noisy

    plain_stats = LatencyStats.of(plain, args.warmup)
    noise = warn_if_noisy(plain, "plain runs")
    prof_wall = statistics.median(profiled)
    # The kernels' total in the header is the sum of the table's rows (each kernel's median), so that the header and
    # the % column say the same. Its share is taken run by run (each run's kernels lie inside that run's own wall
    # time, so it is at most 100%), then the median: medians of different runs need not fit inside one run.
    share = statistics.median(k / w for k, w in zip(report.iteration_totals_s, profiled) if w > 0)
    notes = []
    if args.trace is not None:
        write_trace(args.trace)
        notes.append(f"trace written: {args.trace} (open in https://ui.perfetto.dev or chrome://tracing)")
    if args.chart is not None:
        why = profiling.write_chart(args.chart, report)
        notes.append(why or f"chart written: {args.chart}")
    slower = prof_wall / plain_stats.median_s if plain_stats.median_s > 0 else 1.0
    if slower > SLOWER_NOTE:
        why = PROFILED_RUN.get(backend.name, PROFILED_RUN["*"])
        notes.append(f"a profiled run takes {slower:.2f}x a plain run: {why} Compare kernels with each other; take "
                     "the total from the plain run.")
    if args.json:
        d = report.to_dict()
        d.update(device=backend.describe(), kernel_timing=method, plain_run=plain_stats.to_dict(),
                 run_wall_s=plain_stats.median_s, profiled_run_wall_s=prof_wall, kernel_share_of_profiled_run=share,
                 notes=notes, noise=noise)
        print(json.dumps(d, indent=1))
        return 0
    total = report.kernel_total_s
    print(f"{title}, {report.iterations} timed runs after {args.warmup} warm-up (medians)")
    if device_line(backend):
        print(device_line(backend))
    if method:
        print(f"  kernel times: {method}")
    print(f"  plain run     {plain_stats.median_s * 1e3:.3f} ms (p90 {plain_stats.p90_s * 1e3:.3f} ms)")
    what = "kernels" if report.kernels and all(k.kind not in ("transfer", "cpu segment") for k in report.kernels) \
        else "kernels, CPU segments and transfers"
    print(f"  profiled run  {prof_wall * 1e3:.3f} ms, of which {what} {total * 1e3:.3f} ms ({100 * share:.0f}% of a "
          "run, the rest is launch and timer overhead); the % column below is of this total")
    print(profiling.format_table(report, args.top or None))
    print("by fusion group: " + ", ".join(f"{g} {t * 1e3:.3f} ms" for g, t in list(report.by_group().items())[:8]))
    for n in notes:
        print(n)
    return 0
