"""The model zoo table: every `npu_export.zoo` model exported, compiled to one program for a backend and verified
against torch_ir.IRExecutor, as shipped in float32 and in its family's half dtype (each with its default compute
dtype, the model's own), under the zoo's tolerance policy (`npu_export.zoo.ZOO_TOLERANCE`).

    python bench/zoo.py                    # the best available backend (cuda where present)
    python bench/zoo.py --backend cpu --models llama-eager,vit
    python bench/zoo.py --backend cuda --json zoo_cuda.json

Columns: IR nodes, nodes the target runs (the rest would run on the CPU), kernels of the float32 program, and per
dtype the verify result and max |err| / max |ref| against the reference in that dtype. Exit status 1 if any fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    import npu_runtime
    from npu_export.zoo import ZOO, ZooUnavailable, half_dtype, verify_zoo_model, zoo_names

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default=None, help="cpu, cuda or webgpu (default: the best available)")
    ap.add_argument("--models", default=None, help="comma-separated zoo models (default: all)")
    ap.add_argument("--json", default=None, help="also write every result as JSON")
    args = ap.parse_args(argv)
    try:
        models = zoo_names(args.models)
    except ValueError as e:
        ap.error(str(e))
    backend = npu_runtime.get_backend(args.backend)
    print(f"model zoo on {backend.name} (target '{backend.compile_target()}'), default compute dtype "
          "(the model's own), against torch_ir.IRExecutor in the same dtype\n")
    print("| model | family | IR nodes | on the accelerator | kernels | verify float32 (max rel err) | "
          "verify half (max rel err) |")
    print("| --- | --- | ---: | ---: | ---: | --- | --- |")
    results, failed, skipped = [], 0, []
    t0 = time.perf_counter()
    for name in models:
        z = ZOO[name]
        try:
            pair = [verify_zoo_model(name, dt, backend) for dt in ("float32", half_dtype(z.family))]
        except ZooUnavailable as e:
            skipped.append(str(e))
            continue
        results += pair
        f32, half = pair
        failed += sum(not r.passed for r in pair)

        def cell(r) -> str:
            if r.fallback_ops:
                return f"FAIL: no lowering for {', '.join(r.fallback_ops)}"
            return f"{'PASS' if r.passed else 'FAIL'} {r.compute_dtype} ({r.max_rel:.1e})"

        share = f"{f32.npu_nodes}/{f32.ir_nodes} ({100 * f32.npu_nodes / f32.ir_nodes:.0f}%)"
        print(f"| {name} | {z.family} | {f32.ir_nodes} | {share} | {f32.kernels} | {cell(f32)} | {cell(half)} |",
              flush=True)
    print(f"\n{len(results)} runs, {failed} failed, {time.perf_counter() - t0:.0f} s")
    for s in skipped:
        print(f"skipped (not counted as passing): {s}")
    if args.json:
        Path(args.json).write_text(json.dumps([{**asdict(r), "tolerance": asdict(r.tolerance)} for r in results],
                                              indent=1))
    return 1 if failed or not results else 0


if __name__ == "__main__":
    raise SystemExit(main())
