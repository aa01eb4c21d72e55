"""JSON (de)serialisation of torch_ir IR objects that survives LLM graphs.

torch_ir's own `IR.save()` fails on LLM graphs: `to.dtype`, `to.device`, `softmax.int` and
`_assert_tensor_metadata` keep raw `torch.dtype` / `torch.device` / `torch.layout` objects in their attrs.
Here they are written as strings ("torch.bfloat16", "cpu", "torch.strided") and turned back into torch objects,
guided by each op's ATen schema, before a reloaded IR is handed to `torch_ir.IRExecutor`.

The JSON keeps torch_ir's top-level schema exactly (no extra keys): the compiler's reader rejects unknown keys.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch_ir import IR

from ._atomic import atomic_write_text

__all__ = ["ir_to_dict", "save_ir_json", "load_ir_dict", "load_ir_for_executor", "TORCH_DTYPES"]

# Names torch_ir (and the IR's tensor metas) use for dtypes, without the "torch." prefix.
TORCH_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}


def _jsonable(value: Any, where: str) -> Any:
    """Turn an attr value into plain JSON data; torch enum-like objects become their `str()`."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, torch.device):
        # A meta device is an artefact of weight-free export, not a placement: the graph is device-agnostic.
        return "cpu" if value.type == "meta" else str(value)
    if isinstance(value, torch.dtype | torch.layout | torch.memory_format):
        return str(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v, where) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, where) for k, v in value.items()}
    raise TypeError(f"{where}: cannot serialise attr value {value!r} of type {type(value).__name__}")


def ir_to_dict(ir: IR) -> dict[str, Any]:
    """A JSON-serialisable dict of `ir` (torch_ir schema; torch objects in attrs stringified)."""
    data = ir.to_dict()
    # IR.to_dict shares the nodes' attrs dicts; rebuild them instead of mutating the IR in place.
    for node in data["nodes"]:
        node["attrs"] = _jsonable(node["attrs"], f"node {node['name']} ({node['op_type']})")
    return data


def save_ir_json(ir: IR | Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write `ir` (an IR or a dict from `ir_to_dict`) as JSON, atomically."""
    data = ir_to_dict(ir) if isinstance(ir, IR) else dict(ir)
    # Non-finite scalars (none in ResNet/Qwen2 graphs) are written as Python's json does: Infinity / NaN.
    text = json.dumps(data, indent=1)
    return atomic_write_text(path, text + "\n")


def load_ir_dict(source: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    """The raw JSON dict of an IR file (a dict argument is deep-copied, never modified)."""
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    with open(source, encoding="utf-8") as f:
        return json.load(f)


# --- reload --------------------------------------------------------------------------------------------------

_SCALAR_TYPE, _DEVICE, _LAYOUT, _MEMORY_FORMAT = "ScalarType", "Device", "Layout", "MemoryFormat"
_KIND_RE = re.compile(rf"\b({_SCALAR_TYPE}|{_DEVICE}|{_LAYOUT}|{_MEMORY_FORMAT})\b")
# Used only for ops whose schema cannot be resolved: the attr name is then the only hint.
_KIND_BY_NAME = {"dtype": _SCALAR_TYPE, "device": _DEVICE, "layout": _LAYOUT, "memory_format": _MEMORY_FORMAT}


def _resolve_op(op_type: str) -> Any | None:
    parts = op_type.split(".")
    if len(parts) != 3 or parts[0] != "aten":
        return None
    packet = getattr(torch.ops.aten, parts[1], None)
    return None if packet is None else getattr(packet, parts[2], None)


@functools.cache
def _torch_kinds(op_type: str) -> dict[str, str] | None:
    """Schema arg name -> the torch enum-like kind it holds, for the args of `op_type` that hold one."""
    op = _resolve_op(op_type)
    if op is None or not hasattr(op, "_schema"):
        return None
    kinds = {}
    for arg in op._schema.arguments:
        # `type` shows ScalarType/Layout/MemoryFormat as plain int; `real_type` keeps the name.
        match = _KIND_RE.search(str(getattr(arg, "real_type", arg.type)))
        if match:
            kinds[arg.name] = match.group(1)
    return kinds


def _to_torch(value: Any, kind: str, device: torch.device | None, where: str) -> Any:
    if isinstance(value, list):
        return [_to_torch(v, kind, device, where) for v in value]
    if not isinstance(value, str):
        return value
    if kind == _DEVICE:
        if device is not None:
            return device
        parsed = torch.device(value)
        return torch.device("cpu") if parsed.type == "meta" else parsed
    obj = getattr(torch, value.removeprefix("torch."), None)
    expected = {_SCALAR_TYPE: torch.dtype, _LAYOUT: torch.layout, _MEMORY_FORMAT: torch.memory_format}[kind]
    if not isinstance(obj, expected):
        raise ValueError(f"{where}: {value!r} is not a {expected.__name__}")
    return obj


def _restore_attrs(node: dict[str, Any], device: torch.device | None) -> None:
    where = f"node {node['name']} ({node['op_type']})"
    kinds = _torch_kinds(node["op_type"])
    attrs = node.get("attrs") or {}
    for name, value in attrs.items():
        kind = kinds.get(name) if kinds is not None else _KIND_BY_NAME.get(name)
        if kind is not None:
            attrs[name] = _to_torch(value, kind, device, f"{where} attr '{name}'")
    node["attrs"] = attrs


def load_ir_for_executor(
    source: str | os.PathLike[str] | Mapping[str, Any], *, device: str | torch.device | None = None
) -> IR:
    """Reload IR JSON into a `torch_ir.IR` that `torch_ir.IRExecutor` can run.

    Stringified dtypes/devices/layouts/memory formats go back to torch objects wherever the op's ATen schema says
    the argument holds one. `device`, when given, replaces every device attr (e.g. to run on "cuda").
    """
    data = load_ir_dict(source)
    dev = torch.device(device) if device is not None else None
    for node in data["nodes"]:
        _restore_attrs(node, dev)
    # IR.from_dict maps constant dtypes with a table that lacks bfloat16 (it would come back as float32).
    raw_constants = data.pop("constants", {}) or {}
    ir = IR.from_dict(data)
    ir.constants = {name: torch.tensor(c["data"], dtype=TORCH_DTYPES[c["dtype"]]) for name, c in raw_constants.items()}
    return ir
