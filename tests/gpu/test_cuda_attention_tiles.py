"""Attention over many query rows on tensor cores (targets/cuda/flash_attention.py) against PyTorch eager on the CPU
in the same dtype: HF's eager attention (scores and probabilities rounded where it stores them) and ATen's fused
attention, with causal masks given as tensors (HF's finfo.min fill, -inf), bool masks, `is_causal`, grouped-query
heads, row and key counts that are not multiples of the tile, and the masks under which the kernel skips whole key
tiles: rows that see no key at all (the block must run again without skipping), and tiles that are all hidden; and
the same with the keys of long rows split across blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fused_cases import ir_dict
from tolerances import assert_close

import npu_compiler
from npu_compiler.targets.cuda import CudaTarget

from .util import rendered_for, to_np


class Eager(torch.nn.Module):
    """HF's eager attention: GQA by repeat, scaled bf16 scores plus the additive mask, fp32 softmax cast back."""

    def forward(self, q, k, v, m):
        g = q.shape[1] // k.shape[1]
        k = k[:, :, None].expand(-1, -1, g, -1, -1).reshape(q.shape[0], q.shape[1], k.shape[2], k.shape[3])
        v = v[:, :, None].expand(-1, -1, g, -1, -1).reshape(q.shape[0], q.shape[1], v.shape[2], v.shape[3])
        w = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5 + m
        w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(w, v)


class Sdpa(torch.nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v, *m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m[0] if m else None, is_causal=self.causal,
                                              enable_gqa=True)


class HeadsBack(torch.nn.Module):
    """Attention whose heads are put back together as the models do (transpose(1, 2), then reshape): the kernel
    writes its output [b, t, h, d] in memory, so that the transpose is a view and no copy follows."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        o = self.inner(*args).transpose(1, 2)
        return o.reshape(o.shape[0], o.shape[1], -1) * 1.0


def _causal(t: int, lk: int, start: int) -> np.ndarray:
    """Query i (at position start + i) sees keys 0..start + i."""
    return np.arange(lk)[None, :] <= (start + np.arange(t))[:, None]


def _additive(visible: np.ndarray, dtype: torch.dtype, fill: float | None = None) -> torch.Tensor:
    fill = torch.finfo(dtype).min if fill is None else fill
    m = torch.where(torch.from_numpy(visible), torch.tensor(0.0), torch.tensor(fill)).to(dtype)
    return m[None, None]


CASES = {
    # a static-cache prefill: 200 queries at positions 0..199 over a 256-slot cache, HF's finfo.min fill, one row
    # that sees nothing (HF gives it a uniform average of every slot: the block must not skip)
    "eager_cache_finfo_bf16": ("bfloat16", Eager(), 2, 12, 2, 200, 256, 128, "finfo_dead_row"),
    "eager_causal_inf_fp16": ("float16", Eager(), 1, 4, 4, 130, 130, 64, "neg_inf"),
    "eager_prompt_tail_bf16": ("bfloat16", Eager(), 1, 6, 2, 70, 300, 96, "finfo_offset"),
    "sdpa_is_causal_bf16": ("bfloat16", Sdpa(True), 2, 8, 2, 150, 150, 128, None),
    "sdpa_bool_blocks_fp16": ("float16", Sdpa(False), 1, 4, 1, 96, 200, 128, "bool_blocks"),
    "sdpa_nomask_bf16": ("bfloat16", Sdpa(False), 1, 2, 2, 17, 33, 16, None),
    # rows that see many key tiles: the keys split across blocks (stats, accumulate, combine launches; online records:
    # one pass, combine, repair)
    "split_eager_causal_finfo_bf16": ("bfloat16", Eager(), 1, 4, 2, 1100, 1100, 128, "causal_finfo"),
    # a row that sees nothing under a finfo.min mask: every split computes every tile (the guard of the skipping)
    "split_eager_dead_row_bf16": ("bfloat16", Eager(), 1, 2, 1, 1030, 1100, 64, "finfo_dead_row"),
    "split_sdpa_bool_blocks_fp16": ("float16", Sdpa(False), 1, 2, 1, 96, 1200, 128, "bool_blocks"),
    "split_sdpa_is_causal_bf16": ("bfloat16", Sdpa(True), 1, 4, 2, 1040, 1040, 64, None),
    # no mask, but too few blocks to fill the GPU
    "split_sdpa_nomask_bf16": ("bfloat16", Sdpa(False), 1, 2, 2, 40, 1100, 64, None),
    # SDPA is online (one pass a split, the splits combined at the row's max): HF's causal mask as a tensor (the
    # dead tiles skipped), and a row that sees nothing under it, which the repair launch computes again exactly
    "split_sdpa_causal_finfo_bf16": ("bfloat16", Sdpa(False), 1, 4, 2, 1100, 1100, 128, "causal_finfo"),
    "split_sdpa_dead_row_bf16": ("bfloat16", Sdpa(False), 1, 2, 1, 1030, 1100, 64, "finfo_dead_row"),
    # query heads in threes a block (a KV head's group a multiple of 3): Qwen2.5-1.5B's 12 heads over 2 under HF's
    # mask over a longer cache, a row that sees nothing, a bool mask, is_causal over two batches, and a mask of its own
    # for every head (each head's warps scan their own rows)
    "split_sdpa_causal_finfo_g6_bf16": ("bfloat16", Sdpa(False), 1, 12, 2, 1100, 1700, 128, "causal_finfo"),
    "split_sdpa_dead_row_g3_bf16": ("bfloat16", Sdpa(False), 1, 6, 2, 1030, 1100, 64, "finfo_dead_row"),
    "split_sdpa_bool_blocks_g3_fp16": ("float16", Sdpa(False), 1, 3, 1, 96, 1200, 128, "bool_blocks"),
    "split_sdpa_is_causal_b2_g3_bf16": ("bfloat16", Sdpa(True), 2, 6, 2, 1040, 1040, 64, None),
    "split_sdpa_per_head_g3_bf16": ("bfloat16", Sdpa(False), 1, 6, 2, 1030, 1100, 64, "per_head"),
    # the output stored head-last, as the heads are read back (one launch; three with splits)
    "heads_back_eager_causal_bf16": ("bfloat16", HeadsBack(Eager()), 2, 6, 2, 150, 150, 64, "causal_finfo"),
    "split_heads_back_sdpa_is_causal_fp16": ("float16", HeadsBack(Sdpa(True)), 1, 4, 2, 1040, 1040, 128, None),
}


# decode: one query row per head over many keys, split across blocks with the query heads of a KV head in one block
# (decode_attention.py: UNROLL key groups loaded at once, the scores kept in the scratch for the second launch)
DECODE_CASES = {
    "decode_eager_finfo_bf16": ("bfloat16", Eager(), 1, 12, 2, 1, 1100, 128, "finfo_offset"),  # Qwen2.5-1.5B's heads
    "decode_sdpa_nomask_fp16": ("float16", Sdpa(False), 2, 8, 2, 1, 700, 64, None),
    "decode_sdpa_bool_bf16": ("bfloat16", Sdpa(False), 1, 4, 4, 1, 1200, 128, "bool_blocks"),
    # eight query heads a KV head, 17 keys a split: most of a round of loads is past the split's end
    "decode_eager_short_bf16": ("bfloat16", Eager(), 1, 16, 2, 1, 600, 64, "finfo_offset"),
    # the scores' reduce-scatter over a key's lanes with more heads than lanes (head dim 32: 4 lanes, 8 heads), a
    # head dim of 32 lanes and a group of 3 (padded to 4), and one query head a KV head
    "decode_eager_d32_bf16": ("bfloat16", Eager(), 1, 16, 2, 1, 600, 32, "finfo_offset"),
    "decode_sdpa_d256_fp16": ("float16", Sdpa(False), 1, 6, 2, 1, 700, 256, None),
    "decode_sdpa_g1_bf16": ("bfloat16", Sdpa(False), 1, 2, 2, 1, 700, 64, None),
    # SDPA is online (one launch, each split at its own running max): Qwen2.5-1.5B's heads under HF's causal mask,
    # and a -inf mask that leaves one key visible, so that all splits but the first see nothing
    "decode_sdpa_finfo_bf16": ("bfloat16", Sdpa(False), 1, 12, 2, 1, 1100, 128, "finfo_offset"),
    "decode_sdpa_neg_inf_bf16": ("bfloat16", Sdpa(False), 1, 12, 2, 1, 900, 128, "neg_inf"),
}


def _inputs(name: str, gen: torch.Generator):
    dtype, _, b, h, hk, t, lk, d, mask = CASES[name] if name in CASES else DECODE_CASES[name]
    tdt = getattr(torch, dtype)
    q, k, v = (torch.randn(shape, generator=gen).to(tdt) for shape in ((b, h, t, d), (b, hk, lk, d), (b, hk, lk, d)))
    if mask is None:
        return [q, k, v]
    if mask == "finfo_dead_row":
        vis = _causal(t, lk, 0)
        vis[5] = False
        return [q, k, v, _additive(vis, tdt)]
    if mask == "causal_finfo":
        return [q, k, v, _additive(_causal(t, lk, 0), tdt)]
    if mask == "neg_inf":
        return [q, k, v, _additive(_causal(t, lk, 0), tdt, float("-inf"))]
    if mask == "finfo_offset":
        return [q, k, v, _additive(_causal(t, lk, 180), tdt)]
    if mask == "per_head":  # head i: queries at positions 40 i.., so each head's tiles differ
        return [q, k, v, torch.cat([_additive(_causal(t, lk, 40 * i), tdt) for i in range(h)], dim=1)]
    vis = np.ones((t, lk), bool)  # bool_blocks: whole 64-key tiles hidden from every row, and scattered holes
    vis[:, 64:128] = False
    vis[::3, 150:160] = False
    return [q, k, v, torch.from_numpy(vis)[None, None]]


def _assert_matches_torch(program, module, args, dtype: str, name: str, backend) -> None:
    """The program's output on the GPU against the module's in PyTorch eager (CPU, same dtype)."""
    ex = backend.create_executor(program)
    feeds = {s.name: to_np(a) for s, a in zip(program.inputs, args, strict=True)}
    got = ex.run_numpy(feeds, {})[program.outputs[0].name]
    with torch.no_grad():
        ref = module(*args)
    assert_close(got.astype(np.float32), ref.float().numpy(), dtype, "accumulate", "cuda", what=name)


@pytest.mark.parametrize("name", sorted(CASES))
def test_tiled_attention_matches_torch(name, cuda_backend) -> None:
    dtype, module = CASES[name][:2]
    args = _inputs(name, torch.Generator().manual_seed(0))
    program = npu_compiler.compile(ir_dict(module, args, name), "cuda", dtype=dtype)
    attn = [k for k in program.kernels if k.kind == "attention"]
    assert len(attn) == 1 and not any(k.kind == "gemm" for k in program.kernels), [k.kind for k in program.kernels]
    sources = CudaTarget().kernel_sources(attn[0], program)
    # (an online split record under a mask: its first launch classifies the mask's tiles)
    assert ("mma.sync" not in sources[0]) == (attn[0].spec.online and attn[0].plan.splits > 0 and len(args) == 4)
    # (the tiled kernel's products: mma.sync's, or on Hopper the warpgroup MMA's; the helpers alone prove nothing)
    first = next((s for s in sources if "tc_mma(sacc" in s or "fa_qk" in s), "")
    assert first, "the tiled kernel was not chosen"
    # the online split launch computes three query heads a block where a KV head's group is a multiple of 3
    assert ("__launch_bounds__(384" in first) == ("_g3_" in name or "_g6_" in name), name
    assert (attn[0].plan.splits > 0) == name.startswith("split_"), attn[0].plan
    assert attn[0].spec.online == ("sdpa" in name), attn[0].spec  # eager graphs round the probabilities themselves
    out = attn[0].outs[0]
    assert (out.strides[1] < out.strides[2]) == ("heads_back" in name), out  # [b, t, h, d] in memory
    assert len(program.kernels) == 1 + ("heads_back" in name), [k.group for k in program.kernels]
    _assert_matches_torch(program, module, args, dtype, name, cuda_backend)


def test_fully_masked_bool_rows_give_zeros(cuda_backend) -> None:
    """A row whose keys are all hidden attends to nothing (ATen's fused attention gives zeros): every tile of that
    row is skipped, and the row must come out as zeros, not NaN."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn((1, 2, 40, 32), generator=gen).to(torch.bfloat16) for _ in range(3))
    vis = np.ones((40, 40), bool)
    vis[7] = False
    m = torch.from_numpy(vis.copy())[None, None]
    module = Sdpa(False)
    program = npu_compiler.compile(ir_dict(module, [q, k, v, m], "dead_rows"), "cuda", dtype="bfloat16")
    ex = cuda_backend.create_executor(program)
    feeds = {s.name: to_np(a) for s, a in zip(program.inputs, [q, k, v, m], strict=True)}
    got = ex.run_numpy(feeds, {})[program.outputs[0].name].astype(np.float32)
    assert np.all(got[0, :, 7] == 0)
    vis[7] = True  # the other rows as ATen computes them (its CPU kernels disagree on a row with no key)
    with torch.no_grad():
        ref = module(q, k, v, torch.from_numpy(vis)[None, None]).float().numpy()
    rows = np.arange(40) != 7
    assert_close(got[:, :, rows], ref[:, :, rows], "bfloat16", "accumulate", "cuda")


@pytest.mark.parametrize("name", sorted(DECODE_CASES))
def test_grouped_decode_attention_matches_torch(name, cuda_backend) -> None:
    from npu_compiler.targets.cuda.decode_attention import grouped_decode_applies

    dtype, module, b, h, _, _, lk = DECODE_CASES[name][:7]
    args = _inputs(name, torch.Generator().manual_seed(0))
    program = npu_compiler.compile(ir_dict(module, args, name), "cuda", dtype=dtype)
    attn = [k for k in program.kernels if k.kind == "attention"]
    assert len(attn) == 1 and attn[0].plan.splits >= 2, [k.kind for k in program.kernels]
    online = isinstance(module, Sdpa)
    assert attn[0].spec.online == online and grouped_decode_applies(attn[0], program)
    assert attn[0].plan.scratch_extra == (0 if online else b * h * lk)
    assert len(CudaTarget().kernel_sources(attn[0], program)) == (2 if online else 3)
    _assert_matches_torch(program, module, args, dtype, name, cuda_backend)


def test_online_decode_with_no_visible_key_gives_zeros(cuda_backend) -> None:
    """Online decode attention where the mask hides every key: each split's max stays -inf and the combine must give
    zeros (as ATen's attention does for a row with no visible key), not the NaN of 0/0."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn((1, 12, 1, 128), generator=gen).to(torch.bfloat16)
    k, v = (torch.randn((1, 2, 700, 128), generator=gen).to(torch.bfloat16) for _ in range(2))
    m = torch.zeros((1, 1, 1, 700), dtype=torch.bool)
    program = npu_compiler.compile(ir_dict(Sdpa(False), [q, k, v, m], "no_key"), "cuda", dtype="bfloat16")
    (attn,) = [k for k in program.kernels if k.kind == "attention"]
    assert attn.spec.online and attn.plan.splits >= 2
    ex = cuda_backend.create_executor(program)
    feeds = {s.name: to_np(a) for s, a in zip(program.inputs, [q, k, v, m], strict=True)}
    got = ex.run_numpy(feeds, {})[program.outputs[0].name].astype(np.float32)
    assert np.all(got == 0)


class _SdpaLayers(torch.nn.Module):
    """Three SDPA layers over one additive mask (a decoder's layers all read one)."""

    def forward(self, q, k, v, m):
        for _ in range(3):
            q = F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
        return q


def test_layers_over_one_mask_read_the_first_layers_tile_table(cuda_backend) -> None:
    """The second and third layers launch no classifying scan of their own: they read the tile table the first
    layer's scan left (the mask is an input no kernel writes). A causal mask over a cache longer than the rows (the
    slots past them hidden, as a prefill's are), three query heads a KV head's group: the output of the third layer
    as PyTorch computes it."""
    from npu_compiler.targets.cuda import flash_attention as FA

    gen = torch.Generator().manual_seed(3)
    t, lk, h, hk, d = 1100, 1300, 6, 2, 64
    vis = torch.arange(lk)[None, :] <= torch.arange(t)[:, None]
    mask = torch.where(vis, 0.0, torch.finfo(torch.bfloat16).min).to(torch.bfloat16)[None, None]
    args = [torch.randn((1, h, t, d), generator=gen).to(torch.bfloat16),
            torch.randn((1, hk, lk, d), generator=gen).to(torch.bfloat16),
            torch.randn((1, hk, lk, d), generator=gen).to(torch.bfloat16), mask]
    program = npu_compiler.compile(ir_dict(_SdpaLayers(), args, "sdpa_layers"), "cuda", dtype="bfloat16")
    attn = [k for k in program.kernels if k.kind == "attention"]
    dev = rendered_for(program, cuda_backend)
    assert len(attn) == 3 and [FA.table_left(k, program, dev) for k in attn] == [False, True, True]
    _assert_matches_torch(program, _SdpaLayers(), args, "bfloat16", "sdpa_layers", cuda_backend)
