"""npusim generate OUT_DIR --prompt TEXT | --prompt-ids 1,2,3 --max-new-tokens N: stream tokens from an export-llm
folder, then report the time to the first token, the decode rate and the backend."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .. import argtypes
from ..common import CLIError, add_backend_option, add_nonfinite_option


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text with an `npusim export-llm` folder",
                       description="Load the compiled prefill/decode programs and the model's weights once, then "
                                   "generate, streaming tokens as they come. Reports the time to the first token "
                                   "(prefill) apart from the decode rate (tokens/s after the first).\n\n"
                                   "  npusim generate out --prompt \"Hello\" --max-new-tokens 32\n"
                                   "  npusim generate out --prompt-ids 1,2,3 --model-dir ~/models/qwen2.5-0.5b")
    p.add_argument("out_dir", help="folder written by `npusim export-llm`")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (needs tokenizer.json in the model directory)")
    src.add_argument("--prompt-ids", help="comma-separated prompt token ids, e.g. 1,2,3")
    p.add_argument("--chat", action="store_true", help="wrap --prompt in the model's chat template")
    p.add_argument("--max-new-tokens", type=argtypes.integer(1, name="count"), default=32,
                   help="tokens to generate at most (the prompt and these must fit the export's cache)")
    add_backend_option(p)
    add_nonfinite_option(p)
    p.add_argument("--model-dir", default=None,
                   help="weights folder: config.json + *.safetensors (default: the one the folder's manifest names)")
    p.add_argument("--temperature", type=argtypes.non_negative, default=0.0,
                   help="sampling temperature, a finite number >= 0; 0 = greedy")
    p.add_argument("--top-k", type=argtypes.integer(1, name="count"), default=None,
                   help="sample from the k most likely tokens, k >= 1 (default: all)")
    p.add_argument("--top-p", type=argtypes.number(0.0, 1.0, lo_open=True, name="probability"), default=None,
                   help="nucleus sampling mass, in (0, 1] (default: off)")
    p.add_argument("--seed", type=argtypes.seed, default=None,
                   help="seed of the sampler, 0 to 2**63-1 (default: a fresh one each run)")
    p.add_argument("--stop-ids", default=None, help="comma-separated stop token ids, '' for none (default: the "
                                                    "model's eos)")
    p.set_defaults(func=run)


def _ids(text: str, what: str) -> list[int]:
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise CLIError(f"{what} expects comma-separated integers, got {text!r}") from None
    bad = [i for i in ids if not 0 <= i <= argtypes.MAX_SEED]
    if bad:
        raise CLIError(f"{what}: token ids are >= 0, got {bad[0]}")
    return ids


def _check_folder(args: argparse.Namespace) -> None:
    """A graphs-only folder needs weights from somewhere: say how, in CLI terms."""
    path = os.path.join(args.out_dir, "manifest.json")
    if args.model_dir is not None or not os.path.isfile(path):
        return  # LLM.load names what is missing
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.loads(f.read())
    except (ValueError, OSError, RecursionError):
        return  # LLM.load reports a bad manifest
    if isinstance(manifest, dict) and not manifest.get("model_dir"):
        raise CLIError(f"{args.out_dir} holds graphs and programs only (exported from --config "
                       f"{manifest.get('config')}): give --model-dir DIR (config.json + safetensors of that "
                       "architecture), or re-export with `npusim export-llm --config NAME --random-weights`")


def run(args: argparse.Namespace) -> int:
    from npu_runtime.llm import LLM

    if args.chat and args.prompt is None:
        raise CLIError("--chat wraps --prompt text in the chat template; with --prompt-ids it has nothing to wrap")
    sampling = [f for f, v in (("--top-k", args.top_k), ("--top-p", args.top_p), ("--seed", args.seed))
                if v is not None]
    if sampling and args.temperature <= 0:
        raise CLIError(f"{', '.join(sampling)} apply to sampling; give --temperature > 0 (0, the default, is greedy)")
    _check_folder(args)
    llm = LLM.load(args.out_dir, args.backend, model_dir=args.model_dir,
                   allow_nonfinite=args.allow_nonfinite_weights)
    kw = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
              stop_tokens=None if args.stop_ids is None else _ids(args.stop_ids, "--stop-ids"))

    def emit(s: str) -> None:
        sys.stdout.write(s)
        sys.stdout.flush()

    if args.prompt is not None:
        res = llm.generate_text(args.prompt, args.max_new_tokens, chat=args.chat, stream_text=emit, **kw)
    else:
        res = llm.generate(_ids(args.prompt_ids, "--prompt-ids"), args.max_new_tokens,
                           stream=lambda t: emit(f"{t} "), **kw)
    print()
    n_decode = max(len(res.tokens) - 1, 0)
    decode = (f"decode {n_decode} tokens in {res.decode_seconds * 1e3:.1f} ms: {res.decode_tokens_per_s:.1f} "
              f"tokens/s ({res.decode_seconds / n_decode * 1e3:.2f} ms/token)" if n_decode else "no decode steps")
    print(f"[{len(res.prompt_ids)} prompt tokens, {len(res.tokens)} new ({res.stop_reason}); time to first token "
          f"{res.prefill_seconds * 1e3:.1f} ms (prefill in {res.prefill_calls} call(s)); {decode}; backend "
          f"{res.backend}]")
    return 0
