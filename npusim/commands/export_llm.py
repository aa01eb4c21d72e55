"""npusim export-llm (MODEL_DIR | --config NAME [--random-weights]) -o OUT: graphs + programs for `generate`."""

from __future__ import annotations

import argparse
import time

from .. import argtypes
from ..common import DTYPES, CLIError, add_quiet_option, check_outputs, default_target


def register(sub) -> None:
    p = sub.add_parser(
        "export-llm", help="export and compile a Qwen2-family LLM for `npusim generate`",
        description="Export the static-KV-cache prefill and decode graphs of a Hugging Face Qwen2-family model on "
                    "the meta device (no weights in memory), compile both and write them with a cache map and "
                    "manifest.json. The weights stay in the model directory.\n\n"
                    "  npusim export-llm MODEL_DIR -o out                       (your checkpoint)\n"
                    "  npusim export-llm --config tiny --random-weights -o out  (no checkpoint: random weights and "
                    "a small tokenizer are written into out, which `npusim generate out --prompt ...` runs)\n"
                    "  npusim export-llm --config qwen2.5-1.5b -o out          (graphs and programs only)")
    p.add_argument("model_dir", nargs="?", help="Hugging Face model folder (config.json + *.safetensors)")
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.add_argument("--config", help="a built-in config instead of a model folder: tiny, qwen2.5-0.5b, qwen2.5-1.5b")
    p.add_argument("--random-weights", action="store_true",
                   help="write a model with random weights (of --config, or of MODEL_DIR's config.json) and a "
                        "small character-level tokenizer into the output folder, so that it runs by itself")
    p.add_argument("--seed", type=argtypes.seed, default=0, help="with --random-weights: the torch seed of the weights")
    p.add_argument("--max-cache-len", type=argtypes.integer(1, 1 << 20, "length"), default=256,
                   help="static KV cache length (prompt + new tokens)")
    p.add_argument("--prefill-len", type=argtypes.integer(1, 1 << 20, "length"), default=32,
                   help="tokens per prefill call (longer prompts: chunks)")
    p.add_argument("--dtype", default=None, choices=DTYPES,
                   help="dtype of the graphs and the compute (default: the checkpoint's; bfloat16 for a built-in "
                        "config)")
    p.add_argument("--weights-dtype", default=None, choices=("int8", "int4"),
                   help="quantize the projections and the LM head when the weights are loaded, weight-only: int8 per "
                        "output channel or int4 in groups of 128 along K (activations and KV cache keep --dtype); "
                        "the cpu target runs them (the GPU kernels come later; default: the weights in --dtype)")
    p.add_argument("--lm-head-dtype", default=None, choices=("int8", "int4", "float"),
                   help="with --weights-dtype: the LM head's own format (float: --dtype's), as AWQ, GPTQ and "
                        "TensorRT-LLM keep it above 4 bits (default: --weights-dtype's)")
    p.add_argument("--target", default=None,
                   help="compiler target of the programs: cpu, cuda, webgpu (default: the target of the best backend "
                        "available here, the one `npusim generate` uses)")
    p.add_argument("--attn", default="eager", choices=["eager", "sdpa"], help="attention implementation to export")
    add_quiet_option(p)
    p.set_defaults(func=run)


# what an export-llm folder holds (npu_export.llm_export), and with --random-weights its model directory's files
LLM_FILES = ("prefill.json", "decode.json", "cache_map.json", "prefill.npubin", "decode.npubin", "manifest.json")
RANDOM_WEIGHT_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                       "tokenizer_config.json")


def run(args: argparse.Namespace) -> int:
    from npu_export.llm_export import export_llm

    if (args.model_dir is None) == (args.config is None):
        raise CLIError("give a MODEL_DIR or --config NAME (not both)")
    if args.lm_head_dtype is not None and args.weights_dtype is None:
        raise CLIError("--lm-head-dtype applies with --weights-dtype only")
    if args.seed != 0 and not args.random_weights:
        raise CLIError("--seed applies to --random-weights only")
    from ..progress import Progress

    args.target, why = default_target(args.target)
    check_outputs(args.output, [*LLM_FILES, *(RANDOM_WEIGHT_FILES if args.random_weights else ())])
    t0 = time.perf_counter()
    try:
        with Progress("export-llm", 3, quiet=args.quiet) as bar:
            res = export_llm(args.output, model_dir=args.model_dir, config=args.config,
                             max_cache_len=args.max_cache_len, prefill_len=args.prefill_len, dtype=args.dtype,
                             target=args.target, attn_implementation=args.attn, random_weights=args.random_weights,
                             seed=args.seed, progress=bar.callback, weights_dtype=args.weights_dtype,
                             lm_head_dtype=args.lm_head_dtype)
    except (ValueError, NotImplementedError) as e:
        raise CLIError(str(e)) from e
    m = res.manifest
    print(f"exported {m['architecture']} ({m['dtype']}, target {m['target']}, max_cache_len {m['max_cache_len']}, "
          f"prefill_len {m['prefill_len']}) -> {res.out_dir} in {time.perf_counter() - t0:.1f} s")
    print(f"target {args.target} ({why})")
    for k, f in m["files"].items():
        print(f"  {k:10s} {f}")
    if res.graphs_only:
        print(f"graphs only: built-in config '{args.config}' has no weights. To generate, give a checkpoint "
              "(npusim export-llm MODEL_DIR ...) or add --random-weights")
        return 0
    if m.get("random_weights"):
        print(f"weights: random (seed {args.seed}) in {res.out_dir}/model.safetensors, with a small character-level "
              "tokenizer; the text it generates is noise, the speed and the pipeline are real")
    else:
        print(f"weights: read at load time from {m['model_dir']} (not copied)"
              + ("; tokenizer.json found" if m["tokenizer"] else "; no tokenizer.json: use --prompt-ids"))
    prompt = '--prompt "Hello"' if m["tokenizer"] else "--prompt-ids 1,2,3"
    print(f"next: npusim generate {res.out_dir} {prompt} --max-new-tokens 16"
          + ("" if why != "--target" else f" --backend {args.target}"))
    return 0
