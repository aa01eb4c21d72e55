"""What the accuracy benchmarks of quantization (quant_minilm.py, quant_crepe.py) share: their common options, one
calibration method's int8 program run on the CPU reference's integer kernels, and the end of a run."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

METHODS = ("minmax", "percentile", "entropy", "mse")


def add_options(ap: argparse.ArgumentParser, method: str, activations: str, rounding: str = "nearest") -> None:
    ap.add_argument("--method", action="append", choices=METHODS,
                    help=f"calibration method (repeat for several; default {method})")
    ap.add_argument("--activations", default=activations, choices=("symmetric", "asymmetric"))
    ap.add_argument("--weight-rounding", default=rounding, choices=("nearest", "gptq"),
                    help=f"int8 weight codes rounded to nearest, or by GPTQ on the calibration inputs (default "
                         f"{rounding})")
    ap.add_argument("--bias-correction", action="store_true",
                    help="subtract each layer's mean output shift from weight rounding from its bias")
    ap.add_argument("--report", action="store_true", help="print the 10 worst tensors of the per-tensor SQNR report")
    ap.add_argument("--json", help="write the results here")


@dataclass
class Int8Run:
    q: Any  # npu_quant.flow.Quantized
    outputs: np.ndarray  # the first output of every batch, concatenated
    integer_kernels: int
    kernels: int
    seconds: float


def run_int8(ir: dict, weights: Mapping[str, np.ndarray], calib: Sequence[Mapping[str, np.ndarray]],
             batches: Sequence[Mapping[str, np.ndarray]], method: str, activations: str,
             keep_float: tuple[str, ...] = (), weight_rounding: str = "nearest", bias_correction: bool = False
             ) -> Int8Run:
    """Quantize with `method`, compile for the CPU and run every batch on its integer kernels."""
    import npu_compiler
    import npu_runtime
    from npu_compiler.kernels import INTEGER_KINDS
    from npu_quant.flow import Options, quantize
    from npu_runtime.cpu.backend import CpuBackend

    t = time.perf_counter()
    q = quantize(ir, weights, calib, Options(method=method, symmetric=activations == "symmetric",
                                              keep_float=keep_float, weight_rounding=weight_rounding,
                                              bias_correction=bias_correction))
    program = npu_compiler.compile(q.ir, "cpu")
    be = CpuBackend()
    ex = be.create_executor(program)
    w = npu_runtime.load_weights(program, q.weights, be)
    got = np.concatenate([list(ex.run_numpy(dict(b), w).values())[0] for b in batches])
    return Int8Run(q, got, sum(k.kind in INTEGER_KINDS for k in program.kernels), len(program.kernels),
                   time.perf_counter() - t)


def report(args: argparse.Namespace, ir: dict, weights, run: Int8Run, calib, method: str,
           out: Callable[[str], None] = print) -> None:
    """With --report, the 10 worst tensors of the per-tensor SQNR report."""
    if args.report:
        from npu_quant.report import format_report, sqnr_report

        out(format_report(sqnr_report(ir, weights, run.q, calib, method), limit=10))


def finish(args: argparse.Namespace, results: dict, ok: bool) -> int:
    """Write --json and return the exit status."""
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if ok else 1
