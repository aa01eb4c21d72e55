"""The NPU model against published silicon: the `eyeriss` and `tpu-v1` presets run the workloads their papers
measured, and the predictions are set beside the published figures.

    python bench/npu_silicon.py [--write-docs]

Every workload is a PyTorch module built on the meta device (no weights), exported with torch_ir and compiled by
`npu_compiler.compile(ir, "cpu", dtype="float16")`; `estimate_program(..., number_format=...)` then costs its
floating-point tensors in the chip's format (Eyeriss: 16-bit fixed point, TPU v1: int8). tests/test_npu_silicon.py
recomputes the table and checks it against docs/npu_model.md and the tolerance.

Sources. Eyeriss: Y.-H. Chen, T. Krishna, J. Emer, V. Sze, "Eyeriss: An Energy-Efficient Reconfigurable Accelerator
for Deep Convolutional Neural Networks", IEEE JSSC 52(1), 2017, abstract and section VI. TPU v1: N. P. Jouppi et al.,
"In-Datacenter Performance Analysis of a Tensor Processing Unit", ISCA 2017, Table 1 (the workloads) and Table 3 (the
measured TeraOps/s).
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from doc_tables import write_between_markers  # noqa: E402

DOCS = ROOT / "docs" / "npu_model.md"
BEGIN, END = "<!-- silicon-table:begin -->", "<!-- silicon-table:end -->"
TOLERANCE = 0.25  # |predicted / published - 1|, end to end


@dataclass(frozen=True)
class Figure:
    chip: str  # the preset
    workload: str
    metric: str  # "fps", "mW", "DRAM accesses/MAC", "TOPS"
    published: float
    source: str


FIGURES = [
    Figure("eyeriss", "AlexNet CONV1-5, batch 4", "fps", 34.7, "JSSC 2017, section VI (115.3 ms for 4 images)"),
    Figure("eyeriss", "AlexNet CONV1-5, batch 4", "mW", 278.0, "JSSC 2017, abstract"),
    Figure("eyeriss", "AlexNet CONV1-5, batch 4", "DRAM accesses/MAC", 0.0029, "JSSC 2017, abstract (16-bit words)"),
    Figure("eyeriss", "VGG-16 CONV1-13, batch 3", "fps", 0.7, "JSSC 2017, abstract"),
    Figure("eyeriss", "VGG-16 CONV1-13, batch 3", "mW", 236.0, "JSSC 2017, abstract"),
    Figure("eyeriss", "VGG-16 CONV1-13, batch 3", "DRAM accesses/MAC", 0.0035, "JSSC 2017, abstract (16-bit words)"),
    Figure("tpu-v1", "MLP0", "TOPS", 12.3, "ISCA 2017, Table 3"),
    Figure("tpu-v1", "MLP1", "TOPS", 9.7, "ISCA 2017, Table 3"),
    Figure("tpu-v1", "LSTM0", "TOPS", 3.7, "ISCA 2017, Table 3"),
    Figure("tpu-v1", "LSTM1", "TOPS", 2.8, "ISCA 2017, Table 3"),
    Figure("tpu-v1", "CNN0", "TOPS", 86.0, "ISCA 2017, Table 3"),
    Figure("tpu-v1", "CNN1", "TOPS", 14.1, "ISCA 2017, Table 3"),
]

FORMAT = {"eyeriss": "int16", "tpu-v1": "int8"}


# ---- the workloads -------------------------------------------------------------------------------------------------


def _compile(make: Callable, inputs: list[tuple[int, ...]], name: str):
    import torch
    import torch_ir

    import npu_compiler
    from npu_export.ir_io import ir_to_dict

    with torch.device("meta"):
        model = make().eval()
    with torch.no_grad():
        ir = torch_ir.extract_ir(model, tuple(torch.empty(s, device="meta") for s in inputs), model_name=name)
    return npu_compiler.compile(ir_to_dict(ir), "cpu", dtype="float16")


def _layers_module(layers: list):
    """One input per layer, one output per layer: relu(layer_i(x_i)). Each layer reads its input from DRAM and writes
    its output there, as the papers measured the layers (pooling between them is not part of the measurement)."""
    import torch

    class Layers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(layers())

        def forward(self, *xs):
            return tuple(torch.relu(layer(x)) for layer, x in zip(self.layers, xs))

    return Layers


def alexnet_convs():
    """AlexNet's five convolutions as Eyeriss ran them (the original two-group network, 227 x 227 input, 2.66 GMACs
    for 4 images: the paper's count), batch 4."""
    import torch.nn as nn

    def layers():
        return [nn.Conv2d(3, 96, 11, stride=4), nn.Conv2d(96, 256, 5, padding=2, groups=2),
                nn.Conv2d(256, 384, 3, padding=1), nn.Conv2d(384, 384, 3, padding=1, groups=2),
                nn.Conv2d(384, 256, 3, padding=1, groups=2)]

    shapes = [(4, 3, 227, 227), (4, 96, 27, 27), (4, 256, 13, 13), (4, 384, 13, 13), (4, 384, 13, 13)]
    return _compile(_layers_module(layers), shapes, "alexnet_convs")


VGG16 = [(3, 64, 224), (64, 64, 224), (64, 128, 112), (128, 128, 112), (128, 256, 56), (256, 256, 56),
         (256, 256, 56), (256, 512, 28), (512, 512, 28), (512, 512, 28), (512, 512, 14), (512, 512, 14),
         (512, 512, 14)]


def vgg16_convs():
    """VGG-16's thirteen 3 x 3 convolutions (224 x 224 input, 15.3 GMACs an image), batch 3."""
    import torch.nn as nn

    def layers():
        return [nn.Conv2d(c, o, 3, padding=1) for c, o, _ in VGG16]

    return _compile(_layers_module(layers), [(3, c, s, s) for c, _, s in VGG16], "vgg16_convs")


def _mlp(batch: int, width: int, depth: int, name: str):
    import torch.nn as nn

    def make():
        layers = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        return nn.Sequential(*layers)

    return _compile(make, [(batch, width)], name)


def _lstm(batch: int, width: int, fcs: int, vectors: int, name: str):
    """`fcs` fully connected layers of width x width; `vectors` elementwise layers (the gates' sigmoid and tanh
    products) spread over them: after FC i a sigmoid, and a tanh product after the first `vectors - fcs`."""
    import torch
    import torch.nn as nn

    class Lstm(nn.Module):
        def __init__(self):
            super().__init__()
            self.fcs = nn.ModuleList(nn.Linear(width, width) for _ in range(fcs))

        def forward(self, x):
            for i, fc in enumerate(self.fcs):
                x = torch.sigmoid(fc(x))
                if i < vectors - fcs:
                    x = x * torch.tanh(x)
            return x

    return _compile(Lstm, [(batch, width)], name)


def _cnn0():
    """16 convolutions of 3 x 3 on a 19 x 19 board, 236 channels, batch 8 (assumed shapes: 16 x 9 x 236^2 = 8.0 M
    weights and 8 x 19 x 19 = 2888 MACs per weight byte, Table 1's figures)."""
    import torch.nn as nn

    def make():
        layers = []
        for _ in range(16):
            layers += [nn.Conv2d(236, 236, 3, padding=1), nn.ReLU()]
        return nn.Sequential(*layers)

    return _compile(make, [(8, 236, 19, 19)], "cnn0")


def _cnn1():
    """72 convolutions of 3 x 3, 256 channels, on 11 x 11 with a 3 x 3 max pool after every sixth (13 pools, the
    last after the stack), and 4 fully connected layers of 3793 x 3793, batch 32 (assumed shapes: 42.5 M + 57.5 M =
    100 M weights and 1663 MACs per weight byte against Table 1's 1750)."""
    import torch
    import torch.nn as nn

    class Cnn1(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = nn.ModuleList(nn.Conv2d(256, 256, 3, padding=1) for _ in range(72))
            self.fcs = nn.ModuleList(nn.Linear(3793, 3793) for _ in range(4))

        def forward(self, x, v):
            for i, conv in enumerate(self.convs):
                x = torch.relu(conv(x))
                if i % 6 == 5 or i == 71:
                    x = torch.nn.functional.max_pool2d(x, 3, 1, 1)
            for fc in self.fcs:
                v = torch.relu(fc(v))
            return x, v

    return _compile(Cnn1, [(32, 256, 11, 11), (32, 3793)], "cnn1")


WORKLOADS: dict[str, Callable] = {
    "AlexNet CONV1-5, batch 4": alexnet_convs,
    "VGG-16 CONV1-13, batch 3": vgg16_convs,
    "MLP0": functools.partial(_mlp, 200, 2000, 5, "mlp0"),  # 5 FC, 20 M weights, batch 200
    "MLP1": functools.partial(_mlp, 168, 1118, 4, "mlp1"),  # 4 FC, 5 M weights, batch 168
    "LSTM0": functools.partial(_lstm, 64, 1472, 24, 34, "lstm0"),  # 24 FC + 34 vector, 52 M weights, batch 64
    "LSTM1": functools.partial(_lstm, 96, 959, 37, 19, "lstm1"),  # 37 FC + 19 vector, 34 M weights, batch 96
    "CNN0": _cnn0,
    "CNN1": _cnn1,
}
BATCH = {"AlexNet CONV1-5, batch 4": 4, "VGG-16 CONV1-13, batch 3": 3}


@functools.cache
def program(workload: str):
    return WORKLOADS[workload]()


@functools.cache
def predicted(chip: str, workload: str) -> dict[str, float]:
    """Every metric the table compares, from the chip's preset and the workload's program."""
    from npu_compiler.npu import estimate_program, load_npu

    est = estimate_program(program(workload), load_npu(chip), number_format=FORMAT[chip])
    on_chip_pj = sum(v for k, e in ((k, k.est.energy_pj) for k in est.kernels) for key, v in e.items()
                     if key != "dram")
    word = 2 if FORMAT[chip] == "int16" else 1
    return {"fps": BATCH.get(workload, 1) / est.time_s, "mW": on_chip_pj * 1e-12 / est.time_s * 1e3,
            "DRAM accesses/MAC": est.dram_bytes / word / est.macs, "TOPS": 2 * est.macs / est.time_s / 1e12,
            "macs": est.macs, "time_s": est.time_s}


@dataclass(frozen=True)
class Row:
    figure: Figure
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.figure.published - 1

    @property
    def within(self) -> bool:
        return abs(self.error) <= TOLERANCE


def table_rows() -> list[Row]:
    return [Row(f, predicted(f.chip, f.workload)[f.metric]) for f in FIGURES]


def _fmt(v: float) -> str:
    if v >= 100:
        return f"{v:.0f}"
    if v >= 1:
        return f"{v:.1f}"
    return f"{v:.2g}" if v >= 0.01 else f"{v:.4f}"


def markdown(rows: list[Row]) -> str:
    lines = [f"Published silicon vs the model (`python bench/npu_silicon.py --write-docs`; tolerance "
             f"{TOLERANCE:.0%} end to end, checked by tests/test_npu_silicon.py).", "",
             "| chip (preset) | workload | metric | published | model | error | within | source |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        f = r.figure
        lines.append(f"| {f.chip} | {f.workload} | {f.metric} | {_fmt(f.published)} | {_fmt(r.predicted)} | "
                     f"{100 * r.error:+.0f}% | {'yes' if r.within else '**no**'} | {f.source} |")
    inside = sum(r.within for r in rows)
    lines += ["", f"{inside} of {len(rows)} figures within {TOLERANCE:.0%}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write-docs", action="store_true", help=f"put the table into {DOCS.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    rows = table_rows()
    text = markdown(rows)
    print(text)
    for w in WORKLOADS:
        chip = "eyeriss" if w in BATCH else "tpu-v1"
        p = predicted(chip, w)
        print(f"  {w}: {p['macs'] / 1e9:.2f} GMAC in {p['time_s'] * 1e3:.2f} ms on {chip}", file=sys.stderr)
    if args.write_docs and write_between_markers(DOCS, BEGIN, END, text):
        return 1
    return 0 if math.isfinite(sum(r.predicted for r in rows)) else 1


if __name__ == "__main__":
    sys.exit(main())
