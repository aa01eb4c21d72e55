"""Every benchmark of the CUDA performance targets in one command: runs bench_llm (decode at KV positions 128,
1024, 2000 and 8192), bench_generate (prefill, time to first token, decode rate, compile + load) and bench_cnn
(ResNet-50 batch 1 and 64), each comparing ours with PyTorch eager and torch.compile in its own process on the same
GPU; then prints one table against the targets, writes all results to one JSON file and draws them as a PNG.

    python bench/bench_all.py --out bench-results [--no-compile]
    python bench/bench_all.py --out bench-results --backends cuda,webgpu   # ours on each, a column each

With `--backends`, the decode and ResNet-50 benchmarks run ours on each backend beside the same peers and the table
gets a column per backend; the targets are judged on the first. bench_generate runs the best available backend.

`--parts` runs some of them and reads the others' JSON files from an earlier call with the same --out (to fit each
call inside a time limit): `--parts llm,cnn` then `--parts generate`; `--parts ""` runs none and makes the table and
the chart from the JSON files in --out (llm.json, llm_8192.json, generate.json, cnn.json, as the scripts write them).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

from npu_compiler.atomic import atomic_path, write_text

HERE = Path(__file__).resolve().parent

# (workload, key in the results, target, "le" (at most) or "ge" (at least), unit)
TARGETS = [
    ("decode step, KV position 1024 (cache 2048)", "decode_1024_ms", 1.5, "le", "ms"),
    ("decode step, KV position 8192 (cache 8448)", "decode_8192_ms", 1.8, "le", "ms"),
    ("prefill, 2048 tokens, one call, last-token logits", "prefill_ms", 12.0, "le", "ms"),
    ("generate, 2000-token prompt: time to first token", "ttft_ms", 25.0, "le", "ms"),
    ("generate, decode rate at 2000 tokens of context", "decode_tokens_per_s", 600.0, "ge", "tokens/s"),
    ("ResNet-50 fp16 batch 1", "resnet50_b1_ms", 0.45, "le", "ms"),
    ("ResNet-50 fp16 batch 64", "resnet50_b64_img_s", 25000.0, "ge", "images/s"),
    ("compile + load of both Qwen programs, kernel cache warm", "compile_and_load_s", 3.0, "le", "s"),
]


def _run(script: str, args: list[str], json_path: Path) -> dict:
    cmd = [sys.executable, str(HERE / script), *args, "--json", str(json_path)]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return json.loads(json_path.read_text())


PARTS = {  # part: (its results, the script, its arguments)
    "llm": [("llm", "bench_llm.py", ["--positions", "128,1024,2000", "--max-cache-len", "2048"]),
            ("llm_8192", "bench_llm.py", ["--positions", "8192", "--max-cache-len", "8448"])],
    "generate": [("generate", "bench_generate.py", [])],
    "cnn": [("cnn", "bench_cnn.py", ["--batches", "1,64"])],
}


# the parts whose script runs ours on several backends (`--backends`)
MULTI_BACKEND = ("llm", "cnn")
# what each backend's column shows: (key in the summary, part, the row field, the row selector)
PER_BACKEND = [("decode_1024_ms", "llm", "ours_ms", ("kv_position", 1024)),
               ("decode_8192_ms", "llm_8192", "ours_ms", ("kv_position", 8192)),
               ("resnet50_b1_ms", "cnn", "ours_ms", ("batch", 1)),
               ("resnet50_b64_img_s", "cnn", "ours_img_s", ("batch", 64))]


def collect(out: Path, no_compile: bool, parts: list[str], backends: str | None = None) -> dict:
    peer = ["--no-compile"] if no_compile else []
    r = {}
    for part, runs in PARTS.items():
        for key, script, args in runs:
            path = out / f"{key}.json"
            if part in parts:
                more = ["--backends", backends] if backends and part in MULTI_BACKEND else []
                r[key] = _run(script, [*args, *peer, *more], path)
            elif path.exists():
                r[key] = json.loads(path.read_text())
    missing = [part for part, runs in PARTS.items() if any(key not in r for key, _, _ in runs)]
    if missing:
        r["missing"] = missing
        return r
    first = r["llm"].get("backends", [None])[0]
    mine = [row for row in r["llm"]["rows"] + r["llm_8192"]["rows"] if row.get("backend", first) == first]
    rows = {row["kv_position"]: row for row in mine}
    cnn = {row["batch"]: row for row in r["cnn"]["rows"] if row.get("backend", first) == first}
    g = r["generate"]
    r["summary"] = {
        "decode_1024_ms": rows[1024]["ours_ms"], "decode_8192_ms": rows[8192]["ours_ms"],
        "prefill_ms": g["prefill_ms"], "ttft_ms": g["ttft_ms"], "decode_tokens_per_s": g["decode_tokens_per_s"],
        "resnet50_b1_ms": cnn[1]["ours_ms"], "resnet50_b64_img_s": cnn[64]["ours_img_s"],
        "compile_and_load_s": g["compile_and_load_s"],
    }
    r["by_backend"] = by_backend(r)
    return r


def by_backend(r: dict) -> dict[str, dict[str, float]]:
    """Each backend's figures of the benchmarks that ran ours on several (`PER_BACKEND`), by backend name in the
    order they ran."""
    names = list(dict.fromkeys([*r["llm"].get("backends", []), *r["cnn"].get("backends", [])]))
    out: dict[str, dict[str, float]] = {name: {} for name in names}
    for key, part, field, (sel, value) in PER_BACKEND:
        for row in r[part]["rows"]:
            if row.get(sel) == value and row.get("backend") in out:
                out[row["backend"]][key] = row[field]
    return out


def _figure(v: float) -> str:
    """Enough digits to see which side of its target a figure is: 24,989 images/s is not "2.5e+04"."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def table(r: dict) -> str:
    """The targets against the first backend's figures; with several backends, a column of each other's."""
    s = r["summary"]
    names = list(r.get("by_backend", {}))
    others = names[1:]
    lines = [f"| workload | ours{f' ({names[0]})' if others else ''} | " + "".join(f"{b} | " for b in others)
             + "target | met |",
             "| --- | --- | " + "--- | " * len(others) + "--- | --- |"]
    for name, key, target, how, unit in TARGETS:
        v = s[key]
        met = v <= target if how == "le" else v >= target
        extra = "".join(f"{_figure(r['by_backend'][b][key]) + ' ' + unit if key in r['by_backend'][b] else '-'} | "
                        for b in others)
        lines.append(f"| {name} | {_figure(v)} {unit} | {extra}{'<=' if how == 'le' else '>='} {target:,g} {unit} | "
                     f"{'yes' if met else 'no'} |")
    return "\n".join(lines)


def chart(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    backends = list(r.get("by_backend", {})) or [None]
    every = sorted(r["llm"]["rows"] + r["llm_8192"]["rows"], key=lambda x: x["kv_position"])
    llm = [x for x in every if x.get("backend", backends[0]) == backends[0]]  # the peers' figures: once
    xs = [str(x["kv_position"]) for x in llm]
    ours = [(f"ours ({b})" if len(backends) > 1 else "ours", [x["ours_ms"] for x in every if x.get("backend", b) == b])
            for b in backends]
    for label, ys in ours + [(label, [x[key] for x in llm]) for label, key in (
            ("torch eager", "eager_ms"), ("torch.compile", "compile_ms"), ("memory floor", "floor_ms"))]:
        if len(ys) == len(xs) and not all(math.isnan(y) for y in ys):
            axes[0].plot(xs, ys, marker="o", label=label)
    axes[0].set(title="Qwen2.5-1.5B decode step", xlabel="KV position", ylabel="ms", yscale="log")
    axes[0].legend()
    g = r["generate"]
    names = ["prefill 2048", "first token"]
    axes[1].bar([n + "\nours" for n in names], [g["prefill_ms"], g["ttft_ms"]], color="C0")
    # (the colours of the other panels: eager C1, torch.compile C2)
    axes[1].bar(["prefill 2048\ntorch eager", "prefill 2048\ntorch.compile"],
                [g["eager_prefill_ms"], g.get("compile_prefill_ms", float("nan"))], color=["C1", "C2"])
    axes[1].set(title=f"prefill and generate (decode {g['decode_tokens_per_s']:.0f} tokens/s)", ylabel="ms")
    cnn = [row for row in r["cnn"]["rows"] if row.get("backend", backends[0]) == backends[0]]
    bars = [(f"ours ({b})" if len(backends) > 1 else "ours", {row["batch"]: row["ours_ms"] for row in r["cnn"]["rows"]
                                                            if row.get("backend", b) == b}) for b in backends]
    bars += [(label, {row["batch"]: row[key] for row in cnn}) for label, key in (("torch eager", "eager_ms"),
                                                                                 ("torch.compile", "compile_ms"))]
    width = 0.8 / len(bars)
    for i, (label, by_batch) in enumerate(bars):
        axes[2].bar([j + i * width for j in range(len(cnn))], [by_batch.get(row["batch"], math.nan) for row in cnn],
                    width, label=label)
    axes[2].set_xticks([j + 0.4 - width / 2 for j in range(len(cnn))], [f"batch {row['batch']}" for row in cnn])
    axes[2].set(title="ResNet-50 fp16", ylabel="ms", yscale="log")
    axes[2].legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench-results", help="folder for the JSON files and the chart")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile peers")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated parts to run (default: all of {', '.join(PARTS)}); the others are read "
                         "from --out")
    ap.add_argument("--backends", default=None,
                    help="comma-separated backends to run ours on in the decode and ResNet-50 benchmarks (default: "
                         "the best available one); the targets are judged on the first")
    args = ap.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if unknown := [p for p in parts if p not in PARTS]:
        ap.error(f"unknown part(s) {', '.join(unknown)}; known: {', '.join(PARTS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    r = collect(out, args.no_compile, parts, args.backends)
    if r.get("missing"):
        print(f"results of {', '.join(parts)} in {out}; the table needs --parts {','.join(r['missing'])} as well")
        return 0
    write_text(out / "results.json", json.dumps(r, indent=1))
    chart(r, out / "results.png")
    print(table(r))
    print(f"results: {out / 'results.json'}, chart: {out / 'results.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
