"""Hashes of the CUDA the compiler renders, to prove a refactor changed nothing on a device (the golden check).

    python tests/render_golden.py write [--device h100] [--only PREFIX] [--out FILE]
    python tests/render_golden.py check [--device h100] [--only PREFIX] [--golden FILE]

For every program of a fixed set (every case of the op conformance table in every dtype it takes, ResNet-18 and
ResNet-50 at batch 1 and 64, the tiny Qwen2 programs (eager and SDPA, prefill and decode, bf16 and fp32, fused and
unfused), and Qwen2.5-1.5B's prefill (2,048 tokens) and decode step at the real widths (two layers: every kernel
shape of the 28), exported on the meta device without weights), it compiles for the cuda target on a device
profile, renders every kernel as the runtime does when it loads the program, and hashes each kernel's steps: the
source text and the launch (grid, block, shared memory, pointers, early launch, tensor maps) or the cuBLAS plan.
`write` stores the hashes (tests/golden/cuda_render_<device>.json); `check` renders again and lists every program
and kernel whose hash differs. Run from the repository root with PYTHONPATH set to the checkout to check.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import inspect
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

UNFUSED_KEEP = "bn_fold"


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def _step_data(step, sources: dict[str, str]):
    from npu_compiler.targets.cuda.target import Cublas

    if isinstance(step, Cublas):
        return {"cublas": step.plan}
    launch = dataclasses.asdict(step.launch)
    return {"source": hashlib.sha256(sources[step.source].encode()).hexdigest(), "launch": launch}


def render_hashes(program, device: str) -> dict:
    """{"kernels": [hash of each kernel's steps], "merged": hash of the merge map, "program": hash of it all}."""
    from npu_compiler.targets.cuda import CudaTarget

    rendered = _target(CudaTarget, device).render_program(program)
    kernels = [_digest([_step_data(s, rendered.sources) for s in steps]) for steps in rendered.steps]
    merged = _digest(sorted(rendered.merged_into.items()))
    return {"kernels": kernels, "merged": merged, "program": _digest([kernels, merged])}


def _target(cls, device: str):
    """The target for a device of the chip table; before device profiles existed, the arch alone."""
    try:
        from npu_compiler.devices import get_profile
    except ImportError:
        return cls({"h100": 90, "h200": 90, "a100": 80, "b200": 100}[device])
    try:
        return cls(get_profile(device))
    except TypeError:  # a target that still takes an arch
        return cls(get_profile(device).compute_capability)


def _compile(ir, device: str, **kw):
    import npu_compiler

    if "device" in inspect.signature(npu_compiler.compile).parameters:
        return npu_compiler.compile(ir, "cuda", device=device, **kw)
    return npu_compiler.compile(ir, "cuda", **kw)  # before device profiles: planned for the H100


def programs(device: str, only: str = "") -> Iterator[tuple[str, Callable[[], object]]]:
    """(name, a function compiling the program for `device`) for every program of the set, in a fixed order."""
    yield from _op_programs(device)
    yield from _model_programs(device)


def _op_programs(device: str):
    import torch
    from conftest import export_ir
    from test_op_conformance import CASES

    for c in CASES:
        for dt in c.dtypes:
            def make(c=c, dt=dt):
                torch.manual_seed(0)
                inputs = c.inputs(dt)
                module = (lambda: c.make().to(dt)) if dt.is_floating_point else c.make
                dtype = str(dt).removeprefix("torch.") if dt.is_floating_point else None
                return _compile(export_ir(module, inputs), device, dtype=dtype)
            yield f"op/{c.name}/{str(dt).removeprefix('torch.')}", make


def _model_programs(device: str):
    import torch
    from fused_cases import ir_dict

    import npu_compiler
    from npu_export.resnet import resnet18, resnet50

    unfused = [p for p in npu_compiler.OPTIONAL_PASSES if p != UNFUSED_KEEP]
    yield "model/resnet18/b2x64", lambda: _compile(
        ir_dict(resnet18().eval(), [torch.empty(2, 3, 64, 64)], "resnet18"), device, dtype="float16")
    for batch in (1, 64):
        def resnet(batch=batch):
            from conftest import export_ir

            return _compile(export_ir(resnet50, [torch.empty(batch, 3, 224, 224)], "resnet50"), device,
                            dtype="float16")
        yield f"model/resnet50/b{batch}", resnet
    for attn in ("eager", "sdpa"):
        for dt in ("bfloat16", "float32"):
            for graph in ("prefill", "decode"):
                for fused in (True, False):
                    def qwen(attn=attn, dt=dt, graph=graph, fused=fused):
                        ir, kw = _tiny_qwen(attn, dt, graph)
                        if not fused:
                            kw["disable_passes"] = unfused
                        return _compile(ir, device, dtype=dt, **kw)
                    yield f"model/qwen2-tiny/{attn}/{dt}/{graph}{'' if fused else '/unfused'}", qwen
    for graph in ("prefill", "decode"):
        def real(graph=graph):
            ir, kw = _real_qwen(graph)
            return _compile(ir, device, **kw)
        yield f"model/qwen2.5-1.5b-2layers/{graph}", real


_QWEN: dict = {}


def _tiny_qwen(attn: str, dt: str, graph: str):
    from npu_export.qwen2 import export_qwen2, tiny_qwen2_config

    key = ("tiny", attn, dt)
    if key not in _QWEN:
        out = tempfile.mkdtemp(prefix="npusim-golden-")
        export_qwen2(tiny_qwen2_config(), out, max_cache_len=32, prefill_len=8, dtype=dt, attn_implementation=attn)
        _QWEN[key] = out
    with open(os.path.join(_QWEN[key], f"{graph}.json")) as f:
        return json.load(f), {}


def _real_qwen(graph: str):
    from npu_export.qwen2 import export_qwen2, qwen2_config

    if "real" not in _QWEN:
        cfg = qwen2_config("qwen2.5-1.5b")
        cfg.num_hidden_layers = 2
        out = tempfile.mkdtemp(prefix="npusim-golden-")
        exp = export_qwen2(cfg, out, max_cache_len=2560, prefill_len=2048, dtype="bfloat16",
                           attn_implementation="sdpa")
        _QWEN["real"] = (out, exp.cache_map["rope"]["theta"])
    out, theta = _QWEN["real"]
    with open(os.path.join(out, f"{graph}.json")) as f:
        return json.load(f), {"rope_theta": theta}


def collect(device: str, only: str = "", progress: bool = True) -> dict:
    out: dict = {}
    start = time.time()
    for name, make in programs(device):
        if only and not name.startswith(only):
            continue
        try:
            out[name] = render_hashes(make(), device)
        except Exception as e:  # noqa: BLE001  (a program that does not compile or render is a result too)
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        if progress and len(out) % 50 == 0:
            print(f"  {len(out)} programs, {time.time() - start:.0f} s", file=sys.stderr, flush=True)
    return out


def compare(golden: dict, now: dict) -> list[str]:
    diffs = []
    for name in sorted(set(golden) | set(now)):
        a, b = golden.get(name), now.get(name)
        if a is None or b is None:
            diffs.append(f"{name}: {'new' if a is None else 'missing'}")
        elif a != b:
            if "kernels" in a and "kernels" in b and len(a["kernels"]) == len(b["kernels"]):
                ks = [i for i, (x, y) in enumerate(zip(a["kernels"], b["kernels"], strict=True)) if x != y]
                diffs.append(f"{name}: kernels {ks[:12]}{' ...' if len(ks) > 12 else ''} differ"
                             + (" (and the merges)" if a["merged"] != b["merged"] else ""))
            else:
                diffs.append(f"{name}: {a.get('error') or len(a.get('kernels', ()))} -> "
                             f"{b.get('error') or len(b.get('kernels', ()))}")
    return diffs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("write", "check"))
    ap.add_argument("--device", default="h100")
    ap.add_argument("--only", default="", help="programs whose name starts with this")
    ap.add_argument("--golden", default=None, help="the golden file (default tests/golden/cuda_render_<device>.json)")
    args = ap.parse_args(argv)
    path = Path(args.golden or HERE / "golden" / f"cuda_render_{args.device}.json")
    now = collect(args.device, args.only)
    if args.mode == "write":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(now, indent=0, sort_keys=True) + "\n")
        errors = sum("error" in v for v in now.values())
        print(f"wrote {len(now)} programs ({errors} that do not compile or render) to {path}")
        return 0
    golden = json.loads(path.read_text())
    if args.only:
        golden = {k: v for k, v in golden.items() if k.startswith(args.only)}
    diffs = compare(golden, now)
    kernels = sum(len(v.get("kernels", ())) for v in now.values())
    print(f"{len(now)} programs, {kernels} kernels rendered for {args.device}: "
          f"{'the same as' if not diffs else f'{len(diffs)} differ from'} {path.name}")
    for d in diffs[:60]:
        print("  " + d)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
