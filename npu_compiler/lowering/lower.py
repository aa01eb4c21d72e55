"""Lowering: every node of the normalised graph becomes kernel calls over buffers, or a strided alias (views).

Generated (expression) kernels cover elementwise ops, reductions, copies, constants, norms, softmax, RoPE, gathers,
pooling and the cache write; library kernels cover GEMM, convolution and attention. Every kernel records the IR nodes
it came from, and every kernel record is checked against its tensors as it is built.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..dtypes import is_float, itemsize
from ..errors import InternalError, NPUSimError, UnsupportedOpError
from ..expr import nodes as X
from ..expr.aten_table import ELEMENTWISE, build_elementwise, cast, const
from ..ir.graph import HOISTED_ROWS, Graph, Node, TensorType, Value
from ..ir.infer import RULES
from ..ir.schema import lookup
from ..kernels import GeneratedKernel, KernelSpec, Scatter
from ..passes.dead_code import random_reason
from ..program import BufferSpec, KernelCall, TensorRef, TensorSpec, contiguous_strides, full_ref
from ..targets.codegen import CodegenTarget
from . import views as V
from .greedy import Pending, bind_args, compose, recomputes_costly
from .planning import attach
from .registry import KERNELS_OF, LOWERINGS, lowers

VIEW_OPS = (
    "view.default", "reshape.default", "_unsafe_view.default", "flatten.using_ints", "unsqueeze.default",
    "squeeze.default", "squeeze.dim", "squeeze.dims", "transpose.int", "t.default", "permute.default", "expand.default",
    "slice.Tensor", "select.int", "split.Tensor", "split_with_sizes.default", "chunk.default", "diagonal.default",
)
CONV_OPS = ("conv2d.default", "npu.conv2d", "npu.qconv2d")
REDUCE_OPS = ("mean.default", "mean.dim", "sum.default", "sum.dim_IntList", "amax.default")

Loader = Callable[..., X.Expr]


class Lowering:
    def __init__(self, graph: Graph, target: CodegenTarget, greedy_fusion: bool = False,
                 conv_im2col: bool = True, conv_tensor_cores: bool = True, gemm_prologue: bool = True) -> None:
        self.graph = graph
        self.greedy_fusion = greedy_fusion
        # norms and elementwise producers of a few rows computed by the GEMM that reads them (target permitting)
        self.gemm_prologue_rows = target.gemm_prologue_rows if gemm_prologue and greedy_fusion else 0
        self.target = target
        # k x k convs as an im2col copy + GEMM: on targets whose GEMM library is much faster than a direct conv
        self.conv_im2col = conv_im2col and target.gemm_im2col
        self.buffers: list[BufferSpec] = []
        self.kernels: list[KernelCall] = []
        self.refs: dict[int, TensorRef] = {}
        self.inputs: list[TensorSpec] = []
        self.outputs: list[TensorSpec] = []
        self.weight_buffers: dict[str, int] = {}
        self._node: Node | None = None
        self._index = 0
        self._inplace_inputs: dict[int, str] = {}  # buffer id -> graph input name updated in place
        self._roots, self._last_read, self._root_is_output = self._view_roots()
        self.pending: dict[int, Pending] = {}
        # what lowering rules share across nodes, by rule (one tile table for every attention over a mask)
        self.memo: dict[str, dict] = {}
        self._graph_outputs = {id(v) for v in graph.outputs}
        self._users: dict[int, list[Node]] | None = None
        # Where convs run as implicit GEMMs on matrix units, image activations are channels-last ([N, H, W, C] in
        # memory: a pixel's channels are one contiguous run, which the GEMM's K walks) and conv weights are kept as
        # [O, kh, kw, C] (their K in the same order), made so at load (WeightSpec.layout).
        convs = [n for n in graph.nodes if n.op in CONV_OPS and len(n.inputs[0].shape) == 4
                 and len(n.inputs[1].shape) == 4] if conv_tensor_cores else []
        decided = target.convs_on_tensor_cores([
            ((n.inputs[0].dtype, n.inputs[1].dtype, n.outputs[0].dtype), int(n.attrs["groups"]), n.inputs[0].shape,
             n.inputs[1].shape, n.outputs[0].shape) for n in convs])
        self._tc_convs = {id(n) for n, on in zip(convs, decided, strict=True) if on}
        self.channels_last = bool(self._tc_convs)
        self.weight_layouts: dict[str, tuple[int, ...]] = self._conv_weight_layouts()

    # ---- buffers ----------------------------------------------------------------------------------------------
    def new_buffer(self, name: str, kind: str, dtype: str, numel: int, data: bytes | None = None) -> BufferSpec:
        b = BufferSpec(len(self.buffers), name, kind, dtype, numel, data=data)
        self.buffers.append(b)
        return b

    def dtype_of(self, ref: TensorRef) -> str:
        return self.buffers[ref.buffer].dtype

    def ref(self, v: Value, pending_ok: bool = False) -> TensorRef:
        """`v`'s strided reference. Unless the caller can inline a pending (not yet written) elementwise result,
        this writes it out first."""
        r = self.refs[id(v)]
        if not pending_ok and r.buffer in self.pending:
            self.materialize(r.buffer)
        return r

    def bind(self, v: Value, ref: TensorRef) -> None:
        if tuple(ref.shape) != tuple(v.shape):
            raise InternalError(f"lowering node '{self._node.name if self._node else '?'}'",
                                f"{v.name} bound to shape {ref.shape}, expected {v.shape}")
        self.refs[id(v)] = ref

    def fresh(self, v: Value) -> TensorRef:
        """A new contiguous intermediate buffer for `v`."""
        b = self.new_buffer(v.name, "arena", v.dtype, v.type.numel)
        r = full_ref(b, v.shape)
        self.bind(v, r)
        return r

    def users(self, v: Value) -> list[Node]:
        """The nodes that read `v` (the graph's index of them, built on first use)."""
        if self._users is None:
            self._users = self.graph.users()
        return self._users.get(id(v), [])

    def is_graph_output(self, v: Value) -> bool:
        return id(v) in self._graph_outputs

    def conv_on_tensor_cores(self, node: Node) -> bool:
        """Whether this conv2d node runs as the target's implicit-GEMM kernel on matrix units (decided for the whole
        program when lowering starts)."""
        return id(node) in self._tc_convs

    def _conv_weight_layouts(self) -> dict[str, tuple[int, ...]]:
        """The weights to keep as [O, kh, kw, C]: those whose only uses are as the weight of convs on matrix units
        with input channels a multiple of 16 bytes (a pixel's K run then splits into 16-byte copies)."""
        tc = self._tc_convs
        names = {id(v): name for name, v in self.graph.weights.items()}
        ok: dict[int, bool] = {}
        for n in self.graph.nodes:
            for i, v in enumerate(n.inputs):
                if id(v) in names:
                    good = id(n) in tc and i == 1 and v.shape[1] * itemsize(v.dtype) % 16 == 0
                    ok[id(v)] = ok.get(id(v), True) and good
        for v in self.graph.outputs:
            if id(v) in ok:
                ok[id(v)] = False
        return {names[i]: (0, 2, 3, 1) for i, good in ok.items() if good}

    def batch_folded(self, v: Value) -> bool:
        """Is `v` an image batch [N, C, H, W] (N > 1) that this target keeps channel-major, [C, N, H, W] in memory?
        Then every convolution is one GEMM over all the batch's pixels (the batch folded into the GEMM's N), not
        one small GEMM per image."""
        return self.target.gemm_im2col and len(v.shape) == 4 and v.shape[0] > 1

    def fresh_activation(self, v: Value) -> TensorRef:
        """A new buffer for a conv or pooling result: channels-last where convs run on matrix units, channel-major
        where the batch is folded into cuBLAS GEMMs (a strided view of it is what the IR value binds to), else
        contiguous."""
        if len(v.shape) != 4 or not (self.channels_last or self.batch_folded(v)):
            return self.fresh(v)
        n, c, h, w = v.shape
        b = self.new_buffer(v.name, "arena", v.dtype, v.type.numel)
        strides = (h * w * c, 1, w * c, c) if self.channels_last else (h * w, n * h * w, w, 1)
        r = TensorRef(b.id, (n, c, h, w), strides, 0)
        self.bind(v, r)
        return r

    def scratch(self, name: str, dtype: str, shape: tuple[int, ...]) -> TensorRef:
        return full_ref(self.new_buffer(name, "arena", dtype, math.prod(shape)), shape)

    def plan(self, k: KernelCall) -> None:
        """Ask the target how it computes `k` on its device (`CodegenTarget.plan`) and give the plan the scratch it
        needs, a buffer of its own (one buffer for every call whose plan shares it: an attention's tile table over
        one mask) that the memory plan places like any intermediate."""
        plan = self.target.plan(k, self.buffers)
        if plan is None:
            return
        attach(k, plan, self.buffers, self.memo.setdefault("plan_scratch", {}),
               self._node.name if self._node else k.name)
        try:
            plan.check(k, self.buffers)
        except ValueError as e:
            raise InternalError(f"planning {k.name}", f"the target made an invalid {k.kind} plan: {e}") from e

    def view_value(self, v: Value, shape: tuple[int, ...]) -> Value:
        """A stand-in for `v` seen with another shape (a view where the layout allows it, else a copy), to lower one
        op as another (conv1d as conv2d over [N, C, 1, L] views). It keeps `v`'s kind: a weight stays a weight."""
        ref = self.ref(v, pending_ok=True)
        r = V.reshape(ref, tuple(shape)) or V.reshape(self.contiguous(ref), tuple(shape))
        nv = Value(v.name, TensorType(tuple(shape), v.dtype), v.kind)
        self.bind(nv, r)
        return nv

    @staticmethod
    def stand_in(v: Value, shape: tuple[int, ...]) -> Value:
        """An unbound value of `v`'s dtype and another shape: the result of an op lowered as another."""
        return Value(v.name, TensorType(tuple(shape), v.dtype), "node")

    # ---- kernels ----------------------------------------------------------------------------------------------
    def emit(self, spec: KernelSpec, args: list[TensorRef], outs: list[TensorRef], group: str | None = None,
             nodes: list[str] | None = None) -> KernelCall:
        node = self._node
        k = KernelCall(
            name=f"k{len(self.kernels)}_{spec.kind}",
            spec=spec,
            args=args,
            outs=outs,
            nodes=nodes if nodes is not None else (list(node.origin) if node else []),
            group=group or (node.op if node else "copy"),
            out_values=[v.name for v in node.outputs] if node else [],
            out_rows=list(self.graph.meta.get(HOISTED_ROWS, {}).get(node.outputs[0].name, []))
            if node and node.outputs else [],
        )
        try:
            spec.check(k, self.buffers)
        except ValueError as e:
            where = f"node '{node.name}' ({node.op})" if node else "an output copy"
            raise InternalError(f"lowering {where}", f"the lowering built an invalid {spec.kind} kernel: {e}") from e
        self.kernels.append(k)
        return k

    def generated(self, out: TensorRef, build: Callable[[Loader], X.Expr], reduce_shape: tuple[int, ...] = (),
                  row_dims: int = 0) -> KernelCall:
        """Emit a generated kernel writing `out`. `build(load)` makes the expression; `load(ref)` reads a
        (broadcastable) operand at the output index, `load(ref, rstrides)` inside a reduction, inlining the operand
        when it is a pending elementwise result."""
        origins: list[str] = []
        expr = build(self.loader(out.shape, reduce_shape, origins))
        return self._emit_generated(out, expr, reduce_shape, origins, row_dims)

    def loader(self, out_shape: tuple[int, ...], reduce_shape: tuple[int, ...], origins: list[str],
               inlined: list[tuple[int, tuple[int, ...], int, bool]] | None = None) -> Loader:
        """`inlined`, where given, gets (buffer, strides, offset, inside a reduction) of each pending result a load
        inlines."""
        def load(ref: TensorRef, rstrides: tuple[int, ...] | None = None, strides: tuple[int, ...] | None = None
                 ) -> X.Expr:
            if rstrides is None and strides is None:  # broadcast the operand to the output
                e = V.expand(ref, out_shape)
                return self.load_raw(ref.buffer, e.strides, e.offset, (), out_shape, (), origins, inlined)
            return self.load_raw(ref.buffer, tuple(strides if strides is not None else ref.strides), ref.offset,
                                 tuple(rstrides or ()), out_shape, reduce_shape, origins, inlined)

        return load

    def load_raw(self, buffer: int, strides: tuple[int, ...], offset: int, rstrides: tuple[int, ...],
                 out_shape: tuple[int, ...], reduce_shape: tuple[int, ...], origins: list[str],
                 inlined: list[tuple[int, tuple[int, ...], int, bool]] | None = None) -> X.Expr:
        p = self.pending.get(buffer)
        if p is not None:
            sizes = tuple(out_shape) + (tuple(reduce_shape) if rstrides else ())
            all_strides = tuple(strides) + tuple(rstrides)
            e = None if recomputes_costly(p, all_strides, sizes) else compose(p, all_strides, offset, sizes,
                                                                              len(out_shape))
            if e is not None:
                origins.extend(o for o in p.origin if o not in origins)
                if inlined is not None:
                    inlined.append((buffer, tuple(strides), offset, bool(rstrides)))
                return e
            self.materialize(buffer)
        return X.Load(self.buffers[buffer].dtype, buffer, tuple(strides), offset, tuple(rstrides))

    def gather(self, ref: TensorRef, indices: tuple[X.Expr, ...], guard: X.Expr | None = None,
               fill: float | int | bool = 0) -> X.Gather:
        """A read of the (written) tensor `ref` at computed indices."""
        if ref.buffer in self.pending:
            self.materialize(ref.buffer)
        return X.Gather(self.dtype_of(ref), ref.buffer, ref.offset, tuple(ref.shape), tuple(ref.strides),
                        tuple(indices), guard, fill)

    def _emit_generated(self, out: TensorRef, expr: X.Expr, reduce_shape: tuple[int, ...], origins: list[str],
                        row_dims: int = 0, scatter: Scatter | None = None,
                        side: tuple[TensorRef, X.Expr] | None = None) -> KernelCall:
        exprs, arg_buffers = bind_args([expr, scatter.index if scatter else None, side[1] if side else None])
        expr = exprs[0]
        if scatter is not None:
            scatter = Scatter(scatter.dim, exprs[1], scatter.shape)
        spec = GeneratedKernel(expr, tuple(reduce_shape), row_dims, scatter, exprs[2])
        k = self.emit(spec, [full_ref(self.buffers[b]) for b in arg_buffers], [out] + ([side[0]] if side else []))
        nodes = list(dict.fromkeys([*origins, *k.nodes]))
        if len(nodes) > len(k.nodes):
            k.nodes = nodes
            # an elementwise op or reduction with producers inlined; a pattern (norm, RoPE, softmax) keeps its name
            if self._node is None or self._node.op in ELEMENTWISE or self._node.op in REDUCE_OPS:
                k.group = "fused_elementwise"
        return k

    def side_output(self, out: TensorRef, inlined: list[tuple[int, tuple[int, ...], int, bool]]
                    ) -> tuple[TensorRef, X.Expr] | None:
        """A pending elementwise result that the row kernel writing `out` computes at each of its own elements
        (read element for element, in its own index space) and that a later kernel reads: the row kernel stores it
        too (`GeneratedKernel.side`), in place of a pass that would write it alone (a residual sum and the norm
        that reads it: one kernel). Where the target keeps such stores apart (`row_side_outputs`), none."""
        if not (self.greedy_fusion and self.target.row_side_outputs):
            return None
        shape = tuple(out.shape)
        own = contiguous_strides(shape)
        for buffer, strides, offset, in_reduce in inlined:
            p = self.pending.get(buffer)
            if (p is None or in_reduce or p.reduce_shape or math.prod(p.shape) != math.prod(shape) or offset
                    or any(n != 1 and s != c for s, c, n in zip(strides, own, shape)) or buffer == out.buffer
                    or self.buffers[buffer].numel != math.prod(shape)):
                continue
            root = self._roots.get(id(p.node.outputs[0]), id(p.node.outputs[0]))
            if self._last_read.get(root, -1) <= self._index and root not in self._root_is_output:
                continue  # no later kernel reads it: it need not be written at all
            e = compose(p, own, 0, shape, len(shape))  # its value at each of the row kernel's own elements
            if e is None:
                continue
            del self.pending[buffer]
            return TensorRef(buffer, shape, own, 0), e
        return None

    def materialize(self, buffer: int) -> None:
        """Write a pending result to its buffer (a consumer needs it in memory)."""
        p = self.pending.pop(buffer)
        saved, self._node = self._node, p.node
        self._emit_generated(full_ref(self.buffers[buffer], p.shape), p.expr, p.reduce_shape, p.origin,
                             row_dims=1 if p.reduce_shape else 0)
        self._node = saved

    def defer_row(self, out: TensorRef, n_rows: int) -> bool:
        """Keep the row result the current node writes to `out` pending, for a GEMM prologue to compute (see
        `CodegenTarget.gemm_prologue`): where greedy fusion is on, the target folds norms of this few rows into its
        GEMMs, and the node writes one value that is not a graph output into a buffer of its own."""
        node = self._node
        return (node is not None and 0 < n_rows <= self.gemm_prologue_rows
                and len(node.outputs) == 1 and id(node.outputs[0]) not in self._graph_outputs
                and out.is_whole(self.buffers[out.buffer].numel) and out.is_contiguous()
                and self.refs.get(id(node.outputs[0])) is out)

    def prologue(self, a: TensorRef, b: TensorRef | None, batch: tuple[int, ...], m: int, k: int,
                 origins: list[str], fits: Callable[[bool], bool] | None = None) -> X.Expr | None:
        """The expression of a GEMM's operand `a` (a view [batch..., m, k]) where it is a pending result the target
        computes in the GEMM's prologue; None where it is read from memory (written first if pending). `fits(reduces)`
        asks the target in place of `gemm_prologue` (a weight-only GEMM's operand b is codes)."""
        p = self.pending.get(a.buffer)
        if p is None:
            return None
        e = None
        if fits is None:
            def fits(reduces: bool) -> bool:
                return self.target.gemm_prologue(m, k, batch, self.dtype_of(a), b, self.dtype_of(b), reduces)
        if m <= self.gemm_prologue_rows and fits(bool(p.reduce_shape)):
            e = compose(p, tuple(a.strides), a.offset, tuple(a.shape), len(a.shape), prologue=True)
        if e is None:
            self.materialize(a.buffer)
            return None
        origins.extend(o for o in p.origin if o not in origins)
        root = self._roots.get(id(p.node.outputs[0]), id(p.node.outputs[0]))
        if self._last_read.get(root, -1) <= self._index and root not in self._root_is_output:
            del self.pending[a.buffer]  # no later node reads it: it is never written
        return e

    def flush_readers(self, buffer: int) -> None:
        """Before `buffer` is overwritten in place, write out every pending result that still reads it."""
        for b in [b for b, p in self.pending.items() if buffer in p.reads]:
            self.materialize(b)

    def contiguous(self, ref: TensorRef, dtype: str | None = None) -> TensorRef:
        """`ref` itself when contiguous, else a copy (the only place layouts cost a kernel)."""
        if ref.buffer in self.pending and ref.is_contiguous() and dtype in (None, self.dtype_of(ref)):
            self.materialize(ref.buffer)
        if ref.is_contiguous() and dtype in (None, self.dtype_of(ref)):
            return ref  # a contiguous window (offset) is fine for every library kernel
        dt = dtype or self.dtype_of(ref)
        out = self.scratch(f"{self._node.name if self._node else 'copy'}.contig", dt, tuple(ref.shape))
        self.generated(out, lambda load: cast(load(ref), dt))
        return out

    # ---- driver -----------------------------------------------------------------------------------------------
    def run(self) -> None:
        g = self.graph
        for v in g.inputs:
            b = self.new_buffer(v.name, "input", v.dtype, v.type.numel)
            self.bind(v, full_ref(b, v.shape))
        for name, v in g.weights.items():
            b = self.new_buffer(name, "weight", v.dtype, v.type.numel)
            self.weight_buffers[name] = b.id
            order = self.weight_layouts.get(name)
            if order:
                stored = full_ref(b, tuple(v.shape[d] for d in order))
                self.bind(v, V.permute(stored, [order.index(d) for d in range(len(order))]))
            else:
                self.bind(v, full_ref(b, v.shape))
        for name, v in g.constants.items():
            b = self.new_buffer(name, "constant", v.dtype, v.type.numel, data=_constant_bytes(v))
            self.bind(v, full_ref(b, v.shape))
        for i, node in enumerate(g.nodes):
            self._node = node
            self._index = i
            handler = self._handler(node)
            try:
                if takes_dim_of_a_scalar(node):
                    self._lower_scalar_as_vector(handler, node)
                else:
                    handler(self, node)
            except NPUSimError:
                raise
            except Exception as e:
                # The reader has checked this node against its op's shape rule, so an exception here is a bug in its
                # lowering: reported as one (not blamed on the model), naming the node it failed on.
                raise InternalError(f"lowering {describe_node(node)}", e) from e
        self._node = None
        self._bind_outputs()

    def _lower_scalar_as_vector(self, handler: Callable[[Lowering, Node], None], node: Node) -> None:
        """An op that takes a dim, over a 0-d tensor, as ATen computes it: ATen wraps a 0-d tensor's dim as if the
        tensor were 1-d (`maybe_wrap_dim(dim, max(ndim, 1))`: dim 0 and -1 name its one element), so the node is
        lowered over [1] views of its 0-d operands, and each result, of one element (or none), is bound back to
        the node's declared shape. One rule for every such op (reductions, softmax, scans, sorts, gathers and
        scatters), in place of a 0-d branch in each lowering."""
        ins = [self.view_value(v, (1,)) if v.type.rank == 0 else v for v in node.inputs]
        synth = Node(node.name, node.op, ins, [], dict(node.attrs), origin=list(node.origin))
        synth.outputs = [self.stand_in(o, t.shape) for o, t in zip(node.outputs, RULES[node.op](synth), strict=True)]
        for o, s in zip(node.outputs, synth.outputs, strict=True):
            if s.type.numel != o.type.numel:  # not one element in, one out: lowered as the op itself
                handler(self, node)
                return
        handler(self, synth)
        for o, s in zip(node.outputs, synth.outputs, strict=True):
            r = self.ref(s, pending_ok=True)
            self.bind(o, V.reshape(r, o.shape) or V.reshape(self.contiguous(r), o.shape))

    def _handler(self, node: Node) -> Callable[[Lowering, Node], None]:
        fn = LOWERINGS.get(node.op)
        if fn is None:
            raise UnsupportedOpError(node.name, f"aten.{node.op}", self.target.name, random_reason(node.op) or "")
        missing = [k for k in KERNELS_OF[node.op] if k not in self.target.library_kernels]
        if missing:
            raise UnsupportedOpError(node.name, f"aten.{node.op}", self.target.name,
                                     f"the target provides no {', '.join(missing)} kernel")
        return fn

    # ---- outputs ----------------------------------------------------------------------------------------------
    def _bind_outputs(self) -> None:
        g = self.graph
        claimed: set[int] = set()
        for v, name in zip(g.outputs, g.output_names):
            ref = self.ref(v)
            buf = self.buffers[ref.buffer]
            whole = ref.is_whole(buf.numel)
            if whole and buf.id in self._inplace_inputs and buf.id not in claimed:
                claimed.add(buf.id)
                self.outputs.append(TensorSpec(name, v.shape, v.dtype, v.dtype, buf.id,
                                               alias_of=self._inplace_inputs[buf.id]))
                continue
            if whole and buf.kind == "arena" and buf.id not in claimed:
                buf.kind, buf.name = "output", name
                claimed.add(buf.id)
                self.outputs.append(TensorSpec(name, v.shape, v.dtype, v.dtype, buf.id))
                continue
            ob = self.new_buffer(name, "output", v.dtype, v.type.numel)
            claimed.add(ob.id)
            self._node = None
            k = self.generated(full_ref(ob, v.shape), lambda load, ref=ref, dt=v.dtype: cast(load(ref), dt))
            k.group = "output_copy"
            k.nodes = [v.producer.name] if v.producer else []
            self.outputs.append(TensorSpec(name, v.shape, v.dtype, v.dtype, ob.id))
        for v in g.inputs:
            self.inputs.append(TensorSpec(v.name, v.shape, v.dtype, v.dtype, self.ref(v).buffer))

    # ---- in-place analysis ----------------------------------------------------------------------------------
    def _view_roots(self) -> tuple[dict[int, int], dict[int, int], set[int]]:
        """root(value) through view ops; the last node index reading any value of a root; roots that are outputs."""
        roots: dict[int, int] = {}
        last: dict[int, int] = {}
        for i, n in enumerate(self.graph.nodes):
            for v in n.inputs:
                r = roots.get(id(v), id(v))
                last[r] = max(last.get(r, -1), i)
            if n.op in VIEW_OPS:
                for o in n.outputs:
                    roots[id(o)] = roots.get(id(n.inputs[0]), id(n.inputs[0]))
        outs = {roots.get(id(v), id(v)) for v in self.graph.outputs}
        return roots, last, outs

    def can_overwrite(self, v: Value, result: Value) -> bool:
        """May the node at the current index write its result into `v`'s buffer? Only when nothing reads `v` (or a
        view of it) later, `v` is not itself returned, and, for a graph input, the result is returned (the caller
        asked for the update: the KV cache)."""
        r = self._roots.get(id(v), id(v))
        if self._last_read.get(r, -1) > self._index or r in self._root_is_output:
            return False
        ref = self.ref(v)
        buf = self.buffers[ref.buffer]
        if not ref.is_whole(buf.numel):
            return False
        if buf.kind == "input":
            res_root = self._roots.get(id(result), id(result))
            return res_root in self._root_is_output or id(result) in {id(o) for o in self.graph.outputs}
        return buf.kind == "arena"

    # ---- elementwise ------------------------------------------------------------------------------------------
    def lower_elementwise(self, node: Node, build: Callable[[Loader], X.Expr] | None = None) -> None:
        """An elementwise node: its ATen table entry, or `build(load)` for an elementwise op defined elsewhere (PT2E's
        quantize/dequantize), kept pending for its readers to inline where greedy fusion is on."""
        out_v = node.outputs[0]
        if build is None:
            operands = [self.ref(v, pending_ok=True) for v in node.inputs]
            try:  # an op whose operand dtypes have no expression (integer bitwise and) is refused, not mis-lowered
                build_elementwise(node.op, [X.Const(v.dtype, 0) for v in node.inputs], node.attrs, out_v.dtype)
            except ValueError as e:
                raise UnsupportedOpError(node.name, f"aten.{node.op}", self.target.name, str(e)) from e
            data = DATA_OPERANDS.get(node.op, len(operands))  # type_as reads its other operand's dtype, not its data

            def build(load) -> X.Expr:
                ops = [load(r) if i < data else X.Const(v.dtype, 0)
                       for i, (r, v) in enumerate(zip(operands, node.inputs))]
                return build_elementwise(node.op, ops, node.attrs, out_v.dtype)
        out = self.fresh(out_v)
        if self.greedy_fusion and len(node.outputs) == 1 and id(out_v) not in self._graph_outputs:
            origins: list[str] = []
            expr = build(self.loader(out_v.shape, (), origins))
            self.pending[out.buffer] = Pending(expr, out_v.shape, [*origins, *node.origin], node)
            return
        self.generated(out, build)
        for extra in node.outputs[1:]:
            self.fresh(extra)

    def lower_batch_norm(self, node: Node) -> None:
        x = node.inputs[0]
        c = x.shape[1] if len(x.shape) > 1 else x.shape[0]
        per_channel = (1, c) + (1,) * (len(x.shape) - 2)
        if node.attrs.get("training"):
            # Normalising with the batch's own statistics is another computation than eval BN: refuse it.
            raise UnsupportedOpError(node.name, f"aten.{node.op}", self.target.name,
                                     "batch_norm with batch statistics (training=True, or a BatchNorm without "
                                     "running stats); export the model in eval mode")
        # With running statistics the IR lists (x, weight, bias, mean, var), or (x, mean, var) for affine=False
        # (the None weight and bias are dropped).
        if len(node.inputs) not in (3, 5):
            raise UnsupportedOpError(node.name, f"aten.{node.op}", self.target.name,
                                     "batch_norm with only one of weight and bias")
        refs = [self.ref(x, pending_ok=True)] + [V.reshape(self.ref(v), per_channel) for v in node.inputs[1:]]
        out = self.fresh(node.outputs[0])

        def build(load: Loader) -> X.Expr:
            ops: list[X.Expr] = [load(r) for r in refs]
            if len(ops) == 3:
                ops = [ops[0], const(1.0, "float32"), const(0.0, "float32"), ops[1], ops[2]]
            return build_elementwise(node.op, ops, node.attrs, node.outputs[0].dtype)

        self.generated(out, build)
        for extra in node.outputs[1:]:
            self.fresh(extra)

    # ---- views ------------------------------------------------------------------------------------------------
    def lower_view(self, node: Node) -> None:
        op, a = node.op, node.attrs
        src = self.ref(node.inputs[0], pending_ok=True)
        out_v = node.outputs[0] if node.outputs else None
        if op in ("split.Tensor", "split_with_sizes.default", "chunk.default"):
            dim = V.norm_dim(a.get("dim", 0), len(src.shape))
            start = 0
            for o in node.outputs:
                n = o.shape[dim]
                self.bind(o, V.slice_(src, dim, start, start + n, 1))
                start += n
            return
        if op == "transpose.int":
            r = V.transpose(src, a["dim0"], a["dim1"])
        elif op == "t.default":
            r = V.transpose(src, 0, 1) if len(src.shape) == 2 else src
        elif op == "permute.default":
            r = V.permute(src, a["dims"])
        elif op == "expand.default":
            r = V.expand(src, out_v.shape)
        elif op == "slice.Tensor":
            r = V.slice_(src, a["dim"], a["start"], a["end"], a["step"])
        elif op == "select.int":
            r = V.select(src, a["dim"], a["index"])
        elif op == "diagonal.default":
            r = V.diagonal(src, int(a.get("offset", 0)), a.get("dim1", 0), a.get("dim2", 1))
        else:  # view/reshape/flatten/unsqueeze/squeeze: same elements, new shape
            r = V.reshape(src, out_v.shape)
            if r is None:
                r = V.reshape(self.contiguous(src), out_v.shape)
        self.bind(out_v, r)

    # ---- reductions -------------------------------------------------------------------------------------------
    def reduce_read(self, x_v: Value, dims: object, keepdim: bool, out_shape: tuple[int, ...],
                    origins: list[str]) -> tuple[X.Expr, tuple[int, ...], list[int]]:
        """`x_v` read inside a reduction over `dims` (an int, a list, or None/[] for all) for an output of
        `out_shape` (the kept dims, in order; reduced dims of size 1 with keepdim): the read, the reduction shape and
        the reduced dims. Pending producers are inlined into the read."""
        src = self.ref(x_v, pending_ok=True)
        rank = len(x_v.shape)
        if dims is None or dims == []:
            dims = list(range(rank))
        dims = sorted({V.norm_dim(d, rank) for d in (dims if isinstance(dims, list) else [dims])})
        keep = [d for d in range(rank) if d not in dims]
        red_shape = tuple(x_v.shape[d] for d in dims)
        # Output index -> source strides: kept dims map in order; reduced dims (size 1 with keepdim) get stride 0.
        if keepdim:
            ostrides = tuple(0 if d in dims else src.strides[d] for d in range(rank))
        else:
            ostrides = tuple(src.strides[d] for d in keep)
        rstrides = tuple(src.strides[d] for d in dims)
        if not red_shape:  # a 0-d input: a reduction over its one element (kernels need a reduction space)
            red_shape, rstrides = (1,), (0,)
        return self.load_raw(src.buffer, ostrides, src.offset, rstrides, out_shape, red_shape, origins), red_shape, dims

    def lower_reduce(self, node: Node) -> None:
        x_v, out_v = node.inputs[0], node.outputs[0]
        origins: list[str] = []
        read, red_shape, _ = self.reduce_read(x_v, node.attrs.get("dim"), bool(node.attrs.get("keepdim")),
                                              out_v.shape, origins)
        out = self.fresh(out_v)
        count = math.prod(red_shape)
        op = node.op
        acc = "float32" if is_float(out_v.dtype) else "int64"
        body = cast(read, acc)
        if op == "amax.default":
            e: X.Expr = X.Reduce(acc, "max", body)
        else:
            e = X.Reduce(acc, "sum", body)
            if op in ("mean.dim", "mean.default"):
                e = X.Binary(acc, "div", e, const(count, acc))
        self._emit_generated(out, cast(e, out_v.dtype), red_shape, origins)

    # ---- library-kernel helpers -----------------------------------------------------------------------------
    def gemm_operand(self, ref: TensorRef) -> TensorRef:
        """GEMM operands need unit stride in one of their last two dims (a transposed view is fine)."""
        if len(ref.shape) >= 2:
            s_row, s_col = ref.strides[-2], ref.strides[-1]
            rows, cols = ref.shape[-2], ref.shape[-1]
            if (s_col == 1 or cols == 1) and s_row >= cols:
                return ref
            if (s_row == 1 or rows == 1) and s_col >= rows:
                return ref
        return self.contiguous(ref)

    def epilogue_args(self, epilogue: X.Expr | None, first: int, prologue: X.Expr | None = None
                      ) -> tuple[X.Expr | None, list[TensorRef], X.Expr | None]:
        """An epilogue (and a prologue) built with buffer ids as load args -> ones naming kernel arguments from
        `first` on, and those arguments (whole buffers, one per buffer either reads)."""
        if epilogue is None and prologue is None:
            return None, [], None
        exprs, buffers = bind_args([epilogue, prologue], first)
        return exprs[0], [full_ref(self.buffers[b]) for b in buffers], exprs[1]


DIM_ARGS = ("dim", "dims")
# Elementwise ops that read the data of their first operands only (the rest give a dtype): never loaded, so that
# an operand of another shape (type_as of a 0-d tensor by a [7] one) is not broadcast to the result
DATA_OPERANDS = {"type_as.default": 1}


def takes_dim_of_a_scalar(node: Node) -> bool:
    """A node whose op takes a dim (`dim`, `dims`) over a 0-d first operand, with an inference rule for its [1]
    form (`Lowering._lower_scalar_as_vector`)."""
    if not node.inputs or node.inputs[0].type.rank != 0 or node.op not in RULES:
        return False
    schema = lookup(node.op)
    return schema is not None and any(a.name in DIM_ARGS for a in schema.attr_args)


def describe_node(node: Node) -> str:
    """How an error names a node: its name and ATen op, and the IR nodes a fused node stands for."""
    op = node.op if node.op.startswith("npu.") else f"aten.{node.op}"
    fused = f", fused from IR nodes {', '.join(node.origin)}" if len(node.origin) > 1 else ""
    return f"node '{node.name}' ({op}{fused})"


def _constant_bytes(v: Value) -> bytes:
    import numpy as np

    from ..dtypes import ITEMSIZE

    data = v.data if v.data is not None else 0
    np_dtype = {"bfloat16": "float32"}.get(v.dtype, v.dtype)
    arr = np.asarray(data, dtype=np_dtype).reshape(v.shape)
    if v.dtype == "bfloat16":
        import ml_dtypes

        arr = arr.astype(ml_dtypes.bfloat16)
    out = arr.tobytes()
    assert len(out) == v.type.numel * ITEMSIZE[v.dtype]
    return out


# The generic lowerings: every ATen elementwise op, the views, the reductions, batch norm.
lowers(*[op for op in ELEMENTWISE if op not in ("batch_norm.default",
                                                "_native_batch_norm_legit_no_training.default")])(
    Lowering.lower_elementwise)
lowers("batch_norm.default", "_native_batch_norm_legit_no_training.default")(Lowering.lower_batch_norm)
lowers(*VIEW_OPS)(Lowering.lower_view)
lowers(*REDUCE_OPS)(Lowering.lower_reduce)

from . import gathers, indexing, layout, library, quantized, reductions, resample, rows, scans  # noqa: E402,F401

# The ATen ops the compiler lowers (the `npu.*` ops are its own, made by the fusion passes).
SUPPORTED_OPS = frozenset(op for op in LOWERINGS if not op.startswith("npu."))

__all__ = ["Lowering", "SUPPORTED_OPS", "VIEW_OPS", "REDUCE_OPS"]
