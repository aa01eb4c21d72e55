"""`npusim`: compile, inspect, run and verify models. Each subcommand lives in `npusim/commands/<name>.py` and
exposes `register(subparsers)`; this module only assembles them and turns known errors into clear messages."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("compile", "describe", "run", "verify", "export", "demo", "partition", "export_llm", "generate",
            "profile", "estimate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npusim",
        description="NPU Simulation: an ahead-of-time compiler and runtime for PyTorch ATen graphs "
                    "(pytorch-ir JSON -> .npubin -> cpu/cuda backends).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"npusim.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"npusim.commands.{name}":
                continue  # a command not built yet
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from npu_compiler.errors import NPUCompileError
    from npu_runtime.errors import NPURuntimeError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (NPUCompileError, NPURuntimeError) as e:
        print(f"npusim {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
