"""Plans for every GPU of the chip table, checked without a GPU.

For each NVIDIA profile of `devices.py` (H100, H200, A100, L4, RTX 4090, B200), the seed models (ResNet-50 at
batch 1 and 64, the tiny Qwen2's prefill and decode, Qwen2.5-1.5B's real widths) and every op conformance case that
lowers to a library kernel (GEMMs, convolutions, attention: the records whose plans depend on the device) compile
for that device and render within its limits: threads a block, shared memory a block may opt in to, grid sizes, and
no instruction the device lacks (the warpgroup MMA only on Hopper, TMA and clusters from sm_90, mma.sync from sm_80).
The WebGPU row renders the same programs for the webgpu target. For the A100 (sm_80) and the B200 (sm_100), the
library kernels' sources compile with NVRTC for those architectures and, where ptxas is installed, assemble for
them within their registers and shared memory. (Elementwise and row kernels are the same text on every device:
tests/test_cuda_codegen.py compiles them.)"""

from __future__ import annotations

import functools
import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_ir")

import npu_compiler  # noqa: E402
from npu_compiler.devices import CHIPS  # noqa: E402
from npu_compiler.kernels import GeneratedKernel  # noqa: E402
from npu_compiler.lowering.registry import KERNELS_OF  # noqa: E402
from npu_compiler.targets.cuda import CudaTarget, nvrtc  # noqa: E402
from npu_compiler.targets.cuda.target import SourceLaunch  # noqa: E402
from npu_compiler.targets.webgpu import DeviceCaps, WebGPUTarget  # noqa: E402

NVIDIA = [name for name, p in CHIPS.items() if p.vendor == "nvidia"]
MAX_GRID_YZ = 65535  # CUDA's grid limit in y and z (x: 2**31 - 1)


@functools.cache
def _irs() -> dict[str, tuple[dict, dict]]:
    """name -> (IR dict, compile options): the seed models and the op cases with library kernels, exported once."""
    import json
    import tempfile

    from conftest import export_ir
    from test_op_conformance import CASES

    from npu_export.qwen2 import export_qwen2, qwen2_config, tiny_qwen2_config
    from npu_export.resnet import resnet50

    irs: dict[str, tuple[dict, dict]] = {}
    for batch in (1, 64):
        irs[f"resnet50_b{batch}"] = (export_ir(resnet50, [torch.empty(batch, 3, 224, 224)], "resnet50"),
                                     {"dtype": "float16"})
    with tempfile.TemporaryDirectory() as tmp:
        real = qwen2_config("qwen2.5-1.5b")
        real.num_hidden_layers = 2  # every kernel shape of the 28 layers
        for name, cfg, cache, prefill in (("qwen2_tiny", tiny_qwen2_config(), 32, 8), ("qwen2.5_1.5b", real, 2560,
                                                                                        2048)):
            exp = export_qwen2(cfg, os.path.join(tmp, name), max_cache_len=cache, prefill_len=prefill,
                               dtype="bfloat16", attn_implementation="sdpa")
            for graph in ("prefill", "decode"):
                with open(getattr(exp, f"{graph}_path")) as f:
                    irs[f"{name}_{graph}"] = (json.load(f), {"rope_theta": exp.cache_map["rope"]["theta"]})
    library_ops = {op for op, kinds in KERNELS_OF.items() if kinds}
    for c in CASES:
        if not (set(c.ops) & library_ops or c.name.startswith("fused_")):
            continue
        dt = next((d for d in c.dtypes if d in (torch.bfloat16, torch.float16)), c.dtypes[0])
        torch.manual_seed(0)
        inputs = c.inputs(dt)
        make = (lambda c=c, dt=dt: c.make().to(dt)) if dt.is_floating_point else c.make
        dtype = str(dt).removeprefix("torch.") if dt.is_floating_point else None
        irs[f"op_{c.name}"] = (export_ir(make, inputs, c.name), {"dtype": dtype})
    return irs


@functools.cache
def _programs(target: str, device: str) -> dict:
    return {name: npu_compiler.compile(ir, target, device=device, **kw) for name, (ir, kw) in _irs().items()}


def _launch_problems(dev, name: str, text: str, launch) -> list[str]:
    out = []
    if launch.block > dev.max_threads_per_block:
        out.append(f"{launch.block} threads a block (at most {dev.max_threads_per_block})")
    if launch.smem > dev.shared_memory_per_block_optin:
        out.append(f"{launch.smem} bytes of dynamic shared memory (at most {dev.shared_memory_per_block_optin})")
    if launch.grid[0] > 2**31 - 1 or max(launch.grid[1:]) > MAX_GRID_YZ or min(launch.grid) < 0:
        out.append(f"grid {launch.grid}")
    for marker, has in ((nvrtc.ARCH_SPECIFIC, dev.warpgroup_mma), ("wgmma.", dev.warpgroup_mma),
                        ("cp.async.bulk", dev.tma), ("__cluster_dims__", dev.cluster_blocks > 0),
                        ("mma.sync", dev.has_mma("mma.sync")), ("cp.async.", dev.async_copy)):
        if marker in text and not has:
            out.append(f"uses {marker!r}, which {dev.name} lacks")
    clusters = re.findall(r"__cluster_dims__\(1, 1, (\d+)\)", text)
    if any(int(z) > dev.cluster_blocks for z in clusters):
        out.append(f"clusters of {clusters} blocks (at most {dev.cluster_blocks})")
    return [f"{name}: {p}" for p in out]


@pytest.mark.parametrize("device", NVIDIA)
def test_every_plan_fits_its_device(device: str) -> None:
    dev = CHIPS[device]
    target = CudaTarget(device)
    problems, launches = [], 0
    for name, program in _programs("cuda", device).items():
        assert program.device == dev
        rendered = target.render_program(program)
        for steps in rendered.steps:
            for step in steps:
                if isinstance(step, SourceLaunch):
                    launches += 1
                    problems += _launch_problems(dev, name, rendered.sources[step.source], step.launch)
    assert launches > 250
    assert not problems, "\n".join(problems[:20])


def test_plans_differ_where_the_devices_do() -> None:
    """The seam is real: the same program is planned differently for an H100, an A100, an L4 and a B200 (grids
    sized for their SMs, Hopper's instructions only on Hopper), the same for an H100 and an H200."""
    def launches(device: str, name: str) -> list:
        program = _programs("cuda", device)[name]
        r = CudaTarget(device).render_program(program)
        return [(s.launch.grid, s.launch.block, s.launch.smem, r.sources[s.source]) for steps in r.steps
                for s in steps if isinstance(s, SourceLaunch)]

    names = ("resnet50_b1", "resnet50_b64", "qwen2.5_1.5b_prefill", "qwen2.5_1.5b_decode")
    h100 = [launches("h100", name) for name in names]
    assert [launches("h200", name) for name in names] == h100
    for other in ("a100", "l4", "b200"):
        differ = [name for name, mine in zip(names, h100, strict=True) if launches(other, name) != mine]
        assert "resnet50_b64" in differ and "qwen2.5_1.5b_decode" in differ, (other, differ)
    hopper = "".join(t for *_, t in launches("h100", "resnet50_b64"))
    assert "wgmma.mma_async" in hopper and nvrtc.ARCH_SPECIFIC in hopper
    for other in ("a100", "l4", "b200"):
        text = "".join(t for *_, t in launches(other, "resnet50_b64"))
        assert "mma.sync" in text and "wgmma" not in text, other


def test_every_program_renders_for_the_webgpu_row() -> None:
    # (bindings as a desktop adapter has them: a GEMM with a bias and a residual needs more than WebGPU's guaranteed 8)
    target = WebGPUTarget("webgpu", caps=DeviceCaps(max_bindings=16))
    for name, program in _programs("webgpu", "webgpu").items():
        assert program.device == CHIPS["webgpu"]
        for steps in target.render_program(program).steps:
            for d in steps:
                assert all(0 <= g <= 65535 for g in d.grid), (name, d.grid)


_RESOURCES = re.compile(r"Used (\d+) registers.*?(\d+) bytes smem", re.S)


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is absent (the project's cuda extra installs it)")
@pytest.mark.parametrize("device", ["a100", "b200"])
def test_library_kernels_compile_for_other_architectures(device: str) -> None:
    """NVRTC (13.0 knows sm_100) compiles the seed models' library kernels planned for the A100 (sm_80) and the B200
    (sm_100) for that architecture; ptxas, where installed, assembles them there within the registers a block has
    (registers a thread times threads) and the shared memory it may opt in to (static plus dynamic). One source of
    each form (the same text but for its numbers: the same code path over other sizes), the one with the most
    dynamic shared memory, to keep CI short."""
    dev = CHIPS[device]
    target = CudaTarget(device)
    forms: dict[str, tuple[str, str, int, int]] = {}  # form -> (source, where, threads, dynamic shared memory)
    for name, program in _programs("cuda", device).items():
        if name.startswith("op_"):
            continue
        rendered = target.render_program(program)
        for k, steps in zip(program.kernels, rendered.steps, strict=True):
            if isinstance(k.spec, GeneratedKernel):
                continue
            for s in steps:
                if isinstance(s, SourceLaunch):
                    text = rendered.sources[s.source]
                    form = re.sub(r"\d+", "#", text)
                    if form not in forms or forms[form][3] < s.launch.smem:
                        forms[form] = (text, f"{name}/{k.name}", s.launch.block, s.launch.smem)
    assert len(forms) > 15
    ptxas = nvrtc.ptxas_path()

    def check(item) -> str | None:
        text, where, threads, smem = item
        try:
            ptx = nvrtc.compile_source(text, nvrtc.target_for(text, f"compute_{dev.compute_capability}"),
                                       name=f"{device}.cu")
            if not ptxas:
                return None
            report = nvrtc.ptxas_check(ptx, nvrtc.target_for(text, dev.arch))
        except Exception as e:  # noqa: BLE001  (every failure, with where it came from)
            return f"{where}: {e}"
        for regs, static in _RESOURCES.findall(report):
            if int(regs) * threads > dev.registers_per_block or int(static) + smem > dev.shared_memory_per_block_optin:
                return f"{where}: {regs} registers x {threads} threads, {static} + {smem} bytes of shared memory"
        return None

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        failures = [f for f in pool.map(check, forms.values()) if f]
    assert not failures, "\n".join(failures[:5])
