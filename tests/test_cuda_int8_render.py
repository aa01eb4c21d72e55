"""The cuda target's integer kernels (`targets/cuda/int8_kernels.py`) render for every case of tests/int8_cases.py and
for a PT2E-form model, and NVRTC compiles them for sm_80 (the A100 row: mma.sync m16n8k32 s8) and sm_90 (the H200
row); ptxas, where installed, assembles them. Their results are checked on a GPU by tests/gpu/test_int8_cuda.py."""

from __future__ import annotations

import numpy as np
import pytest
from int8_cases import Case, integer_cases, program_of, wgemm_cases

from npu_compiler.kernels import WGemmKernel
from npu_compiler.targets.cuda import CudaTarget, nvrtc


def _decode_wgemm(bits: int, m: int, n: int, k: int) -> Case:
    """A bf16 decode step's weight-only projection (render only: the values are zeros)."""
    g = 128 if bits == 4 else 0
    ins = [("x", np.zeros((m, k), np.float32), "bfloat16"),
           ("q", np.zeros((n, k if bits == 8 else k // 2), np.uint8), "int8" if bits == 8 else "uint8"),
           ("s", np.zeros((n,) if bits == 8 else (n, k // g), np.float32), "float32")]
    if bits == 4:
        ins.append(("z", np.zeros((n, k // g), np.uint8), "uint8"))
    ins.append(("bias", np.zeros(n, np.float32), "bfloat16"))
    return Case(f"wgemm bf16 int{bits} {m}x{n}x{k}", WGemmKernel(m, n, k, (), bits, g, True), ins, (m, n), "bfloat16")


# Qwen2.5-1.5B's q/k/v (concatenated), gate/up and down projections in bf16, as the decode step runs them
DECODE = [_decode_wgemm(8, 1, 2048, 1536), _decode_wgemm(4, 1, 17920, 1536), _decode_wgemm(4, 3, 1536, 8960)]
CASES = integer_cases() + wgemm_cases() + DECODE


def _sources(device: str) -> list[tuple[str, str]]:
    target = CudaTarget(device)
    out = []
    for case in CASES:
        program = program_of(case, "cuda")
        for text in target.kernel_sources(program.kernels[0], program):
            out.append((case.name, text))
    return out


def test_integer_kinds_render_on_tensor_cores() -> None:
    texts = dict(_sources("h200"))
    assert "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32" in texts["qgemm plain"]
    assert "mma.sync.aligned.m16n8k32" in texts["qconv2d 3x3 pad"]
    assert "uint4" in texts["wgemm int4"]  # 16-byte loads of the packed codes
    assert "uint4" in texts["qgemm uint8 acts, k%4"] and "uint4" in texts["qconv2d 16-byte weight rows"]
    assert "uint4" not in texts["qgemm b zero point"]  # K = 12: element loads


def test_a_gpu_without_int8_tensor_cores_is_refused_by_name() -> None:
    from helpers import turing_profile

    from npu_compiler.errors import NPUCompileError

    case = integer_cases()[0]
    program = program_of(case, "cuda")
    with pytest.raises(NPUCompileError, match="int8 tensor cores"):
        CudaTarget(turing_profile()).kernel_sources(program.kernels[0], program)


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is absent (the project's cuda extra installs it)")
@pytest.mark.parametrize("device,arch", [("a100", "80"), ("h200", "90")])
def test_integer_kernels_compile_with_nvrtc(device: str, arch: str) -> None:
    seen: set[str] = set()
    ptxas = nvrtc.ptxas_path()
    for name, text in _sources(device):
        if text in seen:
            continue
        seen.add(text)
        ptx = nvrtc.compile_source(text, f"compute_{arch}", name=f"{name}.cu")
        assert b"mma.sync.aligned.m16n8k32" in ptx or not name.startswith(("qgemm", "qconv2d"))
        if ptxas:
            nvrtc.ptxas_check(ptx, f"sm_{arch}")


def test_tiles_are_planned_from_the_device_profile() -> None:
    """The tile is the largest that still gives every multiprocessor a block (an A100 and an L4 differ by their SM
    counts); every NVIDIA row's plan fits the row's threads and its shared memory without opting in."""
    import re

    from npu_compiler.devices import CHIPS
    from npu_compiler.targets.cuda.int8_kernels import BLOCK, plan_int8

    rows, cols = 64 * 56 * 56, 256  # ResNet-50 batch 64's first bottleneck 1x1
    a100, l4 = plan_int8(rows, cols, CHIPS["a100"]), plan_int8(rows, cols, CHIPS["l4"])
    assert (a100.bm, a100.bn) == (128, 64) and a100.grid != l4.grid
    assert (plan_int8(32, 32, CHIPS["h200"]).bm, plan_int8(32, 32, CHIPS["h200"]).bn) == (32, 32)
    case = next(c for c in integer_cases() if c.name == "qconv2d stride 2 relu")
    program = program_of(case, "cuda")
    for name, dev in CHIPS.items():
        if dev.vendor != "nvidia" or dev.compute_capability < 80:
            continue
        (text,) = CudaTarget(name).kernel_sources(program.kernels[0], program)
        shared = sum(int(a) * int(b) for a, b in re.findall(r"npu_s[ab]\[(\d+)\]\[(\d+)\]", text))
        assert BLOCK <= dev.max_threads_per_block and shared < 48 * 1024, name


def test_weight_only_gemv_prefetches_only_before_its_wait() -> None:
    from helpers import assert_waits_first

    texts = dict(_sources("h200"))
    for name in ("wgemm int8", "wgemm int4", "wgemm int8 split k", "wgemm int4 row tail", *(c.name for c in DECODE)):
        assert "npu_prefetch_l2(" in texts[name] and "__shfl_xor_sync" in texts[name]
        assert_waits_first(texts[name])
