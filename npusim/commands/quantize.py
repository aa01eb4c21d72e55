"""npusim quantize IR.json --weights W (--calibration DIR | --calibration-random N) -o OUT"""

from __future__ import annotations

import argparse
import os
import time

from .. import argtypes
from ..common import CLIError, _comma_list, add_quiet_option


def register(sub) -> None:
    p = sub.add_parser(
        "quantize", help="post-training int8 quantization: a quantized IR and int8 weights",
        description="Quantize a float model after training: weights int8 per output channel (symmetric), "
                    "activations int8 per tensor with scales calibrated on your inputs, written as PT2E writes a "
                    "quantized graph (quantize/dequantize pairs), which compile, verify, run, profile and estimate "
                    "take; the compiler folds them into integer kernels (int32 accumulation, fixed-point "
                    "requantization). Writes OUT/NAME_int8.json, OUT/NAME_int8.safetensors and "
                    "OUT/NAME_int8.quant.json (every tensor's scale and zero point; with --report its SQNR).\n\n"
                    "  npusim quantize model.json --weights model.safetensors --calibration calib/ -o q\n"
                    "  npusim quantize model.json --weights w.safetensors --calibration-random 16 --method entropy "
                    "--report -o q")
    p.add_argument("ir", help="IR JSON of the float model")
    p.add_argument("--weights", required=True, help="its safetensors file or folder of shards")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--calibration", metavar="DIR",
                     help="calibration inputs: .npy files shaped like the input (or [K, *shape] for K samples); for "
                          "several inputs SAMPLE.INPUT.npy (no default: give this or --calibration-random)")
    src.add_argument("--calibration-random", type=argtypes.integer(1, 1 << 16, "count"), metavar="N",
                     help="N generated samples instead (floats N(0, 1), integers in their valid range): for trying "
                          "the flow, not for accuracy (no default: give this or --calibration)")
    p.add_argument("-o", "--output", required=True, help="output folder (created if missing)")
    add_quant_options(p)
    p.add_argument("--report", action="store_true",
                   help="compare every quantized tensor with the float model's on the calibration inputs (SQNR, "
                        "worst first)")
    p.add_argument("--seed", type=argtypes.seed, default=0, help="seed of --calibration-random")
    add_quiet_option(p)
    p.set_defaults(func=run)


def add_quant_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", default="minmax", choices=("minmax", "percentile", "entropy", "mse"),
                   help="how each activation's range is chosen: the observed min and max, a percentile of |x|, the "
                        "threshold of least KL divergence (TensorRT's entropy calibrator), or the threshold of least "
                        "quantization error (mean squared, over the histogram)")
    p.add_argument("--percentile", type=argtypes.number(50.0, 100.0, lo_open=True), default=99.99,
                   help="with --method percentile: the percentile of |x| kept")
    p.add_argument("--activations", default="symmetric", choices=("symmetric", "asymmetric"),
                   help="activation scheme: zero point 0, or a zero point that fits the range")
    p.add_argument("--weight-rounding", default="nearest", choices=("nearest", "gptq"),
                   help="how the int8 weight codes are rounded: to nearest, or by GPTQ: column by column, each "
                        "rounding error spread over the columns not yet rounded so that the layer's output on the "
                        "calibration inputs moves least (layers of up to 4096 inputs per output; wider ones and "
                        "grouped convolutions round to nearest)")
    p.add_argument("--bias-correction", action="store_true",
                   help="subtract from each conv's and linear's bias the mean output shift its weight rounding "
                        "causes on the calibration inputs (Nagel et al. 2019, as AIMET does)")
    p.add_argument("--keep-float", action="extend", default=[], metavar="TENSOR", type=_comma_list,
                   help="never quantize these tensors (IR value names, comma-separated or repeated): the integer ops "
                        "that read them compute in float (mixed precision for the layers the --report shows worst)")


def quantize_files(args: argparse.Namespace, out_dir: str, report: bool = False):
    """Calibrate and write the quantized model; returns (paths by what, the Quantized model, report rows or None)."""
    from npu_compiler.atomic import atomic_path, write_text
    from npu_compiler.ir.reader import checked_ir_dict
    from npu_quant.flow import Options, quantize
    from npu_quant.report import dumps, report_json, sqnr_report
    from npu_quant.samples import folder_samples, random_samples
    from npu_runtime.weights import TensorSource

    from ..common import input_specs_from_ir

    ir = checked_ir_dict(args.ir)
    known = {o["name"] for n in ir["nodes"] for o in n.get("outputs", [])} | {t["name"] for t in ir["graph_inputs"]}
    unknown = sorted(set(args.keep_float) - known)
    if unknown:
        raise CLIError(f"--keep-float {', '.join(unknown)}: no such tensor in the graph")
    specs = input_specs_from_ir(ir)
    if args.calibration is not None:
        samples = folder_samples(args.calibration, specs)
    else:
        samples = list(random_samples(specs, args.calibration_random, args.seed))
    source = TensorSource(args.weights)
    weights = {k: source.get(k) for k in sorted(source.keys())}
    try:
        options = Options(args.method, args.activations == "symmetric", args.percentile, tuple(args.keep_float),
                          args.weight_rounding, args.bias_correction)
    except ValueError as e:
        raise CLIError(str(e)) from None
    q = quantize(ir, weights, samples, options)
    stem = q.ir["model_name"]
    os.makedirs(out_dir, exist_ok=True)
    paths = {"ir": os.path.join(out_dir, f"{stem}.json"), "weights": os.path.join(out_dir, f"{stem}.safetensors"),
             "params": os.path.join(out_dir, f"{stem}.quant.json")}
    write_text(paths["ir"], dumps(q.ir))
    from safetensors.numpy import save_file

    with atomic_path(paths["weights"]) as tmp:
        save_file({k: v for k, v in sorted(q.weights.items())}, str(tmp))
    rows = sqnr_report(ir, weights, q, samples, options.method) if report else None
    table = {"method": options.method, "activations": args.activations, "samples": q.samples,
             "weight_rounding": options.weight_rounding, "bias_correction": options.bias_correction,
             "layers": {n: {"rounding": lw.rounding, "bias_shift_max": lw.bias_correction}
                        for n, lw in q.layers.items()},
             "tensors": {t: {"scale": p.scale, "zero_point": p.zero_point, "dtype": p.dtype,
                             **({"same_as": q.plan.same_as[t]} if t in q.plan.same_as else {})}
                         for t, p in q.qparams.items()}}
    if rows is not None:
        table["report"] = report_json(rows)
    write_text(paths["params"], dumps(table))
    return paths, q, rows


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    from npu_quant.report import format_report

    paths, q, rows = quantize_files(args, args.output, report=args.report)
    folded = len(q.plan.weights)
    print(f"quantized {q.ir['model_name']}: {len(q.qparams)} activation tensor(s) int8 ({args.method}, "
          f"{args.activations}, {q.samples} calibration sample(s)), {folded} weight(s) int8 per channel, in "
          f"{time.perf_counter() - t0:.1f} s")
    for what in ("ir", "weights", "params"):
        print(f"  -> {paths[what]}")
    if rows is not None:
        print("per-tensor report (SQNR of the int8 tensor against the float model's, worst first):")
        print(format_report(rows, limit=20))
    print(f"next: npusim compile {paths['ir']} -o model_int8.npubin; npusim describe model_int8.npubin; "
          f"npusim verify {paths['ir']} --weights {paths['weights']}")
    return 0
