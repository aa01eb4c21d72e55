"""Attention over many query rows (prefill) on tensor cores: Q K^T and P V as `mma.sync` m16n8k16 products (bf16 or
fp16 operands, fp32 accumulators), with the scores and probabilities kept in registers and never written out.

A block (4 warps) owns 64 query rows of one (batch, head); each warp 16 of them. Key tiles of 64 rows of K and V go
through shared memory (`cp.async`, zero-filled past the last key), fragments come out with `ldmatrix`. Grouped-query
heads read their KV head in place.

The graph rounds the probabilities after the row's max and sum are known (`softmax(...).to(bf16)`, then a bf16
matmul): a one-pass online softmax cannot round them there, so this is two passes over the keys, as the other
attention kernels of this target are: (1) each row's max and sum of exponentials, (2) p = round(exp(s - max) / sum)
in the operand dtype (exactly the graph's rounding when the probabilities dtype is the operands'), then P V. Scores
are rounded where the graph stores them (`scores_dtype`), as in `library.attention`.

Exponentials go through the SFU (`__expf`: a relative error of a few 1e-6 at the scores' range, far below the bf16
or fp16 rounding of the probabilities that follows); the row max ignores NaN (`fmaxf`) but a NaN score still turns
its row's sum, and so the row, into NaN, as the graph's softmax does.

Key tiles no query row of the block can see are skipped, decided at run time from the mask itself, so a causal mask
handed in as a tensor costs half the work, as `is_causal` does:
- past the causal diagonal, past the valid length, or a tile of a bool mask that is all false: such keys get exactly
  zero probability (and a row with no visible key gets zeros, as ATen's attention gives);
- a tile of an additive mask whose every value is at most DEAD (the "finfo.min" masks of HF models, or -inf): such a
  key's score is at most DEAD plus its unmasked score, and its probability underflows to exactly zero whenever the
  row's max lies above DEAD / 4 and no unmasked score reaches -DEAD / 4 in size. The block checks both after the
  first pass over the keys it computed; where either fails (a row that sees no key above the threshold, a score of
  absurd size) it runs again with no tile skipped.
The mask is read once per block before the passes (coalesced, 16 bytes a lane for 16-bit masks), which also marks
the tiles whose every mask value is 0 (or true): their scores need no mask loads.

Key splits (`tile_splits`): with a causal mask the block of the last 64 rows computes every key tile while the first
computes one, and all blocks fit in one wave, so that block's chain of tiles would be the kernel's time. Where rows
see many tiles and some may be skipped, the keys are split into runs of TILES_PER_SPLIT tiles, one block per (row
block, head, split), in three launches over the record's float32 scratch:
1. stats: the split's tiles chosen from the mask as above; each row's max and sum of exponentials over them, and one
   int per block with the live and mixed tiles and whether a score was of absurd size;
2. accumulate: every split's (max, sum) combined into the row's, then P V over this split's tiles into a float32
   partial output. The guard of the skipping is checked on the combined stats: where it fails for a row of the
   block, every split block of those rows computes the row's stats again over every tile and its P V over every
   tile of its split. A block with nothing to compute writes no partial output, and says so in a second int;
3. combine: each row's output is the sum, in split order, of the partial outputs that were written.
Measured on the H100 (bf16, 12 heads over 2 KV heads, head dim 128, 2048 rows): 0.178 -> 0.157 ms with `is_causal`,
0.246 -> 0.225 ms with an additive causal mask; runs of 4 tiles instead of 8 were slower (0.198 ms).

An online record (SDPA: the graph leaves the probabilities' rounding to the kernel) with key splits makes one pass:
1. online: a split block chooses its tiles as the stats launch does and keeps each row's running max over them,
   rescaling the row's sum and output where it grows; the probabilities against it are rounded to the operand dtype
   for P V (as ATen's fused kernels do); the record gets the split's max, sum and unnormalised output;
2. combine: the splits added at the row's max, over the row's sum. The skipping's guard needs the combined max, so
   this launch checks it: a row block with a row at or below the threshold, or a score of absurd size, is marked;
3. repair: one block a row block, stopping at once unless marked; a marked one computes its rows again with the
   exact single-block kernel above (every tile where its guard fails).
On Hopper, a split block that is the only one with live tiles for its row block (a causal mask's first rows) writes
the rows' outputs itself and the combine skips them (`_sole_split`; the same bits): the record 77.3 -> 75.6 us a
layer at Qwen2.5-1.5B's prefill shapes.
Qwen2.5-1.5B's prefill (2048 rows, HF's causal mask as a tensor): 250 -> 191 us a layer against the three exact
launches.

The online launch's blocks are shaped for grouped-query heads: where a KV head's group of query heads is a multiple
of HEADS_PER_BLOCK (3), a block computes that many heads of its row block and split (4 warps each, 12 warps, one
block an SM as three blocks of four warps were), so that each key and value tile is copied from L2 once for the
three heads. Under a mask, a launch before it classifies the mask's tiles once (`classify`: one block a row block,
CLASSIFY_TILES key tiles and head of the mask, the scan above; one byte a tile, live and mixed, in the record's tile
table), instead of every split block of every head scanning its part of the mask again; a split block ORs its heads'
bytes. Where the mask (and the positions of a valid length) are inputs no kernel writes, the scan runs before the
launch's wait and the launch starts early, beside the kernel before it (`Launch.early`); and since every record over
the same mask shares one table (`AttentionKernel.tile_table`), only the first of them classifies it (`table_left`: a
decoder's layers read one mask). Q stays in shared memory
(a k-step's fragment loaded where it is used), key and value tiles go through STAGES buffers (the next tile's copies
in flight during the whole of this one's work; no barrier at a tile's end), and a mixed tile's mask values are loaded
where they are added: each of these had kept a register array alive beside the products, and the kernel spilled in
its loop. Its runs are ONLINE_TILES_PER_SPLIT (14) tiles: fewer partial outputs to write and combine.
Measured on the H100, the kernel alone at Qwen2.5-1.5B's shapes (2048 rows over a 2560-slot cache, 12 heads over 2,
HF's mask; a one-off A/B script, the same outputs to the bit): 177.6 -> 157.5 us with three heads a block, 148.0 us
with runs of 12 tiles (168.0 at 6, 151.9 at 15), 129.1 us with the classifying launch (137.6 with 8 tiles a block);
torch's SDPA with the same mask tensor 131-138 us, its flash kernel with is_causal and no mask 46-52 us.

On Hopper (sm_90) the tiled launches multiply on the warpgroup MMA (`wgmma`; where the head dim is a multiple of 64):
a warpgroup (the four warps of one head) issues S = Q K^T for its 64 rows as m64 x BN products that read K's tile
from shared memory, laid out unpadded in the MMA's K-major layout with the 128-byte swizzle, and Q from shared memory
the same way (the online launch) or from the fragments each warp keeps in registers (the others), instead of every
warp loading K's fragments through `ldmatrix`; P V takes P from the registers the softmax packed it into (an
mma.sync A fragment is the warpgroup MMA's register operand) and V's tile in its transposed (head-dim contiguous)
form, which the same swizzled layout gives. In the online launch the P V of a tile runs on while the next tile's
copies are waited for; it is waited for before the tile's barrier, so no warpgroup copies into a buffer another still
reads. The softmax, masking, skipping, split records and the launches around them are the mma.sync path's, and so are
the results, to the bit. On the H100 (Qwen2.5-1.5B's prefill shapes, 2048 rows over a 2560-slot cache, HF's mask):
SDPA's online launches 125.1 -> 105.5 us, 103.6 us with P V left running (ncu: the one-pass launch 95.5 -> 75.6 us,
still latency-bound: one block of 12 warps an SM, 28% of its issue slots used); HF's eager attention (stats,
accumulate, combine) 241 -> 221 us, and over a 512-slot cache (one launch) 78.3 -> 68.8 us. Ampere keeps mma.sync.

The online launch on Hopper with three heads a block (three key and value buffers) then:
- issues a tile's Q K^T and, behind it, the P V of the tile before, so that those products run during this tile's
  softmax; the rows' outputs are rescaled and the probabilities packed once that P V is waited for. The same
  arithmetic in the same order: the same bits.
- ends by staging its 192 rows of partial outputs in the shared memory its tiles used and copying each row out with
  one bulk copy (`cp.async.bulk`, 512 bytes): the fragments' float2 stores wrote each row as 16 pieces of 32 bytes,
  each across two sectors, and held the SM (one block of 12 warps) until they drained, a quarter of the launch's
  stall samples. The online records of the tiled launches are laid out for it (`online_part_at`): every row's and
  split's partial output first, 16-byte aligned, then the (max, sum) pairs; the combining launch reads a row's four
  columns a lane with one 16-byte load a split and stores them as one 8-byte store where the output's rows allow.
Measured on the H100 (the record alone at Qwen2.5-1.5B's prefill shapes, HF's mask, `Executor.profile`, alternating
rounds against the launches before, the same outputs to the bit): 100.9 -> 99.3 us with the products overlapped,
88.5 us with the bulk epilogue (ncu: the online launch 87.7 -> 79.2 us, the combining one 17.3 -> 15.7 us);
the whole prefill (2048 tokens, 28 layers, one process, one export loaded with each) 13.41 -> 12.95 ms, the
same logits to the bit. Tried and left out: the scale folded into the exponent's multiply-add (one instruction a
score less; 90.1 us, a spill), exponentials without __expf's care for results below 2^-126 (three instructions a
score less; no change: the loop is bound by its latencies, not its issue slots), the row blocks that see most keys
launched first (no change), runs of 8, 10, 14 or 16 tiles a split (100.6, 88.6, 97.7, 97.6 us against 88.6 at 12,
the blocks in the grid's order; once they ran longest first, 14 won: see ONLINE_TILES_PER_SPLIT), the combining
launch's values loaded before the splits' stats (no change).
"""

from __future__ import annotations

import functools

from ...kernels import AttentionKernel, AttentionPlan, plan_of
from ...program import CompiledProgram, KernelCall, TensorRef
from ..clike import Launch, attention_geometry, grid_for, pad4
from .common import (
    CUDA,
    INPUTS_BEGIN,
    INPUTS_END,
    NEG_INF_F,
    PRELUDE,
    REDUCE_HELPERS,
    WAIT,
    literal,
    load_expr,
    mma_sync_ok,
    round_expr,
    storage,
    store_expr,
    tc_helpers,
    unpack16,
    unwritten_input,
    valid_length_prologue,
    wgmma_helpers,
)

BM = 64  # query rows per block (16 per warp)
BN = 64  # keys per tile
WARPS = 4
# three blocks an SM (12 warps): the registers are capped at 168 a thread. Measured on the H100 (bf16, 12 heads,
# 2048 rows, head dim 128): 0.28 ms for HF's eager attention against 0.33 ms at the two blocks 226 registers allow.
MIN_BLOCKS = 3
MAX_HEAD_DIM = 128  # registers: the block keeps Q's fragments and the 16 x head-dim output per warp in registers
MIN_ROWS = 16  # fewer query rows than an MMA tile has: the row kernels do less work
TILES_PER_SPLIT = 8  # key tiles per block where the keys are split across blocks
# the online launch's blocks (HEADS_PER_BLOCK heads each) make one pass: longer runs mean fewer partial outputs to
# write and combine (Qwen2.5-1.5B's prefill attention alone on the H100: 155.6 us at 8 tiles, 148.0 at 12, 168.0 at 6;
# with the blocks longest first (online_order), 14 against 12: the record 79.8 -> 77.3 us a layer in one process,
# 79.8 -> 77.6 in another; its 2560-key cache in 3 splits instead of 4)
ONLINE_TILES_PER_SPLIT = 14
# the most blocks the online launch orders by a table in its source (online_order); larger grids keep their order
MAX_ORDERED_BLOCKS = 8192
MAX_TILES_PER_SPLIT = 15  # a split's live and mixed tiles are bits of one int (bit 15: the guard's flag)
# the online split launch: query heads of one KV head in one block (4 warps each), sharing its key and value tiles,
# so that they come from L2 once for every HEADS_PER_BLOCK heads; 12 warps at 168 registers are one block an SM, as 3
# blocks of 4 warps were
HEADS_PER_BLOCK = 3
# key tiles a block of the classifying launch scans (its four warps 16 rows each); more blocks scan faster (the
# kernel alone at Qwen2.5-1.5B's shapes below: 137.6 us with 8, 129.1 with 4)
CLASSIFY_TILES = 4
# the online launch's key and value tiles: the next tile's copies run during the whole of this one's work, and with
# three buffers a tile needs no barrier at its end (the next copies land in a buffer read two tiles ago), so warps
# drift apart by up to a tile instead of running the products and the softmax in lockstep. Qwen2.5-1.5B's prefill
# attention alone on the H100: 127.4 -> 124.8 us against two buffers and a barrier a tile. Blocks of one head keep
# two (a third would leave one block an SM where the shared memory holds two)
STAGES = 3
# Hopper (a device with `warpgroup_mma`, sm_90a only): the tiled launches' products on the warpgroup MMA, a warpgroup
# (4 warps) one head's 64 rows (see the module's docstring)
_VEC = 8  # 2-byte elements per 16-byte copy
# floats after each staged output row of the online launch's bulk epilogue: its 8 rows a store instruction writes
# then start 4 banks apart, with no conflict
_PAD_F = 4
_OPERANDS = ("bfloat16", "float16")


def tiles_apply(dtypes: tuple[str, str, str], probs_dtype: str, q_len: int, head_dim: int, v_dim: int,
                refs: tuple[TensorRef, TensorRef, TensorRef], dev) -> bool:
    """Whether q, k, v (their dtypes and views) can be read as tiles: MIN_ROWS query rows or more, one 16-bit
    operand dtype, a head dim that is a multiple of 16 up to MAX_HEAD_DIM (the same for v), rows of 16-byte aligned,
    unit-stride elements, probabilities in the operand dtype or float32 (the graph's fp32 probabilities enter the
    P V product in the operand dtype, as ATen's fused attention kernels do)."""
    if not mma_sync_ok(dev) or q_len < MIN_ROWS or len(set(dtypes)) != 1 or dtypes[0] not in _OPERANDS:
        return False
    if probs_dtype not in (dtypes[0], "float32") or head_dim != v_dim or head_dim % 16 or head_dim > MAX_HEAD_DIM:
        return False
    for r in refs:
        if len(r.shape) > 4 or not r.shape:
            return False
        _, st = pad4(r, "cuda")
        if st[3] != 1 or r.offset % _VEC or any(s % _VEC for s in st[:3]):
            return False
    return True


def _split_extra(batch: int, heads: int, q_len: int, splits: int) -> int:
    """The scratch ints after the split record: the first launch's flags and the accumulating (or online) launch's,
    one per block each."""
    return 2 * batch * heads * -(-q_len // BM) * splits


def tile_table(batch: int, heads: int, q_len: int, kv_len: int) -> int:
    """Bytes of an online split record's table of its mask's key tiles (AttentionKernel.tile_table): one a (batch,
    head, row block, key tile), room for a mask of its own for every head."""
    return batch * heads * -(-q_len // BM) * -(-kv_len // BN)


def tile_splits(batch: int, heads: int, q_len: int, kv_len: int, may_skip: bool, dev,
                online: bool = False) -> tuple[int, int]:
    """Key splits of a tiled attention and the scratch ints they need beside the split record (the stats and the
    accumulate launches' flags, one per block each). Rows that see many key tiles are split when tiles may be skipped
    (a causal or masked attention): otherwise the block of the last rows computes every tile while the first
    computes one, and that block's chain of tiles is the kernel's time. Unmasked attention computes every tile in
    every block and gains only where its blocks are too few to fill the GPU."""
    n_tiles = -(-kv_len // BN)
    blocks = batch * heads * -(-q_len // BM)
    # unmasked attention with MIN_BLOCKS / 2 blocks an SM or more gains nothing from splits (measured on the H100,
    # 132 SMs: 2048 rows of 12 heads, 384 blocks, went from 0.217 to 0.244 ms split; 1024 rows, 192 blocks, from
    # 0.086 to 0.067 ms)
    full = dev.multiprocessors * MIN_BLOCKS // 2
    if n_tiles < 2 * TILES_PER_SPLIT or not blocks or (not may_skip and blocks >= full):
        return 0, 0
    splits = max(2, -(-n_tiles // ONLINE_TILES_PER_SPLIT)) if online else -(-n_tiles // TILES_PER_SPLIT)
    return splits, _split_extra(batch, heads, q_len, splits)


def tiles_fit_call(call: KernelCall, buffers, dev) -> bool:
    """Whether an attention record's q, k and v (their dtypes, views) can be read as tiles on the device `dev`."""
    p: AttentionKernel = call.spec
    q, kk, v = call.args[:3]
    dts = tuple(buffers[r.buffer].dtype for r in (q, kk, v))
    return tiles_apply(dts, p.probs_dtype, p.q_len, p.head_dim, p.v_dim, (q, kk, v), dev)  # type: ignore[arg-type]


def plan_tiled_attention(p: AttentionKernel, dev) -> AttentionPlan:
    """The plan of an attention on these tiles: its key splits where rows see many key tiles (`tile_splits`), the
    flags they keep, and for an online softmax over a mask the table of its key tiles."""
    may_skip = p.mask != "none" or p.is_causal or p.valid_len
    splits, extra = tile_splits(p.batch, p.heads, p.q_len, p.kv_len, may_skip, dev, p.online)
    table = tile_table(p.batch, p.heads, p.q_len, p.kv_len) if splits and p.online and p.mask != "none" else 0
    return AttentionPlan(splits, extra, table)


def _split_layout(p: AttentionKernel, pl: AttentionPlan, n_scratch: int) -> bool:
    """Whether a split attention's plan has the layout the tiled split launches use (else the generic split runs):
    its flags after the split record, and an online record over a mask its tile table."""
    n_tiles = -(-p.kv_len // BN)
    table = tile_table(p.batch, p.heads, p.q_len, p.kv_len) if p.online and p.mask != "none" else 0
    return (n_scratch == 1 + (table > 0) and -(-n_tiles // pl.splits) <= MAX_TILES_PER_SPLIT
            and pl.scratch_extra == _split_extra(p.batch, p.heads, p.q_len, pl.splits) and pl.tile_table == table)


def applies(k: KernelCall, program: CompiledProgram, dev) -> bool:
    p: AttentionKernel = k.spec
    pl = plan_of(k)
    if (pl.splits and not _split_layout(p, pl, len(k.scratch))) or p.batch * p.heads > 65535:  # (grid y holds b * h)
        return False
    return tiles_fit_call(k, program.buffers, dev)


def dead_threshold(mask_dtype: str) -> float:
    """An additive mask value at or below this hides its key (fp16 masks cannot hold -1e30: their finfo.min)."""
    return -65504.0 if mask_dtype == "float16" else -1e30


def heads_per_block(p: AttentionKernel, mode: str, dev) -> int:
    """Query heads a block of `mode` computes on the device `dev`: HEADS_PER_BLOCK for the online split launch where
    they divide a KV head's group and their tiles fit the shared memory a block may take, else one."""
    group = p.heads // p.kv_heads if p.kv_heads else 1
    if mode != "online" or group % HEADS_PER_BLOCK:
        return 1
    fits = _online_smem(p.head_dim, HEADS_PER_BLOCK, _wgmma(p, dev)) <= dev.shared_memory_per_block_optin
    return HEADS_PER_BLOCK if fits else 1


def _classify_early(k: KernelCall, program: CompiledProgram) -> bool:
    """Whether the classifying launch scans the mask before its wait: where the mask (and the cache positions of a
    valid length) are inputs no kernel of the program writes, so the scan overlaps the kernel before it."""
    p: AttentionKernel = k.spec
    reads = [k.args[3]] + ([k.args[-1]] if p.valid_len else [])
    return all(unwritten_input(program, r.buffer) for r in reads)


def online_order(p: AttentionKernel, pl: AttentionPlan, hb: int) -> tuple[int, ...] | None:
    """The online split launch's blocks, longest first: block i computes the (row block x, heads y, split z) packed
    as x | y << 12 | z << 24 in entry i. Its live key tiles are known at run time only (the mask), so they are
    estimated as a causal mask at cache position 0 gives them (row block x sees the key tiles up to its last row's):
    the blocks with the most tiles start first, and the short ones fill in behind them, instead of the grid's order,
    which left blocks of whole splits to the second wave. Any order gives the same results (every block writes its
    own split's record). Qwen2.5-1.5B's prefill on the H100 (8 layers, one process): the attention record 84.5 ->
    80.2 us a layer. None where the grid is too large to order by a table (the grid's order then)."""
    return _longest_first(p.q_len, p.kv_len, p.batch * p.heads // hb, pl.splits)


@functools.cache
def _longest_first(q_len: int, kv_len: int, gy: int, splits: int) -> tuple[int, ...] | None:
    """online_order of a grid (computed once for a decoder's identical layers)."""
    rbs = -(-q_len // BM)
    if not (rbs and gy and splits) or rbs * gy * splits > MAX_ORDERED_BLOCKS or max(rbs, gy) >= 1 << 12 \
            or splits >= 1 << 8:
        return None
    n_tiles = -(-kv_len // BN)
    tps = -(-n_tiles // splits)

    def est(x: int, z: int) -> int:
        seen = (min(q_len, (x + 1) * BM) - 1) // BN + 1  # the tiles a causal row block sees, from key 0
        return max(0, min(tps, seen - tps * z))

    blocks = sorted(((x, y, z) for z in range(splits) for y in range(gy) for x in range(rbs)),
                    key=lambda c: (-est(c[0], c[2]), c[2], -c[0], c[1]))
    return tuple(x | y << 12 | z << 24 for x, y, z in blocks)


def table_left(k: KernelCall, program: CompiledProgram, dev) -> bool:
    """Whether an earlier record of the program left this one's tile table as its own classifying launch would write
    it, so that it launches none: the nearest earlier kernel touching the table's buffer is an attention record with
    the same spec, mask (and cache positions) and table, rendered with these launches, and the mask (and positions)
    are inputs no kernel writes. A decoder's layers then classify their shared mask once, in the first layer (the
    launch took 8 us a layer in Qwen2.5-1.5B's prefill graph)."""
    p: AttentionKernel = k.spec
    pl = plan_of(k)
    if not pl.tile_table or not _classify_early(k, program):
        return False
    table = k.writes[-1]
    at = next((i for i, kk in enumerate(program.kernels) if kk is k), 0)
    for kj in reversed(program.kernels[:at]):
        if all(r.buffer != table.buffer for r in (*kj.writes, *kj.args)):
            continue
        return (kj.spec == p and kj.plan == pl and kj.writes[-1] == table and kj.args[3:] == k.args[3:]
                and applies(kj, program, dev))
    return False


def _mask_batches_heads(g) -> tuple[int, int]:
    """How many batches and heads the mask has its own values for (a stride of 0: one for all)."""
    _, ms = pad4(g.mask, "cuda")
    return (g.b if ms[0] else 1), (g.h if ms[1] else 1)


def online_stages(hb: int) -> int:
    """Key and value buffers of the online launch with `hb` heads a block (see STAGES)."""
    return STAGES if hb > 1 else 2


def _online_smem(d: int, hb: int, wg: bool = False) -> int:
    """The online launch's dynamic shared memory: Q's rows of every head of the block, its key and value buffers
    (for the warpgroup MMA unpadded, swizzled, and 1,024 bytes more to align them)."""
    if wg:
        tiles = (BM * hb + 2 * online_stages(hb) * BN) * d * 2
        staged = BM * hb * (d + _PAD_F) * 4 if _overlapped(hb) else 0  # (the bulk epilogue's rows)
        return max(tiles, staged) + 1024
    return (BM * hb + 2 * online_stages(hb) * BN) * (d + _VEC) * 2


def _overlapped(hb: int) -> bool:
    """Whether the online launch on the warpgroup MMA with `hb` heads a block runs the overlapped loop and the bulk
    epilogue: three buffers or more, so that a tile's copies never land in one a P V still reads."""
    return online_stages(hb) >= 3


def sole_split_applies(k: KernelCall, program: CompiledProgram, dev) -> bool:
    """Whether the online split launch writes a row block's outputs itself where its block's split is the only one
    with live key tiles for it (_sole_split): Hopper's overlapped launch (its partial outputs staged in shared
    memory), an output in the operand dtype whose rows are whole 16-byte chunks."""
    p: AttentionKernel = k.spec
    pl = plan_of(k)
    if not (p.online and pl.splits and _wgmma(p, dev) and _overlapped(heads_per_block(p, "online", dev))
            and k.writes[1].offset % 4 == 0):
        return False
    g = attention_geometry(k, "cuda")
    _, os_ = pad4(g.out, "cuda")
    return (program.dtype_of(g.out) in _OPERANDS and os_[3] == 1 and g.out.offset % _VEC == 0
            and all(st % _VEC == 0 for st in os_[:3]))


def _table_byte(g, hb: int, rbs: int, n_tiles: int) -> str:
    """Code that ORs into `v` the tile table's bytes of key tile i for the block's heads (the mask's own where it
    has one a head) in row block bx (see the classifying launch)."""
    bm, hm = _mask_batches_heads(g)
    head = f"hg * {hb} + e" if hm > 1 else "0"
    return f"""unsigned v = 0;
    #pragma unroll
    for (int e = 0; e < {hb if hm > 1 else 1}; ++e)
      v |= out2[((long long)({"bi" if bm > 1 else "0"} * {hm} + {head}) * {rbs} + bx) * {n_tiles} + i];"""


def _sole_split(k: KernelCall, program: CompiledProgram, ityp: str, threads: int, hb: int, n_tiles: int, rbs: int,
                additive: bool, dead: str) -> str:
    """The online launch's end where its block's split is the only one with live key tiles for the row block (a
    causal mask's first rows: a third of Qwen2.5-1.5B's prefill row blocks): the rows' outputs normalised and
    written here, from the staged rows, 16 bytes a store, instead of a float32 partial output for the combining
    launch to read back (which skips the row block: its split's `used` flag is 2). The same arithmetic as the
    combine of one split (its weight exp(0) = 1, its sum the row's): the same bits. The skipping's guard is checked
    here on the rows' max, the row block marked in this split's flags (bit 31: the repair launch reads every
    split's)."""
    p: AttentionKernel = k.spec
    g = attention_geometry(k, "cuda")
    t, d = g.t, p.head_dim
    od = program.dtype_of(g.out)
    pitch = d + _PAD_F
    if g.mask is not None:
        other = f"""{_table_byte(g, hb, rbs, n_tiles)}
        other |= v & 1;"""
    else:
        other = "other = 1;"
    packed = ", ".join(store_expr(od, f"x[{e}] * iv", "float32") for e in range(_VEC))
    return f"""
  {{  // the only split with keys for these rows?
    int other = 0;
    for (int i = tid; i < ntiles; i += {threads})
      if (i < tile_lo || i >= tile_hi) {{
        {other}
      }}
    if (__syncthreads_or(other) == 0) {{
      __shared__ float fa_inv[{BM * hb}];
      float* const stage = reinterpret_cast<float*>(Qs) + warp * {16 * pitch};
      bool fail = {str(additive).lower()} && ((bits >> 15) & 1);
      #pragma unroll
      for (int r = 0; r < 2; ++r) {{
        const {ityp} row = r ? row1 : row0;
        if (t4 == 0) fa_inv[warp * 16 + g8 + 8 * r] = (mx[r] == {NEG_INF_F}) ? 0.0f : 1.0f / sum[r];
        fail |= {str(additive).lower()} && row < {t} && !(mx[r] > {dead} / 4.0f);
      }}
      #pragma unroll
      for (int nb = 0; nb < {d // 8}; ++nb)
        #pragma unroll
        for (int r = 0; r < 2; ++r)
          *reinterpret_cast<float2*>(stage + (g8 + 8 * r) * {pitch} + nb * 8 + 2 * t4) =
              make_float2(oacc[nb][2 * r], oacc[nb][2 * r + 1]);
      __syncwarp();
      for (int c = lane; c < {16 * (d // _VEC)}; c += 32) {{
        const int rr = c / {d // _VEC};
        const {ityp} ti = m0 + rw * 16 + rr, dd = (c % {d // _VEC}) * {_VEC};
        if (ti < {t}) {{
          const float iv = fa_inv[warp * 16 + rr];
          float x[{_VEC}];
          *reinterpret_cast<float4*>(x) = *reinterpret_cast<const float4*>(stage + rr * {pitch} + dd);
          *reinterpret_cast<float4*>(x + 4) = *reinterpret_cast<const float4*>(stage + rr * {pitch} + dd + 4);
          __align__(16) {storage(od)} o8[{_VEC}] = {{{packed}}};
          *reinterpret_cast<uint4*>(&out0[{g.o_at}]) = *reinterpret_cast<const uint4*>(o8);
        }}
      }}
      if (rw == 0 && lane == 0) {{
        flags[z] = bits;
        used[z] = 2;
      }}
      __syncthreads();  // (the flags written before a mark)
      if (fail) atomicOr(&flags[z], 1 << 31);
      return;
    }}
  }}"""


def online_part_at(splits: int, dv: int, row: str, z: str) -> str:
    """Where split z's partial output of `row` starts in an online split record (the tiled launches' layout: every
    row's and split's dv floats first, 16-byte aligned for the online launch's bulk copies, then the (max, sum) pairs;
    the record's size is the generic layout's, rows * splits * (2 + dv))."""
    return f"(({row}) * {splits} + {z}) * {dv}"


def online_stat_at(rows: int, splits: int, dv: int, row: str, z: str) -> str:
    """Where split z's (max, sum) of `row` is in an online split record (see online_part_at)."""
    return f"{rows * splits * dv}LL + (({row}) * {splits} + {z}) * 2"


def _wgmma(p: AttentionKernel, dev) -> bool:
    """Whether the tiled launches multiply on the warpgroup MMA: Hopper, a head dim of whole 128-byte rows."""
    return dev is not None and dev.warpgroup_mma and p.head_dim % 64 == 0


def flash_attention(k: KernelCall, program: CompiledProgram, signature, ptrs, ityp: str,
                    dev) -> list[tuple[str, Launch]]:
    """The kernel's launches: one, or with key splits three (stats, accumulate, combine); `signature(block,
    min_blocks)` is the kernel's parameter list."""
    p: AttentionKernel = k.spec
    pl = plan_of(k)
    t, bh = p.q_len, p.batch * p.heads
    if not pl.splits:
        grid = (-(-t // BM), bh, 1) if t and bh else (0, 1, 1)
        return [(_source(k, program, signature, ityp, "single", dev), Launch(grid, 32 * WARPS, ptrs))]
    grid = (-(-t // BM), bh, pl.splits) if t and bh else (0, 1, 1)
    if p.online:
        rows_grid = (-(-t // BM), bh, 1) if t and bh else (0, 1, 1)
        hb = heads_per_block(p, "online", dev)
        online_grid = (grid[0], grid[1] // hb, grid[2]) if t and bh else grid
        classify = []
        if p.mask != "none" and not table_left(k, program, dev):  # classified once, for every split block to read
            g = attention_geometry(k, "cuda")
            bm, hm = _mask_batches_heads(g)
            n_tiles = -(-p.kv_len // BN)
            classify = [(_source(k, program, signature, ityp, "classify", dev),
                         Launch((-(-t // BM), -(-n_tiles // CLASSIFY_TILES), bm * hm) if t and bh else (0, 1, 1),
                                32 * WARPS, ptrs, early=_classify_early(k, program)))]
        wg = _wgmma(p, dev)
        return classify + [(_source(k, program, signature, ityp, "online", dev),
                 Launch(online_grid, 32 * WARPS * hb, ptrs, smem=_online_smem(p.head_dim, hb, wg))),
                _combine(k, program, signature, ptrs, ityp),
                (_source(k, program, signature, ityp, "repair", dev), Launch(rows_grid, 32 * WARPS, ptrs))]
    return [(_source(k, program, signature, ityp, "stats", dev), Launch(grid, 32 * WARPS, ptrs)),
            (_source(k, program, signature, ityp, "accumulate", dev), Launch(grid, 32 * WARPS, ptrs)),
            _combine(k, program, signature, ptrs, ityp)]


def _source(k: KernelCall, program: CompiledProgram, signature, ityp: str, mode: str, dev=None) -> str:
    p: AttentionKernel = k.spec
    pl = plan_of(k)
    g = attention_geometry(k, "cuda")
    q, mask, pos = g.q, g.mask, g.pos
    b, h, t, d, lk, group = g.b, g.h, g.t, g.d, g.kv_len, g.group
    dt = program.dtype_of(q)
    od = program.dtype_of(g.out)
    sd = p.scores_dtype  # (the probabilities: the operand dtype or float32, see the P V packing below)
    ks = d // 16  # k-steps of Q K^T
    dp_ = d // 16  # pairs of 8-wide output column blocks
    cpr = d // _VEC  # 16-byte chunks per row
    dpad = d + _VEC  # shared-memory row (padded: ldmatrix's eight rows fall in different banks)
    mma_t = "bf16" if dt == "bfloat16" else "f16"
    pack = "__floats2bfloat162_rn" if dt == "bfloat16" else "__floats2half2_rn"
    pack_t = "__nv_bfloat162" if dt == "bfloat16" else "__half2"
    scale = literal(float(p.scale), "float32")
    additive = mask is not None and p.mask == "additive"
    dead = literal(dead_threshold(program.dtype_of(mask)) if additive else -1e30, "float32")
    guard = literal(-dead_threshold(program.dtype_of(mask)) / 4 if additive else 1e29, "float32")
    hb = heads_per_block(p, mode, dev)
    wg = mode != "classify" and _wgmma(p, dev)
    # the online launch on the warpgroup MMA with three buffers or more: a tile's Q K^T issued ahead of the P V of the
    # tile before, whose products then run during this tile's softmax (overlap_loop below)
    overlap = wg and mode == "online" and _overlapped(hb)

    def swz(r: str, dd: str, rows: int) -> str:
        """The element (row r, column dd, a multiple of 8) of a tile of `rows` rows in the warpgroup MMA's layout:
        each 64 columns a region of 128-byte rows, the 16-byte chunk c of row r at c ^ (r % 8) in its row."""
        return f"(({dd}) / 64) * {rows * 64} + ({r}) * 64 + (((({dd}) % 64) / 8) ^ (({r}) & 7)) * 8"
    # the online launch loads a mixed tile's mask after its products: before them, its 32 values a thread live
    # beside the products' and the next tile's registers, and the kernel spills
    late_mask = mode == "online"
    threads = 32 * WARPS * hb

    # the valid length (decode-style cache positions) bounds the keys read, as in library.attention
    valid = ""
    if pos is not None:
        valid = valid_length_prologue(pos, len(k.args) - 1, lk, ityp) + "\n  jend = min(jend, nvalid);"
    causal_end = (f"\n  jend = min(jend, m0 + {BM});  // no row of the block sees a key past its last row"
                  if p.is_causal else "")

    live_scan, mask_pre, mask_use = _mask_scan_parts(dead=dead, g=g, ityp=ityp, lk=lk, mask=mask, p=p, program=program,
        sd=sd, t=t)
    n_tiles = max(1, -(-lk // BN))
    rbs = -(-t // BM)  # row blocks per (batch, head)
    if mode == "classify":
        # one block a (row block, run of CLASSIFY_TILES key tiles, mask batch and head): which tiles some row sees
        # (bit 0) and which hold a mask value other than 0 (or false: bit 1), one byte each in the table
        bm, hm = _mask_batches_heads(g)
        # where the mask and the positions are inputs no kernel writes, the scan runs before the wait (overlapping
        # the kernel before); only the table's bytes wait
        early = _classify_early(k, program)
        return f"""{PRELUDE}{REDUCE_HELPERS if valid else ''}
{signature(32 * WARPS, 0)} {{
{INPUTS_BEGIN if early else WAIT}
  const int tid = threadIdx.x, lane = tid & 31, rw = tid >> 5;
  const {ityp} m0 = ({ityp})blockIdx.x * {BM};
  const {ityp} bi = blockIdx.z / {hm}, hi = blockIdx.z % {hm};
  {ityp} jend = ({ityp}){lk};{valid}{causal_end}
  const int ntiles = (int)((jend + {BN - 1}) / {BN});
  const int tile_lo = min(ntiles, (int)blockIdx.y * {CLASSIFY_TILES});
  const int tile_hi = min(ntiles, tile_lo + {CLASSIFY_TILES});
  __shared__ unsigned char tlive[{n_tiles}], tmixed[{n_tiles}];
  for (int i = tile_lo + tid; i < tile_hi; i += {32 * WARPS}) tlive[i] = tmixed[i] = 0;
  __syncthreads();{live_scan}
{INPUTS_END + chr(10) + WAIT if early else ""}
  unsigned char* const tab = out2 + ((long long)blockIdx.z * {rbs} + blockIdx.x) * {n_tiles};
  for (int i = tile_lo + tid; i < tile_hi; i += {32 * WARPS}) tab[i] = tlive[i] | (tmixed[i] << 1);
}}
"""
    late_mask_apply, mask_apply, mask_load = _mask_apply_parts(ityp=ityp, mask=mask, mask_pre=mask_pre,
        mask_use=mask_use, t=t)
    (acc_init, block_flags, causal_test, edge_causal, live_default, loop_start, split, split_head, stride,
     tps) = _split_setup(b=b, d=d, h=h, ityp=ityp, mask=mask, mode=mode, n_tiles=n_tiles, p=p, pl=pl, rbs=rbs, t=t)
    kv_at, pass2_loop, pv_product, pv_wgmma = _pass2_parts(acc_init=acc_init, d=d, dp_=dp_, dpad=dpad, ityp=ityp,
        loop_start=loop_start, swz=swz, wg=wg)
    plain_loop, stages, tile_h, tile_max = _plain_loop(d=d, dpad=dpad, hb=hb, ityp=ityp, pv_product=pv_product,
        pv_wgmma=pv_wgmma, wg=wg)
    online_loop = _online_loops(acc_init=acc_init, cpr=cpr, d=d, g=g, ityp=ityp, kv_at=kv_at, overlap=overlap,
        plain_loop=plain_loop, pv_wgmma=pv_wgmma, stages=stages, threads=threads, tile_h=tile_h, tile_max=tile_max)
    guard_rows, partial_out, sole_ok, stat_at, store = _store_parts(b=b, d=d, dead=dead, dev=dev, g=g, h=h, ityp=ityp,
        k=k, mode=mode, od=od, overlap=overlap, p=p, pl=pl, program=program, stride=stride, t=t)
    middle, tail, tile_choice = _mode_parts(additive=additive, dead=dead, g=g, guard=guard, guard_rows=guard_rows,
        hb=hb, ityp=ityp, k=k, live_scan=live_scan, mask=mask, mode=mode, n_tiles=n_tiles, online_loop=online_loop,
        partial_out=partial_out, pass2_loop=pass2_loop, pl=pl, program=program, rbs=rbs, sole_ok=sole_ok, split=split,
        stat_at=stat_at, store=store, stride=stride, t=t, threads=threads, tps=tps)
    q_frags, q_regs, q_stage, qk_products, repair_exit, shared = _q_parts(block_flags=block_flags, d=d, dpad=dpad,
        hb=hb, ks=ks, mode=mode, overlap=overlap, pl=pl, swz=swz, wg=wg)
    coords, load_tile_src, order_table, pass1_src, scores_head, wg_helpers = _pass1_parts(b=b, cpr=cpr, d=d,
        edge_causal=edge_causal, g=g, h=h, hb=hb, ityp=ityp, kv_at=kv_at, late_mask=late_mask, mask_load=mask_load,
        mma_t=mma_t, mode=mode, overlap=overlap, p=p, pl=pl, qk_products=qk_products, t=t, wg=wg)
    src = _kernel_text(additive=additive, causal_end=causal_end, causal_test=causal_test, coords=coords, cpr=cpr,
        dpad=dpad, g=g, group=group, h=h, hb=hb, ityp=ityp, late_mask=late_mask, late_mask_apply=late_mask_apply,
        live_default=live_default, lk=lk, load_tile_src=load_tile_src, mask_apply=mask_apply, middle=middle,
        mma_t=mma_t, n_tiles=n_tiles, order_table=order_table, pack=pack, pack_t=pack_t, pass1_src=pass1_src,
        q_frags=q_frags, q_regs=q_regs, q_stage=q_stage, repair_exit=repair_exit, scale=scale, scores_head=scores_head,
        sd=sd, shared=shared, signature=signature, split=split, split_head=split_head, swz=swz, t=t, tail=tail,
        threads=threads, tile_choice=tile_choice, valid=valid, wg=wg, wg_helpers=wg_helpers)
    return src


def _mask_scan_parts(*, dead, g, ityp, lk, mask, p, program, sd, t):
    """The scan of the mask over tiles: which key tiles some row sees and which hold mask values."""
    # the mask of one score (variables ti, j): loaded (mask_pre), folded into s (mask_use); whether a key is visible
    # at all (live_test, for the choice of tiles)
    mask_pre, mask_use, live_scan = "0.0f", "", ""
    if mask is not None:
        if p.mask == "bool":
            mask_pre, mask_use = f"(a3[{g.m_at}] ? 0.0f : 1.0f)", f"if (mk[nb][e] != 0.0f) s = {NEG_INF_F};"
            mval, live_test, plain_test = f"const bool mval = a3[{g.m_at}];", "mval", "mval"
        else:
            mv = load_expr(program.dtype_of(mask), f"a3[{g.m_at}]")
            mask_pre, mask_use = mv, f"s = {round_expr('s + mk[nb][e]', sd)};"
            mval, live_test, plain_test = f"const float mval = {mv};", f"mval > {dead}", "mval == 0.0f"
        row_end = "min(jend, ti + 1)" if p.is_causal else "jend"
        # a warp reads 16 rows of a tile, a row of 64 keys at a time (coalesced); a tile is live if some row sees
        # some key of it, plain if every mask value in reach is 0 (true): its scores need no mask loads
        md = program.dtype_of(mask)
        _, mst = pad4(mask, "cuda")
        if md in ("bfloat16", "float16") and lk % _VEC == 0 and mst[3] == 1 and mask.offset % _VEC == 0 and all(
                x % _VEC == 0 for x in mst[:3]):
            # 16-bit masks with rows of 16-byte chunks: a lane reads 8 keys at once, a warp 256 keys of one row
            # (four tiles, eight lanes each), the 16 rows of the warp in flight together; ballots gather the tiles
            live_scan = f"""
  for (int i0 = tile_lo; i0 < tile_hi; i0 += 4) {{
    const {ityp} jc = ({ityp})i0 * {BN} + lane * {_VEC};
    bool any = false, plain = true;
    #pragma unroll
    for (int rr = 0; rr < 16; ++rr) {{
      const {ityp} ti = m0 + rw * 16 + rr;
      const {ityp} jl = {row_end};
      if (ti < {t} && jc < jl) {{
        const {ityp} j = jc;
        const uint4 w = __ldg(reinterpret_cast<const uint4*>(&a3[{g.m_at}]));
        float mvs[{_VEC}];
        {" ".join(unpack16(md, "w", "mvs"))}
        #pragma unroll
        for (int e = 0; e < {_VEC}; ++e) {{
          if (jc + e < jl) {{
            const float mval = mvs[e];
            any |= {live_test};
            plain &= {plain_test};
          }}
        }}
      }}
    }}
    const unsigned ba = __ballot_sync(0xffffffffu, any), bp = __ballot_sync(0xffffffffu, !plain);
    if (lane < 4 && i0 + lane < tile_hi) {{
      if ((ba >> (lane * 8)) & 0xffu) tlive[i0 + lane] = 1;
      if ((bp >> (lane * 8)) & 0xffu) tmixed[i0 + lane] = 1;
    }}
  }}
  __syncthreads();"""
        else:
            live_scan = f"""
      for (int i = tile_lo; i < tile_hi; ++i) {{
        const {ityp} jb = ({ityp})i * {BN} + lane * 2;
        bool any = false, plain = true;
        #pragma unroll
        for (int rr = 0; rr < 16; ++rr) {{
          const {ityp} ti = m0 + rw * 16 + rr;
          const {ityp} jl = {row_end};
          #pragma unroll
          for (int e = 0; e < 2; ++e) {{
            const {ityp} j = jb + e;
            if (ti < {t} && j < jl) {{
              {mval}
              any |= {live_test};
              plain &= {plain_test};
            }}
          }}
        }}
        any = __any_sync(0xffffffffu, any);
        plain = __all_sync(0xffffffffu, plain);
        if (lane == 0) {{
          if (any) tlive[i] = 1;
          if (!plain) tmixed[i] = 1;
        }}
      }}
      __syncthreads();"""
    return live_scan, mask_pre, mask_use


def _mask_apply_parts(*, ityp, mask, mask_pre, mask_use, t):
    """The mask tiles' loads and their application to the scores (early or late)."""
    mask_load = mask_apply = late_mask_apply = ""
    if mask is not None:
        # the mask of a mixed tile, loaded before the products so that its latency hides behind them; every other
        # tile's mask values are all 0 (or all true): it loads none, and its scores skip the mask's add and rounding
        mask_load = f"""    // the mask of a mixed tile (others: all 0 or all true, so not loaded, nor added)
    float mk[{BN // 8}][4];
    if (mixed) {{
      #pragma unroll
      for (int nb = 0; nb < {BN // 8}; ++nb)
        #pragma unroll
        for (int e = 0; e < 4; ++e) {{
          const {ityp} ti = (e < 2) ? row0 : row1;
          const {ityp} j = j0 + nb * 8 + 2 * t4 + (e & 1);
          mk[nb][e] = (!edge || (ti < {t} && j < jend)) ? {mask_pre} : 0.0f;
        }}
    }}"""
        mask_apply = f"""
    if (mixed) {{
      #pragma unroll
      for (int nb = 0; nb < {BN // 8}; ++nb)
        #pragma unroll
        for (int e = 0; e < 4; ++e) {{
          float s = sacc[nb][e];
          {mask_use}
          sacc[nb][e] = s;
        }}
    }}"""
        # the online launch: each mask value loaded and folded in where it is used (no array of them beside the
        # products: with one the kernel spilled in its loop)
        late_mask_apply = f"""
    if (mixed) {{
      #pragma unroll
      for (int nb = 0; nb < {BN // 8}; ++nb)
        #pragma unroll
        for (int e = 0; e < 4; ++e) {{
          const {ityp} ti = (e < 2) ? row0 : row1;
          const {ityp} j = j0 + nb * 8 + 2 * t4 + (e & 1);
          if (!edge || (ti < {t} && j < jend)) {{
            const float mkv = {mask_pre};
            float s = sacc[nb][e];
            {mask_use.replace("mk[nb][e]", "mkv")}
            sacc[nb][e] = s;
          }}
        }}
    }}"""
    return late_mask_apply, mask_apply, mask_load


def _split_setup(*, b, d, h, ityp, mask, mode, n_tiles, p, pl, rbs, t):
    """The split launches' bookkeeping (flags after the split record) and the loop's head."""
    live_default = 0 if mask is not None else 1
    edge_causal = f" || j0 + {BN - 1} > m0" if p.is_causal else ""
    causal_test = " && j <= ti" if p.is_causal else ""

    split = pl.splits > 0 and mode != "repair"
    tps = -(-n_tiles // pl.splits) if split else n_tiles  # key tiles per split
    stride = 2 + d
    flag_count = b * h * rbs * pl.splits  # ints after the split record: the stats launch's, then the accumulate's
    flag_base = b * h * t * pl.splits * stride
    # this row block's flags, one int a split, after the split record
    block_flags = (f"reinterpret_cast<int*>(out1 + {flag_base}LL) + ((long long)(bi * {h} + hi) * {rbs} + "
                   f"bx) * {pl.splits}")
    split_head = ""
    if split:
        split_head = f"""
  tile_lo = min(ntiles, bz * {tps});
  tile_hi = min(ntiles, tile_lo + {tps});
  const int z = bz;
  const long long rowbase = (long long)(bi * {h} + hi) * {t};  // this (batch, head)'s first row in the record
  int* const flags = {block_flags};"""
        if mode in ("accumulate", "online"):
            split_head += f"\n  int* const used = flags + {flag_count}LL;"
    # the P V loop's pieces, shared by pass 2 and the online pass: the accumulators; the first tiles' copies and the
    # loop's head up to the tile's scores; after the probabilities (pf), their product with V and the next copies
    acc_init = f"""  float oacc[{d // 8}][4];
  #pragma unroll
  for (int nb = 0; nb < {d // 8}; ++nb) oacc[nb][0] = oacc[nb][1] = oacc[nb][2] = oacc[nb][3] = 0.0f;
"""
    loop_start = f"""  int cur = next_tile(tile_lo - 1);
  if (cur < tile_hi) {{
    load_tile(Ks, a1, ({ityp})cur * {BN}, false);
    load_tile(Vs, a2, ({ityp})cur * {BN}, true);
  }} else {{
    tc_commit();
    tc_commit();
  }}
  while (cur < tile_hi) {{
    const int nx = next_tile(cur);
    tc_wait<1>();
    __syncthreads();
    scores(({ityp})cur * {BN}, Ks);"""
    return acc_init, block_flags, causal_test, edge_causal, live_default, loop_start, split, split_head, stride, tps


def _pass2_parts(*, acc_init, d, dp_, dpad, ityp, loop_start, swz, wg):
    """The P V products (mma.sync or the warpgroup MMA) and the second pass over the key tiles."""
    def pv_product(vb: str) -> str:
        """P V of a tile into oacc, the probabilities' fragments in pf, V's tile at `vb` in shared memory."""
        return f"""    #pragma unroll
    for (int s = 0; s < {BN // 16}; ++s) {{
      #pragma unroll
      for (int dp = 0; dp < {dp_}; ++dp) {{
        unsigned r[4];
        tc_ldsm_t(r, &{vb}[(s * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * {dpad} + dp * 16 + (lane >> 4) * 8]);
        tc_mma(oacc[2 * dp], pf[s], r[0], r[1]);
        tc_mma(oacc[2 * dp + 1], pf[s], r[2], r[3]);
      }}
    }}"""

    def pv_wgmma(vb: str, wait: bool = False) -> str:
        """P V of a tile on the warpgroup MMA: P from the registers (pf), V's tile at `vb` the B operand in its
        transposed (d-contiguous) form, whose 64-column regions are `lead` bytes apart and 8-key groups 1,024; with
        `wait`, waited for here."""
        done = f"\n      wg_wait<{d // 2}>(&oacc[0][0]);" if wait else ""
        return f"""    {{
      const unsigned vb_s = (unsigned)__cvta_generic_to_shared({vb});
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
      #pragma unroll
      for (int s = 0; s < {BN // 16}; ++s) fa_pv(&oacc[0][0], pf[s], wg_desc(vb_s + s * 2048, {BN * 128}, 1024));
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");{done}
    }}"""

    # a key or value tile's element (r, dd) in shared memory: the warpgroup MMA's swizzled layout, or padded rows
    kv_at = swz("r", "dd", BN) if wg else f"r * {dpad} + dd"
    loop_end = f"""    __syncthreads();
    if (nx < tile_hi) load_tile(Ks, a1, ({ityp})nx * {BN}, false); else tc_commit();
    tc_wait<1>();  // V of this tile (K of the next may still be in flight)
    __syncthreads();
{pv_wgmma("Vs", wait=True) if wg else pv_product("Vs")}
    __syncthreads();
    if (nx < tile_hi) load_tile(Vs, a2, ({ityp})nx * {BN}, true); else tc_commit();
    cur = nx;
  }}"""
    pass2_loop = f"""
  // pass 2: probabilities rounded as the graph rounds them, in the operand dtype, times V. K of the next tile is
  // copied during this tile's P V, V of the next tile during the next tile's Q K^T.
{acc_init}  // a row with every key hidden attends to nothing: exp(-inf - 0) * 0 gives its zeros with no test per score
  const float inv0 = (mx[0] == {NEG_INF_F}) ? 0.0f : 1.0f / sum[0];
  const float inv1 = (mx[1] == {NEG_INF_F}) ? 0.0f : 1.0f / sum[1];
  const float mu0 = (mx[0] == {NEG_INF_F}) ? 0.0f : mx[0], mu1 = (mx[1] == {NEG_INF_F}) ? 0.0f : mx[1];
{loop_start}
    // the probabilities packed in the operand dtype for P V: the packing rounds them to nearest even, which is the
    // graph's rounding when they are stored in that dtype (tiles_apply: the operand dtype or float32), so no
    // rounding of their own comes before it
    unsigned pf[{BN // 16}][4];
    #pragma unroll
    for (int nb = 0; nb < {BN // 8}; ++nb) {{
      float pr[4];
      #pragma unroll
      for (int e = 0; e < 4; ++e)
        pr[e] = __expf(sacc[nb][e] - ((e >> 1) ? mu1 : mu0)) * ((e >> 1) ? inv1 : inv0);
      pf[nb >> 1][(nb & 1) * 2] = fa_pack(pr[0], pr[1]);
      pf[nb >> 1][(nb & 1) * 2 + 1] = fa_pack(pr[2], pr[3]);
    }}
{loop_end}"""
    return kv_at, pass2_loop, pv_product, pv_wgmma


def _plain_loop(*, d, dpad, hb, ityp, pv_product, pv_wgmma, wg):
    """The loop over key tiles with two or three buffers (the online launch without overlap)."""
    tile_h = BN * (d if wg else dpad)  # one tile's shorts in shared memory
    stages = online_stages(hb)
    # with three buffers or more the next tile's copies land in one no warp can still be reading: no barrier
    end_barrier = ("\n    __syncthreads();  // every warp is done with these buffers before the next copies land"
                   if stages < 3 else "")
    # the last tile's P V runs on during the next tile's copies and their wait: it is waited for before the barrier
    # (no warpgroup copies into a buffer before every warpgroup's products from it are done)
    pv_done = f"\n  wg_wait<{d // 2}>(&oacc[0][0]);" if wg else ""
    pv_wait = f"\n    wg_wait<{d // 2}>(&oacc[0][0]);" if wg else ""
    # row r's max over the tile (over its four threads) and with the running one, in both online loops
    tile_max = f"""      float tm = {NEG_INF_F};
      #pragma unroll
      for (int nb = 0; nb < {BN // 8}; ++nb) tm = fmaxf(tm, fmaxf(sacc[nb][2 * r], sacc[nb][2 * r + 1]));
      tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 1));
      tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 2));
      const float mn = fmaxf(mx[r], tm);"""
    plain_loop = f"""  int cur = next_tile(tile_lo - 1), bf = 0;
  if (cur < tile_hi) load_kv(0, ({ityp})cur * {BN}); else tc_commit();
  while (cur < tile_hi) {{
    const int nx = next_tile(cur);
    // (the buffers written here were last read {stages - 1} tile(s) ago: every warp has passed a barrier since)
    if (nx < tile_hi) load_kv((bf + 1) % {stages}, ({ityp})nx * {BN}); else tc_commit();
    tc_wait<1>();  // this tile's K and V{pv_wait}
    __syncthreads();
    scores(({ityp})cur * {BN}, Ks + bf * {tile_h});
    float mu[2];
    #pragma unroll
    for (int r = 0; r < 2; ++r) {{
{tile_max}
      if (mn != mx[r]) {{  // (exp(-inf) is 0: nothing summed yet)
        const float f = __expf(mx[r] - mn);
        sum[r] *= f;
        #pragma unroll
        for (int nb = 0; nb < {d // 8}; ++nb) {{
          oacc[nb][2 * r] *= f;
          oacc[nb][2 * r + 1] *= f;
        }}
        mx[r] = mn;
      }}
      mu[r] = (mx[r] == {NEG_INF_F}) ? 0.0f : mx[r];  // a row with every key so far hidden: exp(-inf - 0) = 0
    }}
    unsigned pf[{BN // 16}][4];
    #pragma unroll
    for (int nb = 0; nb < {BN // 8}; ++nb) {{
      float pr[4];
      #pragma unroll
      for (int e = 0; e < 4; ++e) {{
        pr[e] = __expf(sacc[nb][e] - mu[e >> 1]);
        sum[e >> 1] += pr[e];
      }}
      pf[nb >> 1][(nb & 1) * 2] = fa_pack(pr[0], pr[1]);
      pf[nb >> 1][(nb & 1) * 2 + 1] = fa_pack(pr[2], pr[3]);
    }}
    const unsigned short* const vb = Vs + bf * {tile_h};
{pv_wgmma("vb") if wg else pv_product("vb")}{end_barrier}
    cur = nx;
    bf = (bf + 1) % {stages};
  }}{pv_done}
"""
    return plain_loop, stages, tile_h, tile_max


def _online_loops(*, acc_init, cpr, d, g, ityp, kv_at, overlap, plain_loop, pv_wgmma, stages, threads, tile_h,
    tile_max):
    """The online launch's main loops: overlapped on the warpgroup MMA, or plain."""
    # the overlapped loop: after a tile's barrier the next tile's copies, this tile's Q K^T, then the P V of the tile
    # before (its probabilities kept in pf); the softmax of this tile runs while that P V does, which is waited for
    # only where the rows' outputs are rescaled and pf is packed again. A buffer's copies come after the barrier that
    # follows its last P V (three buffers: the one of the tile before last)
    overlap_loop = f"""  // pv: the buffer of the P V still to issue (-1: none)
  int cur = next_tile(tile_lo - 1), bf = 0, pv = -1;
  if (cur < tile_hi) load_kv(0, ({ityp})cur * {BN}); else tc_commit();
  unsigned pf[{BN // 16}][4];
  while (cur < tile_hi) {{
    const int nx = next_tile(cur);
    tc_wait<0>();  // this tile's K and V
    __syncthreads();
    if (nx < tile_hi) load_kv((bf + 1) % {stages}, ({ityp})nx * {BN}); else tc_commit();
    qk_issue(Ks + bf * {tile_h});
    if (pv >= 0) {{
      const unsigned short* const vb = Vs + pv * {tile_h};
{pv_wgmma("vb")}
      wg_wait<{BN // 2}, 1>(&sacc[0][0]);  // the scores (the P V runs on)
    }} else {{
      wg_wait<{BN // 2}>(&sacc[0][0]);
    }}
    scores(({ityp})cur * {BN});
    float mu[2], f[2];
    #pragma unroll
    for (int r = 0; r < 2; ++r) {{
{tile_max}
      f[r] = 1.0f;
      if (mn != mx[r]) {{  // (exp(-inf) is 0: nothing summed yet)
        f[r] = __expf(mx[r] - mn);
        sum[r] *= f[r];
        mx[r] = mn;
      }}
      mu[r] = (mx[r] == {NEG_INF_F}) ? 0.0f : mx[r];  // a row with every key so far hidden: exp(-inf - 0) = 0
    }}
    #pragma unroll
    for (int nb = 0; nb < {BN // 8}; ++nb)
      #pragma unroll
      for (int e = 0; e < 4; ++e) {{
        sacc[nb][e] = __expf(sacc[nb][e] - mu[e >> 1]);
        sum[e >> 1] += sacc[nb][e];
      }}
    wg_wait<{d // 2}>(&oacc[0][0]);  // the P V of the tile before
    #pragma unroll
    for (int r = 0; r < 2; ++r)
      if (f[r] != 1.0f) {{
        #pragma unroll
        for (int nb = 0; nb < {d // 8}; ++nb) {{
          oacc[nb][2 * r] *= f[r];
          oacc[nb][2 * r + 1] *= f[r];
        }}
      }}
    #pragma unroll
    for (int nb = 0; nb < {BN // 8}; ++nb) {{
      pf[nb >> 1][(nb & 1) * 2] = fa_pack(sacc[nb][0], sacc[nb][1]);
      pf[nb >> 1][(nb & 1) * 2 + 1] = fa_pack(sacc[nb][2], sacc[nb][3]);
    }}
    pv = bf;
    cur = nx;
    bf = (bf + 1) % {stages};
  }}
  if (pv >= 0) {{
    const unsigned short* const vb = Vs + pv * {tile_h};
{pv_wgmma("vb", wait=True)}
  }}
"""
    online_loop = f"""
  // one pass (an online record: the graph leaves the probabilities' rounding to the kernel): each tile's scores
  // raise the rows' running max, which rescales their sum and output; the probabilities against it are rounded to
  // the operand dtype for P V (as ATen's fused kernels do), the sum adds them before that rounding. K and V of the
  // next tile are copied into the other buffers during the whole of this tile's work.
{acc_init}  mx[0] = mx[1] = {NEG_INF_F};
  sum[0] = sum[1] = 0.0f;
  auto load_kv = [&](const int bf, const {ityp} j0) {{
    for (int c = tid; c < {BN * cpr}; c += {threads}) {{
      const int r = c / {cpr}, dd = (c % {cpr}) * {_VEC};
      const {ityp} j = j0 + r;
      const bool in = j < jend;
      tc_cp16(&Ks[bf * {tile_h} + {kv_at}], a1 + (in ? ({g.k_at}) : 0), in);
      tc_cp16(&Vs[bf * {tile_h} + {kv_at}], a2 + (in ? ({g.v_at('j')}) : 0), in);
    }}
    tc_commit();
  }};
{overlap_loop if overlap else plain_loop}  // each row's sum over its four threads (their max is the same)
  #pragma unroll
  for (int r = 0; r < 2; ++r) {{
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
  }}"""
    return online_loop


def _store_parts(*, b, d, dead, dev, g, h, ityp, k, mode, od, overlap, p, pl, program, stride, t):
    """The stores of a block's outputs: whole, or a split's part with its (max, sum) and flags."""
    store = f"""
  #pragma unroll
  for (int nb = 0; nb < {d // 8}; ++nb)
    #pragma unroll
    for (int e = 0; e < 4; ++e) {{
      const {ityp} ti = (e < 2) ? row0 : row1;
      const {ityp} dd = nb * 8 + 2 * t4 + (e & 1);
      if (ti < {t}) out0[{g.o_at}] = {store_expr(od, 'oacc[nb][e]', 'float32')};
    }}"""
    guard_rows = f"(row0 < {t} && !(mx[0] > {dead} / 4.0f)) || (row1 < {t} && !(mx[1] > {dead} / 4.0f))"
    # this split's share of the rows' outputs, in float32, for the combining launch
    rows_all = b * h * t
    if p.online:
        part_at = "out1 + " + online_part_at(pl.splits, d, "rowbase + ti", "z")
        stat_at = "out1 + " + online_stat_at(rows_all, pl.splits, d, "rowbase + row", "z")
    else:
        part_at = f"out1 + (rowbase + ti) * {pl.splits * stride} + z * {stride} + 2"
        stat_at = f"out1 + (rowbase + row) * {pl.splits * stride} + z * {stride}"
    partial_out = f"""
  #pragma unroll
  for (int nb = 0; nb < {d // 8}; ++nb)
    #pragma unroll
    for (int r = 0; r < 2; ++r) {{
      const {ityp} ti = r ? row1 : row0;
      if (ti < {t})
        *reinterpret_cast<float2*>({part_at} + nb * 8 + 2 * t4) = make_float2(oacc[nb][2 * r], oacc[nb][2 * r + 1]);
    }}"""
    sole_ok = mode == "online" and sole_split_applies(k, program, dev)
    if overlap and k.writes[1].offset % 4 == 0:
        # the block's 192 rows staged in the shared memory of its tiles (free once every warp is past the barrier of
        # the stats above), each warp's 16 rows then copied out by its lanes as 16 bulk copies of a whole row: the
        # float2 stores of the fragments wrote every row as 16 pieces of 32 bytes, each across two sectors, and the
        # block's last stores held the SM until they drained
        pitch = d + _PAD_F
        partial_out = f"""
  {{
    float* const stage = reinterpret_cast<float*>(Qs) + warp * {16 * pitch};
    #pragma unroll
    for (int nb = 0; nb < {d // 8}; ++nb)
      #pragma unroll
      for (int r = 0; r < 2; ++r)
        *reinterpret_cast<float2*>(stage + (g8 + 8 * r) * {pitch} + nb * 8 + 2 * t4) =
            make_float2(oacc[nb][2 * r], oacc[nb][2 * r + 1]);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // (the copies read through the async proxy)
    __syncwarp();
    const {ityp} ti = m0 + rw * 16 + lane;
    if (lane < 16 && ti < {t}) {{
      const unsigned src = (unsigned)__cvta_generic_to_shared(stage + lane * {pitch});
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], {d * 4};"
                   :: "l"({part_at}), "r"(src) : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // (the shared memory read before the exit)
    }}
  }}"""
    return guard_rows, partial_out, sole_ok, stat_at, store


def _mode_parts(*, additive, dead, g, guard, guard_rows, hb, ityp, k, live_scan, mask, mode, n_tiles, online_loop,
    partial_out, pass2_loop, pl, program, rbs, sole_ok, split, stat_at, store, stride, t, threads, tps):
    """What the split launches (stats, accumulate, online, repair) add around the passes."""
    # which of this split's tiles are live and mixed (bits 0-14 and 16-30; bit 15: a score of absurd size)
    tile_bits = """  int bits = 0;
  for (int i = tile_lo; i < tile_hi; ++i)
    bits |= (tlive[i] ? 1 << (i - tile_lo) : 0) | (tmixed[i] ? 1 << (i - tile_lo + 16) : 0);
"""
    # the flag of a score of absurd size (the skipping's guard fails), and each row's max and sum to the record
    split_stats = f"""    if (__syncthreads_or({str(additive).lower()} && big >= {guard})) bits |= 1 << 15;
    #pragma unroll
    for (int r = 0; r < 2; ++r) {{
      const {ityp} row = r ? row1 : row0;
      if (t4 == 0 && row < {t}) {{
        float* st = {stat_at};
        st[0] = mx[r];
        st[1] = sum[r];
      }}
    }}
"""
    if mode == "online":
        # one pass over this split's live tiles (their choice as in the stats launch); the record gets each row's max
        # and sum and its output at that max, the flags whether the block computed anything and whether a score was
        # of absurd size (the combining launch checks the skipping's guard on the combined max)
        tile_choice = ""
        if mask is not None:  # the classifying launch's table: a tile is live (mixed) if it is for one of the heads
            tile_choice = f"""
  for (int i = tile_lo + tid; i < tile_hi; i += {threads}) {{
    {_table_byte(g, hb, rbs, n_tiles)}
    tlive[i] = v & 1;
    tmixed[i] = v >> 1;
  }}
  __syncthreads();"""
        middle = tile_bits + """  if (!(bits & 0x7fff)) {
    if (rw == 0 && lane == 0) {  // (one thread a head)
      flags[z] = bits;
      used[z] = 0;
    }
    return;
  }
  load_q();
"""
        sole = _sole_split(k, program, ityp, threads, hb, n_tiles, rbs, additive, dead) if sole_ok else ""
        tail = online_loop + "\n" + split_stats + sole + partial_out + """
  if (rw == 0 && lane == 0) {
    flags[z] = bits;
    used[z] = 1;
  }"""
    elif not split:
        tile_choice, tail = live_scan, pass2_loop + store
        middle = f"""  for (int attempt = 0; attempt < 2; ++attempt) {{
    pass1();
    // the skipped tiles add exactly zero only where each row sees a key above the threshold and no score is huge
    bool again = {str(additive).lower()} && skip && (big >= {guard} || {guard_rows});
    if (__syncthreads_or(again) == 0) break;
    skip = false;
  }}
"""
    elif mode == "stats":
        # each row's max and sum over this split's live tiles, and which tiles those were (bits 0-14: live, 16-30:
        # mixed, 15: a score of absurd size, so the skipping's guard fails)
        tile_choice, tail = live_scan, ""
        middle = tile_bits + """  if (bits & 0x7fff) {
    load_q();
    pass1();
""" + split_stats + """  }
  if (tid == 0) flags[z] = bits;
"""
    else:
        # the tiles the stats launch found, and every split's (max, sum) combined into the row's
        tile_choice = f"""
  const int mine = flags[z];
  for (int i = tile_lo + tid; i < tile_hi; i += {32 * WARPS}) {{
    tlive[i] = (mine >> (i - tile_lo)) & 1;
    tmixed[i] = (mine >> (i - tile_lo + 16)) & 1;
  }}
  __syncthreads();"""
        middle = f"""  bool huge = false;
  #pragma unroll
  for (int r = 0; r < 2; ++r) {{
    const {ityp} row = r ? row1 : row0;
    mx[r] = {NEG_INF_F};
    sum[r] = 0.0f;
    for (int zz = 0; zz < {pl.splits}; ++zz) {{
      const int f = flags[zz];
      huge |= (f >> 15) & 1;
      if (!(f & 0x7fff) || row >= {t}) continue;
      const float* st = out1 + (rowbase + row) * {pl.splits * stride} + zz * {stride};
      const float m2 = st[0], l2 = st[1];
      const float mn = fmaxf(mx[r], m2);
      if (mn == {NEG_INF_F}) continue;
      sum[r] = sum[r] * __expf(mx[r] - mn) + l2 * __expf(m2 - mn);
      mx[r] = mn;
    }}
  }}
  // where the skipping's guard fails for some row of the block, every split computes every tile: the row's max and
  // sum again over all keys here, then this split's keys
  const bool every_tile = __syncthreads_or({str(additive).lower()} && (huge || {guard_rows}));
  if (!every_tile && !(mine & 0x7fff)) {{
    if (tid == 0) used[z] = 0;
    return;
  }}
  load_q();
  if (every_tile) {{
    for (int i = tid; i < ntiles; i += {32 * WARPS}) tlive[i] = tmixed[i] = 1;
    __syncthreads();
    skip = false;
    tile_lo = 0;
    tile_hi = ntiles;
    pass1();
    tile_lo = min(ntiles, z * {tps});
    tile_hi = min(ntiles, tile_lo + {tps});
  }}
"""
        tail = pass2_loop + partial_out + """
  if (tid == 0) used[z] = 1;"""
    return middle, tail, tile_choice


def _q_parts(*, block_flags, d, dpad, hb, ks, mode, overlap, pl, swz, wg):
    """Where a block takes Q from and how its products wait: shared memory or registers, by mode."""
    repair_exit = ""
    q_at_warp = f"(warp * 16 + (lane & 15)) * {dpad} + s * 16 + (lane >> 4) * 8"  # (rows hw * 64 + rw * 16)
    # the tiles in the warpgroup MMA's swizzled layout, which repeats every 1,024 bytes: their base (`first`, at shared
    # address smem_s) aligned to it inside `raw`, which has 1,024 bytes to spare
    aligned = """
  const unsigned raw_s = (unsigned)__cvta_generic_to_shared(fa_raw);
  const unsigned smem_s = (raw_s + 1023u) & ~1023u;
  unsigned short* const {first} = fa_raw + (smem_s - raw_s) / 2;"""
    if wg and mode == "online":
        shared = f"""  extern __shared__ __align__(1024) unsigned short fa_raw[];{aligned.format(first="Qs")}
  unsigned short* const Ks = Qs + {BM * hb * d};
  unsigned short* const Vs = Ks + {online_stages(hb) * BN * d};"""
        q_stage, q_regs, q_frags, q_frag, q_load = "Qs", "", "", "", ""
    elif mode == "online":
        # Q's 64 rows a head stay in shared memory (each k-step's fragment loaded where it is used: the 32 registers
        # of all of them made the kernel spill), then STAGES buffers of K and of V
        shared = f"""  extern __shared__ __align__(16) unsigned short fa_smem[];
  unsigned short* const Qs = fa_smem;
  unsigned short* const Ks = fa_smem + {BM * hb * dpad};
  unsigned short* const Vs = Ks + {online_stages(hb) * BN * dpad};"""
        q_stage, q_regs, q_frags, q_frag = "Qs", "", "", "qa"
        q_load = f"""
      unsigned qa[4];
      tc_ldsm(qa, &Qs[{q_at_warp}]);"""
    else:
        if wg:  # (the key and value tiles swizzled; Q goes through V's as through the others')
            base = aligned.format(first="Ks")
            shared = f"""  __shared__ __align__(1024) unsigned short fa_raw[{2 * BN * d + 512}];{base}
  unsigned short* const Vs = Ks + {BN * d};"""
            q_at_warp = swz("warp * 16 + (lane & 15)", "s * 16 + (lane >> 4) * 8", BM)
        else:
            shared = f"""  __shared__ __align__(16) unsigned short Ks[{BN * dpad}];
  __shared__ __align__(16) unsigned short Vs[{BN * dpad}];"""
        q_stage, q_regs, q_frag, q_load = "Vs", f"  unsigned qf[{ks}][4];", "qf[s]", ""
        q_frags = f"""
    #pragma unroll
    for (int s = 0; s < {ks}; ++s) tc_ldsm(qf[s], &{q_stage}[{q_at_warp}]);
    __syncthreads();  // every warp has its fragments before tiles are copied into the buffer"""
    qk_wait = f"\n      wg_wait<{BN // 2}>(&sacc[0][0]);"
    if wg:
        # the online launch: the warpgroup hw's 64 rows of Q (a region of 64 columns every {BM * hb} rows) in shared
        # memory; the others: Q's fragments in registers. Times K's tile, K 16 at a time
        online = mode == "online"
        q_at = f", qs_s = smem_s + hw * {BM * 128}" if online else ""
        q_operand = (f"fa_qk(&sacc[0][0], wg_desc(qs_s + (s / 4) * {BM * hb * 128} + (s % 4) * 32, 16, 1024),\n"
                     + " " * 13 if online else "fa_qkr(&sacc[0][0], qf[s],")
        qk_products = f"""    {{
      const unsigned kb_s = (unsigned)__cvta_generic_to_shared(kb){q_at};
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
      #pragma unroll
      for (int s = 0; s < {ks}; ++s)
        {q_operand} wg_desc(kb_s + (s / 4) * {BN * 128} + (s % 4) * 32, 16, 1024));
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");{"" if overlap else qk_wait}
    }}"""
    else:
        qk_products = f"""    #pragma unroll
    for (int s = 0; s < {ks}; ++s) {{{q_load}
      #pragma unroll
      for (int np = 0; np < {BN // 16}; ++np) {{
        unsigned r[4];
        tc_ldsm(r, &kb[(np * 16 + (lane & 7) + (lane >> 4) * 8) * {dpad} + s * 16 + ((lane >> 3) & 1) * 8]);
        tc_mma(sacc[2 * np], {q_frag}, r[0], r[1]);
        tc_mma(sacc[2 * np + 1], {q_frag}, r[2], r[3]);
      }}
    }}"""
    if mode == "repair":
        # the row blocks whose combined max (or a score of absurd size) said the online launch's skipping cannot be
        # trusted, marked by the combining launch (bit 31 of the block's first split flags): those run again here,
        # exactly and as one block each; the others stop at once
        # (bit 31 of any split's flags: the combining launch marks the first split's, a sole split its own)
        repair_exit = f"""
  {{
    const int* const fl = {block_flags};
    int marked = 0;
    for (int zz = 0; zz < {pl.splits}; ++zz) marked |= fl[zz];
    if (!(marked >> 31 & 1)) return;
  }}"""
    return q_frags, q_regs, q_stage, qk_products, repair_exit, shared


def _pass1_parts(*, b, cpr, d, edge_causal, g, h, hb, ityp, kv_at, late_mask, mask_load, mma_t, mode, overlap, p, pl,
    qk_products, t, wg):
    """The first pass over the key tiles (Q K^T, the softmax, P V) and the online launch's block order."""
    # Q K^T with Q's tile in shared memory (the online launch) or its fragments in registers (the others), K's tile
    # in shared memory; P V with P in registers and V's tile in its transposed form
    products = {"fa_qk": (BN, False, False)} if mode == "online" else {"fa_qkr": (BN, True, False)}
    zero_scores = f"""    #pragma unroll
    for (int nb = 0; nb < {BN // 8}; ++nb)
      #pragma unroll
      for (int e = 0; e < 4; ++e) sacc[nb][e] = 0.0f;"""
    tile_kind = f"""    const bool edge = m0 + {BM} > {t} || j0 + {BN} > jend{edge_causal};
    const bool mixed = tmixed[j0 / {BN}];"""
    if overlap:  # the products issued on their own (the loop waits for them), the scores finished after the wait
        scores_head = f"""  auto qk_issue = [&](const unsigned short* kb) {{
{zero_scores}
{qk_products}
  }};
  auto scores = [&](const {ityp} j0) {{
{tile_kind}"""
    else:
        scores_head = f"""  auto scores = [&](const {ityp} j0, const unsigned short* kb) {{
{tile_kind}
{mask_load if not late_mask else ""}
{zero_scores}
{qk_products}"""
    wg_helpers = wgmma_helpers(mma_t, {**products, "fa_pv": (d, True, True)}) if wg else ""
    # one tile of K or V (pass 1 and pass 2; the online loops copy both at once)
    load_tile_src = "" if overlap else f"""
  auto load_tile = [&](unsigned short* dst, const auto* src, const {ityp} j0, const bool is_v) {{
    for (int c = tid; c < {BN * cpr}; c += {32 * WARPS}) {{
      const int r = c / {cpr}, dd = (c % {cpr}) * {_VEC};
      const {ityp} j = j0 + r;
      const bool in = j < jend;
      tc_cp16(&dst[{kv_at}], src + (in ? (is_v ? ({g.v_at('j')}) : ({g.k_at})) : 0), in);
    }}
    tc_commit();
  }};
"""
    # (the overlapped online loop scores a tile in two steps, and has no use for pass 1)
    pass1_src = f"""\
  // pass 1: each row's max and sum of exponentials (per thread over its columns, then over the 4 threads of a row);
  // K tiles alternate between the two buffers, the next one copied while this one is used
  float mx[2], sum[2];
  auto pass1 = [&]() {{
    mx[0] = mx[1] = {NEG_INF_F};
    sum[0] = sum[1] = 0.0f;
    big = 0.0f;
    int cur = next_tile(tile_lo - 1);
    if (cur < tile_hi) load_tile(Ks, a1, ({ityp})cur * {BN}, false); else tc_commit();
    for (int which = 0; cur < tile_hi; which ^= 1) {{
      const int nx = next_tile(cur);
      unsigned short* here = which ? Vs : Ks;
      if (nx < tile_hi) load_tile(which ? Ks : Vs, a1, ({ityp})nx * {BN}, false); else tc_commit();
      tc_wait<1>();
      __syncthreads();
      scores(({ityp})cur * {BN}, here);
      #pragma unroll
      for (int r = 0; r < 2; ++r) {{
        float tm = {NEG_INF_F};
        #pragma unroll
        for (int nb = 0; nb < {BN // 8}; ++nb) tm = fmaxf(tm, fmaxf(sacc[nb][2 * r], sacc[nb][2 * r + 1]));
        const float mn = fmaxf(mx[r], tm);
        if (mn == {NEG_INF_F}) continue;  // every key so far hidden
        // (exp(-inf) is 0: a hidden key or an empty running sum adds nothing, with no test)
        float acc = sum[r] * __expf(mx[r] - mn);
        #pragma unroll
        for (int nb = 0; nb < {BN // 8}; ++nb) acc += __expf(sacc[nb][2 * r] - mn) + __expf(sacc[nb][2 * r + 1] - mn);
        sum[r] = acc;
        mx[r] = mn;
      }}
      __syncthreads();  // every warp is done with `here` before the next copy lands in it
      cur = nx;
    }}
    #pragma unroll
    for (int r = 0; r < 2; ++r)
      #pragma unroll
      for (int o = 1; o < 4; o <<= 1) {{
        const float m2 = __shfl_xor_sync(0xffffffffu, mx[r], o), l2 = __shfl_xor_sync(0xffffffffu, sum[r], o);
        const float mn = fmaxf(mx[r], m2);
        if (mn == {NEG_INF_F}) continue;
        sum[r] = sum[r] * __expf(mx[r] - mn) + l2 * __expf(m2 - mn);
        mx[r] = mn;
      }}
  }};
"""
    if overlap:
        pass1_src = "  float mx[2], sum[2];  // each row's running max and sum\n"
    order = online_order(p, pl, hb) if mode == "online" else None
    order_table = coords = ""
    if order:
        order_table = f"__device__ const unsigned fa_order[{len(order)}] = {{{','.join(map(str, order))}}};\n"
        coords = f"""  // this block's row block, heads and split: the ones with most key tiles first (see online_order)
  const unsigned bo = fa_order[blockIdx.x + {-(-t // BM)} * (blockIdx.y + {b * h // hb} * blockIdx.z)];
  const int bx = bo & 0xfff, by = (bo >> 12) & 0xfff, bz = bo >> 24;"""
    else:
        coords = "  const int bx = blockIdx.x, by = blockIdx.y, bz = blockIdx.z;"
    return coords, load_tile_src, order_table, pass1_src, scores_head, wg_helpers


def _kernel_text(*, additive, causal_end, causal_test, coords, cpr, dpad, g, group, h, hb, ityp, late_mask,
    late_mask_apply, live_default, lk, load_tile_src, mask_apply, middle, mma_t, n_tiles, order_table, pack, pack_t,
    pass1_src, q_frags, q_regs, q_stage, repair_exit, scale, scores_head, sd, shared, signature, split, split_head, swz,
    t, tail, threads, tile_choice, valid, wg, wg_helpers):
    """The whole source of one launch of mode `mode`, from its parts."""
    src = f"""{PRELUDE}{REDUCE_HELPERS if valid else ''}
{tc_helpers(mma_t)}{wg_helpers}__device__ __forceinline__ unsigned fa_pack(float lo, float hi) {{
  const {pack_t} v = {pack}(lo, hi);
  return *reinterpret_cast<const unsigned*>(&v);
}}
{order_table}{signature(threads, MIN_BLOCKS if hb == 1 else 1)} {{
{WAIT}
{coords}
{shared}
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // rw: the warp's 16 rows of the block's 64; hw: its head of the block's {hb}
  const int rw = warp & {WARPS - 1}, hw = warp / {WARPS};
  const int g8 = lane >> 2, t4 = lane & 3;
  const {ityp} m0 = ({ityp})bx * {BM};
  const {ityp} hg = by % {h // hb}, bi = by / {h // hb};
  const {ityp} hi = hg * {hb} + hw;
  const {ityp} kvh = hi / {group};{repair_exit}
  {ityp} jend = ({ityp}){lk};{valid}{causal_end}
  // the two query rows of this thread's accumulator fragments
  const {ityp} row0 = m0 + rw * 16 + g8, row1 = row0 + 8;

  // Q: 64 rows through shared memory (the V buffer) into fragments, zero past the last row (a split block loads
  // them once it knows it has tiles to compute)
{q_regs}
  auto load_q = [&]() {{
    for (int c = tid; c < {BM * hb * cpr}; c += {threads}) {{
      const int r = c / {cpr}, dd = (c % {cpr}) * {_VEC};
      const {ityp} ti = m0 + r % {BM};
      const {ityp} hi = hg * {hb} + r / {BM};
      const bool in = ti < {t};
      tc_cp16(&{q_stage}[{swz("r", "dd", BM * hb) if wg else f"r * {dpad} + dd"}], a0 + (in ? {g.q_at} : 0), in);
    }}
    tc_commit();
    tc_wait<0>();
    __syncthreads();{q_frags}
  }};{"" if split else chr(10) + "  load_q();"}
{load_tile_src}  // which key tiles some row of the block sees (decided once, from the mask: one coalesced pass over it)
  const int ntiles = (int)((jend + {BN - 1}) / {BN});
  int tile_lo = 0, tile_hi = ntiles;  // the tiles this block computes{split_head}
  __shared__ unsigned char tlive[{n_tiles}], tmixed[{n_tiles}];
  for (int i = tid; i < ntiles; i += {threads}) {{
    tlive[i] = {live_default};
    tmixed[i] = 0;
  }}
  __syncthreads();{tile_choice}
  bool skip = true;
  // the next tile to compute after tile i
  auto next_tile = [&](int i) -> int {{
    for (++i; i < tile_hi && skip && !tlive[i]; ++i) {{}}
    return i;
  }};
  // S = Q K^T over the tile in sacc (K in kb), then rounded, scaled and masked as the graph stores the scores
  float sacc[{BN // 8}][4];
  float big = 0.0f;  // the largest unmasked score seen (additive masks: the skipping's guard)
  // edge: a tile that crosses the last row, the last key or the causal diagonal (the others need no bounds test)
{scores_head}
    #pragma unroll
    for (int nb = 0; nb < {BN // 8}; ++nb)
      #pragma unroll
      for (int e = 0; e < 4; ++e) {{
        float s = sacc[nb][e];
        s = {round_expr('s', sd)};
        s = {round_expr(f's * {scale}', sd)};
        {"big = fmaxf(big, fabsf(s));" if additive else ""}
        sacc[nb][e] = s;
      }}{late_mask_apply if late_mask else mask_apply}
    if (edge) {{
      #pragma unroll
      for (int nb = 0; nb < {BN // 8}; ++nb)
        #pragma unroll
        for (int e = 0; e < 4; ++e) {{
          const {ityp} ti = (e < 2) ? row0 : row1;
          const {ityp} j = j0 + nb * 8 + 2 * t4 + (e & 1);
          if (!(ti < {t} && j < jend{causal_test})) sacc[nb][e] = {NEG_INF_F};
        }}
    }}
  }};

{pass1_src}{middle}{tail}
}}
"""
    return src


def _combine(k: KernelCall, program: CompiledProgram, signature, ptrs, ityp: str) -> tuple[str, Launch]:
    """The last launch of split attention: each row's output is the sum, in split order, of the partial outputs of
    the splits whose accumulate block computed something. Online: each split's output is at its own max,
    unnormalised; they add up weighed by exp(its max - the row's max), over the row's sum (a row with no visible key
    gives zeros). Where the row's max is at or below the skipping's threshold, or a split saw a score of absurd size,
    the skipped tiles may not add zero: the row block is marked for the repair launch (bit 31 of its first split's
    flags).
    One warp a row, two output columns a lane at a time (four where an online record's rows are aligned and the
    output's allow 8-byte stores: `wide` below): the row's index arithmetic (64-bit divisions where the
    record is large) and its flags and stats are done once for its columns, not once a column pair. Qwen2.5-1.5B's
    prefill attention alone on the H100 (its four launches, `Executor.profile`, three alternating rounds): 129.5 ->
    127.4 us; this launch stays about 20 us, reading the splits' float32 records."""
    p: AttentionKernel = k.spec
    pl = plan_of(k)
    g = attention_geometry(k, "cuda")
    b, h, t, dv = g.b, g.h, g.t, p.v_dim
    od = program.dtype_of(g.out)
    rbs, splits, stride = -(-t // BM), pl.splits, 2 + dv
    rows = b * h * t
    block = 128
    warps = block // 32
    col_steps = -(-dv // 64)  # a lane's column pairs of a row
    additive = g.mask is not None and p.mask == "additive"
    dead = literal(dead_threshold(program.dtype_of(g.mask)) if additive else -1e30, "float32")
    # (an online record: the tiled launches' layout, see online_part_at)
    part = online_part_at(splits, dv, "row", "zz") if p.online else f"(row * {splits} + zz) * {stride} + 2"
    if p.online:
        row_stats = f"""
    int* const fl = reinterpret_cast<int*>(out1 + {rows * splits * stride}LL) + (bh * {rbs} + ti / {BM}) * {splits};
    float mx = {NEG_INF_F};
    for (int zz = 0; zz < {splits}; ++zz)
      if (u[zz]) mx = fmaxf(mx, out1[{online_stat_at(rows, splits, dv, "row", "zz")}]);
    float tot = 0.0f;
    bool huge = false;
    for (int zz = 0; zz < {splits}; ++zz)
      if (u[zz]) {{
        const float* st = out1 + {online_stat_at(rows, splits, dv, "row", "zz")};
        tot += st[1] * ((st[0] == {NEG_INF_F}) ? 0.0f : __expf(st[0] - mx));
        huge |= (fl[zz] >> 15) & 1;
      }}
    const float inv = (mx == {NEG_INF_F}) ? 0.0f : 1.0f / tot;
    if ({str(additive).lower()} && lane == 0 && (huge || !(mx > {dead} / 4.0f))) atomicOr(fl, 1 << 31);"""
        # each split's output is at its own max: its weight exp(its max - the row's max)
        weights = f"""
    float f[{splits}];
    #pragma unroll
    for (int zz = 0; zz < {splits}; ++zz) {{
      const float* st = out1 + {online_stat_at(rows, splits, dv, "row", "zz")};
      f[zz] = (!live[zz] || st[0] == {NEG_INF_F}) ? 0.0f : __expf(st[0] - mx);
    }}"""
        term, scale = "v[cs][zz].{0} * f[zz]", """
      acc.x *= inv;
      acc.y *= inv;"""
        scale4 = scale + """
      acc.z *= inv;
      acc.w *= inv;"""
    else:
        row_stats = ""
        weights = ""
        term, scale, scale4 = "v[cs][zz].{0}", "", ""
    # an online record's rows are 16-byte aligned (online_part_at): four columns a lane, one 16-byte load a split, and
    # the four results stored as one 8-byte store where the output's rows allow it
    _, os_ = pad4(g.out, "cuda")
    wide = (p.online and k.writes[1].offset % 4 == 0 and dv % 4 == 0 and od in _OPERANDS and os_[3] == 1
            and g.out.offset % 4 == 0 and all(st % 4 == 0 for st in os_[:3]))
    if wide:
        col_steps = -(-dv // 128)
        loads = f"""    float4 v[{col_steps}][{splits}];
    #pragma unroll
    for (int cs = 0; cs < {col_steps}; ++cs)
      #pragma unroll
      for (int zz = 0; zz < {splits}; ++zz)
        v[cs][zz] = live[zz] && lane * 4 + cs * 128 < {dv}
            ? *reinterpret_cast<const float4*>(out1 + {part} + lane * 4 + cs * 128)
            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);"""
        body = f"""      const {ityp} dd = lane * 4 + cs * 128;
      if (dd >= {dv}) break;
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      #pragma unroll
      for (int zz = 0; zz < {splits}; ++zz)
        if (live[zz]) {{
          acc.x += {term.format("x")};
          acc.y += {term.format("y")};
          acc.z += {term.format("z")};
          acc.w += {term.format("w")};
        }}{scale4}
      __align__(8) {storage(od)} o4[4] = {{{", ".join(store_expr(od, f"acc.{c}", "float32") for c in "xyzw")}}};
      *reinterpret_cast<uint2*>(&out0[{g.o_at}]) = *reinterpret_cast<const uint2*>(o4);"""
    else:
        loads = f"""    float2 v[{col_steps}][{splits}];
    #pragma unroll
    for (int cs = 0; cs < {col_steps}; ++cs)
      #pragma unroll
      for (int zz = 0; zz < {splits}; ++zz)
        v[cs][zz] = live[zz] && lane * 2 + cs * 64 < {dv}
            ? *reinterpret_cast<const float2*>(out1 + {part} + lane * 2 + cs * 64)
            : make_float2(0.0f, 0.0f);"""
        body = f"""      const {ityp} d0 = lane * 2 + cs * 64;
      if (d0 >= {dv}) break;
      float2 acc = make_float2(0.0f, 0.0f);
      #pragma unroll
      for (int zz = 0; zz < {splits}; ++zz)
        if (live[zz]) {{
          acc.x += {term.format("x")};
          acc.y += {term.format("y")};
        }}{scale}
      #pragma unroll
      for (int e = 0; e < 2; ++e) {{
        const {ityp} dd = d0 + e;
        out0[{g.o_at}] = {store_expr(od, '(e ? acc.y : acc.x)', 'float32')};
      }}"""
    # (an online record: a row block whose only split with keys wrote its outputs itself, see _sole_split)
    sole_skip = f"""
    bool sole = false;
    #pragma unroll
    for (int zz = 0; zz < {splits}; ++zz) sole |= u[zz] == 2;
    if (sole) continue;""" if p.online else ""
    src = f"""{PRELUDE}
{signature(block, 0)} {{
{WAIT}
  const int* const used = reinterpret_cast<const int*>(out1 + {rows * splits * stride}LL) + {b * h * rbs * splits}LL;
  const int lane = threadIdx.x & 31;
  // (the row in 64 bits: the record's offsets, row * splits * (2 + v_dim), outgrow the index type of q, k, v)
  for (long long row = (long long)blockIdx.x * {warps} + (threadIdx.x >> 5); row < {rows}LL;
       row += (long long)gridDim.x * {warps}) {{
    const {ityp} ti = row % {t};
    const long long bh = row / {t};
    const {ityp} hi = bh % {h}, bi = bh / {h};
    const int* u = used + (bh * {rbs} + ti / {BM}) * {splits};{sole_skip}{row_stats}
    // every split's weight and every value of the row's columns are loaded before the first store: a store could
    // alias a later load (for all the compiler knows), which would make each column step a round trip of its own
    bool live[{splits}];
    #pragma unroll
    for (int zz = 0; zz < {splits}; ++zz) live[zz] = u[zz] != 0;{weights}
{loads}
    #pragma unroll
    for (int cs = 0; cs < {col_steps}; ++cs) {{
{body}
    }}
  }}
}}
"""
    return src, Launch((grid_for(rows, warps, CUDA.max_grid) if rows else 0, 1, 1), block, ptrs)
