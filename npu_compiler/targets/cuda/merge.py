"""Consecutive small elementwise kernels that do not depend on each other, launched as one.

A decode step is a chain of kernels, each of which waits for the one before it; a small kernel costs its launch
and that wait more than its work. Where a run of generated kernels without reductions (RoPE of q, the cache writes
of k and v) neither reads nor writes what another of the run writes, one launch runs them all: its grid is theirs
laid end to end, and each block runs the part its index falls in, over that part's own blocks. The kernel records
stay as they are (the profile shows the merged launch on the first of them and none on the others); only the
launches change, and only where the parts are small (MAX_PART_BLOCKS), so large elementwise work keeps its own
grid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ...expr import nodes as X
from ...kernels import GeneratedKernel
from ...program import CompiledProgram, KernelCall, TensorRef
from ..clike import ELEMENTWISE_BLOCK, KernelText, Launch, Store, expression_text
from .common import CUDA

MAX_PART_BLOCKS = 1024  # a part's blocks (ELEMENTWISE_BLOCK threads each): 262,144 elements
MAX_PARTS = 8


def _store(k: KernelCall, program: CompiledProgram) -> Store:
    spec: GeneratedKernel = k.spec
    out = k.outs[0]
    store = Store(tuple(out.shape), tuple(out.strides), out.offset, program.dtype_of(out))
    if spec.scatter is not None:
        store.scatter_dim = spec.scatter.dim
        store.scatter_index = spec.scatter.index
        store.scatter_size = out.shape[spec.scatter.dim]
    return store


def part_text(k: KernelCall, program: CompiledProgram, dev, names: str = "", blocks: tuple[str, str] | None = None,
              lang=CUDA) -> tuple[KernelText, Launch]:
    """A generated kernel's text (its parameters named with the prefix `names`) and launch. The text depends on the
    expression, the arguments' dtypes and extents and the output's map only, so the kernels a model repeats layer
    after layer are rendered once (Qwen2.5-1.5B's prefill: 28 layers of the same RoPE and cache writes), the cache
    keyed by a digest of the expression (`X.fingerprint`), by the device (`dev`) the launch is shaped for and by the
    language (`lang`: CUDA, or the hip target's)."""
    spec: GeneratedKernel = k.spec
    st = _store(k, program)
    dts = [program.dtype_of(a) for a in k.args]
    extents = [program.buffers[a.buffer].numel for a in k.args]
    shape, reduce_shape = tuple(spec.iteration_shape(k)), tuple(spec.reduce_shape)
    side = None
    if spec.side is not None:
        o1 = k.outs[1]
        side = (spec.side, Store(tuple(o1.shape), tuple(o1.strides), o1.offset, program.dtype_of(o1)))
    key = (_fingerprint(spec.expr), tuple(dts), tuple(extents), st.shape, st.strides, st.offset, st.dtype,
           st.scatter_dim, None if st.scatter_index is None else _fingerprint(st.scatter_index), st.scatter_size,
           shape, reduce_shape, spec.row_dims, names, blocks, dev, lang.name,
           None if side is None else (_fingerprint(side[0]), side[1].shape, side[1].strides, side[1].offset,
                                      side[1].dtype))
    if key not in _TEXTS:
        if len(_TEXTS) >= MAX_CACHED_TEXTS:
            _TEXTS.clear()
        outs = [("out", 0)] + ([("out", 1)] if side is not None else [])
        _TEXTS[key] = expression_text(lang, spec.expr, dts, extents, st, shape, reduce_shape, spec.row_dims,
                                      outs + [("arg", i) for i in range(len(k.args))], names=names,
                                      blocks=blocks, side=side, device=dev)
    text, launch = _TEXTS[key]
    return replace(text, params=list(text.params), body=list(text.body), helpers=set(text.helpers),
                   shared=dict(text.shared)), launch


MAX_CACHED_TEXTS = 2048
_TEXTS: dict[tuple, tuple[KernelText, Launch]] = {}
# each expression object's digest: a program's generated kernel is keyed once when it renders alone and again as a
# merged launch's part (the digest walks the whole tree: a third of a decode step's rendering). Keyed by identity,
# the object kept with its digest so that its id is not reused while the entry lives.
_DIGESTS: dict[int, tuple[X.Expr, bytes]] = {}


def _fingerprint(e: X.Expr) -> bytes:
    hit = _DIGESTS.get(id(e))
    if hit is not None and hit[0] is e:
        return hit[1]
    if len(_DIGESTS) >= 4 * MAX_CACHED_TEXTS:
        _DIGESTS.clear()
    digest = X.fingerprint(e)
    _DIGESTS[id(e)] = (e, digest)
    return digest


def _mergeable(k: KernelCall, launch: Launch | None) -> bool:
    """May `k` (rendered alone as `launch`) be a part: an elementwise generated kernel, small?"""
    if launch is None or not isinstance(k.spec, GeneratedKernel) or k.spec.reduce_shape or k.spec.row_dims:
        return False
    return 0 < launch.grid[0] <= MAX_PART_BLOCKS and launch.block == ELEMENTWISE_BLOCK


def _span(program: CompiledProgram, ref: TensorRef) -> tuple:
    """What memory a reference may touch: an arena buffer's byte range (buffers share the arena), else its
    buffer (each its own allocation; an output that aliases an input is that input's buffer)."""
    b = program.buffers[ref.buffer]
    if b.kind == "arena":
        return ("arena", b.offset, b.offset + b.nbytes)
    return ("buffer", b.id)


def _overlap(a: tuple, b: tuple) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "buffer":
        return a[1] == b[1]
    return a[1] < b[2] and b[1] < a[2]


def _independent(k: KernelCall, reads: list[tuple], writes: list[tuple], program: CompiledProgram) -> bool:
    kr = [_span(program, r) for r in k.args]
    kw = [_span(program, r) for r in k.writes]
    return not any(_overlap(w, x) for w in kw for x in reads + writes) and \
        not any(_overlap(r, w) for r in kr for w in writes)


def groups(program: CompiledProgram, launches: Mapping[int, Launch]) -> list[list[int]]:
    """Runs of at least two consecutive kernels that one launch may run together; `launches` holds the launch of
    each generated kernel rendered alone."""
    out: list[list[int]] = []
    run: list[int] = []
    reads: list[tuple] = []
    writes: list[tuple] = []
    for i, k in enumerate(program.kernels):
        ok = _mergeable(k, launches.get(i))
        if run and ok and len(run) < MAX_PARTS and _independent(k, reads, writes, program):
            run.append(i)
        else:
            if len(run) > 1:
                out.append(run)
            run = [i] if ok else []
            reads, writes = [], []
        if run:
            reads += [_span(program, r) for r in k.args]
            writes += [_span(program, r) for r in k.writes]
    if len(run) > 1:
        out.append(run)
    return out


def merged(program: CompiledProgram, run: list[int], launches: Mapping[int, Launch], dev) -> tuple[str, Launch]:
    """One source and launch for the kernels `run`: block b runs the part whose range of blocks holds it."""
    params: list[tuple[str, str, bool]] = []
    helpers: set[str] = set()
    ptrs: list[tuple[str, int]] = []
    body: list[str] = []
    first = 0
    restrict = True
    for p, i in enumerate(run):
        k = program.kernels[i]
        grid = launches[i].grid[0]
        text, launch = part_text(k, program, dev, f"p{p}_", (f"((int)blockIdx.x - {first})", str(grid)))
        params += text.params
        helpers |= text.helpers
        restrict = restrict and text.restrict
        ptrs += [("buffer", (k.writes if w == "out" else k.args)[j].buffer) for w, j in launch.ptrs]
        cond = f"blockIdx.x < {first + grid}" if p < len(run) - 1 else None
        body.append(("  " if p == 0 else "  } else ") + (f"if ({cond}) {{" if cond else "{"))
        body += ["  " + line for line in text.body]
        first += grid
    body.append("  }")
    text = KernelText(params, ELEMENTWISE_BLOCK, body, helpers, {}, restrict)
    return CUDA.kernel(text), Launch((first, 1, 1), ELEMENTWISE_BLOCK, ptrs)


__all__ = ["groups", "merged", "part_text", "MAX_PART_BLOCKS"]
