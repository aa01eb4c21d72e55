"""ResNet-18 (random weights) end to end against PyTorch: fp32 and fp16, batch 1 and 4, BN folded or not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import npu_compiler
import npu_runtime
from npu_export import resnet
from npu_export.cnn import export_cnn
from npu_runtime.metrics import compare, topk_agreement

IMAGE = 96  # the real ResNet-18 (full width); a smaller image keeps the CPU run short


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = resnet.resnet18(num_classes=1000).eval()
    with torch.no_grad():  # non-trivial BN statistics, so folding is really exercised
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.normal_(0, 0.2)
                mod.running_var.uniform_(0.5, 2.0)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.normal_(0, 0.1)
    return m


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    out = {}
    for batch in (1, 4):
        d = tmp_path_factory.mktemp(f"r18b{batch}")
        out[batch] = export_cnn(model, (batch, 3, IMAGE, IMAGE), d, "resnet18")
    return out


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("fold", [True, False], ids=["bn_fold", "no_bn_fold"])
def test_resnet18_logits(model, exported, batch, dtype, fold):
    res = exported[batch]
    prog = npu_compiler.compile(res.ir_path, "cpu", dtype=dtype, disable_passes=() if fold else ("bn_fold",))
    assert any("bn_fold(20)" == p for p in prog.passes) == fold
    be = npu_runtime.get_backend("cpu")
    ws = npu_runtime.load_weights(prog, res.weights_path, be)
    x = torch.randn(batch, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(batch))
    out = be.create_executor(prog).run_numpy({prog.inputs[0].name: x.numpy()}, ws)
    logits = next(iter(out.values()))
    with torch.no_grad():
        ref = model(x).numpy()
    assert logits.dtype == np.float32 and logits.shape == ref.shape
    np.testing.assert_array_equal(logits.argmax(-1), ref.argmax(-1))
    assert topk_agreement(logits, ref, 5) >= (1.0 if dtype == "float32" else 0.8)
    c = compare("logits", logits, ref, dtype)
    assert c.max_rel <= (1e-4 if dtype == "float32" else 2e-2), c
    assert c.passed, c


def test_bn_fold_removes_batchnorm_kernels(exported):
    res = exported[1]
    from npu_compiler.compiler import FUSION_PASSES

    folded = npu_compiler.compile(res.ir_path, "cpu", dtype="float32", disable_passes=FUSION_PASSES)
    unfolded = npu_compiler.compile(res.ir_path, "cpu", dtype="float32", disable_passes=("bn_fold", *FUSION_PASSES))
    assert len(unfolded.kernels) - len(folded.kernels) == 20  # one elementwise BN kernel per conv
    recipes = {w.recipe.kind for w in folded.weights}
    assert {"bn_fold_weight", "bn_fold_bias"} <= recipes
    # The folded bias is bound although torchvision's convs have no bias of their own.
    convs = [k for k in folded.kernels if k.kind == "conv2d"]
    assert len(convs) == 20 and all(k.spec.bias for k in convs)
