"""LLM generation on the compiled programs (npu_runtime.llm) against transformers, on a tiny random Qwen2."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import Qwen2ForCausalLM

from npu_export.llm_export import export_llm
from npu_export.qwen2 import tiny_qwen2_config
from npu_runtime.llm import LLM, LLMError, sample_token
from npu_runtime.metrics import pearson
from npusim.cli import main as npusim_main

L, P, NEW = 64, 8, 16
VOCAB = 256


def _model(dtype: torch.dtype) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    m = Qwen2ForCausalLM(tiny_qwen2_config(vocab_size=VOCAB)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.1)  # larger than HF's init, so argmax is not degenerate
    return m.to(dtype)


def _save_tokenizer(d) -> None:
    """A word-level tokenizer over "w0".."w255" (+ a chat template), built with the tokenizers package."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(d / "tokenizer.json"))
    template = "{% for m in messages %}w1 {{ m['content'] }} w2 {% endfor %}{% if add_generation_prompt %}w3{% endif %}"
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))


_BUILT: dict[str, tuple] = {}


def _build(dtype: str, tmp_path_factory) -> tuple:
    if dtype in _BUILT:
        return _BUILT[dtype]
    model = _model(getattr(torch, dtype))
    d = tmp_path_factory.mktemp(f"llm_{dtype}")
    model.save_pretrained(d / "hf")
    _save_tokenizer(d / "hf")
    export_llm(d / "npu", model_dir=d / "hf", max_cache_len=L, prefill_len=P, dtype=dtype)
    _BUILT[dtype] = (dtype, model, d, LLM.load(d / "npu", "cpu"))
    return _BUILT[dtype]


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def setup(request, tmp_path_factory):
    return _build(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def setup_f32(tmp_path_factory):
    """For claims made in fp32 only (token-for-token equality) or that one dtype checks fully."""
    return _build("float32", tmp_path_factory)


def _prompt(n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(n).integers(0, VOCAB, size=n)]


@pytest.mark.parametrize("n", [1, 5, 19], ids=["one_token", "shorter_than_prefill", "chunked"])
def test_greedy_equals_transformers_generate(setup_f32, n):
    dtype, model, _, llm = setup_f32
    prompt = _prompt(n)
    res = llm.generate(prompt, NEW, stop_tokens=[])
    with torch.no_grad():
        ids = torch.tensor([prompt])
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False)
    assert res.tokens == ref[0, n:].tolist()
    # a prompt shorter than one chunk is one call (padding rows in front; one token: a decode step)
    assert res.prefill_calls == (1 if n < P else -(-n // P))
    assert res.prefill_seconds > 0 and res.decode_tokens_per_s > 0 and res.backend == "cpu"


@pytest.mark.parametrize("n", [1, 5, 19], ids=["one_token", "shorter_than_prefill", "chunked"])
def test_teacher_forced_logits(setup, n):
    dtype, model, _, llm = setup
    tokens = _prompt(n + 8)
    with torch.no_grad():
        ref = model(torch.tensor([tokens])).logits[0].float().numpy()
    steps = [(llm.prefill(tokens[:n])[0], ref[n - 1])]
    for pos in range(n, len(tokens)):
        steps.append((llm.decode_step(tokens[pos], pos), ref[pos]))
    for s, (ours, r) in enumerate(steps):
        assert pearson(ours, r) >= 0.999, f"step {s}: pearson {pearson(ours, r)}"
        if dtype == "float32":
            np.testing.assert_allclose(ours, r, atol=2e-4, rtol=1e-3, err_msg=f"step {s}")


def test_cache_shared_and_updated_in_place(setup):
    _, _, _, llm = setup
    execs = llm.executors
    # one weight set serves both programs: the executors read the very same arrays
    for ex in execs.values():
        for w in ex.program.weights:
            assert np.shares_memory(ex.flat[w.buffer], llm.weights.buffers[w.name].native_handle)
    layers = {k: llm.cache_map["graphs"][k]["layers"] for k in execs}
    before = {name: buf.to_numpy() for name, buf in llm.cache.items()}
    ids = id(llm.cache["k_cache_0"]), id(llm.cache["k_cache_0"].native_handle)
    llm.generate(_prompt(5), 3, stop_tokens=[])
    assert (id(llm.cache["k_cache_0"]), id(llm.cache["k_cache_0"].native_handle)) == ids
    for name, buf in llm.cache.items():
        assert not np.array_equal(buf.to_numpy(), before[name]), f"{name} not written"
    for kind, ex in execs.items():
        prog = ex.program
        ins, outs = {s.name: s for s in prog.inputs}, {s.name: s for s in prog.outputs}
        for lay, pl in zip(layers[kind], layers["prefill"]):
            for kv in "kv":
                shared = llm.cache[pl[f"{kv}_input"]].native_handle
                # the executor's input buffer IS the shared array, and the cache output is that same buffer
                assert np.shares_memory(ex.flat[ins[lay[f"{kv}_input"]].buffer], shared)
                assert outs[lay[f"{kv}_output"]].alias_of == lay[f"{kv}_input"]
                assert outs[lay[f"{kv}_output"]].buffer == ins[lay[f"{kv}_input"]].buffer
        # the memory plan: the only kernels writing a cache buffer are in-place index_copy of the new rows
        cache_bufs = {ins[lay[f"{kv}_input"]].buffer for lay in layers[kind] for kv in "kv"}
        writers = [k for k in prog.kernels if any(o.buffer in cache_bufs for o in k.outs)]
        assert writers and all(k.group == "index_copy.default" and k.spec.scatter is not None for k in writers)


def test_sampling_seeded_and_stop_tokens(setup_f32):
    dtype, _, _, llm = setup_f32
    prompt = _prompt(5)
    kw = dict(temperature=0.8, top_k=20, top_p=0.9, seed=7, stop_tokens=[])
    a, b = llm.generate(prompt, 8, **kw), llm.generate(prompt, 8, **kw)
    assert a.tokens == b.tokens
    streamed: list[int] = []
    greedy = llm.generate(prompt, 8, stop_tokens=[], stream=streamed.append)
    assert streamed == greedy.tokens
    stop = greedy.tokens[2]
    cut = llm.generate(prompt, 8, stop_tokens=[stop])
    assert cut.stop_reason == "stop_token" and cut.tokens == greedy.tokens[: greedy.tokens.index(stop) + 1]
    # greedy decoding queues a step ahead: one token asked for is one made, and the step queued past a stop token
    # leaves nothing behind that changes the next generation
    assert llm.generate(prompt, 1, stop_tokens=[]).tokens == greedy.tokens[:1]
    assert llm.generate(prompt, 8, stop_tokens=[]).tokens == greedy.tokens
    rng = np.random.default_rng(0)
    logits = np.array([0.0, 5.0, 4.9, -3.0])
    assert sample_token(logits, rng) == 1
    assert all(sample_token(logits, rng, temperature=1.0, top_k=1) == 1 for _ in range(20))
    assert {sample_token(logits, rng, temperature=1.0, top_p=0.99) for _ in range(200)} == {1, 2}


@pytest.mark.parametrize("start,pads", [(0, 0), (3, 0), (0, 2), (0, 5)])
def test_step_inputs_positions_and_mask(start, pads):
    """The step-inputs program: tokens after `pads` padding rows at slots start.., the pads after them; a query sees
    the slots up to its own position."""
    from npu_runtime import get_backend, llm_io

    T, L, masked = 6, 12, -1e4
    ex = get_backend("cpu").create_executor(llm_io.step_inputs("cpu", T, L, "float32", masked))
    out = ex.run_numpy({"start": np.array([start], np.int64), "front_pads": np.array([pads], np.int64)})
    rows = np.arange(T)
    pos = np.where(rows < pads, start + T - pads + rows, start + rows - pads)
    np.testing.assert_array_equal(out["position_ids"], pos[None])
    np.testing.assert_array_equal(out["cache_position"], pos)
    want = np.where(np.arange(L)[None, :] <= pos[:, None], 0.0, masked).astype(np.float32)
    np.testing.assert_array_equal(out["attention_mask"], want[None, None])
    assert sorted(pos) == list(range(start, start + T))  # every slot of the step written once


@pytest.mark.parametrize("vocab", [151936, 4096, 997])
def test_device_argmax_is_torch_argmax(vocab):
    """The greedy step's argmax program: two stages where the vocabulary splits into chunks (151,936 and 4,096), one
    where it does not (a prime)."""
    from helpers import check_greedy_argmax

    from npu_runtime import get_backend

    check_greedy_argmax(get_backend("cpu"), vocab, kernels=1 if vocab == 997 else 3)


def test_text_in_text_out(setup_f32):
    dtype, _, _, llm = setup_f32
    assert llm.tokenizer is not None
    res = llm.generate_text("w10 w20 w30", 6, stop_tokens=[])
    assert res.prompt_ids == [10, 20, 30]
    assert res.text == " ".join(f"w{t}" for t in res.tokens)
    chunks: list[str] = []
    chat = llm.generate_text("w10", 4, chat=True, stop_tokens=[], stream_text=chunks.append)
    assert chat.prompt_ids == [1, 10, 2, 3]
    assert "".join(chunks) == chat.text


def test_cli_generate(setup_f32, capsys):
    dtype, _, d, llm = setup_f32
    prompt = _prompt(5)
    want = llm.generate(prompt, 4, stop_tokens=[]).tokens
    assert npusim_main(["generate", str(d / "npu"), "--prompt-ids", ",".join(map(str, prompt)),
                        "--max-new-tokens", "4", "--backend", "cpu", "--stop-ids", ""]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == [str(t) for t in want]
    assert "prefill" in out and "tokens/s" in out and "backend cpu" in out
    assert npusim_main(["generate", str(d / "npu"), "--prompt", "w10 w20", "--max-new-tokens", "3", "--backend",
                        "cpu"]) == 0  # (the programs are compiled for cpu: on a GPU machine cuda would refuse them)


# ---- bad input ----------------------------------------------------------------------------------------------------


def test_prompt_too_long_fails_before_any_work(setup, monkeypatch):
    _, _, _, llm = setup

    def boom(*a, **k):
        raise AssertionError("a program ran")

    monkeypatch.setattr(llm, "_call", boom)
    with pytest.raises(LLMError, match="max_cache_len 64"):
        llm.generate(_prompt(L + 1), 1)
    with pytest.raises(LLMError, match="needs 70 cache slots"):
        llm.generate(_prompt(60), 11)
    with pytest.raises(LLMError, match="empty prompt"):
        llm.generate([], 4)
    with pytest.raises(LLMError, match=r"token ids must be in \[0, 256\)"):
        llm.generate([1, 256], 4)


def test_model_dir_without_safetensors(setup, tmp_path):
    _, _, d, _ = setup
    (tmp_path / "config.json").write_text((d / "hf" / "config.json").read_text())
    with pytest.raises(LLMError, match="no \\*.safetensors"):
        export_llm(tmp_path / "out", model_dir=tmp_path, max_cache_len=L, prefill_len=P)
    with pytest.raises(LLMError, match="no \\*.safetensors"):
        LLM.load(d / "npu", "cpu", model_dir=tmp_path)


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_unsupported_architecture(setup, tmp_path, model_type):
    _, _, d, _ = setup
    cfg = json.loads((d / "hf" / "config.json").read_text())
    cfg["model_type"] = model_type
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LLMError, match=f"unsupported architecture model_type='{model_type}'"):
        export_llm(tmp_path / "out", model_dir=tmp_path, max_cache_len=L, prefill_len=P)
    assert npusim_main(["export-llm", str(tmp_path), "-o", str(tmp_path / "o2"), "--max-cache-len", "8",
                        "--prefill-len", "4"]) == 1


def test_cli_export_llm_config_graphs_only(tmp_path, capsys):
    assert npusim_main(["export-llm", "--config", "tiny", "-o", str(tmp_path), "--max-cache-len", "16",
                        "--prefill-len", "4"]) == 0
    assert "graphs only" in capsys.readouterr().out
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert man["model_dir"] is None and (tmp_path / man["files"]["decode"]).is_file()
    with pytest.raises(LLMError, match="graphs only"):
        LLM.load(tmp_path, "cpu")


def test_a_broken_tokenizer_is_named_when_text_is_first_used(setup_f32, tmp_path):
    """The tokenizer is read on first use (not at load: running on token ids needs none); a broken tokenizer.json
    is then refused with its path, and token ids still run."""
    import shutil

    from npu_runtime.llm import LLMError

    _, _, d, _ = setup_f32
    shutil.copytree(d / "hf", tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").write_text("{ not json")
    llm = LLM.load(d / "npu", "cpu", model_dir=tmp_path / "hf")
    assert len(llm.generate([1, 2, 3], 2, stop_tokens=[]).tokens) == 2
    with pytest.raises(LLMError, match=r"tokenizer\.json: cannot be read as a tokenizer"):
        llm.generate_text("w1 w2", 2)


def test_generate_chat_with_a_hostile_template_runs_nothing(setup_f32, tmp_path, monkeypatch, capsys):
    """The attack: a downloaded model folder whose chat template calls os.system. `npusim generate --chat` refuses
    it in one line (exit 1) and the command it names never runs."""
    import shutil

    _, _, d, _ = setup_f32
    shutil.copytree(d / "hf", tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{{ cycler.__init__.__globals__.os.system('touch CANARY') }}"}))
    monkeypatch.chdir(tmp_path)
    assert npusim_main(["generate", str(d / "npu"), "--model-dir", str(tmp_path / "hf"), "--chat", "--prompt", "w1",
                        "--max-new-tokens", "2", "--backend", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "sandbox forbids" in err and "tokenizer_config.json" in err
    assert not (tmp_path / "CANARY").exists()
