"""The row-stationary dataflow (Eyeriss: Chen, Krishna, Emer, Sze, JSSC 2017; Chen, Emer, Sze, ISCA 2016).

Each processing element (PE) runs a 1-D convolution: one filter row (S weights, kept in its filter scratchpad) slides
along one input row, producing one row of F partial sums. A *PE set* of R x E PEs computes one 2-D convolution of one
channel by one filter: its R rows hold the filter's R rows, its E columns the E output rows; partial sums flow up a
column and add up. A set is mapped onto the physical rows x cols array:

- a set wider than the array is cut into segments of at most `cols` output rows (AlexNet's CONV1, E = 55, on 14
  columns: 4 segments of 14, 14, 14 and 13), and a filter taller than the array into parts of at most `rows` rows;
- as many segments as fit are placed side by side: floor(rows / R) across the rows and floor(cols / e) across the
  columns (AlexNet's CONV3, R = 3, E = 13: four sets of 3 x 13, 156 active PEs; CONV2, R = 5, E = 27: two segments
  of 5 x 14 and 5 x 13, 135 active PEs).

Every (image, filter, channel) pair of every segment is one unit of work of F x S MACs per PE, one MAC per PE per
cycle; the slots work in parallel, so a layer takes ceil(units / slots) x F x S cycles. A fully connected layer (or a
1x1 convolution lowered to a GEMM) is the degenerate case R = S = E = 1: each PE multiplies one weight along the
rows of the input, and every PE of the array holds a (filter, channel) pair.

Data movement: every MAC reads its input, its weight and its partial sum from the PE's scratchpads and writes the
partial sum back. The global buffer sends each input row once per group of p filters that a PE interleaves (p
bounded by the partial-sum scratchpad and p q S by the filter scratchpad, q the channels it interleaves, bounded by
the input scratchpad) and each filter row once per image and segment. A pass over q channels sends every partial sum
it made back to the buffer, and every pass but the first reads them in again: C / q passes, each partial sum
carrying R S q MACs. The partial sums travel on networks of their own, one each way (Eyeriss: 64 bits, four 16-bit
partial sums a cycle), which bounds the array at 4 R S q MACs a cycle when the passes are many
(`buffers.psum_bytes_per_cycle`). The mapper takes the largest q and p the scratchpads hold; a mapping the user gives
(`mapping.py`: the chip's own, in a validation study) sets them per layer within the same bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..targets.config import NPUConfig


@dataclass(frozen=True)
class RSLayer:
    """A convolution as the row-stationary dataflow sees it (a GEMM: R = S = E = 1, F = its rows)."""

    n: int  # images
    m: int  # filters (output channels)
    c: int  # channels per group
    r: int  # filter rows
    s: int  # filter columns
    e: int  # output rows
    f: int  # output columns
    w_in: int  # input row length the PE slides over ((F - 1) * stride + S)


@dataclass(frozen=True)
class RSMapping:
    cycles: float
    units: int  # (image, filter, channel, segment, filter part) units of F x S MACs
    slots: int  # units in flight at once
    active_pes: int
    glb_bytes: float  # global buffer <-> array traffic
    psum_in_bytes: float = 0.0  # partial sums read back from the global buffer (part of glb_bytes)
    psum_out_bytes: float = 0.0  # partial sums and outputs written to it (part of glb_bytes)
    passes: int = 1  # passes over the channels, each sending its partial sums to the global buffer
    channels_per_pass: int = 1  # q
    filters_per_pass: int = 1  # p

    def psum_cycles(self, npu: NPUConfig) -> float:
        """Cycles the partial-sum networks need (each way at `buffers.psum_bytes_per_cycle`; 0: not limited)."""
        bw = npu.psum_bytes_per_cycle
        return max(self.psum_in_bytes, self.psum_out_bytes) / bw if bw > 0 else 0.0


def channels_limit(layer: RSLayer, npu: NPUConfig) -> int:
    """The most input channels a PE interleaves: S inputs a channel in the input scratchpad (the mapper's q)."""
    return max(1, min(layer.c, npu.ifmap_spad // max(layer.s, 1)))


def filters_limit(layer: RSLayer, npu: NPUConfig, q: int) -> int:
    """The most filters a PE interleaves at q channels a pass: a partial sum each in the partial-sum scratchpad,
    q S weights each in the filter scratchpad (the mapper's p)."""
    return max(1, min(layer.m, npu.psum_spad, npu.filter_spad // max(q * layer.s, 1)))


def rs_map(layer: RSLayer, npu: NPUConfig, elem: int, acc_bytes: int, rate: float = 1.0,
           given: tuple[int, int] | None = None) -> RSMapping:
    """`given`: (q, p) instead of the mapper's (checked by the caller: `mapping.LayerMapping.choose`)."""
    rows, cols = npu.array_rows, npu.array_cols
    r_parts = math.ceil(layer.r / rows)
    r_eff = math.ceil(layer.r / r_parts)
    seg = min(layer.e, cols)
    segments = math.ceil(layer.e / seg)
    slots = (rows // r_eff) * (cols // seg)
    units = layer.n * layer.m * layer.c * segments * r_parts
    per_unit = layer.f * layer.s
    cycles = math.ceil(units / slots) * per_unit / rate if units else 0.0
    # the PEs busy in the widest wave: whole sets side by side when a set's segments all fit, else full segments
    if not units:
        active = 0
    elif segments <= slots:
        active = r_eff * layer.e * min(slots // segments, math.ceil(units / segments))
    else:
        active = r_eff * seg * min(slots, units)
    if given is None:
        q = channels_limit(layer, npu)
        given = (q, filters_limit(layer, npu, q))
    q, p = given
    ifmap = layer.n * layer.c * (layer.e + layer.r - 1) * layer.w_in * elem  # rows the sets read (halo included)
    filters = layer.m * layer.c * layer.r * layer.s * elem
    outputs = layer.n * layer.m * layer.e * layer.f
    # every pass over q channels writes its partial sums out; every pass but the first reads them back in
    passes = math.ceil(layer.c / q)
    psum_out, psum_in = outputs * acc_bytes * passes, outputs * acc_bytes * (passes - 1)
    glb = ifmap * math.ceil(layer.m / p) + filters * layer.n * segments + psum_in + psum_out
    return RSMapping(cycles, units, slots, active, glb, psum_in, psum_out, passes, q, p)


def spad_bytes_per_mac(elem: int, acc_bytes: int) -> int:
    """Scratchpad bytes each MAC moves: input, weight, partial sum read and written."""
    return 2 * elem + 2 * acc_bytes


def rs_dram(layer: RSLayer, npu: NPUConfig, h_in: int, stride: int, elem: int, acc_bytes: int, staging: float,
            x_on_chip: bool = False, out_on_chip: bool = False, x_coded: float = 1.0,
            out_coded: float = 1.0) -> tuple[float, dict[str, object]]:
    """DRAM bytes of a convolution in the row-stationary loop nest, with the tiles that move the fewest: for each
    tile of n_t images and e_t output rows, for each group of m_t filters, the partial sums of the tile stay in the
    global buffer while the channels stream through in groups of c_t (filters into the PE scratchpads, input rows
    into the global buffer). Inputs are read once per filter group (and their halo rows once per row tile), filters
    once per image and row tile, outputs written once. The global buffer holds the input tile and the partial sums
    (`staging`: what the residency plan leaves of it), double-buffered where DRAM transfers overlap the computation;
    the scratchpads hold m_t c_t R S weights. `x_coded`, `out_coded`: the input's and output's coded size on the
    DRAM link over their dense size (run-length coding); `constant_bytes` in the returned tiles: the filters' part."""
    spads = npu.weight_buffer_kib * 1024
    glb = max(staging, 0.0) / (2 if npu.dram_overlap else 1)
    n, m, c, r, s, e, f, w = (layer.n, layer.m, layer.c, layer.r, layer.s, layer.e, layer.f, layer.w_in)
    ifmap_total = n * c * h_in * w * elem * x_coded
    filters_total = m * c * r * s * elem
    best: tuple[float, dict[str, object]] | None = None
    for n_t in _choices(n):
        for e_t in _choices(e):
            rows_in = min(h_in, (e_t - 1) * stride + r)
            halo = rows_in * math.ceil(e / e_t) / h_in
            for c_t in _choices(c):
                m_spad = spads // max(c_t * r * s * elem, 1)
                room = glb - n_t * c_t * rows_in * w * elem
                m_glb = room // max(n_t * e_t * f * acc_bytes, 1)
                m_t = min(m, m_spad, m_glb)
                if m_t < 1:
                    continue
                ifmap = 0.0 if x_on_chip else ifmap_total * halo * (1 if c_t == c and m_t == m else math.ceil(m / m_t))
                weights = filters_total * math.ceil(n / n_t) * math.ceil(e / e_t)
                total = ifmap + weights
                if best is None or total < best[0]:
                    best = (total, {"order": "RS", "n_tile": n_t, "e_tile": e_t, "m_tile": m_t, "c_tile": c_t,
                                    "constant_bytes": weights})
    if best is None:  # not even one filter row fits: every MAC's operands from DRAM
        macs = n * m * c * r * s * e * f
        best = (float(macs * elem * (1 + x_coded)), {"order": "RS (no tile fits)", "constant_bytes": macs * elem})
    outputs = 0 if out_on_chip else n * m * e * f * elem * out_coded
    return best[0] + outputs, best[1]


def _choices(k: int) -> list[int]:
    """Tile sizes worth trying for a dimension of k: powers of two and k's own divisors up to k (at most ~30)."""
    out = {k}
    p = 1
    while p < k:
        out.add(p)
        p *= 2
    out.update(d for d in range(1, min(k, 64) + 1) if k % d == 0)
    return sorted(out)
