"""npu_export: ResNet and Qwen2 exports, checked by running the reloaded IR JSON in torch_ir's reference executor."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch_ir import IRExecutor
from transformers import Qwen2ForCausalLM

from npu_export._atomic import atomic_path
from npu_export.cnn import export_cnn
from npu_export.ir_io import ir_to_dict, load_ir_for_executor, save_ir_json
from npu_export.qwen2 import (
    CACHE_MAP_FORMAT,
    export_qwen2,
    make_additive_mask,
    qwen2_config,
    random_tiny_qwen2,
    tiny_qwen2_config,
)
from npu_export.resnet import resnet18, resnet50

P, L = 8, 32  # prefill length, static cache slots


# --- helpers --------------------------------------------------------------------------------------------------


def _randomize_bn(model: torch.nn.Module) -> None:
    # Fresh BN stats (mean 0, var 1) would make eval-mode BN nearly an identity and hide a wrong mapping.
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)


def _tiny_qwen2(attn_implementation: str = "eager", dtype: torch.dtype = torch.float32) -> Qwen2ForCausalLM:
    return random_tiny_qwen2(attn_implementation, dtype)


def _executor_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    # Non-persistent buffers (rotary inv_freq) are not in the state dict but the IR reads them.
    return {**model.state_dict(), **dict(model.named_buffers())}


def _run_static_cache(
    prefill_ir, decode_ir, weights: dict[str, torch.Tensor], ids: torch.Tensor, num_layers: int, kv_shape, dtype
) -> torch.Tensor:
    """Prefill ids[:, :P], then decode the remaining tokens one at a time; logits of every position."""
    kv = [torch.zeros(kv_shape, dtype=dtype) for _ in range(2 * num_layers)]
    out = IRExecutor(prefill_ir, weights=weights).execute(
        (ids[:, :P], torch.arange(P)[None], torch.arange(P), make_additive_mask(P, P, L, dtype), *kv)
    )
    logits, kv = [out[0]], list(out[1:])
    decode = IRExecutor(decode_ir, weights=weights)
    for p in range(P, ids.shape[1]):
        out = decode.execute(
            (ids[:, p : p + 1], torch.tensor([[p]]), torch.tensor([p]), make_additive_mask(p + 1, 1, L, dtype), *kv)
        )
        logits.append(out[0])
        kv = list(out[1:])
    return torch.cat(logits, dim=1)


# --- ResNet ---------------------------------------------------------------------------------------------------


def test_resnet_state_dict_keys_match_torchvision() -> None:
    r18, r50 = resnet18(), resnet50()
    # torchvision's counts: 122 / 320 state-dict entries, 11,689,512 / 25,557,032 parameters
    assert len(r18.state_dict()) == 122 and sum(p.numel() for p in r18.parameters()) == 11_689_512
    assert len(r50.state_dict()) == 320 and sum(p.numel() for p in r50.parameters()) == 25_557_032
    for key in (
        "conv1.weight",
        "bn1.running_var",
        "layer1.0.conv1.weight",
        "layer2.0.downsample.0.weight",
        "layer2.0.downsample.1.num_batches_tracked",
        "layer4.1.bn2.bias",
        "fc.weight",
        "fc.bias",
    ):
        assert key in r18.state_dict()
    assert "layer4.2.conv3.weight" in r50.state_dict() and "layer1.0.downsample.1.weight" in r50.state_dict()
    small = resnet18(num_classes=10, width=16)
    assert list(small.state_dict()) == list(r18.state_dict())
    assert small.fc.weight.shape == (10, 128)


def test_resnet18_export_matches_torch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = resnet18(num_classes=10, width=16)
    _randomize_bn(model)
    result = export_cnn(model, (2, 3, 64, 64), tmp_path, "resnet18_small")
    assert result.ir_path == tmp_path / "resnet18_small.json" and result.ir_path.is_file()

    weights = load_file(result.weights_path)
    assert set(weights) == set(model.state_dict())  # BN running stats and num_batches_tracked included
    ir = load_ir_for_executor(result.ir_path)
    assert len(ir.nodes) == 69
    x = torch.randn(2, 3, 64, 64)
    (got,) = IRExecutor(ir, weights=weights).execute((x,))
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert not list(tmp_path.glob(".*.tmp"))


# --- IR JSON --------------------------------------------------------------------------------------------------


def test_bf16_export_stringifies_attrs_and_reloads(tmp_path: Path) -> None:
    ex = export_qwen2(tiny_qwen2_config(), tmp_path, max_cache_len=L, prefill_len=P)  # meta device, bf16
    data = json.loads(ex.decode_path.read_text())
    attrs = [n["attrs"] for n in data["nodes"]]
    assert {"dtype": "torch.float32", "device": "cpu", "layout": "torch.strided"} in attrs  # _assert_tensor_metadata
    assert {"dtype": "torch.bfloat16"} in attrs  # to.dtype
    assert {"dim": -1, "dtype": "torch.float32"} in attrs  # softmax.int
    assert {t["dtype"] for t in data["graph_inputs"][3:]} == {"bfloat16"}  # mask and caches in the model dtype

    ir = load_ir_for_executor(ex.decode_path)
    restored = {n.op_type: n.attrs for n in ir.nodes}
    assert restored["aten.to.device"] == {"device": torch.device("cpu"), "dtype": torch.float32}
    assert restored["aten._assert_tensor_metadata.default"]["layout"] is torch.strided
    assert restored["aten.softmax.int"]["dtype"] is torch.float32
    # a reload saves back to the very same JSON
    assert ir_to_dict(ir) == data

    # and runs: the bf16 graph against HF's bf16 model
    model = _tiny_qwen2(dtype=torch.bfloat16)
    ids = torch.randint(0, 256, (1, P + 1))
    prefill = load_ir_for_executor(ex.prefill_path)
    got = _run_static_cache(prefill, ir, _executor_weights(model), ids, 2, (1, 2, L, 16), torch.bfloat16)
    with torch.no_grad():
        want = model(ids).logits
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)


def test_save_is_atomic(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half-writ")
        raise RuntimeError("export failed midway")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]

    ir_dict = {
        "model_name": "m",
        "pytorch_version": "",
        "graph_inputs": [],
        "graph_outputs": [],
        "weights": [],
        "weight_name_mapping": {},
        "nodes": [],
    }
    save_ir_json(ir_dict, target)
    assert json.loads(target.read_text()) == ir_dict


# --- Qwen2 ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_qwen2_static_cache_matches_hf(tmp_path: Path, attn_implementation: str) -> None:
    model = _tiny_qwen2(attn_implementation)
    ex = export_qwen2(
        model, tmp_path, max_cache_len=L, prefill_len=P, dtype=None, attn_implementation=attn_implementation
    )
    prefill, decode = load_ir_for_executor(ex.prefill_path), load_ir_for_executor(ex.decode_path)
    ops = {n.op_type for n in decode.nodes}
    assert ("aten.scaled_dot_product_attention.default" in ops) == (attn_implementation == "sdpa")

    torch.manual_seed(1)
    ids = torch.randint(0, 256, (1, P + 2))
    got = _run_static_cache(prefill, decode, _executor_weights(model), ids, 2, (1, 2, L, 16), torch.float32)
    with torch.no_grad():
        want = model(ids).logits  # full sequence, no cache
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_cache_map(tmp_path: Path) -> None:
    ex = export_qwen2(tiny_qwen2_config(), tmp_path, max_cache_len=L, prefill_len=P)
    cm = json.loads(ex.cache_map_path.read_text())
    assert cm == ex.cache_map and cm["format"] == CACHE_MAP_FORMAT
    assert {
        k: cm["model"][k]
        for k in (
            "num_layers",
            "kv_heads",
            "head_dim",
            "max_cache_len",
            "prefill_len",
            "vocab_size",
            "dtype",
            "rope_theta",
            "tie_word_embeddings",
        )
    } == {
        "num_layers": 2,
        "kv_heads": 2,
        "head_dim": 16,
        "max_cache_len": L,
        "prefill_len": P,
        "vocab_size": 256,
        "dtype": "bfloat16",
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
    }

    for graph, ir, seq_len in (("prefill", ex.prefill_ir, P), ("decode", ex.decode_ir, 1)):
        entry = cm["graphs"][graph]
        assert entry["file"] == f"{graph}.json" and entry["seq_len"] == seq_len
        inputs = {t.name: t for t in ir.graph_inputs}
        outputs = {t.name: t for t in ir.graph_outputs}
        assert entry["input_order"] == list(inputs) and entry["output_order"] == list(outputs)
        assert inputs[entry["inputs"]["attention_mask"]].shape == (1, 1, seq_len, L)
        assert inputs[entry["inputs"]["cache_position"]].shape == (seq_len,)
        assert outputs[entry["outputs"]["logits"]].shape == (1, seq_len, 256)
        assert [layer["layer"] for layer in entry["layers"]] == [0, 1]
        for layer in entry["layers"]:
            for kind in "kv":
                assert inputs[layer[f"{kind}_input"]].shape == outputs[layer[f"{kind}_output"]].shape == (1, 2, L, 16)

    placeholders = cm["weights"]["placeholders"]
    lm_head = placeholders["p_lm_head_weight"]
    assert (lm_head["source"], lm_head["checkpoint_key"]) == ("tied", "model.embed_tokens.weight")
    # the graph reads the tied matrix through the lm_head placeholder only
    assert "p_model_embed_tokens_weight" not in placeholders
    inv_freq = placeholders["b_model_rotary_emb_inv_freq"]
    assert (inv_freq["source"], inv_freq["checkpoint_key"], inv_freq["dtype"]) == ("rope_inv_freq", None, "float32")
    assert cm["rope"]["inv_freq_placeholders"] == ["b_model_rotary_emb_inv_freq"]


def test_prefill_last_logits_only_and_builtin_name(tmp_path: Path) -> None:
    ex = export_qwen2("tiny", tmp_path, max_cache_len=L, prefill_len=P, prefill_last_logits_only=True)
    assert ex.cache_map["graphs"]["prefill"]["logits_shape"] == [1, 1, 256]
    assert ex.cache_map["graphs"]["decode"]["logits_shape"] == [1, 1, 256]
    with pytest.raises(ValueError):
        export_qwen2("tiny", tmp_path, max_cache_len=4, prefill_len=P)
    with pytest.raises(FileNotFoundError):
        export_qwen2(tmp_path / "missing", tmp_path, max_cache_len=L, prefill_len=P)


def test_export_from_model_dir_runs_from_cache_map_alone(tmp_path: Path) -> None:
    """What a runtime does: weights by cache_map from the model's safetensors, inv_freq computed from rope."""
    model = _tiny_qwen2()
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    ex = export_qwen2(model_dir, tmp_path / "out", max_cache_len=L, prefill_len=P, dtype=None)
    cm = ex.cache_map
    assert cm["model"]["dtype"] == "float32" and cm["weights"]["checkpoint_files"] == ["model.safetensors"]

    checkpoint = load_file(model_dir / "model.safetensors")
    assert "lm_head.weight" not in checkpoint  # HF drops the tied half
    rope = cm["rope"]
    inv_freq = 1.0 / rope["theta"] ** (torch.arange(0, rope["head_dim"], 2, dtype=torch.float32) / rope["head_dim"])
    weights = {}
    for name, w in cm["weights"]["placeholders"].items():
        tensor = inv_freq if w["source"] == "rope_inv_freq" else checkpoint[w["checkpoint_key"]]
        assert list(tensor.shape) == w["shape"]
        weights[name] = tensor

    ids = torch.randint(0, 256, (1, P + 1))
    prefill, decode = load_ir_for_executor(ex.prefill_path), load_ir_for_executor(ex.decode_path)
    got = _run_static_cache(prefill, decode, weights, ids, 2, tuple(cm["cache"]["shape"]), torch.float32)
    with torch.no_grad():
        want = model(ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_make_additive_mask() -> None:
    neg = torch.finfo(torch.bfloat16).min
    m = make_additive_mask(3, 3, 5, torch.bfloat16)  # prefill of 3 tokens, positions 0..2
    assert m.shape == (1, 1, 3, 5) and m.dtype == torch.bfloat16
    expected = torch.tensor([[0, neg, neg, neg, neg], [0, 0, neg, neg, neg], [0, 0, 0, neg, neg]])
    assert torch.equal(m[0, 0].float(), expected.float())
    assert torch.equal(make_additive_mask(4, 1, 5, torch.float32), make_additive_mask([3], 1, 5, torch.float32))
    assert torch.equal(make_additive_mask(4, 1, 5)[0, 0, 0, :4], torch.zeros(4))
    with pytest.raises(ValueError):
        make_additive_mask(6, 1, 5)


def test_builtin_configs() -> None:
    cfg = qwen2_config("qwen2.5-1.5b")
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (151936, 1536, 8960, 28)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.rms_norm_eps) == (12, 2, 1e-6)
    assert cfg.rope_parameters["rope_theta"] == 1e6 and cfg.tie_word_embeddings and cfg.max_position_embeddings == 32768
    with torch.device("meta"):
        n_params = sum(p.numel() for p in Qwen2ForCausalLM(cfg).parameters())
    assert n_params == 1_543_714_304
    assert qwen2_config("tiny").num_hidden_layers == 2
    with pytest.raises(KeyError):
        qwen2_config("llama")


class _MakesTensors(torch.nn.Module):
    """A forward that creates tensors (transformers 5.17's mask code does: `torch.where(mask, torch.tensor(0.0),
    min)`): torch.export lifts them into constants that a weight-free export records without data."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        zero = torch.tensor(0.5, dtype=x.dtype, device=x.device)
        return torch.where(x > 0, zero, x) * torch.tensor([1.0, 2.0, 3.0], device=x.device)


def test_tensors_made_in_forward_are_exported_and_run(tmp_path: Path) -> None:
    """Their values go into the safetensors beside the weights (from one export of the real model), the in-place
    `detach_` the export puts on them is a no-op for the compiler, and the model verifies."""
    from safetensors.numpy import load_file

    import npu_compiler
    from npu_export import export_model
    from npusim.cli import main

    res = export_model(_MakesTensors(), [(2, 3)], tmp_path, "made")
    data = json.loads(res.ir_path.read_text())
    assert "aten.detach_.default" in {n["op_type"] for n in data["nodes"]}
    saved = load_file(str(res.weights_path))
    assert {w["name"] for w in data["weights"]} <= set(saved)
    np.testing.assert_array_equal(sorted(float(v) for v in np.concatenate([a.ravel() for a in saved.values()])),
                                  [0.5, 1.0, 2.0, 3.0])
    assert npu_compiler.compile(res.ir_path).stats["ir_nodes"] == len(data["nodes"])  # one program, no fallback
    assert main(["verify", str(res.ir_path), "--weights", str(res.weights_path)]) == 0


class _EmptyCache(torch.nn.Module):
    """transformers' cache starts its keys as `torch.tensor([])` and concatenates onto them: empty constants."""

    def forward(self, x: torch.Tensor):
        k = torch.tensor([], dtype=x.dtype, device=x.device)
        return torch.cat([k, x.flatten()]) * 2, torch.cat([torch.tensor([], device=x.device), x.flatten()]) + 1


def test_empty_constants_need_no_value(tmp_path: Path, monkeypatch) -> None:
    """A lifted constant with no elements is written from the shape and dtype the graph declares, where the export of
    the real model does not give it back by the same name (BART's cache placeholders: `verify` refused the export for
    the weights it lacked)."""
    from safetensors.numpy import load_file

    from npu_export import export_model, model_export
    from npusim.cli import main

    monkeypatch.setattr(model_export, "lifted_constants", lambda *a: {})
    res = export_model(_EmptyCache(), [(2, 3)], tmp_path, "empty")
    data = json.loads(res.ir_path.read_text())
    saved = load_file(str(res.weights_path))
    assert {w["name"] for w in data["weights"]} == set(saved) and len(saved) == 2
    assert all(a.shape == (0,) and a.dtype == np.float32 for a in saved.values())
    assert main(["verify", str(res.ir_path), "--weights", str(res.weights_path)]) == 0
