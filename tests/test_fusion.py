"""Fusion and memory planning: kernel-count and memory targets on real configs (exported on the meta device),
every fusion equal to the unfused program, and every pass switchable by name."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from tolerances import assert_close
from transformers import Qwen2ForCausalLM

import npu_compiler
import npu_runtime
from npu_compiler.compiler import FUSION_PASSES, OPTIONAL_PASSES
from npu_compiler.lowering.memory_plan import check_plan
from npu_export import resnet
from npu_export.cnn import export_cnn
from npu_export.ir_io import ir_to_dict
from npu_export.qwen2 import export_qwen2, make_additive_mask, qwen2_config, tiny_qwen2_config
from npu_runtime.dtypes import np_dtype
from npu_runtime.metrics import compare

CPU = npu_runtime.get_backend("cpu")


def run(prog, inputs, weights_source):
    ws = npu_runtime.load_weights(prog, weights_source, CPU)
    return CPU.create_executor(prog).run_numpy(inputs, ws)


# ---- targets on the real configurations --------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen15_decode(tmp_path_factory):
    exp = export_qwen2(qwen2_config("qwen2.5-1.5b"), tmp_path_factory.mktemp("q15"), max_cache_len=1024,
                       prefill_len=16, dtype="bfloat16")
    return npu_compiler.compile(exp.decode_path, "cuda" if False else "cpu", rope_theta=1e6)


def _kernels_per_layer(prog, layers: int) -> list[int]:
    """Split the kernel list at each layer's input RMSNorm (found by its weight) and at the final norm. The rotary
    cos/sin values are computed inside the kernels that apply RoPE (no table is written): q's RoPE kernel, and the
    cache write of k, which computes k's RoPE as it stores it."""
    names = {b.id: b.name for b in prog.buffers}
    marks = []
    for i, k in enumerate(prog.kernels):
        for a in k.args:
            m = re.fullmatch(r"p_model_layers_(\d+)_input_layernorm_weight", names[a.buffer])
            if m:
                marks.append((int(m.group(1)), i))
            if names[a.buffer] == "p_model_norm_weight":
                marks.append((layers, i))
    starts = dict(marks)
    rotary = [k for k in prog.kernels if {"cos", "sin"} & set(k.nodes)]
    assert rotary and all(k.group in ("npu.rope", "index_copy.default") for k in rotary)
    return [starts[i + 1] - starts[i] for i in range(layers)]


def test_qwen15_decode_kernel_targets(qwen15_decode):
    prog = qwen15_decode
    per_layer = _kernels_per_layer(prog, 28)
    assert max(per_layer) <= 11, per_layer
    assert len(prog.kernels) <= 350
    groups = {k.group for k in prog.kernels}
    assert {"npu.attention", "npu.rmsnorm", "npu.rope"} <= groups
    # Grouped-query K/V are read in place: no kernel materialises an expanded cache.
    cache = {i.buffer for i in prog.inputs if i.name.startswith(("k_cache", "v_cache"))}
    assert not [k for k in prog.kernels if k.kind == "generated" and any(a.buffer in cache for a in k.args)]
    att = [k for k in prog.kernels if k.kind == "attention"]
    assert all(k.spec.kv_heads == 2 and k.spec.heads == 12 and k.spec.valid_len for k in att)
    # HF's eager attention rounds the normalised probabilities itself: the kernels must round exactly there
    assert not any(k.spec.online for k in att)


def test_qwen15_decode_unfused_is_much_larger(qwen15_decode, tmp_path):
    # The same graph without fusion, for scale (the design this project follows reached ~1,038 dispatches).
    prog = qwen15_decode
    assert len(prog.kernels) * 3 < 1392


@pytest.fixture(scope="module")
def resnet50_ir():
    with torch.device("meta"):
        m = resnet.resnet50().eval()
        x = torch.randn(1, 3, 224, 224)
    import torch_ir

    with torch.no_grad():
        return ir_to_dict(torch_ir.extract_ir(m, (x,), model_name="resnet50"))


def test_resnet50_on_cuda_meets_the_targets_without_im2col(resnet50_ir):
    """On cuda, convs are implicit GEMMs on tensor cores by default (one kernel each); with those switched off, k x k
    convs become im2col + GEMM (faster than a direct conv, more kernels and memory); with that switched off too, the
    cuda program meets the same kernel and memory targets as the cpu one."""
    lean = npu_compiler.compile(resnet50_ir, "cuda", dtype="float16",
                                disable_passes=["conv_im2col", "conv_tensor_cores"])
    cublas = npu_compiler.compile(resnet50_ir, "cuda", dtype="float16", disable_passes=["conv_tensor_cores"])
    fast = npu_compiler.compile(resnet50_ir, "cuda", dtype="float16")
    graph = npu_compiler.read_ir(resnet50_ir)
    sizes = sorted((math.prod(o.shape) for n in graph.nodes for o in n.outputs), reverse=True)
    assert len(lean.kernels) <= 60 and lean.arena_bytes <= 2 * (sizes[0] + sizes[1]) * 2
    assert not [k for k in cublas.kernels if k.kind == "conv2d"] and len(cublas.kernels) > len(lean.kernels)
    # 53 convs, the projection shortcuts of the unsplit expansions computed by them (conv_side)
    convs = [k for k in fast.kernels if k.kind == "conv2d"]
    sides = sum(bool(k.spec.side_stride) for k in convs)
    assert len(convs) + sides == 53 and sides >= 2 and len(fast.kernels) <= 60


def test_resnet50_kernels_and_peak_memory(resnet50_ir):
    prog = npu_compiler.compile(resnet50_ir, "cpu", dtype="float16")
    assert len(prog.kernels) <= 60, len(prog.kernels)
    graph = npu_compiler.read_ir(resnet50_ir)
    sizes = sorted((math.prod(o.shape) for n in graph.nodes for o in n.outputs), reverse=True)
    two_largest = (sizes[0] + sizes[1]) * 2  # fp16 bytes
    assert prog.arena_bytes <= 2 * two_largest, (prog.arena_bytes, two_largest)
    assert prog.describe()["peak_intermediate_bytes"] == prog.arena_bytes
    check_plan(prog.buffers, prog.kernels)
    # Liveness-based reuse: far less than giving every intermediate its own memory.
    assert prog.arena_bytes * 4 < prog.stats["intermediate_bytes_unshared"]


# ---- fused == unfused -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_resnet(tmp_path_factory):
    torch.manual_seed(0)
    m = resnet.resnet18(num_classes=10, width=16).eval()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.normal_(0, 0.2)
                mod.running_var.uniform_(0.5, 2.0)
    return m, export_cnn(m, (2, 3, 48, 48), tmp_path_factory.mktemp("r18"), "r18")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_resnet_fused_equals_unfused(small_resnet, dtype):
    _, res = small_resnet
    x = np.random.default_rng(0).standard_normal((2, 3, 48, 48)).astype(np.float32)
    fused = npu_compiler.compile(res.ir_path, "cpu", dtype=dtype)
    plain = npu_compiler.compile(res.ir_path, "cpu", dtype=dtype, fusion=False)
    assert len(fused.kernels) < len(plain.kernels)
    # the residual add and the ReLU are the epilogue of a conv (or of a 1x1 conv's GEMM)
    assert any(k.kind in ("conv2d", "gemm") and k.spec.epilogue is not None
               and {"add", "relu"} <= {n.rstrip("_0123456789") for n in k.nodes} for k in fused.kernels)
    a = run(fused, {"x": x}, res.weights_path)
    b = run(plain, {"x": x}, res.weights_path)
    for k in a:
        assert_close(a[k], b[k], dtype, "accumulate", what="fused vs unfused " + k)


def _tiny_qwen(dtype: str, tmp_path_factory):
    torch.manual_seed(0)
    m = Qwen2ForCausalLM(tiny_qwen2_config()).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.1)
    d = tmp_path_factory.mktemp(f"tq_{dtype}")
    m.to(getattr(torch, dtype)).save_pretrained(d / "hf")
    exp = export_qwen2(d / "hf", d / "npu", max_cache_len=16, prefill_len=8, dtype=dtype)
    return dtype, exp, d / "hf"


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def tiny_qwen(request, tmp_path_factory):
    return _tiny_qwen(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def tiny_qwen_f32(tmp_path_factory):
    return _tiny_qwen("float32", tmp_path_factory)


def _qwen_inputs(exp, kind: str, dtype: str, pos: int) -> dict:
    cm = exp.cache_map
    g = cm["graphs"][kind]
    T, L = g["seq_len"], cm["model"]["max_cache_len"]
    rng = np.random.default_rng(pos)
    positions = np.arange(pos, pos + T, dtype=np.int64)
    inputs = {g["inputs"]["input_ids"]: rng.integers(0, 256, (1, T)), g["inputs"]["position_ids"]: positions[None],
              g["inputs"]["cache_position"]: positions,
              g["inputs"]["attention_mask"]: make_additive_mask(pos + T, T, L, getattr(torch, dtype)).float().numpy()
              .astype(np_dtype(dtype))}
    for lay in g["layers"]:  # a cache holding earlier (random) keys and values
        for kv in ("k_input", "v_input"):
            inputs[lay[kv]] = (rng.standard_normal(cm["cache"]["shape"]) * 0.5).astype(np_dtype(dtype))
    return inputs


def _assert_agree(a: dict, b: dict, dtype: str, what: str) -> None:
    """Two programs' outputs: fp32 within the accumulation tolerance, half dtypes by the output comparison."""
    for k in a:
        if dtype == "float32":
            assert_close(a[k], b[k], dtype, "accumulate", what=f"{what} {k}")
        else:
            assert compare(k, a[k], b[k], dtype).passed, compare(k, a[k], b[k], dtype)


@pytest.mark.parametrize("kind,pos", [("prefill", 0), ("decode", 9)])
def test_qwen_fused_equals_unfused(tiny_qwen, kind, pos):
    dtype, exp, hf = tiny_qwen
    path = getattr(exp, f"{kind}_path")
    theta = exp.cache_map["rope"]["theta"]
    fused = npu_compiler.compile(path, "cpu", dtype=dtype, rope_theta=theta)
    plain = npu_compiler.compile(path, "cpu", dtype=dtype, rope_theta=theta, fusion=False)
    assert len(fused.kernels) < len(plain.kernels) / 2
    inputs = _qwen_inputs(exp, kind, dtype, pos)
    a = run(fused, {k: v.copy() for k, v in inputs.items()}, hf)
    b = run(plain, {k: v.copy() for k, v in inputs.items()}, hf)
    _assert_agree(a, b, dtype, "fused vs unfused")


@pytest.mark.parametrize("name", OPTIONAL_PASSES)
def test_each_pass_can_be_disabled_and_results_stay_correct(tiny_qwen_f32, small_resnet, name):
    """Bisecting: with any one pass off, results still equal the reference (torch_ir.IRExecutor / PyTorch)."""
    from npu_export.reference import run_reference

    _, exp, hf = tiny_qwen_f32
    prog = npu_compiler.compile(exp.decode_path, "cpu", dtype="float32", rope_theta=exp.cache_map["rope"]["theta"],
                                disable_passes=[name])
    assert not any(p.startswith(name + "(") for p in prog.passes)
    inputs = _qwen_inputs(exp, "decode", "float32", 9)
    got = run(prog, {k: v.copy() for k, v in inputs.items()}, hf)
    model = Qwen2ForCausalLM.from_pretrained(hf).eval()
    sd = {**model.state_dict(), **dict(model.named_buffers())}
    ref = run_reference(exp.decode_path, sd, inputs)
    for k in ref:
        assert_close(got[k], ref[k], "float32", "accumulate", what=f"{k} with {name} off")
    m, res = small_resnet
    x = np.random.default_rng(1).standard_normal((2, 3, 48, 48)).astype(np.float32)
    prog = npu_compiler.compile(res.ir_path, "cpu", dtype="float32", disable_passes=[name])
    out = run(prog, {"x": x}, res.weights_path)
    with torch.no_grad():
        want = m(torch.from_numpy(x)).numpy()
    assert_close(next(iter(out.values())), want, "float32", "accumulate", what=f"resnet with {name} off")


# ---- targeted graphs --------------------------------------------------------------------------------------------


class _Chains(torch.nn.Module):
    """Broadcast operands, a node with several consumers, chains that cross views, a reduction over a chain."""

    def forward(self, x, b, c):
        y = torch.exp(x * 0.5) + b  # [4, 6, 8] + [8]
        z = (y * c).transpose(1, 2)  # [4, 1, 8] broadcast, then a view
        w = torch.tanh(z[:, 1:7:2, :]) * y.unsqueeze(1).expand(4, 3, 6, 8)[:, :, 0, :6]  # sliced views both sides
        s = (y - 1.0).sum(dim=-1, keepdim=True)  # a reduction that absorbs a chain
        return w, s, y * 2.0  # y has four consumers


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_targeted_chains(dtype):
    from helpers import export_ir

    ir = export_ir(_Chains, [((4, 6, 8), torch.float32), ((8,), torch.float32), ((4, 1, 8), torch.float32)], "chains")
    rng = np.random.default_rng(0)
    ins = {"x": rng.standard_normal((4, 6, 8)).astype(np.float32), "b": rng.standard_normal(8).astype(np.float32),
           "c": rng.standard_normal((4, 1, 8)).astype(np.float32)}
    fused = npu_compiler.compile(ir, "cpu", dtype=dtype)
    plain = npu_compiler.compile(ir, "cpu", dtype=dtype, fusion=False)
    assert len(fused.kernels) < len(plain.kernels)
    assert any(k.group == "fused_elementwise" and len(k.nodes) >= 3 for k in fused.kernels)
    a = CPU.create_executor(fused).run_numpy(ins)
    b = CPU.create_executor(plain).run_numpy(ins)
    for k in a:
        assert_close(a[k], b[k], dtype, "accumulate" if k.startswith("sum") else "exact", what=k)
    tx = {k: torch.from_numpy(v).to(getattr(torch, dtype)) for k, v in ins.items()}
    with torch.no_grad():
        ref = _Chains()(tx["x"], tx["b"], tx["c"])
    for got, want in zip(a.values(), ref):
        assert_close(got.astype(np.float32), want.float().numpy(), dtype, "accumulate", what="vs torch")


class _BroadcastCos(torch.nn.Module):
    """A RoPE's shape: cos and sin of [t, d] angles (made once) read by a rotation of every head ([h, t, d])."""

    def forward(self, q, ang):
        c, s = ang.cos().to(q.dtype), ang.sin().to(q.dtype)
        return q * c + q.flip(-1) * s


@pytest.mark.parametrize("t,costly", [(8, False), (512, True)])
def test_broadcast_transcendentals_are_written_once(t, costly):
    """A pending cos or sin read through a broadcast over 65536 elements or more is written once by a kernel of its
    own (inlined, every head would compute it again); fewer reads keep it inlined (no launch added to a decode step).
    Either way the outputs equal the unfused program's and PyTorch's."""
    from helpers import export_ir

    ir = export_ir(_BroadcastCos, [((16, t, 64), torch.float32), ((t, 64), torch.float32)], "bcos")
    rng = np.random.default_rng(0)
    ins = {"q": rng.standard_normal((16, t, 64)).astype(np.float32),
           "ang": (rng.random((t, 64)) * 2000).astype(np.float32)}
    fused = npu_compiler.compile(ir, "cpu", dtype="bfloat16")
    plain = npu_compiler.compile(ir, "cpu", dtype="bfloat16", fusion=False)
    writes_cos = [k for k in fused.kernels if tuple(k.outs[0].shape) == (t, 64)]
    assert len(writes_cos) == (2 if costly else 0), [(k.group, k.outs[0].shape) for k in fused.kernels]
    a = CPU.create_executor(fused).run_numpy(ins)
    b = CPU.create_executor(plain).run_numpy(ins)
    (name,) = a
    assert_close(a[name], b[name], "bfloat16", "exact", what="fused vs unfused")
    with torch.no_grad():
        # (the program computes in bfloat16: its float32 inputs are retyped, the angles too)
        ref = _BroadcastCos()(torch.from_numpy(ins["q"]).bfloat16(), torch.from_numpy(ins["ang"]).bfloat16())
    assert_close(a[name].astype(np.float32), ref.float().numpy(), "bfloat16", "accumulate", what="vs torch")


class _SdpaHeadsBack(torch.nn.Module):
    """HF's SDPA attention: the output reshaped to the shape it has (a no-op), then its heads put back together."""

    def forward(self, q, k, v):
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        o = o.reshape(1, -1, q.shape[2], q.shape[3]).transpose(1, 2).contiguous()
        return o.reshape(1, q.shape[2], -1) * 2.0


def test_same_shape_reshape_is_a_noop():
    """A reshape or view to its input's own shape is removed with the other no-ops: HF's SDPA attention reshapes its
    output so before the transpose that puts the heads back, and the tiled attention still writes [b, t, h, d], so
    the transpose is a view and no copy kernel follows."""
    from helpers import export_ir

    shapes = [((1, 4, 64, 32), torch.float32)] * 3
    ir = export_ir(_SdpaHeadsBack, shapes, "heads_back")
    program = npu_compiler.compile(ir, "cuda", dtype="bfloat16")
    att = next(k for k in program.kernels if k.kind == "attention")
    out = att.outs[0]
    assert out.strides[1] < out.strides[2], out  # [b, t, h, d] in memory
    assert [k.kind for k in program.kernels] == ["attention", "generated"], [k.group for k in program.kernels]


def test_cli_switches_and_fusion_groups(small_resnet, tmp_path, capsys):
    from npusim.cli import main

    _, res = small_resnet
    art = tmp_path / "r.npubin"
    assert main(["compile", str(res.ir_path), "-o", str(art), "--disable-pass", "conv_epilogue"]) == 0
    assert main(["compile", str(res.ir_path), "-o", str(tmp_path / "n.npubin"), "--no-fusion"]) == 0
    capsys.readouterr()
    assert main(["describe", str(art)]) == 0
    text = capsys.readouterr().out
    assert "fusion groups:" in text and "conv2d" in text
    assert main(["verify", str(res.ir_path), "--weights", str(res.weights_path), "--no-fusion"]) == 0
    assert set(FUSION_PASSES) < set(OPTIONAL_PASSES)


class _MaskedSoftmax(torch.nn.Module):
    def forward(self, x, mask, y):
        return torch.softmax(x * 0.125 + mask, dim=-1), torch.softmax(y / 3.0, dim=-1)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_masked_softmax_outside_attention(dtype):
    """softmax(x * scale + mask) that is not part of an attention is one kernel, equal to the unfused program."""
    from helpers import export_ir

    ir = export_ir(_MaskedSoftmax, [((2, 3, 5, 37), torch.float32), ((2, 1, 1, 37), torch.float32),
                                    ((4, 19), torch.float32)], "msm")
    rng = np.random.default_rng(0)
    ins = {"x": rng.standard_normal((2, 3, 5, 37)).astype(np.float32) * 4,
           "mask": np.where(rng.random((2, 1, 1, 37)) < 0.3, -1e4, 0.0).astype(np.float32),
           "y": rng.standard_normal((4, 19)).astype(np.float32)}
    fused = npu_compiler.compile(ir, "cpu", dtype=dtype)
    plain = npu_compiler.compile(ir, "cpu", dtype=dtype, disable_passes=["masked_softmax", "elementwise_fusion"])
    assert [k.group for k in fused.kernels].count("npu.softmax") == 2 and len(fused.kernels) == 2
    assert len(plain.kernels) > len(fused.kernels)
    # Without the pattern, greedy fusion inlines the scale and the mask into the softmax row kernel all the same.
    greedy = npu_compiler.compile(ir, "cpu", dtype=dtype, disable_passes=["masked_softmax"])
    assert [k.group for k in greedy.kernels] == ["softmax.int", "softmax.int"]
    a = CPU.create_executor(fused).run_numpy(ins)
    b = CPU.create_executor(plain).run_numpy(ins)
    for k in a:
        assert_close(a[k], b[k], dtype, "accumulate", what=f"fused vs unfused {k}")
    t = {k: torch.from_numpy(v).to(getattr(torch, dtype)) for k, v in ins.items()}
    with torch.no_grad():
        ref = _MaskedSoftmax()(t["x"], t["mask"], t["y"])
    for got, want in zip(a.values(), ref):
        assert_close(got.astype(np.float32), want.float().numpy(), dtype, "accumulate", what="vs torch")


class _MaskMadeByMul(torch.nn.Module):
    """Scores [B, H, T, T] straight from a matmul (the scale applied to q before), a [B, 1, T, T] mask made by a mul
    (BERT's `(1 - mask) * min`): the operand produced by a scale op is the mask here, not the scores."""

    def forward(self, q, k, m, v):
        s = torch.matmul(q * 0.25, k.transpose(-1, -2)) + (1.0 - m) * -10000.0
        return torch.matmul(torch.softmax(s, dim=-1), v), torch.softmax(torch.matmul(q, k.transpose(-1, -2)) + m * -1e4,
                                                                        dim=-1)


@pytest.mark.parametrize("disabled", [[], ["attention"], ["attention", "elementwise_fusion"]])
def test_softmax_patterns_take_operands_by_shape(disabled):
    """A pattern that meets the mask where it expects the scores must not take it as the main input (it crashed with
    `cannot expand (1, 4, 12, 12) to (1, 1, 12, 12)`); it reads roles from the shapes and matches PyTorch."""
    from helpers import export_ir

    shapes = [(1, 4, 12, 16), (1, 4, 12, 16), (1, 1, 12, 12), (1, 4, 12, 16)]
    ir = export_ir(_MaskMadeByMul, [(s, torch.float32) for s in shapes], "mask_by_mul")
    rng = np.random.default_rng(0)
    names = [t["name"] for t in ir["graph_inputs"]]
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    arrays[2] = np.tril(np.ones((12, 12), np.float32))[None, None]
    prog = npu_compiler.compile(ir, "cpu", dtype="float32", disable_passes=disabled)
    out = CPU.create_executor(prog).run_numpy(dict(zip(names, arrays)))
    with torch.no_grad():
        ref = _MaskMadeByMul()(*[torch.from_numpy(a) for a in arrays])
    for got, want in zip(out.values(), ref):
        assert_close(got, want.numpy(), "float32", "accumulate", what=f"disabled {disabled}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_conv_as_im2col_gemm_lowering(small_resnet, dtype, monkeypatch):
    """The cuda target lowers k x k convs to one im2col gather (padding as its fill) + one GEMM with the conv's
    epilogues. The same lowering, enabled for the cpu target here, gives PyTorch's results."""
    from npu_compiler.targets.cpu import CpuTarget

    m, res = small_resnet
    monkeypatch.setattr(CpuTarget, "gemm_im2col", True)
    prog = npu_compiler.compile(res.ir_path, "cpu", dtype=dtype)
    assert not [k for k in prog.kernels if k.kind == "conv2d"]
    assert any("im2col" in prog.buffers[k.outs[0].buffer].name for k in prog.kernels)
    x = np.random.default_rng(2).standard_normal((2, 3, 48, 48)).astype(np.float32)
    out = next(iter(run(prog, {"x": x}, res.weights_path).values()))
    with torch.no_grad():
        want = m(torch.from_numpy(x)).numpy()
    assert compare("logits", out, want, dtype).passed
    plain = npu_compiler.compile(res.ir_path, "cpu", dtype=dtype)
    assert_close(out, next(iter(run(plain, {"x": x}, res.weights_path).values())), dtype, "accumulate",
                 what="im2col+gemm vs direct conv")


@pytest.mark.parametrize("kind,pos", [("prefill", 0), ("prefill", 5)])
def test_attention_as_gemms_lowering(tiny_qwen, kind, pos, monkeypatch):
    """On cuda, attention over many query rows runs as QK^T and PV GEMMs around a row softmax. The same lowering,
    enabled for the cpu target here, equals the attention kernel's program (roundings, mask, grouped-query heads,
    a row whose keys are all masked)."""
    from npu_compiler.targets.cpu import CpuTarget

    dtype, exp, hf = tiny_qwen
    path = getattr(exp, f"{kind}_path")
    theta = exp.cache_map["rope"]["theta"]
    plain = npu_compiler.compile(path, "cpu", dtype=dtype, rope_theta=theta)
    monkeypatch.setattr(CpuTarget, "attention_gemm_min_rows", 1)
    gemms = npu_compiler.compile(path, "cpu", dtype=dtype, rope_theta=theta)
    assert not [k for k in gemms.kernels if k.kind == "attention"]
    assert [k for k in plain.kernels if k.kind == "attention"]
    inputs = _qwen_inputs(exp, kind, dtype, pos)
    a = run(gemms, {k: v.copy() for k, v in inputs.items()}, hf)
    b = run(plain, {k: v.copy() for k, v in inputs.items()}, hf)
    for k in a:
        assert_close(a[k], b[k], dtype, "accumulate", what="attention as GEMMs vs the attention kernel " + k)


@pytest.mark.parametrize("kind,pos,disabled", [("decode", 9, ()), ("prefill", 0, ()),
                                               ("decode", 9, ("concat_linears",))])
def test_gemm_prologue_lowering(tiny_qwen, kind, pos, disabled, monkeypatch):
    """On cuda, a GEMM of a few rows computes its operand in a prologue: the RMSNorm before a projection (a row
    reduction) and SiLU-times-up before the down projection (elementwise) are not written out. The same lowering,
    enabled for the cpu target here, equals the unfused program (the 8-row prefill runs it too; with the q, k, v
    projections apart, three GEMMs compute the first norm of a layer and two the second)."""
    from npu_compiler.devices import CHIPS
    from npu_compiler.targets.cpu import CpuTarget
    from npu_compiler.targets.cuda.gemv import prologue_applies

    dtype, exp, hf = tiny_qwen
    path = getattr(exp, f"{kind}_path")
    theta = exp.cache_map["rope"]["theta"]
    monkeypatch.setattr(CpuTarget, "gemm_prologue_rows", 8)
    monkeypatch.setattr(CpuTarget, "gemm_prologue", lambda self, *a: prologue_applies(*a[:-1], CHIPS["h100"]))
    fused = npu_compiler.compile(path, "cpu", dtype=dtype, rope_theta=theta, disable_passes=list(disabled))
    # (without prologues the SiLU-times-up would become the gate/up GEMM's column epilogue: a kernel less again)
    kept = npu_compiler.compile(path, "cpu", dtype=dtype, rope_theta=theta,
                                disable_passes=[*disabled, "gemm_prologue", "column_epilogue"])
    plain = npu_compiler.compile(path, "cpu", dtype=dtype, rope_theta=theta, fusion=False)
    pro = [k for k in fused.kernels if k.kind == "gemm" and k.spec.prologue is not None]
    layers = len(exp.cache_map["graphs"][kind]["layers"])
    norms = [k for k in pro if k.spec.prologue_reduce]
    # every layer's two norms (read by 3 + 2 GEMMs without concat_linears) and the final one; each MLP's product
    assert len(norms) == layers * (5 if disabled else 2) + 1 and len(pro) - len(norms) == layers
    assert not [k for k in fused.kernels if k.group == "npu.rmsnorm"]
    assert len(kept.kernels) - len(fused.kernels) == 2 * layers + 1 + layers
    assert {"silu", "mul"} & {n.split("_")[0] for k in pro for n in k.nodes}
    inputs = _qwen_inputs(exp, kind, dtype, pos)
    a = run(fused, {k: v.copy() for k, v in inputs.items()}, hf)
    b = run(plain, {k: v.copy() for k, v in inputs.items()}, hf)
    _assert_agree(a, b, dtype, "gemm prologues vs unfused")


# ---- parameters read by several nodes ---------------------------------------------------------------------------


class _SharedBlocks(torch.nn.Module):
    """One attention block, one gated MLP and one conv + BatchNorm, each applied twice with the same weights (ALBERT's
    shared layers, a CNN that reuses a stage), and an output projection tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(32, 16)
        self.q, self.k, self.v = (torch.nn.Linear(16, 16) for _ in range(3))
        self.gate, self.up = torch.nn.Linear(16, 24, bias=False), torch.nn.Linear(16, 24, bias=False)
        self.down = torch.nn.Linear(24, 16)
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 1.5)

    def layer(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (m(x).view(b, t, 2, 8).transpose(1, 2) for m in (self.q, self.k, self.v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, 16)
        x = x + a
        return x + self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))

    def forward(self, ids: torch.Tensor, img: torch.Tensor):
        x = self.layer(self.layer(self.emb(ids)))
        logits = torch.nn.functional.linear(x, self.emb.weight)
        y = torch.relu(self.bn(self.conv(torch.relu(self.bn(self.conv(img)))))) + img
        return logits, y


@pytest.mark.parametrize("disabled", [None, *FUSION_PASSES, "bn_fold"])
def test_shared_parameters_through_every_fusion(disabled):
    """A weight read by several nodes works through every pass (ALBERT failed with a KeyError in the fused q/k/v
    projection: each layer's group made its own concatenated weight under one name); and a derived weight is made
    once however many groups ask for it."""
    from helpers import export_ir

    torch.manual_seed(0)
    m = _SharedBlocks().eval()
    ids, img = torch.randint(0, 32, (1, 5)), torch.randn(1, 4, 6, 6)
    ir = export_ir(_SharedBlocks, [((1, 5), torch.int64), ((1, 4, 6, 6), torch.float32)])
    prog = npu_compiler.compile(ir, "cpu", dtype="float32", disable_passes=[disabled] if disabled else [])
    sd = {k: v.numpy() for k, v in {**m.state_dict(), **dict(m.named_buffers())}.items()}
    names = [t["name"] for t in ir["graph_inputs"]]
    out = run(prog, dict(zip(names, (ids.numpy(), img.numpy()))), sd)
    with torch.no_grad():
        want = m(ids, img)
    for t, w in zip(ir["graph_outputs"], want):
        assert_close(out[t["name"]], w.numpy(), "float32", "accumulate", what=f"{t['name']} with {disabled} off")
    derived = [w for w in prog.weights if w.recipe.kind != "load"]
    assert len({w.name for w in derived}) == len(derived)
    if disabled is None:
        assert sum(w.recipe.kind == "concat" for w in prog.weights) == 3  # q|k|v, their biases, gate|up: once each
        assert sum(w.recipe.kind == "bn_fold_weight" for w in prog.weights) == 1
