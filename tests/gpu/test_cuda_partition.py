"""The partition path on the cuda backend, unchanged: ops the target lacks run on the CPU through torch_ir, the
rest on the GPU, with the transfers at the boundaries; the outputs match PyTorch."""

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
        return torch.sort(z, dim=-1).values, z.softmax(-1)


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
