"""Text the CLI writes escapes what the input brings: a node, tensor or model name from an IR or an artifact may
hold control characters (a terminal escape sequence that retitles the window or rewrites the screen, a carriage
return that overwrites a line, a newline that forges a line of a log, bidirectional overrides that reorder what is
shown). The readers refuse such names; everything the CLI prints goes through `SafeStream` (control characters
escaped, newlines and tabs kept for the CLI's own layout), and a name from any other input (a checkpoint's keys, a
file name) through `shown` (`one_line`: newlines escaped too). What is unsafe is defined once, in
`npu_compiler.text`."""

from __future__ import annotations

from typing import Any, TextIO

from npu_compiler.text import one_line, printable, shown

__all__ = ["SafeStream", "printable", "one_line", "shown"]


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
