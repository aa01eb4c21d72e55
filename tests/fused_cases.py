"""Larger graphs and fusion patterns, in every dtype they accept: part of the op conformance table (run on every
backend present), and the graphs whose CUDA sources CI compiles with NVRTC.

Each case is a torch module and its input specs. Graphs are extracted with torch_ir on the meta device (inside
torch.no_grad) and their torch objects in attrs are stringified, as the compiler wants them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

FLOATS = ("float32", "float16", "bfloat16")
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "int64": torch.int64, "bool": torch.bool}


@dataclass(frozen=True)
class In:
    shape: tuple[int, ...]
    kind: str = "float"  # "float" (the case dtype), "int64" (0 <= x < high), "bool", "f32" (always float32)
    high: int = 10


@dataclass
class OpCase:
    name: str
    make: Callable[[], nn.Module]
    inputs: list[In]
    dtypes: tuple[str, ...] = FLOATS
    loose: bool = False  # accumulating ops (GEMM, conv, attention, reductions): the "accumulate" tolerance
    tags: set[str] = field(default_factory=set)


class Fn(nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


class Lin(nn.Module):
    def __init__(self, k: int, n: int, bias: bool = True) -> None:
        super().__init__()
        self.fc = nn.Linear(k, n, bias=bias)

    def forward(self, x):
        return self.fc(x)


class ConvBlock(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, stride: int = 1, padding: int = 0, dilation: int = 1,
                 groups: int = 1, bias: bool = True, bn: bool = False, relu: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride=stride, padding=padding, dilation=dilation, groups=groups,
                              bias=bias)
        self.bn = nn.BatchNorm2d(cout) if bn else None
        self.relu = relu
        if self.bn is not None:
            with torch.no_grad():
                self.bn.running_mean.uniform_(-0.5, 0.5)
                self.bn.running_var.uniform_(0.5, 2.0)
                self.bn.weight.uniform_(0.5, 1.5)
                self.bn.bias.uniform_(-0.2, 0.2)

    def forward(self, x):
        y = self.conv(x)
        if self.bn is not None:
            y = self.bn(y)
        return torch.relu(y) if self.relu else y


class ResidualConv(nn.Module):
    """conv + bn + add + relu: the residual epilogue pattern of ResNet."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.a = ConvBlock(c, c, 3, padding=1, bias=False, bn=True)

    def forward(self, x):
        return torch.relu(self.a(x) + x)


class Emb(nn.Module):
    def __init__(self, v: int, d: int) -> None:
        super().__init__()
        self.e = nn.Embedding(v, d)

    def forward(self, ids):
        return self.e(ids)


class RMSNormLike(nn.Module):
    """Qwen2's RMSNorm as HF writes it: fp32 statistics, cast back, times the weight."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(d) + 0.5)

    def forward(self, x):
        dt = x.dtype
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + 1e-6)
        return self.weight * h.to(dt)


class SiluTimesUp(nn.Module):
    """The MLP's SiLU(gate) * up over one [rows, 2 x n] tensor (its halves read a row apart, as in a decode graph)."""

    def forward(self, x):
        n = x.shape[-1] // 2
        return torch.nn.functional.silu(x[..., :n]) * x[..., n:]


class ConvPool(nn.Module):
    """A conv on tensor cores (its output channels-last) and a pool over it: "maxK" a max pool of window K, stride 2,
    padding K // 2 ("max2": window 2, no padding); "avg3" an average pool of window 3, stride 2, padding 1, the
    padding not counted."""

    def __init__(self, pool: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, 64, 3, padding=1)
        self.pool = pool

    def forward(self, x):
        y = torch.relu(self.conv(x))
        if self.pool == "avg3":
            return torch.nn.functional.avg_pool2d(y, 3, 2, 1, count_include_pad=False)
        k = int(self.pool[3:])
        return torch.nn.functional.max_pool2d(y, k, 2, k // 2 if k > 2 else 0)


class LinRes(nn.Module):
    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.fc = nn.Linear(k, n)

    def forward(self, x, r):
        return self.fc(x) + r


def _rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


def _eager_attention(q, k, v, m):
    """HF's eager attention: GQA by unsqueeze/expand/reshape, fp32 softmax cast back, two matmuls."""
    b, hk, n, d = k.shape
    g = q.shape[1] // hk
    k = k[:, :, None].expand(b, hk, g, n, d).reshape(b, hk * g, n, d)
    v = v[:, :, None].expand(b, hk, g, n, d).reshape(b, hk * g, n, d)
    s = torch.matmul(q, k.transpose(2, 3)) * (d ** -0.5) + m
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(p, v)


def _cache_update(cache, idx, src):
    return cache.index_copy(2, idx, src)


def _cache_update_reuse(cache, idx, src):
    # the cache is read after the update: the compiler must copy, not write in place
    return cache.index_copy(2, idx, src) + cache


def op_cases() -> list[OpCase]:
    f = In
    return [
        OpCase("binary_broadcast", lambda: Fn(lambda a, b: (a + b) * 2.5 - b / (a.abs() + 1.0)),
               [f((2, 3, 33)), f((3, 1))]),
        OpCase("unary_chain", lambda: Fn(lambda x: torch.exp(x * 0.5) + torch.log(x.abs() + 1) + torch.sqrt(x.abs())
                                         + torch.rsqrt(x.abs() + 0.5) + torch.sin(x) * torch.cos(x) + torch.tanh(x)
                                         - torch.neg(x)),
               [f((4, 257))]),
        OpCase("activations", lambda: Fn(lambda x: F.gelu(x) + F.gelu(x, approximate="tanh") + F.silu(x)
                                         + torch.sigmoid(x) + F.relu(x) + F.hardtanh(x, -0.5, 0.5)),
               [f((3, 5, 7))]),
        OpCase("pow_clamp_recip", lambda: Fn(lambda x: x.pow(2) + x.pow(3) + x.abs().pow(0.5)
                                             + torch.clamp(x, min=-1.0, max=0.5) + torch.reciprocal(x.abs() + 1)),
               [f((64, 9))]),
        OpCase("where_compare", lambda: Fn(lambda a, b: torch.where(a > b, a, b * 2) + a.masked_fill(a < 0, -1.0)
                                           + (a >= b).to(a.dtype)),
               [f((5, 6)), f((6,))]),
        OpCase("transpose_copy", lambda: Fn(lambda x: x.transpose(1, 2).contiguous() * 1.5 + x.permute(0, 2, 1)),
               [f((2, 17, 9))]),
        OpCase("cat_slice", lambda: Fn(lambda a, b: torch.cat([a[:, 1:], b, a[:, :1] * 2], dim=1)),
               [f((3, 4, 5)), f((3, 2, 5))]),
        OpCase("arange_full", lambda: Fn(lambda x: x + torch.arange(x.shape[-1], dtype=x.dtype, device=x.device)
                                         + torch.full((x.shape[-1],), 0.25, dtype=x.dtype, device=x.device)),
               [f((4, 10))]),
        OpCase("int_ops", lambda: Fn(lambda ids: (ids * 3 + 1).to(torch.float32) + (ids > 4).to(torch.float32)),
               [In((2, 9), "int64", 100)], dtypes=("float32",)),
        OpCase("mean_last", lambda: Fn(lambda x: x.mean(-1, keepdim=True)), [f((6, 96))], loose=True),
        OpCase("sum_dims", lambda: Fn(lambda x: x.sum(dim=(0, 2))), [f((3, 5, 7))], loose=True),
        OpCase("amax_mid", lambda: Fn(lambda x: torch.amax(x, dim=1)), [f((4, 37, 3))], loose=True),
        OpCase("mean_large", lambda: Fn(lambda x: x.float().mean(-1)), [f((3, 5000))], loose=True),
        OpCase("mean_huge", lambda: Fn(lambda x: x.float().sum(-1)), [f((2, 20000))], loose=True),
        OpCase("rmsnorm_pattern", lambda: RMSNormLike(160), [f((2, 3, 160))], loose=True),
        OpCase("softmax_last", lambda: Fn(lambda x: torch.softmax(x, dim=-1)), [f((2, 3, 77))], loose=True),
        OpCase("softmax_mid", lambda: Fn(lambda x: torch.softmax(x, dim=1)), [f((2, 13, 5))], loose=True),
        OpCase("log_softmax", lambda: Fn(lambda x: torch.log_softmax(x, dim=-1)), [f((4, 3000))], loose=True),
        OpCase("softmax_fp32", lambda: Fn(lambda x: torch.softmax(x, dim=-1, dtype=torch.float32)), [f((3, 40))],
               loose=True),
        OpCase("masked_softmax", lambda: Fn(lambda x, m: torch.softmax(x * 0.125 + m, dim=-1)),
               [f((2, 3, 5, 37)), f((2, 1, 1, 37))], loose=True),
        OpCase("linear_bias", lambda: Lin(48, 40), [f((2, 5, 48))], loose=True),
        OpCase("linear_nobias", lambda: Lin(64, 33, bias=False), [f((7, 64))], loose=True),
        OpCase("matmul_batched", lambda: Fn(lambda a, b: a @ b), [f((3, 2, 9, 16)), f((3, 2, 16, 11))], loose=True),
        OpCase("matmul_transposed", lambda: Fn(lambda a, b: a @ b.transpose(-1, -2)), [f((2, 9, 16)), f((2, 12, 16))],
               loose=True),
        OpCase("matmul_broadcast", lambda: Fn(lambda a, b: torch.matmul(a, b)), [f((4, 5, 8)), f((8, 6))], loose=True),
        OpCase("matvec", lambda: Fn(lambda a, b: torch.matmul(a, b)), [f((5, 8)), f((8,))], loose=True),
        OpCase("addmm", lambda: Fn(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0)),
               [f((6,)), f((4, 8)), f((8, 6))], loose=True),
        OpCase("conv3x3_bias", lambda: ConvBlock(5, 12, 3, padding=1), [f((2, 5, 9, 11))], loose=True),
        OpCase("conv7x7_s2", lambda: ConvBlock(3, 16, 7, stride=2, padding=3, bias=False), [f((1, 3, 23, 20))],
               loose=True),
        OpCase("conv_groups_dil", lambda: ConvBlock(8, 12, 3, padding=2, dilation=2, groups=4), [f((2, 8, 10, 10))],
               loose=True),
        OpCase("conv1x1_s2", lambda: ConvBlock(16, 70, 1, stride=2, bias=False), [f((2, 16, 9, 9))], loose=True),
        OpCase("conv_bn_relu", lambda: ConvBlock(6, 10, 3, padding=1, bias=False, bn=True, relu=True),
               [f((2, 6, 8, 8))], loose=True),
        OpCase("conv_residual", lambda: ResidualConv(8), [f((1, 8, 7, 7))], loose=True),
        OpCase("maxpool", lambda: Fn(lambda x: F.max_pool2d(x, 3, 2, 1)), [f((2, 3, 11, 12))], loose=True),
        OpCase("maxpool_ceil", lambda: Fn(lambda x: F.max_pool2d(x, 2, 2, ceil_mode=True)), [f((1, 2, 7, 9))],
               loose=True),
        OpCase("avgpool", lambda: Fn(lambda x: F.avg_pool2d(x, 3, 2, 1) + F.avg_pool2d(x, 3, 2, 1,
                                                                                      count_include_pad=False)),
               [f((2, 3, 10, 9))], loose=True),
        OpCase("adaptive_pool", lambda: Fn(lambda x: F.adaptive_avg_pool2d(x, (2, 3))), [f((2, 4, 7, 8))], loose=True),
        OpCase("global_pool", lambda: Fn(lambda x: torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)),
               [f((2, 6, 7, 7))], loose=True),
        OpCase("embedding", lambda: Emb(50, 24), [In((2, 7), "int64", 50)]),
        OpCase("index_copy_inplace", lambda: Fn(_cache_update),
               [f((1, 2, 16, 8)), In((3,), "perm", 16), f((1, 2, 3, 8))]),
        OpCase("index_copy_copy", lambda: Fn(_cache_update_reuse),
               [f((1, 2, 16, 8)), In((3,), "perm", 16), f((1, 2, 3, 8))]),
        OpCase("sdpa_gqa_mask", lambda: Fn(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m,
                                                                                             enable_gqa=True)),
               [f((1, 4, 5, 16)), f((1, 2, 37, 16)), f((1, 2, 37, 16)), f((1, 1, 5, 37))], loose=True),
        OpCase("sdpa_causal", lambda: Fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
               [f((2, 3, 9, 24)), f((2, 3, 9, 24)), f((2, 3, 9, 24))], loose=True),
        # enough query rows for the cuda target's tensor-core attention (16-bit dtypes; fp32 takes the row kernel)
        OpCase("sdpa_causal_tiles", lambda: Fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                               enable_gqa=True)),
               [f((1, 4, 20, 16)), f((1, 2, 20, 16)), f((1, 2, 20, 16))], loose=True),
        OpCase("sdpa_bool_scale", lambda: Fn(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m,
                                                                                               scale=0.3)),
               [f((1, 2, 4, 40)), f((1, 2, 6, 40)), f((1, 2, 6, 40)), In((1, 1, 4, 6), "bool")], loose=True),
        OpCase("linear_residual", lambda: LinRes(32, 24), [f((3, 32)), f((3, 24))], loose=True),
        OpCase("matmul_int", lambda: Fn(lambda a, b: a @ b), [In((3, 5), "int64", 7), In((5, 4), "int64", 7)],
               dtypes=("float32",)),
        OpCase("rope_pattern", lambda: Fn(_rope), [f((1, 2, 5, 16)), f((1, 1, 5, 16)), f((1, 1, 5, 16))]),
        OpCase("eager_attention", lambda: Fn(_eager_attention),
               [f((1, 4, 6, 16)), f((1, 2, 10, 16)), f((1, 2, 10, 16)), f((1, 1, 6, 10))], loose=True),
        OpCase("dtype_casts", lambda: Fn(lambda x: x.to(torch.float16).to(torch.float32) + x.to(torch.bfloat16)
                                         .to(torch.float32)), [In((5, 11), "f32")], dtypes=("float32",)),
    ]


# ---- IR ------------------------------------------------------------------------------------------------------------


def _jsonable(v: Any) -> Any:
    if isinstance(v, torch.dtype | torch.layout | torch.memory_format):
        return str(v)
    if isinstance(v, torch.device):
        return "cpu"
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    return v


def ir_dict(module: nn.Module, example: list[torch.Tensor], name: str) -> dict[str, Any]:
    """The IR of `module` on `example` (shapes and dtypes only), as the compiler reads it."""
    from torch_ir import extract_ir

    meta = copy.deepcopy(module).to("meta").eval()
    with torch.no_grad():
        ir = extract_ir(meta, tuple(x.to("meta") for x in example), model_name=name)
    d = ir.to_dict()
    for node in d["nodes"]:
        node["attrs"] = _jsonable(node["attrs"])
    return d


def make_inputs(case: OpCase, dtype: str, gen: torch.Generator, device: str = "cpu") -> list[torch.Tensor]:
    out = []
    for spec in case.inputs:
        if spec.kind == "float":
            t = torch.randn(spec.shape, generator=gen).to(TORCH_DTYPES[dtype])
        elif spec.kind == "f32":
            t = torch.randn(spec.shape, generator=gen)
        elif spec.kind == "int64":
            t = torch.randint(0, spec.high, spec.shape, generator=gen)
        elif spec.kind == "perm":
            t = torch.randperm(spec.high, generator=gen)[: spec.shape[0]]
        elif spec.kind == "bool":
            t = torch.rand(spec.shape, generator=gen) > 0.3
            t[..., 0] = True  # no fully masked row (that is NaN in torch as well)
        else:
            raise ValueError(spec.kind)
        out.append(t.to(device))
    return out


def build(case: OpCase, dtype: str, seed: int = 0) -> tuple[nn.Module, dict[str, Any], list[torch.Tensor]]:
    """(module in `dtype`, IR dict, example inputs on the CPU)."""
    torch.manual_seed(seed)
    module = case.make().eval().to(TORCH_DTYPES[dtype])
    gen = torch.Generator().manual_seed(seed + 1)
    inputs = make_inputs(case, dtype, gen)
    return module, ir_dict(module, inputs, f"{case.name}_{dtype}"), inputs


def module_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in {**module.state_dict(), **dict(module.named_buffers())}.items()}
