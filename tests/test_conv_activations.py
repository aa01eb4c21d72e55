"""Any elementwise activation of the expression table fuses into a convolution's epilogue (issue 53: only ReLU did; a
SiLU or GELU after a conv was a kernel of its own), on every target: computed by the cpu reference and
webgpu where present, checked against PyTorch, and rendered to CUDA C by each of cuda's conv kernels (the tensor-core
implicit GEMM, Hopper's direct conv, the direct kernel for grouped convs), compiled with NVRTC."""

from __future__ import annotations

import pytest
import torch
from conftest import check_module, export_ir

import npu_compiler
from npu_compiler.expr import nodes as X

F = torch.nn.functional
ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "hardtanh": lambda x: F.hardtanh(x, 0.0, 6.0),
    "elu": F.elu,
    "softplus": F.softplus,
    "clamp": lambda x: torch.clamp(x, -1.0, 1.0),
    "silu_then_scale": lambda x: F.silu(x) * 0.5,  # a chain: two ops of the table
}


class ConvAct(torch.nn.Module):
    def __init__(self, act: str, cin: int = 8, cout: int = 16, k: int = 3, groups: int = 1, residual: bool = False,
                 bn: bool = True) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(cin, cout, k, padding=k // 2, groups=groups, bias=not bn)
        self.bn = torch.nn.BatchNorm2d(cout) if bn else torch.nn.Identity()
        self.act = ACTIVATIONS[act]
        self.residual = residual

    def forward(self, x, r=None):
        y = self.bn(self.conv(x))
        if self.residual:
            y = y + r
        return self.act(y)


def _init(m: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for b in m.modules():
            if isinstance(b, torch.nn.BatchNorm2d):
                b.running_mean.normal_(0, 0.2)
                b.running_var.uniform_(0.5, 1.5)
    return m


def _one_conv_kernel(ir: dict, target: str, dtype: str) -> X.Expr:
    """The program is one conv2d kernel whose epilogue holds the activation (no kernel of its own)."""
    prog = npu_compiler.compile(ir, target, dtype=dtype)
    assert [k.kind for k in prog.kernels] == ["conv2d"], [(k.kind, k.group) for k in prog.kernels]
    epilogue = prog.kernels[0].spec.epilogue
    assert epilogue is not None and any(isinstance(n, X.Unary | X.Binary | X.Where) for n in X.walk(epilogue))
    return epilogue


@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_conv_activation_fuses_and_matches_pytorch(backend, act):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 6, 6)
    ir = check_module(backend, lambda: _init(ConvAct(act)).eval(), [x], kind="accumulate")
    _one_conv_kernel(ir, backend.compile_target(), "float32")


@pytest.mark.parametrize("act", ["silu", "gelu", "hardtanh"])
def test_conv_residual_activation_in_half_precision(backend, act):
    """bias (a folded batch norm) + residual + activation, in float16: rounded where the graph rounds."""
    torch.manual_seed(1)
    x, r = torch.randn(1, 8, 5, 5).half(), torch.randn(1, 16, 5, 5).half()
    ir = check_module(backend, lambda: _init(ConvAct(act, residual=True)).eval().half(), [x, r], kind="accumulate")
    _one_conv_kernel(ir, backend.compile_target(), "float16")


def test_the_fusion_is_switched_off_by_name():
    ir = export_ir(lambda: _init(ConvAct("silu")).eval(), [torch.randn(1, 8, 4, 4)])
    prog = npu_compiler.compile(ir, "cpu", disable_passes=["conv_epilogue"])
    assert len(prog.kernels) == 2


# ---- every cuda conv renderer renders any epilogue ---------------------------------------------------------------


class TwoConvs(torch.nn.Module):
    """A stem conv, then the conv under test: its input is a conv result, channels-last where cuda's convs run on
    tensor cores (so that the tensor-core kernels take it)."""

    def __init__(self, act: str, c: int) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(16, c, 3, padding=1)
        self.body = _init(ConvAct(act, c, c))

    def forward(self, x):
        return self.body(torch.relu(self.stem(x)))


def _cuda_conv_programs():
    """Programs whose convs run on each of cuda's conv kernels, with activations in their epilogues."""
    half = torch.float16
    cases = {
        # fp16 group-1 convs: the implicit GEMM on tensor cores (mma.sync; wgmma on Hopper for 128-pixel tiles)
        "implicit_gemm": (lambda: TwoConvs("gelu_tanh", 64).eval().half(), [torch.randn(16, 16, 32, 32, dtype=half)]),
        # 64 channels, stride 1, 3x3, tiles for every SM: Hopper's direct conv (conv_direct.py)
        "hopper_direct": (lambda: TwoConvs("silu_then_scale", 64).eval().half(),
                          [torch.randn(16, 16, 64, 64, dtype=half)]),
        # 3 input channels (a stem over the program input): Hopper's conv of few channels (conv_narrow.py)
        "hopper_narrow": (lambda: _init(ConvAct("gelu_tanh", 3, 64, k=7)).eval().half(),
                          [torch.randn(4, 3, 40, 40, dtype=half)]),
        # grouped: the direct conv kernel of library.py
        "grouped": (lambda: _init(ConvAct("hardtanh", 8, 16, groups=2)).eval().half(), [torch.randn(2, 8, 8, 8,
                                                                                                    dtype=half)]),
        "grouped_fp32": (lambda: _init(ConvAct("elu", 8, 16, groups=4)).eval(), [torch.randn(2, 8, 8, 8)]),
    }
    for name, (make, inputs) in cases.items():
        dtype = "float16" if inputs[0].dtype == half else "float32"
        yield name, npu_compiler.compile(export_ir(make, inputs, name), "cuda", dtype=dtype)


def test_every_cuda_conv_kernel_renders_an_activation_epilogue():
    from test_cuda_codegen import NVRTC_REASON, _check_sources

    from npu_compiler.targets.cuda import CudaTarget, conv_direct, conv_narrow, nvrtc

    if not nvrtc.available():
        pytest.skip(NVRTC_REASON)
    sources, renderers = {}, set()
    for name, prog in _cuda_conv_programs():
        convs = [k for k in prog.kernels if k.kind == "conv2d"]
        assert convs and all(k.spec.epilogue is not None for k in convs), name
        for arch in (80, 90):
            target = CudaTarget(arch)  # the chip table's row of that compute capability
            for k in convs:
                src = target.kernel_sources(k, prog)[0]
                renderers.add("conv_direct" if conv_direct.fits(k, prog, target.profile)
                              else "conv_narrow" if conv_narrow.fits(k, prog, target.profile)
                              else "wgmma" if "wgmma.mma_async" in src
                              else "mma.sync" if "tc_mma(" in src else "library direct")
                sources[f"{name}_sm{arch}_{k.name}"] = src
    assert renderers == {"conv_direct", "conv_narrow", "wgmma", "mma.sync", "library direct"}, renderers
    failures = _check_sources(sources)
    assert not failures, "\n\n".join(failures[:2])
