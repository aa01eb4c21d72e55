"""Runs a CompiledProgram with NumPy: buffers resolved to strided views once, then one closure per kernel."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from npu_compiler.expr import nodes as X
from npu_compiler.program import CompiledProgram, KernelCall, TensorRef

from ..backend import DeviceBuffer
from ..dtypes import np_dtype
from ..errors import NPURuntimeError, WeightError
from ..executor import Executor
from ..profiling import KernelTiming
from ..weights import WeightSet
from .backend import CpuBackend, CpuBuffer
from .generated import compile_source
from .kernels import LIBRARY


class CpuExecutor(Executor):
    def __init__(self, program: CompiledProgram, backend: CpuBackend, bindings: Mapping[str, DeviceBuffer] | None = None
                 ) -> None:
        super().__init__(program, backend)
        if program.target not in ("cpu",):
            raise NPURuntimeError(f"program was compiled for target '{program.target}'; the cpu backend runs "
                                  "programs compiled for target 'cpu'")
        self.arena = np.zeros(program.arena_bytes, np.uint8)
        self.flat: dict[int, np.ndarray] = {}
        for b in program.buffers:
            dt = np_dtype(b.dtype)
            if b.kind == "arena":
                self.flat[b.id] = self.arena[b.offset:b.offset + b.nbytes].view(dt)
            elif b.kind in ("input", "output"):
                self.flat[b.id] = np.zeros(b.numel, dt)
            elif b.kind == "constant":
                self.flat[b.id] = np.frombuffer(b.data, dtype=dt).copy()
        self._weights_bound: int | None = None
        self._sources = {name: compile_source(text) for name, text in program.sources.items()}
        self._steps: list[Callable[[], None]] = []
        self._weight_ids = {w.name: w.buffer for w in program.weights}
        # Inputs bound to caller-owned buffers (shared KV cache, shared weights): no copy per run.
        self._bound_inputs: set[str] = set()
        if bindings:
            self.bind_buffers(bindings)

    # ---- binding --------------------------------------------------------------------------------------------------
    def bind_buffers(self, bindings: Mapping[str, DeviceBuffer]) -> None:
        """Make inputs (by input name) read and write caller-owned buffers directly."""
        by_name = {s.name: s for s in self.program.inputs}
        for name, buf in bindings.items():
            spec = by_name.get(name)
            if spec is None:
                raise NPURuntimeError(f"cannot bind '{name}': not an input of the program")
            arr = buf.native_handle
            if tuple(arr.shape) != tuple(spec.shape) or arr.dtype != np_dtype(spec.device_dtype):
                raise NPURuntimeError(f"cannot bind '{name}': expected {spec.device_dtype}{list(spec.shape)}, got "
                                      f"{buf.dtype}{list(arr.shape)}")
            self.flat[spec.buffer] = arr.reshape(-1)
            self._bound_inputs.add(name)
        self._steps = []

    def bind_weights(self, weights: WeightSet) -> None:
        missing = [n for n in self._weight_ids if n not in weights.buffers]
        if missing:
            raise WeightError(f"weight set lacks {len(missing)} weight(s) of the program: {', '.join(missing[:8])}")
        for name, bid in self._weight_ids.items():
            self.flat[bid] = weights.buffers[name].native_handle.reshape(-1)
        self._weights_bound = id(weights)
        self._steps = []

    # ---- views ------------------------------------------------------------------------------------------------------
    def view(self, ref: TensorRef) -> np.ndarray:
        flat = self.flat[ref.buffer]
        item = flat.itemsize
        return as_strided(flat[ref.offset:], shape=ref.shape, strides=tuple(s * item for s in ref.strides),
                          writeable=True)

    def _build(self) -> None:
        self._steps = [self._step(k) for k in self.program.kernels]

    def _step(self, k: KernelCall) -> Callable[[], None]:
        outs = [self.view(o) for o in k.outs]
        ctx = f"kernel {k.name} ({k.group}, nodes {', '.join(k.nodes[:4])})"
        if k.kind == "generated":
            fn = self._sources[k.source]
            expr = X.from_data(k.expr)
            out_shape = k.outs[0].shape
            loads = []
            for ld in X.loads(expr):
                flat = self.flat[k.args[ld.arg].buffer]
                shape = tuple(out_shape) + (tuple(k.reduce_shape) if ld.rstrides else ())
                strides = tuple(s * flat.itemsize for s in (*ld.strides, *ld.rstrides))
                loads.append(as_strided(flat[ld.offset:], shape=shape, strides=strides, writeable=False))
            index = [np.arange(n, dtype=np.int64).reshape((1,) * i + (n,) + (1,) * (len(out_shape) - i - 1))
                     for i, n in enumerate(out_shape)]
            out = outs[0]

            def run_generated(fn=fn, loads=loads, index=index, out=out) -> None:
                fn(loads, index, out)

            return run_generated
        lib = LIBRARY.get(k.kind)
        if lib is None:
            raise NPURuntimeError(f"{ctx}: the cpu backend has no library kernel '{k.kind}'")
        args = [self.view(a) for a in k.args]

        def run_library(lib=lib, args=args, outs=outs, p=k.params) -> None:
            lib(args, outs, p, ctx)

        return run_library

    # ---- run --------------------------------------------------------------------------------------------------------
    def run(self, inputs: Mapping[str, Any], weights: WeightSet | None = None) -> dict[str, DeviceBuffer]:
        self._prepare(inputs, weights)
        with np.errstate(all="ignore"):
            for step in self._steps:
                step()
        return self._outputs()

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
        bound = {n for n in self._bound_inputs if n not in inputs}
        self.check_inputs({**inputs, **{n: _Shape(self._input_specs[n]) for n in bound}})
        if weights is not None and id(weights) != self._weights_bound:
            self.bind_weights(weights)
        if self._weights_bound is None and self.program.weights:
            raise WeightError("no weights bound: pass weights=load_weights(...) to run()")
        for name, value in inputs.items():
            spec = self._input_specs[name]
            np.copyto(self.flat[spec.buffer].reshape(spec.shape), self.host_input(value, spec))
        if not self._steps:
            self._build()

    def _outputs(self) -> dict[str, DeviceBuffer]:
        return {s.name: CpuBuffer(self.flat[s.buffer].reshape(s.shape), s.device_dtype) for s in self.program.outputs}


class _Shape:
    """Stands for a bound input in the input check (its buffer is checked at bind time)."""

    def __init__(self, spec) -> None:
        self.shape = spec.shape
        self.dtype = spec.device_dtype


