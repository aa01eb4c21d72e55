"""The hip target without an AMD GPU (none is reachable: the target is compile-only). Rendering: every kernel kind the
target declares renders as HIP C++ sized from the device profile (wavefront width, LDS, compute units), with HIP's
headers and none of the CUDA-only features; the hipBLAS plans compute the record's product (checked by emulating
the column-major call in NumPy); the CLI compiles and describes a hip artifact and says that nothing runs it.
hipcc (Debian's `hipcc` package; skipped where it is absent, CI installs it): every kernel of the op conformance
table, a ResNet-50 and the tiny Qwen2 programs compile for gfx90a (MI200), each distinct source once, many in one
translation unit, units in parallel (targets/hip/hipcc.py)."""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Iterable, Iterator

import msgpack
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_ir")

from fused_cases import build, module_weights, op_cases  # noqa: E402
from helpers import check_gemm_plan  # noqa: E402

import npu_compiler  # noqa: E402
from npu_compiler.devices import CHIPS  # noqa: E402
from npu_compiler.errors import ArtifactError, NPUCompileError  # noqa: E402
from npu_compiler.program import _HEADER, CompiledProgram  # noqa: E402
from npu_compiler.targets.codegen import DEVICE_ENV, get_codegen_target  # noqa: E402
from npu_compiler.targets.hip import Blas, HipTarget, RenderedProgram, SourceLaunch, hipcc  # noqa: E402

MI250X = CHIPS["mi250x"]
HIPCC_REASON = "hipcc is absent: apt-get install hipcc (Debian 12's ROCm 5.2)"
needs_hipcc = pytest.mark.skipif(not hipcc.available(), reason=HIPCC_REASON)
# what a source of the hip target never holds: CUDA's headers and types, and the NVIDIA-only features (programmatic
# dependent launch, cp.async, ldmatrix, mma.sync, the warpgroup MMA, TMA, 32-lane full-mask shuffles)
CUDA_ONLY = ("cuda_fp16", "cuda_bf16", "__nv_bfloat16", "griddepcontrol", "npu_wait_prior", "cp.async", "ldmatrix",
             "mma.sync", "wgmma", "cp.async.bulk", "__shfl_xor_sync", "0xffffffffu", "__cluster_dims__", "asm volatile")

CASES = {c.name: c for c in op_cases()}


@functools.cache
def case_program(name: str, dtype: str, device: str = "mi250x") -> CompiledProgram:
    _, ir, _ = build(CASES[name], dtype)
    return npu_compiler.compile(ir, "hip", dtype=dtype, device=device)


def rendered(program: CompiledProgram, device=MI250X) -> RenderedProgram:
    return HipTarget(device).render_program(program)


def _sources_of(program: CompiledProgram, kind: str, device=MI250X) -> list[str]:
    target = HipTarget(device)
    return [s for k in program.kernels if k.kind == kind for s in target.kernel_sources(k, program)]


def _check_hip_only(sources) -> None:
    for text in sources:
        assert text.startswith("#include <hip/hip_runtime.h>") or text.startswith("// "), text[:200]
        found = [s for s in CUDA_ONLY if s in text]
        assert not found, f"{found} in\n{text}"


# ---- the target and its profile --------------------------------------------------------------------------------------


def test_target_plans_for_an_amd_profile(monkeypatch) -> None:
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    t = get_codegen_target("hip")
    assert isinstance(t, HipTarget) and t.profile is MI250X and t.lang.warp_width == 64
    assert get_codegen_target("hip", "mi300x").profile.arch == "gfx942"
    for device in ("h100", CHIPS["a100"], "webgpu"):
        with pytest.raises(NPUCompileError, match="AMD"):
            get_codegen_target("hip", device)
    _, ir, _ = build(CASES["binary_broadcast"], "float32")
    with pytest.raises(NPUCompileError, match="AMD"):
        npu_compiler.compile(ir, "hip", device="h200")


def test_block_reductions_shuffle_over_the_profiles_wavefront() -> None:
    program = case_program("softmax_last", "float32")
    (text,) = _sources_of(program, "generated")
    assert "__shfl_xor(v, o, 64)" in text and "for (int o = 32; o > 0; o >>= 1)" in text
    assert "(threadIdx.x & 63) == 0" in text and "npu_sh_f[16]" in text  # 1,024 threads a block: 16 wavefronts
    launch = rendered(program).steps[0][0].launch
    assert launch.block % 64 == 0, launch  # a block is whole wavefronts
    # the same record for a device of 32-wide wavefronts: the pattern follows the profile, not a literal
    narrow = MI250X.replace(name="amd-wave32", warp_width=32)
    (text32,) = _sources_of(program, "generated", narrow)
    assert "__shfl_xor(v, o, 32)" in text32 and "for (int o = 16; o > 0; o >>= 1)" in text32
    assert "npu_sh_f[32]" in text32 and "__AMDGCN_WAVEFRONT_SIZE != 32" in text32


def test_attention_is_sized_from_the_profile() -> None:
    program = case_program("sdpa_gqa_mask", "float32")
    k = next(k for k in program.kernels if k.kind == "attention")
    (text,) = _sources_of(program, "attention")
    # head dim over the wavefront's lanes; few rows (fewer than two a compute unit): eight wavefronts a row
    assert "lane + 64 * p" in text and "threadIdx.x & 63" in text and "__shfl_xor(s, off, 64)" in text
    assert rendered(program).steps[program.kernels.index(k)][0].launch.block == 512
    one_cu = MI250X.replace(name="amd-1cu", multiprocessors=1)
    assert rendered(program, one_cu).steps[program.kernels.index(k)][0].launch.block == 256
    # the block's LDS (each wavefront's output row) fits the device's: fewer wavefronts where it holds less
    small = MI250X.replace(name="amd-small-lds", shared_memory_per_block=1024, shared_memory_per_block_optin=1024,
                           shared_memory_per_multiprocessor=1024)
    launch = rendered(program, small).steps[program.kernels.index(k)][0].launch
    assert launch.block == 64 * 2  # 2 x (64 lanes x 4 B + 8 B) + 16 x 8 B of the valid length's reduction <= 1 KiB
    tiny = small.replace(name="amd-tiny-lds", shared_memory_per_block=256, shared_memory_per_block_optin=256,
                         shared_memory_per_multiprocessor=256)
    with pytest.raises(NPUCompileError, match="LDS"):
        rendered(program, tiny)


def test_attention_computes_a_call_of_another_targets_plan_without_it() -> None:
    """A call that carries key splits (a cuda plan) renders as the hip target's one-block-a-row kernel: its scratch
    is one more pointer, passed and unused."""
    import dataclasses

    from npu_compiler.kernels import AttentionPlan

    program = case_program("sdpa_gqa_mask", "float32")
    index, k = next((i, k) for i, k in enumerate(program.kernels) if k.kind == "attention")
    scratch = program.kernels[index].outs[0]  # (a float32 view standing in for the plan's scratch)
    split = dataclasses.replace(k, plan=AttentionPlan(splits=2), scratch=[scratch])
    (step,) = HipTarget(MI250X).render_kernel(split, program)
    text, launch = step[1]
    assert "float* out1" in text and "out1[" not in text and ("out", 1) in launch.ptrs
    assert launch.ptrs[:1] + launch.ptrs[2:] == rendered(program).steps[index][0].launch.ptrs


@pytest.mark.parametrize("kind,name,dtype", [("generated", "softmax_last", "bfloat16"),
                                             ("gemm", "linear_bias", "float16"),
                                             ("conv2d", "conv_groups_dil", "bfloat16"),
                                             ("attention", "sdpa_gqa_mask", "bfloat16")])
def test_every_declared_kind_renders(kind: str, name: str, dtype: str) -> None:
    assert kind == "generated" or kind in HipTarget.library_kernels
    program = case_program(name, dtype)
    r = rendered(program)
    assert len(r.steps) == len(program.kernels) and all(r.steps)
    sources = _sources_of(program, kind)
    assert sources
    _check_hip_only(sources)
    if kind == "gemm":  # bias fill -> hipBLAS -> (no epilogue here)
        k = next(i for i, k in enumerate(program.kernels) if k.kind == "gemm")
        assert [type(s) for s in r.steps[k]] == [SourceLaunch, Blas]
        assert "hipblasGemmStridedBatchedEx(handle, HIPBLAS_OP_" in sources[-1]
    if dtype == "bfloat16":
        assert any("hip_bfloat16" in s for s in sources)


def test_the_lowering_takes_the_hip_targets_choices() -> None:
    """Prefill's attention over many rows runs on hipBLAS around a row softmax; a decode step's stays one kernel
    without key splits; a k x k conv of one group is im2col + hipBLAS, a grouped one the portable conv."""
    program = case_program("conv_groups_dil", "float32")
    assert {k.kind for k in program.kernels} >= {"conv2d"}
    assert all(not k.spec.splits for k in program.kernels if k.kind == "attention")


# ---- hipBLAS plans ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["linear_bias", "linear_nobias", "matmul_batched", "matmul_transposed",
                                  "matmul_broadcast", "matvec", "addmm"])
def test_hipblas_plan_matches_numpy(name: str) -> None:
    program = case_program(name, "float32")
    rng = np.random.default_rng(0)
    r = rendered(program)
    plans = 0
    for index, k in enumerate(program.kernels):
        for step in r.steps[index]:
            if not isinstance(step, Blas):
                continue
            plan, plans = step.plan, plans + 1
            assert (plan["type_a"], plan["type_c"], plan["compute"]) == ("HIP_R_32F", "HIP_R_32F",
                                                                         "HIPBLAS_COMPUTE_32F")
            check_gemm_plan(program, k, plan, rng)
    assert plans


# ---- the CLI: compile, describe, and no runtime ----------------------------------------------------------------------


def test_compile_describe_and_no_runtime(tmp_path, capsys, monkeypatch) -> None:
    from npusim.cli import main

    monkeypatch.delenv(DEVICE_ENV, raising=False)
    module, ir, _ = build(CASES["linear_bias"], "float32")
    (tmp_path / "m.json").write_text(json.dumps(ir))
    art = tmp_path / "m.npubin"
    assert main(["compile", str(tmp_path / "m.json"), "--target", "hip", "-o", str(art)]) == 0
    out = capsys.readouterr().out
    assert "planned for AMD Instinct MI250X" in out and "npusim has no HIP runtime" in out
    prog = CompiledProgram.load(str(art))
    assert prog.target == "hip" and prog.device == MI250X
    d = msgpack.unpackb(prog.to_bytes()[_HEADER.size:], raw=False)
    with pytest.raises(ArtifactError, match="for target 'hip'"):  # a crafted artifact: an NVIDIA device for hip
        CompiledProgram.from_dict({**d, "device": CHIPS["h100"].to_dict()})
    assert main(["describe", str(art), "--source", "0"]) == 0
    out = capsys.readouterr().out
    assert "---- hip source 1/" in out and "#include <hip/hip_runtime.h>" in out
    assert "hipblasGemmStridedBatchedEx(handle" in out
    weights = tmp_path / "w.safetensors"
    from safetensors.torch import save_file

    save_file(module_weights(module), str(weights))
    for extra in ([], ["--backend", "hip"]):
        assert main(["run", str(art), "--weights", str(weights), *extra]) == 1
        assert "npusim has no HIP runtime" in capsys.readouterr().err
    # $NPUSIM_DEVICE chooses the device of every GPU target a process compiles for (the GPU suite sets an NVIDIA
    # one): for hip, an NVIDIA row is refused naming the variable, the device and the target
    monkeypatch.setenv(DEVICE_ENV, "a100")
    assert main(["compile", str(tmp_path / "m.json"), "--target", "hip", "-o", str(tmp_path / "a.npubin")]) != 0
    err = capsys.readouterr().err
    assert "NPUSIM_DEVICE='a100'" in err and "target 'hip'" in err and "NVIDIA A100" in err, err
    assert not (tmp_path / "a.npubin").exists()
    assert main(["compile", str(tmp_path / "m.json"), "--target", "hip", "--device", "mi250x", "-o",
                 str(tmp_path / "b.npubin")]) == 0, capsys.readouterr().err


# ---- hipcc ---------------------------------------------------------------------------------------------------------


def _compile_with_hipcc(programs: Iterable[tuple[str, CompiledProgram]]) -> set[str]:
    """Render every (name, program) for the MI250X, check that its sources are HIP's, compile them with hipcc (as
    they come: producing the programs overlaps compiling the sources of those before); returns the kernel kinds
    seen."""
    target = HipTarget(MI250X)
    names: dict[str, str] = {}
    kinds: set[str] = set()

    def sources() -> Iterator[str]:
        for name, program in programs:
            r = target.render_program(program)
            assert len(r.steps) == len(program.kernels) and all(r.steps), name
            kinds.update(k.kind for k in program.kernels)
            for key, text in r.sources.items():
                if text not in names:
                    names[text] = f"{name}/{key}"
                    _check_hip_only([text])
                    yield text

    failures = hipcc.check_sources(sources(), target.lang.prelude, MI250X.arch)
    assert not failures, "\n\n".join(f"{names[t]}: {e[:3000]}\n----\n{t}" for t, e in list(failures.items())[:3])
    return kinds


@needs_hipcc
def test_hipcc_names_a_source_it_rejects() -> None:
    prelude = HipTarget(MI250X).lang.prelude
    good = prelude + 'extern "C" __global__ void __launch_bounds__(64) npu_kernel(float* out0) { out0[0] = 1.0f; }\n'
    bad = prelude + 'extern "C" __global__ void __launch_bounds__(64) npu_kernel(float* out0) { out0[0] = nope; }\n'
    failures = hipcc.check_sources([good, bad, good.replace("1.0f", "2.0f")], prelude, unit=3)
    assert list(failures) == [bad] and "nope" in failures[bad]
    with pytest.raises(NPUCompileError, match="gfx942"):
        hipcc.check_sources([good], prelude, "gfx942")


@needs_hipcc
def test_a_source_compiles_only_for_the_wavefront_width_it_was_rendered_for(tmp_path) -> None:
    """gfx1030 (RDNA2) runs 32-wide wavefronts: a source rendered for the MI250X's 64 stops at its guard."""
    import subprocess

    (text,) = _sources_of(case_program("softmax_last", "float32"), "generated")
    src = tmp_path / "k.hip"
    src.write_text(text)
    done = subprocess.run([hipcc.hipcc_path(), "--offload-arch=gfx1030", *hipcc.FLAGS, str(src), "-o",
                           str(tmp_path / "k.hsaco")], env={**os.environ, **hipcc.ENV}, capture_output=True, text=True)
    assert done.returncode != 0 and "rendered for 64-wide wavefronts" in done.stderr


@needs_hipcc
def test_op_conformance_table_compiles_with_hipcc() -> None:
    from conftest import export_ir
    from test_op_conformance import CASES as TABLE

    def export(c, dt) -> dict:
        torch.manual_seed(0)
        make = (lambda: c.make().to(dt)) if dt.is_floating_point else c.make
        return export_ir(make, c.inputs(dt))

    def programs() -> Iterator[tuple[str, CompiledProgram]]:
        # A case's float dtypes share one export (its float32 graph, else its first float one) compiled at each
        # compute dtype, as `--dtype` compiles a checkpoint: the kernels are each dtype's, and exporting, not
        # compiling or hipcc, is most of this test's time. A dtype that graph does not compile at is exported apart.
        for c in TABLE:
            floats = [dt for dt in c.dtypes if dt.is_floating_point]
            shared = export(c, torch.float32 if torch.float32 in floats else floats[0]) if floats else None
            for dt in c.dtypes:
                dtype = str(dt).removeprefix("torch.") if dt.is_floating_point else None
                try:
                    if shared is None or dtype is None:
                        raise NPUCompileError("exported apart")
                    program = npu_compiler.compile(shared, "hip", dtype=dtype, device="mi250x")
                except NPUCompileError:
                    program = npu_compiler.compile(export(c, dt), "hip", dtype=dtype, device="mi250x")
                yield f"{c.name}/{dt}", program

    kinds = _compile_with_hipcc(programs())
    assert kinds == {"generated", "gemm", "conv2d", "attention"}


@needs_hipcc
def test_model_programs_compile_with_hipcc() -> None:
    """A ResNet-50 (fp16, batch 1 and 2: its batch folded into the GEMMs) and the tiny Qwen2's programs (eager
    attention in fp32 and SDPA in bf16, prefill and decode, fused and unfused, and a prefill of 64 tokens whose
    attention runs on hipBLAS around a row softmax)."""
    from conftest import export_ir

    from npu_export.qwen2 import export_qwen2, tiny_qwen2_config
    from npu_export.resnet import resnet50

    unfused = [p for p in npu_compiler.OPTIONAL_PASSES if p != "bn_fold"]

    def programs() -> Iterator[tuple[str, CompiledProgram]]:
        for n in (1, 2):
            ir = export_ir(resnet50, [torch.empty(n, 3, 224, 224)], "resnet50")
            yield f"resnet50/b{n}", npu_compiler.compile(ir, "hip", dtype="float16", device="mi250x")
        with tempfile.TemporaryDirectory() as tmp:
            for attn, dt, prefill in (("eager", "float32", 8), ("sdpa", "bfloat16", 8), ("sdpa", "bfloat16", 64)):
                out = os.path.join(tmp, f"{attn}_{dt}_{prefill}")
                export_qwen2(tiny_qwen2_config(), out, max_cache_len=96, prefill_len=prefill, dtype=dt,
                             attn_implementation=attn)
                for graph in ("prefill", "decode"):
                    with open(os.path.join(out, f"{graph}.json")) as f:
                        ir = json.load(f)
                    name = f"qwen2/{attn}/{dt}/{prefill}/{graph}"
                    program = npu_compiler.compile(ir, "hip", dtype=dt, device="mi250x")
                    if prefill >= HipTarget.attention_gemm_min_rows and graph == "prefill":
                        assert not any(k.kind == "attention" for k in program.kernels)  # on hipBLAS
                    yield name, program
                    if prefill < HipTarget.attention_gemm_min_rows:
                        yield name + "/unfused", npu_compiler.compile(ir, "hip", dtype=dt, device="mi250x",
                                                                      disable_passes=unfused)

    assert _compile_with_hipcc(programs()) == {"generated", "gemm", "attention"}
