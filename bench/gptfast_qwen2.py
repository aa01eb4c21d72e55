"""A gpt-fast-style Qwen2 in plain PyTorch: the third decode peer of bench_llm.py.

As pytorch-labs/gpt-fast writes a decoder for `torch.compile`: the KV caches are module buffers updated in place
(`index_copy_` at the step's positions), attention is `scaled_dot_product_attention` over the whole static cache with
a boolean causal mask row and grouped heads (`enable_gqa`), q/k/v and gate/up are one fused linear each, RoPE reads a
precomputed cos/sin table, and the step is one function that `torch.compile(mode="reduce-overhead", fullgraph=True)`
turns into a CUDA graph. The weights are a Hugging Face Qwen2ForCausalLM's (`from_hf`), so it computes the same
model as the other peers; bench_llm checks its logits against theirs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class KVCache(nn.Module):
    def __init__(self, kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(1, kv_heads, max_len, head_dim, dtype=dtype), persistent=False)
        self.register_buffer("v_cache", torch.zeros(1, kv_heads, max_len, head_dim, dtype=dtype), persistent=False)

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k_cache.index_copy_(2, input_pos, k)
        self.v_cache.index_copy_(2, input_pos, v)
        return self.k_cache, self.v_cache


class RMSNorm(nn.Module):
    """Qwen2's: the mean square in float32, the scale applied in the input's dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, heads, t, d] rotated by the halves (Qwen2's rotate_half), cos/sin [t, d]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.wqkv = nn.Linear(dim, (heads + 2 * kv_heads) * head_dim, bias=True)
        self.wo = nn.Linear(heads * head_dim, dim, bias=False)
        self.kv_cache: KVCache | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                input_pos: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q_n, kv_n = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q, k, v = self.wqkv(x).split([q_n, kv_n, kv_n], dim=-1)
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        k, v = self.kv_cache.update(input_pos, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, q_n))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w13 = nn.Linear(dim, 2 * hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.attention = Attention(dim, heads, kv_heads, head_dim)
        self.feed_forward = FeedForward(dim, hidden)
        self.attention_norm = RMSNorm(dim, eps)
        self.ffn_norm = RMSNorm(dim, eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                input_pos: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, mask, input_pos)
        return h + self.feed_forward(self.ffn_norm(h))


class GptFastQwen2(nn.Module):
    """forward(idx [1, t], input_pos [t]) -> logits [1, t, vocab], writing the step's keys and values into the
    caches at `input_pos` (`setup_caches` first)."""

    def __init__(self, config) -> None:
        super().__init__()
        c = config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.config, self.head_dim = c, head_dim
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Block(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, head_dim,
                                          c.intermediate_size, c.rms_norm_eps) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.output = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.max_len = 0

    def setup_caches(self, max_len: int) -> None:
        """The static caches, the causal mask and the RoPE table for `max_len` positions, on the model's device and
        in its dtype (the table computed in float32 and rounded as Qwen2's rotary embedding does)."""
        w = self.output.weight
        dt, dev = w.dtype, w.device
        for layer in self.layers:
            a = layer.attention
            a.kv_cache = KVCache(a.kv_heads, max_len, self.head_dim, dt).to(dev)
        self.register_buffer("causal_mask", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool, device=dev)),
                             persistent=False)
        theta = float(getattr(self.config, "rope_theta", None)
                      or (getattr(self.config, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
        inv = 1.0 / theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=dev).float() / self.head_dim)
        freqs = torch.outer(torch.arange(max_len, device=dev).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos().to(dt), persistent=False)
        self.register_buffer("sin", emb.sin().to(dt), persistent=False)
        self.max_len = max_len

    def clear_caches(self) -> None:
        for layer in self.layers:
            layer.attention.kv_cache.k_cache.zero_()
            layer.attention.kv_cache.v_cache.zero_()

    def forward(self, idx: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        mask = self.causal_mask[None, None, input_pos]
        cos, sin = self.cos[input_pos], self.sin[input_pos]
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, input_pos)
        return self.output(self.norm(x))

    @classmethod
    def from_hf(cls, model, max_len: int) -> GptFastQwen2:
        """The same weights as a Hugging Face Qwen2ForCausalLM (fused where gpt-fast fuses), on its device and in
        its dtype, with caches for `max_len` positions."""
        c = model.config
        w = model.lm_head.weight
        with torch.device("meta"):
            fast = cls(c)
        fast = fast.to_empty(device=w.device).to(w.dtype)
        hf = model.model
        with torch.no_grad():
            fast.tok_embeddings.weight.copy_(hf.embed_tokens.weight)
            fast.output.weight.copy_(model.lm_head.weight)
            fast.norm.weight.copy_(hf.norm.weight)
            for mine, theirs in zip(fast.layers, hf.layers, strict=True):
                at, mlp = theirs.self_attn, theirs.mlp
                mine.attention.wqkv.weight.copy_(torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight]))
                mine.attention.wqkv.bias.copy_(torch.cat([at.q_proj.bias, at.k_proj.bias, at.v_proj.bias]))
                mine.attention.wo.weight.copy_(at.o_proj.weight)
                mine.feed_forward.w13.weight.copy_(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
                mine.feed_forward.w2.weight.copy_(mlp.down_proj.weight)
                mine.attention_norm.weight.copy_(theirs.input_layernorm.weight)
                mine.ffn_norm.weight.copy_(theirs.post_attention_layernorm.weight)
        fast.eval()
        fast.setup_caches(max_len)
        return fast


def decode_one_token(model: GptFastQwen2, idx: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
    """One decode step: what gpt-fast compiles."""
    return model(idx, input_pos)


def compiled_step():
    """`decode_one_token` under torch.compile as gpt-fast runs it (a CUDA graph a step)."""
    return torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True)
