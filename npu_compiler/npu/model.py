"""The analytical NPU model: cycles, traffic and energy of one piece of work on an `NPUConfig`.

Contractions (GEMM, convolution, the two products of attention) run on an R x C systolic array in one of three
dataflows; everything else runs on a vector unit of `lanes` operations per cycle. docs/npu_model.md derives the
equations; the comments here say which one each function implements.

Overlap: within a kernel, DRAM transfers, on-chip buffer traffic and computation overlap completely (tiles are
double-buffered), so a kernel takes the longest of the three, plus one DRAM latency for the first tile when it
touches DRAM at all. Kernels run one after another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..targets.config import DATAFLOWS, NPUConfig
from .work import AttentionWork, ConvWork, GemmWork, Operand, VectorWork, Work

BOUNDS = ("compute", "on-chip", "DRAM")


@dataclass
class Estimate:
    """What the model predicts for one kernel. Cycles are clock cycles of the NPU."""

    cycles: float  # predicted: the longest of compute, on-chip and DRAM, plus the exposed DRAM latency
    compute_cycles: float  # the array and the vector unit (they overlap: the longer of the two)
    onchip_cycles: float  # bytes through the on-chip buffers / their bandwidth
    dram_cycles: float  # DRAM bytes / DRAM bandwidth, in cycles
    latency_cycles: float
    array_cycles: float  # cycles the array is busy (the compute part that is the array's)
    macs: int
    vector_ops: int
    dram_bytes: int
    sram_bytes: int
    register_bytes: int
    folds: int = 0
    energy_pj: dict[str, float] = field(default_factory=dict)
    detail: dict[str, object] = field(default_factory=dict)

    @property
    def bound(self) -> str:
        parts = (self.compute_cycles, self.onchip_cycles, self.dram_cycles)
        return BOUNDS[parts.index(max(parts))]

    @property
    def energy_total_pj(self) -> float:
        return sum(self.energy_pj.values())

    def utilization(self, npu: NPUConfig) -> float:
        """MACs done / MACs the array could have done in the predicted cycles."""
        cap = npu.array_rows * npu.array_cols * self.cycles
        return self.macs / cap if cap > 0 else 0.0


def estimate(work: Work, npu: NPUConfig) -> Estimate:
    if isinstance(work, GemmWork):
        return gemm(work, npu)
    if isinstance(work, ConvWork):
        return gemm(conv_as_gemm(work), npu, detail={"conv": f"{work.kh}x{work.kw}/{work.stride[0]}"})
    if isinstance(work, AttentionWork):
        return attention(work, npu)
    return vector(work, npu)


# ---- the array -------------------------------------------------------------------------------------------------


def array_mapping(m: int, n: int, k: int, dataflow: str) -> tuple[int, int, int]:
    """(dimension along the array's rows, dimension along its columns, dimension streamed in time).
    Weight stationary: B[k, n] sits in the cells, A's m rows stream. Output stationary: each cell accumulates one
    C[m, n] over k. Input stationary: A^T[k, m] sits in the cells, B's n columns stream."""
    return {"ws": (k, n, m), "os": (m, n, k), "is": (k, m, n)}[dataflow]


def array_cycles(m: int, n: int, k: int, npu: NPUConfig, batch: int = 1) -> tuple[int, int]:
    """(cycles, folds) of `batch` products C[m,n] = A[m,k] B[k,n] on the array.

    The work is cut into folds of R x C cells. A fold streams its `stream` vectors in, skewed by one cycle per row
    and column, so the last result leaves R + C - 2 cycles after the last vector enters: stream + R + C - 2 cycles.
    A fold that covers only part of the array (an edge fold) takes as long: data still crosses the whole array.
    In the weight- and input-stationary dataflows the fold's stationary tile first shifts in, one row per cycle
    (R cycles); with `preload_overlap` the next tile shifts in while the current fold computes, so only the first
    load shows. In the output-stationary dataflow results drain through the cells while the next fold computes.
    """
    rows, cols = npu.array_rows, npu.array_cols
    spatial_r, spatial_c, stream = array_mapping(m, n, k, DATAFLOWS[npu.dataflow])
    folds = math.ceil(spatial_r / rows) * math.ceil(spatial_c / cols) * batch
    per_fold = stream + rows + cols - 2
    preload = 0 if DATAFLOWS[npu.dataflow] == "os" else rows
    total = folds * per_fold + (preload if npu.preload_overlap else folds * preload)
    return (total if folds else 0), folds


def conv_as_gemm(c: ConvWork) -> GemmWork:
    """A convolution on the array is a GEMM over image patches per group: M = N*Ho*Wo output pixels,
    K = C/groups*kh*kw, N = O/groups. The patches are formed on chip from the input tile, so A's footprint stays the
    input tensor's, not the kh*kw times larger patch matrix. A side conv's channels lengthen K (its input and weight
    are among the extra operands)."""
    return GemmWork(
        m=c.n * c.ho * c.wo, n=c.o // c.groups, k=(c.c // c.groups) * c.kh * c.kw + c.side_c, a=c.x, b=c.weight,
        out=c.out,
        a_elem=c.elem, b_elem=c.elem, out_elem=c.elem, batch=c.groups, extra=c.extra, vector_ops=c.vector_ops,
        label=c.label, staging=c.staging)


def gemm_dram(g: GemmWork, npu: NPUConfig) -> tuple[int, dict[str, object]]:
    """DRAM bytes of a GEMM with tiles chosen to fit the buffers (each double-buffered: a tile may use half).

    Every output tile reduces its whole K on chip (accumulators), so C is written once. Two loop orders:
    B-resident: B is cut into column panels that fit the weight buffer, each read once; A is read once per panel
    unless all of A fits the activation buffer. A-resident: A is cut into row panels that fit the activation
    buffer, each read once; B is read once per panel unless all of B fits the weight buffer. The order that moves
    fewer DRAM bytes is taken. Operands resident on chip (intermediates in the activation buffer) cost no DRAM, and
    an A resident on chip is one panel. The activation buffer's share for tiles is what the residency plan leaves
    free (`staging`)."""
    wcap = npu.weight_buffer_kib * 1024 / 2
    icap = (npu.activation_buffer_kib * 1024 if g.staging is None else g.staging) / 2
    acc_cols = max(1, int(npu.accumulator_kib * 1024 / 2 // npu.accumulator_bytes))  # accumulators of one row
    fa, fb = g.a.bytes / g.batch, g.b.bytes / g.batch
    a_row, b_col = fa / max(g.m, 1), fb / max(g.n, 1)

    # B-resident
    nt = max(1, min(g.n, int(wcap // b_col) if b_col else g.n, acc_cols))
    panels_n = math.ceil(g.n / nt)
    mt = max(1, min(g.m, acc_cols // nt))
    b_reads1 = 1 if b_col * nt <= wcap else math.ceil(g.m / mt)
    a_reads1 = 1 if fa <= icap else panels_n
    # A-resident (an A held on chip between kernels is one panel already)
    mt2 = g.m if g.a.on_chip else max(1, min(g.m, int(icap // a_row) if a_row else g.m))
    panels_m = math.ceil(g.m / mt2)
    a_reads2 = 1 if g.a.on_chip or a_row * mt2 <= icap else math.ceil(g.n / max(1, acc_cols // mt2))
    b_reads2 = 1 if fb <= wcap else panels_m

    def cost(a_reads: int, b_reads: int) -> float:
        return (0 if g.a.on_chip else fa * a_reads) + (0 if g.b.on_chip else fb * b_reads)

    c1, c2 = cost(a_reads1, b_reads1), cost(a_reads2, b_reads2)
    if c1 <= c2:
        chosen, a_reads, b_reads, tiles = "B-resident", a_reads1, b_reads1, {"n_tile": nt, "panels": panels_n}
    else:
        chosen, a_reads, b_reads, tiles = "A-resident", a_reads2, b_reads2, {"m_tile": mt2, "panels": panels_m}
    once = sum(o.bytes for o in (g.out, *g.extra) if not o.on_chip)
    total = int(round(g.batch * min(c1, c2))) + once
    return total, {"order": chosen, "a_reads": a_reads, "b_reads": b_reads, **tiles}


def gemm_array_sram(g: GemmWork, npu: NPUConfig) -> int:
    """Bytes between the buffers and the array. Weight stationary: B once, A once per column fold, partial sums
    written and read back once per extra row fold. Output stationary: A once per column fold, B once per row fold,
    C written once. Input stationary: A once, B once per column fold, partial sums as in weight stationary."""
    rows, cols, acc = npu.array_rows, npu.array_cols, npu.accumulator_bytes
    m, n, k = g.m, g.n, g.k
    a_all, b_all = m * k * g.a_elem, k * n * g.b_elem
    psums = m * n * acc * (2 * math.ceil(k / rows) - 1)
    df = DATAFLOWS[npu.dataflow]
    if df == "ws":
        per = b_all + a_all * math.ceil(n / cols) + psums
    elif df == "os":
        per = a_all * math.ceil(n / cols) + b_all * math.ceil(m / rows) + m * n * acc
    else:
        per = a_all + b_all * math.ceil(m / cols) + psums
    return g.batch * (per + m * n * g.out_elem) + sum(o.bytes for o in g.extra)


def moving_bytes_per_mac(g: GemmWork, npu: NPUConfig) -> int:
    """Bytes that hop between neighbouring cells per MAC: the two operands that are not stationary."""
    acc = npu.accumulator_bytes
    return {"ws": g.a_elem + acc, "os": g.a_elem + g.b_elem, "is": g.b_elem + acc}[DATAFLOWS[npu.dataflow]]


def gemm(g: GemmWork, npu: NPUConfig, detail: dict[str, object] | None = None) -> Estimate:
    cyc, folds = array_cycles(g.m, g.n, g.k, npu, g.batch)
    ops = g.vector_ops
    dram, tiles = gemm_dram(g, npu)
    sram = gemm_array_sram(g, npu) + dram
    reg = g.macs * moving_bytes_per_mac(g, npu)
    info = {"m": g.m, "n": g.n, "k": g.k, "batch": g.batch, **tiles, **(detail or {})}
    return _finish(npu, cyc, ops, dram, sram, reg, g.macs, folds, info)


# ---- attention ---------------------------------------------------------------------------------------------------


def attention(w: AttentionWork, npu: NPUConfig) -> Estimate:
    """Q K^T on the array (K^T stationary), the softmax on the vector unit, P V on the array (V stationary). The
    query heads that share a key/value head are stacked into M, so each K and V is loaded once for all of them.
    The scores stay on chip (processed in tiles, as flash attention does); the three phases run one after
    another."""
    group = w.heads // w.kv_heads if w.kv_heads and w.heads % w.kv_heads == 0 else 1
    bh = w.batch * (w.heads // group)
    m = w.q_len * group
    scores = Operand(w.batch * w.heads * w.q_len * w.kv_len * 4, on_chip=True)
    qk = GemmWork(m, w.kv_len, w.head_dim, w.q, w.k, scores, w.elem, w.elem, 4, bh, extra=w.extra, label="qk",
                  staging=w.staging)
    pv = GemmWork(m, w.v_dim, w.kv_len, scores, w.v, w.out, 4, w.elem, w.elem, bh, label="pv", staging=w.staging)
    sm = VectorWork(w.softmax_ops, (scores, *((w.mask,) if w.mask is not None else ())), (scores,), "softmax")
    parts = [gemm(qk, npu), vector(sm, npu), gemm(pv, npu)]
    busy = [max(p.compute_cycles, p.onchip_cycles, p.dram_cycles) for p in parts]
    latency = max(p.latency_cycles for p in parts)
    return Estimate(
        cycles=sum(busy) + latency,
        compute_cycles=sum(p.compute_cycles for p in parts),
        onchip_cycles=sum(p.onchip_cycles for p in parts),
        dram_cycles=sum(p.dram_cycles for p in parts),
        latency_cycles=latency,
        array_cycles=sum(p.array_cycles for p in parts),
        macs=sum(p.macs for p in parts), vector_ops=sum(p.vector_ops for p in parts),
        dram_bytes=sum(p.dram_bytes for p in parts), sram_bytes=sum(p.sram_bytes for p in parts),
        register_bytes=sum(p.register_bytes for p in parts), folds=sum(p.folds for p in parts),
        energy_pj={k: sum(p.energy_pj[k] for p in parts) for k in parts[0].energy_pj},
        detail={"group": group, "phases": {"qk": busy[0], "softmax": busy[1], "pv": busy[2]}},
    )


# ---- the vector unit ---------------------------------------------------------------------------------------------


def vector(v: VectorWork, npu: NPUConfig) -> Estimate:
    """`ops` at `lanes` per cycle; every operand passes through the on-chip buffers; those not resident on chip
    come from or go to DRAM."""
    moved = sum(o.bytes for o in (*v.reads, *v.writes))
    dram = sum(o.bytes for o in (*v.reads, *v.writes) if not o.on_chip)
    return _finish(npu, 0, v.ops, dram, moved + dram, 0, 0, 0, {})


def _finish(npu: NPUConfig, array_cyc: float, ops: int, dram: int, sram: int, reg: int, macs: int, folds: int,
            detail: dict[str, object]) -> Estimate:
    compute = max(array_cyc, math.ceil(ops / npu.vector_lanes))
    onchip = sram / npu.sram_bytes_per_cycle
    dram_cyc = dram / (npu.dram_gb_s * 1e9) * npu.clock_hz
    latency = npu.dram_latency_ns * 1e-9 * npu.clock_hz if dram else 0.0
    energy = {
        "mac": macs * npu.mac_pj,
        "register": reg * npu.register_pj_per_byte,
        "sram": sram * npu.sram_pj_per_byte,
        "dram": dram * npu.dram_pj_per_byte,
        "vector": ops * npu.vector_op_pj,
    }
    return Estimate(max(compute, onchip, dram_cyc) + latency, compute, onchip, dram_cyc, latency, array_cyc, macs,
                    ops, dram, sram, reg, folds, energy, detail)
