"""Runs a CompiledProgram with NumPy: buffers resolved to strided views once, then one closure per kernel, built
from the kernel's record by its reference semantics (no source text is read or executed)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from npu_compiler.errors import ArtifactError, KernelFault
from npu_compiler.limits import Limits
from npu_compiler.memory_check import check_sizes
from npu_compiler.program import CompiledProgram, KernelCall, TensorRef, TensorSpec

from ..backend import DeviceBuffer
from ..dtypes import np_dtype
from ..errors import NPURuntimeError
from ..executor import Executor, allocation_guard
from ..profiling import KernelTiming
from ..weights import WeightSet
from .backend import CpuBackend, CpuBuffer


class CpuExecutor(Executor):
    buffer_type = CpuBuffer

    def __init__(self, program: CompiledProgram, backend: CpuBackend, bindings: Mapping[str, DeviceBuffer] | None = None
                 ) -> None:
        super().__init__(program, backend)  # (which refuses a program of another target)
        try:  # NumPy evaluates an expression kernel over its whole iteration space: bound it before allocating
            check_sizes(program.buffers, program.kernels, Limits().max_bytes, iteration_space=True)
        except ValueError as e:
            raise ArtifactError(f"program '{program.model_name}': {e}") from None
        with allocation_guard(program):
            self.arena = np.zeros(program.arena_bytes, np.uint8)
            self.flat: dict[int, np.ndarray] = {}
            for b in program.buffers:
                dt = np_dtype(b.dtype)
                if b.kind == "arena":
                    self.flat[b.id] = self.arena[b.offset:b.offset + b.nbytes].view(dt) if b.numel else \
                        np.zeros(0, dt)
                elif b.kind in ("input", "output"):
                    self.flat[b.id] = np.zeros(b.numel, dt)
                elif b.kind == "constant":
                    self.flat[b.id] = np.frombuffer(b.data, dtype=dt).copy()
        self._weights_bound: int | None = None
        self._steps: list[Callable[[], None]] = []
        # Inputs bound to caller-owned buffers (shared KV cache, shared weights): no copy per run.
        self._bound_inputs: dict[str, DeviceBuffer] = {}
        if bindings:
            self.bind_buffers(bindings)

    # ---- binding --------------------------------------------------------------------------------------------------
    def bind_buffers(self, bindings: Mapping[str, DeviceBuffer]) -> None:
        """Make inputs (by input name) read and write caller-owned buffers directly."""
        specs = self._check_bindings(self._bound_inputs, bindings)
        for name, buf in bindings.items():
            self.flat[specs[name].buffer] = buf.native_handle.reshape(-1)
            self._bound_inputs[name] = buf
        self._steps = []
        self._forget_outputs()

    def bind_weights(self, weights: WeightSet) -> None:
        for bid, buf in self._weight_buffers(weights):
            self.flat[bid] = buf.native_handle.reshape(-1)
        self._weights_bound = id(weights)
        self._steps = []

    # ---- views (the `Arrays` the kernels' reference semantics read) -------------------------------------------------
    def view(self, ref: TensorRef) -> np.ndarray:
        flat = self.flat[ref.buffer]
        item = flat.itemsize
        if any(n == 0 for n in ref.shape):
            return np.zeros(ref.shape, flat.dtype)
        return as_strided(flat[ref.offset:], shape=ref.shape, strides=tuple(s * item for s in ref.strides),
                          writeable=True)

    def buffer(self, ref: TensorRef) -> np.ndarray:
        return self.flat[ref.buffer]

    def _build(self) -> None:
        self._steps = [self._step(k) for k in self.program.kernels]

    def _step(self, k: KernelCall) -> Callable[[], None]:
        run = k.spec.reference(k, self)
        where = f"kernel {k.name} ({k.group}, nodes {', '.join(k.nodes[:4])})"

        def step() -> None:
            try:
                run()
            except KernelFault as e:
                raise NPURuntimeError(f"{where}: {e}") from None

        return step

    # ---- run --------------------------------------------------------------------------------------------------------
    def run(self, inputs: Mapping[str, Any], weights: WeightSet | None = None) -> dict[str, DeviceBuffer]:
        self._prepare(inputs, weights)
        with np.errstate(all="ignore"):
            for step in self._steps:
                step()
        return self.outputs()

    def run_observed(self, inputs: Mapping[str, Any], weights: WeightSet | None = None,
                     before: Callable[[int], None] | None = None, after: Callable[[int], None] | None = None) -> None:
        """Run kernel by kernel, calling `before(i)` / `after(i)` around kernel i (per-node verify reads the
        buffers there with `view()`, since the arena is reused and a later kernel overwrites them)."""
        self._prepare(inputs, weights)
        with np.errstate(all="ignore"):
            for i, step in enumerate(self._steps):
                if before:
                    before(i)
                step()
                if after:
                    after(i)

    def profile(self, inputs: Mapping[str, Any], weights: WeightSet | None = None) -> list[KernelTiming]:
        """One run with a host timer around every kernel (the NumPy kernels are synchronous)."""
        self._prepare(inputs, weights)
        clock = time.perf_counter
        timings: list[KernelTiming] = []
        with np.errstate(all="ignore"):
            for i, step in enumerate(self._steps):
                t0 = clock()
                step()
                timings.append(KernelTiming(i, t0, clock() - t0))
        return timings

    def _prepare(self, inputs: Mapping[str, Any], weights: WeightSet | None) -> None:
        self._check_run(inputs, weights, self._bound_inputs)
        for name, value in inputs.items():
            spec = self._input_specs[name]
            np.copyto(self.flat[spec.buffer].reshape(spec.shape), self.host_input(value, spec))
        if not self._steps:
            self._build()

    def _output_view(self, spec: TensorSpec) -> CpuBuffer:
        return CpuBuffer(self.flat[spec.buffer].reshape(spec.shape), spec.device_dtype)

    def prepare(self) -> None:
        """Build every kernel's closure now (it happens on the first run otherwise)."""
        if not self._steps:
            self._build()


