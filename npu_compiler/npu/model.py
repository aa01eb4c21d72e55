"""The analytical NPU model: cycles, traffic and energy of one piece of work on an `NPUConfig`.

Contractions (GEMM, convolution, the two products of attention) run on an R x C array in one of three systolic
dataflows or the row-stationary one (`rowstationary.py`), at the rate of their number format (`formats.py`);
everything else runs on a vector unit of `lanes` operations per cycle. docs/npu_model.md derives the equations; the
comments here say which one each function implements.

Overlap: within a kernel, on-chip buffer traffic and computation overlap (tiles are double-buffered), and DRAM
transfers too where the preset says the hardware double-buffers its loads (`dram.double_buffered`), else they add
(but for weight loads where it prefetches them, `dram.weights_prefetched`); one DRAM latency is exposed for the
first tile when a kernel touches DRAM at all. Activations whose zero fraction is known move run-length coded and
gate their MACs where the preset has those mechanisms (`dram.rlc_*`, `array.zero_gating`). Kernels run one after another
(`estimate_program(..., pipeline=True)` overlaps a kernel's weight loads with the kernel before it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..targets.config import DATAFLOWS, NPUConfig
from .formats import mac_energy, mac_rate, vector_rate
from .mapping import LayerMapping, MappingError
from .rowstationary import RSLayer, rs_dram, rs_map, spad_bytes_per_mac
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
    constant_dram_cycles: float = 0.0  # the part of dram_cycles that loads weights and constants

    @property
    def bound(self) -> str:
        parts = (self.compute_cycles, self.onchip_cycles, self.dram_cycles)
        return BOUNDS[parts.index(max(parts))]

    @property
    def energy_total_pj(self) -> float:
        return sum(self.energy_pj.values())

    def utilization(self, npu: NPUConfig) -> float:
        """MACs done / MACs the array could have done in the predicted cycles (in its fastest format)."""
        cap = npu.peak_macs_per_s / npu.clock_hz * self.cycles
        return self.macs / cap if cap > 0 else 0.0


def estimate(work: Work, npu: NPUConfig, mapping: LayerMapping | None = None) -> Estimate:
    """`mapping`: the row-stationary choices for this work instead of the mapper's (a convolution on an `rs` array)."""
    rs = DATAFLOWS[npu.dataflow] == "rs"
    if mapping is not None and not (rs and isinstance(work, ConvWork)):
        what = "a convolution" if isinstance(work, ConvWork) else f"not a convolution ({type(work).__name__})"
        raise MappingError(f"{mapping.where}: a mapping sets a convolution's row-stationary passes; "
                           f"{work.label or 'this kernel'} is {what} on {npu.name}'s {npu.dataflow} array")
    if isinstance(work, GemmWork):
        return gemm(work, npu)
    if isinstance(work, ConvWork):
        detail: dict[str, object] = {"conv": f"{work.kh}x{work.kw}/{work.stride[0]}"}
        if rs:
            h_in = (work.ho - 1) * work.stride[0] + work.kh  # the padded rows the convolution reads
            layer = rs_layer(work)
            given = mapping.choose(layer, npu) if mapping is not None else None
            if given is not None:
                detail["mapping"] = mapping.where
            return gemm(conv_as_gemm(work), npu, detail, layer, (h_in, work.stride[0]), given)
        return gemm(conv_as_gemm(work), npu, detail)
    if isinstance(work, AttentionWork):
        return attention(work, npu)
    return vector(work, npu)


# ---- the array -------------------------------------------------------------------------------------------------


def array_mapping(m: int, n: int, k: int, dataflow: str) -> tuple[int, int, int]:
    """(dimension along the array's rows, dimension along its columns, dimension streamed in time).
    Weight stationary: B[k, n] sits in the cells, A's m rows stream. Output stationary: each cell accumulates one
    C[m, n] over k. Input stationary: A^T[k, m] sits in the cells, B's n columns stream."""
    return {"ws": (k, n, m), "os": (m, n, k), "is": (k, m, n)}[dataflow]


def array_cycles(m: int, n: int, k: int, npu: NPUConfig, batch: int = 1, rate: float = 1.0) -> tuple[float, int]:
    """(cycles, folds) of `batch` products C[m,n] = A[m,k] B[k,n] on the array, at `rate` MACs per cell per cycle
    (the number format's: 0.25 for 16-bit operands on 8-bit cells, which take four passes).

    The work is cut into folds of R x C cells. A fold streams its `stream` vectors in, skewed by one cycle per row
    and column, so the last result leaves R + C - 2 cycles after the last vector enters: stream + R + C - 2 cycles.
    A fold that covers only part of the array (an edge fold) takes as long: data still crosses the whole array.
    In the weight- and input-stationary dataflows the fold's stationary tile first shifts in, one row per cycle
    (R cycles); with `preload_overlap` the next tile shifts in while the current fold computes, so only the first
    load shows. In the output-stationary dataflow results drain through the cells while the next fold computes.
    With `fold_overlap` a fold's vectors enter right behind the previous fold's (which drains meanwhile): fill and
    drain show once, and a fold takes its stream or, when the next tile shifts in during it, at least R cycles.
    The row-stationary dataflow maps the product as 1 x 1 convolutions (`rowstationary.py`).
    """
    rows, cols = npu.array_rows, npu.array_cols
    df = DATAFLOWS[npu.dataflow]
    if df == "rs":
        mapping = rs_map(rs_gemm_layer(m, n, k), npu, 1, 1, rate)
        return mapping.cycles * batch, mapping.units * batch
    spatial_r, spatial_c, stream = array_mapping(m, n, k, df)
    folds = math.ceil(spatial_r / rows) * math.ceil(spatial_c / cols) * batch
    if not folds:
        return 0, 0
    preload = 0 if df == "os" else rows
    if npu.fold_overlap:
        per_fold = max(stream, rows) if (npu.preload_overlap or df == "os") else stream + preload
        total = folds * per_fold + rows + cols - 2 + (preload if npu.preload_overlap else 0)
    else:
        total = folds * (stream + rows + cols - 2) + (preload if npu.preload_overlap else folds * preload)
    return total / rate, folds


def rs_gemm_layer(m: int, n: int, k: int) -> RSLayer:
    """A product C[m,n] = A[m,k] B[k,n] as row stationary sees it: n filters of k channels, 1 x 1, over m columns."""
    return RSLayer(1, n, k, 1, 1, 1, m, m)


def rs_layer(c: ConvWork) -> RSLayer:
    """A convolution's shape for the row-stationary dataflow (a side conv's 1x1 channels join C)."""
    return RSLayer(c.n, c.o, c.c // c.groups + c.side_c, c.kh, c.kw, c.ho, c.wo, (c.wo - 1) * c.stride[1] + c.kw)


def conv_as_gemm(c: ConvWork) -> GemmWork:
    """A convolution on the array is a GEMM over image patches per group: M = N*Ho*Wo output pixels,
    K = C/groups*kh*kw, N = O/groups. The patches are formed on chip from the input tile, so A's footprint stays the
    input tensor's, not the kh*kw times larger patch matrix. A side conv's channels lengthen K (its input and weight
    are among the extra operands)."""
    return GemmWork(
        m=c.n * c.ho * c.wo, n=c.o // c.groups, k=(c.c // c.groups) * c.kh * c.kw + c.side_c, a=c.x, b=c.weight,
        out=c.out,
        a_elem=c.elem, b_elem=c.elem, out_elem=c.elem, batch=c.groups, extra=c.extra, vector_ops=c.vector_ops,
        label=c.label, staging=c.staging, dtypes=c.dtypes, out_dtype=c.out_dtype)


def gemm_dram(g: GemmWork, npu: NPUConfig) -> tuple[int, dict[str, object]]:
    """DRAM bytes of a GEMM with tiles chosen to fit the buffers (double-buffered where DRAM transfers overlap the
    computation: a tile may use half).

    Every output tile reduces its whole K on chip (accumulators), so C is written once. Two loop orders:
    B-resident: B is cut into column panels that fit the weight buffer, each read once; A is read once per panel
    unless all of A fits the activation buffer. A-resident: A is cut into row panels that fit the activation
    buffer, each read once; B is read once per panel unless all of B fits the weight buffer. The order that moves
    fewer DRAM bytes is taken. Operands resident on chip (intermediates in the activation buffer) cost no DRAM, and
    an A resident on chip is one panel. The activation buffer's share for tiles is what the residency plan leaves
    free (`staging`)."""
    halves = 2 if npu.dram_overlap else 1  # double-buffered tiles take half the buffer each
    wcap = npu.weight_buffer_kib * 1024 / halves
    icap = (npu.activation_buffer_kib * 1024 if g.staging is None else g.staging) / halves
    acc_cols = max(1, int(npu.accumulator_kib * 1024 / 2 // npu.accumulator_bytes))  # accumulators of one row
    fa, fb = dram_bytes(g.a, npu) / g.batch, weight_dram_bytes(g, npu) / g.batch
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
    once = sum(dram_bytes(o, npu) for o in (g.out, *g.extra) if not o.on_chip)
    total = int(round(g.batch * min(c1, c2) + once))
    constant = (0 if g.b.on_chip or not g.b.constant else g.batch * fb * b_reads) + sum(
        o.bytes for o in g.extra if o.constant and not o.on_chip)
    return total, {"order": chosen, "a_reads": a_reads, "b_reads": b_reads, **tiles, "constant_bytes": constant}


def rlc_ratio(zeros: float, elem: int, npu: NPUConfig) -> float:
    """Coded / dense bytes of a tensor with a fraction `zeros` of zero elements under the NPU's run-length coding:
    a pair (run of up to `rlc_max_run` zeros, the next value) per nonzero, plus a pair with a zero value for every
    run longer than the longest a pair codes; `rlc_pairs_per_word` pairs in a word of `rlc_word_bits`. With zeros
    spread independently a nonzero ends a run with probability 1 - z, and a run outlasts one pair with
    probability z^(L+1) (L = rlc_max_run): (1 - z) / (1 - z^(L+1)) pairs an element. Below about 25% zeros the
    code is longer than the data (Eyeriss: 21.3 bits a pair against 16 bits an element); the hardware codes every
    activation it moves anyway."""
    z = min(max(zeros, 0.0), 1.0)
    runs = npu.rlc_max_run + 1
    pairs = 1 / runs if z >= 1.0 else (1 - z) / (1 - z ** runs)
    return pairs * npu.rlc_word_bits / npu.rlc_pairs_per_word / (8 * elem)


def dram_bytes(op: Operand, npu: NPUConfig) -> float:
    """What `op` moves over the DRAM link: run-length coded where the NPU codes activations and the tensor's zero
    fraction is known (weights and constants are stored as they are), else its bytes."""
    if npu.rlc_max_run and op.zeros is not None and op.elem and not op.constant:
        return op.bytes * rlc_ratio(op.zeros, op.elem, npu)
    return float(op.bytes)


def weight_dram_bytes(g: GemmWork, npu: NPUConfig) -> float:
    """B's DRAM bytes: where the NPU stores its weights as whole array tiles (`dram.whole_weight_tiles`: the TPU's
    Weight Memory holds 256 x 256 tiles), a weight-stationary B[k, n] moves ceil(k/R) ceil(n/C) full tiles, zero-padded
    at the edges (TPU v1 paper, section 7: a 600 x 600 matrix takes 9 tile loads)."""
    b = g.b
    if not (npu.whole_weight_tiles and b.constant and DATAFLOWS[npu.dataflow] == "ws"):
        return dram_bytes(b, npu)
    rows, cols = npu.array_rows, npu.array_cols
    return float(g.batch * math.ceil(g.k / rows) * rows * math.ceil(g.n / cols) * cols * g.b_elem)


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
    """Bytes that hop between neighbouring cells per MAC: the two operands that are not stationary (row stationary:
    the scratchpad reads and writes of each MAC)."""
    acc = npu.accumulator_bytes
    df = DATAFLOWS[npu.dataflow]
    if df == "rs":
        return spad_bytes_per_mac(max(g.a_elem, g.b_elem), acc)
    return {"ws": g.a_elem + acc, "os": g.a_elem + g.b_elem, "is": g.b_elem + acc}[df]


def gemm(g: GemmWork, npu: NPUConfig, detail: dict[str, object] | None = None,
         conv: RSLayer | None = None, conv_geometry: tuple[int, int] | None = None,
         given: tuple[int, int] | None = None) -> Estimate:
    """A GEMM (or a convolution as one) on the array: cycles at its format's rate, DRAM by the tiling, on-chip
    traffic by the dataflow (a convolution under row stationary: by its own mapping, `conv`, with the channels and
    filters a pass `given` or the mapper's)."""
    rate, formats, note = mac_rate(npu, *g.dtypes)
    info: dict[str, object] = {"m": g.m, "n": g.n, "k": g.k, "batch": g.batch, **(detail or {})}
    if note:
        info["format_note"] = note
    if conv is not None and conv_geometry is not None:
        h_in, stride = conv_geometry
        extra = [o for o in g.extra if not o.on_chip]
        elem = max(g.a_elem, g.b_elem)
        dram, tiles = rs_dram(conv, npu, h_in, stride, elem, npu.accumulator_bytes,
                              npu.activation_buffer_kib * 1024 if g.staging is None else g.staging, g.a.on_chip,
                              g.out.on_chip, dram_bytes(g.a, npu) / max(g.a.bytes, 1),
                              dram_bytes(g.out, npu) / max(g.out.bytes, 1))
        dram = int(round(dram + sum(dram_bytes(o, npu) for o in extra)))
        tiles["constant_bytes"] = ((tiles["constant_bytes"] if g.b.constant and not g.b.on_chip else 0)
                                   + sum(o.bytes for o in extra if o.constant))
    else:
        dram, tiles = gemm_dram(g, npu)
    constant = tiles.pop("constant_bytes")
    info.update(tiles)
    network = 0.0
    if conv is not None:
        mapping = rs_map(conv, npu, max(g.a_elem, g.b_elem), npu.accumulator_bytes, rate, given)
        cyc, folds, onchip = mapping.cycles, mapping.units, mapping.glb_bytes
        network = mapping.psum_cycles(npu)
        info.update({"active_pes": mapping.active_pes, "slots": mapping.slots, "psum_passes": mapping.passes,
                     "channels_per_pass": mapping.channels_per_pass, "filters_per_pass": mapping.filters_per_pass})
        onchip += sum(o.bytes for o in g.extra)
    elif rate > 0:
        cyc, folds = array_cycles(g.m, g.n, g.k, npu, g.batch, rate)
        onchip = gemm_array_sram(g, npu)
        if DATAFLOWS[npu.dataflow] == "rs":  # the partial sums' networks bound a product as they bound a conv
            network = rs_map(rs_gemm_layer(g.m, g.n, g.k), npu, 1, npu.accumulator_bytes).psum_cycles(npu) * g.batch
    else:
        cyc, folds, onchip = math.inf, 0, gemm_array_sram(g, npu)
    reg = g.macs * moving_bytes_per_mac(g, npu)
    switching = g.macs
    if npu.zero_gating and g.a.zeros:
        # a zero input activation gates the multiplier and the weight read (Eyeriss's zero buffer); the input and
        # partial-sum accesses still happen, and the cycle is still spent
        gated = g.macs * min(max(g.a.zeros, 0.0), 1.0)
        switching -= gated
        reg -= gated * (g.b_elem if DATAFLOWS[npu.dataflow] == "rs" else 0)
        info["gated_macs"] = gated
    return _finish(npu, cyc, g.vector_ops, dram, onchip + dram, reg, g.macs, folds, info,
                   mac_pj=mac_energy(npu, formats), vector_dtype=g.out_dtype, constant_dram=constant,
                   switching_macs=switching, network_cycles=network)


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
                  staging=w.staging, dtypes=w.dtypes, out_dtype="float32")
    pv = GemmWork(m, w.v_dim, w.kv_len, scores, w.v, w.out, 4, w.elem, w.elem, bh, label="pv", staging=w.staging,
                  dtypes=w.dtypes, out_dtype=w.dtypes[0])
    sm = VectorWork(w.softmax_ops, (scores, *((w.mask,) if w.mask is not None else ())), (scores,), "softmax",
                    "float32")
    parts = [gemm(qk, npu), vector(sm, npu), gemm(pv, npu)]
    busy = [p.cycles - p.latency_cycles for p in parts]
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
        energy_pj={k: sum(p.energy_pj[k] for p in parts) for k in parts[0].energy_pj}
        | {"static": (sum(busy) + latency) * npu.static_pj_per_cycle},
        detail={"group": group, "phases": {"qk": busy[0], "softmax": busy[1], "pv": busy[2]},
                **({"format_note": parts[0].detail["format_note"]} if "format_note" in parts[0].detail else {})},
        constant_dram_cycles=sum(p.constant_dram_cycles for p in parts),
    )


# ---- the vector unit ---------------------------------------------------------------------------------------------


def vector(v: VectorWork, npu: NPUConfig) -> Estimate:
    """`ops` at `lanes` per cycle; every operand passes through the on-chip buffers; those not resident on chip
    come from or go to DRAM."""
    moved = sum(o.bytes for o in (*v.reads, *v.writes))
    dram = int(round(sum(dram_bytes(o, npu) for o in (*v.reads, *v.writes) if not o.on_chip)))
    constant = sum(o.bytes for o in v.reads if o.constant and not o.on_chip)
    return _finish(npu, 0, v.ops, dram, moved + dram, 0, 0, 0, {}, vector_dtype=v.dtype, constant_dram=constant)


def busy_cycles(npu: NPUConfig, compute: float, onchip: float, dram: float, constant_dram: float) -> float:
    """A kernel's cycles before the exposed DRAM latency. Buffer traffic overlaps the computation (double-buffered
    tiles); DRAM transfers too where the NPU double-buffers them, else they add, except weight and constant loads
    where it prefetches those (`dram.weights_prefetched`: Eyeriss loads the next pass's filters during a pass but
    stops while it loads inputs and writes outputs)."""
    if npu.dram_overlap:
        return max(compute, onchip, dram)
    if npu.weights_prefetched:
        return max(compute, onchip, constant_dram) + dram - constant_dram
    return max(compute, onchip) + dram


def _finish(npu: NPUConfig, array_cyc: float, ops: int, dram: int, sram: int, reg: int, macs: int, folds: int,
            detail: dict[str, object], mac_pj: float | None = None, vector_dtype: str = "",
            constant_dram: float = 0.0, switching_macs: float | None = None, network_cycles: float = 0.0) -> Estimate:
    """`network_cycles`: the on-chip time a network narrower than the aggregate buffer bandwidth needs (row
    stationary: the partial sums' networks), a floor under the on-chip cycles."""
    lane_rate, note = vector_rate(npu, vector_dtype) if vector_dtype else (1.0, None)
    if note and ops:
        detail.setdefault("format_note", note)
    vector_cyc = math.ceil(ops / (npu.vector_lanes * lane_rate)) if lane_rate > 0 else (math.inf if ops else 0)
    compute = max(array_cyc, vector_cyc)
    onchip = max(sram / npu.sram_bytes_per_cycle, network_cycles)
    dram_cyc = dram / (npu.dram_gb_s * 1e9) * npu.clock_hz
    const_cyc = min(constant_dram / (npu.dram_gb_s * 1e9) * npu.clock_hz, dram_cyc)
    latency = npu.dram_latency_ns * 1e-9 * npu.clock_hz if dram else 0.0
    cycles = busy_cycles(npu, compute, onchip, dram_cyc, const_cyc) + latency
    energy = {
        "mac": (macs if switching_macs is None else switching_macs) * (npu.mac_pj if mac_pj is None else mac_pj),
        "register": reg * npu.register_pj_per_byte,
        "sram": sram * npu.sram_pj_per_byte,
        "dram": dram * npu.dram_pj_per_byte,
        "vector": ops * npu.vector_op_pj,
        "static": cycles * npu.static_pj_per_cycle,
    }
    return Estimate(cycles, compute, onchip, dram_cyc, latency, array_cyc, macs, ops, dram, sram, reg, folds,
                    energy, detail, const_cyc)
