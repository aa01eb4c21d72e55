"""The cuda target without a GPU: every CUDA C source that the test graphs and models produce compiles with NVRTC
(PTX for compute_90) and assembles with `ptxas -arch=sm_90`; the cuBLAS plans compute the right products (checked
by emulating cuBLAS's column-major semantics in NumPy)."""

from __future__ import annotations

import functools
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_ir")

from fused_cases import Fn, Lin, build, ir_dict, op_cases  # noqa: E402
from helpers import assert_waits_first, check_gemm_plan, emulate_blas, strided, turing_profile  # noqa: E402

import npu_compiler  # noqa: E402
from npu_compiler.devices import CHIPS  # noqa: E402
from npu_compiler.program import CompiledProgram, KernelCall  # noqa: E402
from npu_compiler.targets.cuda import CudaTarget, RenderedProgram, nvrtc  # noqa: E402
from npu_compiler.targets.cuda.common import literal  # noqa: E402
from npu_compiler.targets.cuda.target import Cublas, SourceLaunch  # noqa: E402

H100 = CHIPS["h100"]

NVRTC_REASON = "NVRTC is absent: pip install cuda-bindings==13.0.3 nvidia-cuda-nvrtc==13.0.88 " \
               "nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85"
needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason=NVRTC_REASON)

CASES = op_cases()
# every optional pass but BN folding: the program as the plain lowering makes it
UNFUSED = [p for p in npu_compiler.OPTIONAL_PASSES if p != "bn_fold"]


@functools.cache
def case_program(name: str, dtype: str) -> CompiledProgram:
    case = next(c for c in CASES if c.name == name)
    _, ir, _ = build(case, dtype)
    return npu_compiler.compile(ir, "cuda", dtype=dtype)


_RENDERED: dict[int, tuple[CompiledProgram, RenderedProgram]] = {}


def rendered(program: CompiledProgram) -> RenderedProgram:
    """The program's CUDA rendering, as the runtime makes it when it loads the program (cached per program)."""
    hit = _RENDERED.get(id(program))
    if hit is None or hit[0] is not program:
        hit = _RENDERED[id(program)] = (program, CudaTarget().render_program(program))
    return hit[1]


def _case_params():
    return [pytest.param(c.name, dt, id=f"{c.name}-{dt}") for c in CASES for dt in c.dtypes]


@functools.cache
def model_programs() -> dict[str, CompiledProgram]:
    """ResNet-18 (fp16) and the tiny Qwen2 (eager and sdpa attention; prefill and decode; bf16 and fp32)."""
    from fused_cases import ir_dict

    from npu_export.qwen2 import export_qwen2, tiny_qwen2_config
    from npu_export.resnet import resnet18

    progs: dict[str, CompiledProgram] = {}
    m = resnet18().eval()
    progs["resnet18"] = npu_compiler.compile(ir_dict(m, [torch.empty(2, 3, 64, 64)], "resnet18"), "cuda",
                                             dtype="float16")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for attn in ("eager", "sdpa"):
            for dt in ("bfloat16", "float32"):
                out = os.path.join(tmp, f"{attn}_{dt}")
                export_qwen2(tiny_qwen2_config(), out, max_cache_len=32, prefill_len=8, dtype=dt,
                             attn_implementation=attn)
                for g in ("prefill", "decode"):
                    with open(os.path.join(out, f"{g}.json")) as f:
                        ir = json.load(f)
                    progs[f"qwen2_{attn}_{g}_{dt}"] = npu_compiler.compile(ir, "cuda", dtype=dt)
                    # and unfused: the plain kernels (softmax, separate GEMMs) must compile too
                    progs[f"qwen2_{attn}_{g}_{dt}_unfused"] = npu_compiler.compile(ir, "cuda", dtype=dt,
                                                                                   disable_passes=UNFUSED)
    return progs


def _check_sources(sources: dict[str, str]) -> list[str]:
    """Compile every source (deduplicated) to PTX and assemble it, and check that it waits for the kernel before
    it first; returns the failures."""
    unique = {text: name for name, text in sources.items()}
    ptxas = nvrtc.ptxas_path()

    def one(item):
        text, name = item
        try:
            assert_waits_first(text)
            ptx = nvrtc.compile_source(text, nvrtc.target_for(text, "compute_90"), name=f"{name}.cu")
            assert b".entry npu_kernel" in ptx, "no npu_kernel entry in the PTX"
            if ptxas:
                nvrtc.ptxas_check(ptx, nvrtc.target_for(text, "sm_90"))
        except Exception as e:  # noqa: BLE001  (collect every failure with its source)
            return f"{name}: {e}\n----\n{text}"
        return None

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return [r for r in pool.map(one, unique.items()) if r]


# ---- every kernel compiles -----------------------------------------------------------------------------------------


@needs_nvrtc
@pytest.mark.parametrize("name,dtype", _case_params())
def test_op_sources_compile(name: str, dtype: str) -> None:
    program = case_program(name, dtype)
    assert program.target == "cuda"
    r = rendered(program)
    assert len(r.steps) == len(program.kernels)
    for i, (k, steps) in enumerate(zip(program.kernels, r.steps)):
        # a kernel without steps runs in the launch of an earlier one (merged: small, independent, elementwise)
        assert steps or r.merged_into.get(i, i) < i, k.name
        for step in steps:
            assert isinstance(step, Cublas) or step.source in r.sources
    failures = _check_sources(r.sources)
    assert not failures, "\n\n".join(failures[:3])


@needs_nvrtc
def test_model_sources_compile() -> None:
    progs = model_programs()
    groups: set[str] = set()
    kinds: set[str] = set()
    for p in progs.values():
        kinds.update(k.kind for k in p.kernels)
        groups.update(k.group for k in p.kernels)
    # Group-1 fp16 convs are implicit GEMMs on tensor cores (conv2d records); the direct conv kernel is compiled by
    # the grouped-conv op case.
    assert kinds == {"generated", "gemm", "attention", "conv2d"}
    assert {"max_pool2d.default", "embedding.default", "index_copy.default", "softmax.int", "npu.rope",
            "npu.attention"} <= groups
    # decoding's RMSNorms are GEMV prologues (a row reduction), compiled here; SiLU-times-up stays a kernel
    prologues = [k.spec for p in progs.values() for k in p.kernels if k.kind == "gemm" and k.spec.prologue]
    assert prologues and {bool(s.prologue_reduce) for s in prologues} == {True}
    sources = {f"{m}_{n}": t for m, p in progs.items() for n, t in rendered(p).sources.items()}
    failures = _check_sources(sources)
    assert not failures, "\n\n".join(failures[:3])


@needs_nvrtc
def test_direct_conv_kernel_still_compiles_for_grouped_convs() -> None:
    program = case_program("conv_groups_dil", "float16")
    assert any(k.kind == "conv2d" for k in program.kernels)
    assert not _check_sources(rendered(program).sources)


@needs_nvrtc
def test_rmsnorm_is_one_row_kernel_per_dtype() -> None:
    """The RMSNorm pattern is one generated row kernel: one block per row, reductions shared by the row."""
    for dt in ("float32", "float16", "bfloat16"):
        program = case_program("rmsnorm_pattern", dt)
        rms = [k for k in program.kernels if k.group == "npu.rmsnorm"]
        assert len(rms) == 1 and rms[0].spec.row_dims == 1
        steps = rendered(program).steps[program.kernels.index(rms[0])]
        assert [s.launch.grid[0] for s in steps] == [6]
        assert not _check_sources(rendered(program).sources)


@needs_nvrtc
def test_nvrtc_reports_errors() -> None:
    with pytest.raises(nvrtc.NVRTCError) as info:
        nvrtc.compile_source('extern "C" __global__ void npu_kernel(float* o) { o[0] = undefined_name; }')
    assert "undefined_name" in str(info.value)


def test_compile_needs_no_gpu_and_round_trips() -> None:
    program = case_program("linear_bias", "float16")
    blob = program.to_bytes()
    again = CompiledProgram.from_bytes(blob)
    assert [k.to_dict() for k in again.kernels] == [k.to_dict() for k in program.kernels]
    assert rendered(again).sources == rendered(program).sources


def test_float_literals_are_exact() -> None:
    for v in (0.1, 1e-6, -3.5, 1 / 3, 65504.0, 1e-30):
        text = literal(v, "float32")
        assert float.fromhex(text.rstrip("f")) == float(np.float32(v))
    assert literal(float("inf"), "float32") == "__int_as_float(0x7f800000)"
    assert literal(-(2**63), "int64") == "(-9223372036854775807LL - 1)"
    assert literal(True, "bool") == "true"


# ---- cuBLAS plans --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["linear_bias", "linear_nobias", "matmul_batched", "matmul_transposed",
                                  "matmul_broadcast", "matvec", "addmm", "sdpa_gqa_mask"])
def test_cublas_plan_matches_numpy(name: str) -> None:
    program = case_program(name, "float32")
    rng = np.random.default_rng(0)
    gemms = [k for k in program.kernels if k.kind == "gemm"]
    if name == "sdpa_gqa_mask":
        assert not gemms  # attention is one kernel
        return
    assert gemms
    r = rendered(program)
    for k in gemms:
        plans = [st.plan for st in r.steps[program.kernels.index(k)] if isinstance(st, Cublas)]
        if not plans:
            continue  # a dtype cuBLAS has no routine for: the direct kernel
        check_gemm_plan(program, k, plans[0], rng)


@needs_nvrtc
@pytest.mark.parametrize("dtype,attn", [("bfloat16", "eager"), ("float32", "eager"), ("bfloat16", "sdpa"),
                                        ("float32", "sdpa")])
def test_split_decode_attention_sources_compile(dtype: str, attn: str, tmp_path) -> None:
    """Decode attention over a long enough cache gets its keys split across blocks: three launches over a scratch
    output where the graph rounds the probabilities itself (eager), two where it is SDPA and the grouped 16-bit
    kernel runs the splits online (the generic float32 kernel keeps three); every one of those sources compiles
    and assembles."""
    from npu_export.qwen2 import export_qwen2, tiny_qwen2_config

    exp = export_qwen2(tiny_qwen2_config(), tmp_path, max_cache_len=256, prefill_len=8, dtype=dtype,
                       attn_implementation=attn)
    program = npu_compiler.compile(exp.decode_path, "cuda", dtype=dtype, rope_theta=10000.0)
    att = [k for k in program.kernels if k.kind == "attention"]
    assert att and all(k.plan.splits >= 2 and len(k.scratch) == 1 and k.spec.online == (attn == "sdpa") for k in att)
    r = rendered(program)
    steps = r.steps[program.kernels.index(att[0])]
    one_pass = attn == "sdpa" and dtype == "bfloat16"
    assert [s.launch.grid[1] for s in steps] == [att[0].plan.splits] * (1 if one_pass else 2) + [1]
    failures = _check_sources({s.source: r.sources[s.source] for s in steps if isinstance(s, SourceLaunch)})
    assert not failures, "\n\n".join(failures[:3])
    # the cpu target has no such scratch: one launch per row there
    cpu = npu_compiler.compile(exp.decode_path, "cpu", dtype=dtype, rope_theta=10000.0)
    assert all(k.plan is None and not k.scratch for k in cpu.kernels if k.kind == "attention")


def _launches(program: CompiledProgram) -> list[tuple[int, str, SourceLaunch]]:
    """Every launch of the rendered program in order: (kernel index, its source's text, the launch)."""
    r = rendered(program)
    return [(i, r.sources[s.source], s) for i, steps in enumerate(r.steps) for s in steps
            if isinstance(s, SourceLaunch)]


def test_decode_attention_prefetches_its_split_before_the_wait(tmp_path) -> None:
    """A split decode attention whose valid length comes from an input that no kernel writes (the cache positions)
    reads that input and prefetches its split's key and value rows before it waits, and asks to launch early; the
    launch before each such launch and before each GEMV that loads its weights early lets it launch before waiting
    itself, and no other launch does. Where the positions could be written by a kernel, nothing is read before the
    wait."""
    from npu_compiler.targets.cuda import decode_attention
    from npu_compiler.targets.cuda.common import EARLY_WAIT, INPUTS_BEGIN, WAIT, unwritten_input
    from npu_export.qwen2 import export_qwen2, tiny_qwen2_config

    exp = export_qwen2(tiny_qwen2_config(), tmp_path, max_cache_len=256, prefill_len=8, dtype="bfloat16",
                       attn_implementation="eager")
    program = npu_compiler.compile(exp.decode_path, "cuda", dtype="bfloat16", rope_theta=10000.0)
    att = [k for k in program.kernels if k.kind == "attention"]
    assert att and all(k.plan.splits >= 2 for k in att)
    names = exp.cache_map["graphs"]["decode"]
    inputs = {s.name: s.buffer for s in program.inputs}
    # the positions: an input no kernel writes; a KV cache input (index_copy writes it) and an arena buffer are not
    assert unwritten_input(program, inputs[names["inputs"]["cache_position"]])
    assert not unwritten_input(program, inputs[names["layers"][0]["k_input"]])
    assert not unwritten_input(program, next(b.id for b in program.buffers if b.kind == "arena"))
    launches = _launches(program)
    splits = [(text, s) for i, text, s in launches if program.kernels[i].kind == "attention" and s.launch.grid[1] > 1]
    assert len(splits) == 2 * len(att)  # the exact kernel's two launches over the keys
    for text, s in splits:
        before = text.split("npu_kernel(", 1)[1].split(WAIT, 1)[0]
        assert s.launch.early and INPUTS_BEGIN in before and before.count("prefetch.L2") == 1, before
        assert_waits_first(text)
    for (_, a_text, _), (_, _, b) in zip(launches, launches[1:], strict=False):
        assert (EARLY_WAIT in a_text) == b.launch.early
    assert any(s.launch.early for i, _, s in launches if program.kernels[i].kind == "gemm")
    # with the positions possibly written by a kernel, the split waits first and prefetches nothing
    orig = decode_attention.unwritten_input
    decode_attention.unwritten_input = lambda program, buffer: False
    try:
        plain = CudaTarget().render_program(program)
    finally:
        decode_attention.unwritten_input = orig
    for i, steps in enumerate(plain.steps):
        for s in steps:
            if isinstance(s, SourceLaunch) and program.kernels[i].kind == "attention" and s.launch.grid[1] > 1:
                text = plain.sources[s.source]
                assert not s.launch.early
                assert text.split("npu_kernel(", 1)[1].split("\n", 2)[1] == WAIT  # the body's first line


def test_convolutions_do_not_launch_early() -> None:
    """Convolutions load weights before their wait too but do not ask to launch early (beside the conv before them
    that made ResNet-50 at batch 1 slower): no launch before a convolution's lets it launch first."""
    from npu_compiler.targets.cuda.common import EARLY_WAIT

    program = model_programs()["resnet18"]
    launches = _launches(program)
    convs = [n for n, (i, _, _) in enumerate(launches) if program.kernels[i].kind == "conv2d"]
    assert convs
    for n in convs:
        assert not launches[n][2].launch.early
        if n:
            assert EARLY_WAIT not in launches[n - 1][1]


@needs_nvrtc
def test_llm_step_programs_compile() -> None:
    """The greedy step's argmax over Qwen2's 151,936 logits: the chunk stages launch one block per chunk (1,187), not
    one block for the whole row; it and the step-inputs program assemble."""
    from npu_runtime import llm_io

    program = llm_io.greedy_token("cuda", (1, 151936), "bfloat16")
    r = rendered(program)
    grids = [s.launch.grid[0] for steps in r.steps for s in steps]
    assert grids == [1187, 1187, 1]
    # and the step-inputs program (positions and mask from the start slot and the count of padding rows)
    steps = rendered(llm_io.step_inputs("cuda", 2048, 2560, "bfloat16", -3.0e38))
    failures = _check_sources({**r.sources, **{f"step_{k}": v for k, v in steps.sources.items()}})
    assert not failures, failures[0]


@functools.cache
def _prefill_program(dtype: str) -> CompiledProgram:
    """The tiny Qwen2's prefill of 64 tokens: more rows than a GEMV takes."""
    import tempfile

    from npu_export.qwen2 import export_qwen2, tiny_qwen2_config

    with tempfile.TemporaryDirectory() as tmp:
        export_qwen2(tiny_qwen2_config(), tmp, max_cache_len=128, prefill_len=64, dtype=dtype,
                     attn_implementation="sdpa")
        with open(os.path.join(tmp, "prefill.json")) as f:
            ir = json.load(f)
    return npu_compiler.compile(ir, "cuda", dtype=dtype)


@needs_nvrtc
def test_prefill_gate_up_is_one_grouped_kernel() -> None:
    """A prefill's gate/up projection and SiLU(gate) * up are one GEMM over two column groups, which Hopper runs on
    the tensor memory accelerator: its tensor maps describe the activations as [rows, k] and the weight as [2 H, k]
    rows, in tiles of 64 x 128, over the buffers the record names; the source assembles for sm_90a. An older GPU
    renders the same record as the plain kernel, which assembles too; float32 keeps cuBLAS and the elementwise
    kernel."""
    from npu_compiler.targets.cuda import grouped_gemm as GG

    program = _prefill_program("bfloat16")
    grouped = [(i, k) for i, k in enumerate(program.kernels) if k.kind == "gemm" and k.spec.acc_groups == 2]
    assert len(grouped) == 2, [k.name for k in program.kernels]  # one a layer
    r = rendered(program)
    sources = {}
    for i, k in grouped:
        spec = k.spec
        assert spec.m == 64 and spec.n == 2 * spec.out_n and k.outs[0].shape[-1] == spec.out_n
        (step,) = r.steps[i]
        maps = step.launch.tensor_maps
        assert [m["ref"] for m in maps] == [("arg", 0), ("arg", 1)]
        assert maps[0]["dims"] == (spec.k, spec.m) and maps[1]["dims"] == (spec.k, spec.n)
        assert [m["box"] for m in maps] == [(GG.BK, GG.BM), (GG.BK, GG.BH)]
        assert maps[1]["pitch"] == k.args[1].strides[-1] and step.launch.ptrs[0] == ("maps", 0)
        assert step.launch.smem == GG.SMEM and step.launch.block == GG.THREADS
        sources[f"grouped_{i}"] = r.sources[step.source]
    old = CudaTarget(80).render_program(program)
    for i, _ in grouped:
        (step,) = old.steps[i]
        assert not step.launch.tensor_maps
        sources[f"plain_{i}"] = old.sources[step.source]
    failures = _check_sources(sources)
    assert not failures, failures[0]
    fp32 = _prefill_program("float32")
    assert not any(k.kind == "gemm" and k.spec.acc_groups != 1 for k in fp32.kernels)


@needs_nvrtc
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_decode_gemv_splits_long_rows_across_warps(dtype: str) -> None:
    """A decode GEMV (a few rows) with few output columns and long rows gives each column several warps, each summing
    every splits-th 16-byte chunk of the row (so enough loads are in flight to stream the weights), and combines
    them in shared memory; a wide one keeps one warp per column. Rows that 16-byte loads do not tile take the
    scalar loop, split the same way. A GEMV with more blocks than fit on the GPU at once runs as one wave of blocks
    looping over column groups. Every variant, with its bias and residual epilogue, compiles and assembles."""
    from fused_cases import TORCH_DTYPES, ir_dict
    from helpers import LinearResidual

    from npu_compiler.targets.cuda import gemv as G

    tdt = TORCH_DTYPES[dtype]
    seen, waves = set(), set()
    for m, k, n in [(1, 4096, 64), (3, 1536, 2048), (1, 64, 20000), (2, 1001, 64)]:
        ir = ir_dict(LinearResidual(k, n).to(tdt), [torch.zeros(m, k, dtype=tdt), torch.zeros(m, n, dtype=tdt)],
                     "linear")
        program = npu_compiler.compile(ir, "cuda", dtype=dtype)
        (gemm,) = [c for c in program.kernels if c.kind == "gemm"]
        assert gemm.spec.epilogue is not None and gemm.spec.bias  # bias and residual ride on the GEMV
        r = rendered(program)
        (step,) = r.steps[program.kernels.index(gemm)]
        vec = 16 // np.dtype(np.float32 if dtype == "float32" else np.float16).itemsize
        splits = G.splits_for(n, k // vec if k % vec == 0 else k // 8, H100)
        warps = max(G.WARPS, splits)
        groups = math.ceil(n / (warps // splits))
        grid = groups
        # more blocks than fit at once: one wave, the groups shared out evenly
        sms, sm_threads = H100.multiprocessors, H100.max_threads_per_multiprocessor
        if groups > sms * (sm_threads // (32 * warps)):
            wave = sms * min(G.WAVE_BLOCKS_PER_SM, sm_threads // (32 * warps))
            grid = math.ceil(groups / math.ceil(groups / wave))
            assert "cg += gridDim.x" in r.sources[step.source]
            waves.add((m, k, n))
        assert step.launch.block == 32 * warps and step.launch.grid == (grid, 1, 1)
        seen.add(splits)
        failures = _check_sources({step.source: r.sources[step.source]})
        assert not failures, failures[0]
    assert {1, 2, 8} <= seen  # (the shapes above exercise no split, a short split of a scalar row, and the widest)
    assert (1, 64, 20000) in waves  # (20,000 columns, four a block: more blocks than fit on the GPU at once)


def test_gemv_loads_only_weights_before_its_wait() -> None:
    """A GEMV loads its first weight chunks before it waits for the kernel ahead (weights are read-only); one whose
    matrix is an activation the kernel ahead may still be writing waits first."""
    from fused_cases import ir_dict
    from helpers import LinearResidual, MatmulOfInputs

    from npu_compiler.targets.cuda import gemv as G

    x = torch.zeros(1, 1536, dtype=torch.bfloat16)
    cases = {"weight": (LinearResidual(1536, 512).to(torch.bfloat16), [x, torch.zeros(1, 512, dtype=torch.bfloat16)]),
             "activation": (MatmulOfInputs(), [x, torch.zeros(512, 1536, dtype=torch.bfloat16)])}
    for what, (module, args) in cases.items():
        program = npu_compiler.compile(ir_dict(module, args, what), "cuda", dtype="bfloat16")
        (gemm,) = [c for c in program.kernels if c.kind == "gemm"]
        assert G.gemv_applies(gemm, program, H100)
        r = rendered(program)
        (step,) = r.steps[program.kernels.index(gemm)]
        before_wait = r.sources[step.source].split("npu_wait_prior();")[-2]
        assert ("__ldcs(w4 + v)" in before_wait) == (what == "weight"), what


class _EagerAttention(torch.nn.Module):
    """HF's eager attention (repeat_kv by expand + reshape, fp32 softmax cast back, two matmuls)."""

    def forward(self, q, k, v, m):
        g = q.shape[1] // k.shape[1]
        k = k[:, :, None].expand(-1, -1, g, -1, -1).reshape(q.shape[0], q.shape[1], k.shape[2], k.shape[3])
        v = v[:, :, None].expand(-1, -1, g, -1, -1).reshape(q.shape[0], q.shape[1], v.shape[2], v.shape[3])
        w = torch.softmax(torch.matmul(q, k.transpose(2, 3)) * 0.125 + m, dim=-1, dtype=torch.float32)
        return torch.matmul(w.to(q.dtype), v)


def _eager_attention_program(dtype: str, t: int, d: int, lk: int = 96) -> CompiledProgram:
    from fused_cases import TORCH_DTYPES, ir_dict

    tdt = TORCH_DTYPES[dtype]
    args = [torch.zeros(1, 4, t, d, dtype=tdt), torch.zeros(1, 2, lk, d, dtype=tdt),
            torch.zeros(1, 2, lk, d, dtype=tdt), torch.zeros(1, 1, t, lk, dtype=tdt)]
    return npu_compiler.compile(ir_dict(_EagerAttention(), args, "eager_attention"), "cuda", dtype=dtype)


@needs_nvrtc
def test_prefill_attention_is_one_tensor_core_kernel_where_it_applies() -> None:
    """Many query rows of 16-bit attention with a head dim that is a multiple of 16 lower to one attention record
    that renders as the tiled tensor-core kernel (and assembles): on Hopper its products on the warpgroup MMA (Q's
    fragments and P from registers, K's and V's tiles from shared memory) where the head dim is a multiple of 64,
    elsewhere on mma.sync; on a GPU older than sm_80 the same record renders as the row kernel. fp32, or a head dim
    the MMA tiles do not divide, keep QK^T and PV on cuBLAS around a softmax."""
    program = _eager_attention_program("bfloat16", 80, 64)
    kinds = [k.kind for k in program.kernels]
    assert kinds.count("attention") == 1 and "gemm" not in kinds, kinds
    att = next(k for k in program.kernels if k.kind == "attention")
    assert att.plan.splits == 0 and att.spec.probs_dtype == "bfloat16" and att.spec.scores_dtype == "bfloat16"
    src = CudaTarget().kernel_sources(att, program)[0]
    assert "fa_qkr(&sacc" in src and "fa_pv(&oacc" in src and "tc_mma(sacc" not in src
    assert nvrtc.target_for(src, "sm_90") == "sm_90a"
    ampere = CudaTarget(80).kernel_sources(att, program)[0]
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ampere and "tc_mma(sacc" in ampere
    assert "wgmma" not in ampere
    failures = _check_sources({"tiles": src, "ampere": ampere})
    assert not failures, failures[0]
    assert "mma.sync" not in CudaTarget(turing_profile()).kernel_sources(att, program)[0]
    for dtype, d in (("float32", 64), ("bfloat16", 72)):
        kinds = [k.kind for k in _eager_attention_program(dtype, 80, d).kernels]
        assert "attention" not in kinds and kinds.count("gemm") == 2, (dtype, d, kinds)


@needs_nvrtc
def test_long_masked_prefill_attention_splits_its_keys() -> None:
    """A masked attention whose rows see many key tiles splits the keys across blocks (so that the block of the last
    rows of a causal mask is not the kernel's whole time): three launches (stats, accumulate, combine) over the
    split scratch and the flags after it, all assembling. A record whose flags do not fit the tiled layout (a
    hostile or older artifact) renders as the generic split kernels instead; unmasked attention with blocks enough
    to fill the GPU is not split."""
    from dataclasses import replace

    from npu_compiler.targets.cuda import flash_attention as FA

    program = _eager_attention_program("bfloat16", 1100, 64, lk=1100)
    att = next(k for k in program.kernels if k.kind == "attention")
    n_tiles, row_blocks = -(-1100 // FA.BN), -(-1100 // FA.BM)
    splits = -(-n_tiles // FA.TILES_PER_SPLIT)
    assert att.plan.splits == splits >= 2 and att.plan.scratch_extra == 2 * 4 * row_blocks * splits
    assert att.scratch[0].numel == 4 * 1100 * splits * (2 + 64) + att.plan.scratch_extra
    r = rendered(program)
    steps = r.steps[program.kernels.index(att)]
    assert [s.launch.grid for s in steps][:2] == [(row_blocks, 4, splits)] * 2 and len(steps) == 3
    assert all("fa_qkr(&sacc" in r.sources[s.source] for s in steps[:2])  # (Hopper: the warpgroup MMA)
    failures = _check_sources({s.source: r.sources[s.source] for s in steps})
    assert not failures, failures[0]
    bad = replace(att, plan=replace(att.plan, scratch_extra=att.plan.scratch_extra - 1))
    assert not any("mma.sync" in src for src in CudaTarget().kernel_sources(bad, program))
    assert FA.tile_splits(1, 4, 1100, 1100, True, H100)[0] == splits
    assert FA.tile_splits(8, 32, 1100, 1100, False, H100) == (0, 0)
    assert FA.tile_splits(1, 2, 64, 1100, False, H100)[0] == splits  # too few blocks: split anyway
    assert FA.tile_splits(1, 4, 1100, 900, True, H100) == (0, 0)  # too few tiles to split


@needs_nvrtc
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (12, 2)])
def test_online_split_attention_sources_compile(heads: int, kv_heads: int) -> None:
    """SDPA over many rows and keys under a causal mask given as a tensor is an online record: its key splits run one
    pass each, then the combining launch (which marks the row blocks whose combined max fails the skipping's guard),
    then the repair launch that recomputes those exactly, one block a row block; all three assemble. Where a KV
    head's group of query heads is a multiple of 3, a block of the first launch computes three of them (12 warps,
    the key and value tiles and Q in dynamic shared memory); the split blocks read which key tiles are live from a
    table the launch before them makes once from the mask. On Hopper the one-pass launch multiplies on the warpgroup
    MMA, on Ampere with mma.sync."""
    from fused_cases import ir_dict

    from npu_compiler.targets.cuda import flash_attention as FA

    class Sdpa(torch.nn.Module):
        def forward(self, q, k, v, m):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)

    t = lk = 1100
    vis = torch.arange(lk)[None, :] <= torch.arange(t)[:, None]
    mask = torch.where(vis, 0.0, torch.finfo(torch.bfloat16).min).to(torch.bfloat16)[None, None]
    args = [torch.zeros(1, heads, t, 64, dtype=torch.bfloat16), torch.zeros(1, kv_heads, lk, 64, dtype=torch.bfloat16),
            torch.zeros(1, kv_heads, lk, 64, dtype=torch.bfloat16), mask]
    program = npu_compiler.compile(ir_dict(Sdpa(), args, "sdpa_attention"), "cuda", dtype="bfloat16")
    att = next(k for k in program.kernels if k.kind == "attention")
    assert att.spec.online and att.plan.splits >= 2
    row_blocks = -(-t // FA.BM)
    hb = 3 if (heads // kv_heads) % 3 == 0 else 1
    assert FA.heads_per_block(att.spec, "online", H100) == hb
    r = rendered(program)
    steps = r.steps[program.kernels.index(att)]
    # the mask's tiles classified once (one block a row block, CLASSIFY_TILES key tiles and mask head), the online
    # pass, the combine, the repair
    assert len(steps) == 4
    key_tiles = -(-lk // FA.BN)
    classify_grid = (row_blocks, -(-key_tiles // FA.CLASSIFY_TILES), 1)
    assert [s.launch.grid for s in steps][::3] == [classify_grid, (row_blocks, heads, 1)]
    # the mask is an input no kernel writes: its scan runs before the wait, the launch before it lets it start early
    assert steps[0].launch.early and "// inputs no kernel writes" in r.sources[steps[0].source]
    assert steps[1].launch.grid == (row_blocks, heads // hb, att.plan.splits)
    assert steps[1].launch.block == 128 * hb
    # three key and value buffers where the block has heads to share them (no barrier at a tile's end), else two
    assert FA.online_stages(hb) == (3 if hb > 1 else 2)
    # on Hopper the online pass multiplies on the warpgroup MMA (a warpgroup one head's 64 rows; the tiles unpadded
    # in the 128-byte swizzle, 1,024 bytes more to align them) and asks for sm_90a; Ampere keeps mma.sync
    online = r.sources[steps[1].source]
    assert "wgmma.mma_async" in online and "fa_pv(&oacc" in online and "tc_ldsm_t" not in online.split("npu_kernel")[1]
    assert nvrtc.target_for(online, "sm_90") == "sm_90a"
    assert steps[1].launch.smem == (64 * hb + 2 * FA.online_stages(hb) * 64) * 64 * 2 + 1024
    ampere = CudaTarget(80).kernel_sources(att, program)
    assert "wgmma" not in ampere[1] and "tc_mma(sacc" in ampere[1] and nvrtc.target_for(ampere[1], "sm_80") == "sm_80"
    assert "atomicOr" in r.sources[steps[2].source]
    # on Hopper with three heads a block, a split block that is the only one with live tiles for its row block writes
    # the rows' outputs itself (used 2, which the combine skips) and marks the row block for the repair in its own
    # flags; the repair reads every split's
    sole = FA.sole_split_applies(att, program, H100)
    assert sole == (hb > 1) and ("used[z] = 2;" in online) == sole
    assert "if (sole) continue;" in r.sources[steps[2].source]
    assert f"for (int zz = 0; zz < {att.plan.splits}; ++zz) marked |= fl[zz];" in r.sources[steps[3].source]
    # with three heads a block the next tile's Q K^T is issued ahead of the last tile's P V (which runs during the
    # softmax), and the partial outputs leave through shared memory as one bulk copy a row; with one, neither
    assert ("wg_wait<32, 1>(&sacc" in online) == (hb > 1)
    assert ("cp.async.bulk.global.shared::cta" in online) == (hb > 1)
    # the combining launch: one warp a row, the row in 64 bits (the record's offsets outgrow q's index type), four
    # columns a lane (an online record's rows are 16-byte aligned), stored 8 bytes at a time
    combine = r.sources[steps[2].source]
    assert "for (long long row = " in combine and "lane * 4" in combine and "reinterpret_cast<uint2*>(&out0" in combine
    failures = _check_sources({s.source: r.sources[s.source] for s in steps})
    assert not failures, failures[0]


class _SdpaLayers(torch.nn.Module):
    """Three SDPA layers over one mask, as a decoder's layers read it; `derived`: each layer reads the mask after an
    op of its own (a tensor some kernel writes)."""

    def __init__(self, derived: bool = False) -> None:
        super().__init__()
        self.derived = derived

    def forward(self, q, k, v, m):
        for i in range(3):
            mask = m * (i + 1) if self.derived else m
            q = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return q


def _sdpa_layers_args(t: int = 1100, heads: int = 6, kv_heads: int = 2, d: int = 64) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    vis = torch.arange(t)[None, :] <= torch.arange(t)[:, None]
    mask = torch.where(vis, 0.0, torch.finfo(torch.bfloat16).min).to(torch.bfloat16)[None, None]
    return [torch.randn(1, heads, t, d, generator=gen).to(torch.bfloat16),
            torch.randn(1, kv_heads, t, d, generator=gen).to(torch.bfloat16),
            torch.randn(1, kv_heads, t, d, generator=gen).to(torch.bfloat16), mask]


@needs_nvrtc
def test_attention_layers_over_one_mask_classify_it_once() -> None:
    """Online split records over the same mask share one tile table (a uint8 buffer alive from the first record to
    the last): where the mask is an input no kernel writes only the first record launches the classifying scan, the
    others read the table it left. A mask some kernel writes is classified by every record; a record whose nearest
    earlier toucher of the table is not a record over the same mask and spec classifies again; a record that
    claims a table of another size is refused at load."""
    from dataclasses import replace

    from fused_cases import ir_dict

    from npu_compiler.targets.cuda import flash_attention as FA

    args = _sdpa_layers_args()
    program = npu_compiler.compile(ir_dict(_SdpaLayers(), args, "sdpa_layers"), "cuda", dtype="bfloat16")
    att = [k for k in program.kernels if k.kind == "attention"]
    assert len(att) == 3 and all(k.spec.online and k.plan.splits >= 2 for k in att)
    tables = {k.scratch[-1].buffer for k in att}
    assert len(tables) == 1 and program.buffers[att[0].scratch[-1].buffer].dtype == "uint8"
    assert att[0].plan.tile_table == FA.tile_table(1, 6, 1100, 1100) == att[0].scratch[-1].numel
    r = rendered(program)
    n_launches = [len(r.steps[program.kernels.index(k)]) for k in att]
    assert n_launches == [4, 3, 3], n_launches
    assert [FA.table_left(k, program, H100) for k in att] == [False, True, True]
    failures = _check_sources({s.source: r.sources[s.source] for k in att for s in r.steps[program.kernels.index(k)]})
    assert not failures, failures[0]

    derived = npu_compiler.compile(ir_dict(_SdpaLayers(True), args, "sdpa_derived"), "cuda", dtype="bfloat16")
    datt = [k for k in derived.kernels if k.kind == "attention"]
    assert len(datt) == 3 and not any(FA.table_left(k, derived, H100) for k in datt)
    rd = rendered(derived)
    assert [len(rd.steps[derived.kernels.index(k)]) for k in datt] == [4, 4, 4]

    # the second record's spec differs (another scale): it and the third (whose nearest toucher is now the second,
    # which classifies) still run correctly, each from a table some launch of theirs or of the record before wrote
    other = replace(att[1], spec=replace(att[1].spec, scale=0.5))
    kernels = list(program.kernels)
    kernels[program.kernels.index(att[1])] = other
    edited = replace(program, kernels=kernels)
    assert [FA.table_left(k, edited, H100) for k in (att[0], other, att[2])] == [False, False, False]
    bad = replace(att[1], plan=replace(att[1].plan, tile_table=att[1].plan.tile_table + 1))
    with pytest.raises(ValueError, match="tile_table"):
        bad.plan.check(bad, program.buffers)


def test_online_split_blocks_run_longest_first() -> None:
    """The online split launch takes its blocks longest first: a permutation of every (row block, heads, split),
    ordered by the key tiles a causal mask would leave each (a row block sees the tiles up to its last row), so
    that the second wave is the short blocks; the source reads the order from a table. A grid too large for a table
    keeps its own order."""
    from dataclasses import replace

    from fused_cases import ir_dict

    from npu_compiler.targets.cuda import flash_attention as FA

    program = npu_compiler.compile(ir_dict(_SdpaLayers(), _sdpa_layers_args(), "sdpa_layers"), "cuda",
                                   dtype="bfloat16")
    att = next(k for k in program.kernels if k.kind == "attention")
    p, pl = att.spec, att.plan
    hb = FA.heads_per_block(p, "online", H100)
    order = FA.online_order(p, pl, hb)
    rbs, gy = -(-p.q_len // FA.BM), p.heads // hb
    blocks = [(c & 0xFFF, c >> 12 & 0xFFF, c >> 24) for c in order]
    assert sorted(blocks) == sorted((x, y, z) for x in range(rbs) for y in range(gy) for z in range(pl.splits))
    n_tiles = -(-p.kv_len // FA.BN)
    tps = -(-n_tiles // pl.splits)
    tiles = [max(0, min(tps, x + 1 - tps * z)) for x, _, z in blocks]  # (1100 rows: row block x sees x + 1 tiles)
    assert tiles == sorted(tiles, reverse=True) and tiles[0] == tps and tiles[-1] == 0
    online = next(s for s in CudaTarget().kernel_sources(att, program) if "fa_order" in s)
    assert f"fa_order[{len(order)}] = {{{order[0]},{order[1]}," in online
    big = replace(p, q_len=FA.BM * (FA.MAX_ORDERED_BLOCKS // gy // pl.splits + 1))
    assert FA.online_order(big, pl, hb) is None


@needs_nvrtc
def test_masked_softmax_sources_compile() -> None:
    """npu.softmax (scale and mask read with the row) renders and assembles in every dtype."""
    from helpers import export_ir

    class M(torch.nn.Module):
        def forward(self, x, mask):
            return torch.softmax(x * 0.125 + mask, dim=-1)

    ir = export_ir(M, [((2, 3, 5, 37), torch.float32), ((2, 1, 1, 37), torch.float32)], "msm")
    for dt in ("float32", "float16", "bfloat16"):
        program = npu_compiler.compile(ir, "cuda", dtype=dt)
        assert [(k.kind, k.group) for k in program.kernels] == [("generated", "npu.softmax")]
        failures = _check_sources(rendered(program).sources)
        assert not failures, "\n\n".join(failures[:3])


@needs_nvrtc
@pytest.mark.parametrize("family", ["text", "vision"])
def test_zoo_sources_compile(family: str) -> None:
    """Every kernel of the model zoo (tests/test_zoo.py), compiled for cuda in each model's half dtype (the casts
    and roundings), compiles with NVRTC and assembles: the new lowerings (norms, gathers, scans, resampling) render
    as CUDA C with no GPU present."""
    from npu_export.zoo import ZOO, ZooUnavailable, export_zoo_model, half_dtype

    sources: dict[str, str] = {}
    seen: set = set()
    for name, z in ZOO.items():
        if (z.family in ("cnn", "vit")) != (family == "vision"):
            continue
        try:
            ex = export_zoo_model(name, half_dtype(z.family))
        except ZooUnavailable:
            continue
        sources.update(_representatives(npu_compiler.compile(ex.ir, "cuda"), name, seen))
    assert len(seen) > 20
    failures = _check_sources(sources)
    assert not failures, "\n\n".join(failures[:3])


def _representatives(program: CompiledProgram, prefix: str, seen: set) -> dict[str, str]:
    """One source per kind of kernel (kind, group, dtypes, row and reduction shape): the lowering that made it
    renders every instance through the same code, and NVRTC then has a few hundred sources to compile, not
    thousands."""
    r = rendered(program)
    out = {}
    for k, steps in zip(program.kernels, r.steps):
        spec = k.spec
        key = (k.kind, k.group, program.dtype_of(k.outs[0]), tuple(program.dtype_of(a) for a in k.args),
               getattr(spec, "row_dims", 0), bool(getattr(spec, "reduce_shape", ())))
        if key in seen:
            continue
        seen.add(key)
        for step in steps:
            if isinstance(step, SourceLaunch):
                out[f"{prefix}_{step.source}"] = r.sources[step.source]
    return out


@needs_nvrtc
def test_new_op_cases_compile() -> None:
    """The op conformance cases of the zoo's ops and of the core ATen ops added with them (gathers, scans, layout
    ops, resampling, norms, reductions), compiled for cuda in float16 (float32 where that is all they take)."""
    from conftest import export_ir
    from test_op_conformance import CASES, F16, ZOO_CASES_FROM, ZOO_CASES_TO

    sources: dict[str, str] = {}
    seen: set = set()
    for c in CASES[ZOO_CASES_FROM:ZOO_CASES_TO]:
        dt = F16 if F16 in c.dtypes else c.dtypes[0]
        torch.manual_seed(0)
        inputs = c.inputs(dt)
        make = (lambda c=c, dt=dt: c.make().to(dt)) if dt.is_floating_point else c.make
        prog = npu_compiler.compile(export_ir(make, inputs), "cuda", dtype=str(dt).removeprefix("torch.")
                                    if dt.is_floating_point else None)
        sources.update(_representatives(prog, c.name, seen))
    assert len(sources) > 100
    failures = _check_sources(sources)
    assert not failures, "\n\n".join(failures[:3])


@needs_nvrtc
def test_small_independent_kernels_share_one_launch() -> None:
    """A run of small elementwise kernels that neither read nor write what another of the run writes runs as one
    launch on the first of them (the others get no steps); a kernel that reads one of their results starts a new
    run. Decoding's q RoPE and k, v cache writes are such a run."""
    from fused_cases import ir_dict
    from helpers import ThreeSmallOps

    from npu_compiler.targets.cuda import merge

    args = [torch.randn(4, 16), torch.randn(4, 16), torch.randn(4, 16)]
    program = npu_compiler.compile(ir_dict(ThreeSmallOps(), args, "three"), "cuda", dtype="float32",
                                   disable_passes=["elementwise_fusion"])
    writes = [k.outs[0].buffer for k in program.kernels]
    reads_earlier = [i for i, k in enumerate(program.kernels) if {a.buffer for a in k.args} & set(writes[:i])]
    r = rendered(program)
    assert r.merged_into and all(first < i for i, first in r.merged_into.items())
    alone = {i: merge.part_text(k, program, H100)[1] for i, k in enumerate(program.kernels) if k.kind == "generated"}
    for run in merge.groups(program, alone):
        assert not [i for i in run[1:] if i in reads_earlier and
                    {a.buffer for a in program.kernels[i].args} & {writes[j] for j in run if j < i}]
        assert r.steps[run[0]] and not any(r.steps[i] for i in run[1:])
        (launch,) = [s.launch for s in r.steps[run[0]]]
        assert launch.grid[0] == sum(alone[i].grid[0] for i in run)
    assert not _check_sources(r.sources)
    prog = npu_compiler.compile(exp_qwen_decode(), "cuda", rope_theta=1e6)
    rq = rendered(prog)
    runs = [[prog.kernels[i].group for i in [first, *[j for j, f in rq.merged_into.items() if f == first]]]
            for first in sorted(set(rq.merged_into.values()))]
    assert ["index_copy.default", "index_copy.default", "npu.rope"] in runs, runs


def exp_qwen_decode() -> dict:
    """The decode graph of a 2-layer Qwen2 (meta weights)."""
    import tempfile

    from npu_export.qwen2 import export_qwen2, qwen2_config

    cfg = qwen2_config("qwen2.5-0.5b")
    cfg.num_hidden_layers, cfg.vocab_size = 2, 1024
    with tempfile.TemporaryDirectory() as tmp:
        exp = export_qwen2(cfg, tmp, max_cache_len=256, prefill_len=16, dtype="bfloat16")
        return json.loads(open(exp.decode_path).read())


def test_tiled_attention_output_is_head_last_where_the_heads_are_put_back() -> None:
    """Where every reader of a tiled attention's output swaps heads and rows back (transpose(1, 2), as the models do
    before the output projection), the output is [b, t, h, d] in memory and no copy kernel follows it; an output
    read otherwise (a graph output here) stays [b, h, t, d]."""
    import torch
    from fused_cases import ir_dict

    class HeadsBack(torch.nn.Module):
        def forward(self, q, k, v):
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
            return o.reshape(o.shape[0], o.shape[1], -1) * 2.0

    args = [torch.randn(1, 4, 80, 64).bfloat16() for _ in range(3)]
    program = npu_compiler.compile(ir_dict(HeadsBack(), args, "heads_back"), "cuda", dtype="bfloat16")
    (att,) = [k for k in program.kernels if k.kind == "attention"]
    assert att.outs[0].shape == (1, 4, 80, 64) and att.outs[0].strides == (80 * 4 * 64, 64, 4 * 64, 1)
    assert [k.kind for k in program.kernels] == ["attention", "generated"]  # the scale, no copy
    sdpa = _eager_attention_program("bfloat16", 80, 64)
    (att,) = [k for k in sdpa.kernels if k.kind == "attention"]
    assert att.outs[0].strides[1] > att.outs[0].strides[2]


def test_large_elementwise_kernels_work_on_several_elements_a_thread() -> None:
    """Past the GPU's resident threads (its profile's) an elementwise kernel's thread works on `elementwise_ilp`
    elements a grid stride apart in an unrolled loop, its grid shrunk to match; below that one element a thread, as
    every row kernel's loops over a row are unrolled (their trip counts are only known at run time). The sources
    compile."""
    from fused_cases import ir_dict

    from npu_compiler.targets.clike import ELEMENTWISE_BLOCK, elementwise_ilp
    from npu_compiler.targets.cuda.common import CUDA

    class Silu(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.silu(x) * 2.0

    ilp = CUDA.elementwise_ilp
    resident = H100.resident_threads  # (the profile `rendered` renders for)
    assert ilp > 1 and elementwise_ilp(CUDA, resident * ilp - 1, H100) == 1
    assert elementwise_ilp(CUDA, resident * ilp, H100) == ilp and elementwise_ilp(CUDA, resident * ilp) == 1
    least = -(-resident * ilp // 1000)  # the fewest rows of 1000 that reach the unrolled loop
    for rows, unrolled in ((least, True), (least - 1, False)):
        x = torch.empty(rows, 1000)
        program = npu_compiler.compile(ir_dict(Silu(), [x], "silu"), "cuda", dtype="float32")
        (k,) = program.kernels
        (step,) = rendered(program).steps[0]
        src = rendered(program).sources[step.source]
        assert ("i0 + e *" in src) == unrolled, src
        per_thread = ilp if unrolled else 1
        assert step.launch.grid[0] == -(-rows * 1000 // (per_thread * ELEMENTWISE_BLOCK)), step.launch
        assert not _check_sources(rendered(program).sources)
    program = case_program("rmsnorm_pattern", "float32")
    assert CUDA.row_loop_hint and all(CUDA.row_loop_hint in s for s in rendered(program).sources.values()
                                      if "npu_block_reduce(" in s)


@needs_nvrtc
def test_elementwise_kernels_move_16_bytes_where_their_loads_allow() -> None:
    """An elementwise kernel over 2-byte elements loads and stores 8 of them at once where every load and the store
    run along the innermost dim in aligned vectors (a value the expression reads once for the vector, such as a
    row's scale, is loaded once), and so does a row kernel (a norm: its reduction's loads and its elements) and a
    cache update (whole rows written at positions read once a vector); a row of an odd length, a float32 store or a
    view shifted off the 16-byte grid keep the element loop. The sources compile."""
    from fused_cases import SiluTimesUp, ir_dict

    class ScaleRows(torch.nn.Module):
        def forward(self, x, s):
            return x * s

    class Shifted(torch.nn.Module):
        def forward(self, x):
            return x[:, 1:1025] * 2.0

    class RmsNorm(torch.nn.Module):
        def forward(self, x):
            return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)

    class CacheWrite(torch.nn.Module):
        def forward(self, cache, pos, new):
            return cache.index_copy(2, pos, new)

    cases = [(SiluTimesUp(), [(64, 2 * 1024)], "bfloat16", True), (ScaleRows(), [(64, 1024), (64, 1)], "float16", True),
             (RmsNorm(), [(64, 1024)], "bfloat16", True), (RmsNorm(), [(64, 1004)], "bfloat16", False),
             (SiluTimesUp(), [(64, 2 * 1031)], "bfloat16", False), (SiluTimesUp(), [(64, 2 * 1024)], "float32", False),
             (Shifted(), [(64, 1032)], "float16", False)]
    for module, shapes, dtype, vector in cases + [(CacheWrite(), [(1, 2, 64, 128), (16,), (1, 2, 16, 128)], "bfloat16",
                                                   True), (CacheWrite(), [(1, 2, 64, 12), (16,), (1, 2, 16, 12)],
                                                           "bfloat16", False)]:
        args = [torch.randperm(sh[0]) if len(sh) == 1 else torch.randn(sh).to(getattr(torch, dtype)) for sh in shapes]
        program = npu_compiler.compile(ir_dict(module, args, type(module).__name__.lower()), "cuda", dtype=dtype)
        sources = rendered(program).sources
        assert any("uint4" in src for src in sources.values()) == vector, (type(module).__name__, shapes, dtype)
        assert not _check_sources(sources)


@needs_nvrtc
def test_qwen15_decode_gemms_all_run_as_gemvs(tmp_path) -> None:
    """Qwen2.5-1.5B's decode step at its real widths (two layers): every GEMM is a GEMV, each norm folded into the
    projection after it, SiLU-times-up the gate/up projection's epilogue over its two column groups, and the
    program renders and compiles."""
    from npu_compiler.targets.cuda import gemv as G
    from npu_export.qwen2 import export_qwen2, qwen2_config

    cfg = qwen2_config("qwen2.5-1.5b")
    cfg.num_hidden_layers = 2
    exp = export_qwen2(cfg, tmp_path, max_cache_len=256, prefill_len=16, dtype="bfloat16", attn_implementation="sdpa")
    program = npu_compiler.compile(exp.decode_path, "cuda", rope_theta=exp.cache_map["rope"]["theta"])
    gemms = [k for k in program.kernels if k.kind == "gemm"]
    assert gemms and all(G.gemv_applies(k, program, H100) for k in gemms), [k.name for k in gemms]
    assert [k.spec.acc_groups for k in gemms].count(2) == 2
    assert not [k for k in program.kernels if k.kind == "generated" and "silu" in k.nodes]
    assert sum(k.spec.prologue is not None for k in gemms) == 5  # two norms a layer and the final one
    r = rendered(program)
    assert not _check_sources(r.sources)
    # a norm GEMV's blocks (at most one wave) share its column groups out evenly, and take one round where fewer
    # warps a column make them fit: q/k/v's 2,048 columns in 256 blocks of 8 (not two rounds of 4 a block), the
    # gate/up projection's 8,960 in 1,120 groups of 8 over 224 blocks, five each (not 264 blocks, 64 of them with five)
    wave = H100.multiprocessors * G.PROLOGUE_BLOCKS_PER_SM
    for k in gemms:
        if k.spec.prologue is None:
            continue
        launch = r.steps[program.kernels.index(k)][0].launch
        _, _, cpo = G._layout(k.spec, program.buffers, k, H100)
        groups = -(-k.spec.out_n // cpo)
        rounds = -(-groups // wave)  # the fewest a wave allows
        assert launch.grid[0] == -(-groups // rounds), (k.name, groups, launch.grid)  # every block `rounds` or one less
        if k.spec.out_n == 2048:
            assert groups <= wave and launch.grid[0] == groups == 256
        if k.spec.acc_groups == 2:
            assert (groups, launch.grid[0]) == (1120, 224)


def test_resnet_conv_epilogues_store_and_read_whole_sectors() -> None:
    """ResNet's convs over channels-last activations (output channels a multiple of 16) store 4 channels a lane after
    an exchange in the quad, and read a residual 4 channels a lane the same way: no 2-byte residual load, no 4-byte
    store (each filled half of a 32-byte sector), and the bias loaded once for the thread's channels. The convs of
    the direct kernel (conv_direct.py: no residual) store 2 channels a lane after an exchange between lanes, with
    the bias loaded once too."""
    from fused_cases import ir_dict

    from npu_export.resnet import resnet18

    # a batch whose first stages' convs have tiles enough for every SM (unsplit: the split's epilogues sum parts);
    # the projection shortcuts kept as convs whose results the residual adds read (conv_side would compute them)
    ir = ir_dict(resnet18().eval(), [torch.empty(16, 3, 224, 224)], "resnet18")
    program = npu_compiler.compile(ir, "cuda", dtype="float16", disable_passes=["conv_side"])
    convs = [k for k in program.kernels if k.kind == "conv2d" and k.plan.splits == 1]
    with_residual = 0
    direct = 0
    for k in convs:
        src = CudaTarget().kernel_sources(k, program)[0]
        if "wg_desc_plain" in src:
            assert "*reinterpret_cast<unsigned*>(out0 + (" in src and "out0[" not in src, k.name
            assert "v += bv[hf];" in src or not k.spec.bias, k.name
            direct += 1
            continue
        assert "*reinterpret_cast<uint2*>(out0 + (" in src and "*reinterpret_cast<unsigned*>(out0" not in src, k.name
        if k.spec.bias:
            assert "v += bv[j][e];" in src, k.name
        residuals = [a for a in range(3, len(k.args)) if f"a{a}[" in src or f"e{a}" in src]
        for a in residuals:
            assert f"reinterpret_cast<const uint2*>(e{a} + (" in src and f"e{a}[" not in src, (k.name, a)
        with_residual += bool(residuals)
    assert convs and with_residual >= 4 and direct >= 2


def test_hopper_convs_multiply_on_the_warpgroup_mma() -> None:
    """On Hopper (sm_90) the unsplit convs whose tiles are 16-byte copies (128-pixel tiles) multiply with `wgmma`
    and ask for the arch-specific target (sm_90a); Ampere and Blackwell render `mma.sync` (their sources run on
    every later GPU of their kind); the stem (3 channels, read element by element) multiplies on the warpgroup MMA
    on Hopper from its input window (conv_narrow.py), on `mma.sync` elsewhere."""
    from fused_cases import ir_dict

    from npu_compiler.targets.cuda import conv_narrow, conv_tc
    from npu_export.resnet import resnet18

    ir = ir_dict(resnet18().eval(), [torch.empty(16, 3, 224, 224)], "resnet18")
    program = npu_compiler.compile(ir, "cuda", dtype="float16")
    convs = [k for k in program.kernels if k.kind == "conv2d"]
    for arch in (80, 90, 100):
        on = []
        for k in convs:
            src = CudaTarget(arch).kernel_sources(k, program)[0]
            x, w, out = k.args[0], k.args[1], k.outs[0]
            p, o, _ = conv_tc._geometry(x.shape, w.shape, out.shape)
            copies = conv_tc.pixels_vectorizable(x) and conv_tc.weight_vectorizable(w)
            want = arch == 90 and (copies and k.plan.splits == 1 and conv_tc.tile_for(p, o, H100, True)[0] == 128
                                   or conv_narrow.fits(k, program, H100))
            assert ("wgmma.mma_async" in src) == want and ("tc_mma(acc" in src) != want, (arch, k.name)
            assert (nvrtc.target_for(src, f"sm_{arch}") == f"sm_{arch}a") == want, (arch, k.name)
            on.append(want)
        assert any(on) == (arch == 90) and not all(on)


def test_hopper_convs_of_one_partial_wave_take_an_sm_each() -> None:
    """A conv on the warpgroup MMA whose grid is at most one block an SM takes stages enough to hold more than half
    of an SM's shared memory (no SM can take two of its blocks when it launches while the kernel before it still
    runs); one of more blocks keeps STAGES, two blocks an SM."""
    from fused_cases import ir_dict

    from npu_compiler.targets.cuda import conv_tc

    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(512, 512, 1), nn.ReLU(), nn.Conv2d(512, 512, 3, padding=1)).eval()
    seen = set()
    for side in (7, 14):  # batch 64: 3,136 pixels (25 x 4 = 100 tiles) and 12,544 (98 x 4 = 392)
        ir = ir_dict(model, [torch.empty(64, 512, side, side)], f"convs{side}")
        program = npu_compiler.compile(ir, "cuda", dtype="float16")
        launches = [(i, text, s.launch) for i, text, s in _launches(program)
                    if program.kernels[i].kind == "conv2d" and "wgmma.mma_async" in text]
        assert launches, side
        for _, _, launch in launches:
            blocks = math.prod(launch.grid)
            one_wave = blocks <= H100.multiprocessors
            seen.add(one_wave)
            assert launch.block == 256
            if one_wave:
                most = H100.shared_memory_per_block_optin
                assert most // 2 < launch.smem <= most, (side, launch)
            else:
                assert launch.smem == (128 + 128) * conv_tc.BK_COPIES * 2 * conv_tc.STAGES, (side, launch)
    assert seen == {True, False}


def test_one_wave_mma_sync_convs_keep_their_split_in_flight() -> None:
    """A conv on mma.sync whose grid is one partial wave (one image's deep convs, split K) takes stages for every K
    tile of its split, up to LATENCY_STAGES; one of more blocks than SMs keeps STAGES."""
    from fused_cases import ir_dict

    from npu_compiler.targets.cuda import conv_tc

    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(256, 256, 1), nn.ReLU(), nn.Conv2d(256, 256, 3, padding=1)).eval()
    # a 64 x 128 tile's stage, K 64 a step (16-byte copies) or 32 (the 1x1 conv's NCHW program input, element by
    # element)
    stage, stage32 = ((64 + 128) * (bk + 8) * 2 for bk in (conv_tc.BK_COPIES, conv_tc.BK))
    # the H100 at batch 1 (196 pixels: 4 x 2 tiles): the 1x1 conv unsplit, 8 K tiles (6 stages, the most); the 3x3
    # split 8 ways, 36 K tiles, 5 a split (6 stages). The A100 at batch 32 (6,272 pixels): 98 x 2 tiles, more
    # blocks than its SMs
    for device, batch, want in (("h100", 1, {1: 6 * stage32, 3: 6 * stage}),
                                ("a100", 32, {1: 3 * stage32, 3: 3 * stage})):
        ir = ir_dict(model, [torch.empty(batch, 256, 14, 14)], f"latency{batch}")
        program = npu_compiler.compile(ir, "cuda", dtype="float16", device=device)
        target = CudaTarget(device)
        out = target.render_program(program)
        got = {}
        for i, steps in enumerate(out.steps):
            k = program.kernels[i]
            launches = [st for st in steps if isinstance(st, SourceLaunch)]
            if k.kind == "conv2d" and "tc_mma(acc" in out.sources[launches[0].source]:
                got[k.args[1].shape[2]] = launches[0].launch.smem
                blocks = math.prod(launches[0].launch.grid)
                assert (blocks <= target.profile.multiprocessors) == (batch == 1), (device, launches[0].launch)
        assert got == want, (device, got)


@needs_nvrtc
def test_small_pool_windows_are_written_out_into_the_vector_form() -> None:
    """A channels-last max pool (ResNet's 3 x 3 window, stride 2, padding 1, after a conv on tensor cores) is written
    out position by position (`clike._unrolled`: the initial value, then the max with each position in the loop's
    order), so that each position reads its 8 channels in one guarded 16-byte load and the kernel has no reduction
    loop; a window past UNROLL_REDUCE_MAX positions, or a pool whose output runs along its width, keeps the loop; the
    sources assemble."""
    from fused_cases import ConvPool, ir_dict

    from npu_compiler.targets import clike

    sources = {}
    for k in (3, 5):
        program = npu_compiler.compile(ir_dict(ConvPool(f"max{k}").eval(), [torch.zeros(2, 16, 29, 31)], f"pool{k}"),
                                       "cuda", dtype="float16")
        (pool,) = [kc for kc in program.kernels if kc.group == "max_pool2d.default"]
        assert pool.outs[0].strides[1] == 1  # channels-last
        src = sources[f"pool{k}"] = CudaTarget().kernel_sources(pool, program)[0]
        written_out = k * k <= clike.UNROLL_REDUCE_MAX
        assert ("for (int r = " not in src) == written_out, k
        assert src.count("const uint4 ") == (k * k if written_out else 0), k
        body = src.split("npu_kernel(")[1]
        assert body.count("npu_max(") == (k * k * 8 if written_out else 1), k
    failures = _check_sources(sources)
    assert not failures, failures[0]


def test_gather_index_arithmetic_is_32_bit_where_it_provably_fits() -> None:
    """A max pool's window positions (output and window indices times constants) are computed in `int` and so is
    its address; an embedding's row comes from a loaded token id (no known range) and stays 64-bit."""
    from fused_cases import ir_dict

    class Pool(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.max_pool2d(x, 3, 2, 1)

    class Embed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.e = torch.nn.Embedding(100, 16)

        def forward(self, ids):
            return self.e(ids)

    pool = npu_compiler.compile(ir_dict(Pool(), [torch.zeros(2, 8, 16, 16)], "pool"), "cuda", dtype="float16")
    (k,) = [k for k in pool.kernels if k.group == "max_pool2d.default"]
    src = CudaTarget().kernel_sources(k, pool)[0]
    assert "long long" not in src.split("npu_kernel(")[1] and "const int n" in src, src
    emb = npu_compiler.compile(ir_dict(Embed(), [torch.zeros(3, dtype=torch.int64)], "emb"), "cuda", dtype="float32")
    (g,) = [k for k in emb.kernels if k.group == "embedding.default"]
    emb_src = CudaTarget().kernel_sources(g, emb)[0]
    assert "long long" in emb_src.split("npu_kernel(")[1], emb_src
    assert not _check_sources({"pool": src, "emb": emb_src})


def test_row_kernel_indexes_in_32_bits_where_its_buffers_do() -> None:
    """A prefill's RMSNorm (2,048 rows of 1,536) indexes in `int`: its loops run to the rows and the row length and
    its addresses stay inside 3 M-element buffers (the rows times the reduction, 4.8 G, is no index it computes)."""
    from fused_cases import ir_dict

    class Norm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1536))

        def forward(self, x):
            h = x.float()
            return self.w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)

    p = npu_compiler.compile(ir_dict(Norm(), [torch.zeros(1, 2048, 1536, dtype=torch.bfloat16)], "norm"), "cuda",
                             dtype="bfloat16")
    (k,) = [k for k in p.kernels if k.group == "npu.rmsnorm"]
    src = CudaTarget().kernel_sources(k, p)[0]
    assert "for (int row" in src and "long long" not in src.split("npu_kernel(")[1], src
    assert not _check_sources({"norm": src})


def test_lane_steps_of_index_expressions() -> None:
    """How an index expression varies over an aligned vector of 8 outputs along the last dim (`clike._lane_step`):
    RoPE's rotated-half column (d + 64 below 64, d - 64 above) moves by one an element from a multiple of 8, its
    comparison is the same for the whole vector; a comparison with 68 flips inside a vector, a loaded value that moves
    is not known, a product by 2 moves by two."""
    from npu_compiler.expr import nodes as X
    from npu_compiler.targets.clike import _lane_step

    shape = (1, 12, 300, 128)
    d = X.Index("int64", 3)

    def c(v: int) -> X.Const:
        return X.Const("int64", v)

    def b(op: str, x: X.Expr, y: X.Expr, dt: str = "int64") -> X.Binary:
        return X.Binary(dt, op, x, y)

    rot = X.Where("int64", b("lt", d, c(64), "bool"), b("add", d, c(64)), b("sub", d, c(64)))
    assert _lane_step(rot, 3, shape, 8) == (1, 0)
    assert _lane_step(b("lt", d, c(64), "bool"), 3, shape, 8) == (0, None)
    assert _lane_step(b("ge", d, c(72), "bool"), 3, shape, 8) == (0, None)
    assert _lane_step(b("lt", d, c(68), "bool"), 3, shape, 8) is None  # 64..71 straddles 68
    assert _lane_step(b("le", d, c(63), "bool"), 3, shape, 8) == (0, None)  # (d <= 63 is d < 64)
    assert _lane_step(b("add", d, c(3)), 3, shape, 8) == (1, 3)
    assert _lane_step(b("mul", d, c(2)), 3, shape, 8) == (2, 0)
    assert _lane_step(b("mul", d, d), 3, shape, 8) is None
    assert _lane_step(X.Index("int64", 2), 3, shape, 8) == (0, None)  # another dim: the same for the vector
    assert _lane_step(X.Load("int64", 0, (0, 0, 1, 1)), 3, shape, 8) is None  # moves with the vector
    assert _lane_step(X.Load("int64", 0, (0, 0, 1, 0)), 3, shape, 8) == (0, None)
    # without recursion: a chain as deep as a tree may be, and one that shares every subtree (2^200 paths)
    deep = shared = d
    for _ in range(256):
        deep = b("add", deep, c(1))
    for _ in range(200):
        shared = b("add", shared, shared)
    assert _lane_step(deep, 3, shape, 8) == (1, 0) and _lane_step(shared, 3, shape, 8) == (2 ** 200, 0)


def test_vector_gathers() -> None:
    """A gather is one 16-byte load for a vector of 8 outputs (`clike._vector_gather_ok`) where exactly one index
    moves with the vector, by one an element from a multiple of 8, along a unit-stride dim whose extent is a multiple
    of 8, the rest of the address aligned and the guard the same for the whole vector."""
    from npu_compiler.expr import nodes as X
    from npu_compiler.targets.clike import _vector_gather_ok

    shape = (1, 12, 300, 128)
    d = X.Index("int64", 3)
    idx = [X.Index("int64", 0), X.Index("int64", 1), X.Index("int64", 2)]

    def c(v: int) -> X.Const:
        return X.Const("int64", v)

    def gather(last: X.Expr, strides=(4194304, 128, 2048, 1), offset: int = 0, dt: str = "bfloat16") -> X.Gather:
        return X.Gather(dt, 0, offset, (1, 12, 2048, 128), strides, (*idx, last))

    rot = X.Where("int64", X.Binary("bool", "lt", d, c(64)), X.Binary("int64", "add", d, c(64)),
                  X.Binary("int64", "sub", d, c(64)))
    dts = ["bfloat16"]
    assert _vector_gather_ok(gather(rot), 3, shape, 8, dts)
    assert not _vector_gather_ok(gather(rot, offset=4), 3, shape, 8, dts)  # a run off the 16-byte grid
    assert not _vector_gather_ok(gather(X.Binary("int64", "add", d, c(4))), 3, shape, 8, dts)  # shifted by 4
    assert not _vector_gather_ok(gather(X.Binary("int64", "mul", d, c(2))), 3, shape, 8, dts)  # every other one
    assert not _vector_gather_ok(gather(rot, strides=(4194304, 128, 2048, 2)), 3, shape, 8, dts)
    assert not _vector_gather_ok(gather(rot, dt="float32"), 3, shape, 8, ["float32"])


def test_repeated_kernels_render_once() -> None:
    """Generated kernels with the same expression, dtypes, extents and output map (a model's layers) are rendered
    once (`merge.part_text`'s cache), keyed by a digest of the expression that costs its distinct nodes: a tree of
    200 levels that shares every subtree (2^200 paths) digests at once, and trees that differ only in a constant's
    sign digest apart."""
    from fused_cases import ir_dict

    from npu_compiler.expr import nodes as X
    from npu_compiler.targets.cuda import merge

    class Twice(torch.nn.Module):
        def forward(self, x, y):
            return torch.sin(x) * 2.0, torch.sin(y) * 2.0

    args = [torch.zeros(64, 128), torch.zeros(64, 128)]
    program = npu_compiler.compile(ir_dict(Twice(), args, "twice"), "cuda", dtype="float32")
    gen = [k for k in program.kernels if k.kind == "generated"]
    assert len(gen) == 2 and gen[0].args != gen[1].args
    merge._TEXTS.clear()
    texts = [merge.part_text(k, program, H100)[0] for k in gen]
    assert len(merge._TEXTS) == 1 and texts[0].body == texts[1].body and texts[0] is not texts[1]

    e = X.Index("int64", 3)
    for _ in range(200):
        e = X.Binary("int64", "add", e, e)
    assert len(X.fingerprint(e)) == 16
    zero, neg = X.Const("float32", 0.0), X.Const("float32", -0.0)
    assert X.fingerprint(X.Binary("float32", "add", zero, neg)) != X.fingerprint(X.Binary("float32", "add", neg, zero))


def _gemm_plan_of(module, args, dtype: str) -> tuple[CompiledProgram, KernelCall, dict]:
    program = npu_compiler.compile(ir_dict(module, args, "gemm"), "cuda", dtype=dtype)
    (k,) = [c for c in program.kernels if c.kind == "gemm"]
    (plan,) = [st.plan for st in rendered(program).steps[program.kernels.index(k)] if isinstance(st, Cublas)]
    return program, k, plan


def test_bias_epilogue_plan_adds_the_bias_row_as_cublaslt_reads_it() -> None:
    """A bf16 linear of more rows than a GEMV takes: the plan offers cuBLASLt's bias epilogue (the runtime then
    skips the fill), and reading it as cuBLASLt does (D = alpha op(A) op(B) + bias[i] on row i of the column-major
    result, C not read) gives alpha * a @ b + bias."""
    module = Lin(64, 40).to(torch.bfloat16)
    x = torch.randn((3, 30, 64)).to(torch.bfloat16)
    program, k, plan = _gemm_plan_of(module, [x], "bfloat16")
    bias_at = plan["bias_epilogue"]
    assert bias_at == {"arg": 2, "offset": k.args[2].offset}
    rng = np.random.default_rng(1)
    flats = {}
    for r in [*k.args, *k.outs]:
        flats.setdefault(r.buffer, rng.standard_normal(program.buffers[r.buffer].numel))
    out_flat = flats[k.outs[0].buffer]
    lt = dict(plan, beta=0.0)
    emulate_blas(lt, flats[k.args[lt["a_arg"]].buffer], flats[k.args[lt["b_arg"]].buffer], out_flat)
    bias_flat = flats[k.args[bias_at["arg"]].buffer]
    ((_, _, oc),) = plan["calls"]
    rows = np.arange(plan["m"])
    for j in range(plan["n"]):
        out_flat[oc + rows + j * plan["ldc"]] += bias_flat[bias_at["offset"] + rows]
    a, b = strided(flats[k.args[0].buffer], k.args[0]), strided(flats[k.args[1].buffer], k.args[1])
    expect = k.spec.alpha * np.matmul(a, b) + strided(bias_flat, k.args[2])
    np.testing.assert_allclose(strided(out_flat, k.outs[0]), expect, rtol=1e-12, atol=1e-12)


def test_bias_epilogue_plan_only_where_it_adds_what_the_fill_would() -> None:
    x = torch.randn((40, 64))
    _, _, plan = _gemm_plan_of(Lin(64, 40), [x], "float32")
    assert plan["bias_epilogue"] is None  # float32 keeps cuBLAS's fill and beta
    scaled = Fn(lambda c, a, b: torch.addmm(c, a, b, beta=0.5))
    args = [torch.randn((48,)).to(torch.bfloat16), x.to(torch.bfloat16), torch.randn((64, 48)).to(torch.bfloat16)]
    _, k, plan = _gemm_plan_of(scaled, args, "bfloat16")
    assert k.spec.bias and k.spec.beta == 0.5 and plan["bias_epilogue"] is None  # the epilogue adds it unscaled
    _, k, plan = _gemm_plan_of(Fn(lambda c, a, b: torch.addmm(c, a, b)), args, "bfloat16")
    assert plan["bias_epilogue"] == {"arg": 2, "offset": 0}  # the same row at beta 1: the epilogue's
    args[0] = torch.randn((40, 48)).to(torch.bfloat16)
    _, k, plan = _gemm_plan_of(Fn(lambda c, a, b: torch.addmm(c, a, b)), args, "bfloat16")
    assert k.spec.bias and plan["bias_epilogue"] is None  # a matrix, not one row broadcast: no bias vector
