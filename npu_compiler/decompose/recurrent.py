"""Recurrent layers (LSTM, GRU, Elman RNN with tanh or ReLU) and their cells, unrolled over the static sequence
length onto GEMMs and elementwise ops.

As ATen computes them on the CPU (aten/src/ATen/native/RNN.cpp): each layer and direction projects its whole input
sequence with one GEMM (`linear(x, w_ih, b_ih)` over [T, B, I]); each step adds the hidden projection
`linear(h, w_hh, b_hh)` to its row of that product and applies the gates in ATen's order of operations; an LSTM
with `proj_size` projects its hidden state (`linear(h, w_hr)`). A bidirectional layer runs its second direction
from the last step to the first and concatenates the two along features; the next layer reads that. Between layers
ATen applies dropout only in training: in eval mode it is ignored, in training it is random and refused.
The greedy fusion makes each step's gates one kernel after its GEMM.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..ir.graph import Node, Value
from .registry import Rewriter, decomposes

_EMITS = ("linear.default", "select.int", "add.Tensor", "sub.Tensor", "mul.Tensor", "chunk.default",
          "sigmoid.default", "tanh.default", "relu.default", "stack.default", "cat.default", "transpose.int",
          "reshape.default")


@dataclass
class _Weights:
    w_ih: Value
    w_hh: Value
    b_ih: Value | None = None
    b_hh: Value | None = None
    w_hr: Value | None = None


Cell = Callable[[Rewriter, Value, Value, Value | None, _Weights], tuple[Value, Value | None]]


def _linear(rw: Rewriter, x: Value, w: Value, b: Value | None) -> Value:
    return rw.op("linear.default", x, w, b) if b is not None else rw.op("linear.default", x, w)


def _lstm_step(rw: Rewriter, xp: Value, h: Value, c: Value | None, p: _Weights) -> tuple[Value, Value | None]:
    """gates = linear_hh(h) + x_t W_ih^T; c' = f * c + i * g; h' = o * tanh(c') (then projected)."""
    gates = rw.op("add.Tensor", _linear(rw, h, p.w_hh, p.b_hh), xp)
    i, f, g, o = rw.ops("chunk.default", gates, chunks=4, dim=-1)
    i, f, g, o = (rw.op("sigmoid.default", i), rw.op("sigmoid.default", f), rw.op("tanh.default", g),
                  rw.op("sigmoid.default", o))
    cy = rw.op("add.Tensor", rw.op("mul.Tensor", f, c), rw.op("mul.Tensor", i, g))
    hy = rw.op("mul.Tensor", o, rw.op("tanh.default", cy))
    if p.w_hr is not None:
        hy = rw.op("linear.default", hy, p.w_hr)
    return hy, cy


def _gru_step(rw: Rewriter, xp: Value, h: Value, c: Value | None, p: _Weights) -> tuple[Value, Value | None]:
    """r = sigmoid(hr + xr); z = sigmoid(hz + xz); n = tanh(xn + hn * r); h' = (h - n) * z + n."""
    xr, xz, xn = rw.ops("chunk.default", xp, chunks=3, dim=-1)
    hr, hz, hn = rw.ops("chunk.default", _linear(rw, h, p.w_hh, p.b_hh), chunks=3, dim=-1)
    r = rw.op("sigmoid.default", rw.op("add.Tensor", hr, xr))
    z = rw.op("sigmoid.default", rw.op("add.Tensor", hz, xz))
    n = rw.op("tanh.default", rw.op("add.Tensor", xn, rw.op("mul.Tensor", hn, r)))
    return rw.op("add.Tensor", rw.op("mul.Tensor", rw.op("sub.Tensor", h, n), z), n), None


def _rnn_step(act: str) -> Cell:
    def step(rw: Rewriter, xp: Value, h: Value, c: Value | None, p: _Weights) -> tuple[Value, Value | None]:
        return rw.op(act, rw.op("add.Tensor", _linear(rw, h, p.w_hh, p.b_hh), xp)), None

    return step


_CELLS: dict[str, Cell] = {"lstm": _lstm_step, "gru": _gru_step, "rnn_tanh": _rnn_step("tanh.default"),
                           "rnn_relu": _rnn_step("relu.default")}


def _layer_weights(params: list[Value], has_biases: bool, layers: int, directions: int) -> list[_Weights]:
    """The flat parameter list (per layer and direction: w_ih, w_hh, [b_ih, b_hh], [w_hr]) grouped."""
    per = len(params) // (layers * directions)
    out = []
    for k in range(layers * directions):
        group = params[k * per:(k + 1) * per]
        w = _Weights(group[0], group[1])
        rest = group[2:]
        if has_biases:
            w.b_ih, w.b_hh, rest = rest[0], rest[1], rest[2:]
        if rest:
            w.w_hr = rest[0]
        out.append(w)
    return out


def _refuses(attrs: Mapping[str, Any]) -> str | None:
    if attrs.get("train") and float(attrs.get("dropout") or 0.0) > 0.0 and int(attrs.get("num_layers") or 1) > 1:
        return (f"dropout {attrs.get('dropout')} between layers in training mode is random: export the model in "
                "eval mode")
    return None


def _sequence(rw: Rewriter, node: Node, kind: str) -> list[Value]:
    a = node.attrs
    cell = _CELLS[kind]
    x = node.inputs[0]
    n_hx = 2 if kind == "lstm" else 1
    h0s = node.inputs[1:1 + n_hx]
    params = node.inputs[1 + n_hx:]
    layers, directions = int(a["num_layers"]), 2 if a["bidirectional"] else 1
    weights = _layer_weights(params, bool(a["has_biases"]), layers, directions)
    if a["batch_first"]:
        x = rw.op("transpose.int", x, dim0=0, dim1=1)
    steps = x.shape[0]
    finals: list[list[Value]] = [[] for _ in range(n_hx)]
    for layer in range(layers):
        outs = []
        for d in range(directions):
            p = weights[layer * directions + d]
            k = layer * directions + d
            state = [rw.op("select.int", h0, dim=0, index=k) for h0 in h0s]
            xp = _linear(rw, x, p.w_ih, p.b_ih)  # the whole sequence's input projection: one GEMM
            ys: list[Value] = [None] * steps  # type: ignore[list-item]
            for t in (range(steps) if d == 0 else range(steps - 1, -1, -1)):
                h, c = cell(rw, rw.op("select.int", xp, dim=0, index=t), state[0], state[1] if n_hx == 2 else None,
                            p)
                state = [h, c] if n_hx == 2 else [h]
                ys[t] = h
            outs.append(rw.op("stack.default", *ys, dim=0))
            for i in range(n_hx):
                finals[i].append(state[i])
        x = outs[0] if directions == 1 else rw.op("cat.default", *outs, dim=2)
    if a["batch_first"]:
        x = rw.op("transpose.int", x, dim0=0, dim1=1)
    states = [rw.op("stack.default", *f, dim=0) for f in finals]
    return [x] + [_as_declared(rw, s, o) for s, o in zip(states, node.outputs[1:])]


def _as_declared(rw: Rewriter, state: Value, declared: Value) -> Value:
    """A final state viewed as the IR declares it (the reader admits only added or dropped unit dims)."""
    if state.shape == declared.shape:
        return state
    return rw.op("reshape.default", state, shape=list(declared.shape))


def _cell(rw: Rewriter, node: Node, kind: str) -> list[Value]:
    n_hx = 2 if kind == "lstm" else 1
    x, state = node.inputs[0], node.inputs[1:1 + n_hx]
    w = node.inputs[1 + n_hx:]
    p = _Weights(w[0], w[1], *(w[2:4] if len(w) == 4 else (w[2], None) if len(w) == 3 else (None, None)))
    h, c = _CELLS[kind](rw, _linear(rw, x, p.w_ih, p.b_ih), state[0], state[1] if n_hx == 2 else None, p)
    return [_as_declared(rw, s, o) for s, o in zip([h, c] if n_hx == 2 else [h], node.outputs)]


for _kind in _CELLS:  # lstm.input, lstm_cell.default, gru.input, ...
    decomposes(f"{_kind}.input", emits=_EMITS, refuses=_refuses)(
        lambda rw, node, k=_kind: _sequence(rw, node, k))
    decomposes(f"{_kind}_cell.default", emits=_EMITS)(lambda rw, node, k=_kind: _cell(rw, node, k))
