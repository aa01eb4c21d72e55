"""The built-in example: export a small ResNet and a small Qwen2 with random weights, compile them, run them on
the best available backend and check them against PyTorch. The files stay in the output folder, ready for the
next commands (`describe`, `run`, `verify`, `profile`, `generate`) that `npusim demo` prints."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class DemoResult:
    name: str
    backend: str
    compute_dtype: str
    kernels: int
    seconds: float
    checks: list[tuple[str, bool, str]]
    files: dict[str, str] = field(default_factory=dict)  # what the demo wrote, by role
    dtype_reason: str = ""  # why it computes in compute_dtype (passes/dtype.py's policy, or the demo's choice)

    @property
    def passed(self) -> bool:
        return all(ok for _, ok, _ in self.checks)


DEMO_DTYPE = "float16"  # the ResNet's compute dtype: asked for, as an NPU runs a CNN (the default would keep fp32)


def demo_resnet(workdir: str, backend_name: str | None = None, batch: int = 2) -> DemoResult:
    import torch

    import npu_compiler
    import npu_runtime
    from npu_export import resnet
    from npu_export.cnn import export_cnn
    from npu_runtime.metrics import compare

    torch.manual_seed(0)
    model = resnet.resnet18(num_classes=100, width=16).eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics, so the fold is exercised
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    shape = (batch, 3, 64, 64)
    res = export_cnn(model, shape, workdir, "resnet18_small")
    backend = npu_runtime.get_backend(backend_name)
    t0 = time.perf_counter()
    # fp16, as an NPU runs a CNN (auto would keep this fp32 model in fp32)
    prog = npu_compiler.compile(res.ir_path, backend.compile_target(), dtype=DEMO_DTYPE)
    artifact = os.path.join(workdir, "resnet18_small.npubin")
    prog.save(artifact)
    ws = npu_runtime.load_weights(prog, res.weights_path, backend)
    x = torch.randn(shape)
    out = backend.create_executor(prog).run_numpy({prog.inputs[0].name: x.numpy()}, ws)
    dt = time.perf_counter() - t0
    with torch.no_grad():
        ref = model(x).numpy()
    logits = next(iter(out.values()))
    c = compare("logits", logits, ref, prog.compute_dtype, class_axis=True)
    top1 = float(np.mean(logits.argmax(-1) == ref.argmax(-1)))
    checks = [("logits within fp16 tolerance", c.passed, f"max_rel {c.max_rel:.2e}, pearson {c.pearson:.6f}"),
              ("top-1 equal", top1 == 1.0, f"{top1:.2f}"),
              ("top-5 agreement >= 0.8", (c.top5_overlap or 0) >= 0.8, f"{c.top5_overlap:.2f}")]
    files = {"ir": str(res.ir_path), "weights": str(res.weights_path), "artifact": artifact}
    return DemoResult("ResNet-18 (width 16, 64x64)", backend.name, prog.compute_dtype, len(prog.kernels), dt, checks,
                      files, f"{DEMO_DTYPE}: asked for, as an NPU computes a CNN; without --dtype npusim keeps this "
                             "float32 model in float32")


def demo_qwen2(workdir: str, backend_name: str | None = None, decode_steps: int = 4) -> DemoResult:
    """A tiny Qwen2 with random weights, written as an `export-llm --random-weights` folder (which `npusim generate`
    runs), checked step by step (prefill, then decode) against torch_ir.IRExecutor."""
    import json

    import torch
    from transformers import Qwen2ForCausalLM

    import npu_runtime
    from npu_compiler.program import CompiledProgram
    from npu_export._quiet import no_hf_progress
    from npu_export.llm_export import export_llm
    from npu_export.qwen2 import make_additive_mask
    from npu_export.reference import run_reference
    from npu_runtime.dtypes import np_dtype
    from npu_runtime.metrics import compare

    backend = npu_runtime.get_backend(backend_name)
    L, P = 32, 8
    exp = export_llm(workdir, config="tiny", max_cache_len=L, prefill_len=P, dtype="bfloat16",
                     target=backend.compile_target(), random_weights=True)
    files = exp.manifest["files"]
    cm = json.loads((exp.out_dir / files["cache_map"]).read_text())
    with no_hf_progress():
        model = Qwen2ForCausalLM.from_pretrained(exp.out_dir, dtype=torch.bfloat16).eval()
    cfg = model.config
    t0 = time.perf_counter()
    progs = {k: CompiledProgram.load(exp.out_dir / files[k]) for k in ("prefill", "decode")}
    ir_paths = {k: exp.out_dir / files[f"{k}_ir"] for k in ("prefill", "decode")}
    ws = {k: npu_runtime.load_weights(p, exp.out_dir, backend) for k, p in progs.items()}
    execs = {k: backend.create_executor(p) for k, p in progs.items()}
    dt_name = cm["cache"]["dtype"]
    cache = {}
    for layer in cm["graphs"]["prefill"]["layers"]:
        for kv in ("k", "v"):
            cache[layer[f"{kv}_input"]] = np.zeros(cm["cache"]["shape"], np_dtype(dt_name))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, size=P + decode_steps)
    checks = []
    kernels = 0
    # A checkpoint holds no rotary inv_freq and, tied, no lm_head: hand the reference what the runtime derived.
    sd_ref = _reference_state_dict(model)
    pos = 0
    for step in range(1 + decode_steps):
        kind = "prefill" if step == 0 else "decode"
        g = cm["graphs"][kind]
        T = g["seq_len"]
        ids = tokens[pos:pos + T].reshape(1, T).astype(np.int64)
        positions = np.arange(pos, pos + T, dtype=np.int64)
        mask = make_additive_mask(pos + T, T, L, getattr(torch, dt_name)).float().numpy().astype(np_dtype(dt_name))
        inputs = {g["inputs"]["input_ids"]: ids, g["inputs"]["position_ids"]: positions.reshape(1, T),
                  g["inputs"]["cache_position"]: positions, g["inputs"]["attention_mask"]: mask}
        for layer in g["layers"]:
            inputs[layer["k_input"]] = cache[cm["graphs"]["prefill"]["layers"][layer["layer"]]["k_input"]]
            inputs[layer["v_input"]] = cache[cm["graphs"]["prefill"]["layers"][layer["layer"]]["v_input"]]
        out = execs[kind].run_numpy(inputs, ws[kind])
        ref = run_reference(ir_paths[kind], sd_ref, inputs)
        lg = g["outputs"]["logits"]
        c = compare("logits", out[lg], ref[lg], progs[kind].compute_dtype, class_axis=True)
        checks.append((f"{kind} step {step} logits", c.passed and (c.pearson or 0.0) >= 0.999,
                       f"pearson {c.pearson:.5f}, max_rel {c.max_rel:.2e}"))
        for layer, pl in zip(g["layers"], cm["graphs"]["prefill"]["layers"]):
            cache[pl["k_input"]] = out[layer["k_output"]]
            cache[pl["v_input"]] = out[layer["v_output"]]
        kernels = len(progs["decode"].kernels)
        pos += T
    dt = time.perf_counter() - t0
    return DemoResult("Qwen2 tiny (2 layers, bf16, prefill + decode)", backend.name, progs["decode"].compute_dtype,
                      kernels, dt, checks, {"llm": str(exp.out_dir)},
                      str(progs["decode"].stats.get("compute_dtype_reason", "")))


def _reference_state_dict(model) -> dict:
    sd = {**model.state_dict(), **dict(model.named_buffers())}
    return {k: v.to(__import__("torch").bfloat16) if v.is_floating_point() and "inv_freq" not in k else v
            for k, v in sd.items()}


def run_demo(backend_name: str | None = None, workdir: str = "npusim-demo") -> list[DemoResult]:
    return [demo_resnet(os.path.join(workdir, "resnet18"), backend_name),
            demo_qwen2(os.path.join(workdir, "qwen2-tiny"), backend_name)]


def next_steps(results: list[DemoResult]) -> list[str]:
    """The commands to try on what the demo wrote."""
    r, q = results[0].files, results[1].files
    be = results[0].backend
    opt = "" if be == "cpu" else f" --backend {be}"
    return [
        f"npusim describe {r['artifact']}",
        f"npusim run {r['artifact']} --weights {r['weights']} --top-k 5{opt}",
        f"npusim verify {r['ir']} --weights {r['weights']} --dtype {results[0].compute_dtype} --per-node --backend cpu",
        f"npusim profile {r['artifact']} --weights {r['weights']}{opt}",
        f"npusim generate {q['llm']} --prompt \"Hello\" --max-new-tokens 16{opt}",
        "npusim export MODULE:FACTORY --input-shape 1,3,224,224 -o out   (your own model: "
        "docs/compile-your-own-model.md)",
    ]
