"""npusim export-llm MODEL_DIR -o OUT_DIR --max-cache-len N --prefill-len P: graphs + programs for `generate`."""

from __future__ import annotations

import argparse
import sys
import time


def register(sub) -> None:
    p = sub.add_parser("export-llm", help="export and compile a Qwen2-family LLM for `npusim generate`",
                       description="Export the static-KV-cache prefill and decode graphs of a Hugging Face "
                                   "Qwen2-family model on the meta device (no weights in memory), compile both and "
                                   "write them with a cache map and manifest.json. The weights stay in the model "
                                   "directory.")
    p.add_argument("model_dir", nargs="?", help="Hugging Face model folder (config.json + *.safetensors)")
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.add_argument("--config", help="a built-in config instead of a model folder (tiny, qwen2.5-0.5b, qwen2.5-1.5b): "
                                    "graphs and programs only, no weights")
    p.add_argument("--max-cache-len", type=int, required=True, help="static KV cache length (prompt + new tokens)")
    p.add_argument("--prefill-len", type=int, required=True, help="tokens per prefill call (longer prompts: chunks)")
    p.add_argument("--dtype", default=None, help="float32, float16 or bfloat16 (default: the checkpoint's dtype)")
    p.add_argument("--target", default="cpu", help="compiler target of the programs (cpu, cuda)")
    p.add_argument("--attn", default="eager", choices=["eager", "sdpa"], help="attention implementation to export")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from npu_export.llm_export import export_llm

    if (args.model_dir is None) == (args.config is None):
        print("npusim export-llm: error: give a MODEL_DIR or --config NAME (not both)", file=sys.stderr)
        return 2
    from ..progress import Progress

    t0 = time.perf_counter()
    try:
        with Progress("export-llm", 3, quiet=args.quiet) as bar:
            res = export_llm(args.output, model_dir=args.model_dir, config=args.config,
                             max_cache_len=args.max_cache_len, prefill_len=args.prefill_len, dtype=args.dtype,
                             target=args.target, attn_implementation=args.attn, progress=bar.callback)
    except (ValueError, KeyError, NotImplementedError, FileNotFoundError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"npusim export-llm: error: {msg}", file=sys.stderr)
        return 1
    m = res.manifest
    print(f"exported {m['architecture']} ({m['dtype']}, target {m['target']}, max_cache_len {m['max_cache_len']}, "
          f"prefill_len {m['prefill_len']}) -> {res.out_dir} in {time.perf_counter() - t0:.1f} s")
    for k, f in m["files"].items():
        print(f"  {k:10s} {f}")
    if res.graphs_only:
        print(f"graphs only: built-in config '{args.config}' has no weights; `npusim generate` needs an export "
              "from a model directory")
    else:
        print(f"weights: read at load time from {m['model_dir']} (not copied)"
              + ("; tokenizer.json found" if m["tokenizer"] else "; no tokenizer.json: use --prompt-ids"))
    return 0
