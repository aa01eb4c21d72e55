"""JSON (de)serialisation of torch_ir IR objects that survives LLM graphs.

torch_ir's own `IR.save()` fails on LLM graphs: `to.dtype`, `to.device`, `softmax.int` and
`_assert_tensor_metadata` keep raw `torch.dtype` / `torch.device` / `torch.layout` objects in their attrs.
Here they are written as strings ("torch.bfloat16", "cpu", "torch.strided") and turned back into torch objects,
guided by each op's ATen schema, before a reloaded IR is handed to `torch_ir.IRExecutor`.

The JSON keeps torch_ir's top-level schema exactly (no extra keys): the compiler's reader rejects unknown keys.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch_ir import IR

from ._atomic import atomic_write_text

__all__ = ["ir_to_dict", "save_ir_json", "load_ir_dict", "load_ir_for_executor", "executable_ir", "TORCH_DTYPES"]

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


# --- reload: the runtime's CPU fallback owns it (it runs sub-graphs through torch_ir.IRExecutor) -----------------

from npu_runtime.fallback import executable_ir, load_ir_for_executor  # noqa: E402
