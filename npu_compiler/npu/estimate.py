"""`estimate_program`: the NPU model over every kernel of a compiled program, with totals for the program and per
fusion group, a JSON-able report and a text table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..program import CompiledProgram
from ..targets.config import NPUConfig
from .formats import as_format
from .mapping import LayerMapping, by_kernel, parse_mapping
from .model import Estimate, busy_cycles, estimate
from .residency import STAGING_SHARES, ResidencyPlan, plan_residency
from .work import AttentionWork, ConvWork, GemmWork, VectorWork, Work, kernel_work


@dataclass
class KernelEstimate:
    index: int
    name: str
    kind: str
    group: str
    nodes: list[str]
    work: str  # what the model saw, in words
    est: Estimate
    time_s: float
    utilization: float

    @property
    def flops(self) -> int:
        return 2 * self.est.macs + self.est.vector_ops

    def to_dict(self) -> dict[str, Any]:
        e = self.est
        return {
            "index": self.index, "name": self.name, "kind": self.kind, "group": self.group, "nodes": self.nodes,
            "work": self.work, "cycles": e.cycles, "time_s": self.time_s, "bound": e.bound,
            "compute_cycles": e.compute_cycles, "onchip_cycles": e.onchip_cycles, "dram_cycles": e.dram_cycles,
            "latency_cycles": e.latency_cycles, "array_utilization": self.utilization, "macs": e.macs,
            "vector_ops": e.vector_ops, "flops": self.flops, "folds": e.folds, "dram_bytes": e.dram_bytes,
            "sram_bytes": e.sram_bytes, "register_bytes": e.register_bytes, "energy_pj": e.energy_total_pj,
            "energy_breakdown_pj": e.energy_pj, "detail": e.detail,
        }


@dataclass
class ProgramEstimate:
    model: str
    npu: NPUConfig
    kernels: list[KernelEstimate]
    residency: ResidencyPlan
    context_len: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def cycles(self) -> float:
        return sum(k.est.cycles for k in self.kernels)

    @property
    def time_s(self) -> float:
        return sum(k.time_s for k in self.kernels)

    @property
    def dram_bytes(self) -> int:
        return sum(k.est.dram_bytes for k in self.kernels)

    @property
    def energy_pj(self) -> float:
        return sum(k.est.energy_total_pj for k in self.kernels)

    @property
    def macs(self) -> int:
        return sum(k.est.macs for k in self.kernels)

    @property
    def utilization(self) -> float:
        cap = self.npu.peak_macs_per_s / self.npu.clock_hz * self.cycles
        return self.macs / cap if cap else 0.0

    def by_group(self) -> dict[str, dict[str, float]]:
        """Totals per fusion group (the pattern or op each kernel came from), slowest first."""
        out: dict[str, dict[str, float]] = {}
        for k in self.kernels:
            g = out.setdefault(k.group, {"kernels": 0, "time_s": 0.0, "cycles": 0.0, "dram_bytes": 0,
                                         "energy_pj": 0.0, "macs": 0})
            g["kernels"] += 1
            g["time_s"] += k.time_s
            g["cycles"] += k.est.cycles
            g["dram_bytes"] += k.est.dram_bytes
            g["energy_pj"] += k.est.energy_total_pj
            g["macs"] += k.est.macs
        return dict(sorted(out.items(), key=lambda kv: -kv[1]["time_s"]))

    def by_bound(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for k in self.kernels:
            out[k.est.bound] = out.get(k.est.bound, 0.0) + k.time_s
        return out

    def totals(self) -> dict[str, Any]:
        return {"cycles": self.cycles, "time_s": self.time_s, "dram_bytes": self.dram_bytes,
                "energy_pj": self.energy_pj, "macs": self.macs, "array_utilization": self.utilization,
                "time_by_bound_s": self.by_bound()}

    def to_dict(self) -> dict[str, Any]:
        r = self.residency
        return {"model": self.model, "npu": self.npu.to_dict(),
                "residency": {"policy": r.policy, "capacity_bytes": r.capacity, "resident_tensors": r.resident_tensors,
                              "spilled_tensors": r.spilled_tensors, "peak_bytes": r.peak_bytes},
                "context_len": self.context_len, "totals": self.totals(), "by_group": self.by_group(),
                "kernels": [k.to_dict() for k in self.kernels], "notes": self.notes}


def estimate_program(program: CompiledProgram, npu: NPUConfig, *, context_len: int | None = None,
                     arena_on_chip: bool | None = None, number_format: str | None = None,
                     pipeline: bool = False, zeros: Mapping[str, float] | None = None,
                     mapping: Mapping[str, LayerMapping | Mapping[str, int]] | None = None) -> ProgramEstimate:
    """Predict every kernel of `program` on `npu`. `context_len`: tokens that decode attention reads from its cache
    (default: the whole static cache). `arena_on_chip`: None plans each tensor's residency in the activation buffer
    (`residency.plan_residency`); True keeps every intermediate on chip whatever its size, False none.
    `number_format`: cost every floating-point tensor as this format (int8, int16, fp16, bf16, fp32: what the
    program would take once quantized to it). `pipeline`: layer-to-layer pipelining (a kernel's weight loads start
    during the kernel before it, in the DRAM time that one leaves idle). `zeros`: the fraction of zero elements of
    the tensors it names (buffer names: measured activations); on an NPU that codes zero runs on its DRAM link or
    gates zero operands, those tensors are costed so (the others dense). `mapping`: per layer (a kernel's or node's
    name), the row-stationary channels and filters a pass instead of the mapper's (`mapping.py`; a
    `{"channels_per_pass": 1}` dict or a `LayerMapping` from `load_mapping`)."""
    if zeros:
        names = {b.name for b in program.buffers}
        for name, z in zeros.items():
            if name not in names:
                raise ValueError(f"zeros: no tensor named {name!r} in {program.model_name}")
            if not 0.0 <= z <= 1.0:
                raise ValueError(f"zeros: {name}: a fraction of zero elements is between 0 and 1, got {z!r}")
    given = by_kernel(_layer_mappings(mapping or {}), [(k.name, list(k.nodes)) for k in program.kernels])
    notes = [f"{len(given)} kernel(s) mapped as given: {', '.join(program.kernels[i].name for i in sorted(given))}"
             ] if given else []
    if number_format is not None:
        program = as_format(program, number_format)
        notes.append(f"every floating-point tensor costed as {number_format} (--format)")
    policy = {None: "plan", True: "all", False: "none"}[arena_on_chip]
    capacity = int(npu.activation_buffer_kib * 1024)
    best = None
    for share in STAGING_SHARES if policy == "plan" else (1 / 2,):
        plan = plan_residency(program, capacity, context_len=context_len, policy=policy, staging_share=share)
        est = _estimate_with(program, npu, plan, context_len, pipeline, zeros, given)
        if best is None or est.time_s < best.time_s:
            best = est
    best.notes[:0] = notes
    return best


def _layer_mappings(mapping: Mapping[str, LayerMapping | Mapping[str, int]]) -> dict[str, LayerMapping]:
    return {name: m if isinstance(m, LayerMapping) else parse_mapping({name: m})[name] for name, m in mapping.items()}


def _estimate_with(program: CompiledProgram, npu: NPUConfig, plan: ResidencyPlan, context_len: int | None,
                   pipeline: bool, zeros: Mapping[str, float] | None = None,
                   given: Mapping[int, LayerMapping] | None = None) -> ProgramEstimate:
    kernels = []
    idle = 0.0  # DRAM cycles the previous kernel left idle (pipelining prefetches into them)
    for i, k in enumerate(program.kernels):
        work = kernel_work(program, k, plan.kernels[i], context_len=context_len, zeros=zeros)
        est = estimate(work, npu, (given or {}).get(i))
        if plan.kernels[i].spilled:
            est.detail["spills"] = [program.buffers[b].name for b in plan.kernels[i].spilled]
        if pipeline:
            idle = _prefetch(program, k, npu, est, idle, context_len, first=i == 0)
        kernels.append(KernelEstimate(i, k.name, k.kind, k.group, list(k.nodes), describe_work(work), est,
                                      est.cycles / npu.clock_hz, est.utilization(npu)))
    notes = [plan.summary()]
    notes += sorted({str(k.est.detail["format_note"]) for k in kernels if "format_note" in k.est.detail})
    if pipeline:
        notes.append("layer-to-layer pipelining: weight loads start during the kernel before")
    return ProgramEstimate(program.model_name, npu, kernels, plan, context_len, notes)


def _prefetch(program: CompiledProgram, k, npu: NPUConfig, est: Estimate, idle: float, context_len: int | None,
              first: bool) -> float:
    """Hide up to `idle` cycles of this kernel's weight loads (they depend on no earlier kernel) in the kernel before
    it; returns the DRAM cycles this kernel leaves idle."""
    cost = k.spec.cost(k, program.buffers, context_len=context_len)
    weights = sum(t.bytes for t in cost.reads if program.buffers[t.buffer].kind in ("weight", "constant"))
    hidden = 0.0 if first else min(idle, weights / (npu.dram_gb_s * 1e9) * npu.clock_hz, est.dram_cycles)
    dram = est.dram_cycles - hidden
    busy = busy_cycles(npu, est.compute_cycles, est.onchip_cycles, dram, max(est.constant_dram_cycles - hidden, 0.0))
    if hidden > 0:
        est.latency_cycles = 0.0  # the first tile came in early
        est.detail["prefetched_cycles"] = hidden
    est.cycles = busy + est.latency_cycles
    est.energy_pj["static"] = est.cycles * npu.static_pj_per_cycle
    return est.cycles - dram


def describe_work(w: Work) -> str:
    if isinstance(w, GemmWork):
        return f"gemm {w.m}x{w.n}x{w.k}" + (f" x{w.batch}" if w.batch > 1 else "")
    if isinstance(w, ConvWork):
        g = f" g{w.groups}" if w.groups > 1 else ""
        return f"conv {w.kh}x{w.kw}/{w.stride[0]} {w.c}->{w.o} {w.ho}x{w.wo}{g}"
    if isinstance(w, AttentionWork):
        return f"attention {w.heads}/{w.kv_heads}h q{w.q_len} kv{w.kv_len} d{w.head_dim}"
    assert isinstance(w, VectorWork)
    moved = sum(o.bytes for o in (*w.reads, *w.writes))
    return f"vector {w.ops / 1e6:.3g} Mop {moved / 1e6:.3g} MB"


def format_table(est: ProgramEstimate, top: int | None = None, measured: dict[int, float] | None = None) -> str:
    """Kernels slowest first: predicted cycles and time, bound, array utilisation, DRAM traffic, energy; with
    `measured` (kernel index -> seconds) the measured time beside the prediction."""
    head = (f"{'#':>4} {'kernel':<22} {'group':<20} {'work':<30} {'cycles':>11} {'time(us)':>10} {'bound':>8} "
            f"{'util%':>6} {'DRAM MB':>9} {'energy uJ':>10}")
    if measured is not None:
        head += f" {'measured(us)':>13} {'meas/pred':>9}"
    lines = [head]
    rows = sorted(est.kernels, key=lambda k: -k.time_s)[:top]
    for k in rows:
        line = (f"{k.index:>4} {k.name[:22]:<22} {k.group[:20]:<20} {k.work[:30]:<30} {k.est.cycles:>11.0f} "
                f"{k.time_s * 1e6:>10.2f} {k.est.bound:>8} {100 * k.utilization:>6.1f} "
                f"{k.est.dram_bytes / 1e6:>9.3f} {k.est.energy_total_pj / 1e6:>10.3f}")
        if measured is not None:
            t = measured.get(k.index, 0.0)
            line += f" {t * 1e6:>13.1f} {t / k.time_s if k.time_s else 0.0:>9.2f}"
        lines.append(line)
    return "\n".join(lines)


def format_groups(est: ProgramEstimate, top: int = 12) -> str:
    lines = [f"{'fusion group':<28} {'kernels':>7} {'time(us)':>10} {'%':>6} {'DRAM MB':>9} {'energy uJ':>10}"]
    total = est.time_s or 1.0
    for name, g in list(est.by_group().items())[:top]:
        lines.append(f"{name[:28]:<28} {g['kernels']:>7} {g['time_s'] * 1e6:>10.2f} {100 * g['time_s'] / total:>6.1f} "
                     f"{g['dram_bytes'] / 1e6:>9.3f} {g['energy_pj'] / 1e6:>10.3f}")
    return "\n".join(lines)
