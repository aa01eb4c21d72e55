"""Per-kernel profiling: the timing record every backend returns from `Executor.profile`, each kernel's cost (bytes
moved, FLOPs: its kind's model in `npu_compiler.kernels`), aggregation over iterations, a Chrome trace (Perfetto /
chrome://tracing) and a chart.

No torch here: the runtime must stay usable without it.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from npu_compiler.atomic import atomic_path, write_text
from npu_compiler.kernels import KernelCost
from npu_compiler.program import CompiledProgram, KernelCall


@dataclass
class KernelTiming:
    """One kernel launch. `start_s` is on the backend's clock (only differences matter); `dur_s` its duration
    (CPU: perf_counter around the call; CUDA: elapsed time between events recorded around the launch)."""

    index: int
    start_s: float
    dur_s: float
    launched_with: int | None = None  # run by another kernel's launch (merged), its time counted there



@dataclass
class KernelProfile:
    index: int
    name: str
    kind: str
    group: str
    nodes: list[str]
    calls: int
    mean_s: float
    median_s: float
    min_s: float
    total_s: float  # over every timed iteration
    bytes: int
    flops: int  # 2 per multiply-add, one per vector arithmetic operation (npu_compiler.kernels.counting)
    launched_with: int | None = None  # the kernel whose launch runs this one (its time is counted there)
    compares: int = 0  # comparisons, max/min and selects (a max pool's work)
    bytes_by_dtype: dict[str, dict[str, int]] = field(default_factory=dict)  # {dtype: {"read": .., "written": ..}}

    @property
    def gbps(self) -> float:
        return self.bytes / self.median_s / 1e9 if self.median_s > 0 else 0.0

    @property
    def gflops(self) -> float:
        return self.flops / self.median_s / 1e9 if self.median_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gbps"] = self.gbps
        d["gflops"] = self.gflops
        return d


@dataclass
class ProfileReport:
    model: str
    backend: str
    iterations: int
    kernels: list[KernelProfile]  # in program order
    iteration_totals_s: list[float] = field(default_factory=list)  # sum of kernel times, per iteration
    runs: list[list[KernelTiming]] = field(default_factory=list)

    @property
    def kernel_total_s(self) -> float:
        """The sum of every kernel's median time: what the table's rows add up to (its % column is of this), and
        what `profile`'s header gives. (The median of each run's own sum is `iteration_totals_s`'s median.)"""
        return sum(k.median_s for k in self.kernels)

    def by_time(self) -> list[KernelProfile]:
        return sorted(self.kernels, key=lambda k: k.median_s, reverse=True)

    def by_group(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for k in self.kernels:
            out[k.group] = out.get(k.group, 0.0) + k.median_s
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "backend": self.backend, "iterations": self.iterations,
                "kernel_total_s": self.kernel_total_s, "iteration_totals_s": self.iteration_totals_s,
                "by_group_s": self.by_group(), "kernels": [k.to_dict() for k in self.by_time()]}


def kernel_cost(program: CompiledProgram, k: KernelCall) -> KernelCost:
    """MACs, vector operations and bytes of one kernel: its kind's one count (`npu_compiler.kernels.counting`), the
    same that `npusim estimate` reads."""
    return k.spec.cost(k, program.buffers)


def summarize(program: CompiledProgram, runs: list[list[KernelTiming]], backend: str) -> ProfileReport:
    """Per-kernel statistics over the timed runs (medians resist the odd preempted launch)."""
    per: dict[int, list[float]] = {}
    merged: dict[int, int] = {}
    for run in runs:
        for t in run:
            per.setdefault(t.index, []).append(t.dur_s)
            if t.launched_with is not None:
                merged[t.index] = t.launched_with
    kernels = []
    for i, k in enumerate(program.kernels):
        ds = per.get(i, [])
        cost = kernel_cost(program, k)
        kernels.append(KernelProfile(
            i, k.name, k.kind, k.group, list(k.nodes), len(ds), statistics.fmean(ds) if ds else 0.0,
            statistics.median(ds) if ds else 0.0, min(ds) if ds else 0.0, sum(ds), cost.bytes, cost.flops,
            merged.get(i), cost.compares, cost.bytes_by_dtype()))
    totals = [sum(t.dur_s for t in run) for run in runs]
    return ProfileReport(program.model_name, backend, len(runs), kernels, totals, runs)


def summarize_partitioned(program, runs: list[list[Any]], backend: str) -> ProfileReport:
    """Per-step statistics of a partitioned program's profiled runs (`DAGExecutor.profile`: `StepTiming`s): a row per
    kernel of the target's segments (named `s<segment>:<kernel>`), per CPU segment (its FLOPs from the partition
    plan) and per transfer (its bytes), in the order of the first run."""
    rows: dict[tuple, KernelProfile] = {}
    per: dict[tuple, list[float]] = {}
    merged: dict[tuple, tuple] = {}
    indexed: list[list[KernelTiming]] = []
    sizes = {t.tensor: t.nbytes for t in program.transfers}
    for run in runs:
        mine = []
        for t in run:
            key = (t.kind, t.segment, t.index, t.tensor)
            if key not in rows:
                rows[key] = _step_row(program, t, len(rows), sizes)
            per.setdefault(key, []).append(t.dur_s)
            if t.launched_with is not None:
                merged[key] = (t.kind, t.segment, t.launched_with, "")
            mine.append(KernelTiming(rows[key].index, t.start_s, t.dur_s))
        indexed.append(mine)
    for key, row in rows.items():
        ds = per[key]
        row.calls, row.mean_s, row.median_s, row.min_s, row.total_s = (len(ds), statistics.fmean(ds),
                                                                        statistics.median(ds), min(ds), sum(ds))
        if key in merged and merged[key] in rows:
            row.launched_with = rows[merged[key]].index
    totals = [sum(t.dur_s for t in run) for run in runs]
    return ProfileReport(program.model_name, backend, len(runs), list(rows.values()), totals, indexed)


def _step_row(program, t: Any, index: int, sizes: dict[str, int]) -> KernelProfile:
    seg = program.segments[t.segment]
    if t.kind == "kernel":
        k = seg.program.kernels[t.index]
        cost = kernel_cost(seg.program, k)
        return KernelProfile(index, f"s{seg.index}:{k.name}", k.kind, k.group, list(k.nodes), 0, 0, 0, 0, 0,
                             cost.bytes, cost.flops)
    if t.kind == "transfer":
        return KernelProfile(index, f"transfer {t.tensor}", "transfer", f"transfer to segment {seg.index}",
                             [], 0, 0, 0, 0, 0, sizes.get(t.tensor, 0), 0)
    who = "cpu reference" if seg.program is not None else "torch_ir"
    nbytes = sum(kernel_cost(seg.program, k).bytes for k in seg.program.kernels) if seg.program is not None else 0
    return KernelProfile(index, f"s{seg.index}:{who.replace(' ', '_')}", "cpu segment", f"host ({who})",
                         list(seg.nodes), 0, 0, 0, 0, 0, nbytes, seg.flops)


def write_rows_trace(path: str | os.PathLike, report: ProfileReport) -> None:
    """A Chrome trace of a report's rows as they ran (a partitioned program's kernels, CPU segments and transfers):
    one complete event per step, every run a track of its own process row."""
    events = trace_process(0, f"{report.model} ({report.backend})", "steps")
    rows = {k.index: k for k in report.kernels}
    for it, t, start in _steps(report):
        r = rows[t.index]
        events.append({"name": r.name, "cat": r.kind, "ph": "X", "pid": 0, "tid": 0, "ts": start * 1e6,
                       "dur": t.dur_s * 1e6, "args": {"index": r.index, "group": r.group, "nodes": r.nodes,
                                                      "iteration": it, "bytes": r.bytes, "flops": r.flops}})
    write_text(path, json.dumps(trace_document(events, {"model": report.model, "backend": report.backend,
                                                        "iterations": report.iterations})))


def trace_process(pid: int, process: str, thread: str = "kernels") -> list[dict[str, Any]]:
    """The metadata events that name one process row (and its one thread) of a Chrome trace."""
    return [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": process}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": thread}}]


def kernel_event(k: KernelCall, index: int, pid: int, start_s: float, dur_s: float,
                 args: dict[str, Any]) -> dict[str, Any]:
    """One complete ('X') event for a kernel, ts/dur in microseconds; `args` joins the kernel's index, fusion group
    and IR nodes. Measured runs (`chrome_trace`) and the NPU estimate (`npusim estimate --trace`) both use it."""
    return {"name": k.name, "cat": k.kind, "ph": "X", "pid": pid, "tid": 0, "ts": start_s * 1e6, "dur": dur_s * 1e6,
            "args": {"index": index, "group": k.group, "nodes": list(k.nodes), **args}}


def trace_document(events: list[dict[str, Any]], other: dict[str, Any]) -> dict[str, Any]:
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def _steps(report: ProfileReport):
    """(iteration, timing, its start from the first timing's) of every timed step of every run."""
    starts = [t.start_s for run in report.runs for t in run]
    t0 = min(starts) if starts else 0.0
    for it, run in enumerate(report.runs):
        for t in run:
            yield it, t, t.start_s - t0


def chrome_trace(program: CompiledProgram, report: ProfileReport) -> dict[str, Any]:
    """Chrome trace event format: one complete ('X') event per kernel launch, ts/dur in microseconds. Every run
    is a track of its own process row laid out in time order, so Perfetto shows iterations side by side."""
    events = trace_process(0, f"{program.model_name} ({report.backend})")
    costs = {k.index: k for k in report.kernels}
    for it, t, start in _steps(report):
        kp = costs[t.index]
        extra = {} if t.launched_with is None else {"launched_with": program.kernels[t.launched_with].name}
        events.append(kernel_event(program.kernels[t.index], t.index, 0, start, t.dur_s,
                                   {"iteration": it, "bytes": kp.bytes, "flops": kp.flops,
                                    "compares": kp.compares, **extra}))
    return trace_document(events, {"model": program.model_name, "backend": report.backend,
                                   "iterations": report.iterations})


def write_trace(path: str | os.PathLike, program: CompiledProgram, report: ProfileReport) -> None:
    """The Chrome trace as JSON (names from the program are JSON strings, escaped by the encoder), written
    atomically with the user's umask."""
    write_text(path, json.dumps(chrome_trace(program, report)))


def write_chart(path: str | os.PathLike, report: ProfileReport, top: int = 20) -> str | None:
    """A horizontal bar chart of the slowest kernels. Returns None when written, else why not (matplotlib is an
    optional dependency; the runtime does not pull it in)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed; skipped the chart (pip install matplotlib)"
    ks = report.by_time()[:top][::-1]
    fig, ax = plt.subplots(figsize=(9, 0.3 * len(ks) + 1.5))
    ax.barh([f"{k.name} ({k.group})" for k in ks], [k.median_s * 1e3 for k in ks])
    ax.set_xlabel("median time per launch (ms)")
    ax.set_title(f"{report.model} on {report.backend}: top {len(ks)} kernels")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=os.path.splitext(os.fspath(path))[1].lstrip(".") or "png")
    plt.close(fig)
    return None


def format_table(report: ProfileReport, top: int | None = None) -> str:
    total = report.kernel_total_s or 1.0  # the header's total: the column's percentages are of it
    rows = report.by_time()[:top]
    # columns as wide as their longest entry: a cut name ("adaptive_avg_pool2d.defaul") is a wrong name
    kw = max([len("kernel"), *(len(k.name) for k in rows)])
    gw = max([len("group"), *(len(k.group) for k in rows)])
    lines = [f"{'#':>4} {'kernel':<{kw}} {'group':<{gw}} {'time(us)':>10} {'%':>6} {'MB':>9} {'MFLOP':>10} "
             f"{'Mcmp':>8} {'GB/s':>8} {'GFLOP/s':>8}  nodes"]
    for k in rows:
        nodes = ", ".join(k.nodes[:3]) + (" ..." if len(k.nodes) > 3 else "")
        if k.launched_with is not None:
            nodes = f"[in {report.kernels[k.launched_with].name}'s launch] {nodes}"
        lines.append(f"{k.index:>4} {k.name:<{kw}} {k.group:<{gw}} {k.median_s * 1e6:>10.1f} "
                     f"{100 * k.median_s / total:>6.1f} {k.bytes / 1e6:>9.3f} {k.flops / 1e6:>10.3f} "
                     f"{k.compares / 1e6:>8.3f} {k.gbps:>8.2f} {k.gflops:>8.2f}  {nodes}")
    return "\n".join(lines)
