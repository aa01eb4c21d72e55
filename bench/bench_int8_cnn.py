"""ResNet int8 inference: ours on the integer kernels against ours in fp16 and PyTorch fp16 (eager and
torch.compile, channels-last), in one process on one GPU.

The model (random weights, BatchNorm statistics perturbed as `npu_export.resnet` makes them) is quantized by
`npu_quant` (int8 weights per channel, activations per tensor, min-max over `--calibration` random images at batch
1); the same scales quantize the graph of every batch size. Roof: the model's int8 MACs at the int8 GEMM rate
measured in the same process: the better of `torch._int_mm` (cuBLAS) and our own qgemm kernel, each the best of five
medians of 20 products of 8192 x 8192 x 8192 (a rate above it prints as "> roof"). Our int8
output at batch 1 is checked bit for bit against the CPU reference's (the spec of the integer kernels; exit status 1
if not)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_llm import _median_ms, print_profile  # noqa: E402

ROOF_N = 8192  # the square int8 GEMM whose rate is the roof


def int8_tops(device: str) -> float:
    """The int8 GEMM rate (TOPS) of torch._int_mm (cuBLAS) on ROOF_N-square int8 matrices (best of five medians)."""
    if device != "cuda" or not hasattr(torch, "_int_mm"):
        return float("nan")
    n = ROOF_N
    a = torch.randint(-128, 127, (n, n), dtype=torch.int8, device="cuda")
    b = torch.randint(-128, 127, (n, n), dtype=torch.int8, device="cuda")
    ms = min(_median_ms(lambda: torch._int_mm(a, b), torch.cuda.synchronize, 20) for _ in range(5))
    return 2 * n**3 / (ms * 1e-3) / 1e12


def our_qgemm_tops(backend) -> float:
    """The int8 GEMM rate (TOPS) of our own qgemm kernel on ROOF_N-square operands (requantized to int8; best of
    five medians): cuBLAS's _int_mm does not reach the tensor cores' rate on every GPU (128 TOPS on the H200)."""
    from npu_compiler.buffers import BufferSpec, TensorSpec
    from npu_compiler.kernels import KernelCall, QGemmKernel, Requant
    from npu_compiler.program import CompiledProgram
    from npu_compiler.tensor import TensorRef

    n = ROOF_N
    spec = QGemmKernel(n, n, n, (), 0, 0, False, 1, Requant())
    shapes = [("a", (n, n), "int8"), ("w", (n, n), "int8"), ("scale", (1, 2), "int32")]
    buffers = [BufferSpec(i, name, "input", dt, n * n if name != "scale" else 2) for i, (name, _, dt) in
               enumerate(shapes)] + [BufferSpec(3, "out", "output", "int8", n * n)]
    refs = [TensorRef(0, (n, n), (n, 1)), TensorRef(1, (n, n), (1, n)), TensorRef(2, (1, 2), (2, 1))]
    call = KernelCall("k0_qgemm", spec, refs, [TensorRef(3, (n, n), (n, 1))], nodes=["roof"])
    program = CompiledProgram("int8 roof", backend.compile_target(), "float32", {},
                              [TensorSpec(name, shape, dt, dt, i) for i, (name, shape, dt) in enumerate(shapes)],
                              [TensorSpec("out", (n, n), "int8", "int8", 3)], [], buffers, [call], 0)
    ex = backend.create_executor(program)
    rng = np.random.default_rng(0)
    feeds = {"a": rng.integers(-128, 128, (n, n), dtype=np.int8), "w": rng.integers(-128, 128, (n, n), dtype=np.int8),
             "scale": np.array([[1 << 30, 40]], np.int32)}
    feeds = {k: backend.upload(v, str(v.dtype)) for k, v in feeds.items()}
    ex.run(feeds)
    ms = min(_median_ms(lambda: ex.run(feeds), backend.synchronize, 20) for _ in range(5))
    return 2 * n**3 / (ms * 1e-3) / 1e12


def _ir(model_name: str, batch: int, size: int) -> dict:
    import torch_ir

    from npu_export import resnet
    from npu_export.ir_io import ir_to_dict

    with torch.device("meta"):
        m = getattr(resnet, model_name)().eval()
        x = torch.randn(batch, 3, size, size)
    with torch.no_grad():
        return ir_to_dict(torch_ir.extract_ir(m, (x,), model_name=model_name))


def _int8_macs(program) -> int:
    from npu_compiler.kernels import conv_flops

    total = 0
    for k in program.kernels:
        if k.kind == "qconv2d":
            total += conv_flops(k.outs[0].numel, *k.args[1].shape[1:]) // 2
        elif k.kind == "qgemm":
            total += k.spec.m * k.spec.n * k.spec.k
    return total


def _timed(backend, prog, weights, x: np.ndarray, iters: int, profile: tuple[str, int] | None = None
           ) -> tuple[float, np.ndarray]:
    """The median time of a run and the output; with `profile` (title, N) also the N slowest kernels printed."""
    import npu_runtime

    ws = npu_runtime.load_weights(prog, weights, backend)
    ex = backend.create_executor(prog)
    spec, out_spec = prog.inputs[0], prog.outputs[0]
    feeds = {spec.name: backend.upload(x, spec.device_dtype)}
    out = ex.run(feeds, ws)[out_spec.name].to_numpy(out_spec).astype(np.float32)
    ms = _median_ms(lambda: ex.run(feeds, ws), backend.synchronize, iters)
    if profile and profile[1]:
        print_profile(profile[0], prog, backend.name, lambda: ex.profile(feeds, ws), profile[1])
    return ms, out


def _of_roof(fraction: float) -> str:
    """A fraction of the roof; above it the roof was not the device's rate: said so, not printed over 100%."""
    if fraction != fraction:
        return "nan"
    return f"{fraction:.1%}" if fraction <= 1 else "> roof"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--calibration", type=int, default=2, help="random calibration images (batch 1)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--backend", default=None, help="the backend that runs ours (default: the best available)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also print the N slowest kernels of our int8 and fp16 programs (per-kernel device time, "
                         "5 runs)")
    args = ap.parse_args(argv)

    import npu_compiler
    import npu_runtime
    from npu_export import resnet
    from npu_export.cnn import model_tensors
    from npu_quant import rewrite
    from npu_quant.flow import quantize
    from npu_quant.samples import random_samples
    from npu_runtime.cpu.backend import CpuBackend

    backend = npu_runtime.get_backend(args.backend)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.manual_seed(0)
    model = getattr(resnet, args.model)().eval()
    weights = model_tensors(model)
    ir1 = _ir(args.model, 1, args.image_size)
    specs = npu_compiler.compile(ir1, "cpu", dtype="float32").inputs
    q = quantize(ir1, weights, random_samples(specs, args.calibration))
    peer = model.half().to(device).to(memory_format=torch.channels_last)
    compiled = None if args.no_compile or device != "cuda" else torch.compile(peer, mode="reduce-overhead")
    # the roof: the best int8 GEMM rate measured here, cuBLAS's or our own kernel's
    peak = max(int8_tops(device), our_qgemm_tops(backend)) if device == "cuda" and backend.name == "cuda" \
        else int8_tops(device)
    rows, exact = [], None
    for batch in [int(b) for b in args.batches.split(",")]:
        ir = _ir(args.model, batch, args.image_size)
        qir, qweights = rewrite.apply(ir, weights, rewrite.plan(ir), q.qparams)
        qprog = npu_compiler.compile(qir, backend.compile_target())
        fprog = npu_compiler.compile(ir, backend.compile_target(), dtype="float16")
        x = torch.randn(batch, 3, args.image_size, args.image_size)
        int8_ms, got = _timed(backend, qprog, qweights, x.numpy(), args.iters,
                              (f"{args.model} int8 batch {batch}", args.profile))
        fp16_ms, _ = _timed(backend, fprog, weights, x.numpy(), args.iters,
                            (f"{args.model} fp16 batch {batch}", args.profile))
        if batch == 1:
            cpu = CpuBackend()
            cprog = npu_compiler.compile(qir, "cpu")
            _, want = _timed(cpu, cprog, qweights, x.numpy(), 1)
            exact = bool(np.array_equal(got, want))
        xt = x.half().to(device).to(memory_format=torch.channels_last)
        with torch.no_grad():
            eager = _median_ms(lambda xt=xt: peer(xt), sync, args.iters)
            comp = float("nan")
            if compiled is not None:
                for _ in range(3):
                    compiled(xt)
                comp = _median_ms(lambda xt=xt: compiled(xt), sync, args.iters)
        macs = _int8_macs(qprog)
        integer = sum(k.kind in ("qconv2d", "qgemm", "qadd") for k in qprog.kernels)
        rows.append({"batch": batch, "kernels": len(qprog.kernels), "integer_kernels": integer, "int8_ms": int8_ms,
                     "fp16_ms": fp16_ms, "eager_ms": eager, "compile_ms": comp,
                     "int8_img_s": batch / int8_ms * 1e3, "fp16_img_s": batch / fp16_ms * 1e3,
                     "x_fp16": fp16_ms / int8_ms, "x_eager": eager / int8_ms, "x_compile": comp / int8_ms,
                     "tops": 2 * macs / (int8_ms * 1e-3) / 1e12,
                     "fraction_of_peak": 2 * macs / (int8_ms * 1e-3) / 1e12 / peak})
    print(f"{args.model} int8 {args.image_size}px on {backend.name}: int8 GEMM roof measured {peak:.0f} TOPS (the "
          f"best of torch._int_mm and our qgemm, {ROOF_N}^3); calibrated on {args.calibration} random images")
    print(f"{'batch':>5} {'kernels':>8} {'int8 ms':>9} {'fp16 ms':>9} {'eager ms':>9} {'compile ms':>11} "
          f"{'int8 img/s':>11} {'fp16 img/s':>11} {'x fp16':>7} {'x eager':>8} {'x compile':>10} {'TOPS':>7} "
          f"{'of peak':>8}")
    for r in rows:
        print(f"{r['batch']:>5} {r['integer_kernels']:>3}/{r['kernels']:<4} {r['int8_ms']:>9.3f} {r['fp16_ms']:>9.3f} "
              f"{r['eager_ms']:>9.3f} {r['compile_ms']:>11.3f} {r['int8_img_s']:>11.0f} {r['fp16_img_s']:>11.0f} "
              f"{r['x_fp16']:>7.2f} {r['x_eager']:>8.2f} {r['x_compile']:>10.2f} {r['tops']:>7.1f} "
              f"{_of_roof(r['fraction_of_peak']):>8}")
    if exact is not None:
        print(f"batch 1: our int8 output {'equals' if exact else 'DIFFERS FROM'} the CPU reference's bit for bit")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "backend": backend.name, "int8_tops": peak, "bit_exact": exact,
                       "rows": rows}, f, indent=1)
    return 0 if exact in (None, True) else 1


if __name__ == "__main__":
    raise SystemExit(main())
