"""The ops a quantized IR is written in: PT2E's `quantized_decomposed` quantize/dequantize ops, as PyTorch declares
them (torch/ao/quantization/fx/_decomposed.py), and what each computes.

    quantize:   q = clamp(round_half_even(x * (1 / scale)) + zero_point, quant_min, quant_max)   (x in float32)
    dequantize: x = (q - zero_point) * scale                                                      (float32)

Per tensor, `scale` and `zero_point` are numbers in the node's attributes; per channel they are tensors (weights)
along `axis`. A weight quantized ahead of time is an int8 weight read through `dequantize_per_channel`; an
activation is quantized and dequantized at once (`quantize_per_tensor` -> `dequantize_per_tensor`), and every reader
of the dequantized value computes in float unless the compiler folds the pattern into an integer kernel
(`quant/fold.py`).
"""

from __future__ import annotations

QUANTIZE = "quantized_decomposed.quantize_per_tensor.default"
DEQUANTIZE = "quantized_decomposed.dequantize_per_tensor.default"
QUANTIZE_CHANNEL = "quantized_decomposed.quantize_per_channel.default"
DEQUANTIZE_CHANNEL = "quantized_decomposed.dequantize_per_channel.default"

DECLS = (
    "quantized_decomposed.quantize_per_tensor.default(Tensor input, float scale, int zero_point, int quant_min, "
    "int quant_max, ScalarType dtype) -> Tensor",
    "quantized_decomposed.dequantize_per_tensor.default(Tensor input, float scale, int zero_point, int quant_min, "
    "int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor",
    "quantized_decomposed.quantize_per_channel.default(Tensor input, Tensor scales, Tensor zero_points, int axis, "
    "int quant_min, int quant_max, ScalarType dtype) -> Tensor",
    "quantized_decomposed.dequantize_per_channel.default(Tensor input, Tensor scales, Tensor? zero_points, int axis, "
    "int quant_min, int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor",
)

QUANT_OPS = (QUANTIZE, DEQUANTIZE, QUANTIZE_CHANNEL, DEQUANTIZE_CHANNEL)
# The integer dtypes a quantize op may produce here, with their full ranges.
QUANT_DTYPES = {"int8": (-128, 127), "uint8": (0, 255)}


def is_quant_op(op: str) -> bool:
    return op in QUANT_OPS
