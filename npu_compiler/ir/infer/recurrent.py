"""Rules of the recurrent layers (LSTM, GRU, Elman RNN) and their cells, as ATen checks them: the flat parameter
list per layer and direction (w_ih, w_hh, [b_ih, b_hh], [w_hr]), the hidden states' shapes, one dtype."""

from __future__ import annotations

from ..graph import Node, TensorType, Value
from .core import UNIT_DIM_OUTPUTS, InferError, _need_float, infers

_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}

# the final states (a layer's outputs after its sequence, every output of a cell) may be declared with unit dims
UNIT_DIM_OUTPUTS.update({f"{k}.input": 1 for k in _GATES} | {f"{k}_cell.default": 0 for k in _GATES})


def _kind(op: str) -> str:
    return op.partition(".")[0].removesuffix("_cell")


def _check(v: Value, shape: tuple[int, ...], what: str, dtype: str) -> None:
    if v.shape != shape:
        raise InferError(f"{what} '{v.name}' has shape {list(v.shape)}, expected {list(shape)}")
    if v.dtype != dtype:
        raise InferError(f"{what} '{v.name}' is {v.dtype}; the input is {dtype}")


@infers("lstm.input", "gru.input", "rnn_tanh.input", "rnn_relu.input")
def _sequence(node: Node) -> list[TensorType]:
    kind = _kind(node.op)
    a = node.attrs
    n_hx = 2 if kind == "lstm" else 1
    if len(node.inputs) < 1 + n_hx:
        raise InferError(f"needs the input and {n_hx} hidden state(s)")
    x, hx, params = node.inputs[0], node.inputs[1:1 + n_hx], node.inputs[1 + n_hx:]
    lists = a.get("_tensor_list_sizes")
    want = [n_hx, len(params)] if kind == "lstm" else [len(params)]
    if lists is not None and lists != want:
        raise InferError(f"_tensor_list_sizes {lists} does not match the inputs ({want})")
    _need_float(x)
    if len(x.shape) != 3:
        raise InferError(f"the input must have 3 dims ([T, B, features], or [B, T, features] batch first), got "
                         f"{list(x.shape)}")
    layers, dirs = a["num_layers"], 2 if a["bidirectional"] else 1
    if layers < 1:
        raise InferError(f"num_layers must be >= 1, got {layers}")
    if not params:
        raise InferError("has no parameters")
    g = _GATES[kind]
    hidden = params[1].shape[0] // g if len(params[1].shape) == 2 else 0
    per = 2 + 2 * bool(a["has_biases"])
    proj = kind == "lstm" and len(params) == layers * dirs * (per + 1)
    if len(params) != layers * dirs * (per + proj) or hidden <= 0:
        raise InferError(f"{len(params)} parameters for {layers} layer(s), {dirs} direction(s)"
                         f"{', with biases' if a['has_biases'] else ''}: expected {layers * dirs * per}"
                         f"{f' (or {layers * dirs * (per + 1)} with projections)' if kind == 'lstm' else ''}")
    out = params[per].shape[0] if proj else hidden
    t_dim, b_dim = (1, 0) if a["batch_first"] else (0, 1)
    steps, batch, feat = x.shape[t_dim], x.shape[b_dim], x.shape[2]
    k = 0
    for layer in range(layers):
        width = feat if layer == 0 else dirs * out
        for d in range(dirs):
            where = f"layer {layer}{' reverse' if d else ''}"
            _check(params[k], (g * hidden, width), f"{where} w_ih", x.dtype)
            _check(params[k + 1], (g * hidden, out), f"{where} w_hh", x.dtype)
            if a["has_biases"]:
                _check(params[k + 2], (g * hidden,), f"{where} b_ih", x.dtype)
                _check(params[k + 3], (g * hidden,), f"{where} b_hh", x.dtype)
            if proj:
                _check(params[k + per], (out, hidden), f"{where} w_hr", x.dtype)
            k += per + proj
    _check(hx[0], (layers * dirs, batch, out), "h0", x.dtype)
    if kind == "lstm":
        _check(hx[1], (layers * dirs, batch, hidden), "c0", x.dtype)
    y = (steps, batch, dirs * out) if not a["batch_first"] else (batch, steps, dirs * out)
    return [TensorType(y, x.dtype)] + [v.type for v in hx]


@infers("lstm_cell.default", "gru_cell.default", "rnn_tanh_cell.default", "rnn_relu_cell.default")
def _cell(node: Node) -> list[TensorType]:
    kind = _kind(node.op)
    n_hx = 2 if kind == "lstm" else 1
    if len(node.inputs) < 3 + n_hx:
        raise InferError(f"needs the input, {n_hx} hidden state(s), w_ih and w_hh")
    x, hx, w = node.inputs[0], node.inputs[1:1 + n_hx], node.inputs[1 + n_hx:]
    if len(w) > 4:
        raise InferError(f"takes w_ih, w_hh and at most two biases, got {len(w)} parameters")
    if kind == "lstm" and node.attrs.get("_tensor_list_sizes") not in (None, [2]):
        raise InferError(f"_tensor_list_sizes {node.attrs['_tensor_list_sizes']} must be [2] (h and c)")
    _need_float(x)
    if len(x.shape) != 2:
        raise InferError(f"the input must have 2 dims [batch, features], got {list(x.shape)}")
    if len(w[1].shape) != 2:
        raise InferError(f"w_hh must be a matrix, got {list(w[1].shape)}")
    g = _GATES[kind]
    hidden = w[1].shape[1]
    _check(w[0], (g * hidden, x.shape[1]), "w_ih", x.dtype)
    _check(w[1], (g * hidden, hidden), "w_hh", x.dtype)
    for b in w[2:]:
        _check(b, (g * hidden,), "bias", x.dtype)
    for h in hx:
        _check(h, (x.shape[0], hidden), "hidden state", x.dtype)
    return [h.type for h in hx]
