"""`Executor`: the part of running a program that every backend shares (checking and converting inputs)."""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar

import numpy as np

from npu_compiler.errors import entry_point
from npu_compiler.limits import MAX_BYTES_ENV, Limits, format_bytes
from npu_compiler.memory_check import written_buffers
from npu_compiler.program import CompiledProgram, TensorSpec

from .backend import BACKEND_MODULES, Backend, DeviceBuffer, unavailable_reason
from .dtypes import convert, dtype_name
from .errors import InputError, NPURuntimeError, ResourceError, WeightError
from .profiling import KernelTiming
from .weights import WeightSet


def target_mismatch(program: CompiledProgram, backend: Backend) -> str:
    """Why `backend` cannot run `program`, and the two ways out, in the CLI's own words."""
    want = backend.compile_target()
    why = unavailable_reason(program.target) if program.target in BACKEND_MODULES else None
    return (f"program '{program.model_name}' was compiled for target '{program.target}'; the {backend.name} backend "
            f"runs programs compiled for target '{want}': recompile it for this backend (npusim compile IR.json "
            f"--target {want} -o X.npubin; `npusim run IR.json` compiles for the backend by itself), or run it on "
            f"a backend for its target (--backend {program.target})"
            + (f"; no backend here runs '{program.target}' programs: {why}" if why else ""))


def max_bytes() -> int:
    """The most device memory one program may ask for (weights aside): $NPUSIM_MAX_BYTES, else 64 GiB."""
    return Limits().max_bytes


@contextlib.contextmanager
def allocation_guard(program: CompiledProgram) -> Iterator[None]:
    """Refuse a program whose buffers exceed the limit before allocating them, and turn a failed allocation into a
    clear error (never a MemoryError from deep inside NumPy or CuPy)."""
    need, limit = program.buffer_bytes, max_bytes()
    if need > limit:
        raise NPURuntimeError(f"program '{program.model_name}' needs {format_bytes(need)} of buffers, above the "
                              f"limit of {format_bytes(limit)} (set ${MAX_BYTES_ENV} to raise it)")
    try:
        yield
    except MemoryError as e:
        raise ResourceError(f"program '{program.model_name}': cannot allocate {format_bytes(need)} of buffers on "
                            "this machine") from e


# The methods of every executor that a caller reaches with its own data: an exception that is not one of the
# hierarchy leaves them as an InternalError (a bug), never as a raw KeyError or IndexError.
_ENTRY_POINTS = {"__init__": "preparing the program to run", "run": "running the program",
                 "run_numpy": "running the program", "profile": "profiling the program",
                 "run_observed": "running the program kernel by kernel"}


class Executor(ABC):
    """All expensive work happens in `__init__`; `run` binds inputs and launches."""

    buffer_type: ClassVar[type[DeviceBuffer]] = DeviceBuffer  # the device buffers this executor's backend makes

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, during in _ENTRY_POINTS.items():
            fn = cls.__dict__.get(name)
            if fn is not None and not getattr(fn, "__wrapped_entry_point__", False):
                setattr(cls, name, entry_point(during)(fn))

    def __init__(self, program: CompiledProgram, backend: Backend) -> None:
        if program.target != backend.compile_target():
            raise NPURuntimeError(target_mismatch(program, backend))
        self.program = program
        self.backend = backend
        self._input_specs = {s.name: s for s in program.inputs}
        self._weight_ids = {w.name: w.buffer for w in program.weights}
        self._weight_specs = {w.name: w for w in program.weights}
        self._output_views: dict[str, DeviceBuffer] | None = None  # (outputs(): built once)

    def _check_run(self, inputs: Mapping[str, Any], weights: WeightSet | None, bound: Iterable[str]) -> None:
        """Before a run: the inputs, with the ones bound to caller-owned buffers (`bound`, checked at bind time) and
        not given standing in by their spec; then the weights, bound now when they are new."""
        self.check_inputs(inputs, bound)
        if weights is not None and id(weights) != self._weights_bound:
            self.bind_weights(weights)
        if self._weights_bound is None and self.program.weights:
            raise WeightError("no weights bound: pass weights=load_weights(...) to run()")

    def _binding_spec(self, name: str, buf: DeviceBuffer) -> TensorSpec:
        """The input `name` that caller-owned `buf` may stand for (its shape and device dtype checked)."""
        spec = self._input_specs.get(name)
        if spec is None:
            raise NPURuntimeError(f"cannot bind '{name}': not an input of the program")
        if not isinstance(buf, self.buffer_type):
            raise NPURuntimeError(f"cannot bind '{name}': a {type(buf).__name__} is not a {self.backend.name} "
                                  "device buffer")
        if tuple(buf.shape) != tuple(spec.shape) or buf.dtype != spec.device_dtype:
            raise NPURuntimeError(f"cannot bind '{name}': expected {spec.device_dtype}{list(spec.shape)}, got "
                                  f"{buf.dtype}{list(buf.shape)}")
        return spec

    def _check_bindings(self, bound: Mapping[str, DeviceBuffer], new: Mapping[str, DeviceBuffer]
                        ) -> dict[str, TensorSpec]:
        """Before binding `new` beside the inputs already `bound`: each one's spec (`_binding_spec`), and no two
        inputs on overlapping memory where a kernel writes either. The program takes its inputs for distinct
        tensors: an in-place write (a KV cache's index_copy) would change the other under it, and a cuda kernel may
        read an input no kernel writes before it waits for the kernel before. Nothing is bound when this raises."""
        specs = {name: self._binding_spec(name, buf) for name, buf in new.items()}
        every = {**bound, **new}
        if len(every) > 1:
            written_ids = written_buffers(self.program.kernels)
            written = {n for n, s in self._input_specs.items() if s.buffer in written_ids}
            spans = sorted((buf.memory_span(), name) for name, buf in every.items() if buf.nbytes)
            for (a_span, a), (b_span, b) in ((x, y) for i, x in enumerate(spans) for y in spans[i + 1:]):
                if a_span[0] == b_span[0] and b_span[1] < a_span[2] and (a in written or b in written):
                    w = a if a in written else b
                    raise NPURuntimeError(f"cannot bind '{a}' and '{b}' to overlapping memory: the program writes "
                                          f"'{w}' in place and takes its inputs for distinct tensors")
        return specs

    def _weight_buffers(self, weights: WeightSet) -> Iterator[tuple[int, DeviceBuffer]]:
        """Each weight buffer id of the program with its device buffer in `weights` (presence, kind, dtype and
        size checked)."""
        missing = [n for n in self._weight_ids if n not in weights.buffers]
        if missing:
            raise WeightError(f"weight set lacks {len(missing)} weight(s) of the program: {', '.join(missing[:8])}")
        for name, bid in self._weight_ids.items():
            buf = weights.buffers[name]
            spec = self._weight_specs[name]
            if not isinstance(buf, self.buffer_type):
                raise WeightError(f"weight '{name}' is a {type(buf).__name__}, not a {self.backend.name} device "
                                  f"buffer: load the weights with the {self.backend.name} backend")
            if buf.dtype != spec.dtype or int(np.prod(buf.shape)) != int(np.prod(spec.shape)):
                raise WeightError(f"weight '{name}': expected {spec.dtype}{list(spec.shape)}, got "
                                  f"{buf.dtype}{list(buf.shape)}")
            if spec.layout and tuple(buf.shape) != spec.device_shape:
                # the same weight loaded for a program that keeps it in another order of dims
                raise WeightError(f"weight '{name}': this program keeps it as {list(spec.device_shape)} (dims in "
                                  f"the order {list(spec.layout)}), the buffer given is {list(buf.shape)}: load "
                                  "the weights for this program")
            yield bid, buf

    def check_inputs(self, inputs: Mapping[str, Any], bound: Iterable[str] = ()) -> None:
        """Names, shapes and dtypes of the inputs given; `bound`: inputs bound to caller-owned buffers (checked when
        they were bound), which need not be given. (A decode step binds its whole KV cache: checking those again
        every step cost more host time than the rest of the run's preparation.)"""
        if not isinstance(inputs, Mapping):
            raise InputError(f"inputs must be a mapping from input name to array, got {type(inputs).__name__}")
        given, wanted = set(inputs), set(self._input_specs)
        if given - wanted:
            raise InputError(f"unexpected input(s) {sorted(given - wanted)}; the program takes "
                             f"{', '.join(self._describe(s) for s in self.program.inputs)}")
        missing_names = wanted - given - set(bound)
        if missing_names:
            missing = ", ".join(self._describe(self._input_specs[n]) for n in sorted(missing_names))
            raise InputError(f"missing input(s): {missing}")
        for name, value in inputs.items():
            spec = self._input_specs[name]
            shape = tuple(value.shape)
            if shape != tuple(spec.shape):
                raise InputError(f"input '{name}': expected shape {list(spec.shape)}, got {list(shape)}")
            # a DeviceBuffer already names its dtype as a string
            if isinstance(getattr(value, "dtype", None), str):
                dt = value.dtype
            else:
                arr_dt = np.asarray(value).dtype
                try:
                    dt = dtype_name(arr_dt)
                except KeyError:
                    raise InputError(f"input '{name}': expected dtype {spec.dtype}, got {arr_dt} (an array type the "
                                     "program cannot take)") from None
            ok = {spec.dtype, spec.device_dtype}
            if dt not in ok:
                raise InputError(f"input '{name}': expected dtype {spec.dtype}, got {dt}")

    @staticmethod
    def _describe(s: TensorSpec) -> str:
        return f"'{s.name}' {s.dtype}{list(s.shape)}"

    @staticmethod
    def host_input(value: Any, spec: TensorSpec) -> np.ndarray:
        arr = value.to_numpy() if isinstance(value, DeviceBuffer) else np.asarray(value)
        return convert(arr, spec.device_dtype)

    @abstractmethod
    def run(self, inputs: Mapping[str, Any], weights: WeightSet | None = None) -> dict[str, DeviceBuffer]:
        """Run once. Outputs are device buffers by output name (overwritten by the next run)."""

    def profile(self, inputs: Mapping[str, Any], weights: WeightSet | None = None) -> list[KernelTiming]:
        """Run once and time every kernel launch (CPU: host timers; a GPU backend: events around each launch,
        read after a synchronise). Backends without kernel timing raise NotImplementedError."""
        raise NotImplementedError(f"the {self.backend.name} backend has no per-kernel profiling yet")

    def device_seconds(self, inputs: Mapping[str, Any], weights: WeightSet | None = None, iters: int = 10
                       ) -> list[float]:
        """The device's time for each of `iters` runs of the program with its inputs already on the device and its
        outputs left there (trtexec's GPU compute time, beside the host-to-host latency of `run_numpy`, which adds
        the uploads, the downloads and the host's work). This default uploads the inputs once and times `run` and
        a synchronise with the host's clock (the CPU's kernels are the host's work); a GPU backend times the
        device's work with its own events."""
        specs = self._input_specs
        staged = {name: self.backend.upload(self.host_input(v, specs[name]), specs[name].device_dtype)
                  for name, v in inputs.items()}
        self.run(staged, weights)
        self.backend.synchronize()
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            self.run(staged, weights)
            self.backend.synchronize()
            times.append(time.perf_counter() - t)
        return times

    def prepare(self) -> None:  # noqa: B027  (a backend with nothing to prepare keeps the default)
        """Do now what the first run would otherwise do (build launches, capture a device graph)."""

    def outputs(self) -> dict[str, DeviceBuffer]:
        """The device buffers the outputs are written to (reused by every run: bind them as another program's
        inputs). Wrapped once, and again after a binding (`_forget_outputs`), which may change what an output that
        aliases an input is: `run()` returns them, and wrapping them anew each run cost the CUDA backend's prefill
        46 us of host time for 17 outputs, some of it (the step-inputs program's) before the prefill's launch."""
        if self._output_views is None:
            self._output_views = {s.name: self._output_view(s) for s in self.program.outputs}
        return dict(self._output_views)

    def _output_view(self, spec: TensorSpec) -> DeviceBuffer:
        """The buffer output `spec` is written to, in its shape and device dtype."""
        raise NotImplementedError

    def _forget_outputs(self) -> None:
        """After a binding: outputs() wraps the buffers again."""
        self._output_views = None

    def run_numpy(self, inputs: Mapping[str, Any], weights: WeightSet | None = None) -> dict[str, np.ndarray]:
        """Run and copy the outputs to the host in their user-facing dtypes."""
        outs = self.run(inputs, weights)
        specs = {s.name: s for s in self.program.outputs}
        return {k: v.to_numpy(specs[k]) for k, v in outs.items()}
