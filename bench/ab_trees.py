"""A/B of two source trees in one process on one GPU: the Qwen2 decode step, the Qwen2 prefill and ResNet-50, each
compiled and run by tree A's and tree B's `npu_compiler` and `npu_runtime`, timed in alternating rounds so that
clocks, temperature and the machine's other load fall on both alike. Prints each workload's median per tree, B's
time over A's, and flags a row where B is more than `--tolerance` slower.

    python bench/ab_trees.py --a ../baseline --b .
    python bench/ab_trees.py --a OLD --b NEW --workloads decode,prefill,resnet50 --rounds 6 --iters 50

Both trees are imported in this process: each tree's packages are loaded under their own names, and its modules are
swapped into `sys.modules` before any of its code runs (the loads, every timed round), so that a late import inside
a tree's code finds that tree's module. The models (random weights, seed 0) and their IR are made once, by tree A's
exporter; both trees compile the same IR. Run it from any directory; neither tree needs installing.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
from dataclasses import dataclass, field

import numpy as np
from bench_llm import _median_ms  # (bench/ is the script's folder: on sys.path)

PACKAGES = ("npu_compiler", "npu_runtime", "npu_export", "npusim")


@dataclass
class Tree:
    name: str
    path: str
    modules: dict = field(default_factory=dict)

    def load(self) -> None:
        """Import this tree's packages afresh (the other tree's leave sys.modules first)."""
        _drop_packages()
        sys.path.insert(0, self.path)
        try:
            for p in PACKAGES:
                importlib.import_module(p)
            importlib.import_module("npu_runtime.cuda.backend")
        finally:
            sys.path.remove(self.path)
        self.modules = {k: v for k, v in sys.modules.items() if k.split(".")[0] in PACKAGES}

    def activate(self) -> None:
        """This tree's modules in sys.modules (every module it has imported so far, and only those)."""
        _drop_packages()
        sys.modules.update(self.modules)

    def remember(self) -> None:
        """Keep the modules this tree's code imported late (inside functions) as its own."""
        self.modules.update({k: v for k, v in sys.modules.items() if k.split(".")[0] in PACKAGES})

    def mod(self, name: str):
        return self.modules[name] if name in self.modules else importlib.import_module(name)


def _drop_packages() -> None:
    for k in [k for k in sys.modules if k.split(".")[0] in PACKAGES]:
        del sys.modules[k]


@dataclass
class Workload:
    name: str
    runs: dict = field(default_factory=dict)  # tree name -> (run, sync)
    times: dict = field(default_factory=dict)  # tree name -> [median ms of each round]


def _llm_models(args):
    """Qwen2 (random bf16 weights) and its decode and prefill IR, exported by the tree that is active."""
    import torch
    from transformers import Qwen2ForCausalLM

    from npu_export.qwen2 import export_qwen2, qwen2_config

    cfg = qwen2_config(args.config)
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = Qwen2ForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16).eval()
    tmp = tempfile.mkdtemp(prefix="ab_trees_")
    exp = export_qwen2(model, tmp, max_cache_len=args.max_cache_len, prefill_len=args.prefill_len,
                       dtype="bfloat16", attn_implementation="sdpa", prefill_last_logits_only=True)
    return model, exp


def _llm_feeds(graph: dict, positions: np.ndarray, L: int) -> dict:
    """A step's inputs: tokens 7 at `positions` (one row), their cache slots, and the causal mask over the cache."""
    import torch

    from npu_export.qwen2 import make_additive_mask
    from npu_export.reference import to_numpy

    T = len(positions)
    names = graph["inputs"]
    return {names["input_ids"]: np.full((1, T), 7, np.int64), names["position_ids"]: positions.reshape(1, T),
            names["cache_position"]: positions,
            names["attention_mask"]: to_numpy(make_additive_mask(int(positions[-1]) + 1, T, L, torch.bfloat16))}


def _llm_run(tree: Tree, backend_name: str, exp, model, kind: str, feeds: dict):
    """Tree `tree`'s compiled `kind` program with its cache, weights and inputs on the device: (run, sync)."""
    compiler, runtime = tree.mod("npu_compiler"), tree.mod("npu_runtime")
    model_tensors = tree.mod("npu_export.cnn").model_tensors
    backend = runtime.get_backend(backend_name)
    g = exp.cache_map["graphs"][kind]
    path = exp.decode_path if kind == "decode" else exp.prefill_path
    prog = compiler.compile(path, backend.compile_target(), rope_theta=exp.cache_map["rope"]["theta"])
    specs = {s.name: s for s in prog.inputs}
    cache = {lay[kv]: backend.zeros(tuple(specs[lay[kv]].shape), specs[lay[kv]].device_dtype)
             for lay in g["layers"] for kv in ("k_input", "v_input")}
    ex = backend.create_executor(prog, bindings=cache)
    ex.bind_weights(runtime.load_weights(prog, model_tensors(model), backend))
    ex.bind_buffers({n: backend.upload(v, specs[n].device_dtype) for n, v in feeds.items()})
    print(f"  {tree.name}: {kind} {len(prog.kernels)} kernels, planned for "
          f"{getattr(getattr(prog, 'device', None), 'name', 'the target default')}", flush=True)
    return (lambda: ex.run({})), backend.synchronize


def _resnet_run(tree: Tree, backend_name: str, model, ir: dict, x: np.ndarray):
    compiler, runtime = tree.mod("npu_compiler"), tree.mod("npu_runtime")
    model_tensors = tree.mod("npu_export.cnn").model_tensors
    backend = runtime.get_backend(backend_name)
    prog = compiler.compile(ir, backend.compile_target(), dtype="float16")
    ws = runtime.load_weights(prog, model_tensors(model), backend)
    ex = backend.create_executor(prog)
    spec = prog.inputs[0]
    feeds = {spec.name: backend.upload(x, spec.device_dtype)}
    print(f"  {tree.name}: resnet50 batch {x.shape[0]} {len(prog.kernels)} kernels", flush=True)
    return (lambda: ex.run(feeds, ws)), backend.synchronize


def _resnet_ir(batch: int):
    import torch
    import torch_ir

    from npu_export import resnet
    from npu_export.ir_io import ir_to_dict

    torch.manual_seed(0)
    model = resnet.resnet50().eval()
    with torch.device("meta"):
        m = resnet.resnet50().eval()
        x_meta = torch.randn(batch, 3, 224, 224)
    with torch.no_grad():
        ir = ir_to_dict(torch_ir.extract_ir(m, (x_meta,), model_name="resnet50"))
    return model, ir, np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)


def build(trees: list[Tree], args) -> list[Workload]:
    """Every workload's runs, for each tree (the models exported once, by the first tree)."""
    kinds = [w for w in args.workloads.split(",") if w]
    trees[0].activate()
    out: list[Workload] = []
    if {"decode", "prefill"} & set(kinds):
        model, exp = _llm_models(args)
        trees[0].remember()
        L = args.max_cache_len
        steps = {"decode": ("decode", np.array([args.position], np.int64)),
                 "prefill": ("prefill", np.arange(args.prefill_len, dtype=np.int64))}
        for w in ("decode", "prefill"):
            if w in kinds:
                kind, positions = steps[w]
                trees[0].activate()
                feeds = _llm_feeds(exp.cache_map["graphs"][kind], positions, L)
                wl = Workload(f"{w} ({args.config}, " + (f"KV position {args.position})" if w == "decode"
                                                          else f"{args.prefill_len} tokens)"))
                for t in trees:
                    t.activate()
                    wl.runs[t.name] = _llm_run(t, args.backend, exp, model, kind, feeds)
                    t.remember()
                out.append(wl)
    for batch in ([int(b) for b in args.batches.split(",")] if "resnet50" in kinds else []):
        trees[0].activate()
        model, ir, x = _resnet_ir(batch)
        trees[0].remember()
        wl = Workload(f"resnet50 fp16 batch {batch}")
        for t in trees:
            t.activate()
            wl.runs[t.name] = _resnet_run(t, args.backend, model, ir, x)
            t.remember()
        out.append(wl)
    return out


def measure(trees: list[Tree], workloads: list[Workload], rounds: int, iters: int) -> None:
    """`rounds` rounds; in each, every workload timed on each tree, the order of the trees alternating by round."""
    for r in range(rounds):
        order = trees if r % 2 == 0 else trees[::-1]
        for wl in workloads:
            for t in order:
                t.activate()
                run, sync = wl.runs[t.name]
                wl.times.setdefault(t.name, []).append(_median_ms(run, sync, iters))
        print(f"  round {r + 1}/{rounds} done", flush=True)


def report(trees: list[Tree], workloads: list[Workload], tolerance: float) -> int:
    a, b = trees[0].name, trees[1].name
    print(f"\n{'workload':<44} {a + ' ms':>12} {b + ' ms':>12} {b + '/' + a:>10}  rounds' spread")
    worse = 0
    for wl in workloads:
        ma, mb = statistics.median(wl.times[a]), statistics.median(wl.times[b])
        spread = max(max(v) / min(v) - 1 for v in wl.times.values())
        flag = ""
        if mb > ma * (1 + tolerance):
            flag, worse = f"  SLOWER by more than {tolerance:.0%}", worse + 1
        print(f"{wl.name:<44} {ma:>12.3f} {mb:>12.3f} {mb / ma:>10.3f}  {spread:.1%}{flag}")
    return 1 if worse else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, metavar="DIR", help="tree A (the baseline), e.g. a git worktree of main")
    ap.add_argument("--b", required=True, metavar="DIR", help="tree B (the change)")
    ap.add_argument("--workloads", default="decode,prefill,resnet50")
    ap.add_argument("--config", default="qwen2.5-1.5b")
    ap.add_argument("--position", type=int, default=1024, help="the decode step's KV position")
    ap.add_argument("--prefill-len", type=int, default=2048)
    ap.add_argument("--max-cache-len", type=int, default=2560)
    ap.add_argument("--batches", default="1,64", help="ResNet-50 batch sizes")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--iters", type=int, default=50, help="timed runs a round (their median)")
    ap.add_argument("--tolerance", type=float, default=0.02, help="B slower than A by more than this is flagged")
    ap.add_argument("--backend", default="cuda")
    args = ap.parse_args(argv)
    trees = [Tree("A", args.a), Tree("B", args.b)]
    for t in trees:
        t.load()
        print(f"tree {t.name}: {t.path} (npu_compiler from {t.modules['npu_compiler'].__file__})", flush=True)
    workloads = build(trees, args)
    measure(trees, workloads, args.rounds, args.iters)
    return report(trees, workloads, args.tolerance)


if __name__ == "__main__":
    raise SystemExit(main())
