"""Run a Markdown guide's code as written: its ```bash and ```python blocks, in order, in one folder.

Conventions in the guides (HTML comments, invisible when rendered):
- `<!-- save-as: NAME -->` before a block: the block is written to the file NAME instead of run.
- `<!-- no-test -->` before a block: not run (installation lines, a GPU-only command).
- `<!-- output -->` before a ```text block: the block quotes lines of what the command run last printed, and is
  checked against it (`check_output`): every quoted line must be a line of the output, numbers aside (times differ
  between machines); `<!-- output: exact=MB,MFLOP -->` also requires the numbers of those columns (what the program
  is, not how fast this machine runs it) to be exactly the printed ones. When a tool's output changes, regenerate
  the quotes instead of editing them: `python tests/doc_runner.py --update docs/GUIDE.md` (it updates the Korean
  edition's quotes too).
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
MARK = re.compile(r"^<!--\s*(save-as|no-test|output)\s*:?\s*(\S*)\s*-->\s*$")
EXIT = re.compile(r"#.*\bexit (\d+)\b")


@dataclass
class Block:
    lang: str
    code: str
    line: int  # where the block starts, for messages
    save_as: str | None = None
    skip: bool = False
    output: str | None = None  # an output quote: "" or "exact=COL,COL"
    end: int = 0  # the line after the block's closing fence (1-based), for --update


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
            b = Block(f.group(1), "\n".join(body) + "\n", start + 1, end=i + 1)
            if mark and mark[0] == "save-as":
                b.save_as = mark[1]
            elif mark and mark[0] == "no-test":
                b.skip = True
            elif mark and mark[0] == "output":
                b.output = mark[1]
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


# ---- output quotes ---------------------------------------------------------------------------------------------

_NUMBER = re.compile(r"(?<![A-Za-z_])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|\b(?:inf|nan)\b")


def _masked(token: str) -> str:
    return _NUMBER.sub("#", token)


def _exact_columns(lines: list[str], spec: str) -> tuple[int, list[int]]:
    """(the index of the header line, the token positions of the exact columns) for `exact=A,B`; (-1, [])."""
    names = [n for n in spec.removeprefix("exact=").split(",") if n] if spec.startswith("exact=") else []
    for i, line in enumerate(lines):
        toks = line.split()
        if names and all(n in toks for n in names):
            return i, [toks.index(n) for n in names]
    return -1, []


def _line_matches(quote: str, line: str, exact: list[int]) -> bool:
    q, t = quote.split(), line.split()
    if len(q) != len(t):
        return False
    return all(a == b if i in exact else _masked(a) == _masked(b) for i, (a, b) in enumerate(zip(q, t)))


def _score(quote: str, line: str) -> int:
    """How alike two lines are: with as many fields, the fields equal once numbers are masked; else (the wording
    changed) the leading fields they share, counted from 2 up, below any line of as many fields."""
    q, t = quote.split(), line.split()
    if len(q) == len(t):
        return len(q) + sum(_masked(a) == _masked(b) for a, b in zip(q, t))
    lead = 0
    for a, b in zip(q, t):
        if _masked(a) != _masked(b):
            break
        lead += 1
    return lead if lead >= 2 else -1


def check_output(quote: str, output: str, spec: str = "") -> list[str]:
    """The quoted lines that are not lines of `output` (numbers masked; the `exact=` columns compared as they are)."""
    lines = [ln for ln in quote.splitlines() if ln.strip() and ln.strip() != "..."]
    header, exact = _exact_columns(lines, spec)
    out_lines = output.splitlines()
    missing = []
    for i, q in enumerate(lines):
        cols = exact if header >= 0 and i > header else []
        if not any(_line_matches(q, o, cols) for o in out_lines):
            missing.append(q)
    return missing


def refreshed(quote: str, output: str) -> tuple[str, list[str]]:
    """The quote with each line replaced by the line of `output` most like it (same number of fields, most fields
    equal once numbers are masked); the lines nothing resembles are kept and returned."""
    out_lines = output.splitlines()
    new, unmatched = [], []
    for q in quote.splitlines():
        if not q.strip() or q.strip() == "...":
            new.append(q)
            continue
        best = max(out_lines, key=lambda o: _score(q, o), default=None)
        if best is None or _score(q, best) <= 0:
            new.append(q)
            unmatched.append(q)
        else:
            new.append(best)
    return "\n".join(new) + "\n", unmatched


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
    quote: Block | None = None  # an output quote of the guide, with the output it quotes


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
            if b.output is not None:
                assert results, f"{where}: an output quote before any command"
                results.append(Result(f"output quote at {where}", 0, results[-1].output))
                results[-1].quote = b
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


def check_quotes(path: Path, results: list[Result]) -> list[str]:
    """Every output quote of the guide that the run contradicts, with the lines it could not find."""
    problems = []
    for r in results:
        if r.quote is None:
            continue
        missing = check_output(r.quote.code, r.output, r.quote.output or "")
        if missing:
            problems.append(f"{path.name}:{r.quote.line}: the output no longer has:\n  " + "\n  ".join(missing))
    if problems:
        problems.append(f"regenerate the quotes: python tests/doc_runner.py --update {path}")
    return problems


def update(path: Path, workdir: Path) -> list[str]:
    """Rerun the guide and rewrite its output quotes (and those of its Korean edition, docs/ko/) from what the tools
    print now. Returns the quoted lines nothing in the output resembles (edit those by hand)."""
    results = run_guide(path, workdir)
    quotes = [r for r in results if r.quote is not None]
    texts = [refreshed(r.quote.code, r.output) for r in quotes]
    unmatched = [line for _, u in texts for line in u]
    editions = [path] + ([path.parent / "ko" / path.name] if (path.parent / "ko" / path.name).is_file() else [])
    if path.name == "README.md" and (path.parent / "README.ko.md").is_file():
        editions.append(path.parent / "README.ko.md")
    for doc in editions:
        lines = doc.read_text(encoding="utf-8").splitlines()
        targets = [b for b in blocks(doc) if b.output is not None]
        assert len(targets) == len(texts), f"{doc.name}: {len(targets)} output quotes, {path.name} has {len(texts)}"
        for b, (text, _) in sorted(zip(targets, texts), key=lambda p: -p[0].line):
            lines[b.line:b.end - 1] = text.rstrip("\n").splitlines()
        doc.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return unmatched


if __name__ == "__main__":
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description="rewrite a guide's output quotes from what the tools print now")
    ap.add_argument("--update", nargs="+", metavar="GUIDE.md", required=True)
    a = ap.parse_args()
    os.environ.setdefault("NPUSIM_BACKEND", "cpu")  # the numbers the doc tests see
    for g in a.update:
        with tempfile.TemporaryDirectory() as tmp:
            left = update(Path(g), Path(tmp))
        print(f"{g}: quotes updated" + (f"; no line like these (edit by hand): {left}" if left else ""))
