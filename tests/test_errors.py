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


def test_bound_inputs_need_not_be_given_but_are_checked_when_given(small):
    ir, model = small
    prog = npu_compiler.compile(ir, "cpu", dtype="float32")
    be = npu_runtime.get_backend("cpu")
    ws = npu_runtime.load_weights(prog, state_dict_numpy(model), be)
    name = prog.inputs[0].name
    x = np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)
    want = be.create_executor(prog).run_numpy({name: x}, ws)
    ex = be.create_executor(prog, bindings={name: be.upload(x)})
    got = ex.run_numpy({}, ws)  # the bound buffer stands for the input
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    with pytest.raises(InputError, match=rf"input '{name}': expected shape \[2, 6\], got \[3, 6\]"):
        ex.run({name: np.zeros((3, 6), np.float32)}, ws)


def test_inputs_bound_to_overlapping_memory_are_refused_where_a_kernel_writes_one(tmp_path):
    """Two inputs on overlapping memory where a kernel writes one (a KV cache, which index_copy updates in place)
    would change each other under the program: binding them is refused, naming both, at once or one call after the
    other, and nothing of the refused call is bound. Inputs that no kernel writes may share memory."""
    import re

    from npu_export.qwen2 import export_qwen2, tiny_qwen2_config
    from npu_runtime import NPURuntimeError
    from npu_runtime.cpu.backend import CpuBuffer

    exp = export_qwen2(tiny_qwen2_config(), tmp_path, max_cache_len=32, prefill_len=8, dtype="float32")
    prog = npu_compiler.compile(exp.decode_path, "cpu", dtype="float32", rope_theta=10000.0)
    g = exp.cache_map["graphs"]["decode"]
    k0, v0, k1 = g["layers"][0]["k_input"], g["layers"][0]["v_input"], g["layers"][1]["k_input"]
    spec = {s.name: s for s in prog.inputs}
    be = npu_runtime.get_backend("cpu")
    cache = be.zeros(tuple(spec[k0].shape), spec[k0].device_dtype)
    refused = re.escape(f"cannot bind '{min(k0, v0)}' and '{max(k0, v0)}' to overlapping memory")
    ex = be.create_executor(prog)
    with pytest.raises(NPURuntimeError, match=refused):
        ex.bind_buffers({k0: cache, v0: cache})
    with pytest.raises(InputError, match="missing input"):  # neither was bound
        ex.run({})
    ex.bind_buffers({k0: cache})
    with pytest.raises(NPURuntimeError, match=refused):
        ex.bind_buffers({v0: cache})
    # a view of the other half of an array whose first half is bound still overlaps where the ranges meet
    two = np.zeros((2, *spec[k1].shape), np.float32)
    ex.bind_buffers({k1: CpuBuffer(two[0], "float32")})
    ex.bind_buffers({v0: CpuBuffer(two[1], "float32")})  # disjoint halves: fine
    with pytest.raises(NPURuntimeError, match="overlapping memory"):
        be.create_executor(prog, bindings={k0: CpuBuffer(two[0], "float32"), v0: CpuBuffer(two[0], "float32")})
    # the step's positions, which no kernel writes, may be one array seen twice
    pos = np.array([5], np.int64)
    pid, cpos = g["inputs"]["position_ids"], g["inputs"]["cache_position"]
    ex.bind_buffers({pid: CpuBuffer(pos.reshape(1, 1), "int64"), cpos: CpuBuffer(pos, "int64")})


def test_outputs_are_wrapped_once_and_again_after_a_binding(tmp_path):
    """`outputs()` gives the same buffers every run (in a dict of its own each call); binding an input that an
    output aliases (a KV cache updated in place) makes that output the caller's buffer from then on."""
    from npu_export.qwen2 import export_qwen2, tiny_qwen2_config

    exp = export_qwen2(tiny_qwen2_config(), tmp_path, max_cache_len=32, prefill_len=8, dtype="float32")
    prog = npu_compiler.compile(exp.decode_path, "cpu", dtype="float32", rope_theta=10000.0)
    k0 = exp.cache_map["graphs"]["decode"]["layers"][0]["k_input"]
    out = next(s.name for s in prog.outputs if s.alias_of == k0)
    spec = {s.name: s for s in prog.inputs}
    be = npu_runtime.get_backend("cpu")
    ex = be.create_executor(prog)
    first, again = ex.outputs(), ex.outputs()
    assert first is not again and all(first[n] is again[n] for n in first)
    cache = be.zeros(tuple(spec[k0].shape), spec[k0].device_dtype)
    assert not np.shares_memory(first[out].native_handle, cache.native_handle)
    ex.bind_buffers({k0: cache})
    assert np.shares_memory(ex.outputs()[out].native_handle, cache.native_handle)


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


class ConvBn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn(self.conv(x))


def test_a_missing_conv_weight_under_a_folded_batch_norm_is_named_missing():
    """The folded conv weight's recipe reads the conv weight and the norm's statistics; without the weight it is
    reported missing by name (it was once folded as if it were the bias: 8 values for an [8, 3, 3, 3] buffer)."""
    ir = export_ir(ConvBn, [((1, 3, 8, 8), torch.float32)], "convbn")
    prog = npu_compiler.compile(ir, "cpu", dtype="float32")
    assert any(w.recipe.kind == "bn_fold_weight" for w in prog.weights)
    torch.manual_seed(0)
    sd = state_dict_numpy(ConvBn().eval())
    del sd["conv.weight"]
    with pytest.raises(WeightError, match=r"missing 1: conv\.weight"):
        npu_runtime.load_weights(prog, sd, npu_runtime.get_backend("cpu"))


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
    with pytest.raises(ArtifactError, match="SHA-256"):
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
    # names that would break generated source or a format string (a name with a control character or a newline is
    # refused by the reader: tests/test_escaping.py)
    hostile = ['a"b\'c', "x y */ /* z", "# comment; import os", "}}{{%s\\n", "k0_generated"]
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


class ManyOps(torch.nn.Module):
    """A graph with most kinds of lowering: norms, gathers, scans, layout ops, convs, upsampling, attention."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(8)
        self.gn = torch.nn.GroupNorm(2, 4)
        self.conv = torch.nn.Conv1d(4, 4, 3, padding=1)
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x, ids):
        y = self.ln(x)  # [2, 4, 8]
        y = self.conv(self.gn(y.unsqueeze(-1)).squeeze(-1)) + torch.cumsum(y, -1)
        v, i = torch.topk(y, 3)
        z = torch.gather(y, -1, i) + v + y[:, ids].sum(1, keepdim=True)[..., :3]
        u = torch.nn.functional.interpolate(y.unsqueeze(1), size=(6, 10), mode="bilinear")
        w = torch.roll(torch.nn.functional.pad(y, (1, 1)), 2, -1)[..., :8].repeat(1, 2, 1)
        a = torch.nn.functional.scaled_dot_product_attention(self.fc(w), w, w, is_causal=True)
        return z, u.mean(), torch.softmax(a, -1) * torch.where(x > 0, 1.0, -1.0).repeat(1, 2, 1)


_BAD_VALUES = ["x", None, -1, 10**12, [], [10**9], [1, "a"], 2.5, {"a": 1}, True]


def test_broken_attrs_never_give_a_traceback():
    """Every attr of every node set to each of several wrong values: compile and partition either succeed or raise
    the compiler's own error (which the CLI prints as one line), never anything else."""
    from npu_compiler.errors import NPUCompileError
    from npu_compiler.partition import partition

    ir = export_ir(ManyOps, [((2, 4, 8), torch.float32), ((2,), torch.int64)], "many")
    assert {"layer_norm.default", "group_norm.default", "conv1d.default", "cumsum.default", "topk.default",
            "gather.default", "index.Tensor", "upsample_bilinear2d.vec", "pad.default", "roll.default",
            "repeat.default", "where.Scalar"} <= {n["op_type"].removeprefix("aten.") for n in ir["nodes"]}
    npu_compiler.compile(ir, dtype="float32")  # the unbroken graph compiles
    tried = 0

    def mutations(node: dict):
        for key in list(node.get("attrs") or {}):
            for bad in _BAD_VALUES:
                yield f"attr {key}={bad!r}", lambda n, key=key, bad=bad: n["attrs"].__setitem__(key, bad)
        if node["inputs"]:
            yield "its last input dropped", lambda n: n["inputs"].pop()
            yield "its first input twice", lambda n: n["inputs"].append(copy.deepcopy(n["inputs"][0]))

    for ni, node in enumerate(ir["nodes"]):
        for what, mutate in mutations(node):
            broken = copy.deepcopy(ir)
            mutate(broken["nodes"][ni])
            tried += 1
            runs = (lambda b=broken: npu_compiler.compile(b, dtype="float32"), lambda b=broken: partition(b, "cpu"))
            for run in runs:
                try:
                    run()
                except NPUCompileError:
                    pass
                except Exception as e:  # noqa: BLE001  (the assertion names what escaped, and where)
                    raise AssertionError(f"node {node['name']} ({node['op_type']}) with {what}: "
                                         f"{type(e).__name__}: {e}") from e
    assert tried > 100
