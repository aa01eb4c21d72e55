"""Post-training quantization: `npusim quantize` turns a float IR and its weights into a quantized IR (PT2E's
`quantized_decomposed` form, which the compiler folds into integer kernels) and int8 weights.

    calibration.py  statistics of every activation to quantize, and the scale each method chooses from them
                    (min-max, percentile, entropy as TensorRT's calibrator)
    rewrite.py      the IR rewrite: BatchNorm folded, weights int8 per output channel, quantize/dequantize pairs
    flow.py         the float program run on calibration inputs (the CPU reference), then the rewrite
    report.py       every quantized tensor's SQNR against the float model's, worst first

Imports the compiler and the runtime (it compiles and runs the float model), never torch.
"""
