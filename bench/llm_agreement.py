"""Token agreement of weight-only decoding: how often the W8A16 and W4A16 programs pick the token the bf16 program
picks, step by step, on the same backend.

    python bench/llm_agreement.py [--config qwen2.5-1.5b] [--steps 128] [--prompt-len 16] [--backend cuda]
                                  [--formats int8,int4] [--json out.json]

One Qwen2 model with random weights (seeded; Hugging Face's initialisation, no checkpoint: the figures are for
random weights, whose logits are flatter than a trained model's) is exported once and its decode graph compiled
once per format: bf16, and each of `--formats` (`int8`: W8A16, per-channel int8 projections and LM head; `int4`:
W4A16, group-128 int4 everywhere; `int4+int8-head`: int4 projections, int8 LM head). The bf16 program decodes
greedily from a random prompt fed one token a step; every other program is fed the same tokens (teacher forcing on
bf16's picks, so that one different pick does not change every later step) over its own KV cache, and its argmax is
compared with bf16's at each step after the prompt. Printed per format: the share of steps that agree (the issue's
targets: W8A16 >= 99%, W4A16 >= 95%), the share among the steps where bf16's lead over its runner-up is clear of
the format's logit error (4 sqrt(2) times the spread of the logits' difference at that step: a miss there is a
wrong kernel, not rounding), and the share where the program picks what PyTorch picks computing in float32 with the
same weights (dequantized by the documented rule, made here in PyTorch): the kernels' agreement, apart from the
format's. A bf16 row gives that last share for the bf16 program, the level to compare with. Exit status 1 where a
format misses a clear lead or its target (`--targets`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

FORMATS = {"int8": ("int8", None), "int4": ("int4", None), "int4+int8-head": ("int4", "int8")}
TARGETS = {"int8": 0.99, "int4": 0.95, "int4+int8-head": 0.95}


@dataclass
class Agreement:
    format: str
    steps: int
    agree: float  # share of steps whose argmax is bf16's
    clear_steps: int  # steps where bf16's lead is clear of this format's logit error
    agree_clear: float
    logit_err_std: float  # median over steps of the spread of (format - bf16) logits
    agree_torch: float = float("nan")  # share of steps whose argmax is PyTorch's on the same dequantized weights


class DecodeProgram:
    """One compiled decode graph on a backend with its own KV cache, stepped one token at a time."""

    def __init__(self, exp, backend, weights_dtype: str | None, lm_head_dtype: str | None, tensors) -> None:
        import npu_compiler
        import npu_runtime

        g = exp.cache_map["graphs"]["decode"]
        self.g = g
        self.max_len = int(exp.cache_map["model"]["max_cache_len"])
        self.prog = npu_compiler.compile(exp.decode_path, backend.compile_target(),
                                         rope_theta=exp.cache_map["rope"]["theta"], weights_dtype=weights_dtype,
                                         lm_head_dtype=lm_head_dtype)
        specs = {s.name: s for s in self.prog.inputs}
        cache = {lay[kv]: backend.zeros(tuple(specs[lay[kv]].shape), specs[lay[kv]].device_dtype)
                 for lay in g["layers"] for kv in ("k_input", "v_input")}
        self.ex = backend.create_executor(self.prog, bindings=cache)
        self.ex.bind_weights(npu_runtime.load_weights(self.prog, tensors, backend))

    def step(self, token: int, pos: int) -> np.ndarray:
        from npu_export.qwen2 import make_additive_mask
        from npu_export.reference import to_numpy

        ins = self.g["inputs"]
        p = np.array([pos], np.int64)
        feeds = {ins["input_ids"]: np.array([[token]], np.int64), ins["position_ids"]: p.reshape(1, 1),
                 ins["cache_position"]: p,
                 ins["attention_mask"]: to_numpy(make_additive_mask(pos + 1, 1, self.max_len, torch.bfloat16))}
        out = self.ex.run_numpy(feeds)[self.g["outputs"]["logits"]]
        return np.asarray(out, np.float32).reshape(-1)


def dequantized(w: torch.Tensor, bits: int, group: int = 128) -> torch.Tensor:
    """The float32 weight a weight-only program computes with, made in PyTorch from the rule docs/quantization.md
    states (int8: per row, symmetric, max|w| / 127; int4: groups of `group` along K, min-max, scale (max - min) / 15,
    zero point round(-min / scale) in [0, 15]; rounding half to even), independently of npu_runtime's code."""
    w = w.float()
    eps = torch.finfo(torch.float32).eps
    if bits == 8:
        scale = (w.abs().amax(1) / 127).clamp_min(eps)[:, None]
        return torch.round(w / scale).clamp(-127, 127) * scale
    g = w.reshape(w.shape[0], -1, group)
    lo, hi = g.amin(2, keepdim=True), g.amax(2, keepdim=True)
    scale = ((hi - lo) / 15).clamp_min(eps)
    zero = torch.round(-lo / scale).clamp(0, 15)
    return ((torch.round(g / scale) + zero).clamp(0, 15) - zero).mul(scale).reshape(w.shape)


def torch_logits(model, fmt: str | None, ids: list[int]) -> np.ndarray:
    """PyTorch's logits (float32, every position) for `ids` with the model's linears (the projections and the LM
    head) holding the weights format `fmt` computes with (None: the bf16 weights), the embeddings as they are."""
    import copy

    ref = copy.deepcopy(model).float()
    proj, head = FORMATS[fmt] if fmt else (None, None)
    with torch.no_grad():
        for name, mod in ref.named_modules():
            if not isinstance(mod, torch.nn.Linear):
                continue
            b = {"int8": 8, "int4": 4}.get((head or proj) if name == "lm_head" else proj)
            w = mod.weight.detach().clone()
            if b is not None and (b == 8 or w.shape[1] % 128 == 0):
                w = dequantized(w, b)
            mod.weight = torch.nn.Parameter(w)  # a new tensor: the LM head no longer shares the embeddings'
        out = ref(torch.tensor([ids], device=next(ref.parameters()).device)).logits[0].float().cpu().numpy()
    del ref
    return out


def measure(model, backend, formats: Sequence[str], steps: int, prompt_len: int, seed: int = 0,
            progress=print, check_torch: bool = True) -> list[Agreement]:
    """Teacher-forced greedy decoding of `model` (a Qwen2ForCausalLM) in bf16 and each format on `backend`."""
    from npu_export.cnn import model_tensors
    from npu_export.qwen2 import export_qwen2

    rng = np.random.default_rng(seed)
    prompt = [int(t) for t in rng.integers(0, model.config.vocab_size, prompt_len)]
    tensors = model_tensors(model)
    with tempfile.TemporaryDirectory() as tmp:
        exp = export_qwen2(model, tmp, max_cache_len=prompt_len + steps, prefill_len=1, dtype="bfloat16",
                           attn_implementation="sdpa")
        t0 = time.perf_counter()
        progs = {"bf16": DecodeProgram(exp, backend, None, None, tensors)}
        for f in formats:
            progs[f] = DecodeProgram(exp, backend, *FORMATS[f], tensors)
    progress(f"compiled and loaded {len(progs)} decode programs in {time.perf_counter() - t0:.1f} s")
    logits: dict[str, list[np.ndarray]] = {name: [] for name in progs}
    token = prompt[0]
    for pos in range(prompt_len + steps - 1):
        for name, prog in progs.items():
            out = prog.step(token, pos)
            if pos >= prompt_len - 1:
                logits[name].append(out)
        token = prompt[pos + 1] if pos + 1 < prompt_len else int(np.argmax(logits["bf16"][-1]))
    ref = np.stack(logits["bf16"])
    top2 = np.sort(ref, axis=1)[:, -2:]
    lead = top2[:, 1] - top2[:, 0]
    fed = prompt + [int(t) for t in ref.argmax(1)[:-1]]  # every program's inputs, the last prompt token on
    rows = []
    for f in ["bf16", *formats]:
        got = np.stack(logits[f])
        hits = got.argmax(1) == ref.argmax(1)
        spread = (got - ref).std(axis=1)
        clear = lead > 4 * np.sqrt(2) * spread  # a lead's error is the difference of two logits' errors
        same = float("nan")
        if check_torch:  # the program against PyTorch computing with the same weights: the kernels, not the format
            same = float(np.mean(torch_logits(model, None if f == "bf16" else f, fed)[prompt_len - 1:].argmax(1) ==
                                 got.argmax(1)))
        rows.append(Agreement(f, int(hits.size), float(hits.mean()), int(clear.sum()),
                              float(hits[clear].mean()) if clear.any() else float("nan"), float(np.median(spread)),
                              same))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="qwen2.5-1.5b", help="a built-in Qwen2 config (qwen2.5-1.5b, qwen2.5-0.5b, "
                                                                "tiny)")
    ap.add_argument("--steps", type=int, default=128, help="decode steps compared after the prompt")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--backend", default=None, help="the backend all programs run on (default: the best available)")
    ap.add_argument("--formats", default="int8,int4",
                    help=f"comma-separated, of {', '.join(FORMATS)}")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and the prompt")
    ap.add_argument("--targets", action=argparse.BooleanOptionalAction, default=True,
                    help="exit 1 where a format's agreement is below its target (int8 0.99, int4 0.95)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    formats = [f for f in args.formats.split(",") if f]
    bad = [f for f in formats if f not in FORMATS]
    if bad or args.steps < 1 or args.prompt_len < 1:
        ap.error(f"--formats {', '.join(bad)}: not one of {', '.join(FORMATS)}" if bad else
                 "--steps and --prompt-len must be at least 1")

    from transformers import Qwen2ForCausalLM

    import npu_runtime
    from npu_export.qwen2 import qwen2_config

    backend = npu_runtime.get_backend(args.backend)
    torch.manual_seed(args.seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # the initialisation, faster on a GPU
        model = Qwen2ForCausalLM._from_config(qwen2_config(args.config), attn_implementation="sdpa",
                                              dtype=torch.bfloat16).eval()
    rows = measure(model, backend, formats, args.steps, args.prompt_len, args.seed)
    print(f"{args.config}, random weights (seed {args.seed}), {backend.name}: greedy decoding of {args.steps} steps "
          f"after a {args.prompt_len}-token prompt, every format fed bf16's tokens")
    print("  agree: the format's pick is bf16's; clear leads: steps where bf16's lead is clear of the format's logit "
          "error; PyTorch: the program's pick is PyTorch's (float32) computing with the same weights, dequantized")
    print(f"{'format':>16} {'agree':>8} {'target':>7} {'clear leads':>12} {'agree there':>12} {'logit err':>10} "
          f"{'PyTorch':>8}")
    ok = True
    for r in rows:
        need = TARGETS.get(r.format, 1.0)
        ok &= (r.agree_clear == 1.0 or r.clear_steps == 0) and (r.agree >= need or not args.targets)
        print(f"{r.format:>16} {r.agree:>8.1%} {need:>7.0%} {r.clear_steps:>12} {r.agree_clear:>12.1%} "
              f"{r.logit_err_std:>10.4f} {r.agree_torch:>8.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": args.config, "backend": backend.name, "random_weights": True,
                       "rows": [asdict(r) for r in rows]}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
