"""Design sweeps: the same program(s) estimated on every combination of NPU parameters, with the Pareto front of
latency, energy and (where the preset gives per-component area) area.

`--sweep rows=64,128,256 --sweep weights_kib=128,256` names NPU file keys by their full dotted name
(`array.rows`, `buffers.weights_kib`) or by their last part when that is unique; values are comma-separated and
checked like the key's values in a file.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..targets.config import NPUConfig
from .config_file import NPUConfigError, check_value

SWEEP_LIMIT = 4096  # combinations; more is a typo more often than a plan


@dataclass(frozen=True)
class Axis:
    key: str  # the file key (array.rows)
    name: str  # the NPUConfig field
    values: tuple[Any, ...]


@dataclass
class SweepPoint:
    params: dict[str, Any]  # file key -> value
    time_s: float
    energy_pj: float
    dram_bytes: int
    area_mm2: float
    pareto: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class SweepReport:
    base: str
    axes: list[Axis]
    points: list[SweepPoint] = field(default_factory=list)

    @property
    def has_area(self) -> bool:
        return any(p.area_mm2 > 0 for p in self.points)

    def to_dict(self) -> dict[str, Any]:
        return {"base": self.base, "axes": {a.key: list(a.values) for a in self.axes},
                "objectives": ["time_s", "energy_pj"] + (["area_mm2"] if self.has_area else []),
                "points": [p.to_dict() for p in self.points]}


def parse_axes(specs: Sequence[str]) -> list[Axis]:
    """`KEY=V1,V2,...` per spec: every key known and given once, every value valid for it."""
    fields = {f.metadata["key"]: f for f in dataclasses.fields(NPUConfig) if f.metadata["check"] != "formats"}
    fields.pop("name")
    fields.pop("description")
    short: dict[str, list[str]] = {}
    for key in fields:
        short.setdefault(key.rsplit(".", 1)[-1], []).append(key)
    axes: list[Axis] = []
    for spec in specs:
        name, sep, text = spec.partition("=")
        name = name.strip()
        if not sep or not text.strip():
            raise NPUConfigError(f"--sweep {spec!r}: expected KEY=V1,V2,... (e.g. rows=64,128,256)")
        key = name if name in fields else None
        if key is None:
            matches = short.get(name, [])
            if len(matches) != 1:
                hint = (f"ambiguous: {', '.join(matches)}" if matches
                        else f"known keys: {', '.join(sorted(fields))}")
                raise NPUConfigError(f"--sweep {name!r}: unknown NPU key ({hint})")
            key = matches[0]
        if any(a.key == key for a in axes):
            raise NPUConfigError(f"--sweep {key}: given twice")
        values = tuple(check_value("--sweep", key, fields[key], _literal(v.strip()))
                       for v in text.split(",") if v.strip())
        if not values:
            raise NPUConfigError(f"--sweep {key}: no values")
        axes.append(Axis(key, fields[key].name, values))
    total = 1
    for a in axes:
        total *= len(a.values)
    if total > SWEEP_LIMIT:
        raise NPUConfigError(f"--sweep: {total} combinations (at most {SWEEP_LIMIT})")
    return axes


def _literal(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def configs(base: NPUConfig, axes: Sequence[Axis]) -> list[tuple[dict[str, Any], NPUConfig]]:
    """Every combination, in the order the axes were given (the last varying fastest)."""
    out = []
    for combo in itertools.product(*(a.values for a in axes)):
        params = {a.key: v for a, v in zip(axes, combo)}
        out.append((params, dataclasses.replace(base, **{a.name: v for a, v in zip(axes, combo)})))
    return out


def run_sweep(base: NPUConfig, axes: Sequence[Axis], evaluate: Callable[[NPUConfig], tuple[float, float, int]],
              progress: Callable[[int, int, dict[str, Any]], None] | None = None) -> SweepReport:
    """`evaluate(npu) -> (seconds, picojoules, DRAM bytes)` at every combination; marks the Pareto front."""
    report = SweepReport(base.name, list(axes))
    combos = configs(base, axes)
    for i, (params, npu) in enumerate(combos):
        if progress is not None:
            progress(i, len(combos), params)
        time_s, energy, dram = evaluate(npu)
        report.points.append(SweepPoint(params, time_s, energy, dram, npu.area_mm2))
    mark_pareto(report.points, with_area=report.has_area)
    return report


def mark_pareto(points: list[SweepPoint], with_area: bool) -> None:
    """A point is on the front when no other point is at least as good in every objective (latency, energy, and
    area where known) and better in one."""
    def objectives(p: SweepPoint) -> tuple[float, ...]:
        return (p.time_s, p.energy_pj, p.area_mm2) if with_area else (p.time_s, p.energy_pj)

    for p in points:
        mine = objectives(p)
        p.pareto = not any(all(o <= m for o, m in zip(objectives(q), mine)) and objectives(q) != mine
                           for q in points if q is not p)
