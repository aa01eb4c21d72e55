"""Small parts: no function in npu_compiler is longer than MAX_LINES (a screen or two), counted from its `def` to its
last line, nested functions included. A generator that grows past it is split into named emitters (a kernel's
loaders, main loops, epilogues), as targets/cuda's are."""

from __future__ import annotations

import ast
from pathlib import Path

MAX_LINES = 150
PACKAGE = Path(__file__).resolve().parent.parent / "npu_compiler"


def _long_functions(root: Path, limit: int) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name}: {lines} lines")
    return out


def test_no_function_is_longer_than_a_screen_or_two() -> None:
    assert not _long_functions(PACKAGE, MAX_LINES), "\n".join(_long_functions(PACKAGE, MAX_LINES))


def test_the_check_counts_whole_functions(tmp_path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "m.py").write_text(f"def short():\n    pass\n\n\ndef long():\n{body}\n")
    assert [r.split(" ", 1)[1] for r in _long_functions(tmp_path, MAX_LINES)] == [f"long: {MAX_LINES + 1} lines"]
