"""ResNet-18 / ResNet-50 in fp16 on the cuda backend against PyTorch on the same GPU: top-1 equal, top-5 agreeing,
logits close; the CUDA-graph run equals the kernel-by-kernel run bit for bit."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from fused_cases import ir_dict, module_weights

import npu_compiler
from npu_runtime import load_weights

from .util import rel_err, to_np


def _randomize_bn(model: torch.nn.Module) -> None:
    # fresh BN statistics would make eval-mode BN nearly an identity and hide a wrong fold
    torch.manual_seed(1)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)


def _median_ms(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


@pytest.mark.parametrize("arch,batch,res", [("resnet18", 1, 224), ("resnet18", 8, 224), ("resnet50", 1, 224),
                                            ("resnet50", 8, 224)])
def test_resnet_fp16(arch, batch, res, cuda_backend) -> None:
    from npu_export import resnet as R

    torch.manual_seed(0)
    model = getattr(R, arch)().eval()
    _randomize_bn(model)
    model = model.half()
    x = torch.randn(batch, 3, res, res).half()
    program = npu_compiler.compile(ir_dict(model, [x], arch), "cuda", dtype="float16")
    weights = load_weights(program, module_weights(model), cuda_backend)
    ex = cuda_backend.create_executor(program)
    ex.poison()
    name = program.inputs[0].name
    got = ex.run_numpy({name: to_np(x)}, weights)[program.outputs[0].name].astype(np.float64)
    with torch.no_grad():
        model_gpu = model.cuda()
        xg = x.cuda()
        ref = model_gpu(xg).float().cpu().numpy().astype(np.float64)
    err = rel_err(got, ref)
    top1 = (got.argmax(-1) == ref.argmax(-1)).mean()
    top5 = np.mean([len(set(np.argsort(-g)[:5]) & set(np.argsort(-r)[:5])) / 5 for g, r in zip(got, ref)])
    # the same program launched kernel by kernel gives the same bits as the graph
    eager = cuda_backend.create_executor(program, use_graph=False)
    got_eager = eager.run_numpy({name: to_np(x)}, weights)[program.outputs[0].name].astype(np.float64)
    np.testing.assert_array_equal(got, got_eager)
    feed = {name: to_np(x)}
    ours_ms = _median_ms(lambda: ex.run(feed))
    with torch.no_grad():
        torch_ms = _median_ms(lambda: model_gpu(xg))
    line = (f"{arch} fp16 batch {batch} {res}px: rel err {err:.2e}, top-1 {top1:.2f}, top-5 {top5:.2f}, "
            f"graph {ex.graph_active}, ours {ours_ms:.2f} ms, torch eager {torch_ms:.2f} ms")
    print("\n" + line)
    assert ex.graph_active, "the program was not captured as a CUDA graph"
    assert err < 1e-2
    assert top1 == 1.0
    assert top5 >= 0.8
