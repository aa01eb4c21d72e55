"""One artifact for any graph: a partitioned `.npubin` (target programs, CPU reference programs, torch_ir segments)
written, read back with every field checked, and run against PyTorch; hostile edits to its segments refused."""

from __future__ import annotations

import copy
import re
import subprocess
import sys

import msgpack
import numpy as np
import partitioned_cases as pc
import pytest
import torch
from safetensors.torch import save_file

import npu_compiler
import npu_runtime
from npu_compiler.errors import ArtifactError, NPUCompileError
from npu_compiler.partition import REFERENCE, TARGET, TORCH
from npu_compiler.partitioned_program import PartitionedProgram, artifact_from_bytes
from npu_compiler.program import CompiledProgram, pack_artifact
from npu_runtime.dag_executor import DAGExecutor


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    model, ir, sd, x = pc.make()
    folder = tmp_path_factory.mktemp("chain")
    save_file(sd, str(folder / "w.safetensors"))
    return model, ir, folder / "w.safetensors", x


@pytest.fixture(scope="module")
def art(chain):
    return pc.artifact(chain[1], "cpu")


def test_round_trip_runs_and_matches_torch(chain, art, tmp_path):
    model, ir, weights, x = chain
    runners = [s.runner for s in art.segments]
    assert runners.count(REFERENCE) >= 2 and runners.count(TORCH) >= 1 and runners.count(TARGET) >= 2
    path = tmp_path / "chain.npubin"
    art.save(path)
    back = npu_compiler.load_artifact(path)
    assert isinstance(back, PartitionedProgram)
    assert back.to_bytes() == path.read_bytes() == art.to_bytes()  # every field survives, in the same form
    assert back.plan().to_dict(include_ir=False) == art.plan().to_dict(include_ir=False)
    ex = DAGExecutor(back, npu_runtime.get_backend("cpu"), weights=str(weights))
    pc.check(ex.run({"x": x}), ir, pc.reference(model, x), "cpu")
    assert ex.num_transfers == back.plan().num_transfers == len(back.transfers) > 0
    # l2.weight: loaded for the target's linear, for the CPU reference's and, raw, for torch_ir's
    holders = {s.runner for s in back.segments if s.program is not None and "l2.weight" in
               {w.key for w in s.program.weights}}
    holders |= {s.runner for s in back.segments if s.ir is not None and "l2.weight" in
                s.ir["weight_name_mapping"].values()}
    assert holders == {TARGET, REFERENCE, TORCH}


def test_every_cpu_node_is_reported_with_its_reason(art):
    by_name = {f.name: f for f in art.fallback}
    assert {f.op for f in art.fallback} >= {"aten.gelu.default", "aten.layer_norm.default", "aten.sigmoid.default"}
    assert by_name["layer_norm"].runner == TORCH and by_name["gelu"].runner == REFERENCE
    assert all("forced to the CPU" in f.reason for f in art.fallback)
    for f in art.fallback:
        assert f.name in art.segments[f.partition].nodes


def test_a_plain_graph_gives_todays_artifact(chain):
    _, ir, _, _ = chain
    plain = npu_compiler.compile_artifact(ir, "cpu", dtype="float32")
    assert isinstance(plain, CompiledProgram)
    assert plain.to_bytes() == npu_compiler.compile(ir, "cpu", dtype="float32").to_bytes()
    with pytest.raises(ArtifactError, match="partitioned artifact.*load_artifact"):
        CompiledProgram.from_bytes(pc.artifact(ir, "cpu").to_bytes(), "x.npubin")


def test_no_fallback_refuses_naming_every_node(chain):
    _, ir, _, _ = chain
    force_cpu, force_torch = pc.forced(ir)
    with pytest.raises(NPUCompileError, match="--no-fallback") as e:
        npu_compiler.compile_artifact(ir, "cpu", fallback=False, force_cpu=force_cpu, force_torch=force_torch)
    for name in ("gelu", "layer_norm", "sigmoid", "tanh"):
        assert f"{name} (aten.{name}" in str(e.value)


def test_a_segment_that_fails_to_compile_moves_to_the_cpu(chain):
    """A target partition that does not compile runs on the CPU reference instead, and the report says why."""
    from npu_compiler.compile_artifact import compile_plan
    from npu_compiler.op_support import support_predicate
    from npu_compiler.partition import partition

    model, ir, weights, x = chain
    plan = partition(ir, support_predicate("cuda", ["gelu"]))
    victim = next(p.index for p in plan.partitions if p.runner == TARGET)

    def compile_fn(sub_ir, target):
        if target == "cuda":
            raise NPUCompileError("simulated")
        return npu_compiler.compile(sub_ir, target, dtype="float32")

    with pytest.warns(RuntimeWarning) as caught:
        got = compile_plan(plan, "cuda", "float32", compile_fn)
    assert any(re.match(rf"partition {victim} .*simulated.*the CPU reference", str(w.message)) for w in caught)
    assert all(s.runner != TARGET for s in got.segments)
    assert any("simulated" in f.reason and f.partition == victim for f in got.fallback)
    back = artifact_from_bytes(got.to_bytes())
    out = DAGExecutor(back, npu_runtime.get_backend("cpu"), weights=str(weights)).run({"x": x})
    pc.check(out, ir, pc.reference(model, x), "cpu")


# ---- hostile artifacts --------------------------------------------------------------------------------------------


def _edit(art: PartitionedProgram, fn) -> bytes:
    d = msgpack.unpackb(msgpack.packb(art.to_dict(), use_bin_type=True), raw=False)
    fn(d)
    return pack_artifact(d)


def _seg(d: dict, runner: str) -> tuple[int, dict]:
    return next((i, s) for i, s in enumerate(d["segments"]) if s["runner"] == runner)


def _op_type(d, value):
    i, s = _seg(d, TORCH)
    s["ir"]["nodes"][0]["op_type"] = value


def _huge_factory(d):
    node = _seg(d, TORCH)[1]["ir"]["nodes"][0]
    node["op_type"] = "aten.empty_permuted.default"  # an op the IR reader has no schema for (rand has one now)
    node["attrs"] = {"size": [100_000, 100_000, 100]}


def _renumber_reversed(d):
    d["segments"].reverse()
    for i, s in enumerate(d["segments"]):
        s["index"] = i


HOSTILE = {
    "runner on the wrong side": (lambda d: d["segments"][0].update(device="cpu"), r"segments\[0\]: runner 'target'"),
    "unknown runner": (lambda d: d["segments"][0].update(runner="python"), r"segments\[0\].runner"),
    "python attribute as op": (lambda d: _op_type(d, "aten.__class__.__init__"), r"ir.nodes\[0\].op_type.*Python"),
    "not an aten op": (lambda d: _op_type(d, "os.system"), r"op_type.*not an ATen op"),
    "bytes in the IR": (lambda d: _seg(d, TORCH)[1]["ir"]["nodes"][0]["attrs"].update(x=b"\x00"), r"ir: .*not JSON"),
    "program in a torch segment": (lambda d: _seg(d, TORCH)[1].update(program={}), r"\.program: a torch_ir segment"),
    "damaged program": (lambda d: d["segments"][0]["program"]["buffers"][0].update(kind="bogus"),
                        r"segments\[0\]\.program: invalid artifact: buffers\[0\]\.kind"),
    "program for another target": (lambda d: _seg(d, REFERENCE)[1]["program"].update(target="cuda"),
                                   r"program.target.*'cpu'"),
    "input made later": (lambda d: d["segments"][0]["inputs"].append(d["segments"][-1]["outputs"][0]),
                         r"segments\[0\]\.(inputs|program\.inputs)"),
    "tensor made twice": (lambda d: d["segments"][-1]["outputs"].append(d["segments"][0]["outputs"][0]),
                          r"segments\[\d+\]\.(outputs|program\.outputs)"),
    "segments out of order": (lambda d: d["segments"].reverse(), r"segments\[0\]\.index"),
    "segments reordered and renumbered": (lambda d: _renumber_reversed(d), r"neither a graph input nor made by an"),
    "no segments": (lambda d: d.update(segments=[]), r"segments: 0 segments"),
    "fallback names another node": (lambda d: d["fallback"][0].update(name="linear"), r"fallback\[0\]"),
    "output made by no segment": (lambda d: d["outputs"][0].update(name="nowhere"), r"outputs\[0\]"),
    "shape of a boundary changed": (lambda d: _seg(d, TORCH)[1]["inputs"][0].update(shape=[4, 33]),
                                    r"segments\[\d+\]\.(inputs\[0\]|ir)"),
    "an allocation beyond the declared tensors": (lambda d: _huge_factory(d), r"ir.nodes\[0\].attrs: 'size'"),
    "device dtype of an input": (lambda d: d["inputs"][0].update(device_dtype="float16"), r"inputs\[0\].device_dtype"),
    "a removed node that is not a name": (lambda d: d.update(dead=[7]), r"dead\[0\]: expected a string"),
    "a number format that is not a name": (lambda d: d.update(formats={"linear": 8}), r"formats\['linear'\]"),
    "number formats not a mapping": (lambda d: d.update(formats=["int8"]), r"formats: expected a mapping"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_segments_are_refused_naming_the_field(art, case):
    edit, pattern = HOSTILE[case]
    with pytest.raises(ArtifactError, match=pattern) as e:
        artifact_from_bytes(_edit(art, edit), "bad.npubin")
    assert str(e.value).startswith("bad.npubin")


def test_an_op_with_effects_outside_its_tensors_is_never_run(art, chain, tmp_path):
    canary = tmp_path / "secret"
    canary.write_text("x")

    def edit(d):
        i, s = _seg(d, TORCH)
        s["ir"]["nodes"][0]["op_type"] = "aten.from_file.default"

    back = artifact_from_bytes(_edit(art, edit), "bad.npubin")  # a name of the right form: refused before running
    with pytest.raises(ArtifactError, match="from_file.*acts outside its tensors"):
        DAGExecutor(back, npu_runtime.get_backend("cpu"), weights=str(chain[2]))


# ---- without torch ------------------------------------------------------------------------------------------------

_NO_TORCH = """
import sys
sys.modules["torch"] = None  # importing torch (or torch_ir) now fails, as where it is not installed
import numpy as np
import npu_compiler, npu_runtime
from npu_runtime.dag_executor import DAGExecutor
art = npu_compiler.load_artifact(sys.argv[1])
try:
    out = DAGExecutor(art, npu_runtime.get_backend("cpu"), weights=sys.argv[2]).run({"x": np.load(sys.argv[3])})
except npu_runtime.NPURuntimeError as e:
    print("ERROR", e)
else:
    np.savez(sys.argv[4], **out)
assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None]
"""


def test_runs_without_torch_unless_a_segment_needs_it(chain, tmp_path):
    model, ir, weights, x = chain
    np.save(tmp_path / "x.npy", x)
    force_cpu, force_torch = pc.forced(ir)
    npu_compiler.compile_artifact(ir, "cpu", force_cpu=force_cpu + force_torch, dtype="float32").save(
        tmp_path / "ref.npubin")
    pc.artifact(ir, "cpu").save(tmp_path / "torch.npubin")
    run = [sys.executable, "-c", _NO_TORCH]
    res = subprocess.run([*run, str(tmp_path / "ref.npubin"), str(weights), str(tmp_path / "x.npy"),
                          str(tmp_path / "out.npz")], capture_output=True, text=True, check=True)
    assert "ERROR" not in res.stdout
    with np.load(tmp_path / "out.npz") as z:
        pc.check({k: z[k] for k in z.files}, ir, pc.reference(model, x), "cpu")
    res = subprocess.run([*run, str(tmp_path / "torch.npubin"), str(weights), str(tmp_path / "x.npy"),
                          str(tmp_path / "o2.npz")], capture_output=True, text=True, check=True)
    assert "ERROR" in res.stdout and "aten.layer_norm.default" in res.stdout
    assert "pip install 'npu-simulation[export]'" in res.stdout


def test_a_torch_tensor_state_dict_and_one_file_give_the_same(chain, art):
    model, ir, weights, x = chain
    cpu = npu_runtime.get_backend("cpu")
    a = DAGExecutor(art, cpu, weights=str(weights)).run({"x": x})
    b = DAGExecutor(art, cpu, weights=copy.deepcopy(model.state_dict())).run({"x": torch.from_numpy(x)})
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


# ---- the command line -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cli_files(chain, tmp_path_factory):
    import json

    model, ir, weights, x = chain
    folder = tmp_path_factory.mktemp("cli")
    (folder / "chain.json").write_text(json.dumps(ir))
    np.save(folder / "x.npy", x)
    pc.artifact(ir, "cpu").save(folder / "api.npubin")
    return folder, weights


def _main(argv, capsys):
    from npusim.cli import main

    code = main([str(a) for a in argv])
    return code, capsys.readouterr()


def test_cli_compile_describe_run_and_verify_an_artifact(chain, cli_files, capsys):
    import json

    model, ir, _, x = chain
    folder, weights = cli_files
    art = folder / "chain.npubin"
    force = ",".join(sum(pc.forced(ir), []))
    code, cap = _main(["compile", folder / "chain.json", "-o", art, "--force-cpu", force], capsys)
    assert code == 0 and "segments" in cap.out and "layer_norm" in cap.err
    code, cap = _main(["describe", art], capsys)
    assert code == 0
    for text in ("partitioned: ", "on the CPU (", "layer_norm", "forced to the CPU", "(reference)", "transfer ",
                 "run partition 0 on target 'cpu'", "the CPU reference:", "next: npusim describe"):
        assert text in cap.out, text
    code, cap = _main(["describe", art, "--json"], capsys)
    d = json.loads(cap.out)
    assert d["partitioned"] and len(d["segments"]) == len(npu_compiler.load_artifact(art).segments)
    assert {f["name"] for f in d["fallback"]} >= {"gelu", "layer_norm", "sigmoid"}
    program_segment = next(s["index"] for s in d["segments"] if "kernels" in s)
    code, cap = _main(["describe", art, "--segment", program_segment, "--source", "0"], capsys)
    assert code == 0 and "kernel #0" in cap.out
    code, cap = _main(["describe", art, "--source", "0"], capsys)
    assert code == 2 and "--segment" in cap.err
    code, cap = _main(["run", art, "--weights", weights, "--input", f"x={folder / 'x.npy'}", "--iters", "1",
                       "-o", folder / "out.npz"], capsys)
    assert code == 0 and "segments" in cap.out
    with np.load(folder / "out.npz") as z:
        pc.check({k: z[k] for k in z.files}, ir, pc.reference(model, x), "cpu")
    golden = folder / "golden.npz"
    np.savez(golden, **dict(zip([t["name"] for t in ir["graph_outputs"]], pc.reference(model, x))))
    code, cap = _main(["verify", art, "--weights", weights, "--input", f"x={folder / 'x.npy'}", "--expected",
                       golden], capsys)
    assert code == 0 and "PASS" in cap.out


def test_cli_verify_per_node_compares_every_segment(chain, cli_files, capsys):
    import json

    _, ir, _, _ = chain
    folder, weights = cli_files
    code, cap = _main(["verify", folder / "chain.json", "--weights", weights, "--per-node", "--json", "--force-cpu",
                       ",".join(pc.forced(ir)[0])], capsys)
    report = json.loads(cap.out)
    assert code == 0 and report["passed"] and report["partition_path"]
    rows = report["per_node"]["kernels"]
    segments = {r["segment"] for r in rows}
    assert len(segments) == report["segments"] >= 5
    assert sum(r["comparison"] is not None for r in rows) == report["per_node"]["compared"] >= 8


def test_cli_profile_shows_cpu_segments_and_transfers_as_rows(cli_files, capsys, tmp_path):
    import json

    folder, weights = cli_files
    art = folder / "api.npubin"
    code, cap = _main(["profile", art, "--weights", weights, "--iters", "2", "--warmup", "1", "--json", "--trace",
                       tmp_path / "t.json"], capsys)
    assert code == 0
    rows = json.loads(cap.out)["kernels"]
    kinds = {r["kind"] for r in rows}
    assert {"transfer", "cpu segment", "gemm"} <= kinds
    assert sum(r["kind"] == "transfer" for r in rows) == len(npu_compiler.load_artifact(art).transfers)
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert any(e.get("cat") == "transfer" for e in events)


def test_cli_estimate_flags_host_work(cli_files, capsys):
    import json

    folder, _ = cli_files
    art = folder / "api.npubin"
    code, cap = _main(["estimate", art], capsys)
    assert code == 0 and "HOST WORK, NOT PREDICTED" in cap.out and "[host] segment" in cap.out
    code, cap = _main(["estimate", art, "--json"], capsys)
    d = json.loads(cap.out)
    assert d["host_work"]["predicted"] is False and d["host_work"]["segments"]
    assert d["predicted_npu_s"] > 0 and any(k.startswith("segment ") for k in d)


def test_cli_no_fallback_refuses_listing_the_nodes(cli_files, capsys):
    folder, _ = cli_files
    out = folder / "pure.npubin"
    code, cap = _main(["compile", folder / "chain.json", "-o", out, "--no-fallback", "--force-cpu", "gelu,sigmoid"],
                      capsys)
    assert code == 1 and not out.exists()
    line = cap.err.strip()
    assert "\n" not in line and "--no-fallback" in line and "gelu (aten.gelu.default" in line and "sigmoid" in line
    code, cap = _main(["compile", folder / "chain.json", "-o", out, "--no-fallback"], capsys)
    assert code == 0 and isinstance(npu_compiler.load_artifact(out), CompiledProgram)


# ---- the LLM runtime ------------------------------------------------------------------------------------------------


def test_llm_runs_partitioned_programs(tmp_path):
    """An export-llm folder whose prefill and decode are partitioned (the MLP's SiLU on the CPU reference, the KV
    cache writes through torch_ir) generates with the plain folder's logits: the cache written on the host lands in
    the shared cache buffers, the weights come from the one checkpoint."""
    from npu_runtime.llm import LLM

    plain, parts = pc.llm_folders(tmp_path, "cpu")
    for kind in ("prefill", "decode"):
        art = npu_compiler.load_artifact(parts / f"{kind}.npubin")
        assert {s.runner for s in art.segments} == {TARGET, REFERENCE, TORCH}
    a, b = LLM.load(plain, "cpu"), LLM.load(parts, "cpu")
    prompt = [3, 14, 15, 9, 2, 6, 5, 3, 5, 8, 9]  # longer than one prefill chunk
    pc.same_logits(a, b, prompt, [7, 9, 3])
    assert b.generate(prompt[:5], 6, stop_tokens=[]).tokens == a.generate(prompt[:5], 6, stop_tokens=[]).tokens
