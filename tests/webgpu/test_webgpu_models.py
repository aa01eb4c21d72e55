"""Models on the webgpu backend against PyTorch: ResNet-18 (fp32, fp16), a tiny Qwen2 (static-cache prefill and
teacher-forced decode steps with the KV cache bound to both programs on the device; fp32, bf16, fp16, eager and sdpa
attention), greedy generation through `npu_runtime.llm.LLM`, and the partition path (ops the target lacks on the
CPU). Small sizes: in CI the device is Mesa's software Vulkan driver."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from fused_cases import ir_dict, module_weights

import npu_compiler
from npu_runtime import get_backend, load_weights
from npu_runtime.metrics import compare, pearson, topk_agreement

P, S = 8, 8  # prefill tokens, decode steps


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_resnet18(webgpu, dtype) -> None:
    from npu_export import resnet

    torch.manual_seed(0)
    model = resnet.resnet18(num_classes=100).eval()
    with torch.no_grad():  # non-trivial BN statistics, so folding is really exercised
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.2)
                m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    program = npu_compiler.compile(ir_dict(model, [x], "resnet18"), "webgpu", dtype=dtype)
    weights = load_weights(program, module_weights(model), webgpu)
    ex = webgpu.create_executor(program)
    ex.poison()
    name = program.inputs[0].name
    got = ex.run_numpy({name: x.numpy()}, weights)[program.outputs[0].name]
    again = ex.run_numpy({name: x.numpy()}, weights)[program.outputs[0].name]
    assert got.tobytes() == again.tobytes()
    with torch.no_grad():
        ref = model(x).numpy()
    np.testing.assert_array_equal(got.argmax(-1), ref.argmax(-1))
    assert topk_agreement(got, ref, 5) >= (1.0 if dtype == "float32" else 0.8)
    c = compare("logits", got, ref, dtype)
    assert c.max_rel <= (1e-4 if dtype == "float32" else 2e-2), c
    assert c.passed, c


def _qwen(dtype: torch.dtype, attn: str):
    from npu_export.qwen2 import random_tiny_qwen2

    return random_tiny_qwen2(attn, dtype)


class StaticRunner:
    """Prefill and decode programs over one KV cache on the device, bound to both executors (what the LLM loop does,
    written out so each step's logits can be compared)."""

    def __init__(self, backend, model, export, dtype: str) -> None:
        from npu_export.cnn import model_tensors

        theta = export.cache_map["rope"]["theta"]
        self.progs = {g: npu_compiler.compile(getattr(export, f"{g}_path"), "webgpu", dtype=dtype, rope_theta=theta)
                      for g in ("prefill", "decode")}
        self.weights = load_weights(self.progs["prefill"], model_tensors(model), backend)
        spec = {s.name: s for s in self.progs["prefill"].inputs}
        layers = export.cache_map["graphs"]["prefill"]["layers"]
        self.cache = {spec[lay[kv]].name: backend.zeros(tuple(spec[lay[kv]].shape), spec[lay[kv]].device_dtype)
                      for lay in layers for kv in ("k_input", "v_input")}
        self.ex, self.names = {}, {}
        for g, prog in self.progs.items():
            glay = export.cache_map["graphs"][g]["layers"]
            bindings = {lay[kv]: self.cache[pl[kv]] for lay, pl in zip(glay, layers) for kv in ("k_input", "v_input")}
            self.ex[g] = backend.create_executor(prog, bindings=bindings)
            self.ex[g].bind_weights(self.weights)
            self.names[g] = export.cache_map["graphs"][g]
        self.L = export.cache_map["model"]["max_cache_len"]

    def call(self, g: str, ids: np.ndarray, start: int) -> np.ndarray:
        from npu_export.qwen2 import make_additive_mask
        from npu_export.reference import to_numpy

        T = len(ids)
        pos = np.arange(start, start + T, dtype=np.int64)
        names = self.names[g]["inputs"]
        mask_spec = next(s for s in self.progs[g].inputs if s.name == names["attention_mask"])
        mask = to_numpy(make_additive_mask(start + T, T, self.L, getattr(torch, mask_spec.dtype)))
        out = self.ex[g].run({names["input_ids"]: ids.reshape(1, T), names["position_ids"]: pos.reshape(1, T),
                              names["cache_position"]: pos, names["attention_mask"]: mask})
        logits = self.names[g]["outputs"]["logits"]
        spec = next(s for s in self.progs[g].outputs if s.name == logits)
        return np.asarray(out[logits].to_numpy(spec), np.float32).reshape(T, -1)


@pytest.mark.parametrize("dtype,attn", [("float32", "eager"), ("bfloat16", "eager"), ("bfloat16", "sdpa"),
                                        ("float16", "sdpa")])
def test_tiny_qwen2_prefill_decode(webgpu, dtype, attn, tmp_path) -> None:
    """Prefill of P tokens, then S decode steps fed the true next tokens: logits against transformers at every
    position. The cache lives on the device, written in place by both programs."""
    from npu_export.qwen2 import export_qwen2

    if dtype == "float16" and "shader-f16" not in webgpu.state.features:
        pytest.skip("the adapter has no shader-f16: float16 is covered as 16-bit words by test_webgpu_backend")
    model = _qwen(getattr(torch, dtype), attn)
    export = export_qwen2(model, tmp_path, max_cache_len=32, prefill_len=P, dtype=dtype, attn_implementation=attn)
    runner = StaticRunner(webgpu, model, export, dtype)
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, P + S).astype(np.int64)
    rows = [runner.call("prefill", ids[:P], 0)] + [runner.call("decode", ids[p:p + 1], p) for p in range(P, P + S)]
    got = np.concatenate(rows)
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids)[None]).logits[0].float().numpy()
    for i in range(P + S):
        assert pearson(got[i], ref[i]) >= 0.999, f"position {i}: pearson {pearson(got[i], ref[i])}"
    if dtype == "float32":
        np.testing.assert_array_equal(got.argmax(-1), ref.argmax(-1))
        np.testing.assert_allclose(got, ref, atol=2e-4, rtol=1e-3)
    # the cache buffers were written in place: the executors' inputs are the shared device buffers
    for ex in runner.ex.values():
        for name, buf in runner.cache.items():
            if name in ex._bound:
                assert ex.input_buffer(name).buffer is buf.buffer
    assert any(buf.to_numpy().astype(np.float32).any() for buf in runner.cache.values())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_split_decode_attention(webgpu, dtype, tmp_path) -> None:
    """Decode over a 256-slot cache: each query row's keys are split across workgroups (flash-decoding: three
    dispatches over a scratch output); logits follow transformers at positions on both sides of the splits'
    boundaries, and the keys past the last written position are never read."""
    from npu_export.qwen2 import export_qwen2

    model = _qwen(getattr(torch, dtype), "sdpa")
    export = export_qwen2(model, tmp_path, max_cache_len=256, prefill_len=P, dtype=dtype, attn_implementation="sdpa")
    runner = StaticRunner(webgpu, model, export, dtype)
    att = [k for k in runner.progs["decode"].kernels if k.kind == "attention"]
    assert att and all(k.plan.splits >= 2 and len(k.scratch) == 1 for k in att)
    steps = runner.ex["decode"].rendered.steps[runner.progs["decode"].kernels.index(att[0])]
    assert [d.grid[1] for d in steps] == [att[0].plan.splits] * 2 + [1]
    n = 40
    ids = np.random.default_rng(2).integers(0, model.config.vocab_size, n).astype(np.int64)
    rows = [runner.call("prefill", ids[:P], 0)] + [runner.call("decode", ids[p:p + 1], p) for p in range(P, n)]
    got = np.concatenate(rows)
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids)[None]).logits[0].float().numpy()
    for i in range(n):
        assert pearson(got[i], ref[i]) >= 0.999, f"position {i}: pearson {pearson(got[i], ref[i])}"
    if dtype == "float32":
        np.testing.assert_allclose(got, ref, atol=2e-4, rtol=1e-3)


def test_llm_greedy_generation_matches_transformers(webgpu, tmp_path) -> None:
    """The project's LLM runtime, unchanged, on webgpu: greedy tokens equal transformers' generate (fp32), and
    equal the cpu backend's."""
    from npu_export.llm_export import export_llm
    from npu_runtime.llm import LLM

    model = _qwen(torch.float32, "eager")
    mdir = tmp_path / "model"
    model.save_pretrained(mdir, safe_serialization=True)
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, model.config.vocab_size, 5)]
    tokens = {}
    for target in ("webgpu", "cpu"):
        out = tmp_path / f"llm_{target}"
        export_llm(out, model_dir=mdir, max_cache_len=32, prefill_len=P, dtype="float32", target=target)
        llm = LLM.load(out, get_backend(target))
        res = llm.generate(prompt, 12, stop_tokens=[])
        assert res.backend == target
        tokens[target] = res.tokens
    with torch.no_grad():
        ids = torch.tensor([prompt])
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    assert tokens["webgpu"] == ref[0, len(prompt):].tolist() == tokens["cpu"]


class Mixed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(16, 16)
        self.l2 = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = self.l1(x).relu()
        c = torch.cumsum(y, dim=-1)  # no lowering: the CPU
        z = self.l2(c) * 0.5 + y  # back on the device
        return torch.cummin(z, dim=-1).values, z.softmax(-1)


def test_partitioned_run_matches_torch(webgpu) -> None:
    """The partition path on webgpu: ops without a lowering run on the CPU through torch_ir, the rest on the
    device, with the transfers at the boundaries."""
    from npu_compiler.partition import partition
    from npu_runtime.dag_executor import DAGExecutor

    torch.manual_seed(0)
    model = Mixed().eval()
    x = torch.randn(4, 16)
    data = ir_dict(copy.deepcopy(model), [x], "mixed")
    plan = partition(data, "webgpu")
    assert {p.device for p in plan.partitions} == {"npu", "cpu"}
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ex = DAGExecutor(plan, webgpu, weights=sd, dtype="float32")
    assert any(s is not None and s.program is not None and s.program.target == "webgpu" for s in ex.stages)
    outs = ex.run({data["graph_inputs"][0]["name"]: x.numpy()})
    with torch.no_grad():
        ref = model(x)
    for name, r in zip([t["name"] for t in data["graph_outputs"]], ref):
        np.testing.assert_allclose(np.asarray(outs[name], np.float32), r.numpy(), rtol=1e-5, atol=1e-5, err_msg=name)
    assert ex.num_transfers == plan.num_transfers > 0
