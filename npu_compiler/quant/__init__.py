"""What the compiler knows about integer (quantized) programs: the fixed-point requantization every backend computes
(`fixed_point`), the `quantized_decomposed` quantize/dequantize ops a quantized IR is written in (`ops`), and the fold
of quantize/dequantize pairs into integer kernels (`fold`). No torch, no runtime."""
