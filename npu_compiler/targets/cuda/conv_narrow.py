"""A convolution of few input channels (a stem over the 3-channel program input) on Hopper's warpgroup MMA, its
pixels read straight from a window of the input in shared memory: no patch (im2col) tile.

The implicit GEMM of `conv_tc.py` reads such a conv's pixels element by element, or builds each pixel tile's patch
matrix in shared memory from a window of input rows (`conv_window.py`): ResNet-50's stem at batch 64 there is 167 us
on the H200 (6.8% of the program), one shared-memory load and store a (pixel, K) pair and the index arithmetic to
find it. Here the window is laid out so that the MMA reads it as it is: [window row][column][cp channels], cp =
8 / stride (4 for a stride of 2), channels past the input's zero. A pixel's run of K for one kernel row r, its kw
columns of cp channels (kr halfs: kw cp rounded up to the MMA's k16), is then contiguous, and the pixel beside it
starts stride x cp x 2 = 16 bytes further: 8 neighbouring pixels of an output row are one core matrix of the MMA's
no-swizzle K-major layout (8 rows of 16 bytes), the next 16 bytes of K the leading offset and the next output row
(`stride` window rows down) the stride offset. The product is transposed as in `conv_direct.py`, D[o, p] = W[o, k]
X[p, k]: the weight is A (64 output channels, K ordered as the window's runs, in the 128-byte swizzle, loaded once a
block), a tile of TY output rows x 8 columns is B (n = 8 TY), and each kernel row is kr / 16 products whose B starts r
window rows and 32 bytes a step further.

The K past a kernel row's kw cp values (a 7-column run of 4 channels is 28 halfs, 32 with the k16's padding) meets
zero weights; the window values it reads are the input's (the next column) or zeros, so an output is exact where the
input is finite (an infinite input value would make a NaN of the neighbouring output column too).

Each block takes tile after tile (a grid of RESIDENT blocks an SM) and copies the next tile's window (element by
element from any layout, the input's rows coalesced) while the MMA multiplies this one. The epilogue is
`conv_direct.py`'s (an epilogue that reads no tensor, two channels of a channels-last output a store).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...kernels import Conv2dKernel
from ...program import CompiledProgram, KernelCall
from ..clike import Launch, affine, ptrs_of
from .common import PRELUDE, WAIT, WEIGHTS_BEGIN, WEIGHTS_END, swizzled_at, tc_helpers, wgmma_helpers
from .conv_direct import MAX_N, O_TILE, TX, tile_outputs, tile_rows, transposed_ok
from .conv_tc import _OPERANDS

# blocks an SM the launch bounds and the grid are sized for (152 registers at ResNet-50's stem: three fit). The stem
# at batch 64 on the H200 with two: 103.5 us, its blocks mostly waiting on their window copies and stores
RESIDENT = 3
RUN_BYTES = 16  # the MMA's core-matrix row: a pixel's run starts this many bytes after its neighbour's
WEIGHT_BLOCK = O_TILE * 128  # bytes of a 64-K block of the weight tile: 64 rows of one 128-byte line


@dataclass(frozen=True)
class Layout:
    """The shared-memory layout of a conv on this kernel."""

    cp: int  # channels a window column holds: 8 / stride, the input's channels and zeros after them
    kr: int  # K halfs of a kernel row: kw cp rounded up to 16 (the MMA's k16)
    k_blocks: int  # 64-K blocks of the weight tile (kh kr rounded up to 64)
    ty: int  # output rows a tile (the MMA's n is 8 ty)
    wy: int  # window rows a tile: stride (ty - 1) + kh
    wx: int  # window columns a tile: stride (TX - 1) + kr / cp

    @property
    def row_bytes(self) -> int:
        return self.wx * self.cp * 2

    @property
    def window_bytes(self) -> int:
        return self.wy * self.row_bytes

    @property
    def weight_bytes(self) -> int:
        return self.k_blocks * WEIGHT_BLOCK

    @property
    def smem(self) -> int:
        """The weight tile and two windows (this tile's and the next one's)."""
        return self.weight_bytes + 2 * self.window_bytes


def tile_count(n: int, ho: int, wo: int, ty: int) -> int:
    return n * -(-ho // ty) * -(-wo // TX)


def layout(x_shape, w_shape, out_shape, stride, dev) -> Layout | None:
    """The layout of a conv of these shapes and stride on `dev`, or None where this kernel cannot take it: a
    stride whose 8 / stride channels a column hold the input's (a stride of 1, 2, 4 or 8 over at most 8, 4, 2 or 1
    channels; 8 channels at stride 1 are 16-byte copies for `conv_tc.py` already), or shared memory that does not
    hold RESIDENT blocks. Tiles of `conv_direct.tile_rows` output rows where they give every SM one, else fewer
    rows (16, then 8: one image's stem)."""
    n, c, _, _ = x_shape
    o, _, kh, kw = w_shape
    _, _, ho, wo = out_shape
    sh, sw = stride
    if sw not in (1, 2, 4, 8) or c * sw > 8 or c >= 8 or min(n, c, kh, kw, ho, wo, sh) < 1:
        return None
    cp = 8 // sw
    kr = -(-kw * cp // 16) * 16
    first = tile_rows(ho)
    rows = [first] + [t for t in (16, 8) if t < first]
    sms = dev.multiprocessors
    ty = next((t for t in rows if tile_count(n, ho, wo, t) * (o // O_TILE) >= sms), rows[-1])
    lay = Layout(cp, kr, -(-kh * kr // 64), ty, sh * (ty - 1) + kh, sw * (TX - 1) + kr // cp)
    if 8 * ty > MAX_N or lay.smem > dev.shared_memory_per_block_optin // RESIDENT:
        return None
    return lay


def fits(k: KernelCall, program: CompiledProgram, dev) -> bool:
    """A conv this kernel runs: Hopper (the warpgroup MMA, sm_90a), one 16-bit dtype, one group, unsplit, no side
    conv, no dilation, whole tiles of 64 output channels, few input channels for its stride (`layout`), a
    channels-last output in pairs and an epilogue that reads no tensor (`conv_direct.py`'s epilogue). The input and
    the weight may have any strides: both are read element by element."""
    if not transposed_ok(k, program, dev):
        return False
    x, w, out = k.args[0], k.args[1], k.outs[0]
    return layout(x.shape, w.shape, out.shape, k.spec.stride, dev) is not None


def conv2d_narrow(k: KernelCall, program: CompiledProgram, render_epilogue, ityp: str, signature,
                  names: list[str], dev) -> list[tuple[str, Launch]]:
    spec: Conv2dKernel = k.spec
    x, w, out = k.args[0], k.args[1], k.outs[0]
    n, c, h, wd = x.shape
    o_total, _, kh, kw = w.shape
    _, _, ho, wo = out.shape
    sh, sw = spec.stride
    ph, pw = spec.padding
    od = program.dtype_of(out)
    lay = layout(x.shape, w.shape, out.shape, spec.stride, dev)
    cp, kr, ty = lay.cp, lay.kr, lay.ty
    npx = 8 * ty  # the MMA's n
    tiles_y, tiles_x = -(-ho // ty), -(-wo // TX)
    tiles = n * tiles_y * tiles_x
    o_tiles = o_total // O_TILE
    threads = 128
    grid = max(1, min(tiles, dev.multiprocessors * RESIDENT // o_tiles))
    weight_early = program.buffers[w.buffer].kind == "weight"
    w_at = affine([("co", w.strides[0]), ("cc", w.strides[1]), ("kr", w.strides[2]), ("ks", w.strides[3])],
                  w.offset)
    x_at = affine([("nb", x.strides[0]), ("iy", x.strides[2]), ("ix", x.strides[3])], x.offset)
    words = max(1, cp // 2)  # 32-bit words of a window column (a column of one channel is one half)
    # the columns of a window row whose lines the prefetch touches: one every 64 bytes of the input, and the last
    step = max(1, 64 // (2 * max(1, abs(x.strides[3]))))
    points = list(range(0, lay.wx - 1, step)) + [lay.wx - 1]

    def packed(v: str, count: int) -> list[str]:
        return [f"(unsigned){v}[{2 * i}] | ((unsigned){v}[{2 * i + 1}] << 16)" for i in range(count // 2)]

    weights = f"""
  // the weight tile: K as the window's runs (kernel row kr: column ks, channel cc; zeros past kw columns and c
  // channels), 64 output channels x 64 K a block of 64 lines of 128 bytes, swizzled
  #pragma unroll 4
  for (int q = tid; q < {lay.k_blocks * O_TILE * 8}; q += {threads}) {{
    const int ch = q & 7, ol = (q >> 3) % {O_TILE}, blk = q / {O_TILE * 8};
    const {ityp} co = oc0 + ol;
    unsigned short v[8];
    #pragma unroll
    for (int e = 0; e < 8; ++e) {{
      const int kg = blk * 64 + ch * 8 + e, kr = kg / {kr}, ks = (kg % {kr}) / {cp}, cc = kg % {cp};
      v[e] = kr < {kh} && ks < {kw} && cc < {c} ? wt[{w_at}] : (unsigned short)0;
    }}
    *reinterpret_cast<uint4*>(reinterpret_cast<unsigned short*>(sm) + blk * {O_TILE * 64} + {swizzled_at("ol", "ch")})
        = make_uint4({", ".join(packed("v", 8))});
  }}"""
    if cp == 1:
        store = "*reinterpret_cast<unsigned short*>(dst) = v[0];"
    elif words == 1:
        store = f"*reinterpret_cast<unsigned*>(dst) = {packed('v', 2)[0]};"
    else:
        store = f"*reinterpret_cast<uint{words}*>(dst) = make_uint{words}({', '.join(packed('v', cp))});"
    fill = f"""
  // tile t's window into buffer b: [window row][column][{cp} channels], zeros outside the image and past {c} channels
  auto fill_window = [&](int b, int t) {{
    const {ityp} nb = t / {tiles_y * tiles_x};
    const int r = t % {tiles_y * tiles_x};
    const int iy0 = (r / {tiles_x}) * {ty * sh} - {ph}, ix0 = (r % {tiles_x}) * {TX * sw} - {pw};
    unsigned char* const win = sm + {lay.weight_bytes} + b * {lay.window_bytes};
    #pragma unroll 4
    for (int q = tid; q < {lay.wy * lay.wx}; q += {threads}) {{
      const int iy = iy0 + q / {lay.wx}, ix = ix0 + q % {lay.wx};
      const bool ok = iy >= 0 && iy < {h} && ix >= 0 && ix < {wd};
      const {ityp} at = ok ? {x_at} : 0;
      unsigned short v[{max(cp, 2)}];
      #pragma unroll
      for (int e = 0; e < {max(cp, 2)}; ++e)
        v[e] = ok && e < {c} ? xt[at + ({ityp})e * {x.strides[1]}] : (unsigned short)0;
      unsigned char* const dst = win + q * {cp * 2};
      {store}
    }}
  }};
  // tile t's input into L2 ahead of its copies (which then wait on L2, not on memory): for every window row and
  // channel the lines of its columns, {step} columns apart and the last (clamped to the image: every address is
  // one of the input's elements)
  auto prefetch_window = [&](int t) {{
    const {ityp} nb = t / {tiles_y * tiles_x};
    const int r = t % {tiles_y * tiles_x};
    const int iy0 = (r / {tiles_x}) * {ty * sh} - {ph}, ix0 = (r % {tiles_x}) * {TX * sw} - {pw};
    for (int q = tid; q < {lay.wy * c * len(points)}; q += {threads}) {{
      const int y = q / {c * len(points)}, cc = (q / {len(points)}) % {c}, px = q % {len(points)};
      const int iy = min(max(iy0 + y, 0), {h - 1});
      const int ix = min(max(ix0 + (px == {len(points) - 1} ? {lay.wx - 1} : px * {step}), 0), {wd - 1});
      const {ityp} at = {x_at} + ({ityp})cc * {x.strides[1]};
      asm volatile("prefetch.global.L2 [%0];" :: "l"(xt + at));
    }}
  }};"""
    ks_n = kr // 16
    products = f"""
    float acc[{npx // 2}];
    #pragma unroll
    for (int i = 0; i < {npx // 2}; ++i) acc[i] = 0.0f;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    #pragma unroll
    for (int r = 0; r < {kh}; ++r)
      #pragma unroll
      for (int q = 0; q < {ks_n}; ++q) {{
        const int s = r * {ks_n} + q;  // the K step: block s / 4 of the weight, 32 bytes a step within it
        tc_wgmma(acc, wg_desc(sb + (s / 4) * {WEIGHT_BLOCK} + (s % 4) * 32, 16, 1024),
                 wg_desc_plain(sb + {lay.weight_bytes} + b * {lay.window_bytes} + r * {lay.row_bytes} + q * 32,
                               {RUN_BYTES}, {sh * lay.row_bytes}));
      }}
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");"""
    bias_pre, outputs = tile_outputs(k, program, render_epilogue, names, ityp, ty)
    src = f"""{PRELUDE}
{tc_helpers(_OPERANDS[od])}{wgmma_helpers(_OPERANDS[od], {"tc_wgmma": (npx, False, False)}, plain_desc=True)}
{signature(threads, RESIDENT)} {{
  extern __shared__ __align__(1024) unsigned char sm[];
  const unsigned short* __restrict__ xt = reinterpret_cast<const unsigned short*>(x);
  const unsigned short* __restrict__ wt = reinterpret_cast<const unsigned short*>(w);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned sb = (unsigned)__cvta_generic_to_shared(sm);
  const {ityp} oc0 = ({ityp})blockIdx.y * {O_TILE};
{WEIGHTS_BEGIN if weight_early else ""}{weights if weight_early else ""}
{WEIGHTS_END if weight_early else ""}
{WAIT}{"" if weight_early else weights}{fill}
  int t = blockIdx.x;{bias_pre}
  if (t + (int)gridDim.x < {tiles}) prefetch_window(t + gridDim.x);
  fill_window(0, t);
  for (int it = 0; t < {tiles}; ++it, t += gridDim.x) {{
    const int b = it & 1;
    // the window's (and at first the weight's) stores, seen by the MMA; every warp is done with the last tile,
    // whose buffer the next copies overwrite
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();{products}
    if (t + (int)gridDim.x < {tiles}) fill_window(b ^ 1, t + gridDim.x);  // the next tile's, during the products
    if (t + 2 * (int)gridDim.x < {tiles}) prefetch_window(t + 2 * gridDim.x);
    wg_wait<{npx // 2}>(acc);
    const {ityp} nb = t / {tiles_y * tiles_x};
    const int r = t % {tiles_y * tiles_x}, oh0 = (r / {tiles_x}) * {ty}, ow0 = (r % {tiles_x}) * {TX};{outputs}
  }}
}}
"""
    return [(src, Launch((grid, o_tiles, 1), threads, ptrs_of(k), lay.smem))]
