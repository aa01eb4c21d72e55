"""Qwen2 decode step: ours (compiled program, KV cache on the device) against PyTorch eager and torch.compile
(reduce-overhead) running the same Hugging Face modules over the same static cache, and a gpt-fast-style Qwen2 in
plain PyTorch (gptfast_qwen2.py: caches as module buffers, SDPA with grouped heads, the step compiled with
mode="reduce-overhead", fullgraph=True; eager with --no-compile or on the CPU), in one process on one GPU. The
gpt-fast peer's logits are checked against the Hugging Face model's (bf16 decoder tolerance: Pearson r >= 0.999,
max |err| <= 5e-2 of max |ref|); the bench fails when they differ.

Prints per KV position the median step time, ratios, and the fraction of the memory-bound floor reached
(weight bytes + the valid part of the KV cache, read once per token, at the measured copy bandwidth). Every step
is timed with its inputs already on the device, as the peers get theirs (their tensors are made once a position)
and as `npusim generate` makes them on the device; the `+upload` column adds our upload of the four inputs from
the host each run.

    python bench/bench_llm.py [--config qwen2.5-1.5b] [--positions 128,1024] [--max-cache-len 2048] [--json out]
    python bench/bench_llm.py --backends cuda,webgpu    # ours on each backend, beside the same peers
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import numpy as np
import torch


def _median_ms(fn, sync, iters: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    warn_if_noisy([t / 1e3 for t in times], getattr(fn, "__qualname__", "runs"))
    return statistics.median(times)


_WARNED: set[str] = set()


def warn_if_noisy(seconds: list[float], what: str) -> None:
    """Print, once per kind of warning, when the runs spread too widely or the machine is busy: the figures of a
    pass taken then are not comparable with a quiet pass's (npu_runtime.noise)."""
    from npu_runtime.noise import timing_warnings

    for text in timing_warnings(seconds):
        key = text.split(":")[0]
        if key not in _WARNED:
            _WARNED.add(key)
            print(f"warning ({what}): {text}", file=sys.stderr, flush=True)


def step_weight_bytes(prog) -> int:
    """The weight bytes a step reads at least: each weight buffer as far as its kernels read it (their cost records),
    at most its size. Not the program's weight bytes: a weight-only program keeps the float embedding table, of which
    a decode step reads one row (a tied bf16 LM head reads it whole)."""
    seen: dict[int, int] = {}
    for k in prog.kernels:
        for t in k.spec.cost(k, prog.buffers).reads:
            buf = prog.buffers[t.buffer]
            if buf.kind == "weight":
                seen[t.buffer] = min(buf.nbytes, seen.get(t.buffer, 0) + t.bytes)
    return sum(seen.values())


def print_profile(title: str, prog, backend_name: str, profile_once, top: int) -> None:
    """The `top` slowest kernels of five profiled runs, and the kernel total by fusion group."""
    from npu_runtime.profiling import format_table, summarize

    report = summarize(prog, [profile_once() for _ in range(5)], backend_name)
    print(f"-- {title} on {backend_name}: kernel total {report.kernel_total_s * 1e3:.3f} ms over "
          f"{len(prog.kernels)} kernels; by group (ms): " + ", ".join(
              f"{g} {t * 1e3:.3f}" for g, t in list(report.by_group().items())[:8]))
    print(format_table(report, top))


LIMIT_ROUNDS = 5


def limit_ms(fn, sync) -> float:
    """The time of a physical-limit probe (a copy, a large GEMM): the best of LIMIT_ROUNDS medians of 20 runs. One
    median of the copy moved from 2687 to 2940 GB/s between two processes of one call (the first on a GPU just
    started), and a limit is meant as the limit, not as one sample of it."""
    return min(_median_ms(fn, sync, 20) for _ in range(LIMIT_ROUNDS))


def copy_bandwidth_gbps(device: str) -> float:
    """Device-to-device copy, bytes read + written per second: the practical rate of streaming the weights once."""
    if device != "cuda":
        return float("nan")
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() / (limit_ms(lambda: b.copy_(a), torch.cuda.synchronize) * 1e-3) / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="qwen2.5-1.5b")
    ap.add_argument("--positions", default="128,1024")
    ap.add_argument("--max-cache-len", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=100,
                    help="timed steps a contender and position (their median; a step is about 1.5 ms on an H100)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    ap.add_argument("--backends", default=None,
                    help="comma-separated backends to run ours on (default: the best available one)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--weights-dtype", default=None, choices=("int8", "int4"),
                    help="ours with weight-only int8 (per channel) or int4 (group 128) projections and LM head "
                         "(W8A16 / W4A16: compile(weights_dtype=...)); the peers stay bf16, the floor is the weight "
                         "bytes our step reads")
    ap.add_argument("--disable-pass", action="append", default=[], metavar="NAME",
                    help="compile ours without this optional pass (npu_compiler.OPTIONAL_PASSES; repeatable): "
                         "e.g. gemm_prologue, to run the norms as kernels of their own")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also print the N slowest kernels of our program (per-kernel device time, 5 runs)")
    args = ap.parse_args(argv)

    from transformers import Qwen2ForCausalLM

    import npu_compiler
    import npu_runtime
    from npu_export.cnn import model_tensors
    from npu_export.qwen2 import export_qwen2, make_additive_mask, qwen2_config
    from npu_export.qwen2_static import StaticCacheLM

    backends = [npu_runtime.get_backend(n) for n in (args.backends.split(",") if args.backends else [None])]
    # the peers run on the GPU wherever PyTorch has one, whichever backend runs ours
    device = "cuda" if torch.cuda.is_available() else "cpu"
    L = args.max_cache_len
    cfg = qwen2_config(args.config)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16).eval()
    ours_ex = {}
    with tempfile.TemporaryDirectory() as tmp:
        exp = export_qwen2(model, tmp, max_cache_len=L, prefill_len=16, dtype="bfloat16", attn_implementation="sdpa")
        g = exp.cache_map["graphs"]["decode"]
        theta = exp.cache_map["rope"]["theta"]
        for backend in backends:
            t0 = time.perf_counter()
            prog = npu_compiler.compile(exp.decode_path, backend.compile_target(), rope_theta=theta,
                                        weights_dtype=args.weights_dtype, disable_passes=args.disable_pass)
            ws = npu_runtime.load_weights(prog, model_tensors(model), backend)
            specs = {s.name: s for s in prog.inputs}
            cache = {lay[kv]: backend.zeros(tuple(specs[lay[kv]].shape), specs[lay[kv]].device_dtype)
                     for lay in g["layers"] for kv in ("k_input", "v_input")}
            ex = backend.create_executor(prog, bindings=cache)
            ex.bind_weights(ws)
            ours_ex[backend.name] = (backend, ex, ws, time.perf_counter() - t0)

    from gptfast_qwen2 import GptFastQwen2, compiled_step, decode_one_token

    fast = GptFastQwen2.from_hf(model, L)
    fast_step = compiled_step() if not args.no_compile and device == "cuda" else decode_one_token
    fast_mode = "compiled (reduce-overhead, fullgraph)" if fast_step is not decode_one_token else "eager"
    wrapper = StaticCacheLM(model).eval()
    tcache = [torch.zeros(tuple(specs[lay[kv]].shape), dtype=torch.bfloat16, device=device)
              for lay in g["layers"] for kv in ("k_input", "v_input")]
    compiled = None if args.no_compile or device != "cuda" else torch.compile(wrapper, mode="reduce-overhead")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    bw = copy_bandwidth_gbps(device)
    weight_bytes = step_weight_bytes(prog)
    kv_per_pos = sum(int(np.prod(specs[n].shape)) // L * 2 for n in cache)  # bf16 bytes per cached position
    rows, checks = [], []
    for pos in [int(p) for p in args.positions.split(",")]:
        ids = np.array([[7]], np.int64)
        p = np.array([pos], np.int64)
        mask = make_additive_mask(pos + 1, 1, L, torch.bfloat16)
        from npu_export.reference import to_numpy

        feeds = {g["inputs"]["input_ids"]: ids, g["inputs"]["position_ids"]: p.reshape(1, 1),
                 g["inputs"]["cache_position"]: p, g["inputs"]["attention_mask"]: to_numpy(mask)}
        ours, ours_upload, ours_device = {}, {}, {}
        for name, (be, ex, _, _) in ours_ex.items():
            # with the step's inputs uploaded from the host every run (as `npusim run` feeds a program), then already
            # on the device, as the peers get theirs and `npusim generate` makes them (the headline figure)
            ours_upload[name] = _median_ms(lambda feeds=feeds, ex=ex: ex.run(feeds), be.synchronize, args.iters)
            specs_in = {s.name: s for s in ex.program.inputs}
            ex.bind_buffers({n: be.upload(v, specs_in[n].device_dtype) for n, v in feeds.items()})
            ours[name] = _median_ms(lambda ex=ex: ex.run({}), be.synchronize, args.iters)
            ours_device[name] = statistics.median(ex.device_seconds({}, None, args.iters)) * 1e3
        if args.profile:
            for name, (_, ex, _, _) in ours_ex.items():
                print_profile(f"decode at KV position {pos}", ex.program, name, lambda ex=ex:
                              ex.profile({}), args.profile)
        targs = (torch.from_numpy(ids).to(device), torch.from_numpy(p.reshape(1, 1)).to(device),
                 torch.from_numpy(p).to(device), mask.to(device), *tcache)
        with torch.no_grad():
            fargs = (torch.tensor([[7]], device=device), torch.from_numpy(p).to(device))
            fast.clear_caches()  # as the other peers' caches: zeros but for this step's row
            try:
                got = fast_step(fast, *fargs)
            except Exception as e:  # noqa: BLE001  (a peer torch.compile cannot build is timed eager, and says so)
                if fast_step is decode_one_token:
                    raise
                print(f"warning: the gpt-fast peer does not compile ({type(e).__name__}: {str(e)[:200]}); timing it "
                      "eager", file=sys.stderr)
                fast_step, fast_mode = decode_one_token, "eager (torch.compile failed)"
                got = fast_step(fast, *fargs)
            check = _check_peer(got, wrapper(*targs)[0])
            checks.append(check)
            gptfast = _median_ms(lambda fargs=fargs, step=fast_step: step(fast, *fargs), sync, args.iters)
            eager = _median_ms(lambda targs=targs: wrapper(*targs), sync, args.iters)
            comp = float("nan")
            if compiled is not None:
                for _ in range(3):  # compile and capture
                    compiled(*targs)
                comp = _median_ms(lambda targs=targs: compiled(*targs), sync, args.iters)
        floor_ms = (weight_bytes + kv_per_pos * (pos + 1)) / (bw * 1e9) * 1e3 if bw == bw else float("nan")
        for name, ms in ours.items():
            rows.append({"backend": name, "kv_position": pos, "ours_ms": ms, "ours_upload_ms": ours_upload[name],
                         "ours_device_ms": ours_device[name],
                         "eager_ms": eager, "compile_ms": comp, "gptfast_ms": gptfast,
                         "floor_ms": floor_ms, "vs_eager": eager / ms, "vs_compile": comp / ms,
                         "fraction_of_floor": floor_ms / ms})
    fmt = {"int8": "W8A16", "int4": "W4A16"}.get(args.weights_dtype or "", "bf16")
    print(f"{args.config} {fmt} decode ({torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}): "
          f"{len(prog.kernels)} kernels, weights read {weight_bytes / 1e9:.2f} GB, copy bandwidth {bw:.0f} GB/s, "
          f"cache length {L}")
    for name, (be, ex, _, t_ready) in ours_ex.items():
        steps = getattr(getattr(ex, "rendered", None), "steps", None)
        launches = f", {sum(len(s) for s in steps)} launches" if steps is not None else ""
        print(f"  ours on {name}: compile+load {t_ready:.1f} s{launches}" + (f"; {be.describe()}" if be.describe()
                                                                              else ""))
    print("  ours: the step with its inputs on the device, as the peers are timed; +upload: each run uploading them "
          "from the host first; device: the GPU's time of a step (Executor.device_seconds)")
    print(f"  gpt-fast: {fast_mode}; its logits against transformers': " + "; ".join(
        f"r {c['pearson']:.6f}, max err {c['max_rel']:.2e} of max |ref| ({'ok' if c['passed'] else 'FAILED'})"
        for c in checks))
    print(f"{'backend':>8} {'KV pos':>7} {'ours ms':>9} {'+upload':>9} {'device':>9} {'eager ms':>9} "
          f"{'compile ms':>11} {'gpt-fast ms':>12} {'floor ms':>9} {'x eager':>8} {'x compile':>10} "
          f"{'x gpt-fast':>11} {'of floor':>9}")
    for r in rows:
        print(f"{r['backend']:>8} {r['kv_position']:>7} {r['ours_ms']:>9.3f} {r['ours_upload_ms']:>9.3f} "
              f"{r['ours_device_ms']:>9.3f} "
              f"{r['eager_ms']:>9.3f} {r['compile_ms']:>11.3f} {r['gptfast_ms']:>12.3f} {r['floor_ms']:>9.3f} "
              f"{r['vs_eager']:>8.2f} {r['vs_compile']:>10.2f} {r['gptfast_ms'] / r['ours_ms']:>11.2f} "
              f"{r['fraction_of_floor']:>9.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": args.config, "weights": fmt, "backends": list(ours_ex), "kernels": len(prog.kernels),
                       "copy_gbps": bw, "gptfast_mode": fast_mode, "gptfast_checks": checks, "rows": rows}, f,
                      indent=1)
    return 0 if all(c["passed"] for c in checks) else 1


# the bf16 decoders' row of docs/tolerances.md (npu_export.zoo.ZOO_TOLERANCE)
PEER_MIN_PEARSON, PEER_MAX_REL = 0.999, 5e-2


def _check_peer(got: torch.Tensor, ref: torch.Tensor) -> dict:
    """The gpt-fast peer's logits against the Hugging Face model's at the same step: it must compute the same model."""
    g, r = got.float().cpu().numpy().ravel(), ref.float().cpu().numpy().ravel()
    pearson = float(np.corrcoef(g, r)[0, 1]) if g.std() and r.std() else float(np.array_equal(g, r))
    max_rel = float(np.abs(g - r).max() / max(float(np.abs(r).max()), 1e-30))
    ok = bool(np.isfinite(g).all()) and pearson >= PEER_MIN_PEARSON and max_rel <= PEER_MAX_REL
    return {"pearson": pearson, "max_rel": max_rel, "passed": ok}


if __name__ == "__main__":
    raise SystemExit(main())
