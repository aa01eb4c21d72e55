"""Export of a Hugging Face Qwen2-family causal LM for static-KV-cache prefill and decode.

Writes `prefill.json` and `decode.json` (torch_ir IR JSON) and `cache_map.json`, which tells the compiler and the
runtime which graph inputs/outputs are the KV caches of which layer, what the other inputs are, and where each
weight placeholder's data comes from. Weights are not copied: they stay in the model folder's safetensors.
"""

from __future__ import annotations

import copy
import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from torch_ir import IR, extract_ir
from transformers import Qwen2Config, Qwen2ForCausalLM

from ._atomic import atomic_write_text
from ._meta import first_float_dtype, meta_clone
from .errors import UnknownConfigError
from .ir_io import TORCH_DTYPES, save_ir_json
from .qwen2_checkpoint import checkpoint_keys, resolve_weights
from .qwen2_static import StaticCacheLM, fixed_inputs, kv_input_names

__all__ = [
    "CACHE_MAP_FORMAT",
    "LLMExport",
    "QWEN2_CONFIGS",
    "export_qwen2",
    "extract_qwen2_graph",
    "make_additive_mask",
    "qwen2_config",
    "random_qwen2",
    "random_tiny_qwen2",
    "tiny_qwen2_config",
]

CACHE_MAP_FORMAT = "npu_export.static_kv_llm/1"
AttnImpl = Literal["eager", "sdpa"]


# --- configs --------------------------------------------------------------------------------------------------


def tiny_qwen2_config(**overrides: Any) -> Qwen2Config:
    """A 2-layer Qwen2 for tests (GQA with 2 KV heads, tied embeddings, head_dim 16)."""
    kwargs: dict[str, Any] = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        max_position_embeddings=256,
    )
    kwargs.update(overrides)
    return Qwen2Config(**kwargs)


def random_qwen2(config: Qwen2Config, *, dtype: torch.dtype = torch.float32, seed: int = 0,
                 attn_implementation: str = "eager"):
    """A Qwen2ForCausalLM of `config` with random weights. HF's init (std 0.02) gives near-uniform attention, which
    would hide mask or cache-slot mistakes and make greedy text one repeated token: weights get std 0.1, norm scales
    U(0.8, 1.2)."""
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM._from_config(copy.deepcopy(config), attn_implementation=attn_implementation, dtype=dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0.0, 0.1)
    return model.eval()


def random_tiny_qwen2(attn_implementation: str = "eager", dtype: torch.dtype = torch.float32, seed: int = 0):
    """`random_qwen2` of the tiny config, for tests."""
    return random_qwen2(tiny_qwen2_config(), dtype=dtype, seed=seed, attn_implementation=attn_implementation)


_BUILTIN: dict[str, dict[str, Any]] = {
    "qwen2.5-1.5b": dict(
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        bos_token_id=151643,
        eos_token_id=151643,
    ),
    "qwen2.5-0.5b": dict(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        bos_token_id=151643,
        eos_token_id=151643,
    ),
}


QWEN2_CONFIGS = ("tiny", *sorted(_BUILTIN))


def qwen2_config(name: str) -> Qwen2Config:
    """A built-in config: "qwen2.5-1.5b", "qwen2.5-0.5b" or "tiny" (see `tiny_qwen2_config`)."""
    key = name.lower()
    if key == "tiny":
        return tiny_qwen2_config()
    if key not in _BUILTIN:
        raise UnknownConfigError(f"unknown Qwen2 config {name!r}; known: {', '.join(QWEN2_CONFIGS)}")
    return Qwen2Config(**_BUILTIN[key])


# --- masks ----------------------------------------------------------------------------------------------------


def make_additive_mask(
    valid_len_or_positions: int | Sequence[int] | torch.Tensor,
    T: int,
    L: int,
    dtype: torch.dtype | str = torch.float32,
) -> torch.Tensor:
    """The `[1, 1, T, L]` additive attention mask of one static-cache step.

    A query at absolute position p sees cache slots 0..p (0 added); every other slot gets `finfo(dtype).min`,
    the fill HF uses. `valid_len_or_positions` is either the T query positions, or an int n = the number of
    valid cache slots after this step's writes, i.e. the queries sit at positions n-T .. n-1 (a prefill of P
    tokens: n = P; a decode step at position p: n = p + 1).
    """
    dt = _as_dtype(dtype)
    if isinstance(valid_len_or_positions, int):
        positions = torch.arange(valid_len_or_positions - T, valid_len_or_positions)
    else:
        positions = torch.as_tensor(valid_len_or_positions, dtype=torch.int64).reshape(-1)
    if positions.numel() != T:
        raise ValueError(f"need {T} query positions, got {positions.numel()}")
    if int(positions.min()) < 0 or int(positions.max()) >= L:
        raise ValueError(f"query positions {positions.tolist()} do not fit a cache of {L} slots")
    visible = torch.arange(L)[None, :] <= positions[:, None]
    mask = torch.full((T, L), torch.finfo(dt).min, dtype=dt)
    mask[visible] = 0
    return mask.reshape(1, 1, T, L)


# --- export ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LLMExport:
    out_dir: Path
    prefill_path: Path
    decode_path: Path
    cache_map_path: Path
    cache_map: dict[str, Any] = field(repr=False, compare=False)
    prefill_ir: IR = field(repr=False, compare=False)
    decode_ir: IR = field(repr=False, compare=False)


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    key = dtype.removeprefix("torch.")
    if key not in TORCH_DTYPES or not TORCH_DTYPES[key].is_floating_point:
        raise ValueError(f"unsupported model dtype {dtype!r}")
    return TORCH_DTYPES[key]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass
class _Source:
    config: Qwen2Config
    model: nn.Module | None = None
    model_dir: Path | None = None


def _resolve_source(source: Qwen2Config | nn.Module | str | os.PathLike[str]) -> _Source:
    if isinstance(source, Qwen2Config):
        return _Source(copy.deepcopy(source))
    if isinstance(source, nn.Module):
        if not hasattr(source, "model") or not hasattr(source, "lm_head"):
            raise TypeError(f"expected a Qwen2ForCausalLM-like model, got {type(source).__name__}")
        return _Source(copy.deepcopy(source.config), model=source)
    path = Path(source)
    if path.is_dir():
        return _Source(Qwen2Config.from_pretrained(path), model_dir=path)
    if isinstance(source, str) and (source.lower() in _BUILTIN or source.lower() == "tiny"):
        return _Source(qwen2_config(source))
    raise FileNotFoundError(
        f"{source}: neither a model folder (with config.json) nor a built-in config name {sorted([*_BUILTIN, 'tiny'])}"
    )


def _meta_model(src: _Source, dtype: torch.dtype, attn_implementation: AttnImpl) -> nn.Module:
    if src.model is not None:
        meta = meta_clone(src.model)
        # Parameters only: buffers such as rotary inv_freq stay float32, as in a model HF loads in `dtype`.
        for p in meta.parameters():
            p.data = p.data.to(dtype)
    else:
        with torch.device("meta"):
            # _from_config sets the default dtype while building, so inv_freq stays float32 (unlike `.to(dtype)`)
            meta = Qwen2ForCausalLM._from_config(copy.deepcopy(src.config), dtype=dtype)
    meta.config._attn_implementation = attn_implementation
    return meta.eval()


def extract_qwen2_graph(
    meta_model: nn.Module, seq_len: int, max_cache_len: int, dtype: torch.dtype, *, last_logits_only: bool = False
) -> IR:
    """IR of one static-cache step with `seq_len` new tokens (a meta-device Qwen2ForCausalLM in)."""
    cfg = meta_model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    meta = torch.device("meta")
    example: list[torch.Tensor] = [
        torch.zeros(1, seq_len, dtype=torch.int64, device=meta),
        torch.zeros(1, seq_len, dtype=torch.int64, device=meta),
        torch.zeros(seq_len, dtype=torch.int64, device=meta),
        # in the model dtype: an fp32 mask would silently promote a bf16 model's attention to fp32
        torch.zeros(1, 1, seq_len, max_cache_len, dtype=dtype, device=meta),
    ]
    kv_shape = (1, cfg.num_key_value_heads, max_cache_len, head_dim)
    example += [torch.zeros(kv_shape, dtype=dtype, device=meta) for _ in range(2 * cfg.num_hidden_layers)]
    wrapper = StaticCacheLM(meta_model, last_logits_only=last_logits_only).eval()
    with warnings.catch_warnings():
        # non-persistent buffers (rotary inv_freq) are meta constants; they stay reachable as weights
        warnings.filterwarnings("ignore", message="Skipping .* meta-device constant")
        # no_grad: HF's @torch.no_grad() rotary embedding would otherwise become an opaque set_grad node
        with torch.no_grad():
            return extract_ir(wrapper, tuple(example), model_name=f"{cfg.model_type}_static_T{seq_len}")


def _graph_entry(ir: IR, file: str, seq_len: int, num_layers: int) -> dict[str, Any]:
    input_names = [t.name for t in ir.graph_inputs]
    expected = [*fixed_inputs, *kv_input_names(num_layers)]
    if input_names != expected:
        raise RuntimeError(f"unexpected graph inputs {input_names}, expected {expected}")
    outputs = ir.graph_outputs
    if len(outputs) != 1 + 2 * num_layers:
        raise RuntimeError(f"expected {1 + 2 * num_layers} graph outputs, got {len(outputs)}")
    producers = {o.name: n for n in ir.nodes for o in n.outputs}
    layers = []
    for i in range(num_layers):
        entry: dict[str, Any] = {"layer": i}
        for j, kind in enumerate("kv"):
            cache_in, cache_out = f"{kind}_cache_{i}", outputs[1 + 2 * i + j].name
            # The output must be the index_copy that wrote into this very input, or the map would lie.
            node = producers.get(cache_out)
            if node is None or node.op_type != "aten.index_copy.default" or node.inputs[0].name != cache_in:
                raise RuntimeError(f"graph output {cache_out} is not index_copy({cache_in}, ...)")
            entry[f"{kind}_input"], entry[f"{kind}_output"] = cache_in, cache_out
        layers.append(entry)
    logits = outputs[0]
    return {
        "file": file,
        "seq_len": seq_len,
        "num_nodes": len(ir.nodes),
        "inputs": {name: name for name in fixed_inputs},
        "outputs": {"logits": logits.name},
        "logits_shape": list(logits.shape),
        "input_order": input_names,
        "output_order": [o.name for o in outputs],
        "layers": layers,
    }


def _rope_facts(cfg: Qwen2Config, head_dim: int) -> dict[str, Any]:
    rope = dict(cfg.rope_parameters or {})
    rope_type = rope.get("rope_type", "default")
    if rope_type != "default":
        # Scaled RoPE variants change inv_freq and cos/sin scaling; the runtime only computes the default one.
        raise NotImplementedError(f"rope_type {rope_type!r} is not supported (only 'default')")
    return {
        "type": rope_type,
        "theta": float(rope["rope_theta"]),
        "head_dim": head_dim,
        "attention_scaling": 1.0,
        "inv_freq": "1.0 / theta ** (arange(0, head_dim, 2, dtype=float32) / head_dim)",
        "inv_freq_dtype": "float32",
    }


def export_qwen2(
    config_or_model_dir: Qwen2Config | nn.Module | str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    max_cache_len: int,
    prefill_len: int,
    dtype: torch.dtype | str | None = "bfloat16",
    attn_implementation: AttnImpl = "eager",
    prefill_last_logits_only: bool = False,
) -> LLMExport:
    """Export prefill (T = prefill_len) and decode (T = 1) graphs over a static cache of max_cache_len slots.

    `config_or_model_dir`: a Qwen2Config, a model folder (config.json + safetensors), a built-in config name, or a
    materialised Qwen2ForCausalLM (tests). Extraction always runs on a meta-device model: no weights in memory.
    `dtype=None` keeps a model instance's dtype (the config's torch dtype otherwise). Nothing is written unless both
    graphs export; `cache_map.json` is written last.
    """
    if attn_implementation not in ("eager", "sdpa"):
        raise ValueError(f"attn_implementation must be 'eager' or 'sdpa', got {attn_implementation!r}")
    if not 1 <= prefill_len <= max_cache_len:
        raise ValueError(f"need 1 <= prefill_len <= max_cache_len, got {prefill_len} and {max_cache_len}")
    src = _resolve_source(config_or_model_dir)
    cfg = src.config
    if max_cache_len > cfg.max_position_embeddings:
        raise ValueError(f"max_cache_len {max_cache_len} exceeds max_position_embeddings {cfg.max_position_embeddings}")
    if getattr(cfg, "use_sliding_window", False):
        raise NotImplementedError("sliding-window attention layers are not supported by the static-cache export")
    if dtype is None:
        dt = first_float_dtype(src.model) if src.model is not None else (cfg.dtype or torch.float32)
        dt = _as_dtype(dt)
    else:
        dt = _as_dtype(dtype)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope = _rope_facts(cfg, head_dim)

    meta_model = _meta_model(src, dt, attn_implementation)
    prefill_ir = extract_qwen2_graph(
        meta_model, prefill_len, max_cache_len, dt, last_logits_only=prefill_last_logits_only
    )
    decode_ir = extract_qwen2_graph(meta_model, 1, max_cache_len, dt)

    n = cfg.num_hidden_layers
    weights = resolve_weights(
        [prefill_ir, decode_ir],
        tied=bool(cfg.tie_word_embeddings),
        checkpoint=checkpoint_keys(src.model_dir) if src.model_dir is not None else None,
    )
    for entry in weights["placeholders"].values():
        if entry["source"] == "rope_inv_freq":
            rope.setdefault("inv_freq_placeholders", []).append(entry["placeholder"])
    cache_map: dict[str, Any] = {
        "format": CACHE_MAP_FORMAT,
        "model": {
            "architecture": "Qwen2ForCausalLM",
            "num_layers": n,
            "hidden_size": cfg.hidden_size,
            "num_heads": cfg.num_attention_heads,
            "kv_heads": cfg.num_key_value_heads,
            "head_dim": head_dim,
            "intermediate_size": cfg.intermediate_size,
            "vocab_size": cfg.vocab_size,
            "max_position_embeddings": cfg.max_position_embeddings,
            "rms_norm_eps": cfg.rms_norm_eps,
            "rope_theta": rope["theta"],
            "tie_word_embeddings": bool(cfg.tie_word_embeddings),
            "dtype": _dtype_name(dt),
            "max_cache_len": max_cache_len,
            "prefill_len": prefill_len,
            "attn_implementation": attn_implementation,
        },
        "cache": {
            "shape": [1, cfg.num_key_value_heads, max_cache_len, head_dim],
            "layout": "[batch, kv_heads, max_cache_len, head_dim]",
            "dtype": _dtype_name(dt),
            "initial_value": 0.0,
            "update": "k_output = index_copy(k_input, dim=2, index=cache_position, source=new_k)",
        },
        "attention_mask": {
            "shape": "[1, 1, seq_len, max_cache_len]",
            "dtype": _dtype_name(dt),
            "visible": 0.0,
            "masked": torch.finfo(dt).min,
            "rule": "the query at position p sees cache slots 0..p",
        },
        "rope": rope,
        "graphs": {
            "prefill": _graph_entry(prefill_ir, "prefill.json", prefill_len, n),
            "decode": _graph_entry(decode_ir, "decode.json", 1, n),
        },
        "weights": weights,
    }

    out = Path(out_dir)
    prefill_path = save_ir_json(prefill_ir, out / "prefill.json")
    decode_path = save_ir_json(decode_ir, out / "decode.json")
    cache_map_path = atomic_write_text(out / "cache_map.json", json.dumps(cache_map, indent=2) + "\n")
    return LLMExport(
        out_dir=out,
        prefill_path=prefill_path,
        decode_path=decode_path,
        cache_map_path=cache_map_path,
        cache_map=cache_map,
        prefill_ir=prefill_ir,
        decode_ir=decode_ir,
    )
