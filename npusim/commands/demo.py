"""npusim demo: the built-in example; keeps its files and prints what to try next."""

from __future__ import annotations

import argparse

from ..common import add_backend_option


def register(sub) -> None:
    p = sub.add_parser("demo", help="export, compile and run a small ResNet and a small Qwen2, checked against PyTorch",
                       description="Export a small ResNet-18 and a tiny Qwen2 (random weights), compile them, run "
                                   "them on the best available backend and check them against PyTorch. The files "
                                   "stay in the output folder; the demo ends with commands to try on them.")
    add_backend_option(p)
    p.add_argument("-o", "--output", default="npusim-demo", help="folder for the demo's files")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..demo import next_steps, run_demo

    results = run_demo(args.backend, args.output)
    ok = True
    for r in results:
        print(f"{r.name}: backend {r.backend}, {r.kernels} kernels, {r.seconds:.2f} s")
        print(f"  compute dtype {r.compute_dtype} ({r.dtype_reason})")
        for name, passed, detail in r.checks:
            print(f"  [{'ok' if passed else 'FAIL'}] {name}: {detail}")
        ok &= r.passed
    print("demo: all checks passed" if ok else "demo: some checks FAILED")
    print(f"files kept in {args.output}/ (resnet18/: IR, weights, compiled artifact; qwen2-tiny/: an export-llm "
          "folder with random weights and a small tokenizer)")
    print("next:")
    for cmd in next_steps(results):
        print(f"  {cmd}")
    return 0 if ok else 1
