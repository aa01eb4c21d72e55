"""npusim estimate X.npubin|LLM_DIR --npu PRESET_OR_FILE [--mapping FILE] [--json] [--trace t.json] [--chart c.png]
[--compare-gpu]"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from ..common import parse_inputs


def register(sub) -> None:
    from npu_compiler.npu import preset_names

    p = sub.add_parser(
        "estimate", help="predict what an NPU would take for every kernel of a program",
        description="Predict, with an analytical tiling-aware model of a systolic-array NPU, the cycles and time of "
                    "every kernel of a compiled program, what bounds it (compute, on-chip buffers or DRAM), the "
                    "array's utilisation, the DRAM traffic and the energy; totals for the program and per fusion "
                    "group. Given an export-llm folder, estimates its prefill and decode programs and predicts the "
                    "time to first token and the decode tokens/s. See docs/npu_model.md.")
    p.add_argument("artifact", help=".npubin file, IR JSON (compiled for cpu on the fly) or an export-llm folder")
    p.add_argument("--npu", default="tpu-v1", metavar="PRESET_OR_FILE",
                   help=f"NPU preset ({', '.join(preset_names())}) or a TOML file (default: tpu-v1)")
    p.add_argument("--context", type=int, default=None, metavar="TOKENS",
                   help="tokens decode attention reads from its KV cache (default: the whole static cache)")
    p.add_argument("--format", dest="number_format", default=None, choices=["int8", "int16", "fp16", "bf16", "fp32"],
                   help="cost every floating-point tensor in this number format: what the program would take once "
                        "quantized to it (default: the program's own dtypes; a format the NPU does not take is "
                        "costed as the nearest it takes, and flagged)")
    p.add_argument("--zeros", action="append", default=[], metavar="FRACTION|NAME=FRACTION",
                   help="the fraction of zero elements of activations (repeatable): FRACTION for every tensor the "
                        "program computes, NAME=FRACTION for one tensor (an input too); an NPU that run-length codes "
                        "its DRAM link or gates zero operands (eyeriss) costs them so (default: every tensor dense)")
    p.add_argument("--mapping", metavar="FILE", default=None,
                   help="row-stationary mapping per layer instead of the mapper's (TOML or JSON: a table per kernel "
                        "or node name with channels_per_pass and/or filters_per_pass; see docs/npu_model.md; default: "
                        "the mapper's choice for every layer)")
    p.add_argument("--pipeline", action="store_true",
                   help="layer-to-layer pipelining: a kernel's weight loads start during the kernel before it "
                        "(default: kernels run one after another)")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="design sweep (repeatable): estimate on every combination of these NPU values (a file key "
                        "such as buffers.weights_kib, or its last part: rows=64,128,256); prints every point with "
                        "the Pareto front of latency, energy and area (where the preset gives area); --json writes "
                        "them, --chart draws latency against energy (PNG or SVG)")
    p.add_argument("--top", type=int, default=30, help="rows of the kernel table (0: all)")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument("--trace", metavar="FILE.json", default=None,
                   help="Chrome trace (same format as `npusim profile --trace`) of the predicted kernels (default: "
                        "none written)")
    p.add_argument("--chart", metavar="FILE.png", default=None,
                   help="roofline chart of the kernels, or with --sweep latency against energy (matplotlib; .png or "
                        ".svg; default: none drawn)")
    g = p.add_argument_group("measured beside predicted (--compare-gpu)")
    g.add_argument("--compare-gpu", action="store_true",
                   help="also run the program on the available backend with the profiler and show the measured "
                        "time of every kernel beside the prediction (needs --weights)")
    g.add_argument("--weights", default=None,
                   help="safetensors file or folder (for --compare-gpu; default: none, no measurement)")
    g.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input array (repeatable); others are generated")
    g.add_argument("--backend", default=None, help="cpu, cuda (default: best available, or $NPUSIM_BACKEND)")
    g.add_argument("--seed", type=int, default=0, help="seed for generated inputs")
    g.add_argument("--warmup", type=int, default=2, help="untimed runs first")
    g.add_argument("--iters", type=int, default=5, help="timed runs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from npu_compiler.npu import estimate_program, load_npu
    from npu_compiler.npu.mapping import by_program, load_mapping

    if args.context is not None and args.context < 1:
        print("npusim estimate: error: --context must be at least 1", file=sys.stderr)
        return 2
    npu = load_npu(args.npu)
    path = Path(args.artifact)
    if path.is_dir():
        if args.compare_gpu:
            print("npusim estimate: error: --compare-gpu takes one .npubin, not an export-llm folder",
                  file=sys.stderr)
            return 2
        progs = _llm_programs(path)
    else:
        progs = {"program": _load_program(args.artifact)}
    partitioned = _partitioned(progs["program"]) if "program" in progs else None
    if partitioned is not None:
        if args.compare_gpu:
            print("npusim estimate: error: --compare-gpu measures one program; this artifact is partitioned (measure "
                  "its segments and transfers with `npusim profile`)", file=sys.stderr)
            return 2
        progs = {f"segment {s.index}": s.program for s in partitioned.segments if s.device == "npu"}
    if args.compare_gpu and not args.weights:
        print("npusim estimate: error: --compare-gpu needs --weights W.safetensors", file=sys.stderr)
        return 2
    try:
        known = {b.name for p in progs.values() for b in p.buffers}
        zeros = {kind: _zeros(p, args.zeros, known) for kind, p in progs.items()}
    except ValueError as e:
        print(f"npusim estimate: error: --zeros: {e}", file=sys.stderr)
        return 2
    args.zeros_by_program = zeros
    mapping = by_program(load_mapping(args.mapping) if args.mapping else {},
                         {kind: [(k.name, list(k.nodes)) for k in p.kernels] for kind, p in progs.items()})
    args.mapping_by_program = mapping
    if args.sweep:
        if args.compare_gpu or args.trace:
            print("npusim estimate: error: --sweep takes neither --compare-gpu nor --trace", file=sys.stderr)
            return 2
        return _sweep(progs, npu, args)
    ests = {kind: estimate_program(p, npu, context_len=args.context, number_format=args.number_format,
                                   pipeline=args.pipeline, zeros=zeros[kind], mapping=mapping[kind])
            for kind, p in progs.items()}
    measured = None
    if args.compare_gpu:
        measured = _measure(progs["program"], args)
    llm = _llm_summary(path, ests) if path.is_dir() else None

    notes = []
    if args.trace:
        _write_trace(args.trace, progs, ests, measured)
        notes.append(f"trace written: {args.trace} (open in https://ui.perfetto.dev or chrome://tracing)")
    if args.chart:
        why = _write_chart(args.chart, ests)
        notes.append(why or f"chart written: {args.chart}")

    if args.json:
        # One program: its estimate at the top level; an LLM folder: one per program and the LLM figures.
        out: dict[str, Any] = ({kind: e.to_dict() for kind, e in ests.items()} if llm or partitioned
                               else ests["program"].to_dict())
        if partitioned is not None:
            out["host_work"] = _host_work(partitioned)
            out["predicted_npu_s"] = sum(e.time_s for e in ests.values())
        if measured is not None:
            out["measured"] = {"backend": measured.backend, "kernel_total_s": measured.kernel_total_s,
                               "iterations": measured.iterations,
                               "kernels": {k.index: k.median_s for k in measured.kernels}}
        if llm:
            out["llm"] = llm
        out["notes"] = notes
        print(json.dumps(out, indent=1))
        return 0
    for kind, est in ests.items():
        _print_estimate(kind, est, progs[kind], args.top or None, measured)
    if partitioned is not None:
        _print_host_work(partitioned, ests)
    if llm:
        print(f"LLM ({llm['prefill_len']}-token prefill, decode at context {llm['context']}): time to first token "
              f"{llm['ttft_s'] * 1e3:.3f} ms; decode {llm['decode_step_s'] * 1e3:.3f} ms per token = "
              f"{llm['decode_tokens_per_s']:.1f} tokens/s")
    for n in notes:
        print(n)
    return 0


def _sweep(progs: dict, npu, args: argparse.Namespace) -> int:
    """Every combination of the --sweep values: latency (the programs' times added: an LLM folder's time to first
    token plus one decode step), energy, DRAM traffic and area, the Pareto front marked."""
    from npu_compiler.npu import estimate_program
    from npu_compiler.npu.sweep import parse_axes, run_sweep

    axes = parse_axes(args.sweep)

    def evaluate(cfg):
        ests = [estimate_program(p, cfg, context_len=args.context, number_format=args.number_format,
                                 zeros=args.zeros_by_program[kind], pipeline=args.pipeline,
                                 mapping=args.mapping_by_program[kind])
                for kind, p in progs.items()]
        return sum(e.time_s for e in ests), sum(e.energy_pj for e in ests), sum(e.dram_bytes for e in ests)

    def progress(i: int, n: int, params: dict) -> None:
        print(f"sweep {i + 1}/{n}: " + ", ".join(f"{k}={v}" for k, v in params.items()), file=sys.stderr,
              flush=True)

    report = run_sweep(npu, axes, evaluate, progress)
    notes = []
    if args.chart:
        why = _write_sweep_chart(args.chart, report)
        notes.append(why or f"chart written: {args.chart}")
    if args.json:
        print(json.dumps({**report.to_dict(), "notes": notes}, indent=1))
        return 0
    keys = [a.key for a in axes]
    width = [max(len(k), 8) for k in keys]
    area = report.has_area
    print(f"sweep of {npu.name}: {len(report.points)} designs; * marks the Pareto front of latency, energy"
          + (" and area" if area else ""))
    print("  ".join(f"{k:>{w}}" for k, w in zip(keys, width)) + f"  {'latency ms':>11} {'energy mJ':>10} "
          f"{'DRAM MB':>9}" + (f" {'area mm2':>9}" if area else "") + "  front")
    for p in report.points:
        print("  ".join(f"{str(p.params[k]):>{w}}" for k, w in zip(keys, width))
              + f"  {p.time_s * 1e3:>11.4f} {p.energy_pj / 1e9:>10.4f} {p.dram_bytes / 1e6:>9.3f}"
              + (f" {p.area_mm2:>9.2f}" if area else "") + ("  *" if p.pareto else ""))
    for n in notes:
        print(n)
    return 0


def _write_sweep_chart(path: str, report) -> str | None:
    """Latency against energy, every design a point, the Pareto front marked and joined; with area, a second panel
    of latency against area. PNG or SVG by the file's extension."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed; skipped the chart (pip install matplotlib)"
    from npu_export._atomic import atomic_path

    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    if fmt not in ("png", "svg"):
        return f"--chart {path}: a sweep chart is .png or .svg"
    panels = [("energy_pj", 1e-9, "energy (mJ)")] + ([("area_mm2", 1.0, "area (mm²)")] if report.has_area else [])
    fig, axs = plt.subplots(1, len(panels), figsize=(7 * len(panels), 5.5), squeeze=False)
    label = ", ".join(a.key.rsplit(".", 1)[-1] for a in report.axes)
    for ax, (attr, scale, title) in zip(axs[0], panels):
        xs = [p.time_s * 1e3 for p in report.points]
        ys = [getattr(p, attr) * scale for p in report.points]
        ax.scatter(xs, ys, s=18, c="tab:grey", alpha=0.7, label="design")
        front = sorted((p for p in report.points if p.pareto), key=lambda p: p.time_s)
        ax.plot([p.time_s * 1e3 for p in front], [getattr(p, attr) * scale for p in front], "o-", c="tab:red",
                ms=5, lw=1.2, label="Pareto front")
        for p in front:
            ax.annotate(",".join(str(v) for v in p.params.values()), (p.time_s * 1e3, getattr(p, attr) * scale),
                        fontsize=7, xytext=(4, 4), textcoords="offset points")
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{report.base} sweep over {label}: {len(report.points)} designs")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt)
    plt.close(fig)
    return None


def _zeros(program, specs: list[str], known: set[str]) -> dict[str, float]:
    """--zeros values as a {tensor name: fraction} map for `program`: a bare FRACTION for every tensor its kernels
    compute (intermediates and outputs), NAME=FRACTION for one tensor (a later value wins). A name in none of the
    `known` tensors (every program of an export-llm folder) is an error; one another program has is skipped."""
    out: dict[str, float] = {}
    names = {b.name for b in program.buffers}
    for spec in specs:
        name, sep, value = spec.rpartition("=")
        try:
            z = float(value)
        except ValueError:
            raise ValueError(f"{spec!r}: expected FRACTION or NAME=FRACTION, a number between 0 and 1") from None
        if not 0.0 <= z <= 1.0:
            raise ValueError(f"{spec!r}: a fraction of zero elements is between 0 and 1")
        if not sep:
            out.update({b.name: z for b in program.buffers if b.kind in ("arena", "output")})
        elif name in names:
            out[name] = z
        elif name not in known:
            raise ValueError(f"{spec!r}: no tensor named {name!r}" if name else f"{spec!r}: no tensor name before '='")
    return out


def _load_program(artifact: str):
    import npu_compiler

    if artifact.endswith(".json"):
        return npu_compiler.compile_artifact(artifact, "cpu")
    return npu_compiler.load_artifact(artifact)


def _partitioned(art):
    from npu_compiler import PartitionedProgram

    return art if isinstance(art, PartitionedProgram) else None


def _host_work(art) -> dict[str, Any]:
    """What a partitioned artifact leaves to the host: its CPU segments and the transfers to and from them, flagged:
    the NPU model predicts neither."""
    return {"predicted": False,
            "note": "CPU segments and transfers run on the host: not part of the NPU prediction",
            "segments": [{"index": s.index, "runner": s.runner, "nodes": s.nodes, "flops": s.flops}
                         for s in art.segments if s.device == "cpu"],
            "transfers": [{"tensor": t.tensor, "src": t.src, "dst": t.dst, "bytes": t.nbytes}
                          for t in art.transfers]}


def _print_host_work(art, ests: dict) -> None:
    from npu_compiler.partition import runner_text

    host = _host_work(art)
    npu_s = sum(e.time_s for e in ests.values())
    moved = sum(t["bytes"] for t in host["transfers"])
    print(f"partitioned: {len(ests)} segment(s) on the NPU, predicted {npu_s * 1e3:.3f} ms in all; HOST WORK, NOT "
          f"PREDICTED: {len(host['segments'])} CPU segment(s) and {len(host['transfers'])} transfer(s) "
          f"({moved / 1e6:.3f} MB) between the NPU and the host")
    for s in host["segments"]:
        nodes = ", ".join(s["nodes"][:6]) + (" ..." if len(s["nodes"]) > 6 else "")
        print(f"  [host] segment {s['index']} on {runner_text(s['runner'], art.target)}: {s['flops'] / 1e6:.3f} "
              f"MFLOP, nodes {nodes}")


def _llm_programs(folder: Path) -> dict:
    from npu_compiler.errors import ArtifactError
    from npu_compiler.partitioned_program import load_artifact
    from npu_compiler.program import CompiledProgram

    man = folder / "manifest.json"
    if not man.is_file():
        raise ArtifactError(f"{folder}: a folder must be an export-llm output (no manifest.json)")
    try:
        files = json.loads(man.read_text())["files"]
        progs = {kind: load_artifact(folder / files[kind]) for kind in ("prefill", "decode")}
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ArtifactError(f"{man}: not an export-llm manifest ({e})") from e
    for kind, prog in progs.items():
        if not isinstance(prog, CompiledProgram):
            raise ArtifactError(f"{folder / files[kind]}: the {kind} program is partitioned (some of its ops run on "
                                "the CPU), so the folder has no time to first token to predict; estimate it alone "
                                f"(npusim estimate {folder / files[kind]}) for its NPU segments and its host work")
    return progs


def _llm_summary(folder: Path, ests: dict) -> dict[str, Any]:
    man = json.loads((folder / "manifest.json").read_text())
    step = ests["decode"].time_s
    ctx = ests["decode"].context_len or man.get("max_cache_len")
    return {"prefill_len": man.get("prefill_len"), "max_cache_len": man.get("max_cache_len"), "context": ctx,
            "ttft_s": ests["prefill"].time_s, "decode_step_s": step,
            "decode_tokens_per_s": 1.0 / step if step else 0.0}


def _measure(program, args: argparse.Namespace):
    """The existing profiler on the available backend: median time of every kernel over --iters runs."""
    import npu_runtime
    from npu_runtime import profiling

    from ..common import complete_inputs

    backend = npu_runtime.get_backend(args.backend)
    if program.target != backend.compile_target():
        from npu_runtime.errors import NPURuntimeError

        raise NPURuntimeError(f"the program was compiled for target '{program.target}'; backend '{backend.name}' "
                              f"runs '{backend.compile_target()}' programs (recompile, or pick --backend)")
    inputs = complete_inputs(program, parse_inputs(args.input), args.seed)
    weights = npu_runtime.load_weights(program, args.weights, backend)
    ex = backend.create_executor(program)
    for _ in range(max(args.warmup, 0)):
        ex.run(inputs, weights)
    backend.synchronize()
    runs = [ex.profile(inputs, weights) for _ in range(max(args.iters, 1))]
    return profiling.summarize(program, runs, backend.name)


def _print_estimate(kind: str, est, program, top: int | None, measured) -> None:
    from npu_compiler.npu import format_groups, format_table

    npu = est.npu
    peak = 2 * npu.peak_macs_per_s / 1e12
    title = "" if kind == "program" else f"[{kind}] "
    fastest = max(npu.array_formats, key=npu.array_formats.get) + " " if npu.array_formats else ""
    print(f"{title}estimate {est.model} on {npu.name}: {npu.array_rows}x{npu.array_cols} "
          f"{npu.dataflow.replace('_', '-')} array at {npu.clock_mhz:g} MHz ({peak:.2f} {fastest}TOPS), "
          f"{npu.dram_gb_s:g} GB/s DRAM; {len(est.kernels)} kernels")
    for n in est.notes:
        print(f"  {n}")
    by = est.by_bound()
    total = est.time_s or 1.0
    print(f"  predicted {est.time_s * 1e3:.3f} ms per run ({est.cycles:.0f} cycles), DRAM {est.dram_bytes / 1e6:.2f} "
          f"MB, energy {est.energy_pj / 1e9:.3f} mJ, array utilisation {100 * est.utilization:.1f}%; time bound by "
          + ", ".join(f"{b} {100 * by.get(b, 0.0) / total:.0f}%" for b in ("compute", "on-chip", "DRAM")))
    med = None
    if measured is not None:
        med = {k.index: k.median_s for k in measured.kernels}
        print(f"  measured on {measured.backend}: {measured.kernel_total_s * 1e3:.3f} ms of kernels per run "
              f"(median of {measured.iterations}); measured / predicted = "
              f"{measured.kernel_total_s / est.time_s if est.time_s else 0:.1f}")
    print(format_table(est, top, med))
    print(format_groups(est))


def _write_trace(path: str, progs: dict, ests: dict, measured) -> None:
    """Predicted kernels back to back on one process row per program (and the measured first run beside them):
    the event format of `npusim profile --trace`, from npu_runtime.profiling."""
    from npu_export._atomic import atomic_path
    from npu_runtime.profiling import kernel_event, trace_document, trace_process

    events: list[dict[str, Any]] = []
    pid = 0
    for kind, est in ests.items():
        prog = progs[kind]
        label = f"{est.model} on {est.npu.name} (predicted" + ("" if kind == "program" else f", {kind}") + ")"
        events += trace_process(pid, label)
        t = 0.0
        for k in est.kernels:
            events.append(kernel_event(prog.kernels[k.index], k.index, pid, t, k.time_s, {
                "cycles": k.est.cycles, "bound": k.est.bound, "work": k.work, "bytes": k.est.dram_bytes,
                "flops": k.flops, "energy_pj": k.est.energy_total_pj, "array_utilization": k.utilization}))
            t += k.time_s
        pid += 1
    if measured is not None and measured.runs:
        prog = progs["program"]
        events += trace_process(pid, f"{prog.model_name} ({measured.backend}, measured)")
        run0 = measured.runs[0]
        t0 = min(t.start_s for t in run0) if run0 else 0.0
        costs = {k.index: k for k in measured.kernels}
        for t in run0:
            events.append(kernel_event(prog.kernels[t.index], t.index, pid, t.start_s - t0, t.dur_s,
                                       {"bytes": costs[t.index].bytes, "flops": costs[t.index].flops}))
    first = next(iter(ests.values()))
    doc = trace_document(events, {"model": first.model, "npu": first.npu.name, "predicted": True})
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(doc))


def _write_chart(path: str, ests: dict) -> str | None:
    """A roofline: each kernel at its operational intensity (FLOPs per DRAM byte) and predicted FLOP/s, under the
    array's and the vector unit's peaks and the DRAM slope. Returns None when written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed; skipped the chart (pip install matplotlib)"
    from npu_export._atomic import atomic_path

    first = next(iter(ests.values()))
    npu = first.npu
    array_peak = 2 * npu.peak_macs_per_s
    vector_peak = npu.vector_lanes * npu.clock_hz
    bw = npu.dram_gb_s * 1e9
    points = [(k, e) for e in ests.values() for k in e.kernels if k.time_s > 0 and k.flops > 0]
    finite = [k.flops / k.est.dram_bytes for k, _ in points if k.est.dram_bytes]
    x_max = max([*finite, 10 * array_peak / bw]) * 4
    fig, ax = plt.subplots(figsize=(9, 6))
    xs = [10 ** (i / 20) for i in range(-40, int(20 * math.log10(x_max)) + 1)]
    ax.plot(xs, [min(array_peak, bw * x) for x in xs], color="black", lw=1.5, label="array peak / DRAM roof")
    ax.plot(xs, [min(vector_peak, bw * x) for x in xs], color="grey", lw=1, ls="--", label="vector-unit peak")
    colours = {"compute": "tab:blue", "on-chip": "tab:orange", "DRAM": "tab:red"}
    markers = ["o", "s", "^"]
    for i, (kind, est) in enumerate(ests.items()):
        for bound, colour in colours.items():
            ks = [k for k in est.kernels if k.time_s > 0 and k.flops > 0 and k.est.bound == bound]
            if not ks:
                continue
            ax.scatter([k.flops / k.est.dram_bytes if k.est.dram_bytes else x_max for k in ks],
                       [k.flops / k.time_s for k in ks], s=14, c=colour, marker=markers[i % 3], alpha=0.7,
                       label=f"{'' if kind == 'program' else kind + ': '}{bound}-bound")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOPs per DRAM byte (on-chip operands at the right edge)")
    ax.set_ylabel("predicted FLOP/s")
    names = " + ".join(dict.fromkeys(e.model for e in ests.values()))
    ax.set_title(f"{names} on {npu.name}: roofline of {sum(len(e.kernels) for e in ests.values())} kernels")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return None
