"""A partitioned artifact on webgpu: compiled for webgpu with CPU segments of both kinds (the CPU reference's
programs and torch_ir's nodes), written, read back and run, against PyTorch."""

from __future__ import annotations

import numpy as np
import partitioned_cases as pc

import npu_compiler
from npu_compiler.partition import REFERENCE, TARGET, TORCH
from npu_runtime.dag_executor import DAGExecutor


def test_partitioned_artifact_round_trips_and_matches_torch(webgpu, tmp_path) -> None:
    model, ir, sd, x = pc.make()
    art = pc.artifact(ir, "webgpu")
    art.save(tmp_path / "chain.npubin")
    back = npu_compiler.load_artifact(tmp_path / "chain.npubin")
    assert back.to_bytes() == art.to_bytes()
    targets = {s.runner: {s.program.target} for s in back.segments if s.program is not None}
    assert targets == {TARGET: {"webgpu"}, REFERENCE: {"cpu"}}
    assert any(s.runner == TORCH for s in back.segments)
    ex = DAGExecutor(back, webgpu, weights=sd)
    out = ex.run({"x": x})
    pc.check(out, ir, pc.reference(model, x), "webgpu")
    assert ex.num_transfers == len(back.transfers) > 0
    again = ex.run({"x": x})  # a second run reuses everything built and uploaded in __init__
    for k in out:
        np.testing.assert_array_equal(out[k], again[k])


def test_llm_on_partitioned_programs(webgpu, tmp_path) -> None:
    """An export-llm folder for webgpu whose programs are partitioned (the MLP's SiLU on the CPU reference, the cache
    writes through torch_ir) gives the plain programs' logits: the cache buffers bound on the device, the writes made
    on the host copied into them after each step."""
    import json
    import shutil

    from npu_export.llm_export import export_llm
    from npu_runtime.llm import LLM

    plain = tmp_path / "plain"
    export_llm(plain, config="tiny", random_weights=True, max_cache_len=16, prefill_len=4, dtype="float32",
               target="webgpu")
    parts = tmp_path / "parts"
    shutil.copytree(plain, parts)
    theta = json.loads((plain / "cache_map.json").read_text())["rope"]["theta"]
    for kind in ("prefill", "decode"):
        npu_compiler.compile_artifact(plain / f"{kind}.json", "webgpu", dtype="float32", force_cpu=["silu"],
                                      force_torch=["index_copy"], rope_theta=theta).save(parts / f"{kind}.npubin")
    a, b = LLM.load(plain, webgpu), LLM.load(parts, webgpu)
    prompt = [3, 14, 15, 9, 2, 6]
    np.testing.assert_allclose(b.prefill(prompt)[0], a.prefill(prompt)[0], atol=1e-4, rtol=1e-4)
    for pos, tok in enumerate([7, 9], start=len(prompt)):
        np.testing.assert_allclose(b.decode_step(tok, pos), a.decode_step(tok, pos), atol=1e-4, rtol=1e-4)
