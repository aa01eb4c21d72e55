"""The webgpu backend's device, buffers, registry entry, limits and error paths; its storage schemes (16- and 8-bit
elements written by different invocations, bindings split in chunks, float16 with and without `shader-f16`, int64
in int32); profiling and per-kernel inspection. The op conformance table runs on it through the `backend` fixture
(tests/test_op_conformance.py); models are in test_webgpu_models.py."""

from __future__ import annotations

import os
import platform

import ml_dtypes
import numpy as np
import pytest
import torch
from conftest import export_ir, run_module

import npu_compiler
import npu_runtime
from npu_compiler.targets.webgpu import DeviceCaps, WebGPUTarget
from npu_runtime.errors import InputError, NPURuntimeError, WeightError
from npu_runtime.webgpu.backend import run_f32_shader


class Fn(torch.nn.Module):
    def __init__(self, f) -> None:
        super().__init__()
        self.f = f

    def forward(self, *xs):
        return self.f(*xs)


def test_adapter_is_vulkan_metal_or_d3d12(webgpu) -> None:
    """wgpu must not have fallen back to its OpenGL adapter (no f16, few bindings): on Linux, and so in CI, the
    adapter is Vulkan (Mesa's lavapipe there); macOS gets Metal, Windows D3D12."""
    info = webgpu.state.info
    want = {"Linux": "Vulkan", "Darwin": "Metal", "Windows": "D3D12"}.get(platform.system())
    assert info["backend_type"] == (want or info["backend_type"]), info
    line = webgpu.describe()
    assert info["device"] in line and f"via {info['backend_type']}" in line and "max storage binding" in line
    limits = webgpu.state.limits
    # the device was asked for the adapter's own limits, not WebGPU's defaults
    for key in ("max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage"):
        assert limits[key] == webgpu.state.adapter.limits[key], key
    if os.environ.get("CI"):
        assert "shader-f16" in webgpu.state.features, "CI's lavapipe has shader-f16"


def test_registry_ranks_webgpu_after_cuda(webgpu, monkeypatch) -> None:
    from npu_runtime import backend as registry

    names = registry.registered_backends()
    assert names.index("cuda") < names.index("webgpu") < names.index("cpu")
    assert "webgpu" in npu_runtime.available_backends()
    assert webgpu.compile_target() == "webgpu"
    monkeypatch.delenv(registry.ENV_VAR, raising=False)
    default = registry.default_backend_name()
    if webgpu.state.software:
        # a software adapter (lavapipe) is slower than the NumPy backend on the same CPU: never the default
        assert default != "webgpu" and "software" in type(webgpu).default_skip_reason()
    elif registry.unavailable_reason("cuda") is not None:
        assert default == "webgpu"
    monkeypatch.setenv(registry.ENV_VAR, "webgpu")
    assert npu_runtime.get_backend().name == "webgpu"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
                                   "bool"])
def test_upload_round_trip(webgpu, dtype) -> None:
    host = np.random.default_rng(0).standard_normal((3, 5, 7)) * 10  # 105 elements: a partial last word
    arr = host.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype))
    buf = webgpu.upload(arr, dtype)
    assert buf.shape == (3, 5, 7) and buf.dtype == dtype
    assert buf.to_numpy().tobytes() == arr.tobytes()
    z = webgpu.zeros((4, 3), dtype)
    assert not z.to_numpy().astype(np.float64).any()


def test_int64_outside_int32_is_refused_on_upload(webgpu) -> None:
    with pytest.raises(InputError, match="outside the int32 range"):
        webgpu.upload(np.array([1, 2**31], np.int64))
    webgpu.upload(np.array([-(2**31), 2**31 - 1], np.int64))  # the ends of the range are fine


def test_buffer_larger_than_the_device_allows_is_refused(webgpu, monkeypatch) -> None:
    monkeypatch.setitem(webgpu.state.limits, "max-buffer-size", 1024)
    with pytest.raises(NPURuntimeError, match=r"larger than the adapter's largest buffer \(1 KiB\)"):
        webgpu.upload(np.zeros(300, np.float32))


def _compare_with_torch(webgpu, f, *inputs, exact: bool = True):
    ir, got, ref = run_module(webgpu, lambda: Fn(f), inputs)
    for g, r in zip(got, ref):
        r = r.float().numpy() if r.is_floating_point() else r.numpy()
        if exact:
            np.testing.assert_array_equal(np.asarray(g, np.float64), np.asarray(r, np.float64))
        else:
            np.testing.assert_allclose(np.asarray(g, np.float64), r, rtol=2e-2, atol=2e-2)
    return ir


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int8, torch.uint8, torch.int16, torch.bool])
def test_subword_stores_from_different_invocations(webgpu, dtype) -> None:
    """16- and 8-bit outputs share 32-bit words between invocations: a transposed write of an odd shape puts the
    two (four) elements of every word in different invocations and workgroups; none may lose another's write."""
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(131, 67, generator=g) * 200 - 100)
    x = (x > 0) if dtype == torch.bool else x.to(dtype)
    _compare_with_torch(webgpu, lambda t: t.t().contiguous(), x)
    _compare_with_torch(webgpu, lambda t: t[:, 1::2].t().contiguous(), x)


def test_bindings_split_in_chunks(webgpu, monkeypatch) -> None:
    """A tensor larger than the largest storage binding is bound as several chunks (a 3 GB model's embedding on a
    128 MiB binding limit): forced here with a 1 KiB limit, so a 12 KiB table and a 4 KiB weight are split."""
    monkeypatch.setenv("NPUSIM_WEBGPU_MAX_BINDING", "1024")

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(96, 32)
            self.lin = torch.nn.Linear(32, 32)

        def forward(self, ids):
            return torch.nn.functional.gelu(self.lin(self.emb(ids))) * 2

    ids = torch.tensor([[0, 95, 40, 7, 64, 33]])
    ir, got, ref = run_module(webgpu, M, [ids])
    np.testing.assert_allclose(got[0], ref[0].numpy(), rtol=1e-4, atol=1e-4)
    prog = npu_compiler.compile(ir, "webgpu", dtype="float32")
    caps = DeviceCaps(max_binding_bytes=1024, max_bindings=32)
    rendered = WebGPUTarget(caps=caps).render_program(prog)
    chunked = [b for steps in rendered.steps for d in steps for b in d.bindings if b.offset > 0]
    assert chunked and all(b.offset % 256 == 0 and b.size <= 1024 for b in chunked)


def test_float16_without_shader_f16_gives_the_same_bits(webgpu, monkeypatch) -> None:
    """float16 is stored natively (`array<f16>`) with the adapter's shader-f16 and as 16-bit words without it;
    both round in integer arithmetic, so the two give identical bits."""
    torch.manual_seed(0)

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.lin = torch.nn.Linear(8, 5)

        def forward(self, x):
            y = torch.relu(self.conv(x)).mean((2, 3))
            return torch.softmax(self.lin(y), -1), y.exp()

    x = torch.randn(2, 3, 9, 7).half()
    outs = {}
    for native in ("1", "0"):
        monkeypatch.setenv("NPUSIM_WEBGPU_F16", native)
        _, got, ref = run_module(webgpu, lambda: M().half(), [x])
        outs[native] = got
    for a, b, r in zip(outs["1"], outs["0"], ref):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
        np.testing.assert_allclose(np.asarray(a, np.float32), r.float().numpy(), rtol=2e-2, atol=2e-3)


def test_int64_arithmetic_leaving_int32_is_reported(webgpu) -> None:
    """int64 computes in int32 (WGSL has no 64-bit integers): a product that leaves int32 is reported after the
    run, naming the kernel, rather than returned wrapped."""
    f = lambda i, j: i * j + 1  # noqa: E731
    small = torch.tensor([3, -50000, 7]), torch.tensor([5, 50000, -9])
    ir = export_ir(lambda: Fn(f), small)
    prog = npu_compiler.compile(ir, "webgpu")
    ex = webgpu.create_executor(prog)
    names = [s.name for s in prog.inputs]
    with pytest.raises(NPURuntimeError, match=r"kernel k\d+.*left the int32 range"):
        ex.run_numpy(dict(zip(names, (t.numpy() for t in small))))
    ok = torch.tensor([3, -4000, 7]), torch.tensor([5, 4000, -9])
    got = ex.run_numpy(dict(zip(names, (t.numpy() for t in ok))))[prog.outputs[0].name]
    np.testing.assert_array_equal(got, f(*ok).numpy())


def test_wrong_target_and_weights_are_refused(webgpu) -> None:
    ir = export_ir(lambda: torch.nn.Linear(4, 3), [torch.zeros(2, 4)])
    with pytest.raises(NPURuntimeError, match="target 'webgpu'"):
        webgpu.create_executor(npu_compiler.compile(ir, "cpu", dtype="float32"))
    prog = npu_compiler.compile(ir, "webgpu", dtype="float32")
    cpu_weights = npu_runtime.load_weights(prog, {"weight": np.zeros((3, 4), np.float32),
                                                  "bias": np.zeros(3, np.float32)}, npu_runtime.get_backend("cpu"))
    with pytest.raises(WeightError, match="not a webgpu device buffer"):
        webgpu.create_executor(prog).run({prog.inputs[0].name: np.zeros((2, 4), np.float32)}, cpu_weights)


def _resnet_artifact(tmp_path):
    from npu_export import resnet
    from npu_export.cnn import export_cnn

    torch.manual_seed(0)
    res = export_cnn(resnet.resnet18(num_classes=10, width=8).eval(), (1, 3, 32, 32), tmp_path, "r18")
    return res


def test_profile_one_timing_per_kernel(webgpu, tmp_path) -> None:
    """`Executor.profile`: GPU timestamps around each kernel's compute pass (host timing where the adapter has no
    timestamp queries); the profiled run computes what a plain run does."""
    res = _resnet_artifact(tmp_path)
    prog = npu_compiler.compile(res.ir_path, "webgpu", dtype="float16")
    ws = npu_runtime.load_weights(prog, res.weights_path, webgpu)
    ex = webgpu.create_executor(prog)
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    feed = {prog.inputs[0].name: x}
    timings = ex.profile(feed, ws)
    assert [t.index for t in timings] == list(range(len(prog.kernels)))
    assert all(t.dur_s >= 0 for t in timings) and sum(t.dur_s for t in timings) > 0
    assert all(a.start_s <= b.start_s for a, b in zip(timings, timings[1:]))
    if "timestamp-query" in webgpu.state.features:
        assert "timestamps" in ex.profile_method
    profiled = {k: v.to_numpy() for k, v in ex.outputs().items()}
    plain = {k: v.to_numpy() for k, v in ex.run(feed, ws).items()}
    for k in plain:
        assert profiled[k].tobytes() == plain[k].tobytes()


def test_cli_reports_the_adapter(webgpu, tmp_path, capsys) -> None:
    """describe, run, verify and profile name the adapter; describe --source prints the WGSL; verify --per-node
    compares every kernel's output on the device."""
    import json

    from npusim.cli import main

    res = _resnet_artifact(tmp_path)
    art = tmp_path / "r18.npubin"
    assert main(["compile", str(res.ir_path), "-o", str(art), "--target", "webgpu"]) == 0
    capsys.readouterr()
    name = webgpu.state.info["device"]
    assert main(["describe", str(art)]) == 0
    assert f"device: {name}" in capsys.readouterr().out
    assert main(["describe", str(art), "--source", "0"]) == 0
    out = capsys.readouterr().out
    assert "@compute @workgroup_size" in out and "fn npu_kernel" in out
    assert main(["run", str(art), "--weights", str(res.weights_path), "--backend", "webgpu", "--iters", "2",
                 "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("run r18 on webgpu") and f"device: {name}" in out
    assert main(["run", str(art), "--weights", str(res.weights_path), "--backend", "webgpu", "--iters", "1",
                 "--warmup", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["device"].startswith(name)
    assert main(["verify", str(res.ir_path), "--weights", str(res.weights_path), "--backend", "webgpu",
                 "--per-node"]) == 0
    out = capsys.readouterr().out
    assert f"device: {name}" in out and "per-node: all" in out and out.rstrip().endswith("PASS")
    assert main(["profile", str(art), "--weights", str(res.weights_path), "--backend", "webgpu", "--iters", "2",
                 "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    assert f"device: {name}" in out and "kernel times:" in out


def test_unavailable_reason_names_the_fix(monkeypatch) -> None:
    """Without wgpu, or with only an OpenGL adapter (wgpu's fallback where no Vulkan driver is installed), the
    backend is unavailable and says why and what to install."""
    from types import SimpleNamespace

    from npu_runtime.webgpu import backend as wb

    def fake_wgpu(adapter):
        return lambda: SimpleNamespace(gpu=SimpleNamespace(request_adapter_sync=lambda **kw: adapter))

    def missing():
        raise ImportError("No module named 'wgpu'")

    cases = [(missing, ["wgpu is not installed", ".[webgpu]"]),
             (fake_wgpu(None), ["no WebGPU adapter", "mesa-vulkan-drivers"]),
             (fake_wgpu(SimpleNamespace(info={"backend_type": "OpenGL", "device": "llvmpipe"})),
              ["only a OpenGL adapter (llvmpipe)", "mesa-vulkan-drivers libvulkan1"])]
    try:
        for fake, words in cases:
            monkeypatch.setattr(wb, "_wgpu", fake)
            wb._adapter.cache_clear()
            why = wb.unavailable_reason()
            assert why is not None and all(w in why for w in words), why
    finally:
        monkeypatch.undo()
        wb._adapter.cache_clear()
    assert wb.unavailable_reason() is None


@pytest.mark.parametrize("mode", ["corrected", "fused"])
def test_quotient_correction(webgpu, mode: str) -> None:
    """Where a device's division is not correctly rounded (WGSL allows 2.5 ulp), kernels correct their quotients:
    given quotients up to 3 ulps off, the correction returns IEEE's, in every sign, at every exponent whose quotient
    is normal (subnormal ones keep the device's, which may flush them: WGSL allows it). "fused" computes
    the residual with `fma`, which only a device whose `fma` rounds once can run (lavapipe's rounds twice)."""
    from npu_compiler.targets.webgpu.language import helpers_for

    if mode == "fused" and not webgpu.state.fused_fma:
        pytest.skip(f"this device's fma rounds twice ({webgpu.state.describe()})")

    rng = np.random.default_rng(1)
    n = 1 << 14
    a = (rng.uniform(1, 2, n) * 2.0 ** rng.integers(-126, 127, n) * rng.choice([-1, 1], n)).astype(np.float32)
    b = (rng.uniform(1, 2, n) * 2.0 ** rng.integers(-126, 127, n) * rng.choice([-1, 1], n)).astype(np.float32)
    with np.errstate(over="ignore", under="ignore"):
        q = a / b
    off = rng.integers(-3, 4, n)
    bits = q.view(np.int32) + off * np.where(q > 0, 1, -1)  # `off` ulps away, toward or away from zero
    qbad = bits.astype(np.int32).view(np.float32)
    body = """
@group(0) @binding(0) var<storage, read_write> io: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let n = arrayLength(&io) / 4u;
  let i = gid.x;
  if (i < n) { io[3u * n + i] = npu_fix_quotient(io[i], io[n + i], io[2u * n + i]); }
}"""
    src = "\n".join(helpers_for(body, mode)) + body
    got = run_f32_shader(webgpu.state, src, np.concatenate([a, b, qbad, np.zeros(n, np.float32)]), n // 64)[3 * n:]
    # corrected: a normal device quotient whose IEEE quotient is normal too (not asserted: one that rounds to a
    # subnormal is rounded twice, at 24 bits then at the subnormal's, and one that overflows meets SPIR-V's ldexp,
    # undefined past the largest float); kept: every other device quotient
    kept = ~((np.abs(qbad) >= 2.0**-126) & np.isfinite(qbad))
    fixed = ~kept & (np.abs(q) >= 2.0**-126) & np.isfinite(q)
    assert fixed.mean() > 0.4 and (np.abs(q[fixed]) > 2.0**36).any() and (np.abs(q[fixed]) < 2.0**-36).any()
    assert (qbad[fixed] != q[fixed]).mean() > 0.5
    np.testing.assert_array_equal(got[fixed], q[fixed])
    np.testing.assert_array_equal(got[kept], qbad[kept])


def test_corrected_division_end_to_end(webgpu, monkeypatch) -> None:
    """NPUSIM_WEBGPU_DIVISION=corrected (fused, where the device's fma rounds once) renders every division through
    the correction: its quotients are IEEE's, and on a device whose own division is correctly rounded it changes no
    bit."""
    torch.manual_seed(0)
    x, y = torch.randn(33, 13) * 100, torch.rand(13) + 0.01
    f = lambda a, b: (a / b, a / 3.0, torch.sigmoid(a), torch.softmax(a, -1))  # noqa: E731
    outs = {}
    corrected = "fused" if webgpu.state.fused_fma else "corrected"
    for mode in ("exact", corrected):
        monkeypatch.setenv("NPUSIM_WEBGPU_DIVISION", mode)
        _, got, ref = run_module(webgpu, lambda: Fn(f), [x, y])
        outs[mode] = got
    for got, r in zip(outs[corrected][:2], ref[:2]):
        np.testing.assert_array_equal(got, r.numpy())
    if webgpu.state.exact_division:
        for a, b in zip(outs["exact"], outs[corrected]):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_subnormal_probe_tells_the_truth(webgpu) -> None:
    """The probe says whether the device flushes subnormal f32 results (WGSL allows it); a kernel's results agree:
    the exact subnormal products and quotients where it does not flush, signed zeros where it does."""
    x = torch.tensor([2.0**-126, -(2.0**-125), 3e38, 1.0])
    f = lambda a: (a * 0.25, 1.0 / a)  # noqa: E731
    _, got, ref = run_module(webgpu, lambda: Fn(f), [x])
    for g, r in zip(got, ref):
        want = r.numpy()
        if webgpu.state.flushes_subnormals:
            want = np.where(np.abs(want) < np.finfo(np.float32).tiny, np.copysign(np.float32(0), want), want)
        assert np.asarray(g).tobytes() == want.tobytes(), (g, want)


def test_products_kept_rounded(webgpu, monkeypatch) -> None:
    """Where the device fuses x*y + z (Vulkan allows it; WGSL cannot forbid it), generated kernels keep products
    rounded as the op-by-op reference does (NPUSIM_WEBGPU_PRODUCTS=opaque, chosen by a probe). The chains are exact
    against PyTorch either way, and on a device that does not fuse the two renderings give the same bits."""
    torch.manual_seed(0)
    x, y = torch.randn(33, 13) * 3, torch.randn(13)
    f = lambda a, b: (a * b + b, (a + 0.1) * b - a, a * a - b * b)  # noqa: E731
    outs = {}
    for mode in ("plain", "opaque"):
        monkeypatch.setenv("NPUSIM_WEBGPU_PRODUCTS", mode)
        ir, got, ref = run_module(webgpu, lambda: Fn(f), [x, y])
        outs[mode] = got
        prog = npu_compiler.compile(ir, "webgpu", dtype="float32")
        zero = [b for steps in webgpu.create_executor(prog).rendered.steps for d in steps for b in d.bindings
                if b.ptr[0] == "zero"]
        assert bool(zero) == (mode == "opaque")
    for got, r in zip(outs["opaque"], ref):
        np.testing.assert_array_equal(got, r.numpy())
    if not webgpu.state.fuses_products:
        for a, b in zip(outs["plain"], outs["opaque"]):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_argmax_in_chunks_is_torch_argmax(webgpu, dtype) -> None:
    """The greedy step's two-stage argmax (4,096 logits in 4 chunks: chunk maxima and first indices in the arena,
    then the first chunk holding the largest) against torch.argmax."""
    from helpers import check_greedy_argmax

    check_greedy_argmax(webgpu, 4096, dtype, kernels=3)
