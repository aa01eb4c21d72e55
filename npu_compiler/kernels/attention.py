"""Attention: out = softmax(scale * q @ k^T [+ mask | masked by a bool mask] [causal]) @ v per head, with grouped-
query K/V read in place (query head h reads kv head h // (heads / kv_heads)), scores and probabilities rounded where
the graph rounds them (`scores_dtype`, `probs_dtype`). With `valid_len` (decode over a static KV cache) the keys past
the last written position (the largest of the positions argument) are never read: the mask hides them anyway. A
query row whose keys are all masked attends to nothing (zeros, as ATen's attention gives).

Why a library kernel: two contractions around a row softmax; run fast it is an online (flash) softmax over key
blocks kept on chip, which the expression language does not describe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..dtypes import is_float
from ..errors import KernelFault
from ..expr.interpret import round_to, store
from .base import Arrays, KernelCost, KernelSpec, Step, dtype_of, expect
from .counting import footprint, out_writes, ref_reads
from .fields import bounded, one_of

if TYPE_CHECKING:
    from ..buffers import BufferSpec
    from .base import KernelCall

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")


def attention_flops(rows: int, kv_len: int, head_dim: int, v_dim: int) -> int:
    """QK^T and PV (2 per multiply-add) and the softmax (about 5 per score) for `rows` query rows."""
    return 2 * rows * kv_len * (head_dim + v_dim) + 5 * rows * kv_len


@dataclass(frozen=True)
class AttentionKernel(KernelSpec):
    kind = "attention"
    library_reason = ("two contractions around a row softmax: run fast it is an online (flash) softmax over key "
                      "blocks kept on chip")

    scale: float
    is_causal: bool
    mask: str = one_of("none", "additive", "bool")
    batch: int = bounded(0)
    heads: int = bounded(1)
    kv_heads: int = bounded(1)
    q_len: int = bounded(0)
    kv_len: int = bounded(0)
    head_dim: int = bounded(1)
    v_dim: int = bounded(1)
    scores_dtype: str = one_of(*FLOAT_DTYPES, default="float32")
    probs_dtype: str = one_of(*FLOAT_DTYPES, default="float32")
    valid_len: bool = False  # the last argument holds the cache positions written this step
    # True where the graph's attention is one fused op (scaled_dot_product_attention), which does not say where its
    # probabilities are rounded: a kernel may then compute them online (against a running max, in one pass over the
    # keys) and keep them at least as precise as `probs_dtype`. False: the graph rounds the normalised probabilities
    # itself (a softmax, then a cast) and every kernel rounds exactly there. The reference rounds exactly either way.
    online: bool = False

    @property
    def rows(self) -> int:
        return self.batch * self.heads * self.q_len

    def check(self, call: KernelCall, buffers: Sequence[BufferSpec]) -> None:
        nargs = 3 + (self.mask != "none") + self.valid_len
        expect(len(call.args) == nargs, f"attention with {len(call.args)} arguments, expected {nargs}")
        expect(len(call.outs) == 1, f"attention with {len(call.outs)} outputs")
        expect(self.heads % self.kv_heads == 0, f"{self.heads} query heads over {self.kv_heads} kv heads")
        q, k, v = call.args[:3]
        b, h, t, lk, d, dv = self.batch, self.heads, self.q_len, self.kv_len, self.head_dim, self.v_dim
        for ref, numel, what in ((q, b * h * t * d, "q"), (k, b * self.kv_heads * lk * d, "k"),
                                 (v, b * self.kv_heads * lk * dv, "v"), (call.outs[0], b * h * t * dv, "output")):
            expect(ref.numel == numel and ref.shape and ref.shape[-1] == (dv if what in ("v", "output") else d),
                   f"attention {what} of shape {list(ref.shape)} for batch {b}, heads {h}/{self.kv_heads}, "
                   f"lengths {t}/{lk}, dims {d}/{dv}")
        expect(len(q.shape) <= 4 and len(k.shape) <= 4 and len(v.shape) <= 4 and len(call.outs[0].shape) <= 4,
               "attention tensors have rank 4 at most")
        for r in (q, k, v, call.outs[0]):
            expect(is_float(dtype_of(buffers, r)), f"attention over {dtype_of(buffers, r)}")
        if self.mask != "none":
            m = call.args[3]
            expect(m.numel == b * h * t * lk, f"attention mask of shape {list(m.shape)} for {b * h * t} rows x {lk}")
            md = dtype_of(buffers, m)
            expect((md == "bool") == (self.mask == "bool"), f"a {self.mask} mask of dtype {md}")
        if self.valid_len:
            pd = dtype_of(buffers, call.args[-1])
            expect(not is_float(pd) and pd != "bool", f"cache positions of dtype {pd}")
        # (key splits and their scratch are the call's plan: kernels/plans.py)

    def attended(self, context_len: int | None = None) -> int:
        """Keys a query row attends to: `context_len` cached tokens for a decode over a static cache (its keys past
        the last written position are never read), else every key."""
        if self.valid_len and context_len is not None:
            return max(1, min(self.kv_len, context_len))
        return self.kv_len

    def cost(self, call: KernelCall, buffers: Sequence[BufferSpec], *, context_len: int | None = None) -> KernelCost:
        """Q K^T and P V: (head_dim + v_dim) MACs per score. Per score, arithmetic: the scale (when not 1), an
        additive mask, subtracting the row's max, exp, the row sum's add, the normalising divide; comparisons: the
        row max, a bool or causal mask's select. Reads: Q, the keys and values attended (each kv head once for the
        query heads that share it), the mask for those keys, the cache positions."""
        lk = self.attended(context_len)
        scores = self.rows * lk
        arith = scores * (4 + int(self.scale != 1.0) + int(self.mask == "additive"))
        compares = scores * (1 + int(self.mask == "bool") + int(self.is_causal))
        kv_rows = self.batch * self.kv_heads * lk
        elements = {1: kv_rows * self.head_dim, 2: kv_rows * self.v_dim}
        if self.mask != "none":
            elements[3] = footprint(call.args[3]) * lk // max(self.kv_len, 1)
        reads = ref_reads(call, buffers, range(len(call.args)), elements)
        return KernelCost(scores * (self.head_dim + self.v_dim), arith, compares, tuple(reads),
                          out_writes(call, buffers), (dtype_of(buffers, call.args[0]), dtype_of(buffers, call.args[1])))

    def reference(self, call: KernelCall, arrays: Arrays) -> Step:
        qv, kv_, vv = (arrays.view(a) for a in call.args[:3])
        mask_v = arrays.view(call.args[3]) if self.mask != "none" else None
        pos_v = arrays.view(call.args[-1]) if self.valid_len else None
        out = arrays.view(call.outs[0])
        b, h, t, d = self.batch, self.heads, self.q_len, self.head_dim
        hk = self.kv_heads
        sd, pd = self.scores_dtype, self.probs_dtype

        def run() -> None:
            q, k, v = (a.astype(np.float32) for a in (qv, kv_, vv))
            lk = self.kv_len
            mask = mask_v
            k = k.reshape(b, hk, lk, d)
            v = v.reshape(b, hk, lk, -1)
            if mask is not None:
                mask = mask.reshape(b, h, t, lk)
            if pos_v is not None:
                # Decode over a static cache: slots past the last written position are masked; do not read them.
                n = int(pos_v.max()) + 1 if pos_v.size else lk
                if not 0 < n <= lk:
                    raise KernelFault(f"cache position {n - 1} outside a cache of {lk} slots")
                k, v, lk = k[:, :, :n], v[:, :, :n], n
                mask = mask[..., :n] if mask is not None else None
            q = q.reshape(b, hk, h // hk, t, d)
            k = k.reshape(b, hk, 1, lk, d)
            v = v.reshape(b, hk, 1, lk, -1)
            # Rounded where the graph stores in a half dtype (the bf16 QK^T, its scaled and masked versions).
            s = round_to(np.matmul(q, k.swapaxes(-1, -2)), sd)
            s = round_to(s * np.float32(self.scale), sd)
            if mask is not None:
                m = mask.reshape(b, hk, h // hk, t, lk)
                if self.mask == "bool":
                    s = np.where(m, s, -np.inf)
                else:
                    s = round_to(s + m.astype(np.float32), sd)
            if self.is_causal:
                s = np.where(np.tril(np.ones((t, lk), bool)), s, -np.inf)
            mx = s.max(axis=-1, keepdims=True)
            # A query row whose keys are all masked out attends to nothing: zeros, as ATen's attention gives (its
            # "safe softmax"), not the NaN of 0/0.
            dead = np.isneginf(mx)
            with np.errstate(invalid="ignore"):
                e = np.exp(s - np.where(dead, np.float32(0), mx))
                pr = round_to(e / np.where(dead, np.float32(1), e.sum(axis=-1, keepdims=True)), pd)
            store(out, np.matmul(pr, v).reshape(out.shape))

        return run
