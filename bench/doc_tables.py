"""Tables the bench scripts write into the docs, between a pair of HTML comment markers."""

from __future__ import annotations

import sys
from pathlib import Path


def write_between_markers(doc: Path, begin: str, end: str, text: str) -> int:
    """Replace what lies between `begin` and `end` in `doc` with `text`; 0, or 1 (said on stderr) without markers."""
    content = doc.read_text()
    if begin not in content or end not in content:
        print(f"{doc}: markers {begin} / {end} not found", file=sys.stderr)
        return 1
    head, rest = content.split(begin, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(f"{head}{begin}\n{text}\n{end}{tail}")
    print(f"written into {doc}")
    return 0
