"""The input of a tensor-core conv through a shared-memory window, where its pixels cannot be 16-byte copies (a stem
of 3 channels over the NCHW program input).

Read element by element from global memory, such a conv's patch matrix costs one 2-byte load for every (pixel, K)
pair and every weight element again in every block: ResNet-50's stem at batch 64 is 118 M such loads, and neither
their order nor their latency was the bound (bench/README.md). Here a block instead:
- copies the input rows its tile of pixels reads (every channel, the whole width) into a shared-memory window, as
  16-byte `cp.async` copies where the rows allow it (else element by element, coalesced along the row), the next
  tile's window in flight while this tile is multiplied;
- builds the tile's patch matrix (BM pixels x K) in shared memory from the window, and keeps the weight tile of all
  K (BN x K, loaded once a block, before the wait where it is a weight buffer);
- and takes pixel tile after pixel tile (a grid of about two blocks an SM), so the weight tile and the window's
  zero columns (the left and right padding) are written once.

The window holds, for each output row the tile's pixels lie in (a tile of consecutive pixels spans a few, also across
images), the kh input rows of every channel that row reads, with zeros for a row outside the image and zero columns
for the left and right padding: each patch element is then one shared-memory load at a pixel's offset plus a K
column's, with no bounds test. The products and the epilogue are the mma.sync path's (`conv_tc.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ALIGN = 8  # halfs of a 16-byte copy: the window's columns start and its rows are that aligned
PAD = 8  # halfs of padding per row of the patch and weight tiles: ldmatrix's eight rows fall in different banks
GRID_BLOCKS = 2  # resident blocks an SM the grid is sized for (the kernel's launch bounds ask for two)


@dataclass(frozen=True)
class Window:
    orows: int  # output rows a tile spans at most
    channels: int
    kh: int
    padl: int  # zero columns before the image's first (the left padding, rounded up to ALIGN)
    width: int  # halfs a window row holds (a multiple of ALIGN)
    kp: int  # K rounded up to the K step: the patch and weight tiles' columns
    vector: bool  # rows copied 16 bytes at a time
    tiles: int  # pixel tiles
    smem: int  # bytes of shared memory a block: two windows, the patch tile, the weight tile

    @property
    def slab(self) -> int:
        """Halfs of one output row's part of the window: kh input rows of every channel."""
        return self.channels * self.kh * self.width

    @property
    def buf(self) -> int:
        """Halfs of one window."""
        return self.orows * self.slab


def plan(x, w_shape, out_shape, stride, padding, dilation, bm: int, bn: int, bk: int, max_smem: int,
         min_tiles: int) -> Window | None:
    """The window of a conv with input `x` (a TensorRef) and BM x BN tiles, or None where it does not fit half of the
    GPU's shared memory (a block an SM would be left, and long K or many channels gain less from it) or where its
    pixel tiles are fewer than `min_tiles` (the grid's blocks): a block of one tile has nothing to spread the weight
    tile's loads and its serial copy, patch and product steps over (ResNet-50's stem at batch 1 on the H100, 196
    tiles: 14.3 us element by element, 19.5 us through the window; at batch 64, 6,272 tiles: 255 -> 180 us)."""
    n, c, _, wd = x.shape
    _, _, kh, kw = w_shape
    _, _, ho, wo = out_shape
    _, sw = stride
    _, pw = padding
    _, dw = dilation
    p_total = n * ho * wo
    kp = -(-(c * kh * kw) // bk) * bk
    tiles = -(-p_total // bm)
    if tiles < min_tiles:
        return None
    first = np.arange(tiles, dtype=np.int64) * bm
    orows = int((((np.minimum(first + bm, p_total) - 1) // wo) - first // wo + 1).max())
    padl = -(-pw // ALIGN) * ALIGN
    last = padl + (wo - 1) * sw - pw + (kw - 1) * dw  # the rightmost window column a pixel reads
    width = -(-max(padl + wd, last + 1) // ALIGN) * ALIGN
    xs = x.strides
    vector = xs[3] == 1 and wd % ALIGN == 0 and x.offset % ALIGN == 0 and all(s % ALIGN == 0 for s in xs[:3])
    smem = 2 * (2 * orows * c * kh * width) + (bm + bn) * (kp + PAD) * 2
    if smem > max_smem // GRID_BLOCKS:
        return None
    return Window(orows, c, kh, padl, width, kp, vector, tiles, smem)


def window_position(k: str, c: int, kw: int) -> str:
    """The declarations of K index `k`'s window row `kr`, column `ks` and channel `cc` (K ordered (r, s, c), the
    weight's [O, kh, kw, C] order), with `rs` the window position."""
    return f"const int rs = {k} / {c}, cc = {k} % {c}, kr = rs / {kw}, ks = rs % {kw};"


def copy_lines(win: Window, x, geom: tuple[int, ...], bm: int, p_total: int, threads: int, ityp: str) -> str:
    """A lambda `copy_window(b, t)`: tile t's window into window buffer b, each of its output rows' kh input rows of
    every channel, zeros where a row lies outside the image (16-byte copies, committed by the caller, or element by
    element).

    A window row's source (its image, channel and input row: the divisions are most of the index arithmetic) is
    found once a warp, each lane one row of every 32, and handed to the lanes copying its units by a shuffle; each
    unit then costs one division (its row) and an add. Found once a unit instead, the copies were most of the
    stem's instructions (ResNet-50 at batch 64: ncu had the kernel issue-bound, ALU the busiest pipe)."""
    h, wd, ho, wo, sh, ph, dh = geom
    xs = x.strides
    unit = ALIGN if win.vector else 1
    per_row = wd // unit
    rows = win.orows * win.channels * win.kh  # window rows of a tile at most
    groups = -(-rows // 32)
    find = "".join(f"""
    {{  // lane's row of group {j}: its source, or -1 outside the image (or the tile)
      const int r = {32 * j} + lane, kr = r % {win.kh}, cc = (r / {win.kh}) % {win.channels};
      const {ityp} orow = ra + r / {win.channels * win.kh};
      const {ityp} ih = (orow % {ho}) * {sh} - {ph} + kr * {dh};
      src{j} = r < nr * {win.channels * win.kh} && ih >= 0 && ih < {h}
          ? ({ityp}){x.offset} + (orow / {ho}) * {xs[0]} + ({ityp})cc * {xs[1]} + ih * {xs[2]} : ({ityp})-1;
    }}""" for j in range(groups))
    pick = " ".join(f"{{ const {ityp} v = __shfl_sync(0xffffffffu, src{j}, r & 31); if ((r >> 5) == {j}) row = v; }}"
                    for j in range(groups))
    if win.vector:
        copy = f"""tc_cp16(&win[dst], xt + (row >= 0 ? row + ({ityp})u * {ALIGN} : 0), row >= 0);"""
    else:
        copy = f"""win[dst] = row >= 0 ? xt[row + ({ityp})u * {xs[3]}] : (unsigned short)0;"""
    return f"""
  auto copy_window = [&](int b, int t) {{
    const {ityp} ra = ({ityp})t * {bm} / {wo};
    const int nr = (int)((min(({ityp})t * {bm} + {bm}, ({ityp}){p_total}) - 1) / {wo} - ra + 1);
    {ityp} {", ".join(f"src{j}" for j in range(groups))};{find}
    // the warp's units, 32 at a time (every lane in each round: the shuffles need them all)
    for (int q0 = warp * 32; q0 < nr * {win.channels * win.kh * per_row}; q0 += {threads}) {{
      const int q = q0 + lane, r = q / {per_row}, u = q - r * {per_row};
      {ityp} row = -1;
      {pick}
      if (q < nr * {win.channels * win.kh * per_row}) {{
        const int dst = b * {win.buf} + r * {win.width} + {win.padl} + u * {unit};
        {copy}
      }}
    }}
  }};"""


def patch_lines(win: Window, c: int, kw: int, sw: int, pw: int, dw: int, k_total: int, wo: int, bm: int,
                threads: int, ityp: str, p_total: int) -> str:
    """Lines that build this tile's patch matrix `pa` ([BM][kp + PAD]; its columns past K stay the zeros written
    first) from window buffer `b`: each warp a row at a time, each lane a K column, one load each."""
    warps = threads // 32
    per = -(-bm // warps)
    row_h = win.kp + PAD
    guard = "" if bm % warps == 0 else f"if (warp + i * {warps} < {bm}) "
    return f"""
    {{
      int rowoff[{per}];
      const {ityp} ra = p0 / {wo};
      #pragma unroll
      for (int i = 0; i < {per}; ++i) {{
        const {ityp} p = min(p0 + warp + i * {warps}, ({ityp}){p_total - 1});
        rowoff[i] = b * {win.buf} + (int)(p / {wo} - ra) * {win.slab} + (int)(p % {wo}) * {sw} + {win.padl - pw};
      }}
      #pragma unroll 1
      for (int kc = 0; kc < {win.kp}; kc += 32) {{
        const int kx = kc + lane;
        {window_position("kx", c, kw)}
        const int koff = (cc * {win.kh} + kr) * {win.width} + ks * {dw};
        if (kx < {k_total}) {{
          #pragma unroll
          for (int i = 0; i < {per}; ++i)
            {guard}pa[(warp + i * {warps}) * {row_h} + kx] = win[rowoff[i] + koff];
        }}
      }}
    }}"""


def zero_lines(win: Window, k_total: int, bm: int, threads: int) -> str:
    """Lines that zero both windows (their padding columns stay zero) and the patch tile's columns past K."""
    tail = win.kp - k_total
    row_h = win.kp + PAD
    zeros = f"""
  for (int q = tid; q < {2 * win.buf}; q += {threads}) win[q] = 0;"""
    if tail == 0:
        return zeros
    return zeros + f"""
  for (int q = tid; q < {bm * tail}; q += {threads}) pa[(q / {tail}) * {row_h} + {k_total} + q % {tail}] = 0;"""
