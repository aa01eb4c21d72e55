"""Every field of the IR is type-checked: a null, or a value of another type, anywhere in an IR is refused with an
error naming where, never read as a default (issue 53: `"attrs": null` made a stride-2 conv run as stride 1)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from conftest import export_ir
from safetensors.numpy import save_file
from test_hardening import small_ir

import npu_compiler
from npu_compiler.errors import ConstraintError, IRFormatError
from npu_compiler.ir.reader import read_ir
from npusim.cli import main


def conv_ir() -> dict:
    return export_ir(lambda: torch.nn.Conv2d(3, 4, 3, stride=2, padding=1), [torch.randn(1, 3, 8, 8)], "conv")


def rich_ir() -> dict:
    """small_ir with a constant, a graph output that names its producer, and a weight declared: every kind of
    field the reader takes."""
    ir = small_ir()
    ir["constants"] = {"c0": {"data": [1.0, 2.0, 3.0, 4.0], "dtype": "float32", "shape": [4]}}
    ir["nodes"].append({"name": "add", "op_type": "aten.add.Tensor", "attrs": {},
                        "inputs": [{"name": "relu", "shape": [2, 4], "dtype": "float32", "producer_node": "relu",
                                    "producer_output_idx": 0},
                                   {"name": "c0", "shape": [4], "dtype": "float32"}],
                        "outputs": [{"name": "add", "shape": [2, 4], "dtype": "float32"}]})
    ir["graph_outputs"] = [{"name": "add", "shape": [2, 4], "dtype": "float32", "producer_node": "add",
                            "producer_output_idx": 0}]
    return ir


def _fields(d, path=()):
    """Every (path, value) of the IR's structure, attrs' values and constants' data aside (those are data checked
    against the op's schema and the constant's shape: test_hardening, test_infer)."""
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else ()
    for k, v in items:
        p = (*path, k)
        yield p, v
        if (path and path[-1] == "attrs") or k == "data" or (k == "attrs" and not v):
            continue
        if k in ("shape",):
            continue  # a shape's entries: replaced below by type only
        yield from _fields(v, p)


def _set(d, path, value):
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value


def _other_type(v):
    if isinstance(v, str):
        return 7
    if isinstance(v, bool):
        return "yes"
    if isinstance(v, int):
        return "0"
    if isinstance(v, list):
        return {"0": v[0]} if v else "[]"
    if isinstance(v, dict):
        return list(v.values())
    return [v]


def _refused(ir) -> str:
    with pytest.raises((IRFormatError, ConstraintError)) as e:
        read_ir(ir)
    return str(e.value)


PATHS = [p for p, _ in _fields(rich_ir())]


@pytest.mark.parametrize("path", PATHS, ids=lambda p: ".".join(map(str, p)))
def test_a_null_or_another_type_is_refused_everywhere(path):
    base = rich_ir()
    for bad in (None, _other_type(_get(base, path))):
        ir = copy.deepcopy(base)
        _set(ir, path, bad)
        text = _refused(ir)
        assert text, path


def _get(d, path):
    for k in path:
        d = d[k]
    return d


def test_null_attrs_name_the_node_and_never_mean_defaults(tmp_path, capsys):
    """The attack of issue 53: a stride-2 conv whose attrs are null. Read as the defaults it ran as stride 1 (max
    error 1.2, exit 0); it is refused, naming the node."""
    ir = conv_ir()
    conv = next(n for n in ir["nodes"] if n["op_type"] == "aten.conv2d.default")
    assert conv["attrs"]["stride"] == [2, 2]
    conv["attrs"] = None
    with pytest.raises(IRFormatError, match=rf"node '{conv['name']}' \(aten.conv2d.default\): 'attrs' must be an "
                                            "object"):
        npu_compiler.compile(ir)
    (tmp_path / "m.json").write_text(json.dumps(ir))
    save_file({k: np.zeros(s, np.float32) for k, s in (("weight", (4, 3, 3, 3)), ("bias", (4,)))},
              str(tmp_path / "w.safetensors"))
    assert main(["verify", str(tmp_path / "m.json"), "--weights", str(tmp_path / "w.safetensors")]) == 1
    assert "'attrs' must be an object" in capsys.readouterr().err
    del conv["attrs"]  # absent: the op's defaults, as the schema says: stride 1, which the declared output is not
    with pytest.raises(IRFormatError, match="wrong shape"):
        read_ir(ir)


def test_empty_graph_outputs_are_refused(tmp_path, capsys):
    ir = small_ir()
    ir["graph_outputs"] = []
    with pytest.raises(IRFormatError, match="'graph_outputs' is empty"):
        npu_compiler.compile(ir)
    (tmp_path / "m.json").write_text(json.dumps(ir))
    assert main(["compile", str(tmp_path / "m.json"), "-o", str(tmp_path / "m.npubin")]) == 1
    assert "'graph_outputs' is empty" in capsys.readouterr().err
    assert not (tmp_path / "m.npubin").exists()


@pytest.mark.parametrize("key", ["model_name", "pytorch_version", "weights", "weight_name_mapping", "constants"])
def test_optional_top_level_keys_may_be_absent_but_not_null(key):
    ir = rich_ir() if key == "constants" else small_ir()
    if key in ("weight_name_mapping", "constants"):
        pass  # their absence changes the graph (placeholders, constants): only null is tried
    else:
        absent = copy.deepcopy(ir)
        absent.pop(key, None)
        read_ir(absent)
    ir[key] = None
    assert key in _refused(ir)


def test_a_producer_reference_on_an_output_must_be_right():
    ir = rich_ir()
    ir["graph_outputs"][0]["producer_node"] = "relu"
    assert "but 'add' produces it" in _refused(ir)
    ir = rich_ir()
    ir["nodes"][0]["outputs"][0]["producer_node"] = "relu"
    assert "but 'linear' produces it" in _refused(ir)
