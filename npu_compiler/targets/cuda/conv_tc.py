"""Convolution as an implicit GEMM on tensor cores over channels-last activations: no patch (im2col) matrix, and the
bias, the residual add and the activation applied as each output is stored.

out[p, o] = sum_k x_col[p, k] * w[o, k], with p = (n, ho, wo) the output pixel (the GEMM's M), o the output channel
(its N) and k = (r, s, c) the window position and input channel (its K). With channels-last activations a pixel's
K run for one window position is a contiguous run of channels, and with the weight kept as [O, kh, kw, C] (the
lowering's WeightSpec.layout) an output channel's K run is contiguous too, so both tiles move as 16-byte `cp.async`
copies (a window position outside the image is a zero-filled copy: the padding). Each block computes a BM x BN
tile in fp32 with `mma.sync` m16n8k16 (fp16 or bf16 operands) over K in steps of BK through STAGES shared-memory
stages, so the copies of the next tiles are in flight while the tensor cores work. An input or weight in another
layout (a program input in NCHW, a stem conv of 3 channels, a weight also used elsewhere) is read element by element
instead: correct for any strides, slower. Where such an input's rows for a pixel tile fit in shared memory and the
pixel tiles are enough to give every block of the grid several, they go through a shared-memory window instead
(`conv_window.py`: the stem at batch 64).

The epilogue adds the bias in fp32, rounds to the output dtype (the unfused graph's stored conv result, `Acc`), then
computes the record's epilogue expression (residual add, ReLU) and stores through the output's strides, two
channels in one 4-byte store where the output is channels-last.

A conv with too few tiles to fill the GPU splits its K across `splits` blocks. On Hopper those blocks are one
thread-block cluster: each leaves its float32 part of the tile in its shared memory, and each then sums a share of
the tile over every part (read through distributed shared memory, in split order) and applies the epilogue, all in
one launch. Elsewhere the parts go to the record's float32 scratch and a second launch sums them in the same order,
so both give the same bits.

On Hopper an unsplit conv whose tiles are both 16-byte copies multiplies on the warpgroup MMA: 128 x 128 tiles of
two warpgroups, two blocks an SM, or 192 x 128 tiles of three, one block an SM, where the grid's rounds over the SMs
are then shorter (`tall_tiles`); a grid of one partial wave takes stages enough that its blocks go one to an SM
(`one_wave_stages`).

A side conv (`Conv2dKernel.side_stride`: a 1x1 conv of another channels-last input, a ResNet block's projection
shortcut) runs first, its K tiles before the conv's: after them its sums plus its bias are rounded to the output
dtype and kept in shared memory (two to a 32-bit word, each thread its own), and the accumulators start again from
zero; the epilogue reads them as `Acc(1)`, what the shortcut would have stored (see SIDE_STAGES).
"""

from __future__ import annotations

import math

from ...dtypes import itemsize
from ...expr import nodes as X
from ...kernels import Conv2dKernel, Conv2dPlan, plan_of
from ...program import CompiledProgram, KernelCall, TensorRef
from ..clike import Launch, affine, ptrs_of
from . import conv_window
from .common import (
    PRELUDE,
    WAIT,
    WEIGHTS_BEGIN,
    WEIGHTS_END,
    load_expr,
    mma_sync_ok,
    round_expr,
    storage,
    store_expr,
    swizzled_at,
    tc_helpers,
    wgmma_helpers,
)

BK = 32  # K per stage where a tile is read element by element
# K per stage where both tiles are 16-byte copies: fewer barriers per K (on the H100, ResNet-50's 3x3 convs at batch 64
# went from 112 to 94 us against BK; the element-by-element stem from 326 to 412 us, so it keeps BK)
BK_COPIES = 64
STAGES = 3
LATENCY_STAGES = 6  # the most a conv of one partial wave on mma.sync takes (`latency_stages`)
_PAD = 8  # halves of padding per shared-memory row: ldmatrix's eight rows fall in different banks
_OPERANDS = {"float16": "f16", "bfloat16": "bf16"}
# (BM pixels, BN output channels, warp tile rows, warp tile columns), largest first
_CONFIGS = ((128, 128, 64, 32), (64, 128, 32, 32), (128, 64, 32, 32), (64, 64, 32, 32))
MAX_SPLITS = 16
# Where the device has thread-block clusters (Hopper and later), a split conv's blocks form one cluster (at most its
# portable size, `cluster_blocks`) and sum their parts through distributed shared memory, in one launch; elsewhere
# the parts go through a float32 scratch and a second launch sums them
# floats of padding per row of a part tile in shared memory: the four rows of a half-warp's float2 stores then
# share half their banks pairwise instead of all of them (8 would separate them fully; not measured)
_RED_PAD = 4
MIN_SPLIT_K = 256  # a K split's length at least: shorter ones are mostly the pipeline's start and end
# Hopper (a device with `warpgroup_mma`, sm_90a only: later architectures have other MMA instructions): an unsplit
# conv whose both tiles are 16-byte copies multiplies on the warpgroup MMA (`wgmma`), which reads both tiles from
# shared memory itself: with `mma.sync` every warp loads its fragments through `ldmatrix`, and at ResNet-50's shapes
# the shared-memory pipe and the tensor pipe were both half busy (ncu: the 3x3 convs at 26-40% of the tensor pipe)
MAX_GRID_Y = 65535
# A conv with a side conv keeps the side's rounded results in shared memory after its stages (each thread its own
# words, no barrier): beside the accumulators in registers they spilled (224-252 bytes on the warpgroup MMA), and
# 64-channel tiles instead re-read each pixel tile. It takes SIDE_STAGES stages, so that two blocks still fit an SM.
# ResNet-50 at batch 64 on the H100, its four shortcut convs folded (the unfolded pair of kernels in brackets):
# 109 / 88 / 68 / 70 us (180 / 123 / 88 / 78) in shared memory with two stages; in registers, in 64-channel tiles up
# to 512 channels and spilling above, 123 / 101 / 73 / 73; in shared memory with three stages (one block an SM)
# 152 / 112 / 82 / 82
SIDE_STAGES = 2


# Thread-block clusters (sm_90): the block's rank, a barrier of all the cluster's threads (release and acquire: the
# shared-memory writes before it are seen by every block after it), and a float read from the shared memory of the
# block of rank `rank` at this block's shared address `at`.
CLUSTER_HELPERS = r"""
__device__ __forceinline__ unsigned tc_cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void tc_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ float tc_cluster_load(unsigned at, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(at), "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}
"""


def _geometry(x_shape, w_shape, out_shape) -> tuple[int, int, int]:
    n, c, _, _ = x_shape
    o, _, kh, kw = w_shape
    _, _, ho, wo = out_shape
    return n * ho * wo, o, kh * kw * c


def tile_for(p: int, o: int, dev, wide: bool = False) -> tuple[int, int, int, int]:
    """The block tile: 128 output channels where there are that many, 128 pixels where that still gives every SM of the
    device (a DeviceProfile) a block, or with `wide` (`wide_tiles`) half of them: the warpgroup MMA does a 128-pixel
    tile in about half the time of mma.sync's 64-pixel one (ResNet-50's last convs at batch 64, 100 blocks: the 3x3 88
    -> 55 us, the 1x1 reductions 47 -> 26 us, unsplit). Measured on the H100 (ResNet-50 at batch 64, 4.02 ms with these,
    before the warpgroup MMA): the 64-pixel tile for every conv with K <= 128 (more blocks for the convs that are mostly
    loads and epilogue) 4.09 ms; 64 x 64 warp tiles in the 128 x 128 tile (222 registers, two blocks an SM) with BK 32
    4.50 ms."""
    bn = 128 if o >= 128 else 64
    cfgs = [c for c in _CONFIGS if c[1] == bn]
    big, small = cfgs
    blocks = -(-p // big[0]) * -(-o // bn)
    sms = dev.multiprocessors
    return big if blocks >= sms or (wide and 2 * blocks >= sms) else small


# Hopper: 192 pixels x 128 channels, three warpgroups (a block an SM), for a conv on the warpgroup MMA where
# `tall_tiles` says so
TALL_TILE = (192, 128, 64, 32)


def tall_tiles(p: int, o: int, dev) -> bool:
    """Whether a conv on the warpgroup MMA whose tiles would be 128 x 128 takes TALL_TILE ones: where the SM with the
    most pixels then gets fewer. Two 128-pixel blocks share an SM, so the busiest SM multiplies 128 pixels for each
    block of the grid's rounds over the SMs, and a 192-pixel block has an SM to itself: ResNet-50's third stage at
    batch 64 (12,544 pixels, 256 channels) has 196 tiles of 128, two on some SMs and one on the rest, or as many
    tiles of 192 as the H100 has SMs, one an SM. Measured there on the H100 (one process, interleaved rounds): its
    3x3 convs 46.3 -> 41.3 us, its 1x1 reductions 24.5 -> 21.7 us, the program 2.467 -> 2.429 ms; with 4 stages
    instead of 3, 2.438 ms."""
    if o < 128:
        return False
    rounds = [-(-(-(-p // bm) * -(-o // 128)) // dev.multiprocessors) for bm in (128, 192)]
    return rounds[1] * 192 < rounds[0] * 128


def wide_tiles(dev, channels: int) -> bool:
    """Whether a conv of `channels` input channels takes 128-pixel tiles for half the SMs already: on Hopper (the
    warpgroup MMA), where its tiles can be 16-byte copies (channels-last, a multiple of 8 channels)."""
    return dev.warpgroup_mma and channels % 8 == 0


def smem_bytes(p: int, o: int, bk: int, dev, cluster: bool = False, wide: bool = False, stages: int = STAGES) -> int:
    """The dynamic shared memory of a block: the stages, and for a cluster's split the float32 part tile that
    reuses them."""
    bm, bn, _, _ = tile_for(p, o, dev, wide)
    tiles = (bm + bn) * (bk + _PAD) * 2 * stages
    return max(tiles, bm * (bn + _RED_PAD) * 4) if cluster else tiles


def in_cluster(splits: int, dev) -> bool:
    """Whether a conv split `splits` ways sums its parts inside a thread-block cluster (one launch)."""
    return 1 < splits <= dev.cluster_blocks


def one_wave_stages(bm: int, bn: int, bk: int, dev) -> int:
    """The stages of a conv on the warpgroup MMA whose grid is one partial wave (at most a block an SM): the fewest,
    no fewer than STAGES, that hold more than half of an SM's shared memory, so that no SM takes two of its blocks.
    Such a conv launches once every block of the kernel before it has started (programmatic dependent launch), and
    its blocks went where that kernel's blocks finished first, two to an SM, other SMs idle: ResNet-50 at batch 64 on
    the H100, the last stage's convs of 100 tiles with 4 stages against 3, 2.575 -> 2.491 ms a run (one process,
    interleaved rounds; 6 stages 2.484), while the per-kernel profile, which launches each kernel on an idle GPU,
    timed those convs the same."""
    stage = (bm + bn) * bk * 2
    return max(STAGES, dev.shared_memory_per_block_optin // 2 // stage + 1)


def latency_stages(bm: int, bn: int, bk: int, per_split: int, dev) -> int:
    """The stages of a conv on mma.sync whose grid is one partial wave (one image's convs): its blocks are few and
    each is a chain of copies and products, so more of its K tiles in flight at once shorten it. Up to
    LATENCY_STAGES, no more than its split's K tiles need (the prologue then copies all of them) and no more than
    fit. Measured on the H200 (ResNet-50 at batch 1, every conv but the stem and the projections on this path; one
    process, 4 alternating rounds of 30 runs): 6 stages against 3, 0.350 -> 0.330 ms."""
    stage = (bm + bn) * (bk + _PAD) * 2
    return max(STAGES, min(LATENCY_STAGES, per_split + 1, dev.shared_memory_per_block_optin // stage))


def k_step(p: int, o: int, copies: bool, dev, wide: bool = False) -> int:
    """K per stage: BK_COPIES where both tiles are 16-byte copies and the stages fit the GPU's shared memory."""
    if copies and smem_bytes(p, o, BK_COPIES, dev, wide=wide) <= dev.shared_memory_per_block_optin:
        return BK_COPIES
    return BK


def conv_tc_shape_ok(dtypes: tuple[str, str, str], groups: int, x_shape, w_shape, out_shape, dev) -> bool:
    """Whether a conv of these dtypes and shapes runs on tensor cores: one 16-bit operand dtype for the input, the
    weight and the output, one group, and a grid that fits."""
    if not mma_sync_ok(dev) or len(set(dtypes)) != 1 or dtypes[0] not in _OPERANDS or groups != 1:
        return False
    if len(x_shape) != 4 or len(w_shape) != 4 or len(out_shape) != 4:
        return False
    p, o, k = _geometry(x_shape, w_shape, out_shape)
    if min(p, o, k) < 1:
        return False
    bm, _, _, _ = tile_for(p, o, dev)
    return -(-p // bm) <= MAX_GRID_Y


def uses_wgmma(p: int, o: int, splits: int, copies: bool, dev) -> bool:
    """Whether a conv multiplies on the warpgroup MMA: Hopper, unsplit, both tiles 16-byte copies, 128-pixel tiles
    (a warpgroup's 64 rows each)."""
    wide = dev.warpgroup_mma
    return (wide and splits == 1 and copies and tile_for(p, o, dev, wide)[0] == 128
            and k_step(p, o, copies, dev, wide) == 64)


def splits_for(p: int, o: int, k: int, dev, wide: bool = False) -> int:
    """Across how many blocks the K of a conv is split: where its tiles are too few to give every SM a block (one
    image's deep layers: ResNet-50's last 3x3 convs have 8 tiles and a K of 4,608), enough splits for about two
    blocks an SM, each at least MIN_SPLIT_K long; on Hopper no more than a cluster holds."""
    bm, bn, _, _ = tile_for(p, o, dev, wide)
    blocks = -(-p // bm) * -(-o // bn)
    sms = dev.multiprocessors
    if blocks >= sms or (wide and bm == 128):
        return 1
    most = dev.cluster_blocks or MAX_SPLITS
    return max(1, min(most, -(-2 * sms // blocks), k // MIN_SPLIT_K))


def convs_on_tensor_cores(convs: list[tuple], dev) -> list[bool]:
    """For each conv (dtypes, groups, input, weight and output shapes): whether it runs on this kernel. A program's
    convs go to it (and its activations channels-last) where those it can run hold at least
    half of the program's conv FLOPs: a network of grouped or depthwise convs keeps its layout. Measured on the H100
    (ResNet-50 fp16, bench_cnn.py): batch 1 0.658 ms on cuBLAS against 0.463 ms here with split K; batch 64 8.17
    against 4.1 ms."""
    total = eligible = 0
    on = []
    for c in convs:
        p, o, _ = _geometry(*c[2:])
        k = math.prod(c[3][1:])  # the K of one group (a grouped conv's FLOPs count its groups' K only)
        total += p * o * k
        on.append(conv_tc_shape_ok(*c, dev))
        eligible += p * o * k if on[-1] else 0
    return on if eligible > 0 and 2 * eligible >= total else [False] * len(convs)


def plan_conv(k: KernelCall, program_buffers, dev) -> Conv2dPlan:
    """A conv record's plan on this kernel: its K split across blocks where its tiles are too few for the device
    (`splits_for`)."""
    x, w, out = k.args[0], k.args[1], k.outs[0]
    dts = tuple(program_buffers[r.buffer].dtype for r in (x, w, out))
    if k.spec.side_stride or not conv_tc_shape_ok(dts, k.spec.groups, x.shape, w.shape, out.shape, dev):
        return Conv2dPlan()
    p, o, kk = _geometry(x.shape, w.shape, out.shape)
    return Conv2dPlan(splits_for(p, o, kk, dev, wide_tiles(dev, x.shape[1])))


def applies(k: KernelCall, program: CompiledProgram, dev) -> bool:
    """A conv2d record this kernel runs (any strides: the loads go through them)."""
    spec = k.spec
    if not isinstance(spec, Conv2dKernel) or len(k.args) < spec.first_epilogue_arg:
        return False
    splits = plan_of(k).splits
    if len(k.outs) != 1 or len(k.scratch) != (splits > 1) or (splits > 1 and spec.groups != 1):
        return False
    x, w, out = k.args[0], k.args[1], k.outs[0]
    dts = tuple(program.dtype_of(r) for r in (x, w, out))
    if spec.side_stride and not side_fits(k, program.buffers, dev):
        return False  # (the direct kernel runs any side conv)
    return conv_tc_shape_ok(dts, spec.groups, x.shape, w.shape, out.shape, dev)


def side_fits(k: KernelCall, buffers, dev) -> bool:
    """Whether a conv2d record with a side conv runs here on every GPU this kernel runs on: one operand dtype, both
    inputs channels-last and both weights [O, kh, kw, C] in 16-byte runs (so no tile is read element by element or
    through a window), unsplit, and both K a multiple of BK_COPIES (no K step mixes the two)."""
    spec = k.spec
    if not isinstance(spec, Conv2dKernel) or not spec.side_stride or plan_of(k).splits != 1:
        return False
    x, w, out = k.args[0], k.args[1], k.outs[0]
    x2, w2 = k.args[spec.side_first_arg], k.args[spec.side_first_arg + 1]
    dts = tuple(buffers[r.buffer].dtype for r in (x, w, out, x2, w2))
    if len(set(dts)) != 1 or not conv_tc_shape_ok(dts[:3], spec.groups, x.shape, w.shape, out.shape, dev):
        return False
    k_total = _geometry(x.shape, w.shape, out.shape)[2]
    return (all(pixels_vectorizable(r) for r in (x, x2)) and all(weight_vectorizable(r) for r in (w, w2))
            and k_total % BK_COPIES == 0 and x2.shape[1] % BK_COPIES == 0)


def pixels_vectorizable(x: TensorRef) -> bool:
    """A pixel's channels are contiguous and every pixel starts 16 bytes aligned (a channels-last input)."""
    _, c, _, _ = x.shape
    xs = x.strides
    return c % 8 == 0 and xs[1] == 1 and x.offset % 8 == 0 and all(s % 8 == 0 for s in (xs[0], xs[2], xs[3]))


def weight_vectorizable(w: TensorRef) -> bool:
    """The weight is kept as [O, kh, kw, C] (dense) with 16-byte aligned runs of channels."""
    o, c, kh, kw = w.shape
    return (c % 8 == 0 and w.offset % 8 == 0
            and tuple(w.strides) == (kh * kw * c, 1, kw * c, c))


def _residual_prefetch(k: KernelCall, program: CompiledProgram, names: list[str], ityp: str, bm: int, bn: int,
                       threads: int, out_hw: tuple[int, int]) -> str:
    """Lines that prefetch into L2 the block's tile of each channels-last tensor the epilogue reads (a residual),
    so that its loads after the GEMM hit L2: a conv with a short K is little more than its loads and its epilogue
    (ResNet-50 at batch 64 on the H100: 4.13 -> 4.02 ms). Only lines that start inside the tensor's buffer are
    touched."""
    spec: Conv2dKernel = k.spec
    if spec.epilogue is None:
        return ""
    ho, wo = out_hw
    p_total = k.outs[0].shape[0] * ho * wo
    out = []
    for e in X.walk(spec.epilogue):
        if not isinstance(e, X.Load) or len(e.strides) != 4 or e.strides[1] != 1 or e.rstrides:
            continue
        ref = k.args[e.arg]
        size = itemsize(program.dtype_of(ref))
        lines = -(-bn * size // 128)
        extent = program.buffers[ref.buffer].numel
        s0, _, s2, s3 = e.strides
        out.append(f"""
  for (int q = tid; q < {bm * lines}; q += {threads}) {{  // this block's tile of {names[e.arg]} into L2
    const {ityp} p = p0 + q / {lines};
    const {ityp} ow = p % {wo}, oh = (p / {wo}) % {ho}, nb = p / {wo * ho};
    const long long at = {e.offset} + (long long)nb * {s0} + (long long)oh * {s2} + (long long)ow * {s3}
                         + n0 + (q % {lines}) * {128 // size};
    if (p < {p_total} && at < {extent})
      asm volatile("prefetch.global.L2 [%0];" :: "l"({names[e.arg]} + at));
  }}""")
    return "".join(dict.fromkeys(out))


def _quad_load(e: X.Expr, program: CompiledProgram, k: KernelCall) -> bool:
    """An epilogue load of 2-byte elements whose 4 channels from a multiple of 4 are one aligned 8-byte run."""
    return (isinstance(e, X.Load) and len(e.strides) == 4 and e.strides[1] == 1 and not e.rstrides
            and e.dtype in _OPERANDS and program.dtype_of(k.args[e.arg]) == e.dtype
            and e.offset % 4 == 0 and all(s % 4 == 0 for s in (e.strides[0], e.strides[2], e.strides[3])))


def _quad_load_lines(e: X.Load, n: int, name: str) -> str:
    """Lines that load 4 channels of `name` at (nb, co4, oh, ow) into this lane (zeros where `in` fails) and hand
    out `rv{n}[hf][j][e]` and `rv{n}[hf][j + 1][e]`: channel 2q + e of the column group j (held by lane q / 2 of
    the quad) and of the group j + 1 (lane 2 + q / 2)."""
    at = affine([("nb", e.strides[0]), ("co4", 1), ("oh", e.strides[2]), ("ow", e.strides[3])], e.offset)
    to_f = "__half2float(__ushort_as_half" if e.dtype == "float16" else "__bfloat162float(__ushort_as_bfloat16"
    return f"""
        {{
          const uint2 v = in ? *reinterpret_cast<const uint2*>({name} + ({at})) : make_uint2(0u, 0u);
          const int lo = (lane & ~3) | (q >> 1), hi = lo | 2;
          const unsigned lx = __shfl_sync(0xffffffffu, v.x, lo), ly = __shfl_sync(0xffffffffu, v.y, lo);
          const unsigned hx = __shfl_sync(0xffffffffu, v.x, hi), hy = __shfl_sync(0xffffffffu, v.y, hi);
          const unsigned r0 = (q & 1) ? ly : lx, r1 = (q & 1) ? hy : hx;
          rv{n}[hf][j][0] = {to_f}((unsigned short)(r0 & 0xffffu)));
          rv{n}[hf][j][1] = {to_f}((unsigned short)(r0 >> 16)));
          rv{n}[hf][j + 1][0] = {to_f}((unsigned short)(r1 & 0xffffu)));
          rv{n}[hf][j + 1][1] = {to_f}((unsigned short)(r1 >> 16)));
        }}"""


def _weight_prefetch(w: TensorRef, bn: int, bk: int, per_split: int, o_total: int, k_total: int, threads: int) -> str:
    """Lines, before the wait on the kernel before, that bring into L2 the weights of this block's channel tile and K
    split, in the blocks of the first pixel tile only (each weight line once): where the tiles are few (one image),
    a conv is mostly the latency of its weight loads, and this overlaps them with the kernel before. For a weight
    kept [O, kh, kw, C] (each output channel's K one run)."""
    span = per_split * bk
    return f"""
  if (blockIdx.y == 0) {{  // this (channel tile, split)'s weights into L2 while the kernel before finishes
    const int k_lo = blockIdx.z * {span}, k_hi = min({k_total}, k_lo + {span});
    const int lines = (k_hi - k_lo + 63) / 64;
    for (int q = threadIdx.x; q < {bn} * lines; q += {threads}) {{
      const long long co = (long long)blockIdx.x * {bn} + q / lines;
      if (co < {o_total})
        asm volatile("prefetch.global.L2 [%0];" :: "l"(w + {w.offset} + co * {w.strides[0]} + k_lo + (q % lines) * 64));
    }}
  }}"""


def conv2d_tc(k: KernelCall, program: CompiledProgram, render_epilogue, ityp: str, signature,
              names: list[str], dev) -> list[tuple[str, Launch]]:
    """The kernel's source and launch, and for a K split across blocks outside a cluster the launch that sums the
    splits and applies the epilogue. `signature(threads, min_blocks, cluster_z)` gives the declaration;
    `render_epilogue` and `names` render the record's epilogue as the other library kernels do."""
    spec: Conv2dKernel = k.spec
    x, w, out = k.args[0], k.args[1], k.outs[0]
    _, c, h, wd = x.shape
    _, _, kh, kw = w.shape
    _, _, ho, wo = out.shape
    sh, sw = spec.stride
    ph, pw = spec.padding
    dh, dw = spec.dilation
    p_total, o_total, k_total = _geometry(x.shape, w.shape, out.shape)
    wide = wide_tiles(dev, c)
    side = bool(spec.side_stride)  # (side_fits: unsplit, both tiles 16-byte copies, K2 a multiple of bk)
    bm, bn, wm_, wn_ = tile_for(p_total, o_total, dev, wide)
    od = program.dtype_of(out)
    xs, ws, os_ = x.strides, w.strides, out.strides
    vec_a, vec_b = pixels_vectorizable(x), weight_vectorizable(w)
    bk = k_step(p_total, o_total, vec_a and vec_b, dev, wide)
    splits = plan_of(k).splits
    cluster = in_cluster(splits, dev)
    x2, w2 = (k.args[spec.side_first_arg], k.args[spec.side_first_arg + 1]) if side else (x, w)
    k2 = x2.shape[1] if side else 0
    wgmma = uses_wgmma(p_total, o_total, splits, vec_a and vec_b, dev)
    if wgmma and not side and tall_tiles(p_total, o_total, dev):
        bm, bn, wm_, wn_ = TALL_TILE
    warps_n = bn // wn_
    threads = 32 * (bm // wm_) * warps_n
    o_tiles = -(-o_total // bn)
    one_wave = not side and -(-p_total // bm) * o_tiles * splits <= dev.multiprocessors
    if side:
        stages = SIDE_STAGES
    elif one_wave and wgmma:
        stages = one_wave_stages(bm, bn, bk, dev)
    elif one_wave:
        k_tiles = -(-k_total // bk)
        stages = latency_stages(bm, bn, bk, -(-k_tiles // splits), dev)
    else:
        stages = STAGES
    smem = smem_bytes(p_total, o_total, bk, dev, cluster, wide, stages)
    cpr = bk // 8  # 16-byte copies per tile row
    # pixels read element by element: through a shared-memory window where it fits (conv_window.py)
    grid_blocks = max(1, dev.multiprocessors * conv_window.GRID_BLOCKS // o_tiles)
    win = None if vec_a or splits > 1 else conv_window.plan(x, w.shape, out.shape, spec.stride, spec.padding,
                                                             spec.dilation, bm, bn, bk,
                                                             dev.shared_memory_per_block_optin, grid_blocks)
    if wgmma:
        # two warpgroups, each the m64 x BN product of its 64 rows: a warp holds 16 rows of all BN columns (the
        # accumulators in the m16n8 fragment order, BN / 8 groups). The tiles in shared memory are the MMA's
        # K-major layout with the 128-byte swizzle: a row's 64 K values one 128-byte line, 8 rows one 1,024-byte
        # atom, the 16-byte chunk c of row r at chunk c ^ (r % 8) of its line (without the swizzle, the MMA's reads
        # of 8 rows 1,024 bytes apart fell on the same banks: the convs ran at half the speed of mma.sync)
        wm_, wn_, warps_n = 16, bn, 1
        row_h = bk
        smem = (bm + bn) * bk * 2 * stages
        tpg = 8 * cpr  # threads that copy one group of 8 rows

        def row_of(i: str) -> str:
            return f"((tid / {tpg}) * 8 + (tid & 7) + {i} * {threads // tpg * 8})"

        chunk = f"((tid >> 3) % {cpr})"

        def at(row: str, ch: str) -> str:
            return swizzled_at(row, ch)
    else:
        row_h = bk + _PAD

        def row_of(i: str) -> str:
            return f"(tid / {cpr} + {i} * {threads // cpr})"

        chunk = f"(tid % {cpr})"

        def at(row: str, ch: str) -> str:
            return f"({row}) * {row_h} + ({ch}) * 8"
    a_stage, b_stage, mi_n, mma_steps, ni_n, side_first, side_word, smem = _mma_parts(bm=bm, bn=bn, k2=k2, row_h=row_h,
        side=side, smem=smem, threads=threads, wm_=wm_, wn_=wn_)

    a_load, a_setup, b_load = _tile_loaders(a_stage=a_stage, at=at, b_stage=b_stage, bk=bk, bm=bm, bn=bn, c=c,
        chunk=chunk, dh=dh, dw=dw, h=h, ho=ho, ityp=ityp, k2=k2, k_total=k_total, kw=kw, o_total=o_total,
        p_total=p_total, ph=ph, pw=pw, row_h=row_h, row_of=row_of, sh=sh, side=side, side_first=side_first, spec=spec,
        stages=stages, sw=sw, threads=threads, vec_a=vec_a, vec_b=vec_b, w=w, w2=w2, wd=wd, wo=wo, ws=ws, x=x, x2=x2,
        xs=xs)

    (as_bits, bias_load, epilogue_lines, kt_side, kt_total, one_output, per_split, prefetch, quad, store,
     w_prefetch) = _epilogue_prep(
        bk=bk, bm=bm, bn=bn, ho=ho, ityp=ityp, k=k, k2=k2, k_total=k_total, names=names, ni_n=ni_n, o_total=o_total,
        od=od, os_=os_, out=out, program=program, render_epilogue=render_epilogue, side=side, spec=spec, splits=splits,
        threads=threads, vec_b=vec_b, w=w, wo=wo)
    if cluster:
        epilogue_src = _cluster_epilogue(bm=bm, bn=bn, ityp=ityp, mi_n=mi_n, ni_n=ni_n, o_total=o_total,
            one_output=one_output, p_total=p_total, splits=splits, threads=threads, wm_=wm_, wn_=wn_)
    elif splits > 1:
        epilogue_src = _scratch_epilogue(mi_n=mi_n, ni_n=ni_n, o_total=o_total, p_total=p_total, wm_=wm_, wn_=wn_)
    else:
        epilogue_src = _tile_epilogue(as_bits=as_bits, bias_load=bias_load, epilogue_lines=epilogue_lines, ho=ho,
            ityp=ityp, k=k, mi_n=mi_n, names=names, ni_n=ni_n, o_total=o_total, od=od, os_=os_, out=out,
            p_total=p_total, program=program, quad=quad, side=side, side_word=side_word, spec=spec, store=store,
            win=win, wm_=wm_, wn_=wn_, wo=wo)

    ptrs = ptrs_of(k)
    if win is not None:  # its own kernel around the same products and epilogue
        w_affine = affine([("co", ws[0]), ("cc", ws[1]), ("kr", ws[2]), ("ks", ws[3])], w.offset)
        src = _windowed(win, x, (h, ho, wo, sh, ph, kh, dh), (c, wd, kw, sw, pw, dw), signature, threads, bm, bn,
                        ityp=ityp, p_total=p_total, o_total=o_total, k_total=k_total,
                        warps_n=warps_n, mi_n=mi_n, ni_n=ni_n, od=od, w_affine=w_affine,
                        weight_early=program.buffers[w.buffer].kind == "weight", prefetch=prefetch,
                        mma=mma_steps(win.kp, win.kp + conv_window.PAD), epilogue=epilogue_src)
        return [(src, Launch((o_tiles, grid_blocks, 1), threads, ptrs, win.smem))]
    src = _main_source(a_load=a_load, a_setup=a_setup, a_stage=a_stage, as_bits=as_bits, b_load=b_load, b_stage=b_stage,
        bk=bk, bm=bm, bn=bn, cluster=cluster, epilogue_src=epilogue_src, ityp=ityp, k=k, k2=k2, kt_side=kt_side,
        kt_total=kt_total, mi_n=mi_n, mma_steps=mma_steps, ni_n=ni_n, o_total=o_total, od=od, per_split=per_split,
        prefetch=prefetch, program=program, row_h=row_h, side=side, side_word=side_word, signature=signature, spec=spec,
        splits=splits, stages=stages, threads=threads, vec_b=vec_b, w=w, w2=w2, w_prefetch=w_prefetch, warps_n=warps_n,
        wgmma=wgmma, wn_=wn_)
    main = (src, Launch((o_tiles, -(-p_total // bm), splits), threads, ptrs, smem))
    if splits == 1 or cluster:
        return [main]
    return _split_sum(dev=dev, ityp=ityp, main=main, o_total=o_total, one_output=one_output, p_total=p_total, ptrs=ptrs,
        signature=signature, splits=splits)


def _mma_parts(*, bm, bn, k2, row_h, side, smem, threads, wm_, wn_):
    """The warp's products over the staged tiles, the side conv's loader order and the corner guards."""
    mi_n, ni_n = wm_ // 16, wn_ // 8
    a_stage, b_stage = bm * row_h, bn * row_h

    def side_first(tile: str, per: int, copy: str) -> str:
        """The loader of a tile (`load_a` / `load_b`) where a side conv's K tiles come first: its copies (`copy`,
        the i-th of `per`, at K `kg`), then `load_main_<tile>` for the conv's."""
        return f"""
  auto load_{tile} = [&](int st, int kg) {{  // the side conv's K first, then the conv's
    if (kg >= {k2}) {{ load_main_{tile}(st, kg - {k2}); return; }}
    #pragma unroll
    for (int i = 0; i < {per}; ++i) {{{copy}
    }}
  }};"""
    # the side's rounded results: each thread's own words of shared memory after the stages (see SIDE_STAGES)
    side_word = f"sdp[((i * {ni_n} + j) * 2 + hf) * {threads} + tid]"
    if side:
        smem += mi_n * ni_n * 2 * threads * 4

    def mma_steps(k_len: int, stride: int) -> str:
        """The warp's products over `k_len` K of the tiles at `As` and `Bs` (rows `stride` halfs apart)."""
        return f"""
    #pragma unroll
    for (int kk = 0; kk < {k_len}; kk += 16) {{
      unsigned af[{mi_n}][4], bf[{ni_n // 2}][4];
      #pragma unroll
      for (int i = 0; i < {mi_n}; ++i)
        tc_ldsm(af[i], &As[(wm * {wm_} + i * 16 + (lane & 15)) * {stride} + kk + (lane >> 4) * 8]);
      #pragma unroll
      for (int j = 0; j < {ni_n // 2}; ++j)
        tc_ldsm(bf[j], &Bs[(wn * {wn_} + j * 16 + (lane & 7) + ((lane >> 4) << 3)) * {stride} + kk
                           + ((lane >> 3) & 1) * 8]);
      #pragma unroll
      for (int i = 0; i < {mi_n}; ++i)
        #pragma unroll
        for (int j = 0; j < {ni_n}; ++j) tc_mma(acc[i][j], af[i], bf[j >> 1][(j & 1) * 2], bf[j >> 1][(j & 1) * 2 + 1]);
    }}"""
    return a_stage, b_stage, mi_n, mma_steps, ni_n, side_first, side_word, smem


def _tile_loaders(*, a_stage, at, b_stage, bk, bm, bn, c, chunk, dh, dw, h, ho, ityp, k2, k_total, kw, o_total, p_total,
    ph, pw, row_h, row_of, sh, side, side_first, spec, stages, sw, threads, vec_a, vec_b, w, w2, wd, wo, ws, x, x2, xs):
    """The loaders of the pixel tile (A) and the weight tile (B): 16-byte copies, a window, or element by element."""
    def corners(first_row: str, comment: str) -> str:
        """This thread's pixels (rows `first_row` of every input tile, an expression of i < per) and their
        windows' corners, found once."""
        return f"""{comment}
  {ityp} a_base[{per}]; int a_ih[{per}], a_iw[{per}];
  #pragma unroll
  for (int i = 0; i < {per}; ++i) {{
    const {ityp} p = p0 + {first_row};
    const {ityp} ow = p % {wo}, oh = (p / {wo}) % {ho}, nb = p / {wo * ho};
    a_ih[i] = p < {p_total} ? (int)(oh * {sh} - {ph}) : -{2 ** 30};
    a_iw[i] = (int)(ow * {sw} - {pw});
    a_base[i] = {x.offset} + nb * {xs[0]} + oh * {sh * xs[2]} + ow * {sw * xs[3]} - {ph * xs[2] + pw * xs[3]};
  }}"""

    # ---- the input tile (A: BM pixels x BK, [p][k]) ----
    if vec_a:
        per = bm * bk // 8 // threads
        a_setup = corners(row_of("i"), "\n  // this thread's pixel rows of every input tile (16-byte copies, BK / 8 "
                                        "per row) and their windows' corners")
        if side:
            xs2 = x2.strides
            s2h, s2w = spec.side_stride
            a_setup += f"""
  // and the side conv's pixels (a 1x1 window of stride {s2h} x {s2w}: inside its image wherever the pixel is)
  {ityp} s_base[{per}];
  #pragma unroll
  for (int i = 0; i < {per}; ++i) {{
    const {ityp} p = p0 + {row_of("i")};
    const {ityp} ow = p % {wo}, oh = (p / {wo}) % {ho}, nb = p / {wo * ho};
    s_base[i] = {x2.offset} + nb * {xs2[0]} + oh * {s2h * xs2[2]} + ow * {s2w * xs2[3]};
  }}"""
        a_load = f"""
  auto load_{"main_" if side else ""}a = [&](int st, int k0) {{
    const int kx = k0 + {chunk} * 8;
    {conv_window.window_position("kx", c, kw)}
    #pragma unroll
    for (int i = 0; i < {per}; ++i) {{
      const int ih = a_ih[i] + kr * {dh}, iw = a_iw[i] + ks * {dw};
      const bool full = kx < {k_total} && ih >= 0 && ih < {h} && iw >= 0 && iw < {wd};
      const unsigned short* src = xt + (full ? a_base[i] + cc + ({ityp})(kr * {dh}) * {xs[2]}
                                               + ({ityp})(ks * {dw}) * {xs[3]} : 0);
      tc_cp16(&smem[st * {a_stage} + {at(row_of("i"), chunk)}], src, full);
    }}
  }};"""
        if side:
            a_load += side_first("a", per, f"""
      const bool full = a_ih[i] > -{2 ** 29};
      const unsigned short* src = x2t + (full ? s_base[i] + kg + {chunk} * 8 : 0);
      tc_cp16(&smem[st * {a_stage} + {at(row_of("i"), chunk)}], src, full);""")
    else:
        per = bm * bk // threads
        # this thread's pixels (the same rows of every tile) and their windows' corners, found once: each element
        # then costs two bounds checks and a load
        a_setup = corners(f"tid / {bk} + i * {threads // bk}", "")
        a_load = f"""
  auto load_a = [&](int st, int k0) {{  // element by element (any strides)
    const int kx = k0 + (tid % {bk});
    {conv_window.window_position("kx", c, kw)}
    const {ityp} koff = ({ityp})cc * {xs[1]} + ({ityp})(kr * {dh}) * {xs[2]} + ({ityp})(ks * {dw}) * {xs[3]};
    #pragma unroll
    for (int i = 0; i < {per}; ++i) {{
      const int ih = a_ih[i] + kr * {dh}, iw = a_iw[i] + ks * {dw};
      const bool ok = kx < {k_total} && ih >= 0 && ih < {h} && iw >= 0 && iw < {wd};
      smem[st * {a_stage} + (tid / {bk} + i * {threads // bk}) * {row_h} + (tid % {bk})] =
          ok ? xt[a_base[i] + koff] : (unsigned short)0;
    }}
  }};"""

    # ---- the weight tile (B: BN output channels x BK, [o][k]) ----
    if vec_b:
        per = -(-bn * bk // 8 // threads)  # (three warpgroups copy 128 rows in 2 2/3 rounds: the last is guarded)
        past = f"\n      if (row >= {bn}) break;" if bn * bk // 8 % threads else ""
        b_load = f"""
  auto load_{"main_" if side else ""}b = [&](int st, int k0) {{
    #pragma unroll
    for (int i = 0; i < {per}; ++i) {{
      const int row = {row_of("i")}, kc = {chunk} * 8;{past}
      const bool full = n0 + row < {o_total} && k0 + kc < {k_total};
      const unsigned short* src = wt + (full ? {w.offset} + ({ityp})(n0 + row) * {k_total} + k0 + kc : 0);
      tc_cp16(&smem[{stages * a_stage} + st * {b_stage} + {at("row", chunk)}], src, full);
    }}
  }};"""
        if side:
            b_load += side_first("b", per, f"""
      const int row = {row_of("i")}, kc = {chunk} * 8;
      const bool full = n0 + row < {o_total};
      const unsigned short* src = w2t + (full ? {w2.offset} + ({ityp})(n0 + row) * {k2} + kg + kc : 0);
      tc_cp16(&smem[{stages * a_stage} + st * {b_stage} + {at("row", chunk)}], src, full);""")
    else:
        per = bn * bk // threads
        b_load = f"""
  auto load_b = [&](int st, int k0) {{  // element by element (any strides)
    const int kx = k0 + (tid % {bk});
    {conv_window.window_position("kx", c, kw)}
    #pragma unroll 4
    for (int i = 0; i < {per}; ++i) {{
      const int row = tid / {bk} + i * {threads // bk};
      const {ityp} co = n0 + row;
      const bool ok = co < {o_total} && kx < {k_total};
      smem[{stages * a_stage} + st * {b_stage} + row * {row_h} + (tid % {bk})] =
          ok ? wt[{affine([("co", ws[0]), ("cc", ws[1]), ("kr", ws[2]), ("ks", ws[3])], w.offset)}]
             : (unsigned short)0;
    }}
  }};"""
    return a_load, a_setup, b_load


def _epilogue_prep(*, bk, bm, bn, ho, ityp, k, k2, k_total, names, ni_n, o_total, od, os_, out, program,
    render_epilogue, side, spec, splits, threads, vec_b, w, wo):
    """What the epilogues share: prefetches, the output's address, the bias, the stores of two channels."""
    prefetch = _residual_prefetch(k, program, names, ityp, bm, bn, threads, (ho, wo)) if splits == 1 else ""
    kt_side = k2 // bk
    kt_total = kt_side + -(-k_total // bk)
    per_split = -(-kt_total // splits)
    w_prefetch = _weight_prefetch(w, bn, bk, per_split, o_total, k_total, threads) if vec_b else ""

    # ---- epilogue: straight from the accumulators (staging the tile through shared memory, so that each warp
    # reads the residual and writes the output in 128-byte runs, measured slower on the H100: 251 against 166 us for
    # ResNet-50's 1x1 expansions with a residual at batch 64; exchanging values in a quad of lanes instead: 117 us) ----
    o_at = affine([("nb", os_[0]), ("co", os_[1]), ("oh", os_[2]), ("ow", os_[3])], out.offset)
    bias_load = ""
    if spec.bias:
        bias = k.args[2]
        b_at = affine([("co", bias.strides[0])], bias.offset)
        bias_load = load_expr(program.dtype_of(bias), "bias[" + b_at + "]")

    def epilogue_lines(expr: X.Expr | None, accs: list[str], bias_value: str) -> str:
        """One output's epilogue (in `v` its sum, `e` its channel of the pair): bias, the record's expression (its
        Acc groups: the conv's rounded result, then any values loaded ahead), the value in `sv[e]`."""
        lines = [f"            v += {bias_value};"] if spec.bias else []
        value, value_dtype = "v", "float32"
        if expr is not None:
            # the epilogue reads the conv's result as the unfused graph stored it: rounded to the output dtype
            lines.append(f"            const float accv = {round_expr('v', od)};")
            lines.append(f"            const {ityp} o0 = nb, o1 = co, o2 = oh, o3 = ow;")
            ep_lines, value = render_epilogue(expr, k, program, names, accs, ityp, "            ")
            lines += ep_lines
            value_dtype = expr.dtype
        lines.append(f"            sv[e] = {store_expr(od, value, value_dtype)};")
        return "\n".join(lines)

    # (the split paths': a side conv is never split)
    epilogue = "" if side else epilogue_lines(spec.epilogue, ["accv"], bias_load)
    as_bits = "__half_as_ushort" if od == "float16" else "__bfloat16_as_ushort"
    pair = (os_[1] == 1 and out.offset % 2 == 0 and o_total % 2 == 0
            and all(s % 2 == 0 for s in (os_[0], os_[2], os_[3])))
    if pair:  # channels-last: the two channels are neighbours, one 4-byte store
        at0 = affine([("nb", os_[0]), ("co0", os_[1]), ("oh", os_[2]), ("ow", os_[3])], out.offset)
        store = (f"        *reinterpret_cast<unsigned*>(out0 + ({at0})) = "
                 f"(unsigned){as_bits}(sv[0]) | ((unsigned){as_bits}(sv[1]) << 16);")
    else:
        store = (f"        for (int e = 0; e < 2; ++e) {{ const {ityp} co = co0 + e; "
                 f"if (co < {o_total}) out0[{o_at}] = sv[e]; }}")
    store = store.replace("sv[", "res[hf][j][")
    # channels-last with whole groups of 16 channels and 8-byte aligned rows: a quad's lanes store 4 channels each
    quad = (pair and o_total % 16 == 0 and out.offset % 4 == 0 and ni_n % 2 == 0
            and all(s % 4 == 0 for s in (os_[0], os_[2], os_[3])))
    # the epilogue of one output from its sum over the splits: the cluster's and the second launch's
    one_output = f"""    const {ityp} ow = p % {wo}, oh = (p / {wo}) % {ho}, nb = p / {wo * ho};
    {storage(od)} sv[1];
    {{
      const int e = 0;
{epilogue}
    }}
    out0[{o_at}] = sv[0];"""
    return (as_bits, bias_load, epilogue_lines, kt_side, kt_total, one_output, per_split, prefetch, quad, store,
            w_prefetch)


def _cluster_epilogue(*, bm, bn, ityp, mi_n, ni_n, o_total, one_output, p_total, splits, threads, wm_, wn_):
    """A cluster's split: each block's part in its shared memory, the tile summed over the cluster's blocks in split
    order."""
    # each split's part of the tile goes to its own shared memory (the stages, done with); after the cluster's
    # barrier every block sums a share of the tile's outputs over the parts of all splits, in split order (the
    # sum of the scratch path, to the bit), and stores them; the second barrier keeps every block's shared
    # memory alive until the others have read it
    rw = bn + _RED_PAD
    epilogue_src = f"""
  tc_wait<0>();
  __syncthreads();  // every warp is done with the stages: they hold this split's part now
  float* part = reinterpret_cast<float*>(smem);
  #pragma unroll
  for (int i = 0; i < {mi_n}; ++i)
    #pragma unroll
    for (int hf = 0; hf < 2; ++hf) {{
      const int r = wm * {wm_} + i * 16 + (lane >> 2) + hf * 8;
      #pragma unroll
      for (int j = 0; j < {ni_n}; ++j) {{
        const int cc = wn * {wn_} + j * 8 + (lane & 3) * 2;
        *reinterpret_cast<float2*>(part + r * {rw} + cc) = make_float2(acc[i][j][hf * 2], acc[i][j][hf * 2 + 1]);
      }}
    }}
  tc_cluster_sync();
  const unsigned part_at = (unsigned)__cvta_generic_to_shared(part);
  for (int idx = (int)tc_cluster_rank() * {threads} + tid; idx < {bm * bn}; idx += {splits * threads}) {{
    const int r = idx / {bn}, cc = idx % {bn};
    const {ityp} p = p0 + r, co = n0 + cc;
    if (p >= {p_total} || co >= {o_total}) continue;
    const unsigned at = part_at + (unsigned)(r * {rw} + cc) * 4u;
    float v = 0.0f;
    #pragma unroll
    for (int z = 0; z < {splits}; ++z) v += tc_cluster_load(at, z);
{one_output}
  }}
  tc_cluster_sync();"""
    return epilogue_src


def _scratch_epilogue(*, mi_n, ni_n, o_total, p_total, wm_, wn_):
    """A split's parts written to the float32 scratch (the second launch sums them)."""
    # this split's part of every output, in float32, to the scratch ([split][pixel][channel]); the second launch
    # sums the parts in split order (the same result on every run) and applies bias and epilogue
    two = o_total % 2 == 0
    write = ("*reinterpret_cast<float2*>(part + at) = make_float2(acc[i][j][hf * 2], acc[i][j][hf * 2 + 1]);"
             if two else
             f"part[at] = acc[i][j][hf * 2]; if (co0 + 1 < {o_total}) part[at + 1] = acc[i][j][hf * 2 + 1];")
    epilogue_src = f"""
  tc_wait<0>();
  float* part = out1 + (long long)blockIdx.z * {p_total * o_total};
  #pragma unroll
  for (int i = 0; i < {mi_n}; ++i)
    #pragma unroll
    for (int hf = 0; hf < 2; ++hf) {{
      const long long p = p0 + wm * {wm_} + i * 16 + (lane >> 2) + hf * 8;
      if (p >= {p_total}) continue;
      #pragma unroll
      for (int j = 0; j < {ni_n}; ++j) {{
        const long long co0 = n0 + wn * {wn_} + j * 8 + (lane & 3) * 2;
        if (co0 >= {o_total}) continue;
        const long long at = p * {o_total} + co0;
        {write}
      }}
    }}"""
    return epilogue_src


def _tile_epilogue(*, as_bits, bias_load, epilogue_lines, ho, ityp, k, mi_n, names, ni_n, o_total, od, os_, out,
    p_total, program, quad, side, side_word, spec, store, win, wm_, wn_, wo):
    """The epilogue of an unsplit tile: bias, the record's epilogue, stores of 2 or 4 neighbouring channels a lane."""
    # the columns 32 at a time (the warpgroup MMA's 128: its outputs, residual and bias at once would spill)
    jc_n = min(ni_n, 4)
    # a row group's outputs first, then their stores: in one pass a residual's load came after the store before
    # it (the output pointer may alias it as far as the compiler knows), so the loads went one at a time; the
    # bias of the thread's channels loaded once, not again for every row. With the quad's exchanges below,
    # ResNet-50 at batch 64 on the H100: 3.92 -> 3.53 ms (its 1x1 expansions with a residual 165 -> 117 us)
    def rows_of(guarded: bool, step: int) -> str:
        """The loops over the thread's two rows of the row group `i` (`p` its pixel, `nb`, `oh`, `ow`; a row past
            the pixels skipped where `guarded`) and over the column groups `j` of the chunk `jc`, `step` at a time."""
        skip = f"\n      if (p >= {p_total}) continue;" if guarded else ""
        return f"""    #pragma unroll
    for (int hf = 0; hf < 2; ++hf) {{
      const {ityp} p = p0 + wm * {wm_} + i * 16 + (lane >> 2) + hf * 8;{skip}
      const {ityp} ow = p % {wo}, oh = (p / {wo}) % {ho}, nb = p / {wo * ho};
      #pragma unroll
      for (int j = jc; j < jc + {jc_n}; {"++j" if step == 1 else f"j += {step}"}) {{"""

    if quad:
        # two column groups' outputs (16 channels of a row, 2 in each of a quad's lanes, a group 8 channels
        # apart) exchanged in the quad so that each lane stores 4 neighbouring channels: a row's 32 bytes in
        # one store of the quad, where a 4-byte store a lane filled half of each 32-byte sector (the shuffles
        # come before the row's bounds test: every lane takes part)
        at4 = affine([("nb", os_[0]), ("co4", 1), ("oh", os_[2]), ("ow", os_[3])], out.offset)
        quad_lanes = """
  const int q = lane & 3, s1 = (lane & ~3) | ((2 * q) & 3), s2 = s1 | 1;"""
        stores = f"""
{rows_of(False, 2)}
        const unsigned a = (unsigned){as_bits}(res[hf][j][0]) | ((unsigned){as_bits}(res[hf][j][1]) << 16);
        const unsigned b = (unsigned){as_bits}(res[hf][j + 1][0]) | ((unsigned){as_bits}(res[hf][j + 1][1]) << 16);
        const unsigned a1 = __shfl_sync(0xffffffffu, a, s1), b1 = __shfl_sync(0xffffffffu, b, s1);
        const unsigned a2 = __shfl_sync(0xffffffffu, a, s2), b2 = __shfl_sync(0xffffffffu, b, s2);
        const {ityp} co4 = n0 + wn * {wn_} + j * 8 + q * 4;
        if (p < {p_total} && co4 < {o_total})
          *reinterpret_cast<uint2*>(out0 + ({at4})) = q < 2 ? make_uint2(a1, a2) : make_uint2(b1, b2);
      }}
    }}"""
    else:
        quad_lanes = ""
        stores = f"""
{rows_of(True, 1)}
        const {ityp} co0 = n0 + wn * {wn_} + j * 8 + (lane & 3) * 2;
        if (co0 >= {o_total}) continue;
{store}
      }}
    }}"""
    # the epilogue's channels-last reads of the output's own elements (a residual) loaded as the stores go:
    # 4 channels a lane, handed to the lanes that hold them (a 2-byte load a value read half of each sector)
    ahead = [e for e in dict.fromkeys(X.walk(spec.epilogue)) if _quad_load(e, program, k)] if (
        quad and spec.epilogue is not None) else []
    sub = {e: X.Acc(e.dtype, spec.acc_groups + n) for n, e in enumerate(ahead)}
    main_expr = (X.substitute(spec.epilogue, lambda e: sub.get(e) if isinstance(e, X.Load) else None)
                 if ahead else spec.epilogue)
    from_bits = "__ushort_as_half" if od == "float16" else "__ushort_as_bfloat16"
    side_acc = [load_expr(od, f"{from_bits}((unsigned short)({side_word} >> (16 * e)))")] if side else []
    main_epilogue = epilogue_lines(main_expr, ["accv", *side_acc] + [f"rv{n}[hf][j][e]" for n in range(len(ahead))],
                                   "bv[j][e]")
    loads_ahead = "".join(_quad_load_lines(e, n, names[e.arg]) for n, e in enumerate(ahead))
    rv_decl = "".join(f"\n    float rv{n}[2][{ni_n}][2];" for n in range(len(ahead)))
    if loads_ahead:
        loads_ahead = f"""
{rows_of(False, 2)}
        const {ityp} co4 = n0 + wn * {wn_} + j * 8 + q * 4;
        const bool in = p < {p_total} && co4 < {o_total};{loads_ahead}
      }}
    }}"""
    bias_lines = ""
    if spec.bias:
        bias_lines = f"""
  float bv[{ni_n}][2];
  #pragma unroll
  for (int j = jc; j < jc + {jc_n}; ++j)
    #pragma unroll
    for (int e = 0; e < 2; ++e) {{
      const {ityp} co = n0 + wn * {wn_} + j * 8 + (lane & 3) * 2 + e;
      bv[j][e] = co < {o_total} ? {bias_load} : 0.0f;
    }}"""
    # a windowed conv's next window copies stay in flight through the epilogue
    drain = "" if win is not None else "\n  tc_wait<0>();"
    epilogue_src = f"""{drain}{quad_lanes}
  #pragma unroll
  for (int jc = 0; jc < {ni_n}; jc += {jc_n}) {{{bias_lines}
  #pragma unroll
  for (int i = 0; i < {mi_n}; ++i) {{
    {storage(od)} res[2][{ni_n}][2];{rv_decl}{loads_ahead}
{rows_of(True, 1)}
        const {ityp} co0 = n0 + wn * {wn_} + j * 8 + (lane & 3) * 2;
        if (co0 >= {o_total}) continue;
        {storage(od)}* sv = res[hf][j];
        #pragma unroll
        for (int e = 0; e < 2; ++e) {{
          const {ityp} co = co0 + e;
          float v = acc[i][j][hf * 2 + e];
          if (co < {o_total}) {{
{main_epilogue}
          }}
        }}
      }}
    }}
{stores}
  }}
  }}"""
    return epilogue_src


def _main_source(*, a_load, a_setup, a_stage, as_bits, b_load, b_stage, bk, bm, bn, cluster, epilogue_src, ityp, k, k2,
    kt_side, kt_total, mi_n, mma_steps, ni_n, o_total, od, per_split, prefetch, program, row_h, side, side_word,
    signature, spec, splits, stages, threads, vec_b, w, w2, w_prefetch, warps_n, wgmma, wn_):
    """The kernel's source: its copies into the stages, the main loop over K (mma.sync or the warpgroup MMA), the
    epilogue."""
    # the weight tiles of the first stages are copied before the wait for the kernel ahead, where the weight is a
    # weight buffer (no kernel writes one: memory_check.check_read_only): one image's convs are latency-bound, and
    # their weights' trip to shared memory then overlaps the kernel before (their first stage commits with A's)
    early_b = vec_b and all(program.buffers[r.buffer].kind == "weight" for r in (w, w2))
    side_done = ""
    if side:
        b2_value = "0.0f"
        if spec.side_bias:
            b2 = k.args[spec.side_first_arg + 2]
            b2_value = load_expr(program.dtype_of(b2), "bias2[" + affine([("co", b2.strides[0])], b2.offset) + "]")
        # between the side's loop and the conv's on the warpgroup MMA, at the conv's first tile on mma.sync
        side_done = f"""
    {"" if wgmma else f"if (kt == {kt_side}) "}{{  // the side conv's sums are complete: kept rounded (with its bias),
      // and the conv's start from 0
      #pragma unroll
      for (int i = 0; i < {mi_n}; ++i)
        #pragma unroll
        for (int j = 0; j < {ni_n}; ++j)
          #pragma unroll
          for (int hf = 0; hf < 2; ++hf) {{
            unsigned bits = 0u;
            #pragma unroll
            for (int e = 0; e < 2; ++e) {{
              const {ityp} co = n0 + wn * {wn_} + j * 8 + (lane & 3) * 2 + e;
              const float v = acc[i][j][hf * 2 + e] + (co < {o_total} ? {b2_value} : 0.0f);
              bits |= (unsigned){as_bits}({store_expr(od, "v")}) << (16 * e);
              acc[i][j][hf * 2 + e] = 0.0f;
            }}
            {side_word} = bits;
          }}
    }}"""
    def copies(main_only: bool = False) -> str:
        """The copies of the tile STAGES - 1 ahead (past the side conv's tiles: the conv's loads alone, so that the
        side's pixel offsets are not kept alive through the conv's loop)."""
        la, lb, at_k = ("load_main_a", "load_main_b", f"(kt_b + nx) * {bk} - {k2}") if main_only else \
            ("load_a", "load_b", f"(kt_b + nx) * {bk}")
        return f"""    const int nx = kt + {stages - 1};
    if (nx < kt_n) {{ {la}(nx % {stages}, {at_k}); {lb}(nx % {stages}, {at_k}); }}
    tc_commit();"""

    next_copies = copies()
    if wgmma:
        # each warpgroup issues its rows' products of the tile (K 16 at a time: the descriptors' start moves 32
        # bytes within the swizzled 128-byte rows) and waits for those of the tile before; after the second barrier
        # no warpgroup reads that tile's stage, which the next copies then overwrite. The last products are waited
        # for after the loop.
        # With a side conv, its tiles are a loop of their own: its sums are read after a wait outside the loops
        # (reading or restarting them between two tiles' products would serialize every product: ptxas C7515)
        def tiles(lo: str, hi: str, main_only: bool = False) -> str:
            return f"""  for (int kt = {lo}; kt < {hi}; ++kt) {{
    tc_wait<{stages - 2}>();
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the copies' writes, seen by the MMA's reads
    __syncthreads();  // tile kt is in
    {{
      const unsigned sa = smem_s + ((kt % {stages}) * {a_stage} + (warp >> 2) * {64 * bk}) * 2;
      const unsigned sb = smem_s + ({stages * a_stage} + (kt % {stages}) * {b_stage}) * 2;
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
      #pragma unroll
      for (int kk = 0; kk < {bk // 16}; ++kk)
        tc_wgmma(&acc[0][0][0], wg_desc(sa + kk * 32, 16, 1024), wg_desc(sb + kk * 32, 16, 1024));
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    }}
    __syncthreads();  // every warpgroup's products of tile kt - 1 are done: its stage is free
{copies(main_only)}
  }}
  wg_wait<{bn // 2}>(&acc[0][0][0]);"""
        main_loop = (tiles("0", str(kt_side)) + side_done + "\n" + tiles(str(kt_side), "kt_n", True)) if side else \
            tiles("0", "kt_n")
    else:
        products = f"""    const unsigned short* As = smem + (kt % {stages}) * {a_stage};
    const unsigned short* Bs = smem + {stages * a_stage} + (kt % {stages}) * {b_stage};{mma_steps(bk, row_h)}"""
        main_loop = f"""  for (int kt = 0; kt < kt_n; ++kt) {{
    tc_wait<{stages - 2}>();
    __syncthreads();  // tile kt is in; every warp is done with the stage the next copies overwrite
{next_copies}{side_done}
{products}
  }}"""
    smem_s = "\n  const unsigned smem_s = (unsigned)__cvta_generic_to_shared(smem);" if wgmma else ""
    side_decl = "" if not side else f"""
  unsigned* const sdp = reinterpret_cast<unsigned*>(smem + {stages * (a_stage + b_stage)});  // the side's results"""
    side_ptrs = """
  const unsigned short* __restrict__ x2t = reinterpret_cast<const unsigned short*>(x2);
  const unsigned short* __restrict__ w2t = reinterpret_cast<const unsigned short*>(w2);""" if side else ""
    head = f"""
  extern __shared__ __align__(1024) unsigned short smem[];
  const unsigned short* __restrict__ xt = reinterpret_cast<const unsigned short*>(x);
  const unsigned short* __restrict__ wt = reinterpret_cast<const unsigned short*>(w);{side_ptrs}
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / {warps_n}, wn = warp % {warps_n};{smem_s}
  const int n0 = blockIdx.x * {bn};
  const {ityp} p0 = ({ityp})blockIdx.y * {bm};
  // this block's K tiles: all of them, or its split's run
  const int kt_b = blockIdx.z * {per_split};
  const int kt_n = max(0, min({kt_total}, kt_b + {per_split}) - kt_b);"""
    early = ""
    if early_b:
        early = f"""
{WEIGHTS_BEGIN}{b_load}
  #pragma unroll
  for (int s = 0; s < {stages - 1}; ++s)
    if (s < kt_n) load_b(s, (kt_b + s) * {bk});
{WEIGHTS_END}"""
    first_b = "" if early_b else f" load_b(s, (kt_b + s) * {bk});"
    wg_helpers = wgmma_helpers(_OPERANDS[od], {"tc_wgmma": (bn, False, False)}) if wgmma else ""
    resident = 1 if threads > 256 else 2 if threads > 128 else 4  # blocks an SM the registers are bounded for
    src = f"""{PRELUDE}
{tc_helpers(_OPERANDS[od])}{wg_helpers}{CLUSTER_HELPERS if cluster else ""}
{signature(threads, resident, splits if cluster else 0)} {{{w_prefetch}{head}{early}
{WAIT}{prefetch}{a_setup}{a_load}{"" if early_b else b_load}
{acc_zeroed(mi_n, ni_n, "  ")}{side_decl}
  #pragma unroll
  for (int s = 0; s < {stages - 1}; ++s) {{
    if (s < kt_n) {{ load_a(s, (kt_b + s) * {bk});{first_b} }}
    tc_commit();
  }}
{main_loop}
{epilogue_src}
}}
"""
    return src


def _split_sum(*, dev, ityp, main, o_total, one_output, p_total, ptrs, signature, splits):
    """The second launch of a K split outside a cluster: each output's sum over its splits' parts in order, then the
    epilogue."""
    n = p_total * o_total
    block = 256
    reduce_src = f"""{PRELUDE}
{signature(block, 0)} {{
{WAIT}
  for (long long idx = (long long)blockIdx.x * {block} + threadIdx.x; idx < {n};
       idx += (long long)gridDim.x * {block}) {{
    const {ityp} p = ({ityp})(idx / {o_total}), co = ({ityp})(idx % {o_total});
    float v = 0.0f;
    #pragma unroll 4
    for (int z = 0; z < {splits}; ++z) v += out1[(long long)z * {n} + idx];
{one_output}
  }}
}}
"""
    return [main, (reduce_src, Launch((min(-(-n // block), dev.multiprocessors * 16), 1, 1), block, ptrs))]


def acc_zeroed(mi_n: int, ni_n: int, indent: str) -> str:
    """The declaration of a warp's accumulators (`mi_n` x `ni_n` m16n8 fragments), zeroed."""
    lines = (f"float acc[{mi_n}][{ni_n}][4];", "#pragma unroll", f"for (int i = 0; i < {mi_n}; ++i)",
             "  #pragma unroll", f"  for (int j = 0; j < {ni_n}; ++j)", "    #pragma unroll",
             "    for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;")
    return "\n".join(indent + line for line in lines)


def _windowed(win: conv_window.Window, x: TensorRef, geom: tuple[int, ...], dims: tuple[int, ...], signature,
              threads: int, bm: int, bn: int, *, ityp: str, p_total: int, o_total: int, k_total: int,
              warps_n: int, mi_n: int, ni_n: int, od: str, w_affine: str, weight_early: bool, prefetch: str,
              mma: str, epilogue: str) -> str:
    """The source of a conv whose pixels come through a shared-memory window (conv_window.py): the weight tile of
    every K once a block, then pixel tile after pixel tile, the next tile's window copied during this one."""
    c, wd, kw, sw, pw, dw = dims
    h, ho, wo, sh, ph, _, dh = geom
    row_w = win.kp + conv_window.PAD
    weights = f"""
  for (int q = tid; q < {bn * win.kp}; q += {threads}) {{  // the weight tile of every K, once a block
    const int row = q / {win.kp}, kx = q % {win.kp};
    {conv_window.window_position("kx", c, kw)}
    const {ityp} co = n0 + row;
    pb[row * {row_w} + kx] = co < {o_total} && kx < {k_total} ? wt[{w_affine}] : (unsigned short)0;
  }}"""
    early = f"\n{WEIGHTS_BEGIN}{weights}\n{WEIGHTS_END}" if weight_early else ""
    late = "" if weight_early else weights
    copy = conv_window.copy_lines(win, x, (h, wd, ho, wo, sh, ph, dh), bm, p_total, threads, ityp)
    patch = conv_window.patch_lines(win, c, kw, sw, pw, dw, k_total, wo, bm, threads, ityp, p_total)
    return f"""{PRELUDE}
{tc_helpers(_OPERANDS[od])}
{signature(threads, conv_window.GRID_BLOCKS, 0)} {{
  extern __shared__ __align__(16) unsigned short smem[];
  const unsigned short* __restrict__ xt = reinterpret_cast<const unsigned short*>(x);
  const unsigned short* __restrict__ wt = reinterpret_cast<const unsigned short*>(w);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / {warps_n}, wn = warp % {warps_n};
  const int n0 = blockIdx.x * {bn};
  unsigned short* const win = smem;
  unsigned short* const pa = smem + {2 * win.buf};
  unsigned short* const pb = pa + {bm * row_w};
  const unsigned short* const As = pa;
  const unsigned short* const Bs = pb;{early}
{WAIT}{conv_window.zero_lines(win, k_total, bm, threads)}{late}{copy}
  __syncthreads();  // the zeros are written before any copy lands
  int tile = blockIdx.y;
  if (tile < {win.tiles}) copy_window(0, tile);
  tc_commit();
  for (int it = 0; tile < {win.tiles}; ++it, tile += gridDim.y) {{
    const {ityp} p0 = ({ityp})tile * {bm};
    const int b = it & 1;
    if (tile + gridDim.y < {win.tiles}) copy_window(b ^ 1, tile + gridDim.y);
    tc_commit();
    tc_wait<1>();
    __syncthreads();  // this tile's window is in; every warp is done with the last tile's patch{patch}
    __syncthreads();  // the patch tile (and at first the weight tile) is in{prefetch}
{acc_zeroed(mi_n, ni_n, "    ")}{mma}
{epilogue}
  }}
}}
"""
