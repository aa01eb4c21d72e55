"""`MODULE:FACTORY` and `FILE.py:FACTORY` references to a user's model, as `npusim export` takes them.

The factory is called (with `--factory-arg KEY=VALUE` keyword arguments) and must return a `torch.nn.Module`;
an `nn.Module` instance or class named directly works too. The current folder is on the import path, as with
`python -m`.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
from typing import Any

from .errors import ExportError, first_line

__all__ = ["is_model_ref", "load_model", "parse_factory_args"]


def is_model_ref(text: str) -> bool:
    return ":" in text and not text.startswith(":") and not text.endswith(":")


def parse_factory_args(items: list[str]) -> dict[str, Any]:
    """KEY=VALUE pairs; a VALUE that reads as a Python literal (10, 0.5, True, 'x', [1, 2]) is that literal,
    anything else is a string."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise ExportError(f"--factory-arg expects KEY=VALUE with KEY a Python name, got {item!r}")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def _import(module: str) -> Any:
    if module.endswith(".py") or os.sep in module or "/" in module:
        path = os.path.abspath(module)
        if not os.path.isfile(path):
            raise ExportError(f"{module}: file not found")
        name = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ExportError(f"{module}: cannot be imported as a Python file")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(module)


def load_model(ref: str, kwargs: dict[str, Any] | None = None) -> tuple[Any, str]:
    """The nn.Module that `ref` (MODULE:FACTORY or FILE.py:FACTORY) names, and the factory's name."""
    import torch

    module, _, attr = ref.rpartition(":")
    try:
        mod = _import(module)
    except ExportError:
        raise
    except Exception as e:  # ImportError, or any error raised while the user's module runs
        raise ExportError(f"cannot import {module!r}: {first_line(e)} (run npusim from the folder that "
                          "holds the module, or give FILE.py:FACTORY)") from e
    obj: Any = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in dir(mod) if not n.startswith("_"))
            raise ExportError(f"{module} has no attribute {attr!r}; it has: {', '.join(names[:20])}")
        obj = getattr(obj, part)
    if isinstance(obj, torch.nn.Module):
        if kwargs:
            raise ExportError(f"{ref} is a model instance, not a factory: --factory-arg does not apply")
        return obj, attr.split(".")[-1]
    if not callable(obj):
        raise ExportError(f"{ref} is a {type(obj).__name__}, not a factory that returns an nn.Module")
    try:
        model = obj(**(kwargs or {}))
    except Exception as e:
        raise ExportError(f"{ref}(...) raised {first_line(e)}") from e
    if not isinstance(model, torch.nn.Module):
        raise ExportError(f"{ref}() returned a {type(model).__name__}, not a torch.nn.Module")
    return model, attr.split(".")[-1]
