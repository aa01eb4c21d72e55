"""Static-KV-cache forward of a Hugging Face Qwen2 causal LM, shaped for `torch.export`.

In transformers 5.x, `past_key_values.update(k, v, layer_idx)` receives no `cache_position`, so the cache object
is built per forward from the `cache_position` graph input. Each layer writes functionally with
`buf.index_copy(2, cache_position, k)`; the results are graph outputs, which is how the updated caches leave a
graph that has no mutable state.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import Cache, CacheLayerMixin

__all__ = ["IndexCopyCache", "IndexCopyLayer", "StaticCacheLM", "fixed_inputs", "kv_input_names"]

# Graph input names, in order, before the per-layer caches.
fixed_inputs = ("input_ids", "position_ids", "cache_position", "attention_mask")


def kv_input_names(num_layers: int) -> list[str]:
    return [name for i in range(num_layers) for name in (f"k_cache_{i}", f"v_cache_{i}")]


class IndexCopyLayer(CacheLayerMixin):
    """One layer's static K/V buffers `[B, kv_heads, L, head_dim]`, updated out of place at `cache_position`."""

    is_compileable = True
    is_sliding = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, cache_position: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values = keys, values
        self.cache_position = cache_position
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        # The buffers come in as graph inputs, already allocated.
        pass

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Out of place: an in-place index_copy_ on a graph input would be an input mutation, which torch_ir's
        # graph outputs do not express.
        self.keys = self.keys.index_copy(2, self.cache_position, key_states)
        self.values = self.values.index_copy(2, self.cache_position, value_states)
        # Attention then runs over all L slots; the additive mask hides the ones not yet valid.
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[2], 0

    def get_seq_length(self) -> int:
        # Only consulted by HF when position_ids or the mask are missing; both are always given.
        raise NotImplementedError("IndexCopyLayer needs explicit position_ids and a 4-D attention mask")

    def get_max_length(self) -> int:
        return self.keys.shape[2]


class IndexCopyCache(Cache):
    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], cache_position: torch.Tensor) -> None:
        super().__init__(layers=[IndexCopyLayer(k, v, cache_position) for k, v in zip(keys, values, strict=True)])


class StaticCacheLM(nn.Module):
    """forward(input_ids, position_ids, cache_position, attention_mask, k_cache_0, v_cache_0, ...) ->
    (logits, k_cache_0', v_cache_0', ...).

    It holds the HF model's own `model` and `lm_head` submodules (not the HF model), so parameter names, and with
    them the IR's weight_name_mapping, are exactly the checkpoint's keys (`model.layers.0...`, `lm_head.weight`).
    """

    def __init__(self, causal_lm: nn.Module, last_logits_only: bool = False) -> None:
        super().__init__()
        self.model = causal_lm.model
        self.lm_head = causal_lm.lm_head
        self.num_layers = causal_lm.config.num_hidden_layers
        self.last_logits_only = last_logits_only
        # torch.export names graph inputs after the forward's signature; spell out one name per cache buffer.
        params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        params += [
            inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            for n in (*fixed_inputs, *kv_input_names(self.num_layers))
        ]
        signature = inspect.Signature(params)
        cls = type(self)
        # A per-instance subclass, so the signature of one model's forward never leaks into another's.
        self.__class__ = type(cls.__name__, (cls,), {"forward": _with_signature(cls.forward, signature)})

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cache_position: torch.Tensor,
        attention_mask: torch.Tensor,
        *kv: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        if len(kv) != 2 * self.num_layers:
            raise ValueError(f"expected {2 * self.num_layers} cache tensors, got {len(kv)}")
        cache = IndexCopyCache(list(kv[0::2]), list(kv[1::2]), cache_position)
        out = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            past_key_values=cache,
            use_cache=True,
        )
        hidden = out.last_hidden_state
        if self.last_logits_only:
            hidden = hidden[:, -1:, :]
        results = [self.lm_head(hidden)]
        for layer in cache.layers:
            results += [layer.keys, layer.values]
        return tuple(results)


def _with_signature(fn: Any, signature: inspect.Signature) -> Any:
    def forward(self: StaticCacheLM, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return fn(self, *args)

    forward.__signature__ = signature  # type: ignore[attr-defined]
    forward.__doc__ = fn.__doc__
    return forward
