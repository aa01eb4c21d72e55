"""The inputs the fuzz suite mutates: the project's own ResNet and tiny Qwen2 (prefill, prefill keeping the last
token's logits, and decode) exported to IR JSON with their weights, and the artifacts compiled from them. Built once
per cache folder (deterministic: fixed seeds, fixed sizes), so a corpus case names its seed and replays on the same
bytes."""

from __future__ import annotations

import json
import os
from pathlib import Path

# qwen_prefill_last keeps the last token's logits only (as `export-llm` does): slice hoisting runs on its last layer
SEED_IRS = ("resnet", "qwen_prefill", "qwen_decode", "qwen_prefill_last")
# resnet_parts_f32 is partitioned: its max pool on the CPU reference, its average pool through torch_ir, between
# segments for the target (the fuzzer mutates segment fields, programs inside segments and a torch segment's IR)
SEED_ARTIFACTS = ("resnet_f32", "resnet_f16", "qwen_decode_f32", "qwen_prefill_bf16", "resnet_parts_f32")
STAMP = "seeds-v4"


def _weights_of(model) -> dict:
    # tied embeddings share storage, which safetensors refuses: every tensor gets its own copy
    state = {**model.state_dict(), **dict(model.named_buffers())}
    return {k: v.detach().clone().contiguous() for k, v in state.items()}


def build(folder: str | os.PathLike) -> Path:
    """Write the seeds into `folder` (once; a stamp file marks a finished build) and return it."""
    out = Path(folder)
    stamp = out / "STAMP"
    if stamp.exists() and stamp.read_text() == STAMP:
        return out
    out.mkdir(parents=True, exist_ok=True)
    import torch
    from safetensors.torch import save_file

    import npu_compiler
    from npu_export import export_model
    from npu_export.qwen2 import export_qwen2, random_tiny_qwen2
    from npu_export.resnet import resnet18

    torch.manual_seed(0)
    r = resnet18(num_classes=10, width=8).eval()
    res = export_model(r, [(1, 3, 32, 32)], out / "export", "resnet")
    (out / "resnet.json").write_text(Path(res.ir_path).read_text())
    save_file(_weights_of(r), str(out / "resnet.safetensors"))

    q = random_tiny_qwen2(seed=0)
    e = export_qwen2(q, out / "export" / "qwen", max_cache_len=16, prefill_len=4, dtype="float32")
    (out / "qwen_prefill.json").write_text(Path(e.prefill_path).read_text())
    (out / "qwen_decode.json").write_text(Path(e.decode_path).read_text())
    e = export_qwen2(q, out / "export" / "qwen_last", max_cache_len=16, prefill_len=4, dtype="float32",
                     prefill_last_logits_only=True)
    (out / "qwen_prefill_last.json").write_text(Path(e.prefill_path).read_text())
    save_file(_weights_of(q), str(out / "qwen.safetensors"))

    for name, ir, dtype in (("resnet_f32", "resnet", "float32"), ("resnet_f16", "resnet", "float16"),
                            ("qwen_decode_f32", "qwen_decode", "float32"),
                            ("qwen_prefill_bf16", "qwen_prefill", "bfloat16")):
        npu_compiler.compile(str(out / f"{ir}.json"), "cpu", dtype=dtype).save(out / f"{name}.npubin")
    npu_compiler.compile_artifact(str(out / "resnet.json"), "cpu", dtype="float32", force_cpu=["max_pool2d"],
                                  force_torch=["adaptive_avg_pool2d"]).save(out / "resnet_parts_f32.npubin")
    from npu_export.llm_export import export_llm

    export_llm(out / "llm", config="tiny", random_weights=True, max_cache_len=32, prefill_len=8, dtype="float32",
               target="cpu")
    stamp.write_text(STAMP)
    return out


def weights_file(seed: str) -> str:
    """The safetensors file of a seed IR or artifact."""
    return "resnet.safetensors" if seed.startswith("resnet") else "qwen.safetensors"


def load_ir(folder: str | os.PathLike, seed: str) -> dict:
    return json.loads((Path(folder) / f"{seed}.json").read_text())
