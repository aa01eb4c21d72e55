"""`npusim partition IR.json --target T [--json] [--force-cpu OP ...]`: the support report before anything runs:
coverage by node count and FLOP share, every node that falls back to the CPU, and the partition plan."""

from __future__ import annotations

import argparse
import sys

from npu_compiler.op_support import support_predicate
from npu_compiler.partition import format_report, partition

from ..common import add_force_cpu_option


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "partition", help="show which ops run on the target and which fall back to the CPU",
        description="Partition an IR JSON for a target: coverage by nodes and FLOPs, every CPU fallback node with "
                    "its reason, and the plan (partitions and transfers). Nothing is compiled or run.")
    p.add_argument("ir", help="IR JSON file (pytorch-ir)")
    p.add_argument("--target", default=None,
                   help="compiler target: cpu, cuda, webgpu (default: the target of the best backend available here, "
                        "the one `run` and `verify` use)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--include-ir", action="store_true", help="with --json: include each partition's sub-IR")
    add_force_cpu_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..common import default_target
    from ..partition_path import check_force_cpu

    args.target, _ = default_target(args.target)
    check_force_cpu(args.ir, args.force_cpu)
    plan = partition(args.ir, support_predicate(args.target, args.force_cpu))
    if args.json:
        sys.stdout.write(plan.to_json(include_ir=args.include_ir) + "\n")
    else:
        print(format_report(plan))
    return 0
