"""Rules of PT2E's quantize/dequantize ops (`npu_compiler/ir/quant_ops.py`): the integer dtype a quantize produces, the
float a dequantize gives back, per-channel scales along their axis, and parameters a quantizer could have written
(a finite positive scale, quant_min <= quant_max inside the integer dtype)."""

from __future__ import annotations

import math

from ...dtypes import FLOAT_DTYPES
from ..graph import Node, TensorType
from ..quant_ops import DEQUANTIZE, DEQUANTIZE_CHANNEL, QUANTIZE, QUANTIZE_CHANNEL
from .core import InferError, infers, norm_dim, tensor

# what quantized_decomposed accepts (torch/ao/quantization/fx/_decomposed.py: _DTYPE_TO_QVALUE_BOUNDS, less the
# sub-byte and unsigned 16/32-bit ones the compiler has no dtype for)
_BOUNDS = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-(1 << 15), (1 << 15) - 1),
           "int32": (-(1 << 31), (1 << 31) - 1)}


def _qtype(node: Node) -> str:
    dtype = str(node.attrs.get("dtype"))
    bounds = _BOUNDS.get(dtype)
    if bounds is None:
        raise InferError(f"quantized dtype {dtype} (known: {', '.join(_BOUNDS)})")
    lo, hi = int(node.attrs["quant_min"]), int(node.attrs["quant_max"])
    if not bounds[0] <= lo <= hi <= bounds[1]:
        raise InferError(f"quant_min {lo} / quant_max {hi} outside {dtype}'s range [{bounds[0]}, {bounds[1]}]")
    return dtype


def _per_tensor_params(node: Node) -> None:
    scale = float(node.attrs["scale"])
    if not (math.isfinite(scale) and scale > 0):
        raise InferError(f"scale {scale!r} must be a finite number > 0")
    zp = int(node.attrs["zero_point"])
    if abs(zp) > 1 << 31:
        raise InferError(f"zero_point {zp} is outside int32")


def _channel_params(node: Node, x_shape: tuple[int, ...]) -> None:
    axis = norm_dim(node.attrs["axis"], len(x_shape), "axis")
    for i, what in ((1, "scales"), (2, "zero_points")):
        if i < len(node.inputs) and node.inputs[i].shape != (x_shape[axis],):
            raise InferError(f"{what} of shape {list(node.inputs[i].shape)} for {x_shape[axis]} channels along "
                             f"axis {axis}")
    if node.inputs[1].dtype not in FLOAT_DTYPES:
        raise InferError(f"scales of dtype {node.inputs[1].dtype}")


@infers(QUANTIZE, QUANTIZE_CHANNEL)
def _quantize(node: Node) -> list[TensorType]:
    x = tensor(node, 0, "input")
    if x.dtype not in ("float32", "float16", "bfloat16"):
        raise InferError(f"quantizes a {x.dtype} tensor (float32, float16 or bfloat16)")
    if node.op == QUANTIZE:
        _per_tensor_params(node)
    else:
        _channel_params(node, x.shape)
    return [TensorType(x.shape, _qtype(node))]


@infers(DEQUANTIZE, DEQUANTIZE_CHANNEL)
def _dequantize(node: Node) -> list[TensorType]:
    x = tensor(node, 0, "input")
    dtype = _qtype(node)
    if x.dtype != dtype:
        raise InferError(f"dequantizes a {x.dtype} tensor declared {dtype}")
    if node.op == DEQUANTIZE:
        _per_tensor_params(node)
    else:
        _channel_params(node, x.shape)
    out = node.attrs.get("out_dtype")
    return [TensorType(x.shape, str(out) if out is not None else "float32")]
