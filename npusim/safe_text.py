"""Text the CLI writes escapes what the input brings: a node, tensor or model name from an IR or an artifact may
hold control characters (a terminal escape sequence that retitles the window or rewrites the screen, a carriage
return that overwrites a line, bidirectional overrides that reorder what is shown). Every such character becomes a
visible escape (`\\x1b`, `\\u202e`) in everything the CLI prints; newlines and tabs stay."""

from __future__ import annotations

import re
from typing import Any, TextIO

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(text: str) -> str:
    """`text` with every control and direction-changing character escaped (newlines and tabs kept)."""
    return _UNSAFE.sub(_escape, text)


def one_line(text: str) -> str:
    """`printable`, and newlines escaped too: an error message is one line, whatever names it quotes."""
    return printable(text).replace("\n", "\\n").replace("\t", " ")


class SafeStream:
    """A text stream that escapes what `printable` escapes. `write_control` writes the CLI's own control sequences
    (the progress bar's carriage return) as they are."""

    def __init__(self, raw: TextIO) -> None:
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(printable(text))
        return len(text)

    def write_control(self, text: str) -> None:
        self.raw.write(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, ...
        return getattr(self.raw, name)
