"""Bad input gets a clear error that names what is wrong and where."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from helpers import export_ir, state_dict_numpy

import npu_compiler
import npu_runtime
from npu_compiler import ArtifactError, IRFormatError, UnsupportedOpError
from npu_runtime import InputError, WeightError


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 4)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2.0


@pytest.fixture(scope="module")
def small():
    ir = export_ir(Small, [((2, 6), torch.float32)], "small")
    torch.manual_seed(0)
    return ir, Small().eval()


def test_malformed_json(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"graph_inputs": [}')
    with pytest.raises(IRFormatError, match=r"malformed JSON at line 1"):
        npu_compiler.compile(str(p))


def test_not_an_ir():
    with pytest.raises(IRFormatError, match="missing required key"):
        npu_compiler.compile({"hello": 1})


def test_dangling_producer(small):
    ir = copy.deepcopy(small[0])
    ir["nodes"][1]["inputs"][0]["producer_node"] = "nope"
    with pytest.raises(IRFormatError, match=r"node '.*'.*producer 'nope'.*does not exist"):
        npu_compiler.compile(ir)


def test_shape_mismatch_names_node(small):
    ir = copy.deepcopy(small[0])
    ir["nodes"][1]["inputs"][0]["shape"] = [3, 3]
    with pytest.raises(IRFormatError, match=r"declared float32\[3, 3\] but its producer"):
        npu_compiler.compile(ir)


def test_unknown_op_names_node_and_partition_path(small):
    ir = copy.deepcopy(small[0])
    ir["nodes"][1]["op_type"] = "aten.cummax.default"
    name = ir["nodes"][1]["name"]
    with pytest.raises(UnsupportedOpError) as e:
        npu_compiler.compile(ir)
    msg = str(e.value)
    assert f"node '{name}'" in msg and "aten.cummax.default" in msg and "partition" in msg


def test_wrong_input_shape_and_dtype(small):
    ir, model = small
    prog = npu_compiler.compile(ir, "cpu", dtype="float32")
    be = npu_runtime.get_backend("cpu")
    ws = npu_runtime.load_weights(prog, state_dict_numpy(model), be)
    ex = be.create_executor(prog)
    name = prog.inputs[0].name
    with pytest.raises(InputError, match=rf"input '{name}': expected shape \[2, 6\], got \[3, 6\]"):
        ex.run({name: np.zeros((3, 6), np.float32)}, ws)
    with pytest.raises(InputError, match=rf"input '{name}': expected dtype float32, got int64"):
        ex.run({name: np.zeros((2, 6), np.int64)}, ws)
    with pytest.raises(InputError, match="missing input"):
        ex.run({}, ws)
    with pytest.raises(InputError, match="unexpected input"):
        ex.run({name: np.zeros((2, 6), np.float32), "other": np.zeros(1)}, ws)


def test_missing_and_misshaped_weights(small):
    ir, model = small
    prog = npu_compiler.compile(ir, "cpu", dtype="float32")
    be = npu_runtime.get_backend("cpu")
    sd = state_dict_numpy(model)
    del sd["fc.bias"]
    with pytest.raises(WeightError, match=r"missing 1: fc\.bias"):
        npu_runtime.load_weights(prog, sd, be)
    sd = state_dict_numpy(model)
    sd["fc.weight"] = np.zeros((4, 5), np.float32)
    with pytest.raises(WeightError, match=r"fc\.weight expected \[4, 6\] got \[4, 5\]"):
        npu_runtime.load_weights(prog, sd, be)
    with pytest.raises(WeightError, match="not found"):
        npu_runtime.load_weights(prog, "/nonexistent/w.safetensors", be)


def test_corrupted_artifact(small, tmp_path):
    prog = npu_compiler.compile(small[0], "cpu")
    p = tmp_path / "m.npubin"
    prog.save(p)
    blob = p.read_bytes()
    (tmp_path / "trunc.npubin").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(ArtifactError, match="truncated"):
        npu_compiler.CompiledProgram.load(tmp_path / "trunc.npubin")
    flipped = bytearray(blob)
    flipped[-10] ^= 0xFF
    (tmp_path / "flip.npubin").write_bytes(bytes(flipped))
    with pytest.raises(ArtifactError, match="checksum"):
        npu_compiler.CompiledProgram.load(tmp_path / "flip.npubin")
    wrong = bytearray(blob)
    wrong[8] = 99
    (tmp_path / "ver.npubin").write_bytes(bytes(wrong))
    with pytest.raises(ArtifactError, match="format version 99"):
        npu_compiler.CompiledProgram.load(tmp_path / "ver.npubin")
    (tmp_path / "junk.npubin").write_bytes(b"PK\x03\x04 not ours at all, longer than a header")
    with pytest.raises(ArtifactError, match="bad magic"):
        npu_compiler.CompiledProgram.load(tmp_path / "junk.npubin")


def test_hostile_node_names_compile_and_run(small):
    ir, model = small
    ir = copy.deepcopy(ir)
    hostile = ['a"b\'c', "x\ny */ /* z", "# comment; import os", "}}{{%s\\n", "k0_generated"]
    rename = {n["name"]: hostile[i % len(hostile)] + f"_{i}" for i, n in enumerate(ir["nodes"])}
    text = json.dumps(ir)
    ir = json.loads(text)
    for n in ir["nodes"]:
        n["name"] = rename[n["name"]]
        for t in n["inputs"]:
            if t.get("producer_node") in rename:
                t["producer_node"] = rename[t["producer_node"]]
    prog = npu_compiler.compile(ir, "cpu", dtype="float32")
    assert any(set(k.nodes) & set(rename.values()) for k in prog.kernels)
    be = npu_runtime.get_backend("cpu")
    ws = npu_runtime.load_weights(prog, state_dict_numpy(model), be)
    x = np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)
    out = be.create_executor(prog).run_numpy({prog.inputs[0].name: x}, ws)
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(next(iter(out.values())), ref, rtol=1e-5, atol=1e-6)
