"""A tiny Qwen2 (random weights) against transformers eager: static prefill and 8 decode steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Qwen2ForCausalLM

import npu_compiler
import npu_runtime
from npu_export.qwen2 import export_qwen2, make_additive_mask, tiny_qwen2_config
from npu_runtime.dtypes import np_dtype
from npu_runtime.metrics import pearson

L, P, STEPS = 32, 8, 8


def _model(dtype: torch.dtype) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    m = Qwen2ForCausalLM(tiny_qwen2_config()).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.1)  # larger than HF's init, so attention is far from uniform
    return m.to(dtype)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def setup(request, tmp_path_factory):
    dtype = request.param
    model = _model(getattr(torch, dtype))
    d = tmp_path_factory.mktemp(f"qwen_{dtype}")
    model.save_pretrained(d / "hf")
    exp = export_qwen2(d / "hf", d / "npu", max_cache_len=L, prefill_len=P, dtype=dtype)
    be = npu_runtime.get_backend("cpu")
    theta = exp.cache_map["rope"]["theta"]
    progs = {k: npu_compiler.compile(getattr(exp, f"{k}_path"), "cpu", dtype=dtype, rope_theta=theta)
             for k in ("prefill", "decode")}
    ws = {k: npu_runtime.load_weights(p, d / "hf", be) for k, p in progs.items()}
    return dtype, model, exp, be, progs, ws


def _run_static(setup, tokens: np.ndarray) -> list[np.ndarray]:
    """Prefill on the first P tokens, then one decode step per remaining token; logits of every step."""
    dtype, model, exp, be, progs, ws = setup
    cm = exp.cache_map
    execs = {k: be.create_executor(p) for k, p in progs.items()}
    names = [(lay["k_input"], lay["v_input"]) for lay in cm["graphs"]["prefill"]["layers"]]
    cache = {n: np.zeros(cm["cache"]["shape"], np_dtype(cm["cache"]["dtype"])) for pair in names for n in pair}
    out_logits, pos = [], 0
    for step in range(1 + len(tokens) - P):
        kind = "prefill" if step == 0 else "decode"
        g = cm["graphs"][kind]
        T = g["seq_len"]
        positions = np.arange(pos, pos + T, dtype=np.int64)
        mask = make_additive_mask(pos + T, T, L, getattr(torch, dtype)).float().numpy()
        inputs = {g["inputs"]["input_ids"]: tokens[pos:pos + T].reshape(1, T).astype(np.int64),
                  g["inputs"]["position_ids"]: positions.reshape(1, T), g["inputs"]["cache_position"]: positions,
                  g["inputs"]["attention_mask"]: mask.astype(np_dtype(dtype))}
        for lay, (kn, vn) in zip(g["layers"], names):
            inputs[lay["k_input"]], inputs[lay["v_input"]] = cache[kn], cache[vn]
        out = execs[kind].run_numpy(inputs, ws[kind])
        for lay, (kn, vn) in zip(g["layers"], names):
            cache[kn], cache[vn] = out[lay["k_output"]], out[lay["v_output"]]
        out_logits.append(out[g["outputs"]["logits"]].astype(np.float32)[0])
        pos += T
    return out_logits


def test_prefill_and_decode_match_transformers(setup):
    dtype, model, *_ = setup
    tokens = np.random.default_rng(1).integers(0, 256, size=P + STEPS)
    ours = _run_static(setup, tokens)
    with torch.no_grad():
        ref = model(torch.from_numpy(tokens).reshape(1, -1)).logits[0].float().numpy()
    # Step 0 is the prefill (P positions); step s > 0 is the decode of position P + s - 1.
    steps = [(ours[0], ref[:P])] + [(ours[s][0], ref[P + s - 1]) for s in range(1, STEPS + 1)]
    for s, (o, r) in enumerate(steps):
        r_corr = pearson(o, r)
        assert r_corr >= 0.999, f"step {s}: pearson {r_corr}"
        if dtype == "float32":
            np.testing.assert_array_equal(o.argmax(-1), r.argmax(-1), err_msg=f"step {s}")
            np.testing.assert_allclose(o, r, atol=2e-4, rtol=1e-3, err_msg=f"step {s}")


def test_kv_cache_written_in_place(setup):
    _, _, exp, _, progs, _ = setup
    for kind, prog in progs.items():
        aliases = {o.name: o.alias_of for o in prog.outputs if o.alias_of}
        layers = exp.cache_map["graphs"][kind]["layers"]
        assert len(aliases) == 2 * len(layers)
        for lay in layers:
            assert aliases[lay["k_output"]] == lay["k_input"] and aliases[lay["v_output"]] == lay["v_input"]
        # No kernel copies a whole cache: every write into a cache buffer is the index_copy of the new rows.
        cache_bufs = {i.buffer for i in prog.inputs if i.name.startswith(("k_cache", "v_cache"))}
        writers = [k for k in prog.kernels if any(o.buffer in cache_bufs for o in k.outs)]
        assert writers and all(k.group == "index_copy.default" and k.spec.scatter is not None for k in writers)


def test_integer_inputs_carry_their_valid_range(setup):
    """verify generates integer inputs inside these ranges: token ids below the vocabulary, positions below the
    cache length."""
    _, _, exp, _, progs, _ = setup
    g = exp.cache_map["graphs"]["decode"]["inputs"]
    ranges = {s.name: s.value_range for s in progs["decode"].inputs}
    assert ranges[g["input_ids"]] == (0, 256)
    assert ranges[g["cache_position"]] == (0, L)
