"""A stride-1 convolution of whole blocks of 64 input channels on Hopper's warpgroup MMA that reads its pixels once:
each block keeps the whole weight of its 64 output channels in shared memory and takes tile after tile of pixels,
copying a tile's halo (its pixels and the rim the window reaches) once, and every filter tap multiplies that halo at
an offset.

The implicit GEMM of `conv_tc.py` copies, for every K step, the pixel rows of one window position: a 3x3 conv reads
each input pixel nine times from L2 (ResNet-50's first-stage 3x3 convs at batch 64: 231 MB a conv, 66 us, bound by
those reads). Here the product is transposed, D[o, p] = sum_k W[o, k] X[p, k]: the weight is the MMA's A (m64: 64
output channels, K-major with the 128-byte swizzle, as `conv_tc.py` lays out its tiles, one 8 KB block a tap and 64
input channels) and a tile of TY x 8 output pixels is its B (n = 8 TY, up to 256). B comes straight from the halo in
shared memory, laid out as the MMA's no-swizzle K-major core matrices: [8-channel chunk][halo row][halo column][8
channels], so that 8 neighbouring pixels of a row are one core matrix (8 rows of 16 bytes), the next halo row is the
stride between core matrices and the next chunk the leading offset; the tap (r, s) is the same descriptor started r
rows and s columns further. Where two halos fit beside the weight, the next tile's is copied while this one
multiplies; where one does (ResNet-50's second stage: 128 channels), it is copied in blocks of 64 channels, each
block's products starting as soon as it is in and the next tile's copy of a block as soon as its products are done.

Measured on the H100 (ResNet-50 at batch 64, in the program's profile, against the implicit GEMM): the first-stage
3x3 convs (64 channels) 66.4 -> 47.6 us, the second-stage ones (128) 49.6 -> 45.4 us (48.8 with the halo copied
whole, then multiplied); the whole program 2.642 -> 2.571 ms. A one-off prototype of the first-stage conv alone:
42 us (torch's cuDNN 103 us); with the product the other way round (pixels as m64, n = the 64 output channels) 46
us, and two or more warpgroups a block (each its own tiles, sharing the weight) 46-53 us.

The epilogue computes each output from its sum as the implicit GEMM's does (bias, the rounded result as `Acc`, the
record's expression: one that reads no tensor, see `fits`); lanes four apart exchange values so that each stores two
neighbouring channels of a pixel at once where the output is channels-last.
"""

from __future__ import annotations

from ...expr import nodes as X
from ...kernels import Conv2dKernel, plan_of
from ...program import CompiledProgram, KernelCall
from ..clike import Launch, affine, ptrs_of
from .common import (
    PRELUDE,
    WAIT,
    WEIGHTS_BEGIN,
    WEIGHTS_END,
    load_expr,
    round_expr,
    store_expr,
    swizzled_at,
    tc_helpers,
    wgmma_helpers,
)
from .conv_tc import _OPERANDS, pixels_vectorizable, weight_vectorizable

CHANNEL_BLOCK = 64  # input channels a 128-byte line of the swizzled weight holds: the channel count's multiple
O_TILE = 64  # output channels a block (the MMA's m64)
TX = 8  # output columns a tile: one core matrix of B is 8 neighbouring pixels
MAX_N = 256  # the MMA's largest n: a tile's pixels


def tile_rows(ho: int) -> int:
    """Output rows a tile: between 8 (fewer make the MMA's n small) and the 32 its n allows, the fewest rows past
    the image first, then the most (56 rows: 28; 43 rows: two tiles of 22)."""
    top = min(MAX_N // TX, ho)
    return min(range(min(8, top), top + 1), key=lambda ty: (-(-ho // ty) * ty - ho, -ty))


def smem_parts(c: int, kh: int, kw: int, ty: int, dev) -> tuple[int, int, int]:
    """Bytes of the weight and of one halo, and the halo buffers: two (the next tile's copied during this one's
    products) where they fit beside the weight, else one (ResNet-50's second-stage 3x3 convs: 147 KB of weight and a
    77 KB halo), 0 where not even that fits."""
    weight = kh * kw * (c // CHANNEL_BLOCK) * O_TILE * 128
    halo = (c // 8) * (ty + kh - 1) * (TX + kw - 1) * 16
    most = dev.shared_memory_per_block_optin
    return weight, halo, next((b for b in (2, 1) if weight + b * halo <= most), 0)


def fits(k: KernelCall, program: CompiledProgram, dev) -> bool:
    """A conv this kernel runs: Hopper (a device with the warpgroup MMA, sm_90a), one 16-bit dtype, one group, unsplit,
    no side conv, stride and dilation 1, a window of several taps (a 1x1 conv reads each pixel once anyway: ResNet-50's
    64-channel 1x1 convs at batch 64 went 26.5 -> 36.3 us here), whole blocks of 64 input channels of a channels-last
    input in 16-byte runs, whole tiles of 64 output channels, the weight as [O, kh, kw, C], a channels-last output
    (`_pairs`), the weight and a halo within the shared memory, an epilogue that reads no tensor (its element-by-element
    loads made a 3x3 conv with a residual add 77 -> 145 us), and tiles enough for every SM (ResNet-50 at batch 1: 14
    tiles, no faster than the implicit GEMM's split K)."""
    if not transposed_ok(k, program, dev):
        return False
    spec = k.spec
    x, w, out = k.args[0], k.args[1], k.outs[0]
    c = x.shape[1]
    if tuple(spec.stride) != (1, 1) or c % CHANNEL_BLOCK:
        return False
    o, _, kh, kw = w.shape
    if kh * kw < 2 or not pixels_vectorizable(x) or not weight_vectorizable(w):
        return False
    n, _, ho, wo = out.shape
    ty = tile_rows(ho)
    if n * -(-ho // ty) * -(-wo // TX) * (o // O_TILE) < dev.multiprocessors:
        return False
    return smem_parts(c, kh, kw, ty, dev)[2] > 0


def transposed_ok(k: KernelCall, program: CompiledProgram, dev) -> bool:
    """What the convs of the transposed product on the warpgroup MMA (this kernel and `conv_narrow.py`) ask of a
    record: Hopper (sm_90a), one 16-bit dtype, one group, unsplit, no side conv, no dilation, whole tiles of 64 output
    channels, a channels-last output in pairs (`_pairs`) and an epilogue that reads no tensor (`tile_outputs`)."""
    spec = k.spec
    if not dev.warpgroup_mma or not isinstance(spec, Conv2dKernel) or spec.groups != 1 or k.scratch \
            or plan_of(k).splits != 1 or spec.side_stride or len(k.outs) != 1:
        return False
    if spec.epilogue is not None and any(isinstance(e, X.Load) for e in X.walk(spec.epilogue)):
        return False
    x, w, out = k.args[0], k.args[1], k.outs[0]
    dts = {program.dtype_of(r) for r in (x, w, out)}
    if len(dts) != 1 or next(iter(dts)) not in _OPERANDS or tuple(spec.dilation) != (1, 1):
        return False
    return len(x.shape) == len(w.shape) == 4 and w.shape[0] % O_TILE == 0 and _pairs(out)


def _pairs(out) -> bool:
    """The output is channels-last with every pixel's channels 4-byte aligned: two neighbouring channels are one
    store (the lowering makes every conv result so where its convs run on tensor cores)."""
    os_ = out.strides
    return os_[1] == 1 and out.offset % 2 == 0 and all(s % 2 == 0 for s in (os_[0], os_[2], os_[3]))


def conv2d_direct(k: KernelCall, program: CompiledProgram, render_epilogue, ityp: str, signature,
                  names: list[str], dev) -> list[tuple[str, Launch]]:
    spec: Conv2dKernel = k.spec
    x, w, out = k.args[0], k.args[1], k.outs[0]
    n, c, h, wd = x.shape
    o_total, _, kh, kw = w.shape
    _, _, ho, wo = out.shape
    ph, pw = spec.padding
    od = program.dtype_of(out)
    xs = x.strides

    ty = tile_rows(ho)
    hy, hx = ty + kh - 1, TX + kw - 1
    npx = ty * TX  # the MMA's n
    tiles_y, tiles_x = -(-ho // ty), -(-wo // TX)
    tiles = n * tiles_y * tiles_x
    o_tiles = o_total // O_TILE
    w_bytes, halo, nbuf = smem_parts(c, kh, kw, ty, dev)
    smem = w_bytes + nbuf * halo
    cb = c // CHANNEL_BLOCK
    threads = 128
    grid = max(1, min(tiles, dev.multiprocessors // o_tiles))
    weight_early = program.buffers[w.buffer].kind == "weight"
    w_at = affine([("co", w.strides[0]), ("tap", c)], w.offset)
    x_at = affine([("nb", xs[0]), ("iy", xs[2]), ("ix", xs[3])], x.offset)

    weights = f"""
  // every tap's weight, 64 output channels x 64 input channels a 8 KB block ([tap][channel block]), swizzled
  for (int q = tid; q < {kh * kw * cb * O_TILE * 8}; q += {threads}) {{
    const int ch = q & 7, row = q >> 3, blk = row / {O_TILE}, ol = row % {O_TILE}, tap = blk / {cb};
    const {ityp} co = oc0 + ol;
    tc_cp16(reinterpret_cast<unsigned short*>(sm) + blk * {O_TILE * 64} + {swizzled_at("ol", "ch")},
            wt + {w_at} + (blk % {cb}) * {CHANNEL_BLOCK} + ch * 8, true);
  }}"""
    bias_pre, outputs = tile_outputs(k, program, render_epilogue, names, ityp, ty)
    products, prologue = _direct_loop(c=c, cb=cb, halo=halo, hx=hx, hy=hy, kh=kh, kw=kw, nbuf=nbuf, npx=npx,
        tiles=tiles, w_bytes=w_bytes)
    src = f"""{PRELUDE}
{tc_helpers(_OPERANDS[od])}{wgmma_helpers(_OPERANDS[od], {"tc_wgmma": (npx, False, False)}, plain_desc=True)}
{signature(threads, 1)} {{
  extern __shared__ __align__(1024) unsigned char sm[];
  const unsigned short* __restrict__ xt = reinterpret_cast<const unsigned short*>(x);
  const unsigned short* __restrict__ wt = reinterpret_cast<const unsigned short*>(w);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned sb = (unsigned)__cvta_generic_to_shared(sm);
  const {ityp} oc0 = ({ityp})blockIdx.y * {O_TILE};
{WEIGHTS_BEGIN if weight_early else ""}{weights if weight_early else ""}
{WEIGHTS_END if weight_early else ""}
{WAIT}{"" if weight_early else weights}
  // tile t's halo (its 8-channel chunks lo..hi) into buffer b: [chunk][halo row][halo column] 16 bytes each, zeros
  // outside the image
  auto copy_halo = [&](int b, int t, int lo, int hi) {{
    const {ityp} nb = t / {tiles_y * tiles_x};
    const int r = t % {tiles_y * tiles_x}, ty0 = (r / {tiles_x}) * {ty} - {ph}, tx0 = (r % {tiles_x}) * {TX} - {pw};
    for (int q = tid; q < {hy * hx} * (hi - lo); q += {threads}) {{
      const int c8 = lo + q % (hi - lo), p = q / (hi - lo), iy = ty0 + p / {hx}, ix = tx0 + p % {hx};
      const bool ok = iy >= 0 && iy < {h} && ix >= 0 && ix < {wd};
      tc_cp16(sm + {w_bytes} + b * {halo} + ((c8 * {hy}) * {hx} + p) * 16, xt + (ok ? {x_at} + c8 * 8 : 0), ok);
    }}
  }};
  int t = blockIdx.x;{bias_pre}{prologue}
  for (int it = 0; t < {tiles}; ++it, t += gridDim.x) {{{products}
    const {ityp} nb = t / {tiles_y * tiles_x};
    const int r = t % {tiles_y * tiles_x}, oh0 = (r / {tiles_x}) * {ty}, ow0 = (r % {tiles_x}) * {TX};{outputs}
  }}
}}
"""
    return [(src, Launch((grid, o_tiles, 1), threads, ptrs_of(k), smem))]


def tile_outputs(k: KernelCall, program: CompiledProgram, render_epilogue, names: list[str], ityp: str,
                 ty: int) -> tuple[str, str]:
    """The lines that load the bias of a thread's two output channels once (before the loop over tiles), and those
    that compute and store a tile's outputs from the accumulators of an m64 x n(8 ty) product of 64 output channels
    (from `oc0`) by ty rows of 8 pixels (image `nb`, rows from `oh0`, columns from `ow0`): acc[4j + 2hf + e] is
    output channel oc0 + 16 warp + lane / 4 + 8 hf, pixel row j, column 2 (lane % 4) + e. The output is channels-last
    in pairs (`_pairs`); the epilogue reads no tensor (`fits`)."""
    spec: Conv2dKernel = k.spec
    out = k.outs[0]
    _, _, ho, wo = out.shape
    od = program.dtype_of(out)
    os_ = out.strides
    as_bits = "__half_as_ushort" if od == "float16" else "__bfloat16_as_ushort"
    lines = []
    bias_pre = ""
    if spec.bias:  # the thread's two channels' bias, loaded once
        bias = k.args[2]
        b_at = affine([("co", bias.strides[0])], bias.offset)
        bias_pre = f"""
  float bv[2];
  #pragma unroll
  for (int hf = 0; hf < 2; ++hf) {{
    const {ityp} co = oc0 + warp * 16 + (lane >> 2) + hf * 8;
    bv[hf] = {load_expr(program.dtype_of(bias), 'bias[' + b_at + ']')};
  }}"""
        lines.append("          v += bv[hf];")
    value, value_dtype = "v", "float32"
    if spec.epilogue is not None:
        lines.append(f"          const float accv = {round_expr('v', od)};")
        lines.append(f"          const {ityp} o0 = nb, o1 = co, o2 = oh, o3 = ow;")
        ep_lines, value = render_epilogue(spec.epilogue, k, program, names, ["accv"], ityp, "          ")
        lines += ep_lines
        value_dtype = spec.epilogue.dtype
    lines.append(f"          sv[e] = {as_bits}({store_expr(od, value, value_dtype)});")
    epilogue = "\n".join(lines)
    # lanes 4 apart hold neighbouring channels of the same pixels: an exchange leaves each with both channels of one
    # pixel (the even lane the first, the odd the second), one 4-byte store (`_pairs`: the output allows it)
    at = affine([("nb", os_[0]), ("ce", 1), ("oh", os_[2]), ("ow", os_[3])], out.offset)
    outputs = f"""
    #pragma unroll
    for (int j = 0; j < {ty}; ++j) {{
      const {ityp} oh = oh0 + j;
      #pragma unroll
      for (int hf = 0; hf < 2; ++hf) {{
        const {ityp} co = oc0 + warp * 16 + (lane >> 2) + hf * 8;
        unsigned short sv[2];
        #pragma unroll
        for (int e = 0; e < 2; ++e) {{  // (outside the image too: the epilogue reads no tensor, and lanes pair up)
          const {ityp} ow = ow0 + (lane & 3) * 2 + e;
          float v = acc[j * 4 + hf * 2 + e];
{epilogue}
        }}
        const int odd = (lane >> 2) & 1;
        const unsigned got = __shfl_xor_sync(0xffffffffu, odd ? (unsigned)sv[0] : (unsigned)sv[1], 4);
        const {ityp} ow = ow0 + (lane & 3) * 2 + odd, ce = co - odd;
        if (oh < {ho} && ow < {wo})
          *reinterpret_cast<unsigned*>(out0 + ({at})) = odd ? got | ((unsigned)sv[1] << 16) : sv[0] | (got << 16);
      }}
    }}"""
    return bias_pre, outputs


def _direct_loop(*, c, cb, halo, hx, hy, kh, kw, nbuf, npx, tiles, w_bytes):
    """The products of a tile over every tap (one warpgroup MMA a tap, B read from the halo at its offset) and the loop
    over tiles with one or two halo buffers."""
    def mma(lo: int, hi: int, b: str) -> str:
        """Every tap's products over the halo's channel steps lo..hi (16 channels each) of buffer b."""
        return f"""
    #pragma unroll
    for (int tap = 0; tap < {kh * kw}; ++tap)
      #pragma unroll
      for (int kk = {lo}; kk < {hi}; ++kk)
        tc_wgmma(acc, wg_desc(sb + (tap * {cb} + kk / 4) * {O_TILE * 128} + (kk % 4) * 32, 16, 1024),
                 wg_desc_plain(sb + {w_bytes} + {b} * {halo} + ((2 * kk * {hy} + tap / {kw}) * {hx} + tap % {kw}) * 16,
                            {hy * hx * 16}, {hx * 16}));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");"""

    zero = f"""
    float acc[{npx // 2}];
    #pragma unroll
    for (int i = 0; i < {npx // 2}; ++i) acc[i] = 0.0f;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");"""
    seen = """
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the copies' writes, seen by the MMA's reads
    __syncthreads();"""
    if nbuf == 2:
        prologue = f"""
  if (t < {tiles}) copy_halo(0, t, 0, {c // 8});
  tc_commit();"""
        products = f"""
    const int b = it & 1;
    __syncthreads();  // every warp is done with the last tile's buffer, which these copies overwrite
    if (t + (int)gridDim.x < {tiles}) copy_halo(1 - b, t + gridDim.x, 0, {c // 8});  // the next tile's, meanwhile
    tc_commit();
    tc_wait<1>();  // this tile's halo (and at first the weight) is in{seen}{zero}{mma(0, c // 16, "b")}
    wg_wait<{npx // 2}>(acc);"""
    else:
        # one buffer, in blocks of 64 channels: a block's products start as soon as its copies are in, and once
        # they are done the next tile's copies of that block start (during the later blocks' products and the
        # epilogue); copied whole and then multiplied, ResNet-50's second-stage 3x3 convs gained nothing
        prologue = "".join(f"""
  if (t < {tiles}) copy_halo(0, t, {8 * i}, {8 * i + 8});
  tc_commit();""" for i in range(cb))
        products = zero + "".join(f"""
    tc_wait<{cb - 1 - i}>();  // block {i} of this tile's halo (and at first the weight) is in{seen}"""
                                  + mma(4 * i, 4 * i + 4, "0") for i in range(cb))
        products += "".join(f"""
    asm volatile("wgmma.wait_group.sync.aligned {cb - 1 - i};" ::: "memory");
    __syncthreads();  // every warp's products of block {i} are done: its part of the buffer is free
    if (t + (int)gridDim.x < {tiles}) copy_halo(0, t + gridDim.x, {8 * i}, {8 * i + 8});
    tc_commit();""" for i in range(cb))
        products += f"""
    wg_wait<{npx // 2}>(acc);"""
    return products, prologue
