"""Shared fixtures: `backend` (every available runtime backend) and `check_module` (export a tiny nn.Module through
torch_ir, compile it for the backend, run it and compare with PyTorch eager under tests/tolerances.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest
import torch
import torch_ir
from tolerances import assert_close

import npu_compiler
import npu_runtime
from npu_runtime.dtypes import dtype_name

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def pytest_addoption(parser) -> None:
    parser.addoption("--npu-device", default=None, metavar="NAME",
                     help="plan every GPU program the tests compile for this chip table row (a100, h200, b200, ...: "
                          "sets $NPUSIM_DEVICE); the cuda runtime runs a plan for another device where this GPU has "
                          "every feature it assumes. Meant for tests/gpu: `pytest tests/gpu --npu-device a100`")


def pytest_configure(config) -> None:
    name = config.getoption("--npu-device")
    if name:
        import os

        from npu_compiler.devices import get_profile
        from npu_compiler.errors import NPUCompileError
        from npu_compiler.targets.codegen import DEVICE_ENV

        try:
            os.environ[DEVICE_ENV] = get_profile(name).name
        except NPUCompileError as e:
            raise pytest.UsageError(f"--npu-device: {e}") from None


def pytest_report_header(config) -> str:
    import os

    from npu_compiler.targets.codegen import DEVICE_ENV

    return f"GPU programs planned for: {os.environ.get(DEVICE_ENV) or 'the device present (else the target default)'}"


@pytest.fixture(params=npu_runtime.available_backends())
def backend(request) -> npu_runtime.Backend:
    """Each available backend in turn (CUDA, WebGPU join when their machine has the device)."""
    return npu_runtime.get_backend(request.param)


def _jsonable(value):
    """torch.dtype / torch.device / layout objects in attrs -> strings, as the IR JSON holds them."""
    if isinstance(value, torch.dtype | torch.device | torch.layout | torch.memory_format):
        return str(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def export_ir(make_module: Callable[[], torch.nn.Module], inputs: Sequence[torch.Tensor], name: str = "m") -> dict:
    """The IR dict of `make_module()` (built on the meta device) for inputs shaped like `inputs`."""
    with torch.device("meta"):
        meta = make_module().eval()
    with torch.no_grad():
        ir = torch_ir.extract_ir(meta, tuple(t.to("meta") for t in inputs), model_name=name)
    data = ir.to_dict()
    for node in data["nodes"]:
        node["attrs"] = _jsonable(node.get("attrs") or {})
    return data


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A torch tensor as NumPy in the same dtype (bf16 through ml_dtypes)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.float().numpy().astype(ml_dtypes.bfloat16)
    return t.numpy()


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def _compute_dtype(module: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> str:
    """The dtype the model computes in: its float parameters', else its first float input's, else float32."""
    for t in [*module.parameters(), *module.buffers(), *inputs]:
        if t.dtype in _FLOATS:
            return _dtype_name(t.dtype)
    return "float32"


def run_module(backend: npu_runtime.Backend, make_module: Callable[[], torch.nn.Module],
               inputs: Sequence[torch.Tensor], *, seed: int = 0) -> tuple[dict, list[np.ndarray], list[torch.Tensor]]:
    """Export, compile for `backend`, run. Returns (IR dict, outputs of the program, outputs of PyTorch eager)."""
    torch.manual_seed(seed)
    real = make_module().eval()
    ir = export_ir(make_module, inputs)
    program = npu_compiler.compile(ir, backend.compile_target(), dtype=_compute_dtype(real, inputs))
    state = {**real.state_dict(), **dict(real.named_buffers())}
    weights = npu_runtime.load_weights(program, {k: to_numpy(v) for k, v in state.items()}, backend)
    executor = backend.create_executor(program)
    names = [t["name"] for t in ir["graph_inputs"]]
    feeds = {n: to_numpy(t) for n, t in zip(names, inputs)}
    poison = getattr(executor, "poison", None)
    if poison is not None:
        poison()  # a device backend: outputs and intermediates start as NaN, so an unwritten element fails
    outs = executor.run_numpy(feeds, weights)
    if poison is not None:
        # a second run (a GPU backend replays its captured graph) gives the same bits
        again = executor.run_numpy(feeds, weights)
        for k, v in outs.items():
            assert np.asarray(again[k]).tobytes() == np.asarray(v).tobytes(), f"second run of {k} differs"
    got = [outs[t["name"]] for t in ir["graph_outputs"]]
    with torch.no_grad():
        ref = real(*[t.clone() for t in inputs])
    ref = list(ref) if isinstance(ref, tuple | list) else [ref]
    return ir, got, ref


def ir_ops(ir: dict) -> set[str]:
    """Short ATen names ("add.Tensor") of the ops in an IR dict."""
    from npu_compiler.ir.schema import short_op

    return {short_op(n["op_type"]) for n in ir["nodes"]}


INT32_RANGE_ERROR = "int32 range"  # what a backend that computes int64 in int32 says when a value leaves it


def _beyond_int32(make_module: Callable[[], torch.nn.Module], inputs: Sequence[torch.Tensor], seed: int) -> bool:
    """Does an int64 input or PyTorch output of the case lie outside int32?"""
    torch.manual_seed(seed)
    with torch.no_grad():
        ref = make_module().eval()(*[t.clone() for t in inputs])
    ref = list(ref) if isinstance(ref, tuple | list) else [ref]
    return any(t.dtype == torch.int64 and t.numel() and (t.min() < -(2**31) or t.max() >= 2**31)
               for t in [*inputs, *ref])


def check_module(backend: npu_runtime.Backend, make_module: Callable[[], torch.nn.Module],
                 inputs: Sequence[torch.Tensor], *, kind: str = "elementwise", ops: Sequence[str] = (),
                 seed: int = 0) -> dict:
    """Compile and run `make_module()` on `backend` and compare every output with PyTorch eager under the tolerance
    policy (its dtype, `kind`, the backend). `ops` are ATen ops the exported graph must contain (so a case cannot
    silently stop testing what it is named after). Returns the IR dict.

    A backend that computes int64 in int32 (capability "int64:int32": webgpu, WGSL has no 64-bit integers) must
    refuse, with its one-line error, exactly the cases whose int64 inputs or outputs leave int32; any other error,
    or a refusal of a case that fits, fails."""
    try:
        ir, got, ref = run_module(backend, make_module, inputs, seed=seed)
    except npu_runtime.NPURuntimeError as e:
        if ("int64:int32" in backend.capabilities and INT32_RANGE_ERROR in str(e)
                and _beyond_int32(make_module, inputs, seed)):
            return export_ir(make_module, inputs)
        raise
    missing = set(ops) - ir_ops(ir)
    assert not missing, f"the exported graph lacks {sorted(missing)}; it has {sorted(ir_ops(ir))}"
    assert len(got) == len(ref), f"{len(got)} outputs, PyTorch gives {len(ref)}"
    for i, (g, r) in enumerate(zip(got, ref)):
        dt = _dtype_name(r.dtype)
        expect = ir["graph_outputs"][i]["dtype"]
        assert expect.removeprefix("torch.") == dt, f"output {i}: IR says {expect}, PyTorch gives {dt}"
        gdt = dtype_name(g.dtype)
        assert gdt == dt, f"output {i}: the program returns {gdt}, PyTorch gives {dt}"
        want = r.float().numpy() if r.dtype in _FLOATS else r.numpy()
        declared = ir["graph_outputs"][i]["shape"]
        if list(want.shape) != declared and _unit_dims_apart(want.shape, declared):
            # torch 2.11's export declares an LSTM's final states with an added unit dim that eager PyTorch does not
            # give (docs/tolerances.md): the program follows the IR, holding the same elements in the same order
            assert list(g.shape) == declared, f"output {i}: the program returns {list(g.shape)}, the IR {declared}"
            want = want.reshape(declared)
        if dt in ("float32", "bfloat16") and getattr(getattr(backend, "state", None), "flushes_subnormals", False):
            # a device that flushes subnormal f32 results (WGSL allows it: docs/webgpu.md) gives signed zeros there
            want = np.where(np.abs(want) < np.finfo(np.float32).tiny, np.copysign(np.float32(0), want), want)
        assert_close(g, want, dt, kind, backend.name, what=f"output {i} {list(r.shape)}")
    return ir


def _unit_dims_apart(a: Sequence[int], b: Sequence[int]) -> bool:
    return [n for n in a if n != 1] == [n for n in b if n != 1]


@pytest.fixture
def check(backend) -> Callable[..., dict]:
    """`check(make_module, *inputs, kind=..., ops=[...])` on the parametrised backend."""

    def _check(make_module: Callable[[], torch.nn.Module], *inputs: torch.Tensor, **kwargs) -> dict:
        return check_module(backend, make_module, inputs, **kwargs)

    return _check
