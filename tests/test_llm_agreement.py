"""bench/llm_agreement.py on the CPU backend: weight-only decoding's token agreement with bf16, teacher-forced, on a
small Qwen2 with random weights (its layers small beside the embeddings, so the logits' leads are readable, as in
tests/test_weight_only.py)."""

from __future__ import annotations

import json

import numpy as np
import torch
from helpers import load_bench

import npu_runtime


def test_weight_only_formats_pick_bf16s_tokens():
    from transformers import Qwen2ForCausalLM

    from npu_export.qwen2 import tiny_qwen2_config

    bench = load_bench("llm_agreement")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        cfg = tiny_qwen2_config(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
        model = Qwen2ForCausalLM(cfg).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.normal_(0, 1.0 if "embed" in name else 0.05)
        model.to(torch.bfloat16)
        rows = bench.measure(model, npu_runtime.get_backend("cpu"), ["int8", "int4+int8-head"], steps=40,
                             prompt_len=6, progress=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    by = {r.format: r for r in rows}
    assert by["int8"].steps == 40 and by["int8"].agree >= 0.99, by["int8"]
    assert by["int4+int8-head"].agree >= 0.95, by["int4+int8-head"]
    for r in rows:
        assert r.clear_steps > 20 and r.agree_clear == 1.0, r
        # every program picks what PyTorch picks computing in float32 with the weights it computes with
        assert r.agree_torch >= 0.95, r
        if r.format != "bf16":
            assert 0 < r.logit_err_std < 0.5, r  # the formats do differ from bf16, by little
    assert by["int4+int8-head"].logit_err_std > by["int8"].logit_err_std


def test_the_script_runs_and_writes_its_table(tmp_path, capsys):
    bench = load_bench("llm_agreement")
    out = tmp_path / "a.json"
    assert bench.main(["--config", "tiny", "--steps", "4", "--prompt-len", "2", "--backend", "cpu", "--formats",
                       "int4", "--no-targets", "--json", str(out)]) in (0, 1)
    data = json.loads(out.read_text())
    assert data["random_weights"] and [r["format"] for r in data["rows"]] == ["bf16", "int4"]
    assert data["rows"][1]["steps"] == 4 and 0.0 <= data["rows"][1]["agree"] <= 1.0
    assert "random weights" in capsys.readouterr().out
    assert np.isfinite(data["rows"][1]["logit_err_std"]) and 0.0 <= data["rows"][1]["agree_torch"] <= 1.0
