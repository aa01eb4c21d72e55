"""The model zoo (`npu_export.zoo`): small random-weight models of many architectures, built from `transformers` config
classes, each exported with torch_ir, checked against eager PyTorch through torch_ir.IRExecutor, then compiled to one
program (every node on the target, no CPU partition) and verified against that reference on every backend present,
as shipped in float32 and in its family's half dtype, each with its default compute dtype (the model's own).
Tolerances: `npu_export.zoo.ZOO_TOLERANCE`, per family and dtype (docs/tolerances.md).

An entry whose transformers classes this release lacks is skipped, and the skip names them."""

from __future__ import annotations

import numpy as np
import pytest
from tolerances import assert_close

from npu_compiler.errors import NPURuntimeError
from npu_export.zoo import ZOO, ZooUnavailable, export_zoo_model, half_dtype, verify_zoo_model

PARAMS = [pytest.param(name, dt, id=f"{name}-{dt}") for name, z in ZOO.items()
          for dt in ("float32", half_dtype(z.family))]


def _export(name: str, dtype: str):
    try:
        return export_zoo_model(name, dtype)
    except ZooUnavailable as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("name,dtype", PARAMS)
def test_export_matches_eager(name: str, dtype: str) -> None:
    """The exported graph, run op by op by torch_ir.IRExecutor, is the model: the reference the compiled program is
    held to must itself agree with eager PyTorch (it did not, for Whisper, OPT and T5, before
    `npu_runtime.fallback.executable_ir`)."""
    from npu_export.reference import run_reference

    ex = _export(name, dtype)
    ref = run_reference(ex.ir, ex.weights, ex.inputs)
    for t, eager in zip(ex.ir["graph_outputs"], ex.eager):
        assert_close(ref[t["name"]], eager.astype(np.float32) if eager.dtype.kind == "f" else eager, dtype,
                     "accumulate", what=f"{name} IRExecutor vs eager")


# (backend, model) -> the error that backend stops the model with, by design (docs/webgpu.md: int64 on webgpu)
REFUSED = {("webgpu", "t5-encoder"): "left the int32 range the webgpu backend computes integers in"}


@pytest.mark.parametrize("name,dtype", PARAMS)
def test_zoo_model_on_backend(backend, name: str, dtype: str) -> None:
    _export(name, dtype)
    refused = REFUSED.get((backend.name, name))
    if refused:
        with pytest.raises(NPURuntimeError, match=refused):
            verify_zoo_model(name, dtype, backend)
        return
    r = verify_zoo_model(name, dtype, backend)
    assert not r.fallback_ops, f"{name}: ops without a lowering for target '{backend.compile_target()}': " \
                               f"{r.fallback_ops}"
    assert r.npu_nodes == r.ir_nodes
    assert r.compute_dtype == dtype, "the default compute dtype is the model's own"
    assert r.passed, (f"{name} ({dtype}) on {backend.name}: max_rel {r.max_rel:.3g}, pearson {r.pearson:.6f}; "
                      f"tolerance {r.tolerance}")


def test_mixture_of_experts_reference_routes_without_ties() -> None:
    """A tie between router probabilities at the top-k boundary has no single right answer (ATen picks by its
    nth_element, ours by index): the MoE entries' inputs must have none, in every dtype the zoo runs them."""
    moe = [n for n, z in ZOO.items() if z.family == "moe"]
    assert moe
    from npu_export.reference import run_reference_all

    for name in moe:
        for dtype in ("float32", half_dtype(ZOO[name].family)):
            ex = _export(name, dtype)
            values, _ = run_reference_all(ex.ir, ex.weights, ex.inputs)
            topk = [n for n in ex.ir["nodes"] if n["op_type"] == "aten.topk.default"]
            assert topk, name
            for node in topk:
                x = np.sort(values[node["inputs"][0]["name"]].astype(np.float32), axis=-1)[..., ::-1]
                k = node["attrs"]["k"]
                assert not (x[..., k - 1] == x[..., k]).any(), f"{name} ({dtype}) node {node['name']}: a tie"


def test_the_zoo_covers_the_architectures_asked_for() -> None:
    wanted = {"bert", "distilbert", "t5-encoder", "gpt2", "opt", "llama", "mistral", "qwen2", "phi3", "gemma",
              "mixtral", "mamba", "whisper-encoder", "vit", "swin", "convnext", "resnet", "mobilenet-v2",
              "efficientnet", "segformer", "albert", "falcon", "beit", "mobilevit", "wav2vec2", "siglip-vision",
              "mtcnn-prelu", "lstm-tagger", "torch-transformer-encoder"}
    have = {n.removesuffix("-eager").removesuffix("-sdpa") for n in ZOO}
    assert wanted <= have, sorted(wanted - have)
    decoders = [n for n, z in ZOO.items() if z.family in ("decoder", "moe")]
    for base in {n.rsplit("-", 1)[0] for n in decoders}:
        assert {f"{base}-eager", f"{base}-sdpa"} <= set(ZOO), base


def test_a_missing_transformers_class_skips_by_name(monkeypatch) -> None:
    """On a transformers release without a model's classes, the entry says which class is missing (the tests turn
    that into a skip naming it, never a pass)."""
    import transformers

    from npu_export.zoo import build_zoo_model

    monkeypatch.delattr(transformers, "MambaConfig", raising=False)
    monkeypatch.setattr(transformers, "MambaConfig", None)
    with pytest.raises(ZooUnavailable, match=r"zoo model 'mamba': transformers .* has no MambaConfig"):
        build_zoo_model("mamba")


def test_op_coverage_report_is_generated_from_the_code() -> None:
    """bench/op_coverage.py (docs/op_coverage.md): the zoo's ops with each target's answer, and torch's own core ATen
    list (not a hand-written one)."""
    import importlib.util
    from pathlib import Path

    import torch

    from npu_compiler.op_support import unsupported_reason

    path = Path(__file__).resolve().parent.parent / "bench" / "op_coverage.py"
    spec = importlib.util.spec_from_file_location("op_coverage", path)
    cov = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cov)
    core = cov.core_aten_ops()
    assert "add.Tensor" in core and "convolution.default" in core and len(core) > 150
    assert all(torch.Tag.core in getattr(getattr(torch.ops.aten, op.split(".")[0]), op.split(".")[1]).tags
               for op in core)
    text = cov.render(["llama-eager", "vit"])
    assert "| `layer_norm.default` | 1 | yes | yes | yes |" in text and "| llama-eager |" in text
    inference = [op for op in core if cov.excluded_reason(op) is None]
    share = sum(unsupported_reason("cpu", op) is None for op in inference)
    assert f"| cpu | {share} of {len(inference)} |" in text
    # the page's parts that do not depend on the zoo are what the code says now (they drifted once)
    page = (path.parent.parent / "docs" / "op_coverage.md").read_text()
    core_part = "## PyTorch's core ATen op set"
    assert page[page.index(core_part):] == text[text.index(core_part):], \
        "docs/op_coverage.md is stale: python bench/op_coverage.py -o docs/op_coverage.md"


def test_every_inference_op_of_core_aten_runs_on_every_target() -> None:
    """Every overload of PyTorch's core ATen set that an inference graph can hold (not a backward, random or
    symbolic-size op: bench/op_coverage.py says why for each of those) runs on cpu, cuda and webgpu."""
    import importlib.util
    from pathlib import Path

    from npu_compiler.op_support import unsupported_reason
    from npu_compiler.targets.codegen import TARGET_MODULES

    path = Path(__file__).resolve().parent.parent / "bench" / "op_coverage.py"
    spec = importlib.util.spec_from_file_location("op_coverage", path)
    cov = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cov)
    missing = {t: [op for op in cov.core_aten_ops() if cov.excluded_reason(op) is None
                   and unsupported_reason(t, op) is not None] for t in TARGET_MODULES}
    assert not any(missing.values()), missing


def test_lstm_tagger_takes_final_states_with_an_added_unit_dim(monkeypatch) -> None:
    """torch 2.11's export traces an LSTM's h_n/c_n as [layers * dirs, 1, batch, hidden]; the tagger must still feed
    its GRUCell [batch, features] (a 3-D input made torch 2.11 refuse the export) and compute what eager computes."""
    import torch

    from npu_export.zoo_nn import LSTMTagger, steps_inputs

    torch.manual_seed(0)
    model, (ids,) = LSTMTagger().eval(), steps_inputs()
    with torch.no_grad():
        want = model(ids)
        plain = torch.nn.LSTM.forward

        def with_unit_dim(self, *args, **kwargs):
            y, (h, c) = plain(self, *args, **kwargs)
            return y, (h.unsqueeze(1), c.unsqueeze(1))

        monkeypatch.setattr(torch.nn.LSTM, "forward", with_unit_dim)
        got = model(ids)
    assert torch.equal(got, want)
