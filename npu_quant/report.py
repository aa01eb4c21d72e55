"""The per-tensor report of a quantized model: for every quantized activation, its scale and zero point and the SQNR
of its int8 values (dequantized) against the float model's tensor on the same inputs, worst first.

    SQNR = 10 log10(sum(x^2) / sum((x - dequantize(q))^2))   in dB, over every element of every sample

The float side is the float IR on the CPU reference (float32), the quantized side the quantized IR compiled for the
CPU reference (its integer kernels), both one kernel per op so that every tensor is some kernel's output. An error
there grows layer by layer: the first tensor far below its neighbours is where to look (a clipped range, an outlier
channel)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

import npu_compiler

from .calibration import method_used
from .flow import Observer, Quantized, float_program, node_outputs


@dataclass
class TensorReport:
    name: str
    scale: float
    zero_point: int
    dtype: str
    method: str
    sqnr_db: float
    max_abs_err: float
    float_range: tuple[float, float]


def sqnr_report(ir: Mapping[str, Any], weights: Any, q: Quantized, samples: Iterable[Mapping[str, np.ndarray]],
                method: str = "minmax") -> list[TensorReport]:
    """Every tensor of `q.plan` (views as the tensor they view), worst SQNR first."""
    tensors = list(q.plan.tensors)
    signal = dict.fromkeys(tensors, 0.0)
    noise = dict.fromkeys(tensors, 0.0)
    worst = dict.fromkeys(tensors, 0.0)
    lo = dict.fromkeys(tensors, math.inf)
    hi = dict.fromkeys(tensors, -math.inf)
    fprog = float_program(ir)
    qprog = npu_compiler.compile(q.ir, "cpu", dtype="float32", fusion=False)
    q_alias = {f"{t}_quantize": f"{_viewed(q.plan.views, t)}_quantize" for t in q.plan.views}
    floats = Observer(fprog, weights, tensors, q.plan.alias_of, node_outputs(ir))
    ints = Observer(qprog, q.weights, [f"{t}_quantize" for t in tensors], q_alias, node_outputs(q.ir))
    ref: dict[str, np.ndarray] = {}

    def compare(name: str, v: np.ndarray) -> None:
        t = name.removesuffix("_quantize")
        p = q.qparams[t]
        x = ref[t].astype(np.float64).reshape(-1)
        d = (v.astype(np.float64).reshape(-1) - p.zero_point) * p.scale
        signal[t] += float(np.sum(x * x))
        noise[t] += float(np.sum((x - d) ** 2))
        worst[t] = max(worst[t], float(np.max(np.abs(x - d))) if x.size else 0.0)
        lo[t], hi[t] = min(lo[t], float(x.min())), max(hi[t], float(x.max()))

    for sample in samples:
        ref.clear()
        floats.run(sample, ref.__setitem__)
        ints.run(sample, compare)
    rows = []
    for t in tensors:
        p = q.qparams[t]
        sq = math.inf if noise[t] == 0 else -math.inf if signal[t] == 0 else 10 * math.log10(signal[t] / noise[t])
        used = method_used(q.stats[t], method) if t in q.stats else "same as its input"
        rows.append(TensorReport(t, p.scale, p.zero_point, p.dtype, used, sq, worst[t], (lo[t], hi[t])))
    rows.sort(key=lambda r: r.sqnr_db)
    return rows


def _viewed(views: Mapping[str, str], t: str) -> str:
    """The tensor a chain of quantized views reads (no kernel writes a view: the values are that tensor's)."""
    while t in views:
        t = views[t]
    return t


def format_report(rows: list[TensorReport], limit: int | None = None) -> str:
    nw = max([len("tensor"), *(len(r.name) for r in rows)])
    lines = [f"{'tensor':<{nw}} {'SQNR dB':>8} {'scale':>11} {'zp':>5} {'max|err|':>10} {'float range':>22}  method"]
    for r in rows[:limit]:
        rng = f"[{r.float_range[0]:.4g}, {r.float_range[1]:.4g}]"
        lines.append(f"{r.name:<{nw}} {r.sqnr_db:>8.2f} {r.scale:>11.4g} {r.zero_point:>5} {r.max_abs_err:>10.4g} "
                     f"{rng:>22}  {r.method}")
    if limit is not None and len(rows) > limit:
        lines.append(f"... {len(rows) - limit} more (best last); the whole table is in the .quant.json file")
    return "\n".join(lines)


def report_json(rows: list[TensorReport]) -> list[dict]:
    return [{**asdict(r), "sqnr_db": r.sqnr_db if math.isfinite(r.sqnr_db) else str(r.sqnr_db)} for r in rows]


def dumps(data: Any) -> str:
    return json.dumps(data, indent=1)
