"""An independent reference for one IR node or a whole IR: each node calls its ATen op with every argument passed by
name, bound from PyTorch's own schema of the op (never from the compiler's schema table).

torch_ir's executor binds positionally and stops at the first absent optional argument, so some IRs it wrote
itself do not run on it (`clamp(max=...)` without `min` loses `max`; `_assert_tensor_metadata` never passes its
dtype; an affine-less batch norm gets its running statistics as weight and bias). The shape-inference test and the
fuzz suite compare with what ATen computes, so they bind by name. Tensor arguments take the node's inputs in order
(the IR drops None optionals and shifts the rest), then a scalar the IR put in attrs under the argument's name.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import torch

_MEMORY_FORMATS = {"torch.contiguous_format": torch.contiguous_format, "torch.preserve_format": torch.preserve_format,
                   "torch.channels_last": torch.channels_last}


class ReferenceError(Exception):
    """ATen refuses the node (or the reference cannot express it)."""


def resolve(op_type: str):
    name = op_type.removeprefix("aten.")
    namespace = torch.ops.aten
    if name.startswith("quantized_decomposed."):  # PT2E's quantize/dequantize ops, registered by importing them
        importlib.import_module("torch.ao.quantization.fx._decomposed")
        namespace, name = torch.ops.quantized_decomposed, name.removeprefix("quantized_decomposed.")
    base, _, overload = name.partition(".")
    try:
        packet = getattr(namespace, base)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError) as e:
        raise ReferenceError(f"no ATen op {op_type}") from e


_ENUM_INTS = {"dtype": 15, "layout": 7, "memory_format": 3}  # the largest int naming a member (c10's enums)


def _value(v: Any, name: str) -> Any:
    """An attribute as ATen takes it: TorchScript schemas type dtype, layout and memory format as ints, so the IR's
    strings are turned into the torch objects by the argument's name."""
    if not isinstance(v, str):
        # an enum argument as an int: ATen indexes its tables with it unchecked (an out-of-range ScalarType crashes
        # the process), so only ints that name a member are passed on
        top = _ENUM_INTS.get(name)
        if top is not None and isinstance(v, int) and not 0 <= v <= top:
            raise ReferenceError(f"{name}={v} names no {name} of ATen's")
        return v
    if name == "dtype":
        dt = getattr(torch, v.removeprefix("torch."), None)
        if not isinstance(dt, torch.dtype):
            raise ReferenceError(f"unknown dtype {v!r}")
        return dt
    if name == "device":
        return torch.device("cpu")
    if name == "layout":
        return torch.strided
    if name == "memory_format":
        return _MEMORY_FORMATS.get(v, torch.preserve_format)
    return v


def run_node(op_type: str, inputs: Sequence[torch.Tensor], attrs: Mapping[str, Any]) -> list[torch.Tensor]:
    """The node's outputs as ATen computes them; ReferenceError when ATen refuses."""
    if "getitem" in op_type:
        idx = attrs.get("index", 0)
        if not isinstance(idx, int) or not 0 <= idx < len(inputs):
            raise ReferenceError(f"getitem index {idx!r}")
        return [inputs[idx]]
    if op_type.removeprefix("aten.") in ("_softmax.default", "_log_softmax.default") and attrs.get("half_to_float") \
            and inputs:
        # defined (ATen runs it on CUDA) but without a CPU kernel: the same as (log_)softmax with an fp32 result
        x = inputs[0]
        if x.dtype not in (torch.float16, torch.bfloat16):
            raise ReferenceError("half_to_float needs a half input")
        try:
            soft = torch.softmax if op_type.removeprefix("aten.") == "_softmax.default" else torch.log_softmax
            return [soft(x, attrs["dim"], dtype=torch.float32)]
        except (IndexError, RuntimeError, TypeError) as e:
            raise ReferenceError(str(e)) from e
    fn = resolve(op_type)
    kwargs: dict[str, Any] = {}
    i = 0
    arguments = list(fn._schema.arguments)
    if "batch_norm" in op_type and len(inputs) == 3:
        # eval batch norm without affine parameters: the IR lists (input, running_mean, running_var), the None
        # weight and bias dropped; with running statistics required in eval, that is the only reading
        arguments = [a for a in arguments if a.name not in ("weight", "bias")]
        kwargs.update(weight=None, bias=None)
    def is_list(a) -> bool:
        return "Tensor" in str(a.type) and ("[]" in str(a.type) or "List" in str(a.type))

    list_sizes = list(attrs.get("_tensor_list_sizes") or [])
    for k, arg in enumerate(arguments):
        typ = str(arg.type)
        if is_list(arg):
            if any("Tensor" in str(a.type) for a in arguments[k + 1:]):
                # a list before other tensors (lstm's hx and params, index_put's indices): `_tensor_list_sizes`
                # splits them
                if not list_sizes:
                    raise ReferenceError(f"no _tensor_list_sizes to split the inputs of list argument '{arg.name}'")
                n = list_sizes.pop(0)
            else:
                n = len(inputs) - i
            rest = list(inputs[i:i + n])
            i += n
            masks = attrs.get("_tensor_list_none_masks")
            if masks and ("?" in typ or "Optional" in typ):  # `x[:, idx]`: a None is a full slice, the IR lists only
                # the tensors
                if len(masks) != 1 or sum(not m for m in masks[0]) != len(rest):
                    raise ReferenceError(f"_tensor_list_none_masks {masks} does not fit {len(rest)} inputs")
                rest.reverse()
                kwargs[arg.name] = [None if is_none else rest.pop() for is_none in masks[0]]
            else:
                kwargs[arg.name] = rest
        elif "Tensor" in typ:
            if i < len(inputs):
                kwargs[arg.name] = inputs[i]
                i += 1
            elif arg.name in attrs:
                kwargs[arg.name] = attrs[arg.name]
            elif "Optional" in typ:
                kwargs[arg.name] = None
        elif arg.name in attrs:
            kwargs[arg.name] = _value(attrs[arg.name], arg.name)
    if i < len(inputs):
        raise ReferenceError(f"{len(inputs)} inputs for {i} tensor arguments")
    unknown = set(attrs) - {a.name for a in fn._schema.arguments} - {"_tensor_list_sizes", "_tensor_list_none_masks"}
    if unknown:
        raise ReferenceError(f"unknown attributes {sorted(unknown)}")
    try:
        out = fn(**kwargs)
    except Exception as e:  # ATen raises RuntimeError, TypeError, IndexError, ValueError, NotImplementedError
        raise ReferenceError(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, tuple | list):
        return [t for t in out if isinstance(t, torch.Tensor)]
    return []


# ---- a whole IR ---------------------------------------------------------------------------------------------------

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                 "float64": torch.float64, "int64": torch.int64, "int32": torch.int32, "int16": torch.int16,
                 "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool}


def to_torch(a: np.ndarray) -> torch.Tensor:
    """A copy: an IR may run an in-place op (or a training batch norm, which updates its running statistics) on a
    weight, and the caller's arrays (the fuzz oracle caches them across cases) must not change."""
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(np.array(a, copy=True).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.array(a, copy=True))


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _tensor_of(meta: Mapping[str, Any], data: Any) -> torch.Tensor:
    dt = _TORCH_DTYPES.get(str(meta.get("dtype", "")).removeprefix("torch."), torch.float32)
    return torch.tensor(data, dtype=dt).reshape(meta["shape"])


def run_ir(ir: Mapping[str, Any], weights: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray],
           check_types: bool = True) -> dict[str, np.ndarray]:
    """Run an IR dict node by node. With `check_types`, every node output must have the shape and dtype the IR
    declares (ReferenceError otherwise: the IR lies about what its ops produce)."""
    mapping = ir.get("weight_name_mapping") or {}
    constants = ir.get("constants") or {}
    values: dict[tuple[str, int], torch.Tensor] = {}
    for t in ir["graph_inputs"]:
        values[(t["name"], 0)] = to_torch(np.asarray(inputs[t["name"]]))
    by_name: dict[str, torch.Tensor] = {t["name"]: values[(t["name"], 0)] for t in ir["graph_inputs"]}
    with torch.no_grad():
        for nd in ir["nodes"]:
            ins = []
            for t in nd["inputs"]:
                if t.get("producer_node") is not None:
                    key = (t["producer_node"], t.get("producer_output_idx", 0))
                    if key not in values:
                        raise ReferenceError(f"node {nd['name']}: no producer {key}")
                    ins.append(values[key])
                    continue
                name = t["name"]
                key = mapping.get(name, name)
                if key in constants or name in constants:
                    c = constants[key if key in constants else name]
                    ins.append(_tensor_of({"dtype": c["dtype"], "shape": t["shape"]}, c["data"]))
                elif key in weights:
                    ins.append(to_torch(np.asarray(weights[key])))
                else:
                    raise ReferenceError(f"node {nd['name']}: no weight {key}")
            outs = run_node(nd["op_type"], ins, nd.get("attrs") or {})
            if check_types:
                declared = nd["outputs"]
                if len(outs) != len(declared):
                    raise ReferenceError(f"node {nd['name']}: {len(outs)} outputs, the IR declares {len(declared)}")
                for o, meta in zip(outs, declared):
                    dt = str(o.dtype).removeprefix("torch.")
                    if list(o.shape) != list(meta["shape"]) or dt != str(meta["dtype"]).removeprefix("torch."):
                        raise ReferenceError(f"node {nd['name']}: produces {dt}{list(o.shape)}, the IR declares "
                                             f"{meta['dtype']}{meta['shape']}")
            for j, (o, meta) in enumerate(zip(outs, nd["outputs"])):
                # an in-place op (relu_, add_) changes its input tensor later: keep this node's value apart
                values[(nd["name"], j)] = o.clone()
                by_name[meta["name"]] = values[(nd["name"], j)]
    out = {}
    for t in ir["graph_outputs"]:
        if t["name"] not in by_name:
            raise ReferenceError(f"graph output {t['name']} is not produced")
        out[t["name"]] = to_numpy(by_name[t["name"]])
    return out
