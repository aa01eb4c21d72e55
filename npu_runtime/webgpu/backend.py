"""The webgpu backend on wgpu-py: one adapter and device per process (Metal on macOS, Vulkan on Linux, D3D12 on
Windows; OpenGL is left out: wgpu's GL path has no f16, few storage bindings and no timestamps, and taking it
silently would hide a missing Vulkan driver), device buffers holding the program's own bytes, executors that render
the program's WGSL when they are built. wgpu is imported lazily, so this module imports (and reports the backend
unavailable) on a machine without it.

Limits: the device is requested with the adapter's largest storage binding and buffer sizes (WebGPU's defaults are
128 MiB and 256 MiB) and its number of storage buffers per stage; a tensor larger than one binding is bound in
chunks (npu_compiler/targets/webgpu/bindings.py), one larger than the largest buffer is refused with its name.
Arithmetic: WGSL allows `/` an error of 2.5 ulp, and Vulkan lets a driver fuse a*b + c. Both are probed once (64K
quotients against IEEE's; one x*y + z whose fused and rounded results differ): where division is not correctly
rounded kernels correct their quotients, where products are fused kernels keep them rounded
(npu_compiler/targets/webgpu/language.py: DIVISION, PRODUCTS), and the device line says so.

Overrides for testing and for unusual adapters: NPUSIM_WEBGPU_MAX_BINDING (bytes: bind in smaller chunks),
NPUSIM_WEBGPU_F16=0 (store float16 as 16-bit words even where the adapter has `shader-f16`),
NPUSIM_WEBGPU_DIVISION=exact|corrected|fused and NPUSIM_WEBGPU_PRODUCTS=plain|opaque (whatever the probes found),
NPUSIM_WEBGPU_SUBGROUPS=0 (reduce through workgroup memory even where the adapter has subgroup operations).
"""

from __future__ import annotations

import functools
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from npu_compiler.program import CompiledProgram, TensorSpec

from ..backend import Backend, DeviceBuffer
from ..dtypes import convert, dtype_name, np_dtype
from ..errors import BackendUnavailable, InputError, NPURuntimeError

INSTALL_HINT = 'pip install -e ".[webgpu]"'
DRIVER_HINT = ("on Linux install a Vulkan driver: Mesa's (software, any machine: apt-get install "
               "mesa-vulkan-drivers libvulkan1) or your GPU vendor's; macOS has Metal and Windows D3D12 built in")
BACKENDS = ("Vulkan", "Metal", "D3D12")
MAX_BINDING_ENV = "NPUSIM_WEBGPU_MAX_BINDING"
F16_ENV = "NPUSIM_WEBGPU_F16"
DIVISION_ENV = "NPUSIM_WEBGPU_DIVISION"
PRODUCTS_ENV = "NPUSIM_WEBGPU_PRODUCTS"
PACKED_ENV = "NPUSIM_WEBGPU_PACKED_DOT"
SUBGROUPS_ENV = "NPUSIM_WEBGPU_SUBGROUPS"
SUBGROUP_FEATURES = ("subgroups", "subgroup")  # WebGPU's name, wgpu-native 0.32's
INT32 = (-(2**31), 2**31)


def _quiet_mesa() -> None:
    """Mesa's window-system layer prints an error for every probe on a machine without a session runtime folder
    (headless servers, CI); a private empty one silences it. Nothing is written there."""
    if not os.environ.get("XDG_RUNTIME_DIR"):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="npusim-xdg-")


@functools.cache
def _wgpu() -> Any:
    """wgpu, with its instance limited to Vulkan, Metal and D3D12 (set once, before the instance exists)."""
    _quiet_mesa()
    import wgpu  # noqa: PLC0415

    try:
        from wgpu.backends.wgpu_native.extras import set_instance_extras  # noqa: PLC0415

        set_instance_extras(backends=["Vulkan", "Metal", "DX12"])
    except Exception:  # noqa: BLE001  (an instance made elsewhere first: the backend check below still applies)
        pass
    return wgpu


@functools.cache
def _adapter() -> tuple[Any, str | None]:
    try:
        wgpu = _wgpu()
    except ImportError:
        return None, f"wgpu is not installed (install the project's webgpu extra: {INSTALL_HINT})"
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as e:  # noqa: BLE001  (wgpu raises RuntimeError and its own errors when no adapter exists)
        return None, f"no WebGPU adapter ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); " \
                     f"{DRIVER_HINT}"
    if adapter is None:
        return None, f"no WebGPU adapter; {DRIVER_HINT}"
    kind = adapter.info.get("backend_type", "")
    if kind not in BACKENDS:
        return None, (f"wgpu offers only a {kind} adapter ({adapter.info.get('device', '?')}), which the webgpu "
                      f"backend does not use; {DRIVER_HINT}")
    return adapter, None


def unavailable_reason() -> str | None:
    """Why the webgpu backend cannot run here (None: wgpu imports and a Vulkan, Metal or D3D12 adapter exists)."""
    return _adapter()[1]


@dataclass
class DeviceState:
    """The process's device: the adapter it came from, the features and limits it was made with, and the pipelines
    built so far (by source text, shared by every executor)."""

    wgpu: Any
    adapter: Any
    device: Any
    features: frozenset[str]
    limits: dict[str, int]

    def __post_init__(self) -> None:
        self.modules: dict[str, Any] = {}
        self._fence = None
        self.timestamp_period = 1.0
        if "timestamp-query" in self.features:
            try:
                from wgpu.backends.wgpu_native._api import libf  # noqa: PLC0415

                self.timestamp_period = float(libf.wgpuQueueGetTimestampPeriod(self.device.queue._internal))
            except Exception:  # noqa: BLE001  (older wgpu: WebGPU defines timestamps in nanoseconds)
                self.timestamp_period = 1.0

    @property
    def info(self) -> dict[str, Any]:
        return dict(self.adapter.info)

    @functools.cached_property
    def profile(self):
        """The adapter as a device profile (devices.py): its workgroup limits and subgroup width, the compute
        units of a known product (WebGPU reports none)."""
        from npu_compiler.devices import webgpu_profile  # noqa: PLC0415

        return webgpu_profile(self.info, self.limits)

    @property
    def software(self) -> bool:
        return self.info.get("adapter_type") == "CPU"

    def describe(self) -> str:
        """One line: the adapter, its backend, the features and limits that matter here."""
        i = self.info
        feats = ", ".join(f for f in ("shader-f16", "timestamp-query", *SUBGROUP_FEATURES) if f in self.features) \
            or "none"
        if not self.f16_native:
            why = "the adapter has no shader-f16" if "shader-f16" not in self.features else f"${F16_ENV}=0"
            feats += f" (float16 stored as 16-bit words: {why}; the same bits, slower stores)"
        if "timestamp-query" not in self.features:
            feats += " (no timestamp queries: profile times each kernel on the host)"
        if self.division != "exact":
            how = "with fused multiply-adds" if self.division == "fused" else "with Dekker's products"
            feats += f" (the device's f32 division is not correctly rounded: kernels correct their quotients {how})"
        if self.products == "opaque":
            feats += " (the device fuses x*y + z: kernels keep products rounded, as the reference does)"
        if self.flushes_subnormals:
            feats += " (the device flushes subnormal f32 results to zero, as WGSL allows)"
        lim = self.limits
        return (f"{i.get('device', '?')} via {i.get('backend_type', '?')} ({i.get('adapter_type', '?')}, "
                f"{i.get('description', '') or i.get('vendor', '')}); features: {feats}; max storage binding "
                f"{_size(lim['max-storage-buffer-binding-size'])}, max buffer {_size(lim['max-buffer-size'])}, "
                f"{lim['max-storage-buffers-per-shader-stage']} storage buffers per stage, "
                f"{lim['max-compute-workgroups-per-dimension']} workgroups per dimension")

    def to_dict(self) -> dict[str, Any]:
        keys = ("max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage",
                "max-compute-workgroups-per-dimension", "max-compute-workgroup-storage-size",
                "min-storage-buffer-offset-alignment")
        return {"adapter": {k: self.info.get(k) for k in ("device", "vendor", "description", "backend_type",
                                                          "adapter_type")},
                "features": sorted(self.features), "limits": {k: self.limits.get(k) for k in keys}}

    @functools.cached_property
    def exact_division(self) -> bool:
        """Is the device's f32 `/` correctly rounded (measured)?"""
        return _probe_division(self)

    @functools.cached_property
    def fused_fma(self) -> bool:
        """Does the device's `fma` round once (measured)? WGSL does not promise it (lavapipe's rounds twice)."""
        return _probe(self, FMA_PROBE) != 0.0

    @functools.cached_property
    def flushes_subnormals(self) -> bool:
        """Does the device flush subnormal f32 results to zero (measured)? WGSL allows it; NVIDIA's Vulkan driver
        does, lavapipe does not."""
        return _probe(self, SUBNORMAL_PROBE, (2.0**-126, 0.5, 0.0)) == 0.0

    @functools.cached_property
    def fuses_products(self) -> bool:
        """Does the device's compiler fuse x*y + z into one rounding (measured)?"""
        return _probe(self) != 0.0

    @property
    def products(self) -> str:
        """How kernels multiply: "plain", or "opaque" where the device fuses products into additions."""
        forced = os.environ.get(PRODUCTS_ENV)
        if forced:
            if forced not in ("plain", "opaque"):
                raise NPURuntimeError(f"${PRODUCTS_ENV} must be 'plain' or 'opaque', got {forced!r}")
            return forced
        return "opaque" if self.fuses_products else "plain"

    @property
    def division(self) -> str:
        """How kernels divide: "exact" (the device's `/`, correctly rounded here), else corrected: "fused" where the
        device's `fma` rounds once, "corrected" (Dekker's products) where it does not (language.py: DIVISION)."""
        forced = os.environ.get(DIVISION_ENV)
        if forced:
            if forced not in ("exact", "corrected", "fused"):
                raise NPURuntimeError(f"${DIVISION_ENV} must be 'exact', 'corrected' or 'fused', got {forced!r}")
            return forced
        if self.exact_division:
            return "exact"
        return "fused" if self.fused_fma else "corrected"

    @functools.cached_property
    def packed_dot(self) -> bool:
        """Does the device's WGSL compiler have the packed_4x8_integer_dot_product language feature, and does its
        `dot4I8Packed` give signed byte products (measured; ${PACKED_ENV}=0 switches the integer kernels' packed path
        off)?"""
        if os.environ.get(PACKED_ENV, "1") == "0":
            return False
        try:
            return _probe(self, PACKED_PROBE, (0.0, 0.0, 0.0)) == 8.0
        except Exception:  # noqa: BLE001  (a WGSL compiler without the builtin refuses the module)
            return False

    @property
    def f16_native(self) -> bool:
        return "shader-f16" in self.features and os.environ.get(F16_ENV, "1") != "0"

    @property
    def subgroup_min_size(self) -> int:
        """The adapter's smallest subgroup where the device has subgroup operations (0: none, or
        $NPUSIM_WEBGPU_SUBGROUPS=0)."""
        if not set(SUBGROUP_FEATURES) & self.features or os.environ.get(SUBGROUPS_ENV, "1") == "0":
            return 0
        i = self.info
        return next((int(i[k]) for k in ("subgroup_min_size", "stackgroup_min_size") if int(i.get(k) or 0) > 0), 0)

    @property
    def max_binding(self) -> int:
        limit = int(self.limits["max-storage-buffer-binding-size"])
        forced = os.environ.get(MAX_BINDING_ENV)
        if forced:
            try:
                limit = min(limit, max(256, int(forced)))
            except ValueError:
                raise NPURuntimeError(f"${MAX_BINDING_ENV} must be a number of bytes, got {forced!r}") from None
        return limit

    def wait(self) -> None:
        """Block until everything submitted so far has run. (wgpu-py 0.32's on_submitted_work_done fails in its
        own binding; mapping a copy made after the submitted work waits for it just as well: the queue is in
        order.)"""
        if self._fence is None:
            w = self.wgpu
            self._fence = self.device.create_buffer(size=4, usage=w.BufferUsage.STORAGE | w.BufferUsage.COPY_SRC)
        self.device.queue.read_buffer(self._fence, 0, 4)

    def module(self, source: str) -> Any:
        hit = self.modules.get(source)
        if hit is None:
            hit = self.modules[source] = self.device.create_shader_module(code=source)
        return hit


PROBE = """
@group(0) @binding(0) var<storage, read_write> io: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let n = arrayLength(&io) / 3u;
  let i = gid.x;
  if (i < n) { io[2u * n + i] = io[i] / io[n + i]; }
}
"""


def _probe_division(state: DeviceState) -> bool:
    """Divide 65,536 random pairs (exponents over +-20 binades) on the device and compare with IEEE's quotients (an
    approximate division, a reciprocal and a product, misses many of them)."""
    n = 1 << 16
    rng = np.random.default_rng(0)
    a = (rng.uniform(1, 2, n) * 2.0 ** rng.integers(-20, 21, n) * rng.choice([-1, 1], n)).astype(np.float32)
    b = (rng.uniform(1, 2, n) * 2.0 ** rng.integers(-20, 21, n)).astype(np.float32)
    out = run_f32_shader(state, PROBE, np.concatenate([a, b, np.zeros(n, np.float32)]), n // 64)
    return bool(np.array_equal(out[2 * n:], a / b))


CONTRACTION_PROBE = """
@group(0) @binding(0) var<storage, read_write> io: array<f32>;
@compute @workgroup_size(1)
fn main() {
  let p = io[0] * io[1];
  io[3] = p + io[2];
}
"""


PACKED_PROBE = """
@group(0) @binding(0) var<storage, read_write> io: array<f32>;
@compute @workgroup_size(1)
fn main() {
  io[3] = f32(dot4I8Packed(0x01020304u, 0xff010101u)) + io[0];
}
"""


FMA_PROBE = """
@group(0) @binding(0) var<storage, read_write> io: array<f32>;
@compute @workgroup_size(1)
fn main() {
  io[3] = fma(io[0], io[1], io[2]);
}
"""


SUBNORMAL_PROBE = """
@group(0) @binding(0) var<storage, read_write> io: array<f32>;
@compute @workgroup_size(1)
fn main() {
  io[3] = io[0] * io[1];
}
"""


def _probe(state: DeviceState, code: str = CONTRACTION_PROBE,
                       operands: tuple[float, float, float] = (1 + 2**-12, 1 + 2**-12, -(1 + 2**-11))) -> float:
    """Run a one-thread probe on three f32 operands and return what it writes. The default: x*y + z (or `fma`)
    with x = y = 1 + 2^-12, z = -(1 + 2^-11): the rounded product makes it 0, a fused one 2^-24."""
    return float(run_f32_shader(state, code, np.array([*operands, 0], np.float32), 1)[3])


def run_f32_shader(state: DeviceState, code: str, data: np.ndarray, workgroups: int) -> np.ndarray:
    """Run a WGSL module whose entry point `main` reads and writes one f32 array bound at 0 (the probes, and tests of
    single helpers); returns the array after the run."""
    w, device = state.wgpu, state.device
    buf = device.create_buffer_with_data(data=np.require(data, np.float32, requirements="C").tobytes(),
                                         usage=w.BufferUsage.STORAGE | w.BufferUsage.COPY_SRC)
    pipe = device.create_compute_pipeline(layout="auto", compute={"module": device.create_shader_module(code=code),
                                                                  "entry_point": "main"})
    group = device.create_bind_group(layout=pipe.get_bind_group_layout(0),
                                     entries=[{"binding": 0, "resource": {"buffer": buf}}])
    enc = device.create_command_encoder()
    p = enc.begin_compute_pass()
    p.set_pipeline(pipe)
    p.set_bind_group(0, group)
    p.dispatch_workgroups(workgroups, 1, 1)
    p.end()
    device.queue.submit([enc.finish()])
    return np.frombuffer(device.queue.read_buffer(buf), np.float32).copy()


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):g} {unit}"
    return f"{n} B"


@functools.cache
def device_state() -> DeviceState:
    adapter, why = _adapter()
    if adapter is None:
        raise BackendUnavailable(f"the webgpu backend cannot run: {why}")
    wgpu = _wgpu()
    lim = adapter.limits
    wanted = ("max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage",
              "max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup",
              "max-compute-workgroup-size-x")
    features = [f for f in ("shader-f16", "timestamp-query", *SUBGROUP_FEATURES) if f in adapter.features]
    device = adapter.request_device_sync(required_features=features,
                                         required_limits={k: lim[k] for k in wanted if k in lim})
    return DeviceState(wgpu, adapter, device, frozenset(device.features), dict(device.limits))


class WebGPUBuffer(DeviceBuffer):
    """A tensor in a wgpu buffer: `size` bytes at `offset` (its own buffer, or a range of an executor's)."""

    def __init__(self, buffer: Any, shape: tuple[int, ...], dtype: str, state: DeviceState, offset: int = 0) -> None:
        self.buffer = buffer
        self.shape = tuple(shape)
        self.dtype = dtype
        self.offset = offset
        self._state = state

    @property
    def native_handle(self) -> Any:
        return self.buffer

    def memory_span(self) -> tuple[int, int, int]:
        return (id(self.buffer), self.offset, self.offset + self.nbytes)

    def to_numpy(self, spec: TensorSpec | None = None) -> np.ndarray:
        host = read_bytes(self._state, self.buffer, self.offset, self.nbytes)
        arr = np.frombuffer(host, dtype=np_dtype(self.dtype)).reshape(self.shape).copy()
        return convert(arr, spec.dtype) if spec is not None else arr

    def __repr__(self) -> str:
        return f"WebGPUBuffer({self.dtype}{list(self.shape)})"


def read_bytes(state: DeviceState, buffer: Any, offset: int, nbytes: int) -> bytes:
    """`nbytes` at `offset` of a buffer (copies are whole 4-byte words: read the covering words, then cut)."""
    if nbytes == 0:
        return b""
    lo = offset // 4 * 4
    hi = -(-(offset + nbytes) // 4) * 4
    data = state.device.queue.read_buffer(buffer, lo, hi - lo)
    return bytes(data)[offset - lo:offset - lo + nbytes]


def check_int32(arr: np.ndarray, what: str) -> None:
    """int64 data the kernels will compute with must fit the int32 they compute in (WGSL has no 64-bit integers)."""
    if arr.dtype == np.int64 and arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < INT32[0] or hi >= INT32[1]:
            bad = lo if lo < INT32[0] else hi
            raise InputError(f"{what}: int64 value {bad} is outside the int32 range the webgpu backend computes "
                             "integers in (WGSL has no 64-bit integers); run it on the cpu or cuda backend")


class WebGPUBackend(Backend):
    name = "webgpu"
    capabilities = frozenset({"float32", "float16", "bfloat16", "int64:int32", "library:all"})

    def __init__(self) -> None:
        why = unavailable_reason()
        if why is not None:
            raise BackendUnavailable(f"the webgpu backend cannot run: {why}")
        self.state = device_state()

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return unavailable_reason()

    @classmethod
    def default_skip_reason(cls) -> str | None:
        """A software adapter (Mesa's lavapipe, WARP) runs on the CPU, slower than the NumPy backend: never the
        default, used when asked for by name."""
        adapter, _ = _adapter()
        if adapter is not None and adapter.info.get("adapter_type") == "CPU":
            return f"its only adapter is a software one ({adapter.info.get('device', '?')})"
        return None

    def describe(self) -> str:
        return self.state.describe()

    def create_buffer(self, nbytes: int, what: str) -> Any:
        """A storage buffer of at least `nbytes` (whole words, at least one)."""
        wgpu = self.state.wgpu
        size = max(4, -(-nbytes // 4) * 4)
        limit = int(self.state.limits["max-buffer-size"])
        if size > limit:
            raise NPURuntimeError(f"{what}: {nbytes} bytes is larger than the adapter's largest buffer "
                                  f"({_size(limit)})")
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        try:
            return self.state.device.create_buffer(size=size, usage=usage)
        except Exception as e:  # noqa: BLE001  (wgpu reports out-of-memory as its own error types)
            raise NPURuntimeError(f"{what}: cannot allocate {_size(size)} on the device ({e})") from e

    def allocate(self, shape: tuple[int, ...], dtype: str) -> WebGPUBuffer:
        n = int(np.prod(shape)) * np_dtype(dtype).itemsize
        return WebGPUBuffer(self.create_buffer(n, f"a {dtype}{list(shape)} buffer"), shape, dtype, self.state)

    def upload(self, array: np.ndarray, dtype: str | None = None) -> WebGPUBuffer:
        array = np.asarray(array)
        dtype = dtype or dtype_name(array.dtype)
        host = np.require(convert(array, dtype), requirements="C")
        check_int32(host, f"a {dtype}{list(host.shape)} array")
        buf = self.allocate(host.shape, dtype)
        write_bytes(self.state, buf.buffer, 0, host)
        return buf

    def zeros(self, shape: tuple[int, ...], dtype: str) -> WebGPUBuffer:
        return self.allocate(shape, dtype)  # new wgpu buffers are zero-initialised (WebGPU guarantees it)

    def create_executor(self, program: CompiledProgram, **kwargs: Any):
        from .executor import WebGPUExecutor  # noqa: PLC0415

        return WebGPUExecutor(program, self, **kwargs)

    def synchronize(self) -> None:
        self.state.wait()

    def compile_target(self) -> str:
        return "webgpu"

    def device_profile(self):
        return self.state.profile


def write_bytes(state: DeviceState, buffer: Any, offset: int, host: np.ndarray) -> None:
    """Host bytes into a buffer at a word-aligned offset (a trailing partial word is padded with zeros)."""
    raw = np.require(host, requirements="C").reshape(-1).view(np.uint8)
    if raw.size == 0:
        return
    if raw.size % 4:
        raw = np.concatenate([raw, np.zeros(4 - raw.size % 4, np.uint8)])
    state.device.queue.write_buffer(buffer, offset, raw)


BACKEND = WebGPUBackend
