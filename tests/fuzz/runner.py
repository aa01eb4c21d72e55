"""The fuzz run: cases drawn from fixed seeds, run in worker processes (a crash kills a worker, not the run; a case
past its time limit is a hang and its worker is replaced), outcomes counted in one table.

    PYTHONPATH=. python tests/fuzz/runner.py                       # the long run (counts below)
    PYTHONPATH=. python tests/fuzz/runner.py --ir 300 --artifact 200 --weights 60 --cli 80   # a shorter one

Prints the table in the form of issue 12 and exits 1 when any case was a raw exception, a crash, a hang, an
invalid input accepted, code run, or a harness failure. `--save-failures DIR` writes one corpus file per such case
(tests/fuzz/corpus/ keeps them as regression cases; test_fuzz.py replays them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty, Queue

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

ROWS = [("ir", "IR JSON through `npu_compiler.compile`"),
        ("ir_cli", "IR JSON through `npusim compile` / `npusim run IR.json`"),
        ("artifact", "`.npubin` with the SHA-256 recomputed, `npusim run` (+ `describe`)"),
        ("weights", "safetensors weights, `npusim run`"), ("cli", "CLI inputs and options")]
BAD = ("raw", "crash", "hang", "invalid", "harness", "stale")
WORKER_MEMORY = 6 << 30  # address space of one worker: a runaway allocation fails there, not on the machine
WORKER_MAX_BYTES = "1G"  # NPUSIM_MAX_BYTES inside the workers


# ---- cases --------------------------------------------------------------------------------------------------------


def make_cases(kind: str, n: int, seed: int, seed_dir: Path) -> list[dict]:
    import mutate
    import seeds as seedlib

    cases = []
    if kind in ("ir", "ir_cli"):
        irs = {s: seedlib.load_ir(seed_dir, s) for s in seedlib.SEED_IRS}
        for i in range(n):
            r = random.Random(f"{seed}:{kind}:{i}")
            s = seedlib.SEED_IRS[i % len(seedlib.SEED_IRS)]
            case = {"kind": kind, "seed": s, "ops": mutate.gen_ir_ops(r, irs[s])}
            if kind == "ir_cli":  # half through `npusim compile`, half through `npusim run IR.json`
                case["command"] = ("compile", "run")[i % 2]
            cases.append(case)
    elif kind == "artifact":
        blobs = {s: (seed_dir / f"{s}.npubin").read_bytes() for s in seedlib.SEED_ARTIFACTS}
        for i in range(n):
            r = random.Random(f"{seed}:{kind}:{i}")
            s = seedlib.SEED_ARTIFACTS[i % len(seedlib.SEED_ARTIFACTS)]
            cases.append({"kind": kind, "seed": s, "ops": mutate.gen_artifact_ops(r, blobs[s])})
    elif kind == "weights":
        blobs = {s: (seed_dir / seedlib.weights_file(s)).read_bytes() for s in ("resnet", "qwen")}
        for i in range(n):
            r = random.Random(f"{seed}:{kind}:{i}")
            s = ("resnet", "qwen")[i % 2]
            cases.append({"kind": kind, "seed": s, "ops": mutate.gen_weights_ops(r, blobs[s])})
    elif kind == "cli":
        import cli_cases

        for i in range(n):
            cases.append(cli_cases.make(random.Random(f"{seed}:{kind}:{i}"), i))
    return cases


# ---- workers --------------------------------------------------------------------------------------------------------


def worker_main(seed_dir: str, work_dir: str) -> None:
    """Read one case per line on stdin, write one outcome per line on the protocol fd (the real stdout); everything
    else the cases print goes to stderr."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))
    os.umask(0o027)  # files the CLI writes must follow it (0640), not a fixed 0644
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import oracle

    ctx = oracle.Context(seed_dir, work_dir)
    for line in sys.stdin:
        case = json.loads(line)
        out = oracle.run_case(case, ctx)
        proto.write(json.dumps(out.to_dict()) + "\n")


@dataclass
class Result:
    case: dict
    kind: str
    detail: str = ""
    refused_valid: bool = False
    code_run: bool = False
    seconds: float = 0.0


@dataclass
class Pool:
    seed_dir: Path
    workers: int
    timeout: float
    log: Path
    results: list[Result] = field(default_factory=list)

    def _spawn(self, wid: int) -> subprocess.Popen:
        env = {**os.environ, "NPUSIM_MAX_BYTES": WORKER_MAX_BYTES, "PYTHONPATH": f"{ROOT}{os.pathsep}"
               f"{os.environ.get('PYTHONPATH', '')}", "NPUSIM_BACKEND": "cpu", "PYTHONHASHSEED": "0"}
        work = Path(tempfile.mkdtemp(prefix=f"npusim-fuzz-w{wid}-"))
        return subprocess.Popen([sys.executable, str(HERE / "runner.py"), "--worker", str(self.seed_dir), str(work)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(self.log, "ab"),
                                env=env, cwd=str(work), text=True, start_new_session=True)

    def run(self, cases: list[dict], progress: bool = True) -> list[Result]:
        queue: Queue = Queue()
        for c in cases:
            queue.put(c)
        lock = threading.Lock()
        done = [0]
        t0 = time.time()

        def loop(wid: int) -> None:
            proc = self._spawn(wid)
            while True:
                try:
                    case = queue.get_nowait()
                except Empty:
                    break
                start = time.time()
                res = self._one(proc, case)
                res.seconds = time.time() - start
                if res.kind in ("crash", "hang"):
                    _kill(proc)
                    proc = self._spawn(wid)
                with lock:
                    self.results.append(res)
                    done[0] += 1
                    if progress and (done[0] % 50 == 0 or done[0] == len(cases)):
                        bad = sum(r.kind in BAD or r.code_run for r in self.results)
                        print(f"  {done[0]}/{len(cases)} cases, {bad} bad, {time.time() - t0:.0f} s",
                              file=sys.stderr, flush=True)
            _kill(proc)

        threads = [threading.Thread(target=loop, args=(w,)) for w in range(self.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return self.results

    def _one(self, proc: subprocess.Popen, case: dict) -> Result:
        try:
            proc.stdin.write(json.dumps(case) + "\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return Result(case, "crash", f"worker gone before the case (exit {proc.poll()})")
        ready, _, _ = select.select([proc.stdout], [], [], self.timeout)
        if not ready:
            return Result(case, "hang", f"no result in {self.timeout:.0f} s")
        line = proc.stdout.readline()
        if not line:
            code = proc.wait(timeout=10)
            sig = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
            return Result(case, "crash", f"worker died: {sig}")
        d = json.loads(line)
        return Result(case, d["kind"], d["detail"], d["refused_valid"], d["code_run"])


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


# ---- report ---------------------------------------------------------------------------------------------------------


def table(results: list[Result]) -> str:
    lines = ["| input | cases | clean error | raw internal exception | crash / hang | accepted though invalid | "
             "accepted, valid | code run |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for kind, label in ROWS:
        rs = [r for r in results if r.case["kind"] == kind]
        if not rs:
            continue
        c = Counter(r.kind for r in rs)
        extra = c["harness"] + c["stale"]
        lines.append(f"| {label} | {len(rs):,} | {c['clean']:,} | {c['raw']:,} | {c['crash']} / {c['hang']} | "
                     f"{c['invalid']:,} | {c['valid']:,} | {sum(r.code_run for r in rs)} |"
                     + (f" ({extra} harness/stale)" if extra else ""))
    return "\n".join(lines)


def failures(results: list[Result]) -> list[Result]:
    return [r for r in results if r.kind in BAD or r.code_run]


def _portable(detail: str) -> str:
    """A detail without this machine's paths: a worker's folder (its canary included) becomes its placeholder."""
    tmp = re.escape(tempfile.gettempdir().rstrip("/"))
    detail = re.sub(tmp + r"/npusim-fuzz-w\d+-[A-Za-z0-9_]+/CANARY", "{CANARY}", detail)
    return re.sub(tmp + r"/npusim-fuzz-w\d+-[A-Za-z0-9_]+", "{WORK}", detail)


def save(results: list[Result], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in failures(results):
        body = {**r.case, "found": {"outcome": r.kind, "detail": _portable(r.detail), "code_run": r.code_run}}
        name = hashlib.sha1(json.dumps(r.case, sort_keys=True).encode()).hexdigest()[:12]
        p = folder / f"{r.case['kind']}-{name}.json"
        p.write_text(json.dumps(body, indent=1, ensure_ascii=True) + "\n")
        paths.append(p)
    return paths


def build_seeds(folder: Path | None) -> Path:
    import seeds as seedlib

    folder = folder or Path(os.environ.get("NPUSIM_FUZZ_SEEDS", Path(tempfile.gettempdir()) / "npusim-fuzz-seeds"))
    return seedlib.build(folder)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", nargs=2, metavar=("SEEDS", "WORK"), help=argparse.SUPPRESS)
    p.add_argument("--ir", type=int, default=10_000, help="IR cases through npu_compiler.compile")
    p.add_argument("--ir-cli", type=int, default=300, help="IR cases through `npusim compile`")
    p.add_argument("--artifact", type=int, default=5_000, help="artifact cases")
    p.add_argument("--weights", type=int, default=1_000, help="safetensors cases")
    p.add_argument("--cli", type=int, default=600, help="CLI option and input-file cases")
    p.add_argument("--seed", type=int, default=12, help="the run's seed (cases are drawn from it)")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2)))
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a case counts as a hang")
    p.add_argument("--seeds-dir", type=Path, default=None, help="where the seed models are built (cached)")
    p.add_argument("--save-failures", type=Path, default=None, help="write a corpus file per failing case here")
    p.add_argument("--json", type=Path, default=None, help="write every outcome here")
    args = p.parse_args(argv)
    if args.worker:
        worker_main(*args.worker)
        return 0
    t0 = time.time()
    seed_dir = build_seeds(args.seeds_dir)
    cases = []
    for kind, n in (("ir", args.ir), ("ir_cli", args.ir_cli), ("artifact", args.artifact),
                    ("weights", args.weights), ("cli", args.cli)):
        cases += make_cases(kind, n, args.seed, seed_dir)
    random.Random(args.seed).shuffle(cases)  # mix slow and fast kinds across workers
    log = Path(tempfile.gettempdir()) / "npusim-fuzz-workers.log"
    pool = Pool(seed_dir, args.workers, args.timeout, log)
    results = pool.run(cases)
    print(table(results))
    bad = failures(results)
    print(f"\n{len(results):,} cases in {time.time() - t0:.0f} s with {args.workers} workers (seed {args.seed}); "
          f"refused though ATen runs it: {sum(r.refused_valid for r in results)} (informational)")
    for r in bad[:40]:
        what = json.dumps(r.case.get("ops") or r.case.get("argv"))[:150]
        print(f"  {r.kind}: {r.case['kind']} {r.case.get('seed', '')} {what}\n      {r.detail[:300]}")
    if args.save_failures and bad:
        for path in save(results, args.save_failures):
            print(f"  saved {path}")
    if args.json:
        args.json.write_text(json.dumps([{**r.case, "outcome": r.kind, "detail": r.detail, "refused_valid":
                                          r.refused_valid, "code_run": r.code_run, "seconds": r.seconds}
                                         for r in results]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
