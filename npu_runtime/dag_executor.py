"""`DAGExecutor`: runs a partitioned artifact (`npu_compiler.PartitionedProgram`): the target's segments as programs
on a backend, the CPU reference's as programs on the cpu backend, the rest through `torch_ir.IRExecutor`
(npu_runtime.fallback, only where torch is installed), tensors moved between the accelerator and the host at the
boundaries. A `PartitionPlan` is compiled into such an artifact first (the compiler is imported for that only).

All expensive work happens in `__init__`: every executor is built and every segment's weights loaded once, from one
weights source (a weight that two segments keep the same way is uploaded once; one that the accelerator and the
host keep differently is made for each); `run` only binds inputs, launches and moves boundary tensors. Tensors made
on the accelerator stay there for the accelerator segments after them; the host holds NumPy arrays in the IR's
dtypes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from npu_compiler.partition import CPU, NPU, TARGET, TORCH, PartitionPlan
from npu_compiler.partitioned_program import PartitionedProgram, Segment
from npu_compiler.program import CompiledProgram, TensorSpec

from .backend import Backend, DeviceBuffer
from .dtypes import convert, dtype_name
from .errors import InputError, NPURuntimeError, WeightError
from .weights import TensorSource, WeightReport, WeightSet, load_weights

__all__ = ["DAGExecutor", "TransferRecord", "StepTiming", "WeightPool"]

CompileFn = Callable[[Mapping[str, Any]], CompiledProgram]


@dataclass(frozen=True)
class TransferRecord:
    tensor: str
    src: str
    dst: str
    before: int  # the segment that needed it


@dataclass
class StepTiming:
    """One step of a profiled run: a kernel of a segment's program, a CPU segment as a whole, or a transfer."""

    kind: str  # "kernel" | "segment" | "transfer"
    segment: int  # the segment (for a transfer: the one that needed it)
    index: int  # the kernel's index in its program; -1 otherwise
    start_s: float
    dur_s: float
    tensor: str = ""  # a transfer's tensor
    launched_with: int | None = None


@dataclass
class _Stage:
    segment: Segment
    device: str  # NPU or CPU
    program: CompiledProgram | None = None
    executor: Any = None
    weights: WeightSet | None = None
    fallback: Any = None  # a CpuFallback (torch segments)

    @property
    def partition(self) -> Segment:
        return self.segment


class WeightPool:
    """Device buffers of weights made by recipes, shared between programs that keep a weight the same way (the
    same key, recipe, dtype, shape and layout on the same backend): the segments of one artifact, or an LLM's prefill
    and decode artifacts."""

    def __init__(self, source: Any) -> None:
        self.source = source if isinstance(source, TensorSource) else TensorSource(source if source is not None
                                                                                    else {})
        self._buffers: dict[tuple, DeviceBuffer] = {}
        self.report = WeightReport()

    @staticmethod
    def _key(backend: Backend, w) -> tuple:
        r = w.recipe
        return (backend.name, w.key, w.dtype, tuple(w.shape), tuple(w.layout), r.kind, tuple(sorted(r.sources.items())),
                repr(sorted(r.params.items())), tuple(r.fallback_keys))

    def load(self, program: CompiledProgram, backend: Backend, allow_nonfinite: bool = False) -> WeightSet:
        """The program's weights: those already made for another program reused, the rest read now."""
        have = {w.name: self._buffers[self._key(backend, w)] for w in program.weights
                if self._key(backend, w) in self._buffers}
        rest = [w.name for w in program.weights if w.name not in have]
        ws = load_weights(program, self.source, backend, names=rest, allow_nonfinite=allow_nonfinite) if rest else \
            WeightSet({}, WeightReport(), backend.name)
        self.report.merge(ws.report)
        for w in program.weights:
            if w.name in ws.buffers:
                self._buffers[self._key(backend, w)] = ws.buffers[w.name]
        ws.buffers.update(have)
        return ws


class DAGExecutor:
    """Run a partitioned artifact. `weights`: a state dict (NumPy or torch), a safetensors path/folder, a
    `TensorSource` or a `WeightPool` (shared with other executors). `bindings`: graph inputs bound to caller-owned
    device buffers of `backend` (an LLM's KV cache), as `Executor.bind_buffers`.

    Given a `PartitionPlan` instead, compiles it first: `compile_fn(sub_ir) -> CompiledProgram` for the target's
    partitions (default `npu_compiler.compile` for the backend's target with `dtype` and `compile_options`, the same
    for every partition); the CPU reference's partitions are compiled for 'cpu' with the same options."""

    def __init__(self, program: PartitionedProgram | PartitionPlan, backend: Backend,
                 compile_fn: CompileFn | None = None, weights: Any = None, *, dtype: str | None = None,
                 compile_options: Mapping[str, Any] | None = None, bindings: Mapping[str, DeviceBuffer] | None = None,
                 allow_nonfinite: bool = False) -> None:
        self.backend = backend
        self.fell_back: list[int] = []  # plan partitions for the target that run on the CPU (they did not compile)
        if isinstance(program, PartitionPlan):
            program = self._compile_plan(program, compile_fn, dtype, compile_options)
        self.program = program
        self.plan = program.plan()
        self.pool = weights if isinstance(weights, WeightPool) else WeightPool(weights)
        self._host_backend = backend if backend.name == "cpu" else None
        self._allow_nonfinite = allow_nonfinite
        self.stages: list[_Stage | None] = [self._build(s) if s.outputs else None for s in program.segments]
        self._graph_inputs = {t.name: t for t in program.inputs}
        self._made = {t.name: s.index for s in program.segments for t in s.outputs}
        self._out_specs = {s.index: {o.name: o for o in s.program.outputs} for s in program.segments
                           if s.program is not None}
        self.last_transfers: list[TransferRecord] = []
        self._bound: dict[str, DeviceBuffer] = {}
        self._writers: dict[str, _Writer] = {}
        self._device: dict[str, tuple[DeviceBuffer, TensorSpec]] = {}
        self._host: dict[str, np.ndarray] = {}
        self._given: dict[str, DeviceBuffer] = {}
        if bindings:
            self.bind_buffers(bindings)

    # ---- init ---------------------------------------------------------------------------------------------------
    def _compile_plan(self, plan: PartitionPlan, compile_fn: CompileFn | None, dtype: str | None,
                      compile_options: Mapping[str, Any] | None) -> PartitionedProgram:
        import npu_compiler  # a plan is compiled here; an artifact needs no compiler
        from npu_compiler.compile_artifact import compile_plan

        opts = {k: v for k, v in (compile_options or {}).items() if k != "dtype"}
        dtype = dtype if dtype is not None else (compile_options or {}).get("dtype")
        target = self.backend.compile_target()

        def fn(sub_ir: Mapping[str, Any], for_target: str) -> CompiledProgram:
            if compile_fn is not None and for_target == target:
                return compile_fn(sub_ir)
            return npu_compiler.compile(sub_ir, for_target, dtype=dtype, **opts)

        art = compile_plan(plan, target, dtype or "float32", fn)
        if dtype is None and art.programs:
            art.compute_dtype = art.programs[0].compute_dtype
        self.fell_back = [s.index for s, p in zip(art.segments, plan.partitions) if p.runner == TARGET != s.runner]
        return art

    @property
    def host_backend(self) -> Backend:
        if self._host_backend is None:
            from . import get_backend

            self._host_backend = get_backend("cpu")
        return self._host_backend

    def _build(self, seg: Segment) -> _Stage:
        if seg.runner == TORCH:
            from .fallback import CpuFallback, check_torch_ops, require_torch

            ops = [str(n["op_type"]) for n in seg.ir["nodes"]]
            require_torch(seg.name, [op for op in ops if "getitem" not in op] or ops)
            check_torch_ops(seg.ir, seg.name)
            return _Stage(seg, CPU, fallback=CpuFallback(seg.ir, self._torch_weights(seg), name=seg.name))
        be = self.backend if seg.runner == TARGET else self.host_backend
        program = seg.program
        ws = self.pool.load(program, be, self._allow_nonfinite) if program.weights else None
        executor = be.create_executor(program)
        if ws is not None:
            executor.bind_weights(ws)  # now, so that prepare() may build everything before the first run
        return _Stage(seg, NPU if seg.runner == TARGET else CPU, program, executor, ws)

    def _torch_weights(self, seg: Segment) -> dict[str, np.ndarray]:
        """The state-dict tensors a torch segment reads, in the dtypes its IR declares (the checkpoint rules of
        `weights.adapt`); a tied weight is read from the unused weight of its shape."""
        from npu_compiler.dtypes import FLOAT_DTYPES

        from .weights import adapt

        ir, src = seg.ir, self.pool.source
        mapping = ir.get("weight_name_mapping") or {}
        constants = ir.get("constants") or {}
        declared = {w["name"]: w for w in ir.get("weights") or []}
        out: dict[str, np.ndarray] = {}
        for nd in ir["nodes"]:
            for t in nd.get("inputs", []):
                ph = t["name"]
                key = mapping.get(ph, ph)
                if t.get("producer_node") is not None or key in out or key in constants or ph in constants:
                    continue
                used = key if key in src else next(
                    (k for k, w in declared.items() if k != key and list(w.get("shape", [])) == list(t["shape"])
                     and k in src), None)
                if used is None:
                    raise WeightError(f"{seg.name}: node '{nd['name']}' ({nd['op_type']}) reads weight '{key}' "
                                      f"(placeholder '{ph}', {t['dtype']}{list(t['shape'])}), which the weights do not "
                                      "hold")
                arr = src.get(used)
                if list(arr.shape) != list(t["shape"]):
                    raise WeightError(f"{seg.name}: weight {src.where(used)} is {list(arr.shape)}, node "
                                      f"'{nd['name']}' ({nd['op_type']}) reads it as {list(t['shape'])}")
                dt = str(t["dtype"])
                out[key] = adapt(arr, dt, f"weight {src.where(used)}", self.pool.report, self._allow_nonfinite) \
                    if dt in FLOAT_DTYPES or arr.dtype.name != dt else arr
        return out

    # ---- bindings (caller-owned device buffers) -----------------------------------------------------------------
    def bind_buffers(self, bindings: Mapping[str, DeviceBuffer]) -> None:
        """Make graph inputs read (and, where the artifact updates them in place, write) caller-owned buffers of the
        backend: bound in each target segment that reads them, read back by a host segment that does."""
        for name, buf in bindings.items():
            t = self._graph_inputs.get(name)
            if t is None:
                raise NPURuntimeError(f"cannot bind '{name}': not an input of the program")
            if tuple(buf.shape) != tuple(t.shape) or buf.dtype != t.device_dtype:
                raise NPURuntimeError(f"cannot bind '{name}': expected {t.device_dtype}{list(t.shape)}, got "
                                      f"{buf.dtype}{list(buf.shape)}")
            readers = [st for st in self.stages if st is not None and name in {i.name for i in st.segment.inputs}]
            written = [o.name for o in self.program.outputs if o.alias_of == name]
            if written and len(readers) > 1:
                raise NPURuntimeError(f"cannot bind '{name}': segments {[st.segment.index for st in readers]} read "
                                      "it and one updates it in place; give it as an input instead")
            for st in readers:
                if st.segment.runner == TARGET:
                    st.executor.bind_buffers({name: buf})
            for out in written:
                st = self.stages[self._made[out]] if self._made.get(out) is not None else None
                in_place = st is not None and st.device == NPU and \
                    self._out_specs[st.segment.index][out].alias_of == name
                if st is not None and not in_place:  # written elsewhere: copied into the caller's buffer after a run
                    self._writers[out] = _Writer(self.backend, t, buf)
            self._bound[name] = buf

    def bind_weights(self, weights: Any = None) -> None:
        """Weights are bound when the executor is made (each segment's from the one source); nothing to do."""

    def prepare(self) -> None:
        for st in self.stages:
            if st is not None and st.executor is not None:
                st.executor.prepare()

    # ---- run ----------------------------------------------------------------------------------------------------
    @property
    def num_transfers(self) -> int:
        """Transfers done by the last run (equals `plan.num_transfers` for a run of every segment)."""
        return len(self.last_transfers)

    def _check_inputs(self, inputs: Mapping[str, Any]) -> None:
        if not isinstance(inputs, Mapping):
            raise InputError(f"inputs must be a mapping from input name to array, got {type(inputs).__name__}")
        missing = [n for n in self._graph_inputs if n not in inputs and n not in self._bound]
        unexpected = [n for n in inputs if n not in self._graph_inputs]
        if missing or unexpected:
            want = ", ".join(f"'{t.name}' {t.dtype}{list(t.shape)}" for t in self.program.inputs)
            raise InputError(f"model '{self.program.model_name}': missing input(s) {missing}, unexpected "
                             f"{unexpected}; it takes {want}")
        for name, v in inputs.items():
            t = self._graph_inputs[name]
            shape = list(v.shape) if hasattr(v, "shape") else list(np.shape(v))
            if shape != list(t.shape):
                raise InputError(f"input '{name}': expected shape {list(t.shape)}, got {shape}")

    def launch(self, inputs: Mapping[str, Any], timings: list[StepTiming] | None = None,
               run_stage: Callable[[_Stage, dict[str, Any]], Mapping[str, Any]] | None = None) -> None:
        """Run every segment once; the outputs stay where they were made (`run` and `outputs` read them).
        `timings`: filled with one entry per kernel of the target's segments, per CPU segment and per transfer.
        `run_stage(stage, inputs)`: runs a program segment instead of its executor's `run` (per-node checks)."""
        self._check_inputs(inputs)
        self._host = {}
        self._given = {}  # inputs given as device buffers of the backend: read there by the target's segments
        for name, v in inputs.items():
            if isinstance(v, DeviceBuffer):
                self._given[name] = v
                continue
            arr = np.asarray(v) if isinstance(v, np.ndarray) else _host_array(v)
            want = self._graph_inputs[name].dtype
            self._host[name] = convert(arr, want) if dtype_name(arr.dtype) != want else arr
        self._device = {}
        self._uploads: dict[str, DeviceBuffer] = {}
        self.last_transfers = []
        clock = time.perf_counter
        for st in self.stages:
            if st is None:
                continue
            seg = st.segment
            ins = {t.name: self._operand(st, t.name, timings) for t in seg.inputs if t.name not in self._bound
                   or st.device == CPU}
            t0 = clock()
            if st.device == NPU:
                outs = run_stage(st, ins) if run_stage else self._run_program(st, ins, timings)
                specs = self._out_specs[seg.index]
                for t in seg.outputs:
                    self._device[t.name] = (outs[t.name], specs[t.name])
                continue
            if st.fallback is not None:
                from .fallback import to_numpy, to_torch

                got = {k: to_numpy(v) for k, v in st.fallback.run({k: to_torch(v) for k, v in ins.items()}).items()}
            else:
                outs = run_stage(st, ins) if run_stage else st.executor.run(ins, st.weights)
                specs = self._out_specs[seg.index]
                got = {t.name: outs[t.name].to_numpy(specs[t.name]) for t in seg.outputs}
            for t in seg.outputs:
                self._host[t.name] = got[t.name]
            if timings is not None:
                timings.append(StepTiming("segment", seg.index, -1, t0, clock() - t0))
        for out, writer in self._writers.items():  # updates made elsewhere, into the caller's (or staging) buffers
            writer.write(self._host[out] if out in self._host else self._device[out][0])

    def _run_program(self, st: _Stage, ins: dict[str, Any], timings: list[StepTiming] | None) -> Mapping[str, Any]:
        if timings is None:
            return st.executor.run(ins, st.weights)
        for k in st.executor.profile(ins, st.weights):
            timings.append(StepTiming("kernel", st.segment.index, k.index, k.start_s, k.dur_s,
                                      launched_with=k.launched_with))
        return st.executor.outputs()

    def _operand(self, st: _Stage, name: str, timings: list[StepTiming] | None) -> Any:
        """Tensor `name` where stage `st` reads it: moved there (once per run) when it was made on the other side."""
        if st.device == CPU:
            if name in self._host:
                return self._host[name]
            on_device = self._bound.get(name) or self._given.get(name)
            if on_device is not None:  # a graph input on the device, read on the host
                self._host[name] = convert(on_device.to_numpy(), self._graph_inputs[name].dtype)
                return self._host[name]
            buf, spec = self._device[name]
            return self._move(name, st, CPU, lambda: buf.to_numpy(spec), timings)
        if name in self._device:
            buf, spec = self._device[name]
            mine = next(s for s in st.program.inputs if s.name == name)
            return buf if buf.dtype == mine.device_dtype else buf.to_numpy(spec)
        if name in self._graph_inputs:  # bound like any program input: not a transfer
            return self._given[name] if name in self._given else self._host[name]
        if name not in self._uploads:
            spec = next(s for s in st.program.inputs if s.name == name)
            arr = self._host[name]
            self._uploads[name] = self._move(name, st, NPU, lambda: self.backend.upload(
                np.require(convert(arr, spec.device_dtype), requirements="C"), spec.device_dtype), timings)
        return self._uploads[name]

    def _move(self, name: str, st: _Stage, dst: str, fn: Callable[[], Any], timings: list[StepTiming] | None) -> Any:
        t0 = time.perf_counter()
        value = fn()
        if timings is not None:
            self.backend.synchronize()
            timings.append(StepTiming("transfer", st.segment.index, -1, t0, time.perf_counter() - t0, tensor=name))
        self.last_transfers.append(TransferRecord(name, CPU if dst == NPU else NPU, dst, st.segment.index))
        if dst == CPU:
            self._host[name] = value
        return value

    def run(self, inputs: Mapping[str, Any], weights: Any = None) -> dict[str, np.ndarray]:
        """Run once: graph inputs (NumPy arrays or torch tensors) by name -> graph outputs as NumPy arrays of the
        IR's dtypes (bf16 as ml_dtypes.bfloat16)."""
        self.launch(inputs)
        return self.host_outputs()

    run_numpy = run

    def host_outputs(self) -> dict[str, np.ndarray]:
        """The last run's graph outputs on the host, in the IR's dtypes."""
        result: dict[str, np.ndarray] = {}
        for t in self.program.outputs:
            if t.name in self._host:
                result[t.name] = np.array(self._host[t.name], copy=True)
            elif t.name in self._device:
                buf, spec = self._device[t.name]
                result[t.name] = buf.to_numpy(spec)
            elif t.name in self._bound or t.name in self._given:
                result[t.name] = convert((self._bound.get(t.name) or self._given[t.name]).to_numpy(), t.dtype)
            else:
                raise InputError(f"graph output '{t.name}' ({t.dtype}{list(t.shape)}) was not produced: segment "
                                 f"{self._made.get(t.name)} did not run")
        return result

    def host_value(self, name: str) -> np.ndarray:
        """A tensor the last run made on the host (a CPU segment's output or a graph input), as it was made."""
        return self._host[name]

    def outputs(self) -> dict[str, DeviceBuffer]:
        """The graph outputs as device buffers of the backend that every run overwrites (as `Executor.outputs`):
        a target segment's own output buffers, else a buffer the host's value is copied into after each run."""
        out = {}
        for t in self.program.outputs:
            seg = self._made.get(t.name)
            st = self.stages[seg] if seg is not None else None
            if st is not None and st.device == NPU:
                out[t.name] = st.executor.outputs()[t.name]
            elif t.alias_of in self._bound:
                out[t.name] = self._bound[t.alias_of]
            else:
                if t.name not in self._writers:
                    self._writers[t.name] = _Writer(self.backend, t, None)
                    if t.name in self._host:
                        self._writers[t.name].write(self._host[t.name])
                out[t.name] = self._writers[t.name].buffer
        return out

    def profile(self, inputs: Mapping[str, Any], weights: Any = None) -> list[StepTiming]:
        """Run once with a timer around every kernel of the target's segments (the backend's own profiler), every
        CPU segment and every transfer."""
        timings: list[StepTiming] = []
        self.launch(inputs, timings)
        return timings


class _Writer:
    """A device buffer that host values are copied into: the output of a one-kernel copy program whose input is
    `target` where given (then the copy lands in the caller's buffer itself)."""

    def __init__(self, backend: Backend, spec: TensorSpec, target: DeviceBuffer | None) -> None:
        self.spec = spec
        dtype = target.dtype if target is not None else spec.device_dtype
        self.dtype = dtype
        self.executor = backend.create_executor(_copy_program(backend.compile_target(), tuple(spec.shape), dtype),
                                                **({"bindings": {"x": target}} if target is not None else {}))
        self.buffer = target if target is not None else self.executor.outputs()["y"]

    def write(self, value: np.ndarray | DeviceBuffer) -> None:
        """Copy a host array (converted to the buffer's dtype) or a device buffer of the backend into the buffer."""
        if isinstance(value, DeviceBuffer):
            self.executor.run({"x": value})
        else:
            self.executor.run({"x": np.require(convert(np.asarray(value), self.dtype), requirements="C")})


def _copy_program(target: str, shape: tuple[int, ...], dtype: str) -> CompiledProgram:
    from npu_compiler.expr import nodes as X
    from npu_compiler.kernels import GeneratedKernel
    from npu_compiler.program import BufferSpec, KernelCall, full_ref
    from npu_compiler.tensor import contiguous_strides

    n = int(np.prod(shape, dtype=np.int64))
    bufs = [BufferSpec(0, "x", "input", dtype, n), BufferSpec(1, "y", "output", dtype, n)]
    k = KernelCall("copy", GeneratedKernel(X.Load(dtype, 0, contiguous_strides(shape))), [full_ref(bufs[0], shape)],
                   [full_ref(bufs[1], shape)], ["copy"], "copy")
    k.spec.check(k, bufs)
    return CompiledProgram("host_to_device", target, dtype, {}, [TensorSpec("x", shape, dtype, dtype, 0)],
                           [TensorSpec("y", shape, dtype, dtype, 1)], [], bufs, [k], 0)


def _host_array(v: Any) -> np.ndarray:
    if hasattr(v, "detach"):  # a torch tensor
        from .fallback import to_numpy

        return to_numpy(v)
    return np.asarray(v)
