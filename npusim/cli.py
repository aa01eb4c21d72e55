"""`npusim`: compile, inspect, run and verify models. Each subcommand lives in `npusim/commands/<name>.py` and
exposes `register(subparsers)`; this module only assembles them and turns errors into one line each.

Exit status: 0 done; 1 an error in the input or the environment (IR, artifact, weights, inputs, an output path,
memory), the line says what and where; 2 options that do not go together (argparse's own usage errors too);
70 an internal error (a bug in npusim: the line asks you to report it); 130 interrupted; 141 the reader of the
output went away. `--traceback` (or NPUSIM_TRACEBACK=1) prints the full Python trace instead of the line."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import threading
import warnings
from collections.abc import Iterator

from npu_compiler.atomic import command_files, remove_temporaries

from . import __version__
from .common import CLIError
from .safe_text import SafeStream, one_line

COMMANDS = ("export", "quantize", "compile", "describe", "run", "verify", "partition", "profile", "estimate",
            "export_llm", "generate", "demo")
EXIT_ERROR, EXIT_USAGE, EXIT_INTERNAL = 1, 2, 70
TRACEBACK_ENV = "NPUSIM_TRACEBACK"


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
                    "npusim COMMAND --help\n\n"
                    "exit status: 0 done, 1 an error in the input (the line says what and where), 2 options that do "
                    "not go together, 70 an internal error (a bug: please report it)",
    )
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument("--traceback", action="store_true",
                        help=f"on an error, print the full Python traceback instead of one line (also: "
                             f"{TRACEBACK_ENV}=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMANDS:
        importlib.import_module(f"npusim.commands.{name}").register(sub)
    return parser


def version_text() -> str:
    from npu_compiler.program import FORMAT_VERSION

    return (f"npusim {__version__} (.npubin format {FORMAT_VERSION}; Python "
            f"{sys.version_info.major}.{sys.version_info.minor})")


@contextlib.contextmanager
def _safe_streams() -> Iterator[None]:
    """stdout and stderr escape control characters for as long as a command runs; warnings of npusim print as
    one line each."""
    from npu_compiler.errors import NPUSimWarning

    saved = sys.stdout, sys.stderr, warnings.showwarning
    sys.stdout, sys.stderr = SafeStream(sys.stdout), SafeStream(sys.stderr)

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if issubclass(category, NPUSimWarning):
            print(f"npusim: warning: {one_line(str(message))}", file=sys.stderr)
        else:
            saved[2](message, category, filename, lineno, file, line)

    warnings.showwarning = show
    warnings.simplefilter("always", NPUSimWarning)  # each conversion and infinity once, however alike the lines
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        sys.stdout, sys.stderr, warnings.showwarning = saved
        warnings.filterwarnings("default", category=NPUSimWarning)


# Options whose value is a path the command writes; every other option or argument naming an existing file is an
# input, which no output of the same command may overwrite (npu_compiler.atomic: readers add the files they open).
OUTPUT_OPTIONS = frozenset({"output", "trace", "chart", "dump_repro"})


def _input_files(args: argparse.Namespace) -> list[str]:
    """The files named by the command's arguments, outputs aside (NAME=FILE and FILE.py:FACTORY give their file)."""
    out = []
    for dest, value in vars(args).items():
        if dest in OUTPUT_OPTIONS:
            continue
        for v in value if isinstance(value, list) else [value]:
            if not isinstance(v, str) or not v:
                continue
            for candidate in (v, v.partition("=")[2], v.rpartition(":")[0]):
                if candidate and os.path.isfile(candidate):
                    out.append(candidate)
    return out


@contextlib.contextmanager
def _temporaries_removed_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP end the command as Ctrl-C does: the temporary file of a write in progress is removed
    (Python's default would end the process on the spot and leave it), then the process exits 128 + the signal."""
    import signal

    def stop(signum, frame) -> None:
        remove_temporaries()
        raise SystemExit(128 + signum)

    saved = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is not None:
                saved[sig] = signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    show_traceback = args.traceback or os.environ.get(TRACEBACK_ENV, "") not in ("", "0")
    with _safe_streams(), _temporaries_removed_on_signals(), command_files(_input_files(args)):
        try:
            return int(args.func(args) or 0)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:
            # the reader went away (`npusim ... | head`): stop quietly, and let Python's exit flush nothing more
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        except Exception as e:
            if show_traceback:
                raise
            status, text = describe_error(e, args.command)
            print(f"npusim {args.command}: error: {one_line(text)}", file=sys.stderr)
            return status


def describe_error(e: BaseException, command: str) -> tuple[int, str]:
    """The exit status and the one line for an exception that ended a command."""
    from npu_compiler.errors import InternalError, NPUSimError, as_npusim_error

    if isinstance(e, CLIError):
        return EXIT_USAGE, str(e)
    if isinstance(e, OSError) and not isinstance(e, NPUSimError):
        # "[Errno 2] No such file or directory: '/x/.npubin-abc'" names a temporary file; say what the user gave
        what = e.strerror or type(e).__name__
        return EXIT_ERROR, f"{what}: {e.filename}" if e.filename is not None else str(e)
    err = as_npusim_error(e, f"running `npusim {command}`")
    if isinstance(err, InternalError):
        return EXIT_INTERNAL, str(err)
    assert isinstance(err, NPUSimError)
    return EXIT_ERROR, str(err)


if __name__ == "__main__":
    sys.exit(main())
