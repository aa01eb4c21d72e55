"""npusim profile X.npubin --weights W [--backend cpu] [--warmup N --iters N] [--trace t.json] [--chart c.png]"""

from __future__ import annotations

import argparse
import json
import time

from ..common import add_run_options, complete_inputs, parse_inputs


def register(sub) -> None:
    p = sub.add_parser("profile", help="time every kernel of an artifact",
                       description="Run an artifact several times with a timer around every kernel launch; print "
                                   "a table sorted by time with the IR nodes and fusion group of each kernel, bytes "
                                   "moved, FLOPs, GB/s and GFLOP/s; optionally write a Chrome trace (Perfetto, "
                                   "chrome://tracing) and a bar chart.")
    p.add_argument("artifact", help=".npubin file (or an IR JSON, compiled on the fly)")
    add_run_options(p)
    p.add_argument("--warmup", type=int, default=2, help="untimed runs first (caches, lazy builds)")
    p.add_argument("--iters", type=int, default=10, help="timed runs")
    p.add_argument("--top", type=int, default=30, help="rows of the table (0: all)")
    p.add_argument("--trace", metavar="FILE.json", default=None, help="write a Chrome trace of the timed runs")
    p.add_argument("--chart", metavar="FILE.png", default=None, help="bar chart of the slowest kernels (matplotlib)")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import npu_compiler
    import npu_runtime
    from npu_compiler.program import CompiledProgram
    from npu_runtime import profiling

    from ..progress import Progress

    backend = npu_runtime.get_backend(args.backend)
    if args.artifact.endswith(".json"):
        prog = npu_compiler.compile(args.artifact, backend.compile_target())
    else:
        prog = CompiledProgram.load(args.artifact)
    inputs = complete_inputs(prog, parse_inputs(args.input), args.seed)
    quiet = args.quiet or args.json
    with Progress("loading weights", quiet=quiet) as bar:
        ws = npu_runtime.load_weights(prog, args.weights, backend, progress=bar.callback)
    ex = backend.create_executor(prog)
    for _ in range(max(args.warmup, 0)):
        ex.run(inputs, ws)
    backend.synchronize()
    # Plain runs, timed end to end and interleaved with the profiled ones (so both see the same cache and clock
    # state), show how much of a run the kernels account for.
    walls, runs = [], []
    with Progress("profiling", max(args.iters, 1), quiet=quiet) as bar:
        for i in range(max(args.iters, 1)):
            t0 = time.perf_counter()
            ex.run(inputs, ws)
            backend.synchronize()
            walls.append(time.perf_counter() - t0)
            runs.append(ex.profile(inputs, ws))
            bar.update(i + 1)
    report = profiling.summarize(prog, runs, backend.name)
    wall = sorted(walls)[len(walls) // 2]
    notes = []
    if args.trace:
        profiling.write_trace(args.trace, prog, report)
        notes.append(f"trace written: {args.trace} (open in https://ui.perfetto.dev or chrome://tracing)")
    if args.chart:
        why = profiling.write_chart(args.chart, report)
        notes.append(why or f"chart written: {args.chart}")
    if args.json:
        d = report.to_dict()
        d["run_wall_s"] = wall
        d["notes"] = notes
        print(json.dumps(d, indent=1))
        return 0
    total = report.kernel_total_s
    print(f"profile {prog.model_name} on {backend.name}: {len(prog.kernels)} kernels, {report.iterations} timed "
          f"runs after {args.warmup} warm-up")
    print(f"  kernel time {total * 1e3:.3f} ms per run (median); a plain run takes {wall * 1e3:.3f} ms "
          f"({100 * total / wall if wall else 0:.0f}% in kernels)")
    print(profiling.format_table(report, args.top or None))
    print("by fusion group: " + ", ".join(f"{g} {t * 1e3:.3f} ms" for g, t in list(report.by_group().items())[:8]))
    for n in notes:
        print(n)
    return 0
