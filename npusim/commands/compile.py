"""npusim compile IR.json -o X.npubin"""

from __future__ import annotations

import argparse
import time

from ..common import add_compile_options, check_output_folder, compile_kwargs, dtype_line


def register(sub) -> None:
    p = sub.add_parser("compile", help="compile an IR JSON into a .npubin artifact",
                       description="Compile a pytorch-ir JSON graph into a .npubin artifact for a target.")
    p.add_argument("ir", help="IR JSON file written by pytorch-ir (torch_ir)")
    p.add_argument("-o", "--output", required=True, help="artifact to write (.npubin)")
    p.add_argument("--target", default="cpu", help="codegen target: cpu, cuda, webgpu (the backend that will run it)")
    add_compile_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import npu_compiler

    check_output_folder(args.output)
    t0 = time.perf_counter()
    prog = npu_compiler.compile(args.ir, args.target, **compile_kwargs(args))
    prog.save(args.output)
    dt = time.perf_counter() - t0
    print(f"compiled {prog.model_name} for {prog.target} ({prog.compute_dtype}): {len(prog.kernels)} kernels, "
          f"{prog.weight_bytes / 1e6:.2f} MB weights, {prog.buffer_bytes / 1e6:.2f} MB buffers "
          f"(peak intermediate {prog.arena_bytes / 1e6:.2f} MB) in {dt:.2f} s -> {args.output}")
    print(dtype_line(prog))
    print(f"next: npusim describe {args.output}; npusim run {args.output} --weights WEIGHTS.safetensors")
    return 0
