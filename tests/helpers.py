"""Small shared helpers for tests: export a torch module to an IR dict and run it through our stack."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import torch


def export_ir(module_factory, example_shapes_dtypes, name: str = "m") -> dict:
    """IR dict (dtype attrs stringified) of `module_factory()` exported on the meta device."""
    import torch_ir

    from npu_export.ir_io import ir_to_dict

    with torch.device("meta"):
        m = module_factory().eval()
        ins = tuple(torch.zeros(s, dtype=d) if d != torch.float32 else torch.randn(s) for s, d in example_shapes_dtypes)
    with torch.no_grad():
        ir = torch_ir.extract_ir(m, ins, model_name=name)
    return ir_to_dict(ir)


def state_dict_numpy(module: torch.nn.Module) -> dict[str, np.ndarray]:
    from npu_export.reference import to_numpy

    return {k: to_numpy(v) for k, v in {**module.state_dict(), **dict(module.named_buffers())}.items()}


def check_greedy_argmax(backend, vocab: int, dtype: str = "float32", kernels: int | None = None) -> None:
    """The greedy step's argmax program (npu_runtime.llm_io.greedy_token) on `backend` against torch.argmax of the
    last row of [2, vocab] logits: random rows, ties (the first index wins), NaNs (the first NaN counts as the
    largest), a row of -inf, a constant row, and a huge value in the other row (which does not count)."""
    import ml_dtypes

    from npu_runtime import llm_io

    program = llm_io.greedy_token(backend.compile_target(), (2, vocab), dtype)
    if kernels is not None:
        assert len(program.kernels) == kernels, [k.name for k in program.kernels]
    ex = backend.create_executor(program)
    rng = np.random.default_rng(vocab)
    np_dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    for case in range(7):
        logits = rng.standard_normal((2, vocab)).astype(np.float32)
        last = logits[-1]
        if case == 1:
            last[[5, vocab // 2, vocab - 1]] = 100.0
        elif case == 2:
            last[[vocab // 3, 200]] = np.nan
        elif case == 3:
            last[:] = -np.inf
        elif case == 4:
            last[vocab - 1] = 50.0
        elif case == 5:
            last[:] = 3.0
        elif case == 6:
            logits[0, 3] = 1e30
        logits = logits.astype(np_dt)
        got = ex.run({"logits": logits})["token"].to_numpy()
        want = int(torch.argmax(torch.from_numpy(logits[-1].astype(np.float32))))
        assert got.shape == (1, 1) and int(got[0, 0]) == want, f"case {case}: got {int(got[0, 0])}, torch {want}"


class LinearResidual(torch.nn.Module):
    """lin(x) + r: a GEMM with its bias and a residual add in the epilogue (a decode GEMV where x has few rows)."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(k, n)

    def forward(self, x, r):
        return self.lin(x) + r


class NormLinear(torch.nn.Module):
    """lin(rmsnorm(x)) + r, RMSNorm written as Qwen2's (fp32 statistics, rounded back, times the weight): a GEMV
    whose prologue is a row reduction where x has few rows."""

    def __init__(self, k: int, n: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(k))
        self.lin = torch.nn.Linear(k, n, bias=False)
        self.eps = eps

    def forward(self, x, r):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.lin(self.weight * h.to(x.dtype)) + r


class GatedLinear(torch.nn.Module):
    """lin(silu(g) * u) + r, an MLP's down projection: a GEMV whose prologue is elementwise."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(k, n, bias=False)

    def forward(self, g, u, r):
        return self.lin(torch.nn.functional.silu(g) * u) + r


class GluProjection(torch.nn.Module):
    """act(a) * b over the two halves of one linear's output (SwiGLU with silu, GeGLU with gelu, ReGLU with relu;
    `swap` multiplies the other way round): a GEMM whose epilogue combines two column groups where x has few rows."""

    def __init__(self, k: int, n: int, act: str = "silu", bias: bool = False, swap: bool = False) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(k, 2 * n, bias=bias)
        self.act = {"silu": torch.nn.functional.silu, "relu": torch.nn.functional.relu,
                    "gelu": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[act]
        self.swap = swap

    def forward(self, x):
        a, b = self.lin(x).chunk(2, dim=-1)
        return b * self.act(a) if self.swap else self.act(a) * b


def glu_case(k: int, n: int, m: int, act: str, bias: bool, swap: bool, dtype: torch.dtype, scale: float = 0.3
             ) -> tuple[GluProjection, torch.Tensor]:
    """A GluProjection with random parameters (N(0, scale)) in `dtype` and an input of m rows, seeded by m."""
    gen = torch.Generator().manual_seed(m)
    module = GluProjection(k, n, act, bias, swap)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * scale)
    return module.to(dtype).eval(), torch.randn((m, k), generator=gen).to(dtype)


class MatmulOfInputs(torch.nn.Module):
    """x @ y^T with both operands inputs: a GEMM (a GEMV for few rows of x) whose matrix is no weight."""

    def forward(self, x, y):
        return x @ y.t()


def assert_waits_first(text: str, weights: bool = True) -> None:
    """A kernel launched with programmatic dependent launch may start while the kernel before it runs, and lets the
    one after it start once it has waited (common.py's prelude): it must wait (`npu_wait_prior`) exactly once, and
    read no memory before that except by L2 prefetches (a hint, never a stale value), between the WEIGHTS_BEGIN and
    WEIGHTS_END lines weights (no kernel writes one: memory_check.check_read_only) and between INPUTS_BEGIN and
    INPUTS_END inputs that no kernel writes (the renderer asks `common.unwritten_input`). `weights`: whether the
    kernel's weight operand is a weight buffer (only then may that region be there)."""
    from npu_compiler.targets.cuda.common import INPUTS_BEGIN, INPUTS_END, WEIGHTS_BEGIN, WEIGHTS_END

    body = text.split("npu_kernel(", 1)[1].replace("npu_wait_prior_early();", "npu_wait_prior();")
    assert body.count("npu_wait_prior();") == 1, "the kernel does not wait for the one before exactly once"
    before = body.split("npu_wait_prior();", 1)[0].splitlines()[1:]  # after the signature's line
    for begin, end, allowed in ((WEIGHTS_BEGIN, WEIGHTS_END, weights), (INPUTS_BEGIN, INPUTS_END, True)):
        if begin in before:
            assert allowed, "weights read before the wait from a buffer that is not a weight"
            a = before.index(begin)
            before = before[:a] + before[before.index(end, a) + 1:]
    reads = [line for line in before if "[" in line and "prefetch" not in line and "__shared__" not in line]
    assert not reads, f"memory read before the wait for the kernel before: {reads[:3]}"


class ThreeSmallOps(torch.nn.Module):
    """Two independent small elementwise results and one that reads both: with elementwise fusion off, the first two
    may share a launch (cuda merges small independent kernels) and the third may not."""

    def forward(self, x, y, z):
        a = x * 2.0 + z
        b = torch.sin(y)
        return a, b, a * b[..., :1]


def load_bench(name: str):
    """A script of bench/ as a module (bench/ is not a package)."""
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)
    spec.loader.exec_module(mod)
    return mod


def turing_profile():
    """A GPU older than the tensor-core kernels' instructions (mma.sync with bf16, cp.async: sm_80): a Tesla T4 as
    the runtime would fill its profile from its reported properties (devices.py has no row of it)."""
    from npu_compiler.devices import nvidia_profile

    return nvidia_profile({"name": "Tesla T4", "major": 7, "minor": 5, "multiProcessorCount": 40,
                           "maxThreadsPerMultiProcessor": 1024, "sharedMemPerBlockOptin": 65536,
                           "sharedMemPerMultiprocessor": 65536})


def emulate_blas(plan: dict, a_flat: np.ndarray, b_flat: np.ndarray, c_flat: np.ndarray) -> None:
    """C = alpha op(A) op(B) + beta C in BLAS's column-major reading of flat buffers (element offsets), as a cuBLAS
    plan (cuda/gemm.py: ops 0 and 1) or a hipBLAS plan (hip/blas.py: ops "N" and "T") describes the call."""
    m, n, k = plan["m"], plan["n"], plan["k"]

    def mat(flat, off, rows, cols, ld):
        return flat[off + np.arange(rows)[:, None] + np.arange(cols)[None, :] * ld]

    for oa, ob, oc in plan["calls"]:
        for i in range(plan["batch_count"]):
            pa, pb, pc = oa + i * plan["stride_a"], ob + i * plan["stride_b"], oc + i * plan["stride_c"]
            a = mat(a_flat, pa, m, k, plan["lda"]) if plan["transa"] in (0, "N") else mat(a_flat, pa, k, m,
                                                                                         plan["lda"]).T
            b = mat(b_flat, pb, k, n, plan["ldb"]) if plan["transb"] in (0, "N") else mat(b_flat, pb, n, k,
                                                                                         plan["ldb"]).T
            idx = pc + np.arange(m)[:, None] + np.arange(n)[None, :] * plan["ldc"]
            c_flat[idx] = plan["alpha"] * (a @ b) + plan["beta"] * c_flat[idx]


def strided(flat: np.ndarray, ref) -> np.ndarray:
    """The view of a flat buffer a TensorRef describes."""
    return np.lib.stride_tricks.as_strided(flat[ref.offset:], shape=ref.shape,
                                           strides=tuple(s * flat.itemsize for s in ref.strides))


def check_gemm_plan(program, k, plan: dict, rng: np.random.Generator) -> None:
    """A BLAS plan of GEMM record `k` computes alpha a @ b (+ beta bias, which the fill launch before the call puts
    in the output) on random buffers: the call emulated (`emulate_blas`) against NumPy's matmul of the record's
    operand views; and it counts the record's FLOPs."""
    flats: dict[int, np.ndarray] = {}
    for ref in [*k.args, *k.outs]:
        flats.setdefault(ref.buffer, rng.standard_normal(program.buffers[ref.buffer].numel).astype(np.float64))
    a, b = strided(flats[k.args[0].buffer], k.args[0]), strided(flats[k.args[1].buffer], k.args[1])
    expect = k.spec.alpha * np.matmul(a, b)
    out_flat = flats[k.outs[0].buffer]
    if k.spec.bias:
        bias = strided(flats[k.args[2].buffer], k.args[2])
        expect = expect + k.spec.beta * bias
        strided(out_flat, k.outs[0])[...] = bias  # the fill launch's job: out = bias (broadcast)
    emulate_blas(plan, flats[k.args[plan["a_arg"]].buffer], flats[k.args[plan["b_arg"]].buffer], out_flat)
    np.testing.assert_allclose(strided(out_flat, k.outs[0]), expect, rtol=1e-12, atol=1e-12)
    assert plan["flops"] == 2 * k.spec.m * k.spec.n * k.spec.k * math.prod(k.spec.batch)
