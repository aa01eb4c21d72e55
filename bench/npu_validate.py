"""Validate the NPU model's compute cycles against SCALE-Sim v3 (an independent cycle simulator of systolic arrays).

    pip install -e ".[npu-model]"            # scalesim 3.0.0 (and the export extra for the models)
    python bench/npu_validate.py [--write-docs] [--jobs 2]

For every GEMM and convolution kernel of ResNet-50 (batch 1, 224 x 224) and every linear layer of a Qwen2.5-1.5B
decode step (the real config, exported on the meta device), both compiled by `npu_compiler.compile(ir, "cpu")`, it
runs SCALE-Sim on the same array (256 x 256, weight stationary: the tpu-v1 preset's array, with the stationary
tile's preload not overlapped, as SCALE-Sim models it) and prints a markdown table with the error per layer.
`--write-docs` puts the table into docs/npu_model.md between its markers. Identical layer shapes are simulated
once. SCALE-Sim runs its memory model cycle by cycle in Python: the whole table takes several minutes.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import dataclasses
import io
import math
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from doc_tables import write_between_markers  # noqa: E402

from npu_compiler.npu import ConvWork, GemmWork, NPUConfig, array_cycles, kernel_work, load_npu  # noqa: E402
from npu_compiler.npu.model import conv_as_gemm  # noqa: E402

DOCS = ROOT / "docs" / "npu_model.md"
BEGIN, END = "<!-- scalesim-table:begin -->", "<!-- scalesim-table:end -->"
# Above this many simulated cycles a layer is simulated in slices of its output columns (see `_slices`), which
# keeps SCALE-Sim's demand matrices (cycles x array width, float64) within a few hundred MB.
MAX_LINES_PER_RUN = 120_000


@dataclass(frozen=True)
class Layer:
    """One layer as SCALE-Sim describes a convolution: an ifmap of h x w x channels, filters of fh x fw, stride.
    A GEMM C[m,n] = A[m,k] B[k,n] is the 'convolution' of an m x k ifmap by n filters of 1 x k."""

    name: str
    ifmap_h: int
    ifmap_w: int
    filt_h: int
    filt_w: int
    channels: int
    filters: int
    stride: int
    m: int  # the same layer as the model sees it
    n: int
    k: int

    def entries(self) -> list:
        return [self.name, self.ifmap_h, self.ifmap_w, self.filt_h, self.filt_w, self.channels, self.filters,
                self.stride, self.stride, 1, 1]


def layer_of(work: GemmWork | ConvWork, name: str) -> Layer:
    if isinstance(work, ConvWork):
        if work.groups != 1 or work.dilation != (1, 1) or work.stride[0] != work.stride[1] or work.n != 1:
            raise ValueError(f"{name}: SCALE-Sim describes plain convolutions of one image only")
        g = conv_as_gemm(work)
        s = work.stride[0]
        # SCALE-Sim has no padding and sizes the output as ceil((H - fh + s) / s); PyTorch as
        # floor((H + 2p - fh) / s) + 1. The rows and columns that the convolution reads are (Ho - 1) * s + fh of
        # the padded input, so that is the ifmap that describes the same layer.
        return Layer(name, (work.ho - 1) * s + work.kh, (work.wo - 1) * s + work.kw, work.kh, work.kw, work.c,
                     work.o, s, g.m, g.n, g.k)
    if work.batch != 1:
        raise ValueError(f"{name}: a batched GEMM is not one SCALE-Sim layer")
    return Layer(name, work.m, work.k, 1, work.k, 1, work.n, 1, work.m, work.n, work.k)


def _patch_scalesim_for_numpy2() -> None:
    """SCALE-Sim 3.0.0 ends its memory simulation with int(max(list of 1-element arrays)); NumPy 2 refuses int()
    of a 1-d array. Give that one module a max() that returns the element itself (the same value)."""
    import numpy as np
    import scalesim.memory.double_buffered_scratchpad_mem as mem

    def max_(*args, **kw):
        r = builtins.max(*args, **kw)
        return r.reshape(()).item() if isinstance(r, np.ndarray) and r.size == 1 else r

    mem.max = max_


def scalesim_cycles(layer: Layer, rows: int, cols: int, dataflow: str) -> int:
    """SCALE-Sim's compute cycles ('Total Cycles' of its compute report, bandwidth mode CALC: no DRAM stalls) for
    one layer, or for the sum of its column slices when it is large."""
    return sum(_scalesim_run(part, rows, cols, dataflow) for part in _slices(layer, rows, cols, dataflow))


def _slices(layer: Layer, rows: int, cols: int, dataflow: str) -> list[Layer]:
    """In SCALE-Sim's weight- and output-stationary dataflows the filters (output columns) are cut into folds that
    run one after another and each take the same cycles whatever the other folds are, so a layer simulated in
    slices of whole column folds takes the sum of the slices' cycles (the sum is checked against one run in
    tests/test_npu_estimate.py)."""
    if dataflow == "is":
        return [layer]
    lines = array_cycles(layer.m, layer.n, layer.k, _npu(rows, cols, dataflow))[0]
    if lines <= MAX_LINES_PER_RUN:
        return [layer]
    parts = math.ceil(lines / MAX_LINES_PER_RUN)
    col_folds = math.ceil(layer.filters / cols)
    per = max(1, math.ceil(col_folds / parts)) * cols
    out, start = [], 0
    while start < layer.filters:
        f = min(per, layer.filters - start)
        out.append(dataclasses.replace(layer, filters=f, n=f))
        start += f
    return out


def _scalesim_run(layer: Layer, rows: int, cols: int, dataflow: str) -> int:
    from scalesim.layout_utils import layouts
    from scalesim.scale_config import scale_config
    from scalesim.single_layer_sim import single_layer_sim
    from scalesim.topology_utils import topologies

    _patch_scalesim_for_numpy2()
    cfg = scale_config()
    cfg.array_rows, cfg.array_cols, cfg.df = rows, cols, dataflow
    cfg.use_user_bandwidth = False  # CALC: SCALE-Sim sizes the bandwidth so that the array never stalls
    cfg.valid_conf_flag = True
    topo = topologies()
    topo.load_layer_params_from_list(layer.name, layer.entries())
    sim = single_layer_sim()
    with contextlib.redirect_stdout(io.StringIO()):
        sim.set_params(layer_id=0, config_obj=cfg, topology_obj=topo, layout_obj=layouts(), verbose=False)
        sim.run()
        _, compute_cycles, stall_cycles, *_ = sim.get_compute_report_items()
    if stall_cycles:
        raise RuntimeError(f"{layer.name}: SCALE-Sim reported {stall_cycles} stall cycles in CALC mode")
    return int(compute_cycles)


def _npu(rows: int, cols: int, dataflow: str, base: NPUConfig | None = None) -> NPUConfig:
    base = base or load_npu("tpu-v1")
    full = {"ws": "weight_stationary", "os": "output_stationary", "is": "input_stationary"}[dataflow]
    return dataclasses.replace(base, array_rows=rows, array_cols=cols, dataflow=full, preload_overlap=False,
                               fold_overlap=False, array_formats={})


# ---- the models' layers ------------------------------------------------------------------------------------------


def resnet50_program():
    import torch
    import torch_ir

    import npu_compiler
    from npu_export.ir_io import ir_to_dict
    from npu_export.resnet import resnet50

    with torch.device("meta"):
        model = resnet50().eval()
    with torch.no_grad():
        ir = torch_ir.extract_ir(model, (torch.empty(1, 3, 224, 224, device="meta"),), model_name="resnet50")
    return npu_compiler.compile(ir_to_dict(ir), "cpu", dtype="float16")


def qwen_decode_program(tmp: str):
    import npu_compiler
    from npu_export.qwen2 import export_qwen2, qwen2_config

    exp = export_qwen2(qwen2_config("qwen2.5-1.5b"), tmp, max_cache_len=256, prefill_len=16, dtype="bfloat16")
    return npu_compiler.compile(exp.decode_path, "cpu", dtype="bfloat16", rope_theta=exp.cache_map["rope"]["theta"])


def model_layers(program, model: str) -> list[tuple[str, str, Layer, int]]:
    """(model, what, layer, count) for every GEMM/conv kernel, identical shapes merged."""
    seen: dict[tuple, list] = {}
    for k in program.kernels:
        if k.kind not in ("gemm", "conv2d"):
            continue
        work = kernel_work(program, k)
        if isinstance(work, GemmWork) and work.batch != 1:
            continue  # attention's batched products (not linear layers)
        layer = layer_of(work, k.name)
        key = dataclasses.astuple(dataclasses.replace(layer, name=""))
        what = _what(work)
        if key in seen:
            seen[key][3] += 1
        else:
            seen[key] = [model, what, layer, 1]
    return [tuple(v) for v in seen.values()]


def _what(work: GemmWork | ConvWork) -> str:
    if isinstance(work, ConvWork):
        return f"conv {work.kh}x{work.kw}/{work.stride[0]} {work.c}->{work.o} @{work.ho}x{work.wo}"
    return f"gemm m={work.m} n={work.n} k={work.k}"


def _simulate(args: tuple[Layer, int, int, str]) -> int:
    layer, rows, cols, df = args
    return _scalesim_run(layer, rows, cols, df)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--cols", type=int, default=256)
    ap.add_argument("--dataflow", choices=["ws", "os", "is"], default="ws")
    ap.add_argument("--models", default="resnet50,qwen2.5-1.5b", help="comma-separated: resnet50, qwen2.5-1.5b")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="SCALE-Sim runs in parallel")
    ap.add_argument("--write-docs", action="store_true", help=f"put the table into {DOCS.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    try:
        import scalesim  # noqa: F401
    except ImportError:
        print("scalesim is not installed: pip install -e '.[npu-model]'", file=sys.stderr)
        return 2

    rows: list[tuple[str, str, Layer, int]] = []
    models = args.models.split(",")
    if "resnet50" in models:
        rows += model_layers(resnet50_program(), "ResNet-50")
    if "qwen2.5-1.5b" in models:
        with tempfile.TemporaryDirectory() as tmp:
            rows += model_layers(qwen_decode_program(tmp), "Qwen2.5-1.5B decode")
    npu = _npu(args.rows, args.cols, args.dataflow)
    t0 = time.perf_counter()
    # Every slice of every layer is one SCALE-Sim run; the runs go to the workers largest first.
    runs = [(i, part) for i, r in enumerate(rows) for part in _slices(r[2], args.rows, args.cols, args.dataflow)]
    runs.sort(key=lambda ip: -array_cycles(ip[1].m, ip[1].n, ip[1].k, npu)[0])
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        cycles = pool.map(_simulate, [(part, args.rows, args.cols, args.dataflow) for _, part in runs])
        sims = [0] * len(rows)
        for (i, _), c in zip(runs, cycles):
            sims[i] += c
    table = [f"SCALE-Sim 3.0.0 vs the model: {args.rows} x {args.cols} array, "
             f"{npu.dataflow.replace('_', '-')}, compute cycles (no memory stalls), stationary preload not "
             f"overlapped. Regenerate: `python bench/npu_validate.py --write-docs` "
             f"({time.perf_counter() - t0:.0f} s of SCALE-Sim here).", "",
             "| model | layer | kernels | M | N | K | SCALE-Sim cycles | model cycles | error |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    worst = 0.0
    for (model, what, layer, count), ref in zip(rows, sims):
        ours = array_cycles(layer.m, layer.n, layer.k, npu)[0]
        err = (ours - ref) / ref
        worst = max(worst, abs(err))
        table.append(f"| {model} | {what} | {count} | {layer.m} | {layer.n} | {layer.k} | {ref} | {ours} | "
                     f"{100 * err:+.3f}% |")
    table.append("")
    table.append(f"{len(rows)} distinct layers; largest error {100 * worst:.3f}%.")
    text = "\n".join(table)
    print(text)
    if args.write_docs and write_between_markers(DOCS, BEGIN, END, text):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
