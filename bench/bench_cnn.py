"""ResNet fp16 inference: ours against PyTorch eager (channels-last) and torch.compile (reduce-overhead), in one
process on one GPU. Prints median latency, images/s, ratios, and the fraction of the compute roof reached (model
FLOPs over the fp16 GEMM rate measured in the same process), and checks our output against PyTorch eager's for the
same input under the fp16 model tolerance (exit status 1 if it fails).

    python bench/bench_cnn.py [--model resnet50] [--batches 1,64] [--json out]
    python bench/bench_cnn.py --backends cuda,webgpu    # ours on each backend, beside the same peers
    python bench/bench_cnn.py --disable conv_tensor_cores  # ours with a pass or lowering choice switched off
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from bench_llm import _median_ms, limit_ms, print_profile


def gemm_tflops(device: str) -> float:
    if device != "cuda":
        return float("nan")
    a = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    ms = limit_ms(lambda: a @ a, torch.cuda.synchronize)
    return 2 * 8192**3 / (ms * 1e-3) / 1e12


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--backends", default=None,
                    help="comma-separated backends to run ours on (default: the best available one)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--disable", default="", metavar="PASSES",
                    help="comma-separated compiler passes or lowering choices to switch off (as `npusim compile "
                         "--disable-pass`), e.g. conv_tensor_cores: the convs as cuBLAS GEMMs (k x k through im2col)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also print the N slowest kernels of our program (per-kernel device time, 5 runs)")
    args = ap.parse_args(argv)

    import torch_ir

    import npu_compiler
    import npu_runtime
    from npu_export import resnet
    from npu_export.cnn import model_tensors
    from npu_export.ir_io import ir_to_dict
    from npu_runtime.metrics import compare

    backends = [npu_runtime.get_backend(n) for n in (args.backends.split(",") if args.backends else [None])]
    # the peers run on the GPU wherever PyTorch has one, whichever backend runs ours
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.manual_seed(0)
    model = getattr(resnet, args.model)().eval()
    tensors = model_tensors(model)
    peer = model.half().to(device).to(memory_format=torch.channels_last)
    compiled = None if args.no_compile or device != "cuda" else torch.compile(peer, mode="reduce-overhead")
    peak = gemm_tflops(device)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        shape = (batch, 3, args.image_size, args.image_size)
        with torch.device("meta"):
            m = getattr(resnet, args.model)().eval()
            x_meta = torch.randn(shape)
        with torch.no_grad():
            ir = ir_to_dict(torch_ir.extract_ir(m, (x_meta,), model_name=args.model))
        x = torch.randn(shape)
        ours, kernels, got = {}, {}, {}
        for backend in backends:
            prog = npu_compiler.compile(ir, backend.compile_target(), dtype="float16",
                                        disable_passes=[p for p in args.disable.split(",") if p])
            flops = sum(_conv_gemm_flops(k) for k in prog.kernels)
            ws = npu_runtime.load_weights(prog, tensors, backend)
            ex = backend.create_executor(prog)
            # The input lives on the device for every contender (the peers get a CUDA tensor): upload it once in
            # the program's device dtype; each run then copies it device-to-device.
            spec = prog.inputs[0]
            feeds = {spec.name: backend.upload(x.numpy(), spec.device_dtype)}
            out_spec = prog.outputs[0]
            got[backend.name] = ex.run(feeds, ws)[out_spec.name].to_numpy(out_spec).astype(np.float32)
            ours[backend.name] = _median_ms(lambda ex=ex, feeds=feeds, ws=ws: ex.run(feeds, ws), backend.synchronize,
                                            args.iters)
            kernels[backend.name] = len(prog.kernels)
            if args.profile:
                print_profile(f"{args.model} batch {batch}", prog, backend.name,
                              lambda ex=ex, feeds=feeds, ws=ws: ex.profile(feeds, ws), args.profile)
        xt = x.half().to(device).to(memory_format=torch.channels_last)
        with torch.no_grad():
            ref = peer(xt).float().cpu().numpy()
            eager = _median_ms(lambda xt=xt: peer(xt), sync, args.iters)
            comp = float("nan")
            if compiled is not None:
                for _ in range(3):
                    compiled(xt)
                comp = _median_ms(lambda xt=xt: compiled(xt), sync, args.iters)
        for name, ms in ours.items():
            check = compare("logits", got[name], ref, "float16")
            rows.append({"backend": name, "batch": batch, "kernels": kernels[name], "ours_ms": ms,
                         "max_rel": check.max_rel, "pearson": check.pearson, "check_passed": bool(check.passed),
                         "eager_ms": eager, "compile_ms": comp, "ours_img_s": batch / ms * 1e3, "vs_eager": eager / ms,
                         "vs_compile": comp / ms, "tflops": flops / (ms * 1e-3) / 1e12,
                         "fraction_of_peak": flops / (ms * 1e-3) / 1e12 / peak})
    print(f"{args.model} fp16 {args.image_size}px: fp16 GEMM rate measured {peak:.0f} TFLOP/s")
    for backend in backends:
        if backend.describe():
            print(f"  {backend.name}: {backend.describe()}")
    print(f"{'backend':>8} {'batch':>5} {'kernels':>7} {'ours ms':>9} {'eager ms':>9} {'compile ms':>11} {'img/s':>9} "
          f"{'x eager':>8} {'x compile':>10} {'TFLOP/s':>8} {'of peak':>8} {'vs eager: max_rel':>18}")
    for r in rows:
        verdict = "ok" if r["check_passed"] else "FAILED"
        print(f"{r['backend']:>8} {r['batch']:>5} {r['kernels']:>7} {r['ours_ms']:>9.3f} {r['eager_ms']:>9.3f} "
              f"{r['compile_ms']:>11.3f} {r['ours_img_s']:>9.0f} {r['vs_eager']:>8.2f} {r['vs_compile']:>10.2f} "
              f"{r['tflops']:>8.1f} {r['fraction_of_peak']:>8.1%} {r['max_rel']:>11.2e} {verdict:>6}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "backends": [b.name for b in backends], "gemm_tflops": peak,
                       "rows": rows}, f, indent=1)
    failed = [f"{r['backend']} batch {r['batch']}" for r in rows if not r["check_passed"]]
    if failed:
        print(f"our output differs from PyTorch eager's beyond the fp16 model tolerance: {', '.join(failed)}")
        return 1
    return 0


def _conv_gemm_flops(k) -> int:
    """2 x multiply-adds of convs and GEMMs (what the compute roof is about): their kernels' own cost models."""
    from npu_compiler.kernels import conv_flops, gemm_flops

    if k.kind == "conv2d":
        return conv_flops(k.outs[0].numel, *k.args[1].shape[1:])
    if k.kind == "gemm":
        return gemm_flops(k.spec.m, k.spec.n, k.spec.k, k.spec.batch_count)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
