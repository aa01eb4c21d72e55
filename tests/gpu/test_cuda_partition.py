"""Partitioned programs on the cuda backend: ops the target lacks (or that are forced there) run on the CPU, the rest
on the GPU, with the transfers at the boundaries; the outputs match PyTorch, and the LLM runtime runs them."""

from __future__ import annotations

import copy

import numpy as np
import torch
from fused_cases import ir_dict


class Mixed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(16, 16)
        self.l2 = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = self.l1(x).relu()
        c = torch.logcumsumexp(y, dim=-1)  # no lowering: the CPU
        z = self.l2(c) * 0.5 + y  # back on the GPU
        return torch.cummin(z, dim=-1).values, z.softmax(-1)


def test_partitioned_run_matches_torch(cuda_backend) -> None:
    from npu_compiler.partition import partition
    from npu_runtime.dag_executor import DAGExecutor

    torch.manual_seed(0)
    model = Mixed().eval()
    x = torch.randn(4, 16)
    data = ir_dict(copy.deepcopy(model), [x], "mixed")
    plan = partition(data, "cuda")
    assert {p.device for p in plan.partitions} == {"npu", "cpu"}
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ex = DAGExecutor(plan, cuda_backend, weights=sd, dtype="float32")
    outs = ex.run({data["graph_inputs"][0]["name"]: x.numpy()})
    with torch.no_grad():
        ref = model(x)
    names = [t["name"] for t in data["graph_outputs"]]
    for name, r in zip(names, ref):
        np.testing.assert_allclose(np.asarray(outs[name], np.float32), r.numpy(), rtol=1e-5, atol=1e-5, err_msg=name)
    print(f"\npartition on cuda: {len(plan.partitions)} partitions, {ex.num_transfers} transfers, outputs match")


def test_partitioned_artifact_round_trips_and_matches_torch(cuda_backend, tmp_path) -> None:
    """A partitioned artifact compiled for cuda, with CPU segments of both kinds (the CPU reference's programs and
    torch_ir's nodes), written, read back and run against PyTorch; tensors made on the GPU stay there for the GPU
    segments after them."""
    import partitioned_cases as pc

    ex, x = pc.round_trip(tmp_path, cuda_backend)
    timings = ex.profile({"x": x})
    assert {t.kind for t in timings} == {"kernel", "segment", "transfer"}
    print(f"\npartitioned artifact on cuda: {len(ex.program.segments)} segments, {ex.num_transfers} transfers, outputs "
          "match")


def test_llm_on_partitioned_programs(cuda_backend, tmp_path) -> None:
    """An export-llm folder for cuda whose prefill and decode are partitioned (the MLP's SiLU on the CPU reference,
    the cache writes through torch_ir) gives the logits of the plain cuda programs: the cache buffers bound on the
    GPU, the writes made on the host copied into them after each step."""
    import partitioned_cases as pc

    from npu_runtime.llm import LLM

    plain, parts = pc.llm_folders(tmp_path, "cuda")
    a, b = LLM.load(plain, cuda_backend), LLM.load(parts, cuda_backend)
    prompt = [3, 14, 15, 9, 2, 6, 5, 3, 5, 8, 9]
    pc.same_logits(a, b, prompt, [7, 9, 3])
    assert b.generate(prompt[:5], 6, stop_tokens=[]).tokens == a.generate(prompt[:5], 6, stop_tokens=[]).tokens
