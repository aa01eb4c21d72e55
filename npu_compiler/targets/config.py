"""`TargetConfig`: the accelerator being simulated (its constraints), chosen separately from the machine that
executes the code (`CodegenTarget`)."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class TargetConfig:
    name: str
    compute_dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16")
    channel_alignment_bytes: int = 1  # 4-D activations and conv weights have C padded to this many bytes
    max_dispatch_per_dim: int = 2**31 - 1
    max_rank: int = 8
    tile_m: int = 64
    tile_n: int = 64
    tile_k: int = 32
    # Figures for a cost model and for reporting the fraction of the physical limit.
    peak_tflops: dict[str, float] = field(default_factory=dict)
    memory_gbps: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


CPU_DEFAULT = TargetConfig(name="cpu")
CUDA_DEFAULT = TargetConfig(
    name="cuda",
    max_dispatch_per_dim=2**31 - 1,
    tile_m=128,
    tile_n=128,
    tile_k=64,
    peak_tflops={"bfloat16": 989.0, "float16": 989.0, "float32": 67.0},
    memory_gbps=3350.0,
)
WEBGPU_DEFAULT = TargetConfig(name="webgpu", max_dispatch_per_dim=65535)
HIP_DEFAULT = TargetConfig(name="hip")  # compile-only: no figures to report against
# An NPU-like accelerator: half-precision only, 64-byte channel alignment, small dispatch grid.
NPU_STRICT = TargetConfig(
    name="npu",
    compute_dtypes=("float16", "bfloat16"),
    channel_alignment_bytes=64,
    max_dispatch_per_dim=65535,
)

PRESETS: dict[str, TargetConfig] = {c.name: c for c in (CPU_DEFAULT, CUDA_DEFAULT, WEBGPU_DEFAULT, HIP_DEFAULT,
                                                         NPU_STRICT)}


def default_config(target: str) -> TargetConfig:
    return PRESETS.get(target, CPU_DEFAULT)


# ---- the NPU's compute and memory figures (what `npusim estimate` predicts with) -----------------------------------

DATAFLOWS = {"weight_stationary": "ws", "output_stationary": "os", "input_stationary": "is", "row_stationary": "rs"}
# Number formats by the dtypes that hold them
FORMATS = {"int8": "int8", "uint8": "int8", "int16": "int16", "float16": "fp16", "bfloat16": "bf16",
           "float32": "fp32", "int32": "int32", "int64": "int64", "bool": "int8"}
FORMAT_BITS = {"int8": 8, "int16": 16, "fp16": 16, "bf16": 16, "fp32": 32, "int32": 32, "int64": 64}


def _npu_field(key: str, check: str, doc: str, default=dataclasses.MISSING):
    """A field of NPUConfig: `key` is its dotted name in an NPU file (section.key), `check` its constraint
    ('positive', 'non_negative', 'dataflow', 'formats', 'any'). The file loader reads this metadata, so the fields,
    the file keys and their checks are written down once, here."""
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata={"key": key, "check": check, "doc": doc})
    return field(default=default, metadata={"key": key, "check": check, "doc": doc})


@dataclass(frozen=True)
class NPUConfig:
    """A systolic-array NPU: an R x C array of multiply-accumulate cells with one dataflow, a vector unit for
    everything that is not a contraction, three on-chip buffers and DRAM. Loaded from a TOML file
    (`npu_compiler.npu.load_npu`); the model in `npu_compiler.npu.model` predicts cycles, traffic and energy from
    it."""

    name: str = _npu_field("name", "any", "short name shown in reports")
    array_rows: int = _npu_field("array.rows", "positive", "rows of the MAC array (R)")
    array_cols: int = _npu_field("array.cols", "positive", "columns of the MAC array (C)")
    dataflow: str = _npu_field("array.dataflow", "dataflow",
                               "weight_stationary, output_stationary or input_stationary")
    clock_mhz: float = _npu_field("array.clock_mhz", "positive", "clock of the array, vector unit and buffers")
    vector_lanes: int = _npu_field("vector.lanes", "positive", "elementwise operations per cycle")
    weight_buffer_kib: float = _npu_field("buffers.weights_kib", "positive",
                                          "on-chip buffer of the stationary-side operand (weights)")
    activation_buffer_kib: float = _npu_field("buffers.activations_kib", "positive",
                                              "on-chip buffer of activations (inputs and outputs of layers)")
    accumulator_kib: float = _npu_field("buffers.accumulators_kib", "positive", "partial-sum storage")
    sram_bytes_per_cycle: float = _npu_field("buffers.bandwidth_bytes_per_cycle", "positive",
                                             "bytes per cycle between the buffers and the array/vector unit")
    dram_gb_s: float = _npu_field("dram.bandwidth_gb_s", "positive", "DRAM bandwidth, GB/s (1e9 bytes/s)")
    dram_latency_ns: float = _npu_field("dram.latency_ns", "non_negative", "DRAM access latency")
    mac_pj: float = _npu_field("energy.mac_pj", "non_negative", "one multiply-accumulate")
    register_pj_per_byte: float = _npu_field("energy.register_pj_per_byte", "non_negative",
                                             "a byte moved between neighbouring cells of the array")
    sram_pj_per_byte: float = _npu_field("energy.sram_pj_per_byte", "non_negative",
                                         "a byte read or written in an on-chip buffer")
    dram_pj_per_byte: float = _npu_field("energy.dram_pj_per_byte", "non_negative",
                                         "a byte read or written in DRAM")
    vector_op_pj: float = _npu_field("energy.vector_op_pj", "non_negative", "one vector-unit operation")
    description: str = _npu_field("description", "any", "one line about the design and its sources", "")
    preload_overlap: bool = _npu_field("array.preload_overlap", "any",
                                       "the next fold's stationary operand shifts in while the current fold "
                                       "computes (double-buffered cells)", False)
    accumulator_bytes: int = _npu_field("array.accumulator_bytes", "positive", "bytes of one partial sum", 4)
    # Number formats (int8, int16, fp16, bf16, fp32): MACs per cell per cycle in each format the array takes, and
    # operations per lane per cycle in each the vector unit takes. Empty: every format at one per cycle.
    array_formats: dict = _npu_field("array.formats", "formats",
                                     "MACs per cell per cycle in each number format the array takes", {})
    vector_formats: dict = _npu_field("vector.formats", "formats",
                                      "operations per lane per cycle in each number format the vector unit takes", {})
    mac_pj_by_format: dict = _npu_field("energy.mac_pj_by_format", "formats",
                                        "one MAC in a given format (formats not listed: mac_pj)", {})
    # Overlap (what the hardware double-buffers)
    fold_overlap: bool = _npu_field("array.fold_overlap", "any",
                                    "a fold's operands enter while the previous fold drains (fill and drain paid once "
                                    "per kernel, not per fold)", False)
    dram_overlap: bool = _npu_field("dram.double_buffered", "any",
                                    "DRAM transfers of a kernel overlap its computation (double-buffered loads); "
                                    "false: they add", True)
    weights_prefetched: bool = _npu_field("dram.weights_prefetched", "any",
                                          "weight and constant loads overlap the computation even where the other "
                                          "transfers do not (a weight buffer filled during the previous pass)", False)
    whole_weight_tiles: bool = _npu_field("dram.whole_weight_tiles", "any",
                                          "weights are stored and fetched as whole R x C array tiles, zero-padded at "
                                          "the edges", False)
    # Run-length coding of activations on the DRAM link: a run of up to `rlc_max_run` zeros and the next value make
    # one pair, `rlc_pairs_per_word` pairs pack into a word of `rlc_word_bits`. rlc_max_run = 0: no coding.
    rlc_max_run: int = _npu_field("dram.rlc_max_run", "non_negative",
                                  "run-length coding of activations on the DRAM link: longest zero run one pair "
                                  "codes (0: no coding)", 0)
    rlc_pairs_per_word: int = _npu_field("dram.rlc_pairs_per_word", "positive",
                                         "run-length coding: (run, value) pairs packed into one word", 1)
    rlc_word_bits: int = _npu_field("dram.rlc_word_bits", "positive", "run-length coding: bits of one coded word",
                                    32)
    zero_gating: bool = _npu_field("array.zero_gating", "any",
                                   "a MAC whose input activation is zero does not switch the multiplier or read its "
                                   "weight (no MAC energy, no weight read)", False)
    static_pj_per_cycle: float = _npu_field("energy.static_pj_per_cycle", "non_negative",
                                            "energy of every cycle the NPU runs whatever it computes: clock network, "
                                            "control, leakage", 0.0)
    # Row-stationary processing elements (dataflow row_stationary): scratchpad entries per PE
    filter_spad: int = _npu_field("array.filter_spad", "positive", "row stationary: filter entries per PE", 224)
    ifmap_spad: int = _npu_field("array.ifmap_spad", "positive", "row stationary: input entries per PE", 12)
    psum_spad: int = _npu_field("array.psum_spad", "positive", "row stationary: partial sums per PE", 24)
    psum_bytes_per_cycle: float = _npu_field("buffers.psum_bytes_per_cycle", "non_negative",
                                             "row stationary: bytes per cycle of partial sums each way between the "
                                             "buffer and the array (0: only the aggregate bandwidth)", 0.0)
    # Area (mm^2), optional: sweeps draw it where a preset gives it
    area_mm2_per_cell: float = _npu_field("area.cell_mm2", "non_negative", "one MAC cell", 0.0)
    area_mm2_per_kib: float = _npu_field("area.sram_mm2_per_kib", "non_negative", "one KiB of on-chip buffer", 0.0)
    area_mm2_fixed: float = _npu_field("area.other_mm2", "non_negative", "everything else (I/O, control)", 0.0)

    @property
    def clock_hz(self) -> float:
        return self.clock_mhz * 1e6

    @property
    def peak_macs_per_s(self) -> float:
        """In the array's fastest format."""
        return self.array_rows * self.array_cols * self.clock_hz * max(self.array_formats.values(), default=1.0)

    @property
    def area_mm2(self) -> float:
        """Cells, buffers and the rest, where the file gives them (0: no area)."""
        kib = self.weight_buffer_kib + self.activation_buffer_kib + self.accumulator_kib
        return (self.array_rows * self.array_cols * self.area_mm2_per_cell + kib * self.area_mm2_per_kib
                + self.area_mm2_fixed)

    def to_dict(self) -> dict:
        return asdict(self)
