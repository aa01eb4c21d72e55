"""Latency statistics of repeated runs, reported the way inference benchmarks report them (trtexec): min, mean,
median, p90, p99, max and throughput."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class LatencyStats:
    runs: int
    warmup: int
    min_s: float
    mean_s: float
    median_s: float
    p90_s: float
    p99_s: float
    max_s: float
    total_s: float

    @classmethod
    def of(cls, seconds: list[float], warmup: int) -> LatencyStats:
        a = np.asarray(seconds, dtype=np.float64)
        # percentiles interpolate linearly between runs; with few runs p99 is close to the max
        p90, p99 = np.percentile(a, [90, 99])
        return cls(len(a), warmup, float(a.min()), float(a.mean()), float(np.median(a)), float(p90), float(p99),
                   float(a.max()), float(a.sum()))

    @property
    def throughput(self) -> float:
        """Runs per second, one after another (what a serving loop of batch-as-compiled gets)."""
        return self.runs / self.total_s if self.total_s > 0 else 0.0

    def format(self) -> str:
        return (f"latency over {self.runs} run(s) after {self.warmup} warm-up: {self._spread()}\n"
                f"throughput: {self.throughput:.2f} runs/s")

    def format_device(self) -> str:
        """The line of a device-time measurement (`Executor.device_seconds`)."""
        return (f"device time over {self.runs} run(s), inputs and outputs on the device (the latency adds their "
                f"transfers and the host's work): {self._spread()}")

    def _spread(self) -> str:
        ms = 1e3
        return (f"min {self.min_s * ms:.3f} ms, mean {self.mean_s * ms:.3f}, median {self.median_s * ms:.3f}, "
                f"p90 {self.p90_s * ms:.3f}, p99 {self.p99_s * ms:.3f}, max {self.max_s * ms:.3f} ms")

    def to_dict(self) -> dict:
        return {**asdict(self), "throughput_per_s": self.throughput}


def time_runs(run_once: Callable[[], object], warmup: int, iters: int) -> tuple[LatencyStats, object]:
    """`warmup` untimed calls, then `iters` timed ones (each must include its own synchronisation); the statistics
    and the last call's result."""
    assert iters >= 1 and warmup >= 0, (iters, warmup)  # the options' types check this for the user
    result = None
    for _ in range(warmup):
        result = run_once()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        result = run_once()
        times.append(time.perf_counter() - t0)
    warn_if_noisy(times)
    return LatencyStats.of(times, warmup), result


def warn_if_noisy(seconds: list[float], what: str = "runs") -> list[str]:
    """An NPUSimWarning for each sign that the timings are noisy (their spread, the machine's load)."""
    import warnings

    from npu_compiler.errors import NPUSimWarning
    from npu_runtime.noise import timing_warnings

    found = timing_warnings(seconds, what)
    for text in found:
        warnings.warn(NPUSimWarning(text), stacklevel=3)
    return found
