"""`npusim export MODULE:FACTORY` exports any nn.Module (several inputs, integer inputs, inputs from .npy, a
checkpoint), and `export-llm --random-weights` makes a folder that `generate` runs from the command line alone;
both checked against PyTorch / transformers."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch

from npusim.cli import main

MODELS = textwrap.dedent('''
    import torch
    from torch import nn


    class Two(nn.Module):
        """Token ids and float features: two inputs of two dtypes."""

        def __init__(self, vocab: int = 50, dim: int = 16):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.proj = nn.Linear(4, dim)
            self.out = nn.Linear(dim, 3)

        def forward(self, ids, feats):
            return self.out(torch.relu(self.embed(ids) + self.proj(feats)))


    def make_two(vocab: int = 50):
        torch.manual_seed(3)
        return Two(vocab)


    def not_a_model():
        return 42
''')


@pytest.fixture
def models(tmp_path, monkeypatch):
    (tmp_path / "usermodels.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    import sys

    sys.modules.pop("usermodels", None)


def _reference(models, ids, feats, vocab=50, checkpoint=None):
    import importlib

    mod = importlib.import_module("usermodels")
    m = mod.make_two(vocab).eval()
    if checkpoint is not None:
        m.load_state_dict(checkpoint)
    with torch.no_grad():
        return m(torch.from_numpy(ids), torch.from_numpy(feats)).numpy()


def test_export_module_factory_two_inputs_runs_like_pytorch(models, capsys):
    ids = np.random.default_rng(0).integers(0, 50, (1, 6)).astype(np.int64)
    feats = np.random.default_rng(1).standard_normal((1, 6, 4)).astype(np.float32)
    np.save("ids.npy", ids)
    np.save("feats.npy", feats)
    # one input by shape and dtype, one from a .npy file, in forward's order
    assert main(["export", "usermodels:make_two", "--input-shape", "1,6:int64", "--input-npy", "feats.npy",
                 "-o", "out"]) == 0
    out = capsys.readouterr().out
    assert "input  ids" in out and "int64[1, 6]" in out and "input  feats" in out and "next:" in out
    ir = json.loads((models / "out" / "make_two.json").read_text())
    assert [(t["name"], t["shape"]) for t in ir["graph_inputs"]] == [("ids", [1, 6]), ("feats", [1, 6, 4])]
    assert main(["compile", "out/make_two.json", "-o", "out/two.npubin", "--dtype", "float32"]) == 0
    assert main(["run", "out/two.npubin", "--weights", "out/make_two.safetensors", "--input", "ids=ids.npy",
                 "--input", "feats=feats.npy", "-o", "out/y.npz", "--iters", "1", "--warmup", "0"]) == 0
    got = np.load(models / "out" / "y.npz")
    np.testing.assert_allclose(got[list(got.keys())[0]], _reference(models, ids, feats), rtol=1e-5, atol=1e-6)


def test_factory_args_file_path_and_checkpoint(models, capsys):
    from safetensors.torch import save_file

    torch.manual_seed(7)
    import importlib

    trained = importlib.import_module("usermodels").Two(vocab=20)
    sd = {k: v.clone() for k, v in trained.state_dict().items()}
    torch.save({"state_dict": {f"module.{k}": v for k, v in sd.items()}}, "trained.pt")  # Lightning + DataParallel
    save_file(sd, "trained.safetensors")
    for ckpt in ("trained.pt", "trained.safetensors"):
        assert main(["export", "usermodels.py:make_two", "--factory-arg", "vocab=20", "--checkpoint", ckpt,
                     "--input-shape", "1,5:int64", "--input-shape", "1,5,4", "--name", "ck", "-o", "out"]) == 0
        assert f"weights from {ckpt}" in capsys.readouterr().out
        ids = np.arange(5, dtype=np.int64).reshape(1, 5)
        feats = np.ones((1, 5, 4), np.float32)
        np.save("ids.npy", ids)
        np.save("feats.npy", feats)
        assert main(["run", "out/ck.json", "--weights", "out/ck.safetensors", "--input", "ids=ids.npy", "--input",
                     "feats=feats.npy", "-o", "out/ck.npz", "--iters", "1", "--warmup", "0"]) == 0
        got = np.load(models / "out" / "ck.npz")
        ref = _reference(models, ids, feats, vocab=20, checkpoint=sd)
        # auto compute dtype of a conv-free fp32 model is bfloat16: the model tolerance of bf16 (docs/tolerances.md)
        y = got[list(got.keys())[0]]
        assert np.abs(y - ref).max() <= 0.1 * np.abs(ref).max()
    capsys.readouterr()


@pytest.mark.parametrize("argv, words", [
    (["usermodels:nope", "--input-shape", "1"], ["has no attribute 'nope'", "make_two"]),
    (["nosuchmodule:f", "--input-shape", "1"], ["cannot import 'nosuchmodule'"]),
    (["usermodels:not_a_model", "--input-shape", "1"], ["not a torch.nn.Module"]),
    (["usermodels:make_two"], ["--input-shape"]),
    (["usermodels:make_two", "--input-shape", "1,6:int64"], ["takes 2 input(s)", "1 example input(s) given"]),
    (["usermodels:make_two", "--input-shape", "1,a"], ["--input-shape '1,a'"]),
    (["usermodels:make_two", "--input-shape", "1,6:int64", "--input-shape", "1,6,4", "--checkpoint", "x.pt"],
     ["checkpoint not found: x.pt"]),
    (["usermodels:make_two", "--input-shape", "1,6:int64", "--input-shape", "1,6,5"], ["torch.export could not trace"]),
    (["mystery"], ["MODULE:FACTORY"]),
])
def test_export_errors_are_one_line(models, capsys, argv, words):
    assert main(["export", *argv, "-o", "out"]) in (1, 2)
    err = capsys.readouterr().err
    assert "Traceback" not in err and len([ln for ln in err.splitlines() if ln.strip()]) == 1, err
    for w in words:
        assert w in err, (w, err)
    assert not (models / "out").exists() or not list((models / "out").glob("*.json"))


def test_checkpoint_that_does_not_fit_lists_every_problem(models, capsys):
    torch.save({"embed.weight": torch.zeros(50, 16), "extra": torch.zeros(1)}, "bad.pt")
    assert main(["export", "usermodels:make_two", "--input-shape", "1,6:int64", "--input-shape", "1,6,4",
                 "--checkpoint", "bad.pt", "-o", "out"]) == 1
    err = capsys.readouterr().err
    for w in ("missing 4", "proj.weight", "unexpected 1: extra"):
        assert w in err, err


# ---- export-llm --random-weights + generate --------------------------------------------------------------------


@pytest.fixture(scope="module")
def random_llm(tmp_path_factory):
    out = tmp_path_factory.mktemp("llm") / "tiny"
    assert main(["export-llm", "--config", "tiny", "--random-weights", "--dtype", "float32", "-o", str(out),
                 "--max-cache-len", "48", "--prefill-len", "8", "--quiet"]) == 0
    return out


def test_random_weights_folder_is_self_contained(random_llm):
    man = json.loads((random_llm / "manifest.json").read_text())
    assert man["model_dir"] == "." and man["random_weights"] and man["tokenizer"]
    for f in ("config.json", "model.safetensors", "tokenizer.json", "prefill.npubin", "decode.npubin"):
        assert (random_llm / f).is_file(), f
    cfg = json.loads((random_llm / "config.json").read_text())
    tok = json.loads((random_llm / "tokenizer.json").read_text())
    assert cfg["eos_token_id"] == 1 and tok["added_tokens"][1]["content"] == "<|endoftext|>"


def test_generate_from_the_cli_equals_transformers_greedy(random_llm, capsys, tmp_path):
    """The folder moves (relative model_dir) and generates from the CLI alone what transformers generates."""
    import shutil

    from transformers import Qwen2ForCausalLM

    moved = tmp_path / "moved"
    shutil.copytree(random_llm, moved)
    prompt = [5, 17, 42, 99, 3, 7]
    assert main(["generate", str(moved), "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "10",
                 "--stop-ids", "", "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    ours = [int(t) for t in out.splitlines()[0].split()]
    model = Qwen2ForCausalLM.from_pretrained(random_llm).eval()
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, eos_token_id=None,
                             pad_token_id=0)[0, len(prompt):].tolist()
    assert ours == ref
    assert "time to first token" in out and "tokens/s" in out and "ms/token" in out
    assert main(["generate", str(moved), "--prompt", "hello world", "--max-new-tokens", "4"]) == 0
    assert "time to first token" in capsys.readouterr().out


def test_graphs_only_folder_asks_for_model_dir_in_cli_terms(tmp_path, capsys, random_llm):
    assert main(["export-llm", "--config", "tiny", "-o", str(tmp_path / "g"), "--max-cache-len", "48",
                 "--prefill-len", "8", "--dtype", "float32", "--quiet"]) == 0
    assert "add --random-weights" in capsys.readouterr().out
    assert main(["generate", str(tmp_path / "g"), "--prompt-ids", "1,2"]) == 2
    err = capsys.readouterr().err
    assert "--model-dir" in err and "LLM.load" not in err
    assert main(["generate", str(tmp_path / "g"), "--prompt-ids", "1,2", "--model-dir", str(random_llm),
                 "--max-new-tokens", "2"]) == 0


def test_char_tokenizer_covers_the_vocabulary():
    from npu_export.char_tokenizer import EOS_TOKEN, build_char_tokenizer

    for vocab in (98, 256, 5000):
        tok = build_char_tokenizer(vocab)
        assert tok.get_vocab_size() == vocab
        text = "Hello, world! 42 times\nzebra"
        assert tok.decode(tok.encode(text).ids) == text
        # every id but the two specials decodes to some text: a random model's tokens are visible
        assert all(tok.decode([i]) for i in range(2, vocab))
        assert tok.token_to_id(EOS_TOKEN) == 1
    with pytest.raises(ValueError, match="at least 98"):
        build_char_tokenizer(64)


@pytest.mark.parametrize("graph", ["prefill", "decode"])
def test_verify_passes_on_the_exports_own_graphs(random_llm, capsys, graph):
    """verify on the export's own graphs passes by default: it reads the rotary base and the input contract from
    cache_map.json (positions, cache positions and the causal mask consistent, caches written below the step), where
    independent random inputs made the decode graph fail (Pearson 0.64) on inputs no generation can produce."""
    assert main(["verify", str(random_llm / f"{graph}.json"), "--weights", str(random_llm / "model.safetensors"),
                 "--json"]) == 0
    cap = capsys.readouterr()
    report = json.loads(cap.out)
    assert report["passed"], report["outputs"]
    assert all("cache_map.json's rule" in line for line in report["generated_inputs"]), report["generated_inputs"]
    assert "computed: model.rotary_emb.inv_freq (rope_theta=10000)" in report["weights"]


def test_contract_inputs_are_consistent(random_llm):
    import numpy as np

    from npu_runtime.dtypes import dtype_name
    from npusim.common import input_specs_from_ir
    from npusim.llm_contract import find_contract

    for graph in ("prefill", "decode", "prefill.npubin", "decode.npubin"):
        path = random_llm / (graph if graph.endswith(".npubin") else f"{graph}.json")
        contract = find_contract(path)
        assert contract is not None and contract.kind == graph.split(".")[0]
    assert find_contract(random_llm / "config.json") is None
    contract = find_contract(random_llm / "decode.json")
    specs = input_specs_from_ir(random_llm / "decode.json")
    for seed in range(5):
        arrays, lines = contract.generate(specs, {}, np.random.default_rng(seed))
        assert set(arrays) == {s.name for s in specs} and len(lines) == len(specs)
        for s in specs:
            assert arrays[s.name].shape == tuple(s.shape) and dtype_name(arrays[s.name].dtype) == s.dtype
        pos = arrays["cache_position"]
        assert (arrays["position_ids"].reshape(-1) == pos).all() and 0 <= pos[0] < 48
        mask = arrays["attention_mask"].astype(np.float32)[0, 0]
        assert ((mask == 0) == (np.arange(48)[None, :] <= pos[:, None])).all()
        cache = arrays["k_cache_0"].astype(np.float32)
        assert (cache[:, :, pos[0]:] == 0).all() and (cache[:, :, :pos[0]] != 0).all()
        assert (arrays["input_ids"] >= 0).all() and (arrays["input_ids"] < 256).all()
    # what the user gives is kept
    ids = np.array([[7]], dtype=np.int64)
    arrays, _ = contract.generate(specs, {"input_ids": ids}, np.random.default_rng(0))
    assert "input_ids" not in arrays


NEXT_MODELS = textwrap.dedent('''
    import torch
    from torch import nn


    class ConvPRelu(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.act = nn.Conv2d(3, 4, 3), nn.PReLU(4)

        def forward(self, x):
            return self.act(self.conv(x))


    class WithFallback(nn.Module):
        """lgamma has no lowering: the partition path runs it on the CPU."""

        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(torch.lgamma(x.abs() + 1.0))
''')


@pytest.mark.parametrize("factory", ["ConvPRelu", "WithFallback"])
def test_export_suggests_commands_that_work(tmp_path, monkeypatch, capsys, factory):
    """Every command `npusim export` prints under next: runs as printed (the comment after it aside), for a model
    the target runs whole and for one with an op that falls back (compiled into one artifact with a CPU segment,
    which describe shows), and verify in the half dtype it suggests."""
    import shlex

    (tmp_path / "nextmodels.py").write_text(NEXT_MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    shape = "1,3,8,8" if factory == "ConvPRelu" else "2,3"
    assert main(["export", f"nextmodels:{factory}", "--input-shape", shape, "-o", "out"]) == 0
    out = capsys.readouterr().out
    lines = [ln.strip() for ln in out.split("next:\n", 1)[1].splitlines()]
    commands = [shlex.split(ln.split("     (")[0]) for ln in lines if ln.startswith("npusim ")]
    assert [c[1] for c in commands] == ["verify", "compile"] + (["describe"] if factory == "WithFallback" else []) + [
        "run"]
    assert ("lgamma" in out) == (factory == "WithFallback")
    half = [ln for ln in lines if "add --dtype" in ln]
    if half:
        commands.append(commands[0] + ["--dtype", half[0].split("--dtype ")[1].split()[0]])
    for argv in commands:
        if argv[1] in ("run", "verify"):
            argv += ["--quiet"] if argv[1] == "verify" else ["--iters", "1", "--warmup", "0"]
        assert main(argv[1:]) == 0, argv
    capsys.readouterr()
