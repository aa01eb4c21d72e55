"""A graph compiled into a partitioned artifact with several CPU segments of both kinds, for every backend's tests
(cpu here, webgpu in tests/webgpu, cuda in tests/gpu).

The CPU segments are made by forcing ops the target has (`force_cpu`: run by the CPU reference; `force_torch`:
through torch_ir), not by ops some target lacks today: those get lowerings over time, and the forced ones stay
valid whatever the targets gain. One weight (l2.weight) is read by a target linear and by a linear forced to the
CPU reference and by one through torch_ir, so each segment must load it in its own way; the layer norm's weights
are read by torch_ir only.
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
        # l2's weight read three times: on the target, by the CPU reference (after its tanh) and through torch_ir
        s = self.l2(g) + F.linear(g.tanh(), self.l2.weight) * 0.5 + F.linear(g, self.l2.weight, self.l2.bias) * 0.25
        y = self.l3(s.relu())
        return y.softmax(-1), s.sum(-1)


def linear_nodes(ir: dict) -> list[str]:
    return [n["name"] for n in ir["nodes"] if n["op_type"] == "aten.linear.default"]


def forced(ir: dict) -> tuple[list[str], list[str]]:
    """(force_cpu, force_torch) for Chain's IR: gelu, tanh and the second use of l2.weight on the CPU reference,
    the layer norm, the sigmoid and the third use of l2.weight through torch_ir."""
    linears = linear_nodes(ir)
    return ["gelu", "tanh", linears[2]], ["layer_norm", "sigmoid", linears[3]]


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


def llm_folders(tmp_path, target: str, cache_len: int = 32, prefill_len: int = 8):
    """A tiny random Qwen2 exported for `target` (the plain folder) and a copy whose prefill and decode programs are
    partitioned: the MLP's SiLU on the CPU reference, the KV cache writes through torch_ir (so the cache is written
    on the host and must land in the shared cache buffers). Returns (plain, partitioned)."""
    import json
    import shutil

    import npu_compiler
    from npu_export.llm_export import export_llm

    plain = tmp_path / "plain"
    export_llm(plain, config="tiny", random_weights=True, max_cache_len=cache_len, prefill_len=prefill_len,
               dtype="float32", target=target)
    parts = tmp_path / "parts"
    shutil.copytree(plain, parts)
    theta = json.loads((plain / "cache_map.json").read_text())["rope"]["theta"]
    for kind in ("prefill", "decode"):
        art = npu_compiler.compile_artifact(plain / f"{kind}.json", target, dtype="float32", force_cpu=["silu"],
                                            force_torch=["index_copy"], rope_theta=theta)
        assert any(o.alias_of for o in art.outputs)  # the cache outputs update the cache inputs
        art.save(parts / f"{kind}.npubin")
    return plain, parts


def same_logits(a, b, prompt: list[int], steps: list[int]) -> None:
    """Two LLMs give the same prefill logits and decode-step logits (float32: within 1e-4)."""
    np.testing.assert_allclose(b.prefill(prompt)[0], a.prefill(prompt)[0], atol=1e-4, rtol=1e-4)
    for pos, tok in enumerate(steps, start=len(prompt)):
        np.testing.assert_allclose(b.decode_step(tok, pos), a.decode_step(tok, pos), atol=1e-4, rtol=1e-4)


def round_trip(tmp_path, backend):
    """Chain compiled for `backend`'s target with its CPU segments, written, read back (every segment kind
    present, each program for its own target) and run against PyTorch. Returns the DAGExecutor and the input."""
    import npu_compiler
    from npu_compiler.partition import REFERENCE, TARGET, TORCH
    from npu_runtime.dag_executor import DAGExecutor

    model, ir, sd, x = make()
    target = backend.compile_target()
    art = artifact(ir, target)
    art.save(tmp_path / "chain.npubin")
    back = npu_compiler.load_artifact(tmp_path / "chain.npubin")
    assert back.to_bytes() == art.to_bytes()
    targets = {s.runner: {s.program.target} for s in back.segments if s.program is not None}
    assert targets == {TARGET: {target}, REFERENCE: {"cpu"}} and any(s.runner == TORCH for s in back.segments)
    ex = DAGExecutor(back, backend, weights=sd)
    check(ex.run({"x": x}), ir, reference(model, x), backend.name)
    assert ex.num_transfers == len(back.transfers) > 0
    return ex, x
