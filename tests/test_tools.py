"""Inspection tools: per-node verify names an injected wrong kernel and its repro reproduces it alone; the profile's
Chrome trace and its agreement with wall time; describe --graph dot parses; the progress display stays quiet off a
terminal."""

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import time

import pytest
import torch

import npu_compiler
from npu_compiler.errors import ArtifactError
from npu_export import resnet
from npu_export.cnn import export_cnn
from npusim.cli import main


@pytest.fixture(scope="module")
def small_resnet(tmp_path_factory):
    torch.manual_seed(0)
    m = resnet.resnet18(num_classes=10, width=8).eval()
    d = tmp_path_factory.mktemp("tools")
    res = export_cnn(m, (1, 3, 32, 32), d, "r18")
    art = d / "r18.npubin"
    npu_compiler.compile(res.ir_path, "cpu", dtype="float32").save(art)
    return res, art, d


def _break_one_relu(prog) -> int:
    """Make one relu kernel (the 3rd) compute min(x, 0) instead of max(x, 0), by editing its expression. The change
    lives in the program, so the dumped one-kernel repro carries it too. (The callers compile with the conv epilogue
    off, so that relus are kernels of their own.)"""
    from npu_compiler.expr import nodes as X

    relus = [i for i, k in enumerate(prog.kernels) if k.kind == "generated" and k.group == "relu.default"]
    bad = relus[2]
    k = prog.kernels[bad]
    flipped = X.substitute(k.spec.expr, lambda e: X.Binary(e.dtype, "min", e.a, e.b)
                           if isinstance(e, X.Binary) and e.op == "max" else None)
    assert flipped != k.spec.expr
    k.spec = k.spec.replace(expr=flipped)
    return bad


def test_per_node_names_the_wrong_kernel_and_repro_reproduces(small_resnet, capsys, monkeypatch, tmp_path):
    res, _, _ = small_resnet
    real_compile = npu_compiler.compile
    injected = {}

    def compile_with_bug(*a, **kw):
        prog = real_compile(*a, **kw)
        injected["index"] = _break_one_relu(prog)
        injected["kernel"] = prog.kernels[injected["index"]]
        return prog

    monkeypatch.setattr(npu_compiler, "compile", compile_with_bug)
    repro = tmp_path / "repro"
    rc = main(["verify", str(res.ir_path), "--weights", str(res.weights_path), "--dtype", "float32", "--per-node",
               "--dump-repro", str(repro), "--json", "--disable-pass", "conv_epilogue"])
    assert rc == 1
    report = json.loads(capsys.readouterr().out)
    bad = report["per_node"]["first_failure"]
    k = injected["kernel"]
    assert bad["index"] == injected["index"] and bad["name"] == k.name
    assert bad["group"] == k.group and bad["nodes"] == k.nodes
    # every kernel before it is within the tolerance: the failure is localised, not smeared
    before = [r for r in report["per_node"]["kernels"][:bad["index"]] if r["comparison"]]
    assert before and all(r["comparison"]["passed"] for r in before)

    # the text table names it too
    monkeypatch.setattr(npu_compiler, "compile", compile_with_bug)
    assert main(["verify", str(res.ir_path), "--weights", str(res.weights_path), "--dtype", "float32",
                 "--per-node", "--disable-pass", "conv_epilogue"]) == 1
    text = capsys.readouterr().out
    assert f"first kernel outside the tolerance: #{bad['index']} {k.name}" in text

    for f in ("repro.py", "kernel.json", "kernel.npubin", "expected.npy", "arg0.npy"):
        assert (repro / f).exists(), f
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "repro.py"], cwd=repro, capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "MISMATCH" in proc.stdout and k.name in proc.stdout


def test_repro_of_a_correct_kernel_passes(small_resnet, tmp_path):
    """The one-kernel program reproduces the kernel exactly: with the right source it matches the reference."""
    from npu_export.reference import load_state_dict, run_reference_all
    from npu_runtime import inspect as npi
    from npu_runtime.cpu.backend import CpuBackend
    from npu_runtime.weights import load_weights
    from npusim.common import complete_inputs

    res, art, _ = small_resnet
    prog = npu_compiler.program.CompiledProgram.load(art)
    be = CpuBackend()
    ws = load_weights(prog, res.weights_path, be)
    ex = be.create_executor(prog)
    inputs = complete_inputs(prog, {}, 0)
    values, node_outputs = run_reference_all(res.ir_path, load_state_dict(res.weights_path), inputs)
    rows = npi.check_kernels(prog, npi.capture_outputs(ex, inputs, ws), values, node_outputs)
    assert npi.first_failure(rows) is None and sum(r.comparison is not None for r in rows) >= len(prog.kernels) - 2
    conv = next(r for r in rows if r.kind == "conv2d" and r.comparison is not None)
    script = npi.dump_repro(tmp_path, ex, inputs, ws, conv, values[conv.value])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_profile_trace_and_kernel_total(small_resnet, capsys, tmp_path):
    import npu_runtime
    from npu_compiler.program import CompiledProgram
    from npusim.common import complete_inputs

    res, art, _ = small_resnet
    trace = tmp_path / "trace.json"
    iters = 4
    assert main(["profile", str(art), "--weights", str(res.weights_path), "--backend", "cpu", "--warmup", "1",
                 "--iters", str(iters), "--trace", str(trace), "--chart", str(tmp_path / "c.png"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    prog = CompiledProgram.load(art)
    assert len(report["kernels"]) == len(prog.kernels)
    assert all(k["nodes"] and k["group"] and k["bytes"] > 0 for k in report["kernels"])
    times = [k["median_s"] for k in report["kernels"]]
    assert times == sorted(times, reverse=True)

    data = json.loads(trace.read_text())
    events = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(events) == iters * len(prog.kernels)  # one event per kernel launch
    for e in events:
        assert {"name", "ts", "dur", "pid", "tid", "args"} <= set(e) and e["dur"] >= 0
        assert isinstance(e["ts"], float | int) and "group" in e["args"] and "nodes" in e["args"]
    assert {e["args"]["index"] for e in events} == set(range(len(prog.kernels)))

    # Kernel total of a profiled run vs. the wall time of a plain run (interleaved, medians).
    be = npu_runtime.get_backend("cpu")
    ws = npu_runtime.load_weights(prog, res.weights_path, be)
    ex = be.create_executor(prog)
    inputs = complete_inputs(prog, {}, 0)
    for _ in range(3):
        ex.run(inputs, ws)
    walls, totals = [], []
    for _ in range(15):
        t0 = time.perf_counter()
        ex.run(inputs, ws)
        walls.append(time.perf_counter() - t0)
        timings = ex.profile(inputs, ws)
        assert [t.index for t in timings] == list(range(len(prog.kernels)))
        totals.append(sum(t.dur_s for t in timings))
    wall, total = statistics.median(walls), statistics.median(totals)
    # 25%: loose enough for a shared, loaded CI machine, tight enough to catch a kernel timed twice or missed
    assert abs(total - wall) <= 0.25 * wall, (total, wall)


def test_describe_graph_dot_parses(small_resnet, capsys):
    import pydot

    from npu_compiler.program import CompiledProgram

    _, art, _ = small_resnet
    prog = CompiledProgram.load(art)
    assert main(["describe", str(art), "--graph", "dot"]) == 0
    text = capsys.readouterr().out
    graphs = pydot.graph_from_dot_data(text)
    assert graphs and len(graphs) == 1
    g = graphs[0]
    names = {n.get_name() for n in g.get_nodes()}
    assert {f"k{i}" for i in range(len(prog.kernels))} <= names
    assert len(g.get_edges()) >= len(prog.kernels)  # a chain at least, plus the residual edges
    assert main(["describe", str(art), "--graph", "mermaid"]) == 0
    mer = capsys.readouterr().out
    assert mer.startswith("flowchart TD") and "k0 --> k1" in mer
    assert main(["describe", str(art), "--json"]) == 0
    sizes = json.loads(capsys.readouterr().out)["sizes"]
    assert sizes["artifact_bytes"] == len(prog.to_bytes()) and sizes["kernel_bytes"] > 0


def test_progress_quiet_off_a_terminal_and_draws_on_one():
    from npusim.progress import Progress

    plain = io.StringIO()
    with Progress("loading", quiet=False, stream=plain) as p:
        for i in range(5):
            p.callback(i + 1, 5, f"w{i}")
    assert plain.getvalue() == ""

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    with Progress("loading", stream=tty, min_interval_s=0) as p:
        for i in range(5):
            p.callback(i + 1, 5, f"w{i}")
    assert "5/5" in tty.getvalue() and "#" in tty.getvalue() and tty.getvalue().endswith("\n")
    quiet = Tty()
    with Progress("loading", stream=quiet, quiet=True) as p:
        p.callback(1, 1)
    assert quiet.getvalue() == ""


def test_out_values_round_trip(small_resnet):
    from npu_compiler.program import CompiledProgram

    _, art, _ = small_resnet
    prog = CompiledProgram.load(art)
    assert all(k.out_values for k in prog.kernels)
    assert [k.out_values for k in CompiledProgram.from_bytes(prog.to_bytes()).kernels] == \
        [k.out_values for k in prog.kernels]
    d = prog.to_dict()
    del d["kernels"][0]["out_values"]
    with pytest.raises(ArtifactError, match=r"kernels\[0\]\.out_values: missing"):
        CompiledProgram.from_dict(d)


def test_describe_source_prints_the_record_and_the_rendered_kernel(small_resnet, capsys, tmp_path):
    """`describe --source K`: the kernel's record with its expression as a formula; for a cuda program also the CUDA
    C the runtime renders from the record (no GPU needed to render)."""
    res, art, _ = small_resnet
    prog = npu_compiler.program.CompiledProgram.load(art)
    pool = next(i for i, k in enumerate(prog.kernels) if k.group == "max_pool2d.default")
    assert main(["describe", str(art), "--source", str(pool)]) == 0
    out = capsys.readouterr().out
    assert f"kernel #{pool} {prog.kernels[pool].name}" in out and "expr: " in out and "max_r(" in out
    assert "there is no source text" in out
    cuda_art = tmp_path / "r18_cuda.npubin"
    npu_compiler.compile(res.ir_path, "cuda", dtype="float16").save(cuda_art)
    assert main(["describe", str(cuda_art), "--source", "0"]) == 0
    out = capsys.readouterr().out
    assert 'extern "C" __global__' in out and "npu_kernel" in out
    assert main(["describe", str(art), "--source", "nosuchkernel"]) != 0
    assert "no such kernel" in capsys.readouterr().err
