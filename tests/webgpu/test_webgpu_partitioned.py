"""A partitioned artifact on webgpu: compiled for webgpu with CPU segments of both kinds (the CPU reference's
programs and torch_ir's nodes), written, read back and run, against PyTorch."""

from __future__ import annotations

import numpy as np
import partitioned_cases as pc


def test_partitioned_artifact_round_trips_and_matches_torch(webgpu, tmp_path) -> None:
    ex, x = pc.round_trip(tmp_path, webgpu)
    out = ex.host_outputs()
    again = ex.run({"x": x})  # a second run reuses everything built and uploaded in __init__
    for k in out:
        np.testing.assert_array_equal(out[k], again[k])


def test_llm_on_partitioned_programs(webgpu, tmp_path) -> None:
    """An export-llm folder for webgpu whose programs are partitioned (the MLP's SiLU on the CPU reference, the cache
    writes through torch_ir) gives the plain programs' logits: the cache buffers bound on the device, the writes made
    on the host copied into them after each step."""
    from npu_runtime.llm import LLM

    plain, parts = pc.llm_folders(tmp_path, "webgpu", cache_len=16, prefill_len=4)
    pc.same_logits(LLM.load(plain, webgpu), LLM.load(parts, webgpu), [3, 14, 15, 9, 2, 6], [7, 9])
