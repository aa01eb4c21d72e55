"""Runs a CompiledProgram (target 'cuda') on one GPU.

`__init__` does the expensive work: rendering every kernel's CUDA C from its record (an artifact carries no source),
NVRTC builds (disk-cached by source hash) of every source, one arena for the intermediates,
device buffers for inputs, outputs and constants. Once weights are bound, every kernel becomes a launch with its
pointers resolved and its configuration fixed; the first run captures them as one CUDA graph. `run()` then only
copies the inputs and launches the graph, all on the backend's one stream.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from npu_compiler.devices import render_device
from npu_compiler.dtypes import itemsize
from npu_compiler.errors import NPUCompileError
from npu_compiler.program import CompiledProgram, TensorSpec
from npu_compiler.targets.cuda.target import CudaTarget, SourceLaunch

from ..backend import DeviceBuffer
from ..errors import InputError, NPURuntimeError, WeightError
from ..executor import Executor, allocation_guard
from ..profiling import KernelTiming
from ..weights import WeightSet
from .backend import CudaBackend, CudaBuffer, storage_dtype
from .cublaslt import LtGemm
from .launch import pdl_launcher
from .modules import load_kernels
from .tensor_maps import encode_all

# the longest the device-time probe holds the stream while it queues its runs (beyond a few hundred runs, later runs
# are queued while earlier ones run: still the GPU's time, as the host queues a graph faster than it runs)
SPIN_CAP_NS = 20_000_000
STATIC_SMEM = 48 * 1024  # the dynamic shared memory a launch may ask for without opting in
LT_ALIGN = 16  # bytes: a bias vector cuBLASLt's epilogue reads (else the plain path: fill, then beta = 1)
BIND_ALIGN = 16  # bytes: a bound buffer's device address, as the arena's buffers and CuPy's allocations are


class CudaExecutor(Executor):
    buffer_type = CudaBuffer

    def __init__(self, program: CompiledProgram, backend: CudaBackend,
                 bindings: Mapping[str, DeviceBuffer] | None = None, *, use_graph: bool = True) -> None:
        import cupy  # noqa: PLC0415

        super().__init__(program, backend)  # (which refuses a program of another target)
        self._cp = cupy
        self.state = backend.state
        self.stream = self.state.stream
        self.use_graph = use_graph
        self.device = render_device(program.device, self.state.profile)
        try:
            self.rendered = CudaTarget(self.device).render_program(program)
        except NPUCompileError as e:
            raise NPURuntimeError(f"cannot render program '{program.model_name}' for cuda: {e}") from e
        with self.state.device, allocation_guard(program):
            self.kernels, self._modules = load_kernels(self.rendered.sources, self.state.arch)
            self.arena = cupy.empty(max(program.arena_bytes, 1), dtype=np.uint8)
            self._own: dict[int, CudaBuffer] = {}
            for b in program.buffers:
                if b.kind in ("input", "output"):
                    self._own[b.id] = backend.allocate((b.numel,), b.dtype)
                elif b.kind == "constant":
                    host = np.frombuffer(b.data or b"", dtype=storage_dtype(b.dtype))
                    buf = backend.allocate((b.numel,), b.dtype)
                    if host.nbytes:
                        buf.array.set(host, stream=self.stream)
                    self._own[b.id] = buf
        self._ptr: dict[int, int] = {}
        base = int(self.arena.data.ptr)
        for b in program.buffers:
            if b.kind == "arena":
                self._ptr[b.id] = base + max(b.offset, 0)
            elif b.id in self._own:
                self._ptr[b.id] = self._own[b.id].ptr
        self._weights_bound: int | None = None
        self._weights: WeightSet | None = None
        self._bound: dict[str, CudaBuffer] = {}
        self._steps: list[Callable[[], None]] | None = None
        self._pdl = pdl_launcher(self.stream.ptr, self.state.arch) if use_graph else None
        self._graph = None
        self._graph_failed = False
        if bindings:
            self.bind_buffers(bindings)
        self.stream.synchronize()

    # ---- binding --------------------------------------------------------------------------------------------------
    def bind_buffers(self, bindings: Mapping[str, DeviceBuffer]) -> None:
        """Make inputs (by name) read and write caller-owned device buffers directly (a KV cache shared by the
        prefill and decode programs): no copy per run, and in-place updates land in the caller's buffer."""
        for name, buf in bindings.items():
            if isinstance(buf, CudaBuffer) and not buf.array.flags.c_contiguous:
                raise NPURuntimeError(f"cannot bind '{name}': the buffer is not contiguous")
            # kernels move 16 bytes a load where a tensor's layout allows (vectorized elementwise and row kernels,
            # GEMVs, conv tiles), which a device address off that grid would fault on
            if isinstance(buf, CudaBuffer) and buf.ptr % BIND_ALIGN:
                raise NPURuntimeError(f"cannot bind '{name}': its device address is not {BIND_ALIGN}-byte aligned "
                                      "(a view into a larger array?); bind an array of its own")
        specs = self._check_bindings(self._bound, bindings)
        for name, buf in bindings.items():
            self._bound[name] = buf
            self._ptr[specs[name].buffer] = buf.ptr
        self._forget_outputs()
        self._invalidate()

    def bind_weights(self, weights: WeightSet) -> None:
        for bid, buf in self._weight_buffers(weights):
            self._ptr[bid] = buf.ptr
        self._weights = weights  # keep the buffers alive as long as launches point at them
        self._weights_bound = id(weights)
        self._invalidate()

    def _invalidate(self) -> None:
        self._steps = None
        self._graph = None

    # ---- launches ---------------------------------------------------------------------------------------------------
    def _build(self) -> None:
        self.bias_epilogues: set[str] = set()  # the GEMMs whose bias cuBLASLt's epilogue adds (names)
        self._maps: dict[tuple, Any] = {}  # (launch, its buffers' addresses) -> its tensor maps on the device
        self._steps = [s for i in range(len(self.program.kernels)) for s in self._kernel_steps(i)]

    def _pointer(self, k, which: str, i: int) -> int:
        if which == "buffer":  # a launch that runs several kernels (merged) names buffers directly
            return self._ptr[i]
        ref = k.writes[i] if which == "out" else k.args[i]
        return self._ptr[ref.buffer]

    def _kernel_steps(self, index: int) -> list[Callable[[], None]]:
        k = self.program.kernels[index]
        steps: list[Callable[[], None]] = []
        rendered = self.rendered.steps[index]
        lt = self._bias_epilogue(k, rendered)
        if lt is not None:
            # the bias added by the GEMM itself: the launch that filled the output with it (the first) is not run
            rendered = rendered[1:]
            self.bias_epilogues.add(k.name)
        for step in rendered:
            if not isinstance(step, SourceLaunch):
                plan = step.plan
                if plan["m"] and plan["n"]:
                    steps.append(self._gemm_step(k, plan, lt))
                continue
            launch = step.launch
            grid = tuple(int(g) for g in launch.grid)
            if not all(grid):
                continue  # nothing to compute (an empty tensor)
            fn = self.kernels[step.source]
            block = (int(launch.block), 1, 1)
            maps = self._tensor_maps(k, launch)
            args = tuple(np.uint64(maps if w == "maps" else self._pointer(k, w, int(i))) for w, i in launch.ptrs)
            smem = int(launch.smem)
            if smem > STATIC_SMEM:
                # more dynamic shared memory than a launch gets by default: opt in, once per kernel
                fn.max_dynamic_shared_size_bytes = smem

            pdl = self._pdl
            if pdl is not None:
                def run_kernel(fn=fn, grid=grid, block=block, args=args, smem=smem, pdl=pdl) -> None:
                    pdl(fn, grid, block, args, smem)
            else:
                def run_kernel(fn=fn, grid=grid, block=block, args=args, smem=smem) -> None:
                    fn(grid, block, args, shared_mem=smem)

            steps.append(run_kernel)
        return steps

    def _tensor_maps(self, k, launch) -> int:
        """The device address of the launch's tensor maps, or 0 where it has none: encoded over its buffers'
        addresses and uploaded when the steps are built (again only after a binding moved a buffer: `_build` starts
        afresh), reused by `profile`, which resolves the steps again."""
        if not launch.tensor_maps:
            return 0
        addresses = tuple(self._pointer(k, *m["ref"]) for m in launch.tensor_maps)
        key = (id(launch), addresses)
        buf = self._maps.get(key)
        if buf is None:
            where = f"kernel {k.name} ({k.kind}, nodes {', '.join(k.nodes[:3])})"
            raw = encode_all(addresses, launch.tensor_maps, where)
            buf = self._cp.asarray(raw)  # (CuPy's allocations are 256-byte aligned: the 64 a map needs)
            # the copy ran on CuPy's stream, not the executor's (non-blocking) one: done before any launch reads it
            self._cp.cuda.runtime.deviceSynchronize()
            self._maps[key] = buf  # alive as long as the launches that read it
        return int(buf.data.ptr)

    def _bias_epilogue(self, k, rendered: list) -> LtGemm | None:
        """The cuBLASLt plan of a GEMM whose bias its epilogue adds (`gemm._bias_epilogue`), where the rendered steps
        are the fill, then that GEMM, and cuBLASLt has an algorithm for it; else None (the steps run as rendered)."""
        if len(rendered) < 2 or not isinstance(rendered[0], SourceLaunch) or isinstance(rendered[1], SourceLaunch):
            return None
        plan = rendered[1].plan
        bias = plan.get("bias_epilogue")
        if not bias or not (plan["m"] and plan["n"] and plan["k"]):
            return None
        address = self._ptr[k.args[bias["arg"]].buffer] + bias["offset"] * itemsize(plan["dtype_c"])
        if address % LT_ALIGN:
            return None
        return LtGemm.create(plan, address, self.state.workspace_bytes)

    def _gemm_step(self, k, plan: dict[str, Any], lt: LtGemm | None = None) -> Callable[[], None]:
        handle = self.state.cublas
        scalar = np.float64 if plan["compute"] == 70 else np.float32
        # host scalars (pointer mode host): read when the call is made or captured, so they must stay alive
        alpha = np.array([plan["alpha"]], dtype=scalar)
        beta = np.array([plan["beta"] if lt is None else 0.0], dtype=scalar)
        a = self._ptr[k.args[plan["a_arg"]].buffer]
        b = self._ptr[k.args[plan["b_arg"]].buffer]
        c = self._ptr[k.outs[0].buffer]
        isa, isb, isc = (itemsize(plan[f"dtype_{x}"]) for x in "abc")
        p = plan
        if lt is not None:
            (oa, ob, oc), = plan["calls"]
            ws, ws_bytes, stream = self.state.workspace_ptr, self.state.workspace_bytes, self.stream.ptr

            def run_lt(keep=(alpha, beta, lt)) -> None:
                lt.run(alpha.ctypes.data, beta.ctypes.data, a + oa * isa, b + ob * isb, c + oc * isc, ws, ws_bytes,
                       stream)

            return run_lt
        calls = [(p["transa"], p["transb"], p["m"], p["n"], p["k"], alpha.ctypes.data,
                  a + oa * isa, p["type_a"], p["lda"], p["stride_a"],
                  b + ob * isb, p["type_b"], p["ldb"], p["stride_b"],
                  beta.ctypes.data, c + oc * isc, p["type_c"], p["ldc"], p["stride_c"], p["batch_count"],
                  p["compute"]) for oa, ob, oc in plan["calls"]]

        def run_gemm(calls=calls, keep=(alpha, beta)) -> None:
            for args in calls:
                handle.gemm_strided_batched(*args)

        return run_gemm

    def _launch(self) -> None:
        if self._steps is None:
            self._build()
            self._graph = None
        if self.use_graph and self._graph is None and not self._graph_failed:
            self._capture()
        with self.state.device, self.stream:
            if self._graph is not None:
                self._graph.launch(self.stream)
            else:
                for step in self._steps:
                    step()

    def prepare(self) -> None:
        """Resolve every launch and capture the CUDA graph now (at load), so that the first run only launches it.
        Call it once the weights and the caller-owned buffers are bound."""
        if self._weights_bound is None and self.program.weights:
            raise WeightError("bind the weights before prepare()")
        with self.state.device:
            if self._steps is None:
                self._build()
                self._graph = None
            if self.use_graph and self._graph is None and not self._graph_failed:
                self._capture()

    def _capture(self) -> None:
        """One CUDA graph of every launch: one host call per run instead of one per kernel. With programmatic
        dependent launch where the GPU has it; if capturing that fails, without it."""
        if self._pdl is not None:
            try:
                with self.state.device, self.stream:
                    self.stream.begin_capture()
                    try:
                        for step in self._steps:
                            step()
                    finally:
                        graph = self.stream.end_capture()
                self._graph = graph
                return
            except Exception as e:  # noqa: BLE001  (PDL is an optimisation: capture without it)
                warnings.warn(f"cuda: capturing with programmatic dependent launch failed ({e}); capturing "
                              "without it", RuntimeWarning, stacklevel=3)
                self._pdl = None
                self._build()
        with self.state.device, self.stream:
            try:
                self.stream.begin_capture()
                try:
                    for step in self._steps:
                        step()
                finally:
                    graph = self.stream.end_capture()
                self._graph = graph
            except Exception as e:  # noqa: BLE001  (capture is an optimisation: fall back to plain launches)
                self._graph = None
                self._graph_failed = True
                warnings.warn(f"cuda: CUDA graph capture failed ({e}); launching kernels one by one",
                              RuntimeWarning, stacklevel=3)

    # ---- run --------------------------------------------------------------------------------------------------------
    def input_buffer(self, name: str) -> CudaBuffer:
        """The device buffer an input is read from (the caller's if bound)."""
        spec = self._input_specs[name]
        return self._bound.get(name) or self._own[spec.buffer]

    def _copy_input(self, spec: TensorSpec, value: Any) -> None:
        cp = self._cp
        dst = self.input_buffer(spec.name)
        if isinstance(value, CudaBuffer) and value.dtype == spec.device_dtype:
            if value.ptr != dst.ptr and dst.nbytes:
                cp.cuda.runtime.memcpyAsync(dst.ptr, value.ptr, dst.nbytes, cp.cuda.runtime.memcpyDeviceToDevice,
                                            self.stream.ptr)
            return
        host = np.require(self.host_input(value, spec), requirements="C")
        if spec.value_range is not None and host.size:
            lo, hi = spec.value_range
            if host.min() < lo or host.max() >= hi:
                bad = host[(host < lo) | (host >= hi)].flat[0]
                raise InputError(f"input '{spec.name}': value {int(bad)} out of range [{lo}, {hi})")
        if host.nbytes:
            cp.cuda.runtime.memcpyAsync(dst.ptr, host.ctypes.data, host.nbytes, cp.cuda.runtime.memcpyHostToDevice,
                                        self.stream.ptr)

    def _prepare(self, inputs: Mapping[str, Any], weights: WeightSet | None) -> None:
        self._check_run(inputs, weights, self._bound)
        with self.state.device:
            for name, value in inputs.items():
                self._copy_input(self._input_specs[name], value)

    def run(self, inputs: Mapping[str, Any], weights: WeightSet | None = None) -> dict[str, DeviceBuffer]:
        self._prepare(inputs, weights)
        with self.state.device:
            self._launch()
        return self.outputs()

    def device_seconds(self, inputs: Mapping[str, Any], weights: WeightSet | None = None, iters: int = 10
                       ) -> list[float]:
        """The GPU's time for each of `iters` runs (the captured graph, or the launches one by one): CUDA events
        recorded on the stream around the launch, the inputs copied to the device once before. A spin kernel holds
        the stream until every run is queued, so that the host's launch calls are not timed either."""
        cp = self._cp
        self._prepare(inputs, weights)
        with self.state.device:
            self._launch()  # builds the launches and captures the graph where that is still to do
            self.stream.synchronize()
            marks = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(iters)]
            with self.stream:
                spin_ns = min(2_000_000 + 100_000 * iters, SPIN_CAP_NS)
                _spin_kernel(self.state.arch)((1, 1, 1), (1, 1, 1), (np.uint64(spin_ns),))
            for e0, e1 in marks:
                e0.record(self.stream)
                self._launch()
                e1.record(self.stream)
            self.stream.synchronize()
        return [cp.cuda.get_elapsed_time(e0, e1) * 1e-3 for e0, e1 in marks]

    def profile(self, inputs: Mapping[str, Any], weights: WeightSet | None = None) -> list[KernelTiming]:
        """One run launched kernel by kernel (not as the captured graph, which has no per-kernel boundaries), with
        CUDA events recorded around each kernel's launches (a GEMM's bias fill, cuBLAS call and epilogue count as
        its kernel). A spin kernel holds the stream until every launch is queued, so the kernels then run back to
        back as in a graph and each event pair times the GPU's work, not the host's launch latency."""
        cp = self._cp
        self._prepare(inputs, weights)
        groups = [self._kernel_steps(i) for i in range(len(self.program.kernels))]
        marks = []
        spin = _spin_kernel(self.state.arch)
        n_launch = sum(len(g) for g in groups) + 2 * len(groups)
        with self.state.device, self.stream:
            # about 25 us of host work per queued item, with room to spare
            spin((1, 1, 1), (1, 1, 1), (np.uint64(max(2_000_000, 50_000 * n_launch)),))
            start = cp.cuda.Event()
            start.record(self.stream)
            for group in groups:
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record(self.stream)
                for step in group:
                    step()
                e1.record(self.stream)
                marks.append((e0, e1))
            self.stream.synchronize()
        merged = self.rendered.merged_into
        return [KernelTiming(i, cp.cuda.get_elapsed_time(start, e0) * 1e-3, cp.cuda.get_elapsed_time(e0, e1) * 1e-3,
                             merged.get(i)) for i, (e0, e1) in enumerate(marks)]

    def _output_view(self, spec: TensorSpec) -> CudaBuffer:
        aliased = spec.alias_of is not None and spec.alias_of in self._input_specs
        buf = self.input_buffer(spec.alias_of) if aliased else self._own[spec.buffer]
        return CudaBuffer(buf.array.reshape(spec.shape), spec.device_dtype, self.state)

    @property
    def graph_active(self) -> bool:
        """Whether runs launch one captured CUDA graph (False: kernel by kernel)."""
        return self._graph is not None

    # ---- debugging --------------------------------------------------------------------------------------------------
    def poison(self, byte: int = 0xFF) -> None:
        """Fill the arena and the output buffers with a byte pattern (0xFF: NaN for floats, -1 for integers), so that
        a test can see an element no kernel wrote."""
        cp = self._cp
        with self.state.device:
            cp.cuda.runtime.memsetAsync(int(self.arena.data.ptr), byte, self.arena.nbytes, self.stream.ptr)
            for b in self.program.buffers:
                if b.kind == "output" and b.nbytes:
                    cp.cuda.runtime.memsetAsync(self._own[b.id].ptr, byte, b.nbytes, self.stream.ptr)
        self.stream.synchronize()


_SPIN = r"""extern "C" __global__ void npu_kernel(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
"""
_SPIN_CACHE: dict[str, Any] = {}


def _spin_kernel(arch: str):
    """A kernel that keeps the stream busy for a given number of nanoseconds (the profiler's launch buffer)."""
    if arch not in _SPIN_CACHE:
        kernels, modules = load_kernels({"spin": _SPIN}, arch)
        _SPIN_CACHE[arch] = (kernels["spin"], modules)
    return _SPIN_CACHE[arch][0]
