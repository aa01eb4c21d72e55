"""npusim verify IR.json --weights W.safetensors: compile, run, and compare with torch_ir.IRExecutor."""

from __future__ import annotations

import argparse
import json
import sys

from ..common import add_compile_options, compile_kwargs, complete_inputs, parse_inputs


def register(sub) -> None:
    p = sub.add_parser("verify", help="compile, run and compare with PyTorch (torch_ir.IRExecutor)",
                       description="Compile the IR, run it on a backend and compare every output with the "
                                   "independent reference (torch_ir.IRExecutor, ATen op by op): max abs/rel error, "
                                   "Pearson r, top-k agreement. Exit status 0 only within the tolerance of the "
                                   "compute dtype.")
    p.add_argument("ir", help="IR JSON file")
    p.add_argument("--weights", required=True, help="safetensors file or folder")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input array (repeatable); others are generated (floats at random, integers in range)")
    p.add_argument("--backend", default=None, help="cpu, cuda (default: best available)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="machine-readable report")
    add_compile_options(p)
    p.set_defaults(func=run)


def reference_weights(prog, ws) -> dict:
    """Checkpoint keys the program resolved by itself (a tied lm_head, a computed rotary inv_freq), for the
    reference, which reads the checkpoint by key only."""
    extra = {}
    for key, used in ws.report.fallbacks.items():
        extra[key] = used
    computed = {}
    for spec in prog.weights:
        if spec.recipe.kind == "rope_inv_freq":
            from npu_runtime.weights import TensorSource, WeightReport, make_weight

            computed[spec.key] = make_weight(spec, TensorSource({}), WeightReport())
    return extra, computed


def run(args: argparse.Namespace) -> int:
    import numpy as np

    import npu_compiler
    import npu_runtime
    from npu_export.reference import load_state_dict, run_reference, to_torch
    from npu_runtime.metrics import compare

    backend = npu_runtime.get_backend(args.backend)
    prog = npu_compiler.compile(args.ir, backend.compile_target(), **compile_kwargs(args))
    inputs = complete_inputs(prog, parse_inputs(args.input), args.seed)
    ws = npu_runtime.load_weights(prog, args.weights, backend)
    outs = backend.create_executor(prog).run_numpy(inputs, ws)

    sd = load_state_dict(args.weights)
    aliases, computed = reference_weights(prog, ws)
    for key, src in aliases.items():
        sd.setdefault(key, sd[src])
    for key, arr in computed.items():
        sd.setdefault(key, to_torch(np.asarray(arr, dtype=np.float32)))
    ref = run_reference(args.ir, sd, inputs)

    rows = [compare(name, outs[name], ref[name], prog.compute_dtype) for name in ref]
    ok = all(r.passed for r in rows)
    report = {"model": prog.model_name, "backend": backend.name, "target": prog.target,
              "compute_dtype": prog.compute_dtype, "kernels": len(prog.kernels), "passed": ok,
              "outputs": [r.to_dict() for r in rows], "weights": ws.report.summary()}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"verify {prog.model_name} on {backend.name} ({prog.compute_dtype}, {len(prog.kernels)} kernels) "
              f"against torch_ir.IRExecutor")
        print(f"  {'output':<20} {'shape':<18} {'max_abs':>10} {'max_rel':>10} {'pearson':>10} {'top1':>6} "
              f"{'top5':>6}  result")
        for r in rows:
            t1 = f"{r.top1_equal:.2f}" if r.top1_equal is not None else "-"
            t5 = f"{r.top5_overlap:.2f}" if r.top5_overlap is not None else "-"
            print(f"  {r.name:<20} {str(list(r.shape)):<18} {r.max_abs:>10.3g} {r.max_rel:>10.3g} "
                  f"{r.pearson:>10.6f} {t1:>6} {t5:>6}  {'ok' if r.passed else 'FAIL'}")
        print("PASS" if ok else "FAIL: outside the tolerance of " + prog.compute_dtype, file=sys.stdout)
    return 0 if ok else 1
