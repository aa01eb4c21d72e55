"""npusim run X.npubin --weights W.safetensors --input NAME=FILE.npy ... -o out.npz"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

from ..common import add_run_options, complete_inputs, parse_inputs


def register(sub) -> None:
    p = sub.add_parser("run", help="run a compiled artifact on a backend",
                       description="Run a .npubin artifact with weights and inputs; write the outputs to an .npz.")
    p.add_argument("artifact", help=".npubin file (or an IR JSON, compiled on the fly)")
    add_run_options(p)
    p.add_argument("-o", "--output", required=True, help="where to write the outputs (.npz)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import npu_compiler
    import npu_runtime
    from npu_compiler.program import CompiledProgram

    backend = npu_runtime.get_backend(args.backend)
    if args.artifact.endswith(".json"):
        from ..common import input_specs_from_ir
        from ..partition_path import needs_partition, partition_notice, run_partitioned

        fallback = needs_partition(args.artifact, backend.compile_target())
        if fallback:
            print(partition_notice(fallback, backend.compile_target()), file=sys.stderr)
            inputs = complete_inputs(input_specs_from_ir(args.artifact), parse_inputs(args.input), args.seed)
            t0 = time.perf_counter()
            outs = run_partitioned(args.artifact, args.weights, inputs, backend)
            _save_npz(args.output, outs)
            print(f"ran {args.artifact} on {backend.name} + cpu fallback in {(time.perf_counter() - t0) * 1e3:.2f} ms "
                  f"-> {args.output}")
            return 0
        prog = npu_compiler.compile(args.artifact, backend.compile_target())
    else:
        prog = CompiledProgram.load(args.artifact)
    inputs = complete_inputs(prog, parse_inputs(args.input), args.seed)
    from ..progress import Progress

    with Progress("loading weights", quiet=args.quiet) as bar:
        ws = npu_runtime.load_weights(prog, args.weights, backend, progress=bar.callback)
    ex = backend.create_executor(prog)
    t0 = time.perf_counter()
    outs = ex.run_numpy(inputs, ws)
    backend.synchronize()
    dt = time.perf_counter() - t0
    _save_npz(args.output, outs)
    print(f"ran {prog.model_name} on {backend.name} in {dt * 1e3:.2f} ms -> {args.output} "
          f"({', '.join(f'{k} {list(v.shape)}' for k, v in outs.items())})")
    return 0


def _save_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Atomic: a failed run leaves no half-written file. bf16 is stored as float32 (npz has no bf16)."""
    plain = {k: (v.astype(np.float32) if v.dtype.name == "bfloat16" else v) for k, v in arrays.items()}
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".npusim-", suffix=".npz", dir=folder)
    os.close(fd)
    try:
        np.savez(tmp, **plain)
        os.replace(tmp, path if path.endswith(".npz") else path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
