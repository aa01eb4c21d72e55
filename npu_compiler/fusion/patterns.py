"""Named fusion patterns on the graph. Each pass rewrites a group of ATen nodes into one compiler op (`npu.*`)
that lowers to one kernel; each can be switched off by name to bisect a numerical problem.

Patterns keep the IR's numerics: where the IR rounds an intermediate to a half dtype (a bf16 matmul result, the
softmax probabilities cast back to bf16), the fused op records it and its kernels round there too.
"""

from __future__ import annotations

import math

from ..dtypes import FLOAT_DTYPES
from ..ir.graph import Graph, Node, TensorType, Value
from ..recipes import Recipe, derived_weight, is_checkpoint_weight
from .match import GraphIndex, other_input, scalar_operand

_CASTS = ("to.dtype", "_to_copy.default", "to.dtype_layout")


def _new_node(name: str, op: str, inputs: list[Value], like: Value, attrs: dict) -> Node:
    node = Node(name, op, inputs, [], attrs)
    node.outputs.append(Value(like.name, like.type, "node", producer=node))
    return node


# ---- RMSNorm ---------------------------------------------------------------------------------------------------


def fuse_rmsnorm(graph: Graph) -> int:
    """to(f32)? -> pow 2 -> mean(-1) -> add eps -> rsqrt -> mul x -> to(dt)? -> mul weight  =>  npu.rmsnorm."""
    gi = GraphIndex(graph)
    count = 0
    for mean in [n for n in graph.nodes if n.op == "mean.dim"]:
        if mean not in graph.nodes:
            continue
        x32 = mean.inputs[0]
        rank = len(x32.shape)
        dims = mean.attrs.get("dim") or []
        if rank == 0 or not mean.attrs.get("keepdim") or [d % rank for d in dims] != [rank - 1]:
            continue
        sq = gi.prod(x32, "pow.Tensor_Scalar", "mul.Tensor")
        if sq is None or not gi.single_use(sq.outputs[0]):
            continue
        if sq.op == "pow.Tensor_Scalar":
            if sq.attrs.get("exponent") != 2:
                continue
        elif not (len(sq.inputs) == 2 and sq.inputs[0] is sq.inputs[1]):
            continue
        x = sq.inputs[0]
        mean_users = gi.users.get(id(mean.outputs[0]), [])
        if len(mean_users) != 1 or mean_users[0].op != "add.Tensor" or len(mean_users[0].inputs) != 1:
            continue
        add = mean_users[0]
        eps = scalar_operand(add)
        if eps is None or not gi.single_use(add.outputs[0]):
            continue
        rs = gi.users[id(add.outputs[0])][0]
        if rs.op != "rsqrt.default" or not gi.single_use(rs.outputs[0]):
            continue
        mulr = gi.users[id(rs.outputs[0])][0]
        if mulr.op != "mul.Tensor" or other_input(mulr, rs.outputs[0]) is not x:
            continue
        tail = mulr
        cast_dtype = None
        group = [sq, mean, add, rs, mulr]
        if gi.single_use(mulr.outputs[0]) and gi.users[id(mulr.outputs[0])][0].op in _CASTS:
            tail = gi.users[id(mulr.outputs[0])][0]
            cast_dtype = tail.outputs[0].dtype
            group.append(tail)
        if not gi.single_use(tail.outputs[0]):
            continue
        wmul = gi.users[id(tail.outputs[0])][0]
        w = other_input(wmul, tail.outputs[0]) if wmul.op == "mul.Tensor" else None
        if w is None or w.shape != (x.shape[-1],):
            continue
        group.append(wmul)
        # The fp32 upcast of the input belongs to the pattern when nothing else reads it.
        src = x
        up = gi.prod(x, *_CASTS)
        if up is not None and gi.only_used_by(x, [sq, mulr]):
            src = up.inputs[0]
            group.insert(0, up)
        new = _new_node(wmul.name, "npu.rmsnorm", [src, w], wmul.outputs[0],
                        {"eps": eps, "compute_dtype": x.dtype, "cast_dtype": cast_dtype})
        gi.replace(group, new, wmul)
        count += 1
    return count


# ---- attention -------------------------------------------------------------------------------------------------


def _unwrap_gqa(gi: GraphIndex, v: Value) -> tuple[Value, int, list[Node]]:
    """reshape(expand(unsqueeze(kv, 2), [b, hk, g, L, d]), [b, hk*g, L, d]) -> (kv, g, nodes): grouped-query
    heads read without materialising the expanded K/V."""
    r = gi.prod(v, "reshape.default", "view.default", "_unsafe_view.default")
    e = gi.prod(r.inputs[0], "expand.default") if r else None
    u = gi.prod(e.inputs[0], "unsqueeze.default") if e else None
    if u is None or len(u.inputs[0].shape) != 4:
        return v, 1, []
    kv = u.inputs[0]
    b, hk, length, d = kv.shape
    if u.attrs.get("dim") % 5 != 2 or len(e.outputs[0].shape) != 5:
        return v, 1, []
    g = e.outputs[0].shape[2]
    if e.outputs[0].shape != (b, hk, g, length, d) or v.shape != (b, hk * g, length, d):
        return v, 1, []
    return kv, g, [r, e, u]


def _written_cache_positions(gi: GraphIndex, kv: Value) -> Value | None:
    """The positions written into a static cache just before attention reads it (index_copy on dim 2 of a graph
    input): slots past the last written position are masked in causal decode and need not be read."""
    n = gi.prod(kv, "index_copy.default")
    if n is None or n.attrs.get("dim") % 4 != 2 or n.inputs[0].kind != "input":
        return None
    return n.inputs[1]


def fuse_attention(graph: Graph, bound_by_valid_len: bool = True) -> int:
    """matmul(q, k^T) [* scale] [+ mask] -> softmax -> [to] -> matmul(p, v), and scaled_dot_product_attention,
    with grouped-query K/V unwrapped  =>  npu.attention."""
    gi = GraphIndex(graph)
    count = 0
    for node in list(graph.nodes):
        if node not in graph.nodes:
            continue
        if node.op == "scaled_dot_product_attention.default":
            count += _rewrite_sdpa(graph, gi, node, bound_by_valid_len)
            continue
        if node.op not in ("softmax.int", "_softmax.default"):
            continue
        sm = node
        rank = len(sm.inputs[0].shape)
        if rank != 4 or sm.attrs.get("dim") % rank != rank - 1:
            continue
        group = [sm]
        cur = sm.inputs[0]
        mask = None
        add = gi.prod(cur, "add.Tensor")
        if add is not None and len(add.inputs) == 2 and gi.single_use(cur):
            roles = _score_and_mask(gi, add, ("mul.Tensor", "div.Tensor", "matmul.default"))
            if roles is None or add.attrs.get("alpha", 1) != 1:
                continue
            scores_side, mask = roles
            group.append(add)
            cur = scores_side
        scale = 1.0
        sc = gi.prod(cur, "mul.Tensor", "div.Tensor")
        if sc is not None and len(sc.inputs) == 1 and scalar_operand(sc) is not None and gi.single_use(cur):
            s = scalar_operand(sc)
            scale = s if sc.op == "mul.Tensor" else 1.0 / s
            group.append(sc)
            cur = sc.inputs[0]
        mm1 = gi.prod(cur, "matmul.default")
        if mm1 is None or not gi.single_use(cur):
            continue
        group.append(mm1)
        q, kt = mm1.inputs
        tr = gi.prod(kt, "transpose.int")
        if tr is None or {tr.attrs["dim0"] % 4, tr.attrs["dim1"] % 4} != {2, 3}:
            continue
        k, gk, k_nodes = _unwrap_gqa(gi, tr.inputs[0])
        # After softmax: an optional cast of the probabilities, then the second matmul.
        out = sm.outputs[0]
        probs_dtype = out.dtype
        if not gi.single_use(out):
            continue
        nxt = gi.users[id(out)][0]
        if nxt.op in _CASTS:
            probs_dtype = nxt.outputs[0].dtype
            group.append(nxt)
            if not gi.single_use(nxt.outputs[0]):
                continue
            out = nxt.outputs[0]
            nxt = gi.users[id(out)][0]
        if nxt.op != "matmul.default" or nxt.inputs[0] is not out:
            continue
        mm2 = nxt
        group.append(mm2)
        v, gv, v_nodes = _unwrap_gqa(gi, mm2.inputs[1])
        if gk != gv or not _attention_shapes(q, k, v, gk):
            continue
        group.append(tr)
        for n in k_nodes + v_nodes:
            if gi.only_used_by(n.outputs[0], group + k_nodes + v_nodes):
                group.append(n)
        inputs = [q, k, v] + ([mask] if mask is not None else [])
        attrs = {"scale": scale, "is_causal": False, "has_mask": mask is not None, "kv_groups": gk,
                 "scores_dtype": mm1.outputs[0].dtype, "softmax_dtype": sm.outputs[0].dtype,
                 "probs_dtype": probs_dtype, "valid_len": False}
        _bound(gi, attrs, inputs, k, v, bound_by_valid_len)
        new = _new_node(mm2.name, "npu.attention", inputs, mm2.outputs[0], attrs)
        gi.replace(group, new, mm2)
        count += 1
    return count


def _attention_shapes(q: Value, k: Value, v: Value, groups: int) -> bool:
    """q [B, H, T, D], k [B, Hk, L, D], v [B, Hk, L, Dv] with H = Hk * groups: what the attention kernel reads."""
    if not len(q.shape) == len(k.shape) == len(v.shape) == 4:
        return False
    b, h, _, d = q.shape
    return (k.shape[0] == v.shape[0] == b and k.shape[1] == v.shape[1] and k.shape[1] * groups == h
            and k.shape[3] == d and v.shape[2] == k.shape[2])


def _bound(gi: GraphIndex, attrs: dict, inputs: list[Value], k: Value, v: Value, enabled: bool) -> None:
    pos_k, pos_v = _written_cache_positions(gi, k), _written_cache_positions(gi, v)
    if enabled and pos_k is not None and pos_k is pos_v and attrs["has_mask"]:
        attrs["valid_len"] = True
        inputs.append(pos_k)


def _rewrite_sdpa(graph: Graph, gi: GraphIndex, node: Node, bound_by_valid_len: bool) -> int:
    q, k_in, v_in = node.inputs[:3]
    mask = node.inputs[3] if len(node.inputs) > 3 else None
    if len(q.shape) != 4 or node.attrs.get("dropout_p", 0.0):
        return 0
    k, gk, k_nodes = _unwrap_gqa(gi, k_in)
    v, gv, v_nodes = _unwrap_gqa(gi, v_in)
    if gk != gv:
        k, v, gk, k_nodes, v_nodes = k_in, v_in, 1, [], []
    if node.attrs.get("enable_gqa") and gk == 1 and len(k.shape) == 4 and k.shape[1] != q.shape[1]:
        gk = q.shape[1] // k.shape[1]
    if not _attention_shapes(q, k, v, gk) or (mask is not None and not _broadcasts_to(
            mask.shape, (*q.shape[:-1], k.shape[-2]))):
        return 0  # the sdpa op keeps its own lowering
    scale = node.attrs.get("scale")
    attrs = {"scale": float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1]),
             "is_causal": bool(node.attrs.get("is_causal")), "has_mask": mask is not None, "kv_groups": gk,
             "scores_dtype": "float32", "softmax_dtype": "float32", "probs_dtype": q.dtype, "valid_len": False,
             "online_softmax": True}
    inputs = [q, k, v] + ([mask] if mask is not None else [])
    _bound(gi, attrs, inputs, k, v, bound_by_valid_len)
    group = [node] + [n for n in k_nodes + v_nodes if gi.only_used_by(n.outputs[0], [node] + k_nodes + v_nodes)]
    new = _new_node(node.name, "npu.attention", inputs, node.outputs[0], attrs)
    gi.replace(group, new, node)
    return 1


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    return all(d in (1, t) for d, t in zip(shape[::-1], target[::-1]))


def _score_and_mask(gi: GraphIndex, add: Node, score_ops: tuple[str, ...]) -> tuple[Value, Value] | None:
    """The operands of `scores + mask` by role: the scores have the sum's full shape, the mask broadcasts to it (a
    [B, 1, T, T] mask beside [B, H, T, T] scores). Where both have the full shape, the one made by a score op (the
    scale, the QK^T matmul) is the scores. None when no assignment fits: the pattern leaves the graph alone."""
    full = add.outputs[0].shape
    a, b = add.inputs
    fits = [(s, m) for s, m in ((a, b), (b, a)) if s.shape == full and _broadcasts_to(m.shape, full)]
    if len(fits) == 2:
        made = [(s, m) for s, m in fits if gi.prod(s, *score_ops) is not None]
        fits = made if len(made) == 1 else fits[:1]
    return fits[0] if fits else None


def fuse_masked_softmax(graph: Graph) -> int:
    """softmax(x * scale [+ mask], dim=-1) outside attention  =>  npu.softmax: the scale and the mask are applied
    as the row is read, rounded where the IR rounds them."""
    gi = GraphIndex(graph)
    count = 0
    for sm in [n for n in graph.nodes if n.op in ("softmax.int", "_softmax.default")]:
        rank = len(sm.inputs[0].shape)
        if rank == 0 or sm.attrs.get("dim") % rank != rank - 1:
            continue
        cur, group, mask, scale = sm.inputs[0], [sm], None, 1.0
        add = gi.prod(cur, "add.Tensor")
        if add is not None and len(add.inputs) == 2 and gi.single_use(cur) and add.attrs.get("alpha", 1) == 1:
            roles = _score_and_mask(gi, add, ("mul.Tensor", "div.Tensor"))
            if roles is None:
                continue
            scaled, mask = roles
            group.append(add)
            cur = scaled
        sc = gi.prod(cur, "mul.Tensor", "div.Tensor")
        if sc is not None and len(sc.inputs) == 1 and scalar_operand(sc) is not None and gi.single_use(cur):
            v = scalar_operand(sc)
            scale = v if sc.op == "mul.Tensor" else 1.0 / v
            group.append(sc)
            cur = sc.inputs[0]
        if len(group) == 1:
            continue
        inputs = [cur] + ([mask] if mask is not None else [])
        attrs = {"scale": scale, "has_mask": mask is not None, "round_dtype": sm.inputs[0].dtype,
                 "divide": sc is not None and sc.op == "div.Tensor" and sc in group}
        if attrs["divide"]:
            attrs["scale"] = scalar_operand(sc)
        new = _new_node(sm.name, "npu.softmax", inputs, sm.outputs[0], attrs)
        gi.replace(group, new, sm)
        count += 1
    return count


# ---- rotary embedding ------------------------------------------------------------------------------------------


def fuse_rope(graph: Graph) -> int:
    """x * cos + cat(-x[..., h:], x[..., :h]) * sin  =>  npu.rope(x, cos, sin)."""
    gi = GraphIndex(graph)
    count = 0
    for cat in [n for n in graph.nodes if n.op == "cat.default"]:
        if cat not in graph.nodes or len(cat.inputs) != 2:
            continue
        rank = len(cat.outputs[0].shape)
        if rank == 0 or cat.attrs.get("dim", 0) % rank != rank - 1:
            continue
        neg = gi.prod(cat.inputs[0], "neg.default")
        s1 = gi.prod(cat.inputs[1], "slice.Tensor")
        s2 = gi.prod(neg.inputs[0], "slice.Tensor") if neg else None
        if s1 is None or s2 is None or s1.inputs[0] is not s2.inputs[0]:
            continue
        x = s1.inputs[0]
        n = x.shape[-1]
        h = n // 2
        if n % 2 or s1.attrs["dim"] % rank != rank - 1 or s2.attrs["dim"] % rank != rank - 1:
            continue
        if (s1.attrs.get("start") or 0, min(s1.attrs.get("end") or n, n)) != (0, h):
            continue
        if (s2.attrs.get("start") or 0, min(s2.attrs.get("end") or n, n)) != (h, n) or s2.attrs.get("step", 1) != 1:
            continue
        if not gi.single_use(cat.outputs[0]):
            continue
        msin = gi.users[id(cat.outputs[0])][0]
        sin = other_input(msin, cat.outputs[0]) if msin.op == "mul.Tensor" else None
        if sin is None or not gi.single_use(msin.outputs[0]):
            continue
        add = gi.users[id(msin.outputs[0])][0]
        mcos_out = other_input(add, msin.outputs[0]) if add.op == "add.Tensor" else None
        mcos = gi.prod(mcos_out, "mul.Tensor") if mcos_out is not None else None
        if mcos is None or add.attrs.get("alpha", 1) != 1 or not gi.single_use(mcos_out):
            continue
        cos = other_input(mcos, x)
        if cos is None or not _broadcasts_to(cos.shape, x.shape) or not _broadcasts_to(sin.shape, x.shape):
            continue
        if add.outputs[0].shape != x.shape:
            continue
        group = [cat, msin, add, mcos, neg]
        for sl in (s1, s2):
            if gi.only_used_by(sl.outputs[0], group):
                group.append(sl)
        new = _new_node(add.name, "npu.rope", [x, cos, sin], add.outputs[0],
                        {"product_dtype": msin.outputs[0].dtype})
        gi.replace(group, new, add)
        count += 1
    return count


# ---- horizontal GEMM fusion -------------------------------------------------------------------------------------


def concat_linears(graph: Graph, recipes: dict[str, Recipe]) -> int:
    """Linears that read the same input (q/k/v, gate/up) become one GEMM over weights concatenated at load time;
    each original output is a slice (a view, no copy) of the combined one."""
    count = 0
    by_input: dict[int, list[Node]] = {}
    for n in graph.nodes:
        if (n.op == "linear.default" and is_checkpoint_weight(graph, n.inputs[1], recipes)
                and len(n.inputs[1].shape) == 2):
            by_input.setdefault(id(n.inputs[0]), []).append(n)
    # every group's new nodes first, then one pass over the graph for all of them (a pass per group made this
    # quadratic in the number of layers)
    new_for: dict[int, Value] = {}
    placed: dict[int, list[Node]] = {}  # id(first member in graph order) -> the nodes that replace the group
    gone: set[int] = set()
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    for members in by_input.values():
        for has_bias in (True, False):
            group = [m for m in members if (len(m.inputs) > 2) == has_bias
                     and (not has_bias or is_checkpoint_weight(graph, m.inputs[2], recipes))
                     and m.inputs[1].dtype == members[0].inputs[1].dtype]
            if len(group) < 2:
                continue
            placed[id(min(group, key=lambda m: order[id(m)]))] = _concat_group(graph, group, has_bias, recipes,
                                                                               new_for)
            gone.update(id(m) for m in group)
            count += 1
    if count:
        nodes: list[Node] = []
        for n in graph.nodes:
            nodes.extend(placed.get(id(n), ()))
            if id(n) not in gone:
                nodes.append(n)
        graph.nodes = nodes
        graph.replace_all(new_for)
    return count


def _concat_value(graph: Graph, parts: list[Value], recipes: dict[str, Recipe]) -> Value:
    """The parts concatenated along rows at load time: one value for every group over the same parts (ALBERT's
    layers all read one layer's q/k/v)."""
    keys = [graph.weight_keys[p.name] for p in parts]
    shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
    recipe = Recipe("concat", {str(i): k for i, k in enumerate(keys)},
                    {"axis": 0, "shapes": [list(p.shape) for p in parts]})
    return derived_weight(graph, recipes, "concat(" + ",".join(keys) + ")", TensorType(shape, parts[0].dtype), recipe)


def _concat_group(graph: Graph, group: list[Node], has_bias: bool, recipes: dict[str, Recipe],
                  new_for: dict[int, Value]) -> list[Node]:
    """The combined linear and its slices for one group (placed by the caller where the group's first member
    was); `new_for` gets each member's output -> its slice."""
    x = group[0].inputs[0]
    w = _concat_value(graph, [m.inputs[1] for m in group], recipes)
    inputs = [x, w] + ([_concat_value(graph, [m.inputs[2] for m in group], recipes)] if has_bias else [])
    total = w.shape[0]
    out_shape = (*group[0].outputs[0].shape[:-1], total)
    lin = Node("+".join(m.name for m in group), "linear.default", inputs, [], {})
    lin.outputs.append(Value(lin.name, TensorType(out_shape, group[0].outputs[0].dtype), "node", producer=lin))
    lin.origin = [o for m in group for o in m.origin]
    new_nodes = [lin]
    start = 0
    for m in group:
        n = m.outputs[0].shape[-1]
        sl = Node(f"{m.name}.slice", "slice.Tensor", [lin.outputs[0]], [],
                  {"dim": -1, "start": start, "end": start + n, "step": 1})
        sl.outputs.append(Value(m.outputs[0].name, m.outputs[0].type, "node", producer=sl))
        sl.origin = list(m.origin)
        new_for[id(m.outputs[0])] = sl.outputs[0]
        new_nodes.append(sl)
        start += n
    return new_nodes


# ---- GEMM and conv epilogues ----------------------------------------------------------------------------------


def fuse_gemm_epilogue(graph: Graph) -> int:
    """linear(x, w, b) + residual  =>  npu.linear with a residual epilogue (one kernel, one write); a weight-only
    linear (npu.wlinear) alike, its residual its last input."""
    gi = GraphIndex(graph)
    count = 0
    for add in [n for n in graph.nodes if n.op == "add.Tensor" and len(n.inputs) == 2]:
        if add.attrs.get("alpha", 1) != 1:
            continue
        for lin_out in add.inputs:
            lin = gi.prod(lin_out, "linear.default")
            wlin = gi.prod(lin_out, "npu.wlinear")
            res = other_input(add, lin_out)
            if (lin is None and wlin is not None and not wlin.attrs.get("has_residual") and res is not None
                    and res is not lin_out and gi.single_use(lin_out) and res.shape == lin_out.shape
                    == add.outputs[0].shape and res.dtype == lin_out.dtype == add.outputs[0].dtype):
                new = _new_node(add.name, "npu.wlinear", [*wlin.inputs, res], add.outputs[0],
                                {**wlin.attrs, "has_residual": True})
                gi.replace([wlin, add], new, add)
                count += 1
                break
            if lin is None or res is None or res is lin_out or not gi.single_use(lin_out):
                continue
            if res.shape != add.outputs[0].shape or lin_out.shape != add.outputs[0].shape:
                continue
            if res.dtype != add.outputs[0].dtype:
                continue
            new = _new_node(add.name, "npu.linear", [*lin.inputs, res], add.outputs[0],
                            {"has_bias": len(lin.inputs) > 2, "has_residual": True})
            gi.replace([lin, add], new, add)
            count += 1
            break
    return count


MAX_ACTIVATION_OPS = 8  # a conv epilogue's chain of elementwise ops (GELU's tanh form is one op of the table)


def activation_op(node: Node, x: Value) -> bool:
    """Whether `node` is an elementwise activation of `x` that an epilogue can compute: an op of the expression table
    (relu, silu, gelu, hardswish, sigmoid, tanh, leaky_relu, clamp, ...) whose one tensor operand is `x` and whose
    result has x's shape and dtype (its scalars, like leaky_relu's slope, sit in its attrs)."""
    from ..expr.aten_table import ELEMENTWISE

    out = node.outputs[0] if len(node.outputs) == 1 else None
    return (node.op in ELEMENTWISE and node.inputs == [x] and out is not None and out.shape == x.shape
            and out.dtype == x.dtype and x.dtype in FLOAT_DTYPES)


def fuse_conv_epilogue(graph: Graph) -> int:
    """conv2d (+ folded BN bias) [+ residual] [-> elementwise activations]  =>  npu.conv2d with the epilogue in the
    kernel. The activations are any chain of unary ops of the expression table (`activation_op`), computed and
    rounded as the unfused graph computes them; the record holds them as its epilogue expression, which every
    target renders."""
    gi = GraphIndex(graph)
    count = 0
    for conv in [n for n in graph.nodes if n.op == "conv2d.default"]:
        group = [conv]
        out = conv.outputs[0]
        inputs = list(conv.inputs)
        attrs = {**conv.attrs, "has_bias": len(conv.inputs) > 2, "has_residual": False, "activation": ()}
        tail = conv
        if gi.single_use(out):
            nxt = gi.users[id(out)][0]
            res = other_input(nxt, out) if nxt.op == "add.Tensor" else None
            if (res is not None and res is not out and res.shape == out.shape and nxt.attrs.get("alpha", 1) == 1
                    and res.dtype == out.dtype == nxt.outputs[0].dtype):
                attrs["has_residual"] = True
                inputs.append(res)
                group.append(nxt)
                tail = nxt
                out = nxt.outputs[0]
        chain = []
        while len(chain) < MAX_ACTIVATION_OPS and gi.single_use(out) and activation_op(gi.users[id(out)][0], out):
            act = gi.users[id(out)][0]
            chain.append((act.op, dict(act.attrs)))
            group.append(act)
            tail = act
            out = act.outputs[0]
        attrs["activation"] = tuple(chain)
        if tail is conv:
            continue
        new = _new_node(tail.name, "npu.conv2d", inputs, tail.outputs[0], attrs)
        gi.replace(group, new, tail)
        count += 1
    return count
