"""The independent reference: a pytorch-ir graph run by `torch_ir.IRExecutor` (ATen op by op)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np
import torch

from npu_runtime.fallback import aten_kernels_for

from .errors import ExportError, first_line
from .ir_io import executable_ir, load_ir_for_executor


def to_torch(a: np.ndarray) -> torch.Tensor:
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(np.require(a, requirements="C").view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.require(a, requirements="C"))  # 0-d stays 0-d


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def load_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    p = os.fspath(path)
    if os.path.isdir(p):
        out: dict[str, torch.Tensor] = {}
        for f in sorted(os.listdir(p)):
            if f.endswith(".safetensors"):
                out.update(load_file(os.path.join(p, f)))
        return out
    return load_file(p)


def _ir_dtypes(ir_obj) -> set[str]:
    metas = [*ir_obj.graph_inputs, *ir_obj.weights, *(o for n in ir_obj.nodes for o in n.outputs)]
    return {m.dtype for m in metas}


def _executor(ir, weights, inputs, extra_weights):
    """The reloaded IR, an IRExecutor over the state dict (plus `extra_weights` it lacks) and the input tensors."""
    import torch_ir

    ir_obj = executable_ir(load_ir_for_executor(ir))
    if isinstance(weights, Mapping):
        sd = {k: (v if isinstance(v, torch.Tensor) else to_torch(np.asarray(v))) for k, v in weights.items()}
    else:
        sd = load_state_dict(weights)
    for k, v in (extra_weights or {}).items():
        sd.setdefault(k, v if isinstance(v, torch.Tensor) else to_torch(np.asarray(v)))
    args = tuple(to_torch(np.asarray(inputs[t.name])) for t in ir_obj.graph_inputs)
    return ir_obj, torch_ir.IRExecutor(ir_obj, weights=sd), args


def run_reference(ir: str | os.PathLike | Mapping[str, Any], weights: Mapping[str, Any] | str | os.PathLike,
                  inputs: Mapping[str, np.ndarray], extra_weights: Mapping[str, Any] | None = None
                  ) -> dict[str, np.ndarray]:
    """Outputs of the IR by name, computed by torch_ir.IRExecutor on the CPU (ATen's own kernels for half floats:
    `aten_kernels_for`)."""
    ir_obj, ex, args = _executor(ir, weights, inputs, extra_weights)
    with torch.no_grad(), aten_kernels_for(_ir_dtypes(ir_obj)):
        try:
            outs = ex.execute(args)
        except Exception as e:  # torch_ir's errors name the node and op; the CLI prints them as one line
            raise ExportError(f"the reference (torch_ir.IRExecutor) failed: {first_line(e)}") from e
    return {t.name: to_numpy(o) for t, o in zip(ir_obj.graph_outputs, outs)}


def run_reference_all(ir: str | os.PathLike | Mapping[str, Any], weights: Mapping[str, Any] | str | os.PathLike,
                      inputs: Mapping[str, np.ndarray], extra_weights: Mapping[str, Any] | None = None
                      ) -> tuple[dict[str, np.ndarray], dict[str, list[str]]]:
    """Every node output of the IR, by value name, and each IR node's output value names (for per-node verify).

    Runs torch_ir.IRExecutor's own per-node steps and copies each output as soon as its node has run: in-place
    ATen ops (relu_, add_) would otherwise change earlier values in the executor's registry afterwards."""
    from torch_ir import executor as ire

    ir_obj, ex, args = _executor(ir, weights, inputs, extra_weights)
    values: dict[str, np.ndarray] = {}
    node_outputs = {n.name: [o.name for o in n.outputs] for n in ir_obj.nodes}
    with torch.no_grad(), aten_kernels_for(_ir_dtypes(ir_obj)):
        ex._prepare(args)
        output_map: dict[str, list[torch.Tensor]] = {t.name: [a] for t, a in zip(ir_obj.graph_inputs, args)}
        for node in ir_obj.nodes:
            outs = ire._execute_node(node, ire._get_input_tensors(node, ex.registry, output_map))
            output_map[node.name] = outs
            for meta, t in zip(node.outputs, outs):
                ex.registry.register(meta.name, t)
                if isinstance(t, torch.Tensor):
                    values[meta.name] = to_numpy(t.clone())
    return values, node_outputs
