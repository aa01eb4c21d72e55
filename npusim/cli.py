"""`npusim`: compile, inspect, run and verify models. Each subcommand lives in `npusim/commands/<name>.py` and
exposes `register(subparsers)`; this module only assembles them and turns known errors into clear messages."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__
from .common import CLIError

COMMANDS = ("export", "compile", "describe", "run", "verify", "partition", "profile", "export_llm", "generate",
            "demo")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default (when it has a meaningful one and does not say it already)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        # identity, not equality: a default of 0 is worth showing, while 0 == False
        trivial = d is None or d is False or d is argparse.SUPPRESS or (isinstance(d, list | tuple) and not d)
        if action.option_strings and not trivial and "default" not in text:
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="npusim",
        description="NPU Simulation: an ahead-of-time compiler and runtime for PyTorch ATen graphs "
                    "(pytorch-ir JSON -> .npubin -> cpu/cuda/webgpu backends).\n\n"
                    "first steps: npusim demo; npusim export MODULE:FACTORY --input-shape 1,3,224,224 -o out; "
                    "npusim COMMAND --help",
    )
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument("--traceback", action="store_true",
                        help="on an error, print the full Python traceback instead of one line (also: "
                             "NPUSIM_TRACEBACK=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMANDS:
        importlib.import_module(f"npusim.commands.{name}").register(sub)
    return parser


def version_text() -> str:
    from npu_compiler.program import FORMAT_VERSION

    return (f"npusim {__version__} (.npubin format {FORMAT_VERSION}; Python "
            f"{sys.version_info.major}.{sys.version_info.minor})")


def main(argv: list[str] | None = None) -> int:
    from npu_compiler.errors import NPUCompileError
    from npu_export.errors import ExportError
    from npu_runtime.errors import NPURuntimeError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    show_traceback = args.traceback or os.environ.get("NPUSIM_TRACEBACK", "") not in ("", "0")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`npusim ... | head`): stop quietly, and let Python's exit flush nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (CLIError, NPUCompileError, NPURuntimeError, ExportError, OSError) as e:
        if show_traceback:
            raise
        print(f"npusim {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2 if isinstance(e, CLIError) else 1


def _one_line(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename is not None:
        # "[Errno 2] No such file or directory: '/x/.npubin-abc'" names a temporary file; say what the user gave
        what = e.strerror or type(e).__name__
        return f"{what}: {e.filename}"
    return str(e)


if __name__ == "__main__":
    sys.exit(main())
