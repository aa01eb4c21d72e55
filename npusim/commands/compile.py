"""npusim compile IR.json -o X.npubin [--target T] [--no-fallback] [--force-cpu OP] [--weights W] [--quantize int8]"""

from __future__ import annotations

import argparse
import os
import sys
import time

from .. import argtypes
from ..common import (
    CLIError,
    add_compile_options,
    add_force_cpu_option,
    beside,
    check_output_folder,
    compile_kwargs,
    default_target,
    dtype_line,
    planned_device,
)
from .quantize import add_quant_options, quantize_files


def register(sub) -> None:
    p = sub.add_parser("compile", help="compile an IR JSON into a .npubin artifact",
                       description="Compile a pytorch-ir JSON graph into one .npubin artifact for a target, whatever "
                                   "its ops: where the target lacks some, the artifact holds the target's programs, "
                                   "the CPU segments that run the rest (on the CPU reference where it has the op, "
                                   "else through torch_ir) and the transfers between them; `npusim describe` shows "
                                   "which nodes run where and why.")
    p.add_argument("ir", help="IR JSON file written by pytorch-ir (torch_ir)")
    p.add_argument("-o", "--output", required=True, help="artifact to write (.npubin)")
    p.add_argument("--target", default=None,
                   help="codegen target: cpu, cuda, webgpu (the backend that will run it), or hip (compile-only: HIP "
                        "C++ for AMD GPUs, no runtime); its op support decides what runs on the CPU; default: the "
                        "target of the best backend available here, the one `npusim run` picks, so that the artifact "
                        "runs here as it is)")
    p.add_argument("--no-fallback", action="store_true",
                   help="a pure accelerator program: refuse a graph with ops the target lacks (listing them) instead "
                        "of running them on the CPU")
    p.add_argument("--weights", default=None,
                   help="the checkpoint the program is for (safetensors file or folder): its SHA-256 is recorded, "
                        "and `npusim run` says when other weights are given (default: the IR's stem + .safetensors "
                        "beside it, when present); with --quantize, the float model's weights it quantizes")
    add_force_cpu_option(p)
    add_compile_options(p)
    q = p.add_argument_group("int8 in one step (npusim quantize, then compile the quantized IR)")
    q.add_argument("--quantize", choices=("int8",), default=None,
                   help="quantize first: writes NAME_int8.json, .safetensors (the weights the artifact runs with) and "
                        ".quant.json beside the artifact (default: the IR as it is)")
    src = q.add_mutually_exclusive_group()
    src.add_argument("--calibration", metavar="DIR",
                     help="with --quantize: calibration inputs (see npusim quantize; default: none)")
    src.add_argument("--calibration-random", type=argtypes.integer(1, 1 << 16, "count"), metavar="N",
                     help="with --quantize: N generated calibration samples (default: none)")
    q.add_argument("--seed", type=argtypes.seed, default=0, help="with --calibration-random: its seed")
    add_quant_options(q)
    p.set_defaults(func=run)


def _quantized_ir(args: argparse.Namespace) -> tuple[str, str | None]:
    """The IR to compile and the weights the artifact will run with: with --quantize, the quantized IR and weights
    written beside the artifact; otherwise the IR as given and --weights (or its same-stem neighbour)."""
    if not args.quantize:
        if args.calibration or args.calibration_random:
            raise CLIError("--calibration and --calibration-random go with --quantize int8")
        return args.ir, args.weights or beside(args.ir)
    weights = args.weights or beside(args.ir)
    if not weights or (args.calibration is None and args.calibration_random is None):
        raise CLIError("--quantize int8 needs the float weights (--weights W, or the IR's stem + .safetensors beside "
                       "it) and --calibration DIR or --calibration-random N")
    args.weights = weights
    paths, q, _ = quantize_files(args, os.path.dirname(os.path.abspath(args.output)))
    print(f"quantized {q.ir['model_name']} ({args.method}, {q.samples} sample(s)): {paths['ir']}, run it with "
          f"--weights {paths['weights']}")
    return paths["ir"], paths["weights"]


def run(args: argparse.Namespace) -> int:
    import npu_compiler
    from npu_compiler.partition import format_report

    from ..partition_path import check_force_cpu

    check_output_folder(args.output)
    check_force_cpu(args.ir, args.force_cpu)
    target, why = default_target(args.target)
    t0 = time.perf_counter()
    ir, weights = _quantized_ir(args)
    art = npu_compiler.compile_artifact(ir, target, fallback=not args.no_fallback, force_cpu=args.force_cpu,
                                        **planned_device(compile_kwargs(args), target))
    if weights is not None:
        from npu_compiler.digest import weights_digest

        art.weights_sha256 = weights_digest(weights)
    art.save(args.output)
    dt = time.perf_counter() - t0
    if isinstance(art, npu_compiler.PartitionedProgram):
        plan = art.plan()
        s = plan.stats
        print(f"compiled {art.model_name} for {art.target} ({art.compute_dtype}): {len(art.segments)} segments "
              f"({s.partitions_npu} on the target, {s.partitions_cpu} on the CPU: {s.nodes_cpu} of {s.nodes_total} "
              f"nodes), {art.kernel_count} kernels, {s.transfers} transfers, {art.weight_bytes / 1e6:.2f} MB weights "
              f"in {dt:.2f} s -> {args.output}")
        print(format_report(plan).split("\nsteps:")[0], file=sys.stderr)
    else:
        print(f"compiled {art.model_name} for {art.target} ({art.compute_dtype}): {len(art.kernels)} kernels, "
              f"{art.weight_bytes / 1e6:.2f} MB weights, {art.buffer_bytes / 1e6:.2f} MB buffers "
              f"(peak intermediate {art.arena_bytes / 1e6:.2f} MB) in {dt:.2f} s -> {args.output}")
    print(f"target {target} ({why})")
    print(dtype_line(art))
    device = getattr(art, "device", None)
    if device is not None:
        print(f"planned for {device.title} ({device.arch}, {device.multiprocessors} "
              f"{'CUs' if device.vendor == 'amd' else 'SMs'})")
    if weights is not None:
        from npu_compiler.digest import short

        print(f"weights: {weights} (sha256 {short(art.weights_sha256)}, recorded: `npusim run` says when others are "
              "given)")
    from npu_runtime import backend as registry

    unavailable = registry.unavailable_reason(art.target) if art.target in registry.registered_backends() else None
    if unavailable is not None:  # (hip: compile-only; cuda on a machine without a GPU)
        print(f"next: npusim describe {args.output} (running it needs the {art.target} backend, which is not "
              f"available here: {unavailable})")
        return 0
    found_beside = weights is not None and weights == beside(args.output)
    print(f"next: npusim describe {args.output}; npusim run {args.output}"
          + ("" if found_beside else f" --weights {weights or 'WEIGHTS.safetensors'}"))
    return 0
