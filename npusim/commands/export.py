"""npusim export: write IR JSON (+ safetensors) for the built-in model families."""

from __future__ import annotations

import argparse
import os


def register(sub) -> None:
    p = sub.add_parser("export", help="export a built-in model (ResNet-18/50, Qwen2) to IR JSON + safetensors",
                       description="Export a model with torch.export through pytorch-ir. ResNets get random weights "
                                   "(no hub access); Qwen2 comes from a model folder (config.json + safetensors) or "
                                   "a built-in config.")
    p.add_argument("model", choices=["resnet18", "resnet50", "qwen2"])
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.add_argument("--batch", type=int, default=1, help="CNN batch size")
    p.add_argument("--image-size", type=int, default=224, help="CNN input height and width")
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--width", type=int, default=64, help="CNN base width (64 = the real model)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-dir", help="qwen2: a Hugging Face model folder")
    p.add_argument("--config", help="qwen2: a built-in config (tiny, qwen2.5-0.5b, qwen2.5-1.5b)")
    p.add_argument("--max-cache-len", type=int, default=256, help="qwen2: static KV cache length")
    p.add_argument("--prefill-len", type=int, default=32, help="qwen2: prefill chunk length")
    p.add_argument("--llm-dtype", default="bfloat16", help="qwen2: dtype of the exported graphs")
    p.add_argument("--attn", default="eager", choices=["eager", "sdpa"], help="qwen2 attention implementation")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    os.makedirs(args.output, exist_ok=True)
    if args.model in ("resnet18", "resnet50"):
        from npu_export import resnet
        from npu_export.cnn import export_cnn

        torch.manual_seed(args.seed)
        model = getattr(resnet, args.model)(num_classes=args.num_classes, width=args.width).eval()
        res = export_cnn(model, (args.batch, 3, args.image_size, args.image_size), args.output, args.model)
        print(f"exported {args.model} -> {res.ir_path}, {res.weights_path} (random weights, seed {args.seed})")
        return 0
    from npu_export.qwen2 import export_qwen2, qwen2_config

    source = args.model_dir or (qwen2_config(args.config) if args.config else None)
    if source is None:
        raise SystemExit("npusim export qwen2: give --model-dir DIR or --config NAME")
    res = export_qwen2(source, args.output, max_cache_len=args.max_cache_len, prefill_len=args.prefill_len,
                       dtype=args.llm_dtype, attn_implementation=args.attn)
    print(f"exported qwen2 -> {res.prefill_path}, {res.decode_path}, {res.cache_map_path}")
    return 0
