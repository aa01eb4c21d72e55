"""The NPU itself: an analytical, tiling-aware model of a systolic-array NPU (`NPUConfig`) that predicts cycles,
DRAM traffic and energy for every kernel of a compiled program. Pure Python: no runtime, no torch."""

from ..targets.config import NPUConfig
from .config_file import NPUConfigError, load_npu, preset_names
from .estimate import KernelEstimate, ProgramEstimate, estimate_program, format_groups, format_table
from .model import Estimate, array_cycles, estimate
from .work import AttentionWork, ConvWork, GemmWork, Operand, VectorWork, kernel_work

__all__ = [
    "NPUConfig", "NPUConfigError", "load_npu", "preset_names", "estimate_program", "ProgramEstimate",
    "KernelEstimate", "format_table", "format_groups", "Estimate", "estimate", "array_cycles", "GemmWork",
    "ConvWork", "AttentionWork", "VectorWork", "Operand", "kernel_work",
]
