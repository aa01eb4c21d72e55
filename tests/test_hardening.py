"""Issue 12, case by case: each input the fuzz table of the issue names gets a clear error of the hierarchy (or is
accepted where a documented rule says how), a bug is an InternalError that asks to be reported, sizes are refused
before anything is allocated, and what the CLI writes escapes the input. (The fuzz suite, tests/fuzz/, covers the
same ground at random; these pin the named cases down.)"""

from __future__ import annotations

import json
import math
import os
import pickle
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import npu_compiler
import npu_runtime
from npu_compiler.errors import (
    ArtifactError,
    ConstraintError,
    InternalError,
    IRFormatError,
    NPUSimError,
    NPUSimWarning,
    OutputError,
    UnsupportedOpError,
)
from npu_compiler.limits import Limits
from npu_runtime.errors import InputError, WeightError
from npusim.cli import main

CPU = npu_runtime.get_backend("cpu")


def tensor(name: str, shape, dtype: str = "float32", producer: str | None = None) -> dict:
    t = {"name": name, "shape": list(shape), "dtype": dtype}
    if producer is not None:
        t.update(producer_node=producer, producer_output_idx=0)
    return t


def small_ir() -> dict:
    """x[2, 6] -> linear(w[4, 6], b[4]) -> relu -> out, as torch_ir writes it."""
    return {
        "model_name": "small", "pytorch_version": "2.13.0",
        "graph_inputs": [tensor("x", (2, 6))],
        "graph_outputs": [tensor("relu", (2, 4))],
        "weights": [tensor("fc.weight", (4, 6)), tensor("fc.bias", (4,))],
        "weight_name_mapping": {"p_fc_weight": "fc.weight", "p_fc_bias": "fc.bias"},
        "nodes": [
            {"name": "linear", "op_type": "aten.linear.default", "attrs": {},
             "inputs": [tensor("x", (2, 6), producer="x"), tensor("p_fc_weight", (4, 6)), tensor("p_fc_bias", (4,))],
             "outputs": [tensor("linear", (2, 4))]},
            {"name": "relu", "op_type": "aten.relu.default", "attrs": {},
             "inputs": [tensor("linear", (2, 4), producer="linear")], "outputs": [tensor("relu", (2, 4))]},
        ],
    }


def small_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"fc.weight": rng.standard_normal((4, 6)).astype(np.float32),
            "fc.bias": rng.standard_normal(4).astype(np.float32)}


def run_small(prog, weights) -> np.ndarray:
    x = np.random.default_rng(1).standard_normal((2, 6)).astype(np.float32)
    ws = npu_runtime.load_weights(prog, weights, CPU)
    return CPU.create_executor(prog).run_numpy({"x": x}, ws)["relu"], x


# ---- the reader ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, words", [
    ('{"nodes": ' + "[" * 100_000 + "]" * 100_000 + "}", "nests deeper"),
    # deeper than the limit but well inside what json.loads parses
    ('{"nodes": ' + "[" * 64 + "]" * 64 + "}", "nests deeper than 64 levels"),
    ('{"nodes": [], "x": ' + '{"a": ' * 70 + "1" + "}" * 70 + "}", "nests deeper than 64 levels"),
    ('{"graph_inputs": [{"name": "x", "shape": [' + "9" * 5000 + '], "dtype": "float32"}]}', "5000 digits"),
    ('{"graph_inputs": [{"name": "x", "shape": [-' + "1" * 21 + '], "dtype": "float32"}]}', "of 22 digits"),
    ("[1, 2]", "must be a JSON object"),
    ('{"graph_inputs": [}', "malformed JSON"),
])
def test_malformed_json_texts(text: str, words: str, tmp_path) -> None:
    path = tmp_path / "ir.json"
    path.write_text(text)
    with pytest.raises(IRFormatError, match=words):
        npu_compiler.compile(path)


def test_long_integer_literals_where_python_converts_any_length(tmp_path) -> None:
    """With Python's bound on converted digits switched off, every literal is checked before it is converted."""
    import sys

    path = tmp_path / "ir.json"
    path.write_text('{"graph_inputs": [{"name": "x", "shape": [' + "9" * 50_000 + '], "dtype": "float32"}]}')
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        with pytest.raises(IRFormatError, match="50000 digits"):
            npu_compiler.compile(path)
    finally:
        sys.set_int_max_str_digits(before)


def _mutated(fn) -> dict:
    ir = small_ir()
    fn(ir)
    return ir


@pytest.mark.parametrize("mutate, words", [
    (lambda ir: ir["nodes"][0]["outputs"][0].update(dtype="int64"),
     r"node 'linear' \(aten.linear.default\): output #0 'linear' is declared int64\[2, 4\], but the op produces "
     r"float32\[2, 4\]"),
    (lambda ir: ir["nodes"][0]["attrs"].update(bogus=1), r"node 'linear'.*unknown attribute 'bogus'"),
    (lambda ir: ir["graph_inputs"].append(tensor("x", (2, 6))), "the name 'x' is given to two values"),
    (lambda ir: ir["nodes"][1]["inputs"][0].update(producer_node="nope"), "producer 'nope' output 0 does not exist"),
    (lambda ir: ir["weight_name_mapping"].update(p_fc_bias="fc.other"), "'fc.other', which the IR's 'weights' do "
                                                                         "not declare"),
    (lambda ir: ir["nodes"][0].update(name="relu"), "duplicate node name"),
    (lambda ir: ir["nodes"][1].update(op_type="aten.leaky_relu.default", attrs={"negative_slope": float("nan")}),
     "attribute 'negative_slope' must be finite"),
])
def test_inconsistent_irs_name_the_node(mutate, words: str) -> None:
    with pytest.raises(IRFormatError, match=words):
        npu_compiler.compile(_mutated(mutate))


def test_attributes_are_checked_against_the_schema() -> None:
    def conv_ir(attrs: dict) -> dict:
        return {"graph_inputs": [tensor("x", (1, 3, 8, 8))], "graph_outputs": [tensor("conv", (1, 4, 8, 8))],
                "weights": [tensor("w", (4, 3, 3, 3))], "weight_name_mapping": {"p_w": "w"},
                "nodes": [{"name": "conv", "op_type": "aten.conv2d.default", "attrs": attrs,
                           "inputs": [tensor("x", (1, 3, 8, 8), producer="x"), tensor("p_w", (4, 3, 3, 3))],
                           "outputs": [tensor("conv", (1, 4, 8, 8))]}]}

    assert npu_compiler.compile(conv_ir({"padding": [1, 1]})).kernels  # the valid one compiles
    for attrs, words in (({"padding": [1, 1], "stride": float("nan")}, "'stride' must be a list of integers"),
                         ({"padding": [1, 1], "stride": [0, 1]}, "'stride' must be positive"),
                         ({"padding": [1, 1], "groups": 2}, "groups=2 does not fit"),
                         ({"padding": [1, 1, 1]}, "'padding' must have 2 entries"),
                         ({"padding": [1, 1], "dilation": [2 ** 70, 1]}, "outside the range of int64")):
        with pytest.raises(IRFormatError, match=words):
            npu_compiler.compile(conv_ir(attrs))
    permute = {"graph_inputs": [tensor("x", (2, 3))], "graph_outputs": [tensor("p", (3, 2))],
               "nodes": [{"name": "p", "op_type": "aten.permute.default", "attrs": {},
                          "inputs": [tensor("x", (2, 3), producer="x")], "outputs": [tensor("p", (3, 2))]}]}
    with pytest.raises(IRFormatError, match="required attribute 'dims'"):  # was KeyError: 'dims'
        npu_compiler.compile(permute)


@pytest.mark.parametrize("attrs,words", [
    ({"dtype": "torch.float16", "layout": "torch.sparse_coo"}, "'torch.sparse_coo' is not supported"),
    ({"dtype": "torch.float16", "layout": 2}, "attribute 'layout' 2 is not supported"),
    ({"dtype": "torch.float16", "memory_format": 7}, "attribute 'memory_format' 7 is not supported"),
    ({"dtype": "torch.float16", "memory_format": "torch.blocked"}, "'torch.blocked' is not supported"),
])
def test_layouts_and_memory_formats_name_a_member(attrs: dict, words: str) -> None:
    """A sparse layout is another kind of tensor, and an enum int outside ATen's members names nothing: both are
    refused (a fuzz run found layout=2, sparse CSR, compiled as a dense copy)."""
    def to_copy(attrs: dict) -> dict:
        return {"graph_inputs": [tensor("x", (2, 3))], "graph_outputs": [tensor("c", (2, 3), "float16")],
                "nodes": [{"name": "c", "op_type": "aten._to_copy.default", "attrs": attrs,
                           "inputs": [tensor("x", (2, 3), producer="x")], "outputs": [tensor("c", (2, 3), "float16")]}]}

    assert npu_compiler.compile(to_copy({"dtype": "torch.float16", "layout": "torch.strided",
                                         "memory_format": "torch.channels_last"})).kernels
    with pytest.raises(IRFormatError, match=words):
        npu_compiler.compile(to_copy(attrs))


def test_broadcast_shape_is_checked() -> None:
    ir = {"graph_inputs": [tensor("a", (2, 3)), tensor("b", (3,))], "graph_outputs": [tensor("add", (2, 2))],
          "nodes": [{"name": "add", "op_type": "aten.add.Tensor", "attrs": {},
                     "inputs": [tensor("a", (2, 3), producer="a"), tensor("b", (3,), producer="b")],
                     "outputs": [tensor("add", (2, 2))]}]}
    with pytest.raises(IRFormatError, match=r"node 'add'.*declared float32\[2, 2\], but the op produces "
                                            r"float32\[2, 3\] \(wrong shape\)"):
        npu_compiler.compile(ir)


def test_an_unknown_dead_op_is_refused_not_dropped() -> None:
    ir = small_ir()
    ir["nodes"].append({"name": "odd", "op_type": "aten.no_such_op.default", "attrs": {},
                        "inputs": [tensor("relu", (2, 4), producer="relu")], "outputs": []})
    with pytest.raises(UnsupportedOpError, match="'odd'"):
        npu_compiler.compile(ir)


# ---- sizes --------------------------------------------------------------------------------------------------------


def test_huge_shapes_are_refused_at_compile_time_with_size_and_limit() -> None:
    ir = small_ir()
    ir["graph_inputs"][0]["shape"] = [1, 10**12]
    with pytest.raises(ConstraintError, match=r"3\.64 TiB, above the limit of 64\.00 GiB \(\$NPUSIM_MAX_BYTES\)"):
        npu_compiler.compile(ir)


def test_the_byte_limit_is_configurable(monkeypatch) -> None:
    monkeypatch.setenv("NPUSIM_MAX_BYTES", "64")
    with pytest.raises(ConstraintError, match="above the limit of 64 bytes"):
        npu_compiler.compile(small_ir())
    monkeypatch.setenv("NPUSIM_MAX_BYTES", "lots")
    with pytest.raises(InputError, match="NPUSIM_MAX_BYTES"):
        npu_compiler.compile(small_ir())
    monkeypatch.setenv("NPUSIM_MAX_BYTES", "1G")
    assert npu_compiler.compile(small_ir()).kernels


def test_the_runtime_refuses_a_program_beyond_the_limit(monkeypatch) -> None:
    prog = npu_compiler.compile(small_ir())
    monkeypatch.setenv("NPUSIM_MAX_BYTES", "100")
    with pytest.raises(npu_runtime.NPURuntimeError, match="above the limit of 100 bytes"):
        CPU.create_executor(prog)


# ---- bugs are internal errors, not bad input ---------------------------------------------------------------------


def test_a_bug_is_an_internal_error(monkeypatch, capsys, tmp_path) -> None:
    from npu_compiler.lowering import lower

    def broken(self, node):
        raise KeyError("oops")

    monkeypatch.setitem(lower.LOWERINGS, "relu.default", broken)
    message = r"internal error while lowering node 'relu' \(aten.relu.default\): KeyError: 'oops'; this is a bug"
    with pytest.raises(InternalError, match=message) as e:
        npu_compiler.compile(small_ir())
    assert isinstance(e.value.__cause__, KeyError)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(small_ir()))
    assert main(["compile", str(path), "-o", str(tmp_path / "m.npubin")]) == 70
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error" in err and "please report it" in err
    with pytest.raises(InternalError):
        main(["--traceback", "compile", str(path), "-o", str(tmp_path / "m.npubin")])


def test_executor_entry_points_wrap_bugs(monkeypatch) -> None:
    prog = npu_compiler.compile(small_ir())
    ex = CPU.create_executor(prog)
    ws = npu_runtime.load_weights(prog, small_weights(), CPU)
    monkeypatch.setattr(type(ex), "_output_view", lambda self, spec: {}["x"])
    with pytest.raises(InternalError, match="while running the program: KeyError"):
        ex.run({"x": np.zeros((2, 6), np.float32)}, ws)
    with pytest.raises(InputError, match="complex64"):
        ex.run({"x": np.zeros((2, 6), np.complex64)}, ws)


# ---- weights ------------------------------------------------------------------------------------------------------


def write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], bytes]]) -> Path:
    header, data = {}, b""
    for k, (dt, shape, raw) in tensors.items():
        header[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return path


def _checkpoint(tmp_path: Path, weight_dtype: str = "F32", bias: np.ndarray | None = None) -> Path:
    w, b = small_weights()["fc.weight"], small_weights()["fc.bias"] if bias is None else bias
    raw = {"F32": w.tobytes(), "F8_E4M3": w.astype(ml_dtypes.float8_e4m3fn).tobytes(),
           "I32": w.astype(np.int32).tobytes(), "BOOL": (w > 0).tobytes(), "F16": w.astype(np.float16).tobytes()}
    return write_safetensors(tmp_path / "w.safetensors", {"fc.weight": (weight_dtype, (4, 6), raw[weight_dtype]),
                                                         "fc.bias": ("F32", (4,), b.astype(np.float32).tobytes())})


@pytest.mark.parametrize("dtype", ["I32", "BOOL"])
def test_integer_and_bool_checkpoints_for_float_weights_are_refused(tmp_path, dtype: str) -> None:
    prog = npu_compiler.compile(small_ir())
    with pytest.raises(WeightError, match=f"'fc.weight' in .*w.safetensors is {dtype.lower().replace('i32', 'int32')}"
                                          " in the checkpoint, the program needs floating-point values"):
        npu_runtime.load_weights(prog, str(_checkpoint(tmp_path, dtype)), CPU)


def test_float8_weights_are_widened_with_a_notice(tmp_path) -> None:
    prog = npu_compiler.compile(small_ir(), dtype="float32")
    with pytest.warns(NPUSimWarning, match="float8_e4m3fn in the checkpoint: widened exactly to float32"):
        ws = npu_runtime.load_weights(prog, str(_checkpoint(tmp_path, "F8_E4M3")), CPU)
    got = ws.buffers["p_fc_weight"].to_numpy()
    want = small_weights()["fc.weight"].astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(got, want)  # exact: every float8 value is a float32 value


def test_non_finite_weights_are_an_error_unless_allowed(tmp_path) -> None:
    """NaN and infinities alike: one inf in a weight made every output NaN with exit 0 (issue 53)."""
    prog = npu_compiler.compile(small_ir(), dtype="float32")
    bad = small_weights()["fc.bias"].copy()
    for value, label in ((np.nan, "NaN"), (-np.inf, "-inf"), (np.inf, "\\+inf")):
        bad[2] = value
        with pytest.raises(WeightError, match=rf"'fc.bias' in .* holds 1 {label} value\(s\) of 4 \(the first at \[2\]\)"
                                              r".*--allow-nonfinite-weights"):
            npu_runtime.load_weights(prog, str(_checkpoint(tmp_path, bias=bad)), CPU)
        with pytest.warns(NPUSimWarning, match=f"holds 1 {label}"):
            ws = npu_runtime.load_weights(prog, str(_checkpoint(tmp_path, bias=bad)), CPU, allow_nonfinite=True)
        assert ws.report.warnings


def test_overflow_to_half_is_an_error_unless_allowed(tmp_path) -> None:
    prog = npu_compiler.compile(small_ir(), dtype="float16")
    big = small_weights()["fc.bias"].copy()
    big[1] = 1e6
    with pytest.raises(WeightError, match=r"1 value\(s\) are too large for float16 and become infinite \(the first at "
                                          r"\[1\]\); compile in a wider dtype"):
        npu_runtime.load_weights(prog, str(_checkpoint(tmp_path, bias=big)), CPU)
    with pytest.warns(NPUSimWarning, match="too large for float16 and become infinite"):
        npu_runtime.load_weights(prog, str(_checkpoint(tmp_path, bias=big)), CPU, allow_nonfinite=True)


@pytest.mark.parametrize("damage, words", [
    (lambda b: b[: len(b) // 2], "data_offsets .* are not inside|does not fit"),
    (lambda b: b[:5], "too short"),
    (lambda b: struct.pack("<Q", 2**40) + b[8:], "header length"),
    (lambda b: b[:8] + b"[" + b[9:], "header is not JSON"),
])
def test_damaged_safetensors_are_clean_errors(tmp_path, damage, words: str) -> None:
    prog = npu_compiler.compile(small_ir())
    path = _checkpoint(tmp_path)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(WeightError, match=words):
        npu_runtime.load_weights(prog, str(path), CPU)


def test_overlapping_tensors_are_refused(tmp_path) -> None:
    prog = npu_compiler.compile(small_ir())
    w = small_weights()
    path = write_safetensors(tmp_path / "w.safetensors", {"fc.weight": ("F32", (4, 6), w["fc.weight"].tobytes())})
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header["fc.bias"] = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + blob[8 + n:])
    with pytest.raises(WeightError, match="overlap"):
        npu_runtime.load_weights(prog, str(path), CPU)


# ---- artifacts: memory safety beyond bounds ------------------------------------------------------------------------


def test_an_artifact_reading_unwritten_memory_is_refused() -> None:
    prog = npu_compiler.compile(small_ir(), dtype="float32")
    d = prog.to_dict()
    # the relu kernel now reads the linear result before the GEMM writes it
    d["kernels"] = list(reversed(d["kernels"]))
    with pytest.raises(ArtifactError, match="reads elements .* before any kernel wrote them"):
        npu_compiler.CompiledProgram.from_dict(d)


def test_an_artifact_writing_a_weight_is_refused() -> None:
    """Weights are read-only (the cuda GEMV reads them before the kernel ahead of it finishes): a kernel whose output
    is a weight buffer is refused at load, naming the kernel and the buffer."""
    prog = npu_compiler.compile(small_ir(), dtype="float32")
    d = prog.to_dict()
    weight = next(b for b in d["buffers"] if b["kind"] == "weight")
    last = d["kernels"][-1]["outs"][0]
    assert last["buffer"] != weight["id"]
    last["buffer"], last["offset"] = weight["id"], 0
    assert list(last["strides"]) == [4, 1] and weight["numel"] >= 8  # the [2, 4] output still inside the weight
    with pytest.raises(ArtifactError, match=rf"writes buffer {weight['id']} .*a weight: weights are read-only"):
        npu_compiler.CompiledProgram.from_dict(d)


def test_an_artifact_whose_live_buffers_share_bytes_is_refused() -> None:
    ir = small_ir()
    # relu -> neg -> relu: two intermediates live at once
    ir["nodes"][1]["outputs"][0]["name"] = "r1"
    ir["nodes"].append({"name": "neg", "op_type": "aten.neg.default", "attrs": {},
                        "inputs": [tensor("r1", (2, 4), producer="relu")], "outputs": [tensor("neg", (2, 4))]})
    ir["nodes"].append({"name": "add", "op_type": "aten.add.Tensor", "attrs": {},
                        "inputs": [tensor("neg", (2, 4), producer="neg"), tensor("r1", (2, 4), producer="relu")],
                        "outputs": [tensor("add", (2, 4))]})
    ir["graph_outputs"] = [tensor("add", (2, 4))]
    prog = npu_compiler.compile(ir, dtype="float32", disable_passes=["elementwise_fusion"])
    d = prog.to_dict()
    arena = [b for b in d["buffers"] if b["kind"] == "arena" and b["numel"]]
    assert len(arena) >= 2
    for b in arena:
        b["offset"] = 0
    with pytest.raises(ArtifactError, match="live at the same time and share arena bytes"):
        npu_compiler.CompiledProgram.from_dict(d)


# ---- outputs: atomic, umask, escaping ------------------------------------------------------------------------------


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def test_outputs_follow_the_umask_and_need_their_folder(tmp_path, umask_027, capsys) -> None:
    prog = npu_compiler.compile(small_ir())
    prog.save(tmp_path / "m.npubin")
    assert (tmp_path / "m.npubin").stat().st_mode & 0o777 == 0o640
    with pytest.raises(OutputError, match="folder .*nope does not exist"):
        prog.save(tmp_path / "nope" / "m.npubin")
    with pytest.raises(OutputError, match="it is a folder"):
        prog.save(tmp_path)
    write_safetensors(tmp_path / "w.safetensors",
                      {k: ("F32", v.shape, v.tobytes()) for k, v in small_weights().items()})
    code = main(["run", str(tmp_path / "m.npubin"), "--weights", str(tmp_path / "w.safetensors"), "--iters", "1",
                 "--warmup", "0", "-o", str(tmp_path / "o.npz"), "--backend", "cpu"])
    assert code == 0 and (tmp_path / "o.npz").stat().st_mode & 0o777 == 0o640
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


HOSTILE = "evil\x1b]0;owned\x07\"\n  click k0 call x()\n\u202e"
# what a name may hold and DOT or Mermaid must still escape: quotes, brackets, a backslash, a directive
QUOTED = "evil\"]; click k0 call x() %%{init: {}}%% \\ end"


def test_names_with_control_characters_are_refused_in_one_escaped_line(tmp_path, capsys) -> None:
    for field in ("model_name", "node"):
        ir = small_ir()
        if field == "model_name":
            ir["model_name"] = HOSTILE
        else:
            ir["nodes"][1]["name"] = HOSTILE
        (tmp_path / "bad.json").write_text(json.dumps(ir))
        assert main(["compile", str(tmp_path / "bad.json"), "-o", str(tmp_path / "b.npubin")]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "\x1b" not in err and "\u202e" not in err and "control character" in err
        assert "evil\\x1b]0;owned\\x07" in err


def test_names_from_the_input_are_escaped_everywhere(tmp_path, capsys) -> None:
    ir = small_ir()
    ir["model_name"] = QUOTED
    ir["nodes"][1]["name"] = QUOTED
    ir["nodes"][1]["outputs"][0]["name"] = "relu"
    prog = npu_compiler.compile(ir)
    path = tmp_path / "m.npubin"
    prog.save(path)
    for args in ([], ["--graph", "dot"], ["--graph", "mermaid"], ["--json"]):
        assert main(["describe", str(path), *args]) == 0
        out = capsys.readouterr().out
        if args == ["--graph", "mermaid"]:
            assert "\n  click" not in out and "%%{" not in out
            assert all(line.startswith(("flowchart", "  ")) for line in out.splitlines())
        if args == ["--graph", "dot"]:
            import pydot

            (graph,) = pydot.graph_from_dot_data(out)
            assert len(graph.get_nodes()) >= 3
    ir["nodes"][0]["attrs"] = {"bogus\x1b[2J": 1}
    (tmp_path / "bad.json").write_text(json.dumps(ir))
    assert main(["compile", str(tmp_path / "bad.json"), "-o", str(tmp_path / "b.npubin")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "\\x1b[2J" in err


# ---- CLI inputs ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cli_model(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("cli-inputs")
    npu_compiler.compile(small_ir()).save(d / "m.npubin")
    write_safetensors(d / "w.safetensors", {k: ("F32", v.shape, v.tobytes()) for k, v in small_weights().items()})
    return d / "m.npubin", d / "w.safetensors"


def _npy(tmp_path: Path, kind: str) -> Path:
    x = np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)
    p = tmp_path / f"{kind}.npy"
    if kind == "npz":
        np.savez(tmp_path / "a.npz", x=x)
        (tmp_path / "a.npz").rename(p)
    elif kind == "complex":
        np.save(p, x.astype(np.complex64))
    elif kind == "object":
        np.save(p, np.array([x, 1], dtype=object), allow_pickle=True)
    elif kind == "pickle":
        p.write_bytes(pickle.dumps(x))
    elif kind == "huge":
        head = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }"
        head += " " * (63 - (len(head) + 10) % 64) + "\n"
        p.write_bytes(b"\x93NUMPY\x01\x00" + len(head).to_bytes(2, "little") + head.encode())
    elif kind == "bigendian":
        np.save(p, x.astype(">f4"))
    return p


@pytest.mark.parametrize("kind, words", [
    ("npz", "is an .npz archive"), ("complex", "holds complex64 values"), ("object", "holds object values"),
    ("pickle", "no NumPy header; pickles are not read"), ("huge", r"\[1000000000000\] float32 \(3\.64 TiB\), above "
                                                                  "the limit"),
])
def test_bad_input_files_are_one_line_errors(cli_model, tmp_path, capsys, kind: str, words: str) -> None:
    art, w = cli_model
    code = main(["run", str(art), "--weights", str(w), "--input", f"x={_npy(tmp_path, kind)}", "--iters", "1"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert "npusim run: error: --input x=" in err and __import__("re").search(words, err), err


def test_a_big_endian_input_is_accepted(cli_model, tmp_path, capsys) -> None:
    art, w = cli_model
    assert main(["run", str(art), "--weights", str(w), "--input", f"x={_npy(tmp_path, 'bigendian')}",
                 "--iters", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["generated_inputs"] == []


@pytest.mark.parametrize("argv, words", [
    (["--iters", "-1"], "must be at least 1"), (["--iters", "10000000"], "must be at most 1000000"),
    (["--seed", "-1"], "must be at least 0"), (["--top-k", "-3"], "must be at least 0"),
    (["-o", ""], "an empty file name"), (["--backend", ""], "unknown backend ''"),
])
def test_bad_run_options(cli_model, capsys, argv, words: str) -> None:
    art, w = cli_model
    try:
        code = main(["run", str(art), "--weights", str(w), *argv])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code in (1, 2) and words in err and "Traceback" not in err, err


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_generate_sampling_options_refuse_non_finite_values(value: str, capsys) -> None:
    for flag in ("--temperature", "--top-p"):
        with pytest.raises(SystemExit) as e:
            main(["generate", "nowhere", "--prompt-ids", "1", flag, value])
        assert e.value.code == 2
        assert "must be" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "nowhere", "--prompt-ids", "1", "--top-k", "0"])
    assert "must be at least 1" in capsys.readouterr().err


def test_every_error_class_is_of_the_hierarchy() -> None:
    from npu_export.errors import ExportError
    from npusim.common import CLIError

    for cls in (ArtifactError, ConstraintError, IRFormatError, OutputError, InputError, WeightError, ExportError,
                InternalError):
        assert issubclass(cls, NPUSimError), cls
    assert not issubclass(CLIError, InternalError)
    assert math.isfinite(1.0)


def test_a_repro_folder_runs_no_code_from_the_model(tmp_path) -> None:
    """verify --dump-repro writes repro.py; names from the IR (a model name written as Python) reach only
    kernel.json, and running the script as told runs none of it."""
    import subprocess
    import sys

    from npu_runtime import inspect as npi

    canary = tmp_path / "CANARY"
    # one line (a name with a newline is refused by the reader): still Python that would run if pasted into a script
    payload = f"x\"\"\"; import os; os.system('touch {canary}'); \"\"\"'; open('{canary}', 'w')#"
    ir = small_ir()
    ir["model_name"] = payload
    ir["nodes"][0]["name"] = payload
    ir["nodes"][1]["inputs"][0]["producer_node"] = payload
    prog = npu_compiler.compile(ir, dtype="float32")
    ex = CPU.create_executor(prog)
    ws = npu_runtime.load_weights(prog, small_weights(), CPU)
    x = {"x": np.zeros((2, 6), np.float32)}
    k = prog.kernels[0]
    check = npi.KernelCheck(0, k.name, k.kind, k.group, list(k.nodes), "linear", None)
    script = npi.dump_repro(tmp_path / "repro", ex, x, ws, check, np.zeros((2, 4), np.float32))
    text = Path(script).read_text()
    assert "os.system" not in text and str(canary) not in text
    assert json.loads((tmp_path / "repro" / "kernel.json").read_text())["model"] == payload
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode in (0, 1) and "max_abs" in proc.stdout, proc.stdout + proc.stderr  # it ran, and
    assert not canary.exists()  # ran nothing of the model's
    with pytest.raises(OutputError, match="does not exist"):
        npi.dump_repro(tmp_path / "nope" / "repro", ex, x, ws, check, np.zeros((2, 4), np.float32))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_fast_finite_check_agrees_with_numpy(dtype):
    # The weight loader decides "no inf/NaN" on integer views; NumPy's isfinite on fp64 copies is the reference.
    import ml_dtypes

    from npu_runtime.weights import _all_finite

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(0)
    info = ml_dtypes.finfo(dt) if dtype == "bfloat16" else np.finfo(dt)
    base = (rng.standard_normal(3 * (1 << 22) + 5) * 1e3).astype(dt)  # spans several chunks
    base[:4] = [info.max, -info.max, info.tiny, -0.0]
    cases = [base, base[::3]]
    for special in (np.inf, -np.inf, np.nan):
        for where in (0, len(base) - 1, 1 << 22):
            b = base.copy()
            b[where] = special
            cases.append(b)
    for a in cases:
        assert _all_finite(a) == bool(np.isfinite(a.astype(np.float64)).all())


def test_an_iteration_space_is_bounded_only_where_it_is_memory(monkeypatch) -> None:
    # sum over x[64, 64]: 16 KiB tensors, a 4,096-point iteration space with its reduction. The NumPy interpreter
    # holds that space in memory (8 bytes a point: 32 KiB), a GPU's thread grid does not.
    ir = {"model_name": "sum", "pytorch_version": "2.13.0",
          "graph_inputs": [tensor("x", (64, 64))], "graph_outputs": [tensor("sum", (64,))],
          "weights": [], "weight_name_mapping": {},
          "nodes": [{"name": "sum", "op_type": "aten.sum.dim_IntList", "attrs": {"dim": [1]},
                     "inputs": [tensor("x", (64, 64), producer="x")], "outputs": [tensor("sum", (64,))]}]}
    monkeypatch.setenv("NPUSIM_MAX_BYTES", "20000")
    with pytest.raises(ConstraintError, match="4096 iteration points"):
        npu_compiler.compile(ir, "cpu")
    prog = npu_compiler.compile(ir, "cuda")
    assert [k.spec.kind for k in prog.kernels] == ["generated"]
    from npu_compiler.program import CompiledProgram

    assert CompiledProgram.from_bytes(prog.to_bytes()).kernels  # the cuda artifact loads under the same limit
    cpu_blob = npu_compiler.compile(ir, "cpu", limits=Limits(max_bytes=10**6)).to_bytes()
    cpu_prog = CompiledProgram.from_bytes(cpu_blob)  # reading it allocates nothing; the interpreter would
    with pytest.raises(ArtifactError, match="4096 iteration points"):
        CPU.create_executor(cpu_prog)


def test_weights_made_on_threads_report_as_one_by_one(monkeypatch) -> None:
    """Weights are read and checked on worker threads while earlier ones upload: the buffers, the report (its order
    too) and the error raised (the first bad weight in the program's order, not the first a thread finishes) are those
    of reading them one by one."""
    import torch
    from helpers import export_ir

    import npu_runtime.weights as W

    class Stack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fcs = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(12))

        def forward(self, x):
            for fc in self.fcs:
                x = fc(x)
            return x

    prog = npu_compiler.compile(export_ir(Stack, [((2, 8), torch.float32)], "stack"), "cpu", dtype="float16")
    rng = np.random.default_rng(0)
    sd = {f"fcs.{i}.{p}": rng.standard_normal((8, 8) if p == "weight" else (8,)).astype(np.float32)
          for i in range(12) for p in ("weight", "bias")}
    clean = {k: v.copy() for k, v in sd.items()}
    for i in (2, 7, 10):
        sd[f"fcs.{i}.bias"][i % 8] = np.inf  # a warning each (allowed), in program order
        sd[f"fcs.{i}.weight"][0, 0] = 1e6  # overflows float16: a warning each (allowed)

    def load(workers: int, weights: dict, **kw):
        monkeypatch.setattr(W, "_WORKERS", workers)
        monkeypatch.setattr(W, "_AHEAD", workers + 1)
        with pytest.warns(NPUSimWarning):
            return npu_runtime.load_weights(prog, weights, CPU, **kw)

    one, many = load(1, sd, allow_nonfinite=True), load(4, sd, allow_nonfinite=True)
    assert one.report == many.report and len(one.report.warnings) == 6
    assert one.buffers.keys() == many.buffers.keys()
    for k in one.buffers:
        np.testing.assert_array_equal(one.buffers[k].to_numpy(), many.buffers[k].to_numpy())
    # the first NaN in program order is the error, though a later one sits on a thread that may finish first
    bad = {k: v.copy() for k, v in clean.items()}
    bad["fcs.3.weight"][1, 1] = np.nan
    for i in range(5, 12):
        bad[f"fcs.{i}.weight"][:] = np.nan
    for workers in (1, 4):
        monkeypatch.setattr(W, "_WORKERS", workers)
        monkeypatch.setattr(W, "_AHEAD", workers + 1)
        with pytest.raises(WeightError, match=r"'fcs\.3\.weight' holds 1 NaN"):
            npu_runtime.load_weights(prog, bad, CPU)
    # missing and mis-shaped keys, listed in program order, once each
    gone = {k: v for k, v in sd.items() if k not in ("fcs.9.bias", "fcs.1.weight")}
    gone["fcs.5.weight"] = np.zeros((8, 7), np.float32)
    reports = []
    for workers in (1, 4):
        monkeypatch.setattr(W, "_WORKERS", workers)
        monkeypatch.setattr(W, "_AHEAD", workers + 1)
        with pytest.warns(NPUSimWarning):
            reports.append(npu_runtime.load_weights(prog, gone, CPU, strict=False, allow_nonfinite=True).report)
    assert reports[0] == reports[1] and reports[0].missing == ["fcs.1.weight", "fcs.9.bias"]
    assert [m[0] for m in reports[0].mismatched] == ["fcs.5.weight"]
