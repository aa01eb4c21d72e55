"""The cuda backend's buffers, registry entry and error paths."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
import torch
from fused_cases import build, op_cases

import npu_compiler
import npu_runtime
from npu_runtime.errors import InputError, NPURuntimeError


def test_registry_prefers_cuda() -> None:
    assert "cuda" in npu_runtime.available_backends()
    if not os.environ.get(npu_runtime.backend.ENV_VAR):
        assert npu_runtime.backend.default_backend_name() == "cuda"
    assert npu_runtime.get_backend("cuda").compile_target() == "cuda"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64", "int32", "bool", "uint8"])
def test_upload_round_trip(dtype, cuda_backend) -> None:
    rng = np.random.default_rng(0)
    host = rng.standard_normal((3, 5, 7)) * 10
    np_dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    arr = host.astype(np_dt)
    buf = cuda_backend.upload(arr, dtype)
    assert buf.shape == (3, 5, 7) and buf.dtype == dtype
    np.testing.assert_array_equal(buf.to_numpy().astype(np.float64), arr.astype(np.float64))
    z = cuda_backend.zeros((4, 4), dtype)
    assert not z.to_numpy().astype(np.float64).any()


@pytest.mark.parametrize("dtype", ["bfloat16", "int64"])
def test_read_later_reads_what_was_queued_before_it(dtype, cuda_backend) -> None:
    np_dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    first = (np.arange(4096) % 251).astype(np_dt).reshape(64, 64)
    buf = cuda_backend.upload(first, dtype)
    read = buf.read_later()
    # overwritten by work queued after the read: what comes back is still the value before it
    with cuda_backend.state.device, cuda_backend.state.stream:
        buf.array[...] = buf.array[::-1].copy()
    got = read()
    assert got.dtype == np_dt and got.shape == (64, 64)
    np.testing.assert_array_equal(got, first)
    np.testing.assert_array_equal(buf.to_numpy(), first[::-1])


@pytest.mark.parametrize("vocab,dtype", [(151936, "bfloat16"), (4096, "float32"), (997, "float16")])
def test_greedy_argmax_is_torch_argmax(vocab, dtype, cuda_backend) -> None:
    """The greedy step's argmax on the device (1,187 chunk blocks for Qwen2's vocabulary, then one) against
    torch.argmax."""
    from helpers import check_greedy_argmax

    check_greedy_argmax(cuda_backend, vocab, dtype)


def test_input_errors(cuda_backend) -> None:
    case = next(c for c in op_cases() if c.name == "embedding")
    module, ir, inputs = build(case, "float32")
    program = npu_compiler.compile(ir, "cuda", dtype="float32")
    weights = npu_runtime.load_weights(program, {k: v for k, v in module.state_dict().items()}, cuda_backend)
    ex = cuda_backend.create_executor(program)
    name = program.inputs[0].name
    with pytest.raises(InputError, match="out of range"):
        ex.run({name: np.full((2, 7), 50, np.int64)}, weights)
    with pytest.raises(InputError, match="expected shape"):
        ex.run({name: np.zeros((2, 6), np.int64)}, weights)
    # a device buffer as input: no host round trip
    ids = cuda_backend.upload(inputs[0].numpy(), "int64")
    out = ex.run_numpy({name: ids}, weights)[program.outputs[0].name]
    np.testing.assert_array_equal(out, module(inputs[0]).detach().numpy())
    cpu_program = npu_compiler.compile(ir, "cpu", dtype="float32")
    with pytest.raises(NPURuntimeError, match="target 'cuda'"):
        cuda_backend.create_executor(cpu_program)
    assert torch.cuda.is_available()
    # a bound buffer off the 16-byte grid (a view one element into a larger array): refused, naming the input, as
    # kernels load 16 bytes at a time; one of its own binds
    from npu_runtime.cuda.backend import CudaBuffer

    whole = cuda_backend.upload(np.zeros(1 + 2 * 7, np.int64), "int64")
    view = CudaBuffer(whole.array[1:].reshape(2, 7), "int64", cuda_backend.state)
    with pytest.raises(NPURuntimeError, match=f"cannot bind '{name}': its device address is not 16-byte aligned"):
        ex.bind_buffers({name: view})
    ex.bind_buffers({name: cuda_backend.upload(inputs[0].numpy(), "int64")})
    out = ex.run_numpy({}, weights)[program.outputs[0].name]
    np.testing.assert_array_equal(out, module(inputs[0]).detach().numpy())


def test_profile_times_every_kernel_with_cuda_events(cuda_backend, tmp_path, capsys) -> None:
    """`Executor.profile` on cuda: one timing per kernel from CUDA events; `npusim profile` writes a trace with one
    event per kernel launch."""
    import json

    from npu_export import resnet
    from npu_export.cnn import export_cnn
    from npusim.cli import main

    torch.manual_seed(0)
    res = export_cnn(resnet.resnet18(num_classes=10, width=16).eval(), (1, 3, 64, 64), tmp_path, "r18")
    art = tmp_path / "r18.npubin"
    assert main(["compile", str(res.ir_path), "-o", str(art), "--target", "cuda"]) == 0
    prog = npu_compiler.CompiledProgram.load(art)
    ws = npu_runtime.load_weights(prog, res.weights_path, cuda_backend)
    ex = cuda_backend.create_executor(prog)
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    timings = ex.profile({prog.inputs[0].name: x}, ws)
    assert [t.index for t in timings] == list(range(len(prog.kernels)))
    assert all(t.dur_s > 0 for t in timings)
    assert all(a.start_s <= b.start_s for a, b in zip(timings, timings[1:]))
    # the profiled run computes the same outputs as a graph run
    profiled = {k: v.to_numpy() for k, v in ex.outputs().items()}
    plain = {k: v.to_numpy() for k, v in ex.run({prog.inputs[0].name: x}, ws).items()}
    for k in plain:
        np.testing.assert_array_equal(profiled[k], plain[k])
    trace = tmp_path / "trace.json"
    assert main(["profile", str(art), "--weights", str(res.weights_path), "--backend", "cuda", "--iters", "3",
                 "--trace", str(trace)]) == 0
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    assert len(events) == 3 * len(prog.kernels)
    print(capsys.readouterr().out.splitlines()[0])


def test_merged_launch_computes_every_part(cuda_backend) -> None:
    """Small independent elementwise kernels launched as one (targets/cuda/merge.py) against PyTorch: every part
    over its own blocks, and the kernel after them reading their results."""
    from fused_cases import ir_dict
    from helpers import ThreeSmallOps
    from tolerances import assert_close

    args = [torch.randn(64, 1000), torch.randn(64, 1000), torch.randn(64, 1000)]
    program = npu_compiler.compile(ir_dict(ThreeSmallOps(), args, "three"), "cuda", dtype="float32",
                                   disable_passes=["elementwise_fusion"])
    ex = cuda_backend.create_executor(program)
    assert ex.rendered.merged_into, "no kernels were merged"
    got = ex.run_numpy({s.name: a.numpy() for s, a in zip(program.inputs, args, strict=True)})
    for spec, want in zip(program.outputs, ThreeSmallOps()(*args), strict=True):
        assert_close(got[spec.name], want.numpy(), "float32", "elementwise", "cuda", what=spec.name)


def test_run_reports_the_device_time_beside_the_latency(cuda_backend, tmp_path, capsys) -> None:
    """`npusim run` on cuda: the device time (CUDA events around the graph's launches, inputs already on the device)
    beside the host-to-host latency, which adds the transfers and the host's work and so is the longer; the runs it
    times compute what a plain run does."""
    import json

    from npu_export import resnet
    from npu_export.cnn import export_cnn
    from npusim.cli import main

    torch.manual_seed(0)
    res = export_cnn(resnet.resnet18(num_classes=10, width=16).eval(), (1, 3, 64, 64), tmp_path, "r18")
    art = tmp_path / "r18.npubin"
    assert main(["compile", str(res.ir_path), "-o", str(art), "--target", "cuda"]) == 0
    capsys.readouterr()  # compile's report: only run's JSON is read below
    assert main(["run", str(art), "--weights", str(res.weights_path), "--backend", "cuda", "--iters", "20",
                 "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    lat, dev = rep["timing"], rep["device_timing"]
    assert dev["runs"] == 20 and 0 < dev["min_s"] <= dev["median_s"] <= dev["max_s"]
    assert dev["median_s"] < lat["median_s"], (dev, lat)
    prog = npu_compiler.CompiledProgram.load(art)
    ws = npu_runtime.load_weights(prog, res.weights_path, cuda_backend)
    ex = cuda_backend.create_executor(prog)
    x = {prog.inputs[0].name: np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)}
    secs = ex.device_seconds(x, ws, 3)
    assert len(secs) == 3 and all(s > 0 for s in secs)
    timed = {k: v.to_numpy() for k, v in ex.outputs().items()}
    plain = {k: v.to_numpy() for k, v in ex.run(x, ws).items()}
    for k in plain:
        np.testing.assert_array_equal(timed[k], plain[k])
    print(f"resnet-18 (width 16, 64x64) on cuda: latency median {lat['median_s'] * 1e3:.3f} ms, device time median "
          f"{dev['median_s'] * 1e3:.3f} ms")
