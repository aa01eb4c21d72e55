"""How many threads the CPU backend's BLAS and OpenMP pools use: as many as the cores this process may use, unless
the user said otherwise.

A BLAS library sizes its pool by the machine's processors, not by what the process is allowed: in a container
limited to 2 CPUs on a 64-core host, or under `taskset`, OpenBLAS starts a thread per host core, and the threads
then take turns on the few cores they have (one measured run: a median of 348 ms against 2.5 ms with one thread).
The cores a process may use are its CPU affinity (`os.sched_getaffinity`) bounded by its cgroup's CPU quota
(cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`), rounded up. A thread count the user set
(`OMP_NUM_THREADS`, `OPENBLAS_NUM_THREADS`, `MKL_NUM_THREADS`, ...) is left as it is. The pools are set with
threadpoolctl, once per process, when the first CPU backend is made.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CoreBudget", "ThreadSetting", "usable_cores", "configure_threads", "THREAD_VARS"]

# The variables by which a user sets the pools' sizes (any one of them set: npusim changes nothing)
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
_CGROUP = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class CoreBudget:
    """The cores this process may use: its affinity, its cgroup quota (in cores, None without one), and the
    smaller of the two, rounded up."""

    affinity: int
    quota: float | None
    usable: int

    def describe(self) -> str:
        quota = "no cgroup CPU quota" if self.quota is None else f"cgroup quota {self.quota:g} cores"
        return f"{self.usable} usable core(s): affinity {self.affinity}, {quota}"


@dataclass(frozen=True)
class ThreadSetting:
    threads: int | None  # what the pools were set to (None: left to the user's variables)
    budget: CoreBudget
    user: dict[str, str]  # the user's thread variables, when set

    def describe(self) -> str:
        if self.user:
            return f"threads as you set them ({', '.join(f'{k}={v}' for k, v in self.user.items())}; " \
                   f"{self.budget.describe()})"
        return f"{self.threads} BLAS/OpenMP thread(s) ({self.budget.describe()})"


def _cgroup_quota(root: Path = _CGROUP) -> float | None:
    """The CPU quota of this process's cgroup, in cores (None: no quota, or none found)."""
    try:
        text = (root / "cpu.max").read_text().split()  # v2: "max 100000" or "200000 100000"
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
        if text:
            return None
    except (OSError, ValueError, IndexError):
        pass
    try:  # v1
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def usable_cores(cgroup_root: Path = _CGROUP) -> CoreBudget:
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows: no affinity call
        affinity = os.cpu_count() or 1
    quota = _cgroup_quota(cgroup_root)
    usable = max(1, min(affinity, math.ceil(quota) if quota else affinity))
    return CoreBudget(affinity, quota, usable)


@functools.cache
def configure_threads() -> ThreadSetting:
    """Set the BLAS and OpenMP pools to the usable cores (once per process), unless the user set a thread variable.
    Without threadpoolctl the pools are left as they are (and the setting says so: threads None)."""
    budget = usable_cores()
    user = {k: os.environ[k] for k in THREAD_VARS if os.environ.get(k)}
    if user:
        return ThreadSetting(None, budget, user)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return ThreadSetting(None, budget, {})
    threadpool_limits(limits=budget.usable)  # called, not entered: the limit stays for the process
    return ThreadSetting(budget.usable, budget, {})
