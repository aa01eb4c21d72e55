"""Run a Markdown guide's code as written: its ```bash and ```python blocks, in order, in one folder.

Conventions in the guides (HTML comments, invisible when rendered):
- `<!-- save-as: NAME -->` before a block: the block is written to the file NAME instead of run.
- `<!-- no-test -->` before a block: not run (installation lines, a GPU-only command).
- In a bash block, a command whose trailing comment says `exit N` must exit with status N (default 0).

`npusim ...` and `python FILE.py` commands run in this process (torch is imported once, not once a command), with
the working folder changed; anything else fails the test: the guides use no other commands.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import runpy
import shlex
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!--\s*(save-as|no-test)\s*:?\s*(\S*)\s*-->\s*$")
EXIT = re.compile(r"#.*\bexit (\d+)\b")


@dataclass
class Block:
    lang: str
    code: str
    line: int  # where the block starts, for messages
    save_as: str | None = None
    skip: bool = False


def blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    mark: tuple[str, str] | None = None
    i = 0
    while i < len(lines):
        m = MARK.match(lines[i])
        if m:
            mark = (m.group(1), m.group(2))
            i += 1
            continue
        f = FENCE.match(lines[i])
        if f and f.group(1):
            start = i
            i += 1
            body = []
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            b = Block(f.group(1), "\n".join(body) + "\n", start + 1)
            if mark and mark[0] == "save-as":
                b.save_as = mark[1]
            elif mark and mark[0] == "no-test":
                b.skip = True
            out.append(b)
            mark = None
        elif lines[i].strip():
            mark = None  # a mark applies to the block right after it only
        i += 1
    return out


def commands(code: str) -> list[tuple[str, int]]:
    """The commands of a bash block (continuation lines joined) with the exit status each must have."""
    out = []
    pending = ""
    for raw in code.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = EXIT.search(line)
        out.append((strip_comment(line), int(m.group(1)) if m else 0))
    return out


def strip_comment(line: str) -> str:
    """A shell line without its trailing comment (a '#' outside quotes)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=False)
    lex.whitespace_split = True
    lex.commenters = "#"
    return shlex.join(list(lex))


def python_without_comments(code: str) -> str:
    """Python source without comments and blank lines: what must be equal in two translations of a guide."""
    toks = [t for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type != tokenize.COMMENT]
    text = tokenize.untokenize(toks)
    return "\n".join(line.rstrip() for line in text.splitlines() if line.strip())


def normalized(path: Path) -> list[tuple[str, str]]:
    """The code of a guide, comments aside: for checking that translations run the same commands."""
    out = []
    for b in blocks(path):
        if b.lang == "bash":
            body = "\n".join(f"{c} [exit {n}]" for c, n in commands(b.code))
        elif b.lang == "python":
            body = python_without_comments(b.code)
        else:
            body = b.code.strip()
        out.append((f"{b.lang}{' save-as ' + b.save_as if b.save_as else ''}{' no-test' if b.skip else ''}", body))
    return out


@dataclass
class Result:
    command: str
    status: int
    output: str


def _run_npusim(argv: list[str]) -> tuple[int, str]:
    from npusim.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            status = main(argv)
        except SystemExit as e:  # argparse errors and --help
            status = e.code if isinstance(e.code, int) else 1
    return status, buf.getvalue()


def _run_python(path: str, argv: list[str]) -> tuple[int, str]:
    buf = io.StringIO()
    old_argv = sys.argv
    sys.argv = [path, *argv]
    status = 0
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            sys.argv = old_argv
    return status, buf.getvalue()


def run_guide(path: Path, workdir: Path) -> list[Result]:
    """Run every block of `path` in `workdir`; fails (AssertionError) at the first command whose exit status is
    not the one the guide says."""
    path, workdir = Path(path).resolve(), Path(workdir).resolve()
    results: list[Result] = []
    old_cwd = os.getcwd()
    old_path = list(sys.path)
    old_modules = set(sys.modules)
    os.chdir(workdir)
    sys.path.insert(0, str(workdir))
    try:
        for b in blocks(path):
            where = f"{path.name}:{b.line}"
            if b.skip:
                continue
            if b.save_as:
                Path(b.save_as).parent.mkdir(parents=True, exist_ok=True)
                Path(b.save_as).write_text(b.code, encoding="utf-8")
                continue
            if b.lang == "python":
                script = workdir / f"_block_{b.line}.py"
                script.write_text(b.code, encoding="utf-8")
                status, out = _run_python(str(script), [])
                results.append(Result(f"python block at {where}", status, out))
                assert status == 0, f"{where}: the python block failed:\n{out}"
            elif b.lang == "bash":
                for cmd, want in commands(b.code):
                    argv = shlex.split(cmd)
                    if argv[0] == "npusim":
                        status, out = _run_npusim(argv[1:])
                    elif argv[0] in ("python", "python3") and len(argv) >= 2 and argv[1].endswith(".py"):
                        status, out = _run_python(argv[1], argv[2:])
                    else:
                        raise AssertionError(f"{where}: the guide runs {argv[0]!r}; guides use npusim and python only")
                    results.append(Result(cmd, status, out))
                    assert status == want, f"{where}: `{cmd}` exited {status}, the guide says {want}:\n{out}"
    finally:
        os.chdir(old_cwd)
        sys.path[:] = old_path
        # the guide's own modules (mynet.py ...) must not leak into the next guide, which may define others
        for name in set(sys.modules) - old_modules:
            f = getattr(sys.modules[name], "__file__", None) or ""
            if f.startswith(str(workdir)):
                del sys.modules[name]
    return results
