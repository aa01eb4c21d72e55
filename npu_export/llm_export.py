"""`export_llm`: a Qwen2-family model directory (or a built-in config) to a folder that `npu_runtime.llm.LLM` loads.

The folder holds prefill.json / decode.json (IR), cache_map.json, prefill.npubin / decode.npubin (compiled for
one target) and manifest.json. Export runs on the meta device and the weights are not copied: the manifest names
the model directory, whose safetensors the runtime reads.

With `random_weights`, the folder is also the model directory: config.json, generation_config.json,
model.safetensors (random weights) and a small character-level tokenizer (tokenizer.json) are written into it, so that
`npusim generate FOLDER --prompt ...` runs with no checkpoint and nothing downloaded. The manifest then names the
model directory as "." (relative to the folder), so the folder can be moved.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config

import npu_compiler
from npu_compiler.atomic import umask
from npu_runtime.llm import MANIFEST_FORMAT, check_model_dir

from ._atomic import atomic_write_text
from ._quiet import no_hf_progress
from .char_tokenizer import save_char_tokenizer
from .qwen2 import export_qwen2, qwen2_config, random_qwen2

__all__ = ["LLMExportResult", "export_llm"]


@dataclass(frozen=True)
class LLMExportResult:
    out_dir: Path
    manifest_path: Path
    manifest: dict[str, Any]
    graphs_only: bool


def export_llm(
    out_dir: str | os.PathLike[str],
    *,
    model_dir: str | os.PathLike[str] | None = None,
    config: str | None = None,
    max_cache_len: int,
    prefill_len: int,
    dtype: str | None = None,
    target: str = "cpu",
    attn_implementation: str = "eager",
    random_weights: bool = False,
    seed: int = 0,
    progress: Callable[[int, int, str], None] | None = None,
    weights_dtype: str | None = None,
    lm_head_dtype: str | None = None,
) -> LLMExportResult:
    """Export, compile and describe. `dtype` None: the checkpoint's torch_dtype (bfloat16 for a built-in config).

    With `config` and no `model_dir` the folder has the graphs and programs only (no weights to run them with),
    unless `random_weights`: then a model of that config (or of `model_dir`'s config.json) with random weights
    (seeded) and a character-level tokenizer are written into the folder, which runs by itself. `weights_dtype`
    "int8" or "int4": the projections and the LM head weight-only quantized when the weights are loaded (W8A16,
    W4A16; npu_compiler/quant/weight_only.py); `lm_head_dtype` "int8", "int4" or "float": the LM head's own format
    (default: `weights_dtype`'s).
    """
    if (model_dir is None) == (config is None):
        raise ValueError("give exactly one of model_dir (a Hugging Face model folder) and config (a built-in name)")
    config_name = config
    if random_weights:
        cfg = (Qwen2Config.from_dict(check_model_dir(model_dir, need_weights=False)) if model_dir is not None
               else qwen2_config(config))
        dt = dtype or "bfloat16"
        write_random_model(out_dir, cfg, dt, seed)
        model_dir, config = out_dir, None
    if model_dir is not None:
        mdir = Path(model_dir).resolve()
        hf_cfg = check_model_dir(mdir)
        source: Any = mdir
        dt = dtype or hf_cfg.get("dtype") or hf_cfg.get("torch_dtype") or "bfloat16"
    else:
        mdir = None
        source = qwen2_config(config)  # KeyError names the known configs
        dt = dtype or "bfloat16"
    step = progress or (lambda done, total, detail: None)
    step(0, 3, "exporting prefill and decode graphs on the meta device")
    # Generation needs the logits after the prompt's last token only: the prefill graph computes no others (at
    # 2048 tokens and a 151,936-word vocabulary that is 1 TFLOP and 622 MB of logits saved).
    exp = export_qwen2(source, out_dir, max_cache_len=max_cache_len, prefill_len=prefill_len, dtype=dt,
                       attn_implementation=attn_implementation, prefill_last_logits_only=True)  # type: ignore[arg-type]
    theta = exp.cache_map["rope"]["theta"]
    out = Path(out_dir)
    files = {"prefill_ir": exp.prefill_path.name, "decode_ir": exp.decode_path.name,
             "cache_map": exp.cache_map_path.name}
    compute = {}
    for i, kind in enumerate(("prefill", "decode")):
        step(1 + i, 3, f"compiling {kind} for {target}")
        # one artifact whatever the ops: those the target lacks run on the CPU (segments the LLM runtime runs too)
        prog = npu_compiler.compile_artifact(getattr(exp, f"{kind}_path"), target, dtype=dt, rope_theta=theta,
                                             weights_dtype=weights_dtype, lm_head_dtype=lm_head_dtype)
        prog.save(out / f"{kind}.npubin")
        files[kind] = f"{kind}.npubin"
        compute[kind] = prog.compute_dtype
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "architecture": exp.cache_map["model"]["architecture"],
        # the folder itself ("."): it stays valid when the folder moves
        "model_dir": ("." if random_weights else str(mdir)) if mdir is not None else None,
        "config": config_name,
        "random_weights": random_weights,
        "files": files,
        "target": target,
        "dtype": dt,
        "weights_dtype": weights_dtype or dt,
        "lm_head_dtype": (lm_head_dtype if lm_head_dtype != "float" else dt) if lm_head_dtype else weights_dtype or dt,
        "compute_dtype": compute["decode"],
        "cache_dtype": exp.cache_map["cache"]["dtype"],
        "max_cache_len": max_cache_len,
        "prefill_len": prefill_len,
        "attn_implementation": attn_implementation,
        "tokenizer": bool(mdir is not None and (mdir / "tokenizer.json").is_file()),
    }
    path = atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    return LLMExportResult(out, path, manifest, mdir is None)


def write_random_model(out_dir: str | os.PathLike[str], config: Qwen2Config, dtype: str, seed: int = 0) -> Path:
    """A Hugging Face model folder in `out_dir`: `config` with random weights (`random_qwen2`, seeded) and a
    character-level tokenizer whose end token is the model's eos."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    eos = save_char_tokenizer(out, config.vocab_size)
    config = Qwen2Config.from_dict({**config.to_dict(), "bos_token_id": None, "eos_token_id": eos,
                                    "pad_token_id": None})
    model = random_qwen2(config, dtype=getattr(torch, dtype), seed=seed)
    # Hugging Face writes in place and with its own permissions: write into a private folder beside, then move
    # each file into place whole, readable as the user's umask allows (what every file npusim writes is)
    staging = Path(tempfile.mkdtemp(prefix=".save_pretrained-", dir=out))
    try:
        with no_hf_progress():
            model.save_pretrained(staging)  # config.json, generation_config.json, model.safetensors
        mode = 0o666 & ~umask()
        for f in sorted(staging.iterdir()):
            os.chmod(f, mode)
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out
