"""Text from an input, made safe to show: the one definition of what may not print raw (control characters, the
line and paragraph separators, and the bidirectional overrides that reorder what a terminal shows), used by the
readers, which refuse such characters in names (`unsafe_char`), and by every writer of text for people
(`npusim/safe_text.py`, reports, messages), which escape them (`printable`, `one_line`)."""

from __future__ import annotations

import re

__all__ = ["UNSAFE", "printable", "one_line", "unsafe_char", "shown"]

# C0 controls but tab and newline; DEL and the C1 controls; the Arabic letter mark, LRM/RLM, the line and paragraph
# separators, the bidi embeddings, overrides and isolates.
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSAFE_IN_NAMES = re.compile(f"{UNSAFE.pattern[:-1]}\t\n]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(text: str) -> str:
    """`text` with every control and direction-changing character escaped (newlines and tabs kept)."""
    return UNSAFE.sub(_escape, text)


def one_line(text: str) -> str:
    """`printable`, and newlines and tabs escaped too (as \\n and \\t): a message, or a name, is one line whatever
    it quotes."""
    return printable(text).replace("\n", "\\n").replace("\t", "\\t")


def shown(name: object) -> str:
    """A name from an input as it may be printed anywhere: one line, every unsafe character escaped."""
    return one_line(str(name))


def unsafe_char(name: str) -> str | None:
    """The first character a name may not hold (any of `UNSAFE`, a newline or a tab), escaped; None when clean."""
    m = _UNSAFE_IN_NAMES.search(name)
    return None if m is None else _escape(m)
