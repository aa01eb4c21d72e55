"""Running one fuzz case and saying what happened (inside a worker process; the runner sees crashes and hangs).

Outcomes:
- "clean": refused with an error of the hierarchy (a one-line `npusim ... error:` from the CLI, exit 1 or 2).
- "raw": anything else that ends the work: an InternalError (npusim's own report of a bug), a ResourceError (memory:
  sizes are meant to be refused before allocating), an exception outside the hierarchy, a CLI traceback or exit 70.
- "valid": accepted, and what it did is right: the IR's outputs match ATen's on the same inputs and weights (see
  `aten_reference`); an artifact's outputs do not depend on memory no kernel wrote; weights the checkpoint rules
  allow, with every conversion reported; a CLI value the documentation accepts.
- "invalid": accepted though invalid: an IR that ATen refuses or whose declared types are not what its ops produce
  (or whose results differ from ATen's), an artifact whose results depend on uninitialised memory, weights with NaN,
  an infinity or a forbidden dtype loaded, a CLI value the documentation refuses, output files
  that do not parse.
Besides, "code_run" is set when the canary file appears (a payload in a name was executed), and "refused_valid"
when the IR was refused though ATen runs it (informational: the reader is stricter than ATen, see its message).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import mutate  # noqa: E402
import seeds as seedlib  # noqa: E402


@dataclass
class Outcome:
    kind: str
    detail: str = ""
    refused_valid: bool = False
    code_run: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


TOL = {"float32": 1e-3, "float16": 3e-2, "bfloat16": 1e-1}


class Context:
    """What a worker keeps between cases: the seeds, read once."""

    def __init__(self, seed_dir: str, work_dir: str) -> None:
        self.seed_dir = Path(seed_dir)
        self.work = Path(work_dir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.canary = str(self.work / "CANARY")
        self._irs: dict[str, dict] = {}
        self._blobs: dict[str, bytes] = {}
        self._weights: dict[str, dict[str, np.ndarray]] = {}

    def ir(self, seed: str) -> dict:
        if seed not in self._irs:
            self._irs[seed] = seedlib.load_ir(self.seed_dir, seed)
        return self._irs[seed]

    def blob(self, name: str) -> bytes:
        if name not in self._blobs:
            self._blobs[name] = (self.seed_dir / name).read_bytes()
        return self._blobs[name]

    def weights(self, seed: str) -> dict[str, np.ndarray]:
        f = seedlib.weights_file(seed)
        if f not in self._weights:
            from safetensors.numpy import load_file

            self._weights[f] = load_file(str(self.seed_dir / f))
        return self._weights[f]

    def weights_path(self, seed: str) -> str:
        return str(self.seed_dir / seedlib.weights_file(seed))


# ---- helpers ------------------------------------------------------------------------------------------------------


def classify_exception(e: BaseException) -> Outcome:
    from npu_compiler.errors import InternalError, NPUSimError, ResourceError

    if isinstance(e, InternalError | ResourceError):
        return Outcome("raw", f"{type(e).__name__}: {_cause(e)}")
    if isinstance(e, NPUSimError):
        return Outcome("clean", f"{type(e).__name__}: {str(e)[:300]}")
    return Outcome("raw", "".join(traceback.format_exception_only(type(e), e)).strip()[:500])


def _cause(e: BaseException) -> str:
    c = e.__cause__
    if c is None:
        return str(e)[:300]
    tb = traceback.extract_tb(c.__traceback__)
    where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    return f"{type(c).__name__}: {str(c)[:200]}{where}"


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`npusim ARGV` in this process: (exit status, stdout, stderr)."""
    from npusim.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's usage errors
            code = e.code if isinstance(e.code, int) else 1
        except BaseException as e:  # a raw exception out of main: its own category
            traceback.print_exc(file=err)
            code = -999 if not isinstance(e, KeyboardInterrupt) else 130
    return int(code or 0), out.getvalue(), err.getvalue()


def classify_cli(code: int, out: str, err: str) -> Outcome:
    if code == 0:
        return Outcome("valid")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if "Traceback" in err or code in (70, -999):
        return Outcome("raw", err.strip().splitlines()[-1][:400] if err.strip() else f"exit {code}")
    errors = [ln for ln in lines if "error:" in ln]
    if code in (1, 2) and errors:
        if any(ch in err for ch in "\x1b\x07\r\x00"):
            return Outcome("invalid", f"the error line holds raw control characters: {errors[-1][:200]!r}")
        return Outcome("clean", errors[-1][:300])
    return Outcome("raw", f"exit {code} without a one-line error: {err[-300:]!r}")


def _compare(outs: dict[str, np.ndarray], ref: dict[str, np.ndarray], compute: str) -> str | None:
    """None when every output matches its reference within the compute dtype's tolerance (max |err| / max |ref|),
    with NaN and infinities in the same places; else what differs."""
    for name, r in ref.items():
        if name not in outs:
            return f"output {name} missing"
        o = np.asarray(outs[name])
        r = np.asarray(r)
        if o.shape != r.shape:
            return f"output {name}: shape {o.shape}, reference {r.shape}"
        if r.dtype.kind in "biu" or o.dtype.kind in "biu":
            if not np.array_equal(o.astype(np.float64), r.astype(np.float64)):
                return f"output {name}: integers differ ({int((o != r).sum())} elements)"
            continue
        of, rf = o.astype(np.float64), r.astype(np.float64)
        if not np.array_equal(np.isnan(of), np.isnan(rf)) or not np.array_equal(np.isposinf(of), np.isposinf(rf)) \
                or not np.array_equal(np.isneginf(of), np.isneginf(rf)):
            return f"output {name}: NaN/inf in other places than the reference's"
        fin = np.isfinite(rf)
        if not fin.any():
            continue
        scale = max(1.0, float(np.abs(rf[fin]).max()))
        err = float(np.abs(of[fin] - rf[fin]).max())
        if err > TOL.get(compute, 1e-3) * scale:
            return f"output {name}: max |err| {err:.3g} above {TOL.get(compute, 1e-3):g} x {scale:.3g}"
    return None


def _canary(ctx: Context, outcome: Outcome) -> Outcome:
    if os.path.exists(ctx.canary):
        os.unlink(ctx.canary)
        outcome.code_run = True
    return outcome


# ---- IR -------------------------------------------------------------------------------------------------------------


def sane_inputs(specs, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for a run: random ones (npusim's own generator), with a KV-cache model's positions distinct and its
    mask causal (index_copy with repeated positions is nondeterministic in ATen itself)."""
    from npusim.common import collect_inputs

    arrays = collect_inputs(specs, {}, seed=seed).arrays
    pos = arrays.get("cache_position")
    if pos is not None and pos.ndim == 1 and pos.dtype.kind in "iu":
        t = pos.shape[0]
        mask = arrays.get("attention_mask")
        slots = mask.shape[-1] if mask is not None and mask.ndim == 4 else t
        start = min(3, max(slots - t, 0))
        arrays["cache_position"] = np.arange(start, start + t, dtype=pos.dtype)
        ids = arrays.get("position_ids")
        if ids is not None and ids.shape == (1, t):
            arrays["position_ids"] = arrays["cache_position"][None].astype(ids.dtype)
        if mask is not None and mask.ndim == 4 and mask.shape[-2] == t:
            allowed = np.arange(slots)[None, :] <= (start + np.arange(t))[:, None]
            low = np.finfo(np.float32).min if mask.dtype.kind == "f" else -1e4
            m = np.where(allowed, 0.0, low).astype(np.float32)
            arrays["attention_mask"] = np.broadcast_to(m, mask.shape).astype(mask.dtype)
    return arrays


def _float_dtypes(ir: Any) -> set[str]:
    found = set()
    for _, v in mutate.walk(ir):
        if isinstance(v, str) and v.removeprefix("torch.") in ("float16", "bfloat16"):
            found.add(v.removeprefix("torch."))
    return found


def run_ir(case: dict, ctx: Context) -> Outcome:
    from aten_reference import ReferenceError
    from aten_reference import run_ir as reference_ir

    import npu_compiler
    import npu_runtime
    from npu_compiler.errors import IRFormatError

    try:
        text = mutate.apply_ir(ctx.ir(case["seed"]), case["ops"], ctx.canary)
    except mutate.Stale as e:
        return Outcome("stale", str(e))
    via_cli = case["kind"] == "ir_cli"
    if via_cli:
        path = ctx.work / "case.json"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        if case.get("command") == "run":
            return _run_ir_cli(path, text, case, ctx)
        res = classify_cli(*run_cli(["compile", str(path), "-o", str(ctx.work / "case.npubin"), "--dtype",
                                     "float32"]))
        if res.kind != "valid":
            return res
    try:
        # `npusim compile` writes one artifact for any graph (ops without a lowering in CPU segments); the API's
        # compile() makes one program or refuses
        compile_fn = npu_compiler.compile_artifact if via_cli else npu_compiler.compile
        prog = compile_fn(text, "cpu", dtype="float32")
    except Exception as e:
        out = classify_exception(e)
        if via_cli:
            return Outcome("raw", f"the CLI compiled it, the API refused: {out.detail}")
        if out.kind == "clean" and isinstance(e, IRFormatError):
            out.refused_valid = _reference_runs(text, ctx, case["seed"])
        return out
    cpu = npu_runtime.get_backend("cpu")
    try:
        inputs = sane_inputs(prog.inputs)
        if isinstance(prog, npu_compiler.PartitionedProgram):
            from npu_runtime.dag_executor import DAGExecutor

            outs = DAGExecutor(prog, cpu, weights=ctx.weights(case["seed"])).run(inputs)
        else:
            ws = npu_runtime.load_weights(prog, ctx.weights(case["seed"]), cpu)
            outs = cpu.create_executor(prog).run_numpy(inputs, ws)
    except Exception as e:
        return classify_exception(e)
    try:
        ir = json.loads(text)
        ref = reference_ir(ir, ctx.weights(case["seed"]), inputs, check_types=True)
    except ReferenceError as e:
        return Outcome("invalid", f"ATen refuses what was compiled and run: {str(e)[:300]}")
    except Exception as e:  # the reference itself failing in an unforeseen way: count it, do not hide it
        return Outcome("invalid", f"reference failed: {type(e).__name__}: {str(e)[:200]}")
    compute = min(_float_dtypes(ir) | {prog.compute_dtype}, key=lambda d: -TOL.get(d, 0))
    problem = _compare(outs, ref, compute)
    return Outcome("invalid", f"wrong result: {problem}") if problem else Outcome("valid")


def _run_ir_cli(path: Path, text: str, case: dict, ctx: Context) -> Outcome:
    """`npusim run IR.json` (compiled on the fly in the automatic compute dtype, or the partition path when an op
    has no lowering), inputs given as files. Accepted is valid when ATen runs the IR with the types it declares and
    the outputs are those of the same program compiled and run through the API (bit for bit; the numbers of
    compiled programs are compared with ATen's by the `ir` cases, in fp32). On the partition path (an op without a
    lowering runs through torch itself), ATen running the IR with its declared types is what is checked."""
    from aten_reference import ReferenceError
    from aten_reference import run_ir as reference_ir

    import npu_compiler
    import npu_runtime
    from npu_compiler.errors import UnsupportedOpError
    from npusim.common import input_specs_from_ir

    argv = ["run", str(path), "--weights", ctx.weights_path(case["seed"]), "--iters", "1", "--warmup", "0",
            "--backend", "cpu", "-o", str(ctx.work / "out.npz")]
    inputs = None
    try:
        inputs = sane_inputs(input_specs_from_ir(text))
    except Exception:  # noqa: BLE001  (an IR the reader refuses: the CLI must say so itself, without inputs)
        pass
    for name, a in (inputs or {}).items():
        f = ctx.work / f"in_{len(argv)}.npy"
        np.save(f, a)
        argv += ["--input", f"{name}={f}"]
    res = classify_cli(*run_cli(argv))
    if res.kind != "valid":
        return res
    with np.load(ctx.work / "out.npz", allow_pickle=False) as z:
        outs = {k: z[k] for k in z.files}
    try:
        ir = json.loads(text)
        ref = reference_ir(ir, ctx.weights(case["seed"]), inputs or {}, check_types=True)
    except ReferenceError as e:
        return Outcome("invalid", f"ATen refuses what `npusim run` ran: {str(e)[:300]}")
    try:
        prog = npu_compiler.compile(text, "cpu")
    except UnsupportedOpError:
        return Outcome("valid")  # the partition path: ATen ran the IR above with its declared types
    except Exception as e:
        return Outcome("raw", f"`npusim run` ran it, the API refused: {classify_exception(e).detail}")
    cpu = npu_runtime.get_backend("cpu")
    try:
        api = cpu.create_executor(prog).run_numpy(inputs or {}, npu_runtime.load_weights(prog, ctx.weights(
            case["seed"]), cpu))
    except Exception as e:
        return Outcome("raw", f"`npusim run` ran it, the API run failed: {classify_exception(e).detail}")
    for name, a in api.items():
        a = a.astype(np.float32) if a.dtype.name == "bfloat16" else a
        if name not in outs or not np.array_equal(outs[name], a, equal_nan=a.dtype.kind == "f"):
            return Outcome("invalid", f"output {name}: `npusim run` and the API disagree")
    return Outcome("valid") if set(outs) == set(api) and set(ref) <= set(api) else \
        Outcome("invalid", f"outputs {sorted(outs)}, the program's {sorted(api)}")


def _reference_runs(text: str, ctx: Context, seed: str) -> bool:
    """Does ATen run (with declared types matching) what the reader refused?"""
    from aten_reference import run_ir as reference_ir

    try:
        ir = json.loads(text)
        inputs = {}
        rng = np.random.default_rng(0)
        for t in ir["graph_inputs"]:
            dt = str(t["dtype"]).removeprefix("torch.")
            shape = tuple(t["shape"])
            if np.prod(shape) > 1 << 22:
                return False
            if dt.startswith("float") or dt == "bfloat16":
                import ml_dtypes

                npdt = ml_dtypes.bfloat16 if dt == "bfloat16" else np.dtype(dt)
                inputs[t["name"]] = rng.standard_normal(shape).astype(np.float32).astype(npdt)
            else:
                inputs[t["name"]] = np.zeros(shape, dtype=np.dtype(dt))
        reference_ir(ir, ctx.weights(seed), inputs, check_types=True)
        return True
    except Exception:
        return False


# ---- artifacts ------------------------------------------------------------------------------------------------------


def run_artifact(case: dict, ctx: Context) -> Outcome:
    try:
        blob = mutate.apply_artifact(ctx.blob(f"{case['seed']}.npubin"), case["ops"], ctx.canary)
    except mutate.Stale as e:
        return Outcome("stale", str(e))
    path = ctx.work / "case.npubin"
    path.write_bytes(blob)
    res = classify_cli(*run_cli(["run", str(path), "--weights", ctx.weights_path(case["seed"]), "--iters", "1",
                                 "--warmup", "0", "--backend", "cpu", "--json"]))
    if res.kind != "valid":
        return res
    for argv in (["describe", str(path)], ["describe", str(path), "--json"], ["describe", str(path), "--source", "0"],
                 ["describe", str(path), "--graph", "dot"], ["describe", str(path), "--graph", "mermaid"]):
        code, out, err = run_cli(argv)
        r = classify_cli(code, out, err)
        if r.kind not in ("valid", "clean"):
            return Outcome(r.kind, f"{' '.join(argv[:1] + argv[2:])}: {r.detail}")
        if code == 0 and argv[-1] == "dot":
            problem = _dot_problem(out)
            if problem:
                return Outcome("invalid", f"describe --graph dot: {problem}")
        if code == 0 and argv[-1] == "mermaid" and any(("\n" in line) for line in out.split("\n")[1:-1]):
            return Outcome("invalid", "describe --graph mermaid: a label spans lines")
    return _artifact_deterministic(path, ctx, case["seed"])


def _dot_problem(text: str) -> str | None:
    try:
        import pydot
    except ImportError:
        return None
    try:
        graphs = pydot.graph_from_dot_data(text)
    except Exception as e:
        return f"does not parse: {type(e).__name__}"
    return None if graphs else "does not parse"


def _artifact_deterministic(path: Path, ctx: Context, seed: str) -> Outcome:
    """Run the accepted program twice, its arena and output buffers filled with different garbage first: outputs
    that differ read memory no kernel wrote (an inconsistent plan or views). A partitioned artifact: every program
    segment's buffers so filled, the whole run compared."""
    import npu_runtime
    from npu_compiler.partitioned_program import PartitionedProgram, load_artifact

    try:
        prog = load_artifact(path)
        cpu = npu_runtime.get_backend("cpu")
        inputs = sane_inputs(prog.inputs)
        results = []
        for fill in (0x00, 0xFF):
            if isinstance(prog, PartitionedProgram):
                from npu_runtime.dag_executor import DAGExecutor

                dag = DAGExecutor(prog, cpu, weights=ctx.weights(seed))
                for st in dag.stages:
                    if st is not None and st.executor is not None:
                        _garbage(st.executor, fill)
                got = dag.run(inputs)
            else:
                ws = npu_runtime.load_weights(prog, ctx.weights(seed), cpu)
                ex = cpu.create_executor(prog)
                _garbage(ex, fill)
                got = ex.run_numpy(inputs, ws)
            results.append({k: np.asarray(v).copy() for k, v in got.items()})
    except Exception as e:
        return classify_exception(e)
    for name in results[0]:
        a, b = results[0][name], results[1][name]
        if a.tobytes() != b.tobytes():
            return Outcome("invalid", f"output {name} depends on uninitialised memory")
    return Outcome("valid")


def _garbage(ex, fill: int) -> None:
    """A cpu executor's arena and output buffers filled with `fill` bytes."""
    ex.arena[:] = fill
    for b in ex.program.buffers:
        if b.kind == "output":
            ex.flat[b.id].view(np.uint8)[:] = fill


# ---- weights --------------------------------------------------------------------------------------------------------

WEIGHT_SEEDS = {"resnet": "resnet_f32", "qwen": "qwen_decode_f32"}


def _weights_expectation(path: Path, ctx: Context, artifact: str) -> tuple[str, str]:
    """("invalid" | "warn" | "valid", why), judged with the safetensors library (not npusim's reader)."""
    import torch
    from safetensors import safe_open

    from npu_compiler.program import CompiledProgram

    prog = CompiledProgram.load(ctx.seed_dir / f"{artifact}.npubin")
    needed: dict[str, str] = {}
    for w in prog.weights:
        keys = list(w.recipe.sources.values())
        for k in keys:
            needed.setdefault(k, w.dtype)
    original = {}
    with safe_open(ctx.weights_path(artifact), framework="pt") as f:
        for k in needed:
            if k in f.keys():
                original[k] = tuple(f.get_slice(k).get_shape())
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            tensors = {k: f.get_tensor(k) for k in needed if k in keys}
    except Exception as e:
        return "invalid", f"the safetensors library refuses it: {str(e)[:100]}"
    warn = ""
    for k, want in needed.items():
        t = tensors.get(k)
        if t is None:
            if k in original:
                return "invalid", f"{k} missing"
            continue
        if tuple(t.shape) != original.get(k, tuple(t.shape)):
            return "invalid", f"{k} mis-shaped"
        if want.startswith("float") or want == "bfloat16":
            if not t.dtype.is_floating_point:
                return "invalid", f"{k} is {t.dtype} for a float weight"
            tf = t.float()
            if torch.isnan(tf).any():
                return "invalid", f"{k} holds NaN"
            if torch.isinf(tf).any():
                return "invalid", f"{k} holds an infinity"
            if torch.isinf(tf.to(getattr(torch, want))).any():
                return "invalid", f"{k} becomes infinite in {want}"
            if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
                warn = warn or f"{k} is float8"
    return ("warn", warn) if warn else ("valid", "")


def run_weights(case: dict, ctx: Context) -> Outcome:
    artifact = WEIGHT_SEEDS[case["seed"]]
    try:
        blob = mutate.apply_weights((ctx.seed_dir / seedlib.weights_file(artifact)).read_bytes(), case["ops"],
                                    ctx.canary)
    except mutate.Stale as e:
        return Outcome("stale", str(e))
    path = ctx.work / "case.safetensors"
    path.write_bytes(blob)
    code, out, err = run_cli(["run", str(ctx.seed_dir / f"{artifact}.npubin"), "--weights", str(path), "--iters",
                              "1", "--warmup", "0", "--backend", "cpu", "--json"])
    res = classify_cli(code, out, err)
    expect, why = _weights_expectation(path, ctx, artifact)
    if res.kind == "valid":
        if expect == "invalid":
            return Outcome("invalid", f"loaded though {why}")
        if expect == "warn" and "warning" not in err:
            return Outcome("invalid", f"loaded without a warning though {why}")
        return Outcome("valid")
    if res.kind == "clean" and expect != "invalid":
        res.refused_valid = True
    return res


# ---- CLI ------------------------------------------------------------------------------------------------------------


def run_cli_case(case: dict, ctx: Context) -> Outcome:
    import cli_cases

    argv = cli_cases.materialise(case, ctx)
    code, out, err = run_cli(argv)
    if argv[0] == "verify" and code == 1 and "FAIL" in out and "error:" not in err:
        code = 0  # a verdict outside the tolerance, not an error
    res = classify_cli(code, out, err)
    if res.kind == "valid" and case["expect"] == "invalid":
        return Outcome("invalid", f"accepted: {' '.join(case['argv'])[:200]} ({case.get('why', '')})")
    if res.kind == "clean" and case["expect"] == "valid":
        res.refused_valid = True
    if res.kind == "valid":
        problem = cli_cases.check_outputs(case, ctx, out)
        if problem:
            return Outcome("invalid", problem)
    return res


RUNNERS = {"ir": run_ir, "ir_cli": run_ir, "artifact": run_artifact, "weights": run_weights, "cli": run_cli_case}


def run_case(case: dict, ctx: Context) -> Outcome:
    import warnings

    from npu_compiler.errors import NPUSimWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.simplefilter("always", NPUSimWarning)  # the CLI's own warnings are part of what is checked
        try:
            out = RUNNERS[case["kind"]](case, ctx)
        except Exception as e:  # a failure of the harness itself: never counted as a pass
            tb = traceback.extract_tb(e.__traceback__)
            where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
            out = Outcome("harness", f"{type(e).__name__}: {e}{where}"[:400])
    return _canary(ctx, out)
