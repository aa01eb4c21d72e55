"""A decoder layer's weight-only projections with the folds a decode step has (tests/test_wgemm_folds.py and
tests/gpu/test_wgemm_folds_cuda.py): an RMSNorm before q/k/v-like and gate/up projections (the GEMV's prologue),
SiLU(gate) * up (column groups), residual adds (the epilogue), one row of bf16 activations. The reference is PyTorch
with each linear's weight replaced by its dequantized codes (the weight-only format's own error left out)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn

import npu_compiler
import npu_runtime
from npu_compiler.kernels.wgemm import unpack_int4
from npu_runtime.quant_recipes import weight_only


class RMSNorm(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))

    def forward(self, x):
        dt = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * x.to(dt)


class Layer(nn.Module):
    """t = qkv(norm1(x)) (a prologue, no epilogue), y = x + o(t's first h columns) (a residual epilogue), then
    y + down(silu(gate(n)) * up(n)) with n = norm2(y) (a prologue and column groups, a residual epilogue)."""

    def __init__(self, h: int = 256, inter: int = 384, bias: bool = False) -> None:
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(h), RMSNorm(h)
        self.qkv = nn.Linear(h, h + 64, bias=bias)
        self.o = nn.Linear(h, h, bias=bias)
        self.gate, self.up = nn.Linear(h, inter, bias=False), nn.Linear(h, inter, bias=False)
        self.down = nn.Linear(inter, h, bias=False)

    def forward(self, x):
        t = self.qkv(self.norm1(x))
        y = x + self.o(t[..., :x.shape[-1]])
        n = self.norm2(y)
        return y + self.down(nn.functional.silu(self.gate(n)) * self.up(n)), t


def make_layer(seed: int = 0, bias: bool = False, h: int = 256, inter: int = 384) -> Layer:
    torch.manual_seed(seed)
    m = Layer(h, inter, bias).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.06)
    return m.to(torch.bfloat16)


def _like(layer: Layer) -> Layer:
    """A layer of `layer`'s sizes (fresh parameters)."""
    return Layer(layer.o.in_features, layer.gate.out_features, layer.o.bias is not None)


def dequantized(w: torch.Tensor, bits: int) -> torch.Tensor:
    """The float32 weight the codes of `w` stand for (npu_runtime.quant_recipes.weight_only's format)."""
    c = weight_only(w.float().numpy(), bits, 128 if bits == 4 else 0)
    if bits == 8:
        return torch.from_numpy(c["qweight"].astype(np.float32) * c["scale"][:, None])
    codes = unpack_int4(c["qweight"]).astype(np.float32)
    return torch.from_numpy((codes - np.repeat(c["zero"], 128, 1)) * np.repeat(c["scale"], 128, 1))


def reference(layer: Layer, x: torch.Tensor, bits: int) -> list[np.ndarray]:
    """PyTorch's layer on the dequantized weights, in float32 from the bf16 input (the bf16 program's roundings are
    within the bf16 tolerance of it)."""
    ref = _like(layer).eval()
    state = {k: v.float() for k, v in layer.state_dict().items()}
    for name in ("qkv", "o", "gate", "up", "down"):
        state[f"{name}.weight"] = dequantized(state[f"{name}.weight"], bits)
    ref.load_state_dict(state)
    with torch.no_grad():
        return [t.float().numpy() for t in ref(x.float())]


def run(layer: Layer, x: torch.Tensor, weights_dtype: str, target: str, backend) -> tuple[list[np.ndarray], object]:
    """The layer compiled for `target` with its projections weight-only, run on `backend`: outputs, program."""
    from conftest import export_ir, to_numpy

    ir = export_ir(lambda: _like(layer), [x])
    program = npu_compiler.compile(ir, target, dtype="bfloat16", weights_dtype=weights_dtype)
    if backend.compile_target() == "cpu" and target != "cpu":
        # the records another target's lowering made, run by the CPU reference (which runs every record: the spec)
        program = dataclasses.replace(program, target="cpu")
    state = {k: to_numpy(v) for k, v in layer.state_dict().items()}
    weights = npu_runtime.load_weights(program, state, backend)
    feeds = {t["name"]: to_numpy(x) for t in ir["graph_inputs"]}
    outs = backend.create_executor(program).run_numpy(feeds, weights)
    return [np.asarray(outs[t["name"]], np.float32) for t in ir["graph_outputs"]], program


def folds(program) -> dict[str, int]:
    """How many wgemm records of the program have each fold."""
    ks = [k.spec for k in program.kernels if k.kind == "wgemm"]
    return {"prologue": sum(s.prologue is not None for s in ks), "groups": sum(s.acc_groups > 1 for s in ks),
            "epilogue": sum(s.epilogue is not None for s in ks), "wgemm": len(ks)}


def assert_close_bf16(got: list[np.ndarray], want: list[np.ndarray], rel: float = 5e-2) -> None:
    """docs/tolerances.md's bf16 row: Pearson >= 0.999 and max |err| / max |ref| <= `rel`."""
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        r = np.corrcoef(g.ravel(), w.ravel())[0, 1]
        err = np.abs(g - w).max() / np.abs(w).max()
        assert r >= 0.999 and err <= rel, f"Pearson {r:.5f}, max |err| / max |ref| {err:.3g}"


def check_layer(backend, target: str, wd: str, bits: int, want_folds: dict[str, int], h: int = 256,
                inter: int = 384) -> None:
    """The layer compiled for `target` with these folds, run on `backend`: PyTorch on the dequantized weights within
    the bf16 tolerance, and the CPU reference of the same records within a few bf16 ulps (a float32 sum in another
    order rounds to bf16 the other way here and there, and the layer's second half reads that)."""
    from npu_runtime.cpu.backend import CpuBackend

    x = torch.randn(1, 1, h, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    layer = make_layer(bias=bits == 8, h=h, inter=inter)
    got, program = run(layer, x, wd, target, backend)
    assert folds(program) == want_folds
    assert_close_bf16(got, reference(layer, x, bits))
    spec, _ = run(layer, x, wd, target, CpuBackend())
    for g, s in zip(got, spec, strict=True):
        np.testing.assert_allclose(g, s, rtol=2 ** -7, atol=2 ** -7 * np.abs(s).max())
