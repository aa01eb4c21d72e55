"""Decode attention on the webgpu backend against PyTorch: one query row a head over a long cache, its keys split
across workgroups (flash-decoding: three dispatches over a scratch output), the keys read in 16-byte words where
their rows are whole words, the splits' statistics and partial outputs combined by many invocations at once. Small
sizes: lavapipe runs them on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fused_cases import TORCH_DTYPES, ir_dict
from gpu.util import to_np
from tolerances import assert_close

import npu_compiler


class Decode(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)


@pytest.mark.parametrize("dtype,d,words", [("float32", 64, True), ("bfloat16", 64, True), ("float16", 40, True),
                                           ("bfloat16", 36, False)])
def test_split_decode_attention_matches_torch(webgpu, dtype, d, words) -> None:
    gen = torch.Generator().manual_seed(d)
    t = TORCH_DTYPES[dtype]
    q = torch.randn((1, 4, 1, d), generator=gen).to(t)
    k = torch.randn((1, 2, 320, d), generator=gen).to(t)
    v = torch.randn((1, 2, 320, d), generator=gen).to(t)
    program = npu_compiler.compile(ir_dict(Decode(), [q, k, v], "decode_attention"), "webgpu", dtype=dtype)
    (att,) = [x for x in program.kernels if x.kind == "attention"]
    assert att.plan.splits >= 2
    ex = webgpu.create_executor(program)
    steps = ex.rendered.steps[program.kernels.index(att)]
    assert len(steps) == 3 and steps[2].grid[1] >= 2  # the combine spreads each row's dims over workgroups
    assert all(("ldv_a1" in ex.rendered.sources[s.source]) == words for s in steps[:2])
    feeds = {spec.name: to_np(x) for spec, x in zip(program.inputs, (q, k, v), strict=True)}
    got = ex.run_numpy(feeds)[program.outputs[0].name].astype(np.float32)
    with torch.no_grad():
        ref = Decode()(q, k, v).float().numpy()
    assert_close(got, ref, dtype, "accumulate", "webgpu", what=f"decode attention {dtype} d={d}")
