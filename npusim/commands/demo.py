"""npusim demo: the built-in example."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("demo", help="export, compile and run a small ResNet and a small Qwen2, checked against PyTorch",
                       description="Export a small ResNet-18 and a tiny Qwen2 (random weights), compile them, run "
                                   "them on the best available backend and check them against PyTorch.")
    p.add_argument("--backend", default=None, help="cpu, cuda (default: best available)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    results = run_demo(args.backend)
    ok = True
    for r in results:
        print(f"{r.name}: backend {r.backend}, compute {r.compute_dtype}, {r.kernels} kernels, {r.seconds:.2f} s")
        for name, passed, detail in r.checks:
            print(f"  [{'ok' if passed else 'FAIL'}] {name}: {detail}")
        ok &= r.passed
    print("demo: all checks passed" if ok else "demo: some checks FAILED")
    return 0 if ok else 1
