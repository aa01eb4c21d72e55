"""Whether timings can be trusted: the run-to-run spread of the timed runs, and the load of the machine while they
ran. `run`, `profile` and the benchmarks print these as warnings beside their figures: on a loaded machine a median
can be 10 to 100 times the time of the same program on a quiet one, and nothing else in the output would say so."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

__all__ = ["spread_warning", "load_warning", "timing_warnings", "MAX_SPREAD", "MAX_LOAD_PER_CORE"]

MAX_SPREAD = 0.25  # (p90 - p10) / median above this: the runs disagree too much for one figure to stand for them
MAX_LOAD_PER_CORE = 1.5  # the 1-minute load average per usable core above this: other work competes for the CPU
MIN_RUNS = 3


def spread_warning(seconds: Sequence[float], what: str = "runs") -> str | None:
    """A line when the timed runs spread too widely (None when they agree, or are too few to tell)."""
    a = np.asarray(seconds, dtype=np.float64)
    if a.size < MIN_RUNS:
        return None
    p10, med, p90 = np.percentile(a, [10, 50, 90])
    if med <= 0 or (p90 - p10) / med <= MAX_SPREAD:
        return None
    return (f"the timings are noisy: {what} spread over {100 * (p90 - p10) / med:.0f}% of their median (p10 "
            f"{p10 * 1e3:.3f} ms, median {med * 1e3:.3f} ms, p90 {p90 * 1e3:.3f} ms over {a.size} runs); take more "
            "runs (--iters), or time on a quieter machine")


def load_warning() -> str | None:
    """A line when the machine is busier than its usable cores (None when not, or where no load average exists)."""
    from .cpu.threads import usable_cores

    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cores = usable_cores().usable
    if load <= MAX_LOAD_PER_CORE * cores:
        return None
    return (f"the machine is busy: a 1-minute load average of {load:.1f} on {cores} usable core(s); other processes "
            "take CPU time from the runs, so the figures may be several times too slow")


def timing_warnings(seconds: Sequence[float], what: str = "runs") -> list[str]:
    return [w for w in (spread_warning(seconds, what), load_warning()) if w]
