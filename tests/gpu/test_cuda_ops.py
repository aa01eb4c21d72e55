"""Op conformance on the cuda backend: every case of `cases.py` in every dtype it accepts, against PyTorch on the
same GPU (TF32 off), with the outputs poisoned before the run so that an unwritten element fails."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import npu_compiler
from npu_runtime import load_weights

from .cases import build, module_weights, op_cases
from .util import rel_err, to_np

# ‖ours − torch‖ / ‖torch‖ by dtype: (pointwise ops, accumulating ops)
TOL = {"float32": (2e-6, 2e-5), "float16": (2e-3, 4e-3), "bfloat16": (1.2e-2, 2e-2)}
CASES = op_cases()


def _params():
    return [pytest.param(c, dt, id=f"{c.name}-{dt}") for c in CASES for dt in c.dtypes]


def run_case(case, dtype, backend, use_graph=True):
    module, ir, inputs = build(case, dtype)
    program = npu_compiler.compile(ir, "cuda", dtype=dtype)
    weights = load_weights(program, module_weights(module), backend) if program.weights else None
    ex = backend.create_executor(program, use_graph=use_graph)
    ex.poison()
    feeds = {spec.name: to_np(x) for spec, x in zip(program.inputs, inputs)}
    got = ex.run_numpy(feeds, weights)
    return module, inputs, program, ex, got


@pytest.mark.parametrize("case,dtype", _params())
def test_op(case, dtype, cuda_backend) -> None:
    module, inputs, program, ex, got = run_case(case, dtype, cuda_backend)
    dev = "cpu" if case.ref_on_cpu else "cuda"
    with torch.no_grad():
        ref = module.to(dev)(*[x.to(dev) for x in inputs])
    refs = list(ref) if isinstance(ref, tuple | list) else [ref]
    assert len(refs) == len(program.outputs)
    tol = TOL[dtype][1 if case.loose else 0]
    for spec, r in zip(program.outputs, refs):
        out = got[spec.name]
        r_np = to_np(r)
        assert out.shape == r_np.shape, spec.name
        if r.dtype in (torch.int64, torch.bool):
            np.testing.assert_array_equal(out, r_np)
            continue
        err = rel_err(out, r_np)
        assert err <= tol, f"{case.name} {dtype} {spec.name}: relative error {err:.3g} > {tol:.3g}"
    # a second run (graph replay) gives the same bits
    again = ex.run_numpy({spec.name: to_np(x) for spec, x in zip(program.inputs, inputs)})
    for name, v in got.items():
        np.testing.assert_array_equal(np.asarray(again[name]), np.asarray(v))
