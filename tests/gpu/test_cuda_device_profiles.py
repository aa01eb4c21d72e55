"""Programs planned for another GPU run correctly on this one: compiled with the A100's profile (sm_80: mma.sync, no
TMA, no warpgroup MMA, 108 SMs, 163 KiB of shared memory a block), a ResNet-50 and a tiny Qwen2 render A100 code
here (the executor keeps the plan: this GPU has every feature it assumes) and match PyTorch on this GPU within the
tolerances of their own tests. Run the whole GPU suite on one profile with NPUSIM_DEVICE=a100 (or h200, ...)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fused_cases import ir_dict, module_weights

import npu_compiler
from npu_compiler.devices import CHIPS, cannot_run
from npu_compiler.targets.cuda.nvrtc import ARCH_SPECIFIC
from npu_runtime import load_weights

from .test_cuda_qwen2 import P, S, StaticRunner, _agreement, _pearson, _teacher_forced, _tiny_model
from .test_cuda_resnet import _randomize_bn
from .util import rel_err, to_np

A100 = CHIPS["a100"]


def _a100_code(ex) -> None:
    """The executor rendered the A100's plan: no Hopper instruction in any source."""
    assert ex.device == A100, ex.device.name
    for text in ex.rendered.sources.values():
        assert ARCH_SPECIFIC not in text and "wgmma" not in text and "cp.async.bulk" not in text
        assert "__cluster_dims__" not in text


@pytest.fixture(autouse=True)
def _needs_a_device_that_runs_a100_code(cuda_backend):
    why = cannot_run(cuda_backend.state.profile, A100)
    if why is not None:
        pytest.skip(f"this GPU cannot run code planned for the A100: {why}")


@pytest.mark.parametrize("batch", [1, 8])
def test_resnet50_planned_for_the_a100(batch, cuda_backend) -> None:
    from npu_export.resnet import resnet50

    torch.manual_seed(0)
    model = resnet50().eval()
    _randomize_bn(model)
    model = model.half()
    x = torch.randn(batch, 3, 224, 224).half()
    program = npu_compiler.compile(ir_dict(model, [x], "resnet50"), "cuda", dtype="float16", device="a100")
    assert program.device == A100
    assert batch > 1 or any(k.kind == "conv2d" and k.plan.splits > 1 for k in program.kernels)  # (split K)
    weights = load_weights(program, module_weights(model), cuda_backend)
    ex = cuda_backend.create_executor(program)
    _a100_code(ex)
    got = ex.run_numpy({program.inputs[0].name: to_np(x)}, weights)[program.outputs[0].name].astype(np.float64)
    with torch.no_grad():
        ref = model.cuda()(x.cuda()).float().cpu().numpy()
    err = rel_err(got, ref)
    print(f"\nresnet50 batch {batch} planned for the A100, run on {cuda_backend.state.profile.title}: "
          f"relative error {err:.2e}, top-1 equal {np.mean(got.argmax(-1) == ref.argmax(-1)):.2f}")
    assert err < 1e-2 and (got.argmax(-1) == ref.argmax(-1)).all()  # (test_cuda_resnet.py's bounds for fp16)


@pytest.mark.parametrize("dtype,attn", [("bfloat16", "sdpa"), ("bfloat16", "eager")])
def test_tiny_qwen2_planned_for_the_a100(dtype, attn, cuda_backend, tmp_path, monkeypatch) -> None:
    from npu_export.qwen2 import export_qwen2

    monkeypatch.setenv("NPUSIM_DEVICE", "a100")  # StaticRunner compiles without naming a device
    model = _tiny_model(getattr(torch, dtype), attn)
    L = 64
    export = export_qwen2(model, tmp_path, max_cache_len=L, prefill_len=P, dtype=dtype, attn_implementation=attn)
    runner = StaticRunner(cuda_backend, model, export, dtype, L)
    for ex in runner.ex.values():
        _a100_code(ex)
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, P + S).astype(np.int64)
    got = _teacher_forced(runner, ids)
    with torch.no_grad():
        ref = model.cuda()(input_ids=torch.from_numpy(ids)[None].cuda()).logits[0].float().cpu().numpy()
    rs = [_pearson(got[i], ref[i]) for i in range(len(ids))]
    _, agree = _agreement(got, ref, dtype)
    print(f"\nqwen2-tiny {dtype} {attn} planned for the A100: min Pearson r {min(rs):.6f}, argmax agreement "
          f"{agree:.3f}")
    assert min(rs) >= 0.999 and agree >= 0.99  # (test_cuda_qwen2.py's bounds)
