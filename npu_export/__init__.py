"""Export of PyTorch models to torch_ir IR JSON + weights: the only package of the project that imports torch.

Submodules are imported lazily so that `import npu_export` stays cheap (torch and transformers load on first use).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "export_model": "model_export",
    "ExportResult": "model_export",
    "load_checkpoint": "checkpoint",
    "ExportError": "errors",
    "resnet18": "resnet",
    "resnet50": "resnet",
    "export_cnn": "cnn",
    "export_llm": "llm_export",
    "ir_to_dict": "ir_io",
    "save_ir_json": "ir_io",
    "load_ir_for_executor": "ir_io",
    "LLMExport": "qwen2",
    "export_qwen2": "qwen2",
    "qwen2_config": "qwen2",
    "tiny_qwen2_config": "qwen2",
    "make_additive_mask": "qwen2",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
