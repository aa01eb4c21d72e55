"""npusim generate OUT_DIR --prompt TEXT | --prompt-ids 1,2,3 --max-new-tokens N: stream tokens from an export-llm
folder, then report prefill time, decode tokens/s and the backend."""

from __future__ import annotations

import argparse
import sys


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate tokens with an `npusim export-llm` folder",
                       description="Load the compiled prefill/decode programs and the model's weights once, then "
                                   "generate, streaming tokens as they come.")
    p.add_argument("out_dir", help="folder written by `npusim export-llm`")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (needs tokenizer.json in the model directory)")
    src.add_argument("--prompt-ids", help="comma-separated prompt token ids, e.g. 1,2,3")
    p.add_argument("--chat", action="store_true", help="wrap --prompt in the model's chat template")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--backend", default=None, help="cpu, cuda (default: best available, or $NPUSIM_BACKEND)")
    p.add_argument("--model-dir", default=None, help="weights folder (default: the one the manifest names)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop-ids", default=None, help="comma-separated stop token ids (default: the model's eos)")
    p.set_defaults(func=run)


def _ids(text: str, what: str) -> list[int]:
    from npu_runtime.llm import LLMError

    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise LLMError(f"{what} expects comma-separated integers, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    from npu_runtime.llm import LLM

    llm = LLM.load(args.out_dir, args.backend, model_dir=args.model_dir)
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
    print(f"[{len(res.prompt_ids)} prompt tokens, {len(res.tokens)} new ({res.stop_reason}); prefill "
          f"{res.prefill_seconds * 1e3:.1f} ms in {res.prefill_calls} call(s); decode "
          f"{res.decode_tokens_per_s:.1f} tokens/s; backend {res.backend}]")
    return 0
