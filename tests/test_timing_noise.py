"""CPU threads from the cores the process may use, and timings that say when they are noisy (issue 53): a loaded
machine made medians 10-100x off with no warning, and `profile` on the CPU explained its overhead by CUDA graph
replay while its header total and % column disagreed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_hardening import small_ir, small_weights, write_safetensors

import npu_compiler
from npu_runtime import noise
from npu_runtime.cpu import threads
from npusim.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_a_cgroup_quota_bounds_the_usable_cores(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    b = threads.usable_cores(tmp_path)
    assert b.quota == 1.5 and b.usable == min(b.affinity, 2)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert threads.usable_cores(tmp_path).quota is None
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert threads.usable_cores(tmp_path).usable == 1


PROBE = """
import json, os, sys
import numpy  # OpenBLAS sizes its pool now, by the machine
from threadpoolctl import threadpool_info
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # what `taskset -c 0` or a 1-CPU container gives
from npu_runtime import get_backend
be = get_backend("cpu")
print(json.dumps({"blas": [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"],
                  "describe": be.describe()}))
"""


def _probe(env: dict) -> dict:
    env = {**{k: v for k, v in os.environ.items() if k not in threads.THREAD_VARS}, "PYTHONPATH": str(ROOT), **env}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this system")
def test_the_cpu_backend_sizes_blas_to_the_cores_it_may_use():
    got = _probe({})
    assert got["blas"] and set(got["blas"]) == {1}, got
    assert "1 BLAS/OpenMP thread(s) (1 usable core(s)" in got["describe"]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this system")
def test_the_users_thread_setting_is_kept():
    got = _probe({"OPENBLAS_NUM_THREADS": "2"})
    assert set(got["blas"]) == {2}, got
    assert "threads as you set them (OPENBLAS_NUM_THREADS=2" in got["describe"]


def test_spread_and_load_warnings(monkeypatch):
    assert noise.spread_warning([1e-3] * 10) is None
    assert noise.spread_warning([1e-3, 1e-3]) is None  # too few to tell
    text = noise.spread_warning([1e-3] * 5 + [3e-3] * 5)
    assert text and "the timings are noisy" in text and "--iters" in text
    cores = threads.usable_cores().usable
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2 * cores, 0.0, 0.0))
    assert noise.load_warning() is None
    monkeypatch.setattr(os, "getloadavg", lambda: (4.0 * cores, 0.0, 0.0))
    assert "the machine is busy" in noise.load_warning()


@pytest.fixture
def model(tmp_path):
    prog = npu_compiler.compile(small_ir())
    prog.save(tmp_path / "m.npubin")
    write_safetensors(tmp_path / "m.safetensors",
                      {k: ("F32", v.shape, v.tobytes()) for k, v in small_weights().items()})
    return tmp_path / "m.npubin"


def test_run_and_profile_warn_on_a_busy_machine(model, capsys, monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    assert main(["run", str(model), "--iters", "3", "--warmup", "0"]) == 0
    assert "warning: the machine is busy" in capsys.readouterr().err
    assert main(["profile", str(model), "--iters", "3", "--warmup", "0", "--json"]) == 0
    out, err = capsys.readouterr()
    assert "warning: the machine is busy" in err and any("busy" in n for n in json.loads(out)["noise"])


def test_profile_header_and_percent_column_agree_and_cpu_says_cpu(model, capsys, monkeypatch):
    monkeypatch.setattr("npusim.commands.profile.SLOWER_NOTE", 0.0)  # the note always, to read it
    assert main(["profile", str(model), "--iters", "3", "--warmup", "1", "--top", "0"]) == 0
    out = capsys.readouterr().out
    header = re.search(r"of which kernels ([0-9.]+) ms", out)
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d+ k\d+_", line)]
    assert header and rows
    times_ms = sum(float(r[3]) for r in rows) / 1e3
    assert abs(times_ms - float(header.group(1))) <= 1e-3 * len(rows) + 1e-3, (times_ms, header.group(1))
    assert abs(sum(float(r[4]) for r in rows) - 100.0) <= 0.1 * len(rows)
    note = next(line for line in out.splitlines() if line.startswith("a profiled run takes"))
    assert "CUDA" not in note and "clock" in note, note
