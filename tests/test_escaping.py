"""A name with a newline, a terminal escape or a direction override never prints raw (issue 53): the IR and artifact
readers refuse such names in every field, and names from other inputs (a checkpoint's keys) are printed escaped."""

from __future__ import annotations

import copy
import json

import msgpack
import numpy as np
import pytest
from test_hardening import small_ir, small_weights, write_safetensors

import npu_compiler
from npu_compiler.errors import ArtifactError, IRFormatError
from npu_compiler.ir.reader import read_ir
from npu_compiler.program import CompiledProgram, pack_payload
from npu_compiler.text import UNSAFE, one_line, shown
from npusim.cli import main
from npusim.progress import Progress

EVIL = ["a\nb", "a\rb", "a\x1b[2Jb", "a\u202eb", "a\u2028b", "a\tb", "a\x85b"]


def _ir_name_paths(ir):
    """Every place of the IR that holds a name (a key of a mapping of names, or a string value)."""
    paths = [("model_name",), ("pytorch_version",)]
    for key in ("graph_inputs", "graph_outputs", "weights"):
        paths += [(key, i, "name") for i in range(len(ir[key]))]
    for k in ir["weight_name_mapping"]:
        paths.append(("weight_name_mapping", k))
        paths.append(("weight_name_mapping", "<key>", k))
    for i, n in enumerate(ir["nodes"]):
        paths += [("nodes", i, "name"), ("nodes", i, "op_type")]
        for j, t in enumerate(n["inputs"]):
            paths.append(("nodes", i, "inputs", j, "name"))
            if "producer_node" in t:
                paths.append(("nodes", i, "inputs", j, "producer_node"))
        for j, _ in enumerate(n["outputs"]):
            paths.append(("nodes", i, "outputs", j, "name"))
    return paths


def _poison(d, path, text):
    if path[-2:-1] == ("<key>",):  # rename a mapping's key
        mapping = d[path[0]]
        mapping[path[-1] + text] = mapping.pop(path[-1])
        return
    node = d
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = node[path[-1]] + text


@pytest.mark.parametrize("evil", EVIL, ids=repr)
def test_every_name_of_an_ir_refuses_control_characters(evil):
    base = small_ir()
    for path in _ir_name_paths(base):
        ir = copy.deepcopy(base)
        _poison(ir, path, evil)
        with pytest.raises(IRFormatError) as e:
            read_ir(ir)
        assert "\n" not in one_line(str(e.value)), path


def test_every_string_of_an_artifact_refuses_control_characters():
    prog = npu_compiler.compile(small_ir())
    d = prog.to_dict()
    paths = []
    stack = [(d, ())]
    while stack:
        v, p = stack.pop()
        items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
        for k, x in items:
            if p == () and k in ("config", "stats"):
                continue
            if isinstance(x, str):
                paths.append((*p, k))
            elif isinstance(x, dict | list):
                stack.append((x, (*p, k)))
    assert len(paths) > 20
    for path in paths:
        bad = msgpack.unpackb(msgpack.packb(d, use_bin_type=True), raw=False, strict_map_key=False)
        _poison(bad, path, "\n\x1b[2J")
        with pytest.raises(ArtifactError):
            CompiledProgram.from_bytes(pack_payload(msgpack.packb(bad, use_bin_type=True)))


def test_a_checkpoints_keys_print_escaped(tmp_path, capsys):
    """The weights line of verify and run names unexpected checkpoint keys: one line, escaped."""
    (tmp_path / "m.json").write_text(json.dumps(small_ir()))
    tensors = {k: ("F32", v.shape, v.tobytes()) for k, v in small_weights().items()}
    tensors["evil\nforged line\x1b]0;title\x07"] = ("F32", (1,), np.zeros(1, np.float32).tobytes())
    write_safetensors(tmp_path / "w.safetensors", tensors)
    assert main(["verify", str(tmp_path / "m.json"), "--weights", str(tmp_path / "w.safetensors")]) == 0
    out = capsys.readouterr().out
    line = next(s for s in out.splitlines() if s.startswith("weights:"))
    assert "evil\\nforged line\\x1b]0;title\\x07" in line
    assert not any(s.startswith("forged line") for s in out.splitlines())
    assert "\x1b" not in out and "\x07" not in out


def test_the_progress_line_escapes_the_key_it_shows():
    import io

    stream = io.StringIO()
    p = Progress("loading weights", 2, stream=stream)
    p.update(1, 2, "evil\nkey\x1b[2J")
    assert "\n" not in p.render() and "\x1b" not in p.render()


@pytest.mark.parametrize("evil", EVIL, ids=repr)
def test_shown_is_one_line_without_unsafe_characters(evil):
    s = shown(evil)
    assert "\n" not in s and "\t" not in s and not UNSAFE.search(s)
