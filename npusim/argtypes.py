"""Option value types that refuse what a command cannot use, at parse time, with argparse's own one-line usage
error (exit status 2): NaN and infinities where a number must be finite, negative counts, absurd sizes."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

MAX_RUNS = 1_000_000  # --warmup / --iters: more is a typo, not a benchmark
MAX_SEED = 2**63 - 1


def integer(lo: int | None = None, hi: int | None = None, name: str = "integer") -> Callable[[str], int]:
    """A whole number in [lo, hi]."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects a whole number, got {text!r}") from None
        if lo is not None and n < lo:
            raise argparse.ArgumentTypeError(f"must be at least {lo}, got {n}")
        if hi is not None and n > hi:
            raise argparse.ArgumentTypeError(f"must be at most {hi}, got {n}")
        return n

    parse.__name__ = name
    return parse


def number(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False,
           name: str = "number") -> Callable[[str], float]:
    """A finite number in the interval from lo to hi (open at either end when asked)."""

    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects a number, got {text!r}") from None
        if not math.isfinite(x):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if lo is not None and (x < lo or (lo_open and x == lo)):
            raise argparse.ArgumentTypeError(f"must be {'above' if lo_open else 'at least'} {lo:g}, got {x:g}")
        if hi is not None and (x > hi or (hi_open and x == hi)):
            raise argparse.ArgumentTypeError(f"must be {'below' if hi_open else 'at most'} {hi:g}, got {x:g}")
        return x

    parse.__name__ = name
    return parse


seed = integer(0, MAX_SEED, "seed")
runs = integer  # integer(least, MAX_RUNS) for --warmup and --iters
positive = number(0.0, lo_open=True, name="positive number")
non_negative = number(0.0, name="non-negative number")
