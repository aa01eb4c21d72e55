"""Runs a CompiledProgram (target 'webgpu') on the process's wgpu device.

`__init__` does the expensive work: rendering every kernel's WGSL from its record for this device, creating every
compute pipeline (shader modules are shared by source text across executors), one arena buffer for the
intermediates, buffers for inputs, outputs and constants. Bind groups are made once the weights are bound (and again
only when a binding changes). `run()` writes the inputs and records the program's dispatches into compute passes of
8, 16, 32, ... kernels, submitting each as it is recorded, so the device runs the first while the host records
the next.

int64 values compute in int32 on this backend (WGSL has no 64-bit integers): data is range-checked as it reaches the
device, and kernels whose integer arithmetic could leave int32 record it in a status word, checked after the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from npu_compiler.errors import NPUCompileError
from npu_compiler.program import CompiledProgram, TensorRef, TensorSpec
from npu_compiler.targets.webgpu import DeviceCaps, Dispatch, WebGPUTarget

from ..backend import DeviceBuffer
from ..dtypes import np_dtype
from ..errors import InputError, NPURuntimeError
from ..executor import Executor, allocation_guard
from ..profiling import KernelTiming
from ..weights import WeightSet
from .backend import WebGPUBackend, WebGPUBuffer, check_int32, read_bytes, write_bytes

STATUS_CLEAR = np.array([0xFFFFFFFF], np.uint32)
# A run is recorded in submissions of 8, 16, 32, ... kernels (0: one submission): the device starts on the first ones
# while the host records the rest, each recorded in less time than the device takes for those before it.
SUBMIT_FIRST = 8


class WebGPUExecutor(Executor):
    buffer_type = WebGPUBuffer

    def __init__(self, program: CompiledProgram, backend: WebGPUBackend,
                 bindings: Mapping[str, DeviceBuffer] | None = None) -> None:
        super().__init__(program, backend)  # (which refuses a program of another target)
        self.state = backend.state
        self.caps = DeviceCaps(max_binding_bytes=self.state.max_binding,
                               max_bindings=int(self.state.limits["max-storage-buffers-per-shader-stage"]),
                               f16_native=self.state.f16_native,
                               max_workgroup_storage=int(self.state.limits["max-compute-workgroup-storage-size"]),
                               division=self.state.division, products=self.state.products,
                               packed_dot=self.state.packed_dot,
                               subgroup_min_size=self.state.subgroup_min_size)
        try:
            # sized for the device the program was planned for (the adapter's limits from its caps), else this one
            device = program.device or self.state.profile
            self.rendered = WebGPUTarget(device, caps=self.caps).render_program(program)
        except NPUCompileError as e:
            raise NPURuntimeError(f"cannot render program '{program.model_name}' for webgpu: {e}") from e
        align = int(self.state.limits["min-storage-buffer-offset-alignment"])
        for b in program.buffers:
            if b.kind == "arena" and b.numel and b.offset % align:
                raise NPURuntimeError(f"buffer {b.name}: arena offset {b.offset} is not a multiple of {align} bytes "
                                      "(not an artifact the compiler writes)")
        # pipelines: one per distinct source, with the layout its bindings declare
        self._pipelines: dict[str, tuple[Any, Any]] = {}
        for steps in self.rendered.steps:
            for d in steps:
                if d.source not in self._pipelines:
                    self._pipelines[d.source] = self._pipeline(d)
        with allocation_guard(program):
            self.arena = backend.create_buffer(program.arena_bytes, f"the arena of '{program.model_name}'")
            self._own: dict[int, WebGPUBuffer] = {}
            for b in program.buffers:
                if b.kind in ("input", "output"):
                    self._own[b.id] = backend.allocate((b.numel,), b.dtype)
                elif b.kind == "constant":
                    host = np.frombuffer(b.data or b"", dtype=np_dtype(b.dtype))
                    check_int32(host, f"constant {b.name}")
                    self._own[b.id] = backend.upload(host, b.dtype)
        self._status = None
        if any(d.uses_status for steps in self.rendered.steps for d in steps):
            self._status = backend.create_buffer(4, "the status word")
        self._zero = None
        if any(b.ptr[0] == "zero" for steps in self.rendered.steps for d in steps for b in d.bindings):
            self._zero = backend.create_buffer(4, "the zero word")  # new buffers hold zeros
        self._where: dict[int, tuple[Any, int]] = {}  # buffer id -> (wgpu buffer, byte offset)
        for b in program.buffers:
            if b.kind == "arena":
                self._where[b.id] = (self.arena, max(b.offset, 0))
            elif b.id in self._own:
                self._where[b.id] = (self._own[b.id].buffer, 0)
        self._weights: WeightSet | None = None
        self._weights_bound: int | None = None
        self._bound: dict[str, WebGPUBuffer] = {}
        self._groups: list[list[tuple[Any, Any, tuple[int, int, int]]]] | None = None
        self._raw: tuple[Any, list] | None = None
        if bindings:
            self.bind_buffers(bindings)

    def _pipeline(self, d: Dispatch) -> tuple[Any, Any]:
        wgpu, device = self.state.wgpu, self.state.device
        entries = [{"binding": b.slot, "visibility": wgpu.ShaderStage.COMPUTE,
                    "buffer": {"type": "read-only-storage" if b.read_only else "storage"}} for b in d.bindings]
        try:
            layout = device.create_bind_group_layout(entries=entries)
            pipe = device.create_compute_pipeline(
                layout=device.create_pipeline_layout(bind_group_layouts=[layout]),
                compute={"module": self.state.module(self.rendered.sources[d.source]), "entry_point": "npu_kernel"})
        except Exception as e:  # noqa: BLE001  (wgpu's validation errors: a renderer bug, reported with the source)
            raise NPURuntimeError(f"webgpu: the device refused source {d.source} of '{self.program.model_name}': "
                                  f"{e}") from e
        return pipe, layout

    # ---- binding ------------------------------------------------------------------------------------------------
    def bind_buffers(self, bindings: Mapping[str, DeviceBuffer]) -> None:
        """Make inputs (by name) read and write caller-owned device buffers directly (a KV cache shared by the
        prefill and decode programs): no copy per run, and in-place updates land in the caller's buffer."""
        specs = self._check_bindings(self._bound, bindings)
        for name, buf in bindings.items():
            self._bound[name] = buf
            self._where[specs[name].buffer] = (buf.buffer, buf.offset)
        self._groups = None
        self._forget_outputs()

    def bind_weights(self, weights: WeightSet) -> None:
        for bid, buf in self._weight_buffers(weights):
            self._where[bid] = (buf.buffer, buf.offset)
        self._weights = weights  # keep the buffers alive as long as bind groups name them
        self._weights_bound = id(weights)
        self._groups = None

    def _build(self) -> None:
        """Every dispatch's bind group (the buffers are fixed until a binding changes)."""
        device = self.state.device
        groups = []
        for k, steps in zip(self.program.kernels, self.rendered.steps):
            per = []
            for d in steps:
                if not all(d.grid):
                    continue  # nothing to compute (an empty tensor)
                pipe, layout = self._pipelines[d.source]
                entries = []
                for b in d.bindings:
                    if b.ptr[0] == "status":
                        buf, base = self._status, 0
                    elif b.ptr[0] == "zero":
                        buf, base = self._zero, 0
                    else:
                        ref = (k.writes if b.ptr[0] == "out" else k.args)[b.ptr[1]]
                        buf, base = self._where[ref.buffer]
                    size = min(b.size, buf.size - base - b.offset)
                    entries.append({"binding": b.slot, "resource": {"buffer": buf, "offset": base + b.offset,
                                                                    "size": size}})
                try:
                    group = device.create_bind_group(layout=layout, entries=entries)
                except Exception as e:  # noqa: BLE001
                    raise NPURuntimeError(f"kernel {k.name}: cannot bind its buffers: {e}") from e
                per.append((pipe, group, d.grid))
            groups.append(per)
        self._groups = groups
        self._raw = _raw_calls(groups)

    # ---- run ----------------------------------------------------------------------------------------------------
    def input_buffer(self, name: str) -> WebGPUBuffer:
        spec = self._input_specs[name]
        return self._bound.get(name) or self._own[spec.buffer]

    def _prepare(self, inputs: Mapping[str, Any], weights: WeightSet | None, encoder: Any) -> None:
        self._check_run(inputs, weights, self._bound)
        for name, value in inputs.items():
            self._copy_input(self._input_specs[name], value, encoder)
        if self._groups is None:
            self._build()
        if self._status is not None:
            write_bytes(self.state, self._status, 0, STATUS_CLEAR)

    def _copy_input(self, spec: TensorSpec, value: Any, encoder: Any) -> None:
        dst = self.input_buffer(spec.name)
        if isinstance(value, WebGPUBuffer) and value.dtype == spec.device_dtype:
            if (value.buffer is not dst.buffer or value.offset != dst.offset) and dst.nbytes:
                n = -(-dst.nbytes // 4) * 4
                encoder.copy_buffer_to_buffer(value.buffer, value.offset, dst.buffer, dst.offset, n)
            return
        host = np.require(self.host_input(value, spec), requirements="C")
        if spec.value_range is not None and host.size:
            lo, hi = spec.value_range
            if host.min() < lo or host.max() >= hi:
                bad = host[(host < lo) | (host >= hi)].flat[0]
                raise InputError(f"input '{spec.name}': value {int(bad)} out of range [{lo}, {hi})")
        check_int32(host, f"input '{spec.name}'")
        write_bytes(self.state, dst.buffer, dst.offset, host)

    def _record(self, pass_: Any, index: int) -> None:
        if self._raw is not None:
            lib, handles = self._raw
            p = pass_._internal
            for pipe, group, x, y, z in handles[index]:
                lib.wgpuComputePassEncoderSetPipeline(p, pipe)
                lib.wgpuComputePassEncoderSetBindGroup(p, 0, group, 0, _NULL)
                lib.wgpuComputePassEncoderDispatchWorkgroups(p, x, y, z)
            return
        for pipe, group, grid in self._groups[index]:
            pass_.set_pipeline(pipe)
            pass_.set_bind_group(0, group)
            pass_.dispatch_workgroups(*grid)

    def run(self, inputs: Mapping[str, Any], weights: WeightSet | None = None) -> dict[str, DeviceBuffer]:
        device = self.state.device
        encoder = device.create_command_encoder()
        self._prepare(inputs, weights, encoder)
        n = len(self.program.kernels)
        start, size = 0, SUBMIT_FIRST or n
        while True:
            pass_ = encoder.begin_compute_pass()
            for i in range(start, min(start + size, n)):
                self._record(pass_, i)
            pass_.end()
            device.queue.submit([encoder.finish()])
            start, size = start + size, size * 2
            if start >= n:
                break
            encoder = device.create_command_encoder()
        self._check_status()
        return self.outputs()

    def _check_status(self) -> None:
        if self._status is None:
            return
        word = int(np.frombuffer(read_bytes(self.state, self._status, 0, 4), np.uint32)[0])
        if word != 0xFFFFFFFF:
            k = self.program.kernels[word] if word < len(self.program.kernels) else None
            where = f"kernel {k.name} ({k.group}, nodes {', '.join(k.nodes[:4])})" if k else f"kernel #{word}"
            raise NPURuntimeError(f"{where}: an int64 value left the int32 range the webgpu backend computes integers "
                                  "in (WGSL has no 64-bit integers); run this model on the cpu or cuda backend")

    def _output_view(self, spec: TensorSpec) -> WebGPUBuffer:
        aliased = spec.alias_of is not None and spec.alias_of in self._input_specs
        buf = self.input_buffer(spec.alias_of) if aliased else self._own[spec.buffer]
        return WebGPUBuffer(buf.buffer, spec.shape, spec.device_dtype, self.state, buf.offset)

    # ---- profiling and inspection ----------------------------------------------------------------------------
    @property
    def profile_method(self) -> str:
        if "timestamp-query" in self.state.features:
            return "GPU timestamps around each kernel's compute pass"
        return ("host timer around each kernel submitted and waited for alone (the adapter has no timestamp "
                "queries): the times include submission and synchronisation")

    def profile(self, inputs: Mapping[str, Any], weights: WeightSet | None = None) -> list[KernelTiming]:
        """One run, every kernel in a compute pass of its own. With timestamp queries (most adapters) the GPU
        writes a timestamp at the start and end of each pass, all in one submission; without them each kernel is
        submitted alone and timed on the host, waiting for it (slower, and the time includes the submission)."""
        device = self.state.device
        n = len(self.program.kernels)
        if "timestamp-query" not in self.state.features:
            return self._profile_host(inputs, weights)
        wgpu = self.state.wgpu
        encoder = device.create_command_encoder()
        self._prepare(inputs, weights, encoder)
        qs = device.create_query_set(type="timestamp", count=max(2 * n, 2))
        for i in range(n):
            pass_ = encoder.begin_compute_pass(timestamp_writes={
                "query_set": qs, "beginning_of_pass_write_index": 2 * i, "end_of_pass_write_index": 2 * i + 1})
            self._record(pass_, i)
            pass_.end()
        resolved = device.create_buffer(size=max(16 * n, 16),
                                        usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        if n:
            encoder.resolve_query_set(qs, 0, 2 * n, resolved, 0)
        device.queue.submit([encoder.finish()])
        self._check_status()
        ticks = np.frombuffer(read_bytes(self.state, resolved, 0, 16 * n), np.uint64).astype(np.float64)
        ns = ticks * self.state.timestamp_period
        t0 = ns[0] if n else 0.0
        return [KernelTiming(i, (ns[2 * i] - t0) * 1e-9, max(ns[2 * i + 1] - ns[2 * i], 0.0) * 1e-9)
                for i in range(n)]

    def _profile_host(self, inputs: Mapping[str, Any], weights: WeightSet | None) -> list[KernelTiming]:
        timings = []
        self.run_observed(inputs, weights, before=lambda i: timings.append(time.perf_counter()),
                          after=lambda i: timings.append(time.perf_counter()))
        return [KernelTiming(i, timings[2 * i], timings[2 * i + 1] - timings[2 * i])
                for i in range(len(self.program.kernels))]

    def run_observed(self, inputs: Mapping[str, Any], weights: WeightSet | None = None,
                     before: Callable[[int], None] | None = None, after: Callable[[int], None] | None = None) -> None:
        """Run kernel by kernel, each submitted alone and waited for, calling `before(i)` / `after(i)` around kernel
        i (per-node verify reads the buffers there with `view()`: the arena is reused, so a later kernel overwrites
        them)."""
        device = self.state.device
        encoder = device.create_command_encoder()
        self._prepare(inputs, weights, encoder)
        device.queue.submit([encoder.finish()])
        for i in range(len(self.program.kernels)):
            if before:
                before(i)
            encoder = device.create_command_encoder()
            pass_ = encoder.begin_compute_pass()
            self._record(pass_, i)
            pass_.end()
            device.queue.submit([encoder.finish()])
            self.state.wait()
            if after:
                after(i)
        self._check_status()

    def buffer_bytes(self, bid: int) -> np.ndarray:
        """A host copy of a whole buffer of the program, in its dtype."""
        b = self.program.buffers[bid]
        if bid not in self._where:
            raise NPURuntimeError(f"buffer {b.name} is not bound (bind the weights first)")
        buf, base = self._where[bid]
        return np.frombuffer(read_bytes(self.state, buf, base, b.nbytes), dtype=np_dtype(b.dtype)).copy()

    @property
    def flat(self) -> Mapping[int, np.ndarray]:
        """Every buffer of the program by id, read from the device when asked for (what `inspect` reads)."""
        return _Flat(self)

    def view(self, ref: TensorRef) -> np.ndarray:
        """A host copy of a tensor view, as it is on the device now."""
        flat = self.buffer_bytes(ref.buffer)
        if any(n == 0 for n in ref.shape):
            return np.zeros(ref.shape, flat.dtype)
        item = flat.itemsize
        return as_strided(flat[ref.offset:], shape=ref.shape, strides=tuple(s * item for s in ref.strides),
                          writeable=False)

    def poison(self, byte: int = 0xFF) -> None:
        """Fill the arena and the output buffers with a byte pattern (0xFF: NaN for floats, -1 for integers), so that
        a test can see an element no kernel wrote."""
        fill = np.full(self.arena.size, byte, np.uint8)
        write_bytes(self.state, self.arena, 0, fill)
        for b in self.program.buffers:
            if b.kind == "output" and b.nbytes:
                own = self._own[b.id]
                write_bytes(self.state, own.buffer, 0, np.full(own.buffer.size, byte, np.uint8))
        self.state.wait()


_NULL = None


def _raw_calls(groups: list) -> tuple[Any, list] | None:
    """The dispatches as wgpu-native handles, for recording them with direct C calls. wgpu-py wraps every call in
    error-scope bookkeeping (about 17 us per dispatch measured, 6 ms for a 340-kernel decode step); the pipelines
    and bind groups were validated when they were made, so recording needs none of it. None (the public API is used)
    where this wgpu build lays its objects out otherwise."""
    global _NULL
    try:
        from wgpu.backends.wgpu_native._ffi import ffi, lib  # noqa: PLC0415

        _NULL = ffi.NULL
        handles = [[(pipe._internal, group._internal, *grid) for pipe, group, grid in per] for per in groups]
        for name in ("wgpuComputePassEncoderSetPipeline", "wgpuComputePassEncoderSetBindGroup",
                     "wgpuComputePassEncoderDispatchWorkgroups"):
            getattr(lib, name)
    except (ImportError, AttributeError):
        return None
    return lib, handles


class _Flat(Mapping):
    def __init__(self, ex: WebGPUExecutor) -> None:
        self._ex = ex

    def __getitem__(self, bid: int) -> np.ndarray:
        return self._ex.buffer_bytes(bid)

    def __iter__(self):
        return iter(range(len(self._ex.program.buffers)))

    def __len__(self) -> int:
        return len(self._ex.program.buffers)


__all__ = ["WebGPUExecutor"]
