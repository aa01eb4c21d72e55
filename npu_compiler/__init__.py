"""NPU Simulation compiler: IR JSON (pytorch-ir) -> CompiledProgram (.npubin). Imports neither torch nor the
runtime."""

from .compile_artifact import compile_artifact
from .compiler import OPTIONAL_PASSES, compile
from .errors import (
    ArtifactError,
    ConstraintError,
    InternalError,
    IRFormatError,
    NPUCompileError,
    NPUSimError,
    NPUSimWarning,
    OutputError,
    ResourceError,
    UnsupportedOpError,
)
from .ir.graph import Graph, Node, TensorType, Value
from .ir.reader import read_ir
from .limits import Limits
from .partitioned_program import PartitionedProgram, Segment, load_artifact
from .program import CompiledProgram, KernelCall, Recipe, TensorRef, TensorSpec, WeightSpec
from .targets.codegen import CodegenTarget, available_targets, get_codegen_target
from .targets.config import PRESETS, TargetConfig, default_config

__all__ = [
    "compile", "compile_artifact", "load_artifact", "PartitionedProgram", "Segment",
    "OPTIONAL_PASSES", "read_ir", "CompiledProgram", "KernelCall", "TensorRef", "TensorSpec", "WeightSpec",
    "Recipe", "Graph", "Node", "Value", "TensorType", "TargetConfig", "PRESETS", "default_config", "CodegenTarget",
    "get_codegen_target", "available_targets", "NPUCompileError", "IRFormatError", "UnsupportedOpError",
    "ConstraintError", "ArtifactError", "NPUSimError", "NPUSimWarning", "InternalError", "OutputError", "ResourceError",
    "Limits",
]
