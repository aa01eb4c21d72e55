"""A small progress display for long steps (export, compile, weight loading, generation): a bar redrawn in place
on a terminal, nothing at all when stderr is not a TTY (logs, CI, pipes) or with --quiet.

Usage: `with Progress("loading weights", quiet=args.quiet) as p: load_weights(..., progress=p.callback)`.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from .safe_text import shown


class Progress:
    def __init__(self, label: str, total: int | None = None, *, quiet: bool = False, stream: TextIO | None = None,
                 width: int = 30, min_interval_s: float = 0.05) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        # Redraw at most every min_interval_s: a model with thousands of weights must not spend time drawing.
        self.min_interval_s = min_interval_s
        self.enabled = not quiet and _is_tty(self.stream)
        self._last_draw = 0.0
        self._t0 = time.perf_counter()
        self._detail = ""
        self._drawn = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, done: int, total: int | None = None, detail: str = "") -> None:
        self.done = done
        if total is not None:
            self.total = total
        self._detail = detail
        now = time.perf_counter()
        finished = self.total is not None and done >= self.total
        if self.enabled and (finished or now - self._last_draw >= self.min_interval_s):
            self._last_draw = now
            self._draw()

    def advance(self, n: int = 1, detail: str = "") -> None:
        self.update(self.done + n, detail=detail)

    def callback(self, done: int, total: int, detail: str = "") -> None:
        """The `progress=` callback of npu_runtime.load_weights: (done, total, what)."""
        self.update(done, total, detail)

    def render(self) -> str:
        elapsed = time.perf_counter() - self._t0
        if self.total:
            frac = min(1.0, self.done / self.total)
            fill = int(round(frac * self.width))
            bar = "#" * fill + "-" * (self.width - fill)
            text = f"{self.label} [{bar}] {self.done}/{self.total} {elapsed:5.1f}s"
        else:
            text = f"{self.label} {self.done} {elapsed:5.1f}s"
        if self._detail:
            text += f"  {shown(self._detail)[:40]}"  # a weight's key from the checkpoint: one line, escaped
        return text

    def _draw(self) -> None:
        # the bar's own control sequence goes out as is; the text (a weight's name) through the escaping stream
        getattr(self.stream, "write_control", self.stream.write)("\r\x1b[2K")
        self.stream.write(self.render())
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled and self._drawn:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()


def _is_tty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def weight_progress(quiet: bool = False) -> Progress:
    return Progress("loading weights", quiet=quiet)
