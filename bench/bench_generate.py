"""Qwen2 prefill and generation end to end: the `npusim export-llm` folder of a real configuration (random weights),
timed as a user sees it, beside PyTorch eager and torch.compile on the same GPU in the same process.

Rows: compile of both programs and load (kernel cache warm; the load also with the cache cold), one prefill call of
`--prefill-len` tokens keeping the last token's logits, `npusim generate` of a `--prompt`-token prompt (time to first
token, decode rate at that context). Peers: the Hugging Face model's whole forward over the same tokens (logits of the
last token only), eager and torch.compile (default mode). Both sides use the attention `--attn` names (transformers'
default, SDPA, unless told otherwise). Prefill and the peers: the median of `--iters` calls; time to first token: the
median of `--iters` `generate` calls of one new token; decode rate: the median of three `generate` calls of `--new`
tokens.

    python bench/bench_generate.py [--config qwen2.5-1.5b] [--prefill-len 2048] [--prompt 2000] [--new 256]
        [--attn sdpa] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_llm import _median_ms as median_ms
from bench_llm import print_profile, warn_if_noisy


def _median_ms(fn, sync, iters: int) -> float:
    return median_ms(fn, sync, iters, warmup=3)


def _cold_load_s(load, backend) -> float:
    """Seconds of `load()` with the kernel cache in an empty folder of its own ($NPUSIM_CACHE, removed after): every
    source compiled by NVRTC, as on a machine's first load."""
    from npu_runtime.cuda.modules import CACHE_ENV

    before = os.environ.get(CACHE_ENV)
    with tempfile.TemporaryDirectory() as cold:
        os.environ[CACHE_ENV] = cold
        try:
            t = time.perf_counter()
            load()
            backend.synchronize()
            seconds = time.perf_counter() - t
        finally:
            if before is None:
                os.environ.pop(CACHE_ENV, None)
            else:
                os.environ[CACHE_ENV] = before
    return seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="qwen2.5-1.5b")
    ap.add_argument("--prefill-len", type=int, default=2048)
    ap.add_argument("--max-cache-len", type=int, default=2560)
    ap.add_argument("--prompt", type=int, default=2000, help="prompt length for generate")
    ap.add_argument("--new", type=int, default=256, help="new tokens for generate")
    ap.add_argument("--iters", type=int, default=30,
                    help="timed calls of prefill, of the peers and of generate's first token (their medians)")
    ap.add_argument("--attn", default="sdpa", choices=["eager", "sdpa"], help="attention implementation to export")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also print the N slowest kernels of the prefill program (per-kernel device time, 5 runs)")
    args = ap.parse_args(argv)

    import npu_runtime
    from npu_export.llm_export import export_llm
    from npu_runtime.llm import LLM

    backend = npu_runtime.get_backend()
    device = "cuda" if backend.name == "cuda" else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    row: dict = {"config": args.config, "backend": backend.name, "prefill_len": args.prefill_len, "attn": args.attn}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "llm"
        t = time.perf_counter()
        export_llm(out, config=args.config, random_weights=True, max_cache_len=args.max_cache_len,
                   prefill_len=args.prefill_len, target=backend.compile_target(), attn_implementation=args.attn)
        row["export_and_compile_s"] = time.perf_counter() - t
        # a load with an empty kernel cache of its own (every source through NVRTC)
        row["cold_load_s"] = _cold_load_s(lambda: LLM.load(out, backend), backend)
        LLM.load(out, backend)  # warms the kernel cache
        import npu_compiler

        t = time.perf_counter()
        exp_dir = out
        for kind in ("prefill", "decode"):
            npu_compiler.compile(exp_dir / f"{kind}.json", backend.compile_target(), rope_theta=json.loads(
                (exp_dir / "cache_map.json").read_text())["rope"]["theta"])
        row["compile_s"] = time.perf_counter() - t
        t = time.perf_counter()
        llm = LLM.load(out, backend)
        backend.synchronize()
        row["load_s"] = time.perf_counter() - t
        row["compile_and_load_s"] = row["compile_s"] + row["load_s"]

        rng = np.random.default_rng(0)
        vocab = llm.vocab_size
        ids = rng.integers(0, vocab, size=args.prefill_len).astype(np.int64)
        row["prefill_ms"] = _median_ms(lambda: llm._run(llm.prefill_graph, ids, 0), backend.synchronize, args.iters)
        if args.profile:
            g = llm.prefill_graph
            llm._step_inputs(g, 0)
            feeds = {g.names["input_ids"]: ids.reshape(1, g.seq_len)}
            print_profile(f"prefill {args.prefill_len} tokens", g.executor.program, backend.name,
                          lambda: g.executor.profile(feeds), args.profile)

        prompt = [int(x) for x in rng.integers(0, vocab, size=args.prompt)]
        rate = []
        for _ in range(3):  # each rate is already over --new steps
            res = llm.generate(prompt, args.new, stop_tokens=[])
            rate.append(res.decode_tokens_per_s)
        ttft = []
        for _ in range(args.iters):
            first = llm.generate(prompt, 1, stop_tokens=[])
            ttft.append(first.prefill_seconds * 1e3)
        warn_if_noisy([t / 1e3 for t in ttft], "time to first token")
        row["ttft_ms"] = statistics.median(ttft)
        row["decode_tokens_per_s"] = statistics.median(rate)
        row["prefill_calls"] = first.prefill_calls

        # peers: the same model (the folder's random weights) in PyTorch, last-token logits only
        from transformers import Qwen2ForCausalLM

        model = Qwen2ForCausalLM.from_pretrained(out, dtype=torch.bfloat16, attn_implementation=args.attn)
        model = model.to(device).eval()
        x = torch.from_numpy(ids)[None].to(device)
        with torch.no_grad():
            row["eager_prefill_ms"] = _median_ms(lambda: model(x, logits_to_keep=1), sync, args.iters)
            row["compile_prefill_ms"] = float("nan")
            if not args.no_compile and device == "cuda":
                compiled = torch.compile(model)
                row["compile_prefill_ms"] = _median_ms(lambda: compiled(x, logits_to_keep=1), sync, args.iters)
    print(f"{args.config} bf16 on {backend.name} ({torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}):")
    print(f"  compile both programs {row['compile_s']:.2f} s + load {row['load_s']:.2f} s "
          f"= {row['compile_and_load_s']:.2f} s (kernel cache warm); load with the kernel cache cold "
          f"{row['cold_load_s']:.2f} s (compile + it: {row['compile_s'] + row['cold_load_s']:.2f} s)")
    print(f"  prefill {args.prefill_len} tokens, one call, last-token logits: ours {row['prefill_ms']:.2f} ms, "
          f"eager {row['eager_prefill_ms']:.2f} ms, torch.compile {row['compile_prefill_ms']:.2f} ms")
    print(f"  generate: {args.prompt}-token prompt, {args.new} new tokens: time to first token {row['ttft_ms']:.1f} ms "
          f"({row['prefill_calls']} calls), decode {row['decode_tokens_per_s']:.0f} tokens/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(row, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
