"""Export of any `nn.Module`: IR JSON extracted on the meta device + safetensors weights.

    from npu_export import export_model
    res = export_model(model, [(1, 3, 224, 224)], "out", "mynet")   # out/mynet.json, out/mynet.safetensors

Example inputs are given by shape (a float input in the model's dtype), by (shape, dtype), or by a tensor or NumPy
array (its shape and dtype; the values are not used: the graph is traced on the meta device).
"""

from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn
from torch_ir import IR, extract_ir

from ._atomic import atomic_path
from ._meta import first_float_dtype, lifted_constants, meta_clone
from .errors import ExportError, first_line
from .ir_io import TORCH_DTYPES, save_ir_json

__all__ = ["ExampleInput", "ExportResult", "export_model", "example_input", "model_tensors"]

InputLike = Sequence[int] | tuple[Sequence[int], Any] | torch.Tensor | Any


@dataclass(frozen=True)
class ExampleInput:
    shape: tuple[int, ...]
    dtype: torch.dtype | None  # None: the model's floating dtype

    def describe(self, float_dtype: torch.dtype | None = None) -> str:
        dt = self.dtype or float_dtype
        return f"{str(dt).removeprefix('torch.') if dt is not None else 'model dtype'}{list(self.shape)}"


@dataclass(frozen=True)
class ExportResult:
    ir_path: Path
    weights_path: Path
    ir: IR = field(repr=False, compare=False)

    @property
    def inputs(self) -> list[tuple[str, list[int], str]]:
        """(name, shape, dtype) of each graph input: the names `npusim run --input NAME=FILE.npy` takes."""
        return [(t.name, list(t.shape), str(t.dtype).removeprefix("torch.")) for t in self.ir.graph_inputs]

    @property
    def outputs(self) -> list[tuple[str, list[int], str]]:
        return [(t.name, list(t.shape), str(t.dtype).removeprefix("torch.")) for t in self.ir.graph_outputs]


def as_torch_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).removeprefix("torch.")
    if name not in TORCH_DTYPES:
        raise ExportError(f"unknown dtype {dtype!r}; known: {', '.join(TORCH_DTYPES)}")
    return TORCH_DTYPES[name]


def example_input(spec: InputLike) -> ExampleInput:
    """One example input from a shape, a (shape, dtype) pair, a tensor or a NumPy array."""
    if isinstance(spec, torch.Tensor):
        return ExampleInput(tuple(spec.shape), spec.dtype)
    if hasattr(spec, "shape") and hasattr(spec, "dtype"):  # a NumPy array (or anything array-like)
        return ExampleInput(tuple(int(n) for n in spec.shape), as_torch_dtype(str(spec.dtype)))
    if (isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], Sequence)
            and not isinstance(spec[0], str)):
        return ExampleInput(_shape(spec[0]), as_torch_dtype(spec[1]))
    return ExampleInput(_shape(spec), None)


def _shape(seq: Any) -> tuple[int, ...]:
    try:
        shape = tuple(int(n) for n in seq)
    except (TypeError, ValueError):
        raise ExportError(f"an example input must be a shape like (1, 3, 224, 224), a (shape, dtype) pair, a tensor "
                          f"or an array; got {seq!r}") from None
    if any(n < 0 for n in shape):
        raise ExportError(f"shape {list(shape)}: sizes must be >= 0")
    return shape


def model_tensors(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every tensor the IR may reference: the state dict plus non-persistent buffers, keyed by state-dict name.
    With `dtype`, floating tensors are cast to it (what `model.to(dtype)` would hold)."""
    tensors = {**model.state_dict(), **dict(model.named_buffers())}
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int]] = set()
    for name, t in tensors.items():
        t = t.detach().to("cpu")
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        # safetensors refuses tensors that share storage; a shared tensor is written once per key instead.
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        out[name] = t.clone() if key in seen else t.contiguous()
        seen.add(key)
    return out


def _check_arity(model: nn.Module, n: int) -> None:
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return
    required = [p.name for p in params if p.default is p.empty]
    if not len(required) <= n <= len(params):
        raise ExportError(f"{type(model).__name__}.forward takes {len(required)} input(s) "
                          f"({', '.join(p.name for p in params)}); {n} example input(s) given")


def export_model(
    model: nn.Module,
    example_inputs: Sequence[InputLike],
    out_dir: str | os.PathLike[str],
    name: str | None = None,
    *,
    dtype: torch.dtype | str | None = None,
) -> ExportResult:
    """Write `<out_dir>/<name>.json` (the IR) and `<out_dir>/<name>.safetensors` (every weight and buffer).

    `example_inputs`: one entry per argument of `model.forward`, in order; a single shape like (1, 3, 224, 224)
    is taken as one input. `dtype` casts the model's floating weights (and float inputs given by shape) first, like
    `model.to(dtype)`; the model itself is not changed. `name` defaults to the model's class name in lower case.

    The model is put in eval mode and the IR is extracted from a meta-device copy, so no weight is traced or
    copied during extraction. Returns the paths and the graph's inputs and outputs (`ExportResult.inputs`).
    """
    if isinstance(model, torch.jit.ScriptModule):  # an nn.Module subclass, but torch.export cannot trace one
        raise ExportError(f"{type(model).__name__} is a TorchScript module (made by torch.jit.script or "
                          "torch.jit.trace): export the nn.Module itself, not a ScriptModule (torch.export traces "
                          "the module's Python forward, which a ScriptModule no longer has)")
    if not isinstance(model, nn.Module):
        raise ExportError(f"expected a torch.nn.Module, got {type(model).__name__}")
    if isinstance(example_inputs, Sequence) and example_inputs and all(isinstance(n, int) for n in example_inputs):
        example_inputs = [tuple(example_inputs)]  # a single shape
    specs = [example_input(s) for s in example_inputs]
    if not specs:
        raise ExportError("give at least one example input (a shape like (1, 3, 224, 224))")
    _check_arity(model, len(specs))
    name = name or type(model).__name__.lower()
    if not name or any(c in name for c in "/\\") or name.startswith("."):
        raise ExportError(f"name {name!r}: give a plain file stem (letters, digits, '_', '-', '.')")
    cast = as_torch_dtype(dtype)
    if cast is not None and not cast.is_floating_point:
        raise ExportError(f"dtype {dtype}: the model can only be cast to a floating dtype")
    model.eval()
    float_dtype = cast or first_float_dtype(model)
    meta_model = meta_clone(model).eval()
    if cast is not None:
        meta_model.to(cast)
    example = tuple(torch.empty(s.shape, dtype=s.dtype or float_dtype, device="meta") for s in specs)
    # no_grad: otherwise any @torch.no_grad() region becomes an opaque wrap_with_set_grad_enabled node
    try:
        with torch.no_grad():
            ir = extract_ir(meta_model, example, model_name=name)
    except Exception as e:  # torch.export raises many types; the user needs the first line and the inputs tried
        raise ExportError(f"torch.export could not trace {type(model).__name__} with inputs "
                          f"{', '.join(s.describe(float_dtype) for s in specs)}: {first_line(e)} "
                          "(--traceback shows the whole trace)") from e

    out = Path(out_dir)
    weights_path = out / f"{name}.safetensors"
    tensors = model_tensors(model, cast)
    missing = {w.name for w in ir.weights} - set(tensors)
    if missing:  # tensors the forward creates: their values come from one export of the real model
        real = model if cast is None else copy.deepcopy(model).to(cast)
        example_real = tuple(torch.zeros(s.shape, dtype=s.dtype or float_dtype) for s in specs)
        tensors.update(lifted_constants(real, example_real, missing))
        # a constant with no elements has no value to recover (BART's empty cache placeholders, which the real
        # export numbers differently from the meta one): the shape and dtype the graph declares are all of it
        for w in ir.weights:
            dt = TORCH_DTYPES.get(str(w.dtype).removeprefix("torch."))
            if w.name not in tensors and 0 in tuple(w.shape) and dt is not None:
                tensors[w.name] = torch.empty(tuple(w.shape), dtype=dt)
    with atomic_path(weights_path) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt", "model_name": name})
    ir_path = save_ir_json(ir, out / f"{name}.json")
    return ExportResult(ir_path=ir_path, weights_path=weights_path, ir=ir)
