"""A graph compiled into a partitioned artifact with several CPU segments of both kinds, for every backend's tests
(cpu here, webgpu in tests/webgpu, cuda in tests/gpu).

The CPU segments are made by forcing ops the target has (`force_cpu`: run by the CPU reference; `force_torch`:
through torch_ir), not by ops some target lacks today: those get lowerings over time, and the forced ones stay
valid whatever the targets gain. One weight (l2.weight) is read by a target linear and by a linear forced to the
CPU reference and torch_ir, so each segment must load it in its own way; the layer norm's weights are read by
torch_ir only.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from npu_runtime.fallback import to_numpy


class Chain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(16, 32)
        self.l2 = torch.nn.Linear(32, 32)
        self.l3 = torch.nn.Linear(32, 8)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x: torch.Tensor):
        h = F.gelu(self.l1(x))  # target linear, gelu on the CPU reference
        g = self.norm(h) * torch.sigmoid(h)  # layer norm and sigmoid through torch_ir, mul on the target
        s = self.l2(g) + F.linear(g.tanh(), self.l2.weight) * 0.5  # the second linear (and its tanh) on the CPU
        y = self.l3(s.relu())
        return y.softmax(-1), s.sum(-1)


def linear_nodes(ir: dict) -> list[str]:
    return [n["name"] for n in ir["nodes"] if n["op_type"] == "aten.linear.default"]


def forced(ir: dict) -> tuple[list[str], list[str]]:
    """(force_cpu, force_torch) for Chain's IR: gelu, tanh and the second use of l2.weight on the CPU reference,
    the layer norm and the sigmoid through torch_ir."""
    return ["gelu", "tanh", linear_nodes(ir)[2]], ["layer_norm", "sigmoid"]


def make(seed: int = 0, batch: int = 4) -> tuple[torch.nn.Module, dict, dict, np.ndarray]:
    """(model, IR dict, state dict, input) for Chain."""
    from conftest import export_ir

    torch.manual_seed(seed)
    model = Chain().eval()
    ir = export_ir(Chain, [torch.empty(batch, 16)], "chain")
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x = np.random.default_rng(seed).standard_normal((batch, 16)).astype(np.float32)
    return model, ir, sd, x


def reference(model: torch.nn.Module, x: np.ndarray) -> list[np.ndarray]:
    with torch.no_grad():
        return [to_numpy(t) for t in model(torch.from_numpy(x))]


def check(outputs: dict[str, np.ndarray], ir: dict, expected: list[np.ndarray], backend: str) -> None:
    """The artifact's outputs against PyTorch's, in order, within the float32 accumulate tolerance (GEMMs inside)."""
    from tolerances import assert_close

    names = [t["name"] for t in ir["graph_outputs"]]
    assert list(outputs) == names
    for name, exp in zip(names, expected):
        assert outputs[name].dtype == exp.dtype, name
        assert_close(outputs[name], exp, "float32", "accumulate", backend, what=name)


def artifact(ir: dict, target: str):
    """Chain's IR compiled for `target` with its forced CPU segments, in float32."""
    import npu_compiler

    force_cpu, force_torch = forced(ir)
    return npu_compiler.compile_artifact(ir, target, force_cpu=force_cpu, force_torch=force_torch, dtype="float32")
