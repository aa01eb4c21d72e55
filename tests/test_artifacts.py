"""Artifacts are data: an edited `.npubin` (its checksum recomputed, as an attacker would) is refused with a clean
error naming the field, or runs exactly what its kernel records say; nothing in it is ever executed as host code,
and no view it describes reaches outside its buffer."""

from __future__ import annotations

import copy
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch
from conftest import export_ir

import npu_compiler
import npu_runtime
from npu_compiler.errors import ArtifactError
from npu_compiler.program import FORMAT_VERSION, CompiledProgram, pack_payload

ROOT = Path(__file__).resolve().parent.parent
CPU = npu_runtime.get_backend("cpu")


class _Net(torch.nn.Module):
    """A GEMM with a ReLU epilogue, an elementwise kernel, an embedding gather and a row softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 6)
        self.emb = torch.nn.Embedding(10, 6)

    def forward(self, x, ids):
        h = torch.relu(x * 2.0 + 1.0)
        return torch.softmax(self.fc(h) + self.emb(ids), dim=-1)


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    m = _Net().eval()
    ins = (torch.randn(3, 8), torch.tensor([1, 4, 9]))
    ir = export_ir(_Net, ins)
    prog = npu_compiler.compile(ir, "cpu", dtype="float32")
    weights = {k: v.detach().numpy() for k, v in m.state_dict().items()}
    with torch.no_grad():
        ref = m(*ins).numpy()
    return prog, weights, {"x": ins[0].numpy(), "ids": ins[1].numpy()}, ref


def repack(d: dict) -> bytes:
    """An artifact from its data form, with a valid header and checksum (what an attacker can always produce)."""
    payload = msgpack.packb(d, use_bin_type=True)
    return pack_payload(payload)


def run(prog: CompiledProgram, weights, inputs) -> np.ndarray:
    ws = npu_runtime.load_weights(prog, weights, CPU)
    return next(iter(CPU.create_executor(prog).run_numpy(inputs, ws).values()))


def test_no_exec_or_eval_in_compiler_or_runtime() -> None:
    pattern = re.compile(r"(^|[^.A-Za-z_])(exec|eval)\(")
    hits = []
    for pkg in ("npu_compiler", "npu_runtime"):
        for path in (ROOT / pkg).rglob("*.py"):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_round_trip_runs_the_same(net) -> None:
    prog, weights, inputs, ref = net
    again = CompiledProgram.from_bytes(prog.to_bytes())
    np.testing.assert_allclose(run(again, weights, inputs), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(run(again, weights, inputs), run(prog, weights, inputs))


def _exprs(d: dict):
    """Every expression node (as data) of every kernel record, with the kernel's index."""
    for i, k in enumerate(d["kernels"]):
        stack = [v for v in k["spec"].values() if isinstance(v, list) and v and isinstance(v[0], str)]
        while stack:
            node = stack.pop()
            yield i, node
            stack += [c for c in node[2:] if isinstance(c, list) and c and isinstance(c[0], str)]
            stack += [c for c in node[2:] if isinstance(c, list) and c and isinstance(c[0], list)
                      for c in c if isinstance(c, list) and c and isinstance(c[0], str)]


@pytest.mark.parametrize("field,value", [
    ("op", "__import__('os').system('touch pwned')"),
    ("op", "exec"),
    ("kind", "python"),
])
def test_injected_code_in_an_expression_is_refused(net, tmp_path, field, value) -> None:
    prog, *_ = net
    d = prog.to_dict()
    index, node = next((i, n) for i, n in _exprs(d) if n[0] == "binary")
    if field == "op":
        node[2] = value
    else:
        node[0] = value
    with pytest.raises(ArtifactError, match=rf"kernel '{d['kernels'][index]['name']}'.*unknown"):
        CompiledProgram.from_bytes(repack(d), "edited.npubin")
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_an_edited_expression_runs_exactly_what_it_says(net) -> None:
    """max -> min in the ReLU kernel's record: the edited program computes min(x, 0), nothing else."""
    prog, weights, inputs, _ = net
    d = prog.to_dict()
    relu = next(i for i, k in enumerate(prog.kernels) if "relu" in k.nodes and k.kind == "generated")
    edited = 0
    for i, node in _exprs(d):
        if i == relu and node[0] == "binary" and node[2] == "max":
            node[2] = "min"
            edited += 1
    assert edited == 1
    bad = CompiledProgram.from_bytes(repack(d))
    ws = npu_runtime.load_weights(bad, weights, CPU)
    ex = CPU.create_executor(bad)
    captured = {}
    ex.run_observed(inputs, ws, after=lambda i: captured.setdefault(i, np.array(ex.view(bad.kernels[i].outs[0]))))
    x = inputs["x"]
    np.testing.assert_array_equal(captured[relu].reshape(x.shape), np.minimum(x * 2.0 + 1.0, 0).astype(np.float32))


def _refs(d: dict):
    for k in d["kernels"]:
        yield from k["args"]
        yield from k["outs"]


@pytest.mark.parametrize("edit", ["offset", "stride", "shape", "negative", "buffer", "rank"])
def test_views_outside_their_buffer_are_refused(net, edit) -> None:
    """Every view an artifact describes (kernel arguments, loads inside expressions) is checked against its buffer
    before anything is allocated or read."""
    prog, *_ = net
    failures = 0
    for target in range(len(list(_refs(prog.to_dict())))):
        d = prog.to_dict()
        ref = list(_refs(d))[target]
        if edit == "offset":
            ref["offset"] += 10**6
        elif edit == "stride":
            if not ref["shape"] or max(ref["shape"]) < 2:
                continue
            ref["strides"] = [s * 1000 + 1000 for s in ref["strides"]]
        elif edit == "shape":
            ref["shape"] = [n + 100 for n in ref["shape"]] or [100]
            ref["strides"] = ref["strides"] or [1]
        elif edit == "negative":
            ref["offset"] = -1
        elif edit == "buffer":
            ref["buffer"] = len(d["buffers"]) + 5
        else:
            ref["strides"] = list(ref["strides"]) + [1]
        with pytest.raises(ArtifactError, match="invalid artifact"):
            CompiledProgram.from_bytes(repack(d))
        failures += 1
    assert failures


def test_loads_outside_their_buffer_are_refused(net) -> None:
    prog, *_ = net
    d = prog.to_dict()
    for _i, node in _exprs(d):
        if node[0] == "load":
            node[4] += 10**6  # offset
            break
    with pytest.raises(ArtifactError, match=r"load reaches element"):
        CompiledProgram.from_bytes(repack(d))
    d = prog.to_dict()
    for _i, node in _exprs(d):
        if node[0] == "gather":
            node[4] = [n * 100 for n in node[4]]  # the gathered view's shape
            break
    else:
        pytest.fail("no gather in the program")
    with pytest.raises(ArtifactError, match=r"gather view reaches element"):
        CompiledProgram.from_bytes(repack(d))


@pytest.mark.parametrize("mutate", [
    lambda d: d["kernels"][0]["spec"].__setitem__("row_dims", 99),
    lambda d: d["kernels"][0].__setitem__("spec", {"expr": ["const", "float32", 1.0], "bogus": 1}),
    lambda d: d["buffers"][0].__setitem__("dtype", "float33"),
    lambda d: d["buffers"][0].__setitem__("numel", 2**62),
    lambda d: d.__setitem__("arena_bytes", -5),
    lambda d: d["inputs"][0].__setitem__("shape", [10**9]),
    lambda d: d["kernels"].append(copy.deepcopy(d["kernels"][0]) | {"kind": "nope"}),
    lambda d: d.__setitem__("kernels", "many"),
    lambda d: d.pop("buffers"),
    lambda d: d["kernels"][0].__setitem__("out_rows", [1, 5, 2]),
    lambda d: d["kernels"][0].__setitem__("out_rows", [1, 2]),
    lambda d: d["kernels"][0].__setitem__("out_rows", "rows"),
], ids=["row_dims", "unknown_field", "dtype", "numel", "arena", "input_shape", "kind", "type", "missing",
        "out_rows_empty", "out_rows_short", "out_rows_type"])
def test_field_edits_give_clean_errors(net, mutate) -> None:
    prog, *_ = net
    d = prog.to_dict()
    mutate(d)
    with pytest.raises(ArtifactError):
        CompiledProgram.from_bytes(repack(d))


def test_deep_expression_is_refused_without_recursion_error(net) -> None:
    prog, *_ = net
    d = prog.to_dict()
    deep: list = ["const", "float32", 1.0]
    for _ in range(300):
        deep = ["unary", "float32", "neg", deep]
    d["kernels"][0]["spec"]["expr"] = deep
    with pytest.raises(ArtifactError, match="deeper than"):
        CompiledProgram.from_bytes(repack(d))
    # nesting far beyond what msgpack's packer writes: a hand-made payload
    payload = b"\x91" * 100_000 + b"\xc0"
    blob = pack_payload(payload)
    with pytest.raises(ArtifactError, match="corrupted"):
        CompiledProgram.from_bytes(blob)


def test_older_format_asks_to_recompile(net) -> None:
    prog, *_ = net
    blob = bytearray(prog.to_bytes())
    blob[8:12] = struct.pack("<I", FORMAT_VERSION - 1)
    with pytest.raises(ArtifactError, match="recompile"):
        CompiledProgram.from_bytes(bytes(blob))


def test_cli_run_of_a_tampered_artifact_exits_cleanly(net, tmp_path) -> None:
    """In a separate process, so that a crash (a segfault) would show as such: a view edited far outside its buffer
    is one clean error line and exit status 1."""
    prog, weights, *_ = net
    d = prog.to_dict()
    next(iter(_refs(d)))["offset"] = 2**40
    art = tmp_path / "bad.npubin"
    art.write_bytes(repack(d))
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in weights.items()}, str(tmp_path / "w.safetensors"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", "import sys; from npusim.cli import main; sys.exit(main())", "run",
                           str(art), "--weights", str(tmp_path / "w.safetensors"), "--backend", "cpu", "-o",
                           str(tmp_path / "out.npz")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "invalid artifact" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out.npz").exists()


def _first(e: list, kind: str = "load") -> list:
    """The first node of `kind` in an expression's data form."""
    stack = [e]
    while stack:
        node = stack.pop()
        if node[0] == kind:
            return node
        stack += [c for c in node[2:] if isinstance(c, list) and c and isinstance(c[0], str)]
    raise AssertionError(f"no {kind}")


@pytest.mark.parametrize("edit,message", [
    (lambda s: s.update(prologue_reduce=[65]), "a gemm prologue reduces along a's rows of 64, not over \\[65\\]"),
    (lambda s: s.update(prologue_reduce=[]), "a reduction in a kernel without a reduction space"),
    (lambda s: _first(s["prologue"]).__setitem__(2, 0), "a gemm prologue reads argument 0, an operand"),
    (lambda s: s.update(prologue=["const", "float16", 1.0]), "a gemm prologue of dtype float16 for operand b"),
])
def test_an_edited_gemm_prologue_is_refused(edit, message) -> None:
    """A GEMV that computes its operand (an RMSNorm) in its prologue, as cuda compiles it: a prologue that reduces
    over another extent, reads the weight operand, or makes another dtype than the weight's is refused by name."""
    from helpers import NormLinear

    ir = export_ir(lambda: NormLinear(64, 16), (torch.randn(3, 64), torch.randn(3, 16)))
    prog = npu_compiler.compile(ir, "cuda", dtype="float32")
    d = prog.to_dict()
    (index,) = [i for i, k in enumerate(d["kernels"]) if k["spec"].get("prologue")]
    edit(d["kernels"][index]["spec"])
    with pytest.raises(ArtifactError, match=rf"kernel '{d['kernels'][index]['name']}'.*{message}"):
        CompiledProgram.from_bytes(repack(d), "edited.npubin")


@pytest.mark.parametrize("edit,message", [
    (lambda s: s.update(acc_groups=3), "a gemm of 32 columns in 3 groups"),
    (lambda s: s.update(acc_groups=1), "gemm output has shape \\[1, 16\\], expected \\[1, 32\\]"),
    (lambda s: s.update(acc_groups=0), "acc_groups"),
    (lambda s: s.update(epilogue=None), "a gemm of 2 column groups needs an epilogue"),
    (lambda s: _first(s["epilogue"], "acc").__setitem__(slice(2, None), [2]), "'acc' of group 2 in an epilogue of 2"),
    (lambda s: _first(s["epilogue"], "acc").__setitem__(slice(2, None), ["1"]), "group"),
    (lambda s: _first(s["epilogue"], "acc").__setitem__(slice(2, None), [1, 1]), "'acc' has 4 fields, expected 3"),
])
def test_an_edited_column_epilogue_is_refused(edit, message) -> None:
    """A GEMV whose epilogue combines its product's two column groups (SiLU(gate) * up), as cuda compiles it: groups
    that do not divide the columns or do not match the output, and an epilogue reading a group there is not, are
    refused by name."""
    from helpers import GluProjection

    ir = export_ir(lambda: GluProjection(64, 16), (torch.randn(1, 64),))
    prog = npu_compiler.compile(ir, "cuda", dtype="float32")
    d = prog.to_dict()
    (index,) = [i for i, k in enumerate(d["kernels"]) if k["spec"].get("acc_groups", 1) > 1]
    edit(d["kernels"][index]["spec"])
    with pytest.raises(ArtifactError, match=rf"kernel '{d['kernels'][index]['name']}'.*{message}"):
        CompiledProgram.from_bytes(repack(d), "edited.npubin")
