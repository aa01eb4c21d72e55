"""`DAGExecutor`: runs a `PartitionPlan` (npu_compiler.partition): accelerator partitions as compiled programs on a
backend, CPU partitions through `torch_ir.IRExecutor` (npu_runtime.fallback), tensors moved at the boundaries.

All expensive work happens in `__init__`: every accelerator partition is compiled once, its executor built and its
weights uploaded once; `run` only binds inputs, launches and moves boundary tensors. A partition that fails to
compile runs on the CPU instead, with a warning that names it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from npu_compiler.errors import NPUCompileError
from npu_compiler.partition import CPU, NPU, Partition, PartitionPlan, RunPartition
from npu_compiler.program import CompiledProgram

from .backend import Backend
from .dtypes import convert, dtype_name
from .errors import InputError, WeightError
from .fallback import CpuFallback, to_numpy, to_torch
from .weights import TensorSource, WeightSet, load_weights

__all__ = ["DAGExecutor", "TransferRecord"]

CompileFn = Callable[[Mapping[str, Any]], CompiledProgram]


@dataclass(frozen=True)
class TransferRecord:
    tensor: str
    src: str
    dst: str
    before: int  # the partition that needed it


@dataclass
class _Stage:
    partition: Partition
    device: str  # effective device: NPU, or CPU for a CPU partition or an NPU partition that failed to compile
    program: CompiledProgram | None = None
    executor: Any = None
    weights: WeightSet | None = None
    fallback: CpuFallback | None = None


class DAGExecutor:
    """Run a partition plan. `weights`: a state dict (NumPy or torch), a safetensors path/folder, or a
    `TensorSource`. `compile_fn(sub_ir) -> CompiledProgram` defaults to `npu_compiler.compile` for the backend's
    compile target with `dtype` and `compile_options` (any other keyword of `npu_compiler.compile`:
    `disable_passes`, `fusion`, `rope_theta`, ...), the same for every partition."""

    def __init__(self, plan: PartitionPlan, backend: Backend, compile_fn: CompileFn | None = None,
                 weights: Any = None, *, dtype: str | None = None,
                 compile_options: Mapping[str, Any] | None = None) -> None:
        self.plan = plan
        self.backend = backend
        self.dtype = dtype
        self.compile_options = {k: v for k, v in (compile_options or {}).items() if k != "dtype"}
        if compile_options and compile_options.get("dtype") is not None and dtype is None:
            self.dtype = compile_options["dtype"]
        self._compile = compile_fn or self._default_compile
        self._source = weights if isinstance(weights, TensorSource) or weights is None else TensorSource(weights)
        self.stages: list[_Stage | None] = []
        self.fell_back: list[int] = []  # NPU partitions that run on the CPU because they failed to compile
        for p in plan.partitions:
            if not p.outputs:
                self.stages.append(None)  # nothing it computes is read: dead code, never run
                continue
            self.stages.append(self._build(p))
        self.last_transfers: list[TransferRecord] = []
        self._partition_of = {t.name: t.producer for p in plan.partitions for t in p.outputs}
        self._graph_inputs = {t.name: t for t in plan.graph_inputs}

    # ---- init ---------------------------------------------------------------------------------------------------
    def _default_compile(self, sub_ir: Mapping[str, Any]) -> CompiledProgram:
        import npu_compiler  # the default only: a caller with a prebuilt artifact passes its own compile_fn

        return npu_compiler.compile(sub_ir, self.backend.compile_target(), dtype=self.dtype, **self.compile_options)

    def _build(self, p: Partition) -> _Stage:
        if p.device == NPU:
            try:
                program = self._compile(p.ir)
            except NPUCompileError as e:
                warnings.warn(f"{p.name} failed to compile for backend '{self.backend.name}' and runs on the CPU "
                              f"instead: {e}", RuntimeWarning, stacklevel=3)
                self.fell_back.append(p.index)
            else:
                source = self._source if self._source is not None else TensorSource({})
                ws = load_weights(program, source, self.backend) if program.weights else None
                return _Stage(p, NPU, program, self.backend.create_executor(program), ws)
        return _Stage(p, CPU, fallback=CpuFallback(p.ir, self._cpu_weights(p), name=p.name))

    def _cpu_weights(self, p: Partition) -> dict[str, Any]:
        """The state-dict tensors the partition's sub-IR reads (a tied weight read from its twin's key)."""
        ir = p.ir
        mapping = ir.get("weight_name_mapping") or {}
        constants = ir.get("constants") or {}
        declared = {w["name"]: w for w in ir.get("weights") or []}
        out: dict[str, Any] = {}
        for nd in ir["nodes"]:
            for t in nd.get("inputs", []):
                if t.get("producer_node") is not None:
                    continue
                ph = t["name"]
                key = mapping.get(ph, ph)
                if key in out or key in constants or ph in constants:
                    continue
                if self._source is not None and key in self._source:
                    out[key] = self._source.get(key)
                    continue
                shape = list(t.get("shape", []))
                twin = next((k for k, w in declared.items() if k != key and list(w.get("shape", [])) == shape
                             and self._source is not None and k in self._source), None)
                if twin is None:
                    raise WeightError(f"{p.name}: node '{nd['name']}' ({nd['op_type']}) reads weight '{key}' "
                                      f"(placeholder '{ph}', {t.get('dtype')}{shape}), which the weights do not hold")
                out[key] = self._source.get(twin)
        return out

    # ---- run ----------------------------------------------------------------------------------------------------
    @property
    def num_transfers(self) -> int:
        """Transfers done by the last `run` (equals `plan.num_transfers` unless a partition fell back)."""
        return len(self.last_transfers)

    def _check_inputs(self, inputs: Mapping[str, Any]) -> None:
        missing = [n for n in self._graph_inputs if n not in inputs]
        unexpected = [n for n in inputs if n not in self._graph_inputs]
        if missing or unexpected:
            want = ", ".join(f"'{t.name}' {t.dtype}{t.shape}" for t in self.plan.graph_inputs)
            raise InputError(f"model '{self.plan.model_name}': missing input(s) {missing}, unexpected {unexpected}; "
                             f"it takes {want}")
        for name, v in inputs.items():
            t = self._graph_inputs[name]
            shape = list(np.shape(v)) if not hasattr(v, "shape") else list(v.shape)
            if shape != list(t.shape):
                raise InputError(f"input '{name}': expected shape {t.shape}, got {shape}")

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run once: graph inputs (NumPy arrays or torch tensors) by name -> graph outputs as NumPy arrays of the
        IR's dtypes (bf16 as ml_dtypes.bfloat16)."""
        self._check_inputs(inputs)
        host: dict[str, np.ndarray] = {}  # NPU side: host arrays in the IR dtypes, bound as program inputs
        cpu: dict[str, Any] = {}  # CPU side: torch tensors
        for name, v in inputs.items():
            t = self._graph_inputs[name]
            arr = to_numpy(v) if not isinstance(v, np.ndarray) else v
            host[name] = convert(np.asarray(arr), t.dtype) if dtype_name(np.asarray(arr).dtype) != t.dtype else arr
        transfers: list[TransferRecord] = []
        for step in self.plan.steps:
            if not isinstance(step, RunPartition):
                continue  # transfers are done on demand below, so a fallen-back partition moves nothing extra
            stage = self.stages[step.partition]
            if stage is None:
                continue
            p = stage.partition
            for t in p.inputs:
                self._make_resident(t.name, stage.device, host, cpu, transfers, p.index)
            if stage.device == NPU:
                names = [s.name for s in stage.program.inputs]
                outs = stage.executor.run_numpy({n: host[n] for n in names}, stage.weights)
                for t in p.outputs:
                    host[t.name] = outs[t.name]
            else:
                outs = stage.fallback.run({t.name: cpu[t.name] for t in p.inputs})
                cpu.update(outs)
        self.last_transfers = transfers
        result: dict[str, np.ndarray] = {}
        for t in self.plan.graph_outputs:
            if t.name in self._graph_inputs or t.name in host:
                result[t.name] = np.array(host[t.name], copy=True)
            elif t.name in cpu:
                result[t.name] = to_numpy(cpu[t.name])
            else:
                raise InputError(f"graph output '{t.name}' ({t.dtype}{t.shape}) was not produced: partition "
                                 f"{self._partition_of.get(t.name)} did not run")
        return result

    def _make_resident(self, name: str, device: str, host: dict[str, np.ndarray], cpu: dict[str, Any],
                       log: list[TransferRecord], before: int) -> None:
        if name in self._graph_inputs:
            # Graph inputs are bound on either side like any program input, not transferred.
            if device == CPU and name not in cpu:
                cpu[name] = to_torch(host[name])
            return
        if device == NPU and name not in host:
            host[name] = to_numpy(cpu[name])  # bf16 stays bf16 (ml_dtypes)
            log.append(TransferRecord(name, CPU, NPU, before))
        elif device == CPU and name not in cpu:
            cpu[name] = to_torch(host[name])  # bf16 stays torch.bfloat16
            log.append(TransferRecord(name, NPU, CPU, before))
