"""A mapping given by the user: per layer, the row-stationary choices the mapper would otherwise make.

Validation studies of analytical models feed the chip's own mapping (Timeloop/Accelergy's Eyeriss validation does);
`estimate_program(..., mapping=...)` and `npusim estimate --mapping FILE` take one. A file is TOML (`.toml`) or JSON
(`.json`): one table per layer, named by a kernel or one of its graph nodes, with the fields of `FIELDS`:

    [conv2d_1]
    channels_per_pass = 1   # q: the input channels a PE interleaves in one pass over the channels
    filters_per_pass = 16   # p: the filters a PE interleaves (default: the most its scratchpads hold for that q)

A layer the file does not name keeps the mapper's choice. Every problem is one line naming the file, the layer and
the field: an unknown layer or field, a value that is not a whole number, one outside what the layer has and the
scratchpads hold, a layer that is not a convolution on a row-stationary array.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..targets.config import NPUConfig
from ..text import shown
from .config_file import NPUConfigError
from .rowstationary import RSLayer, channels_limit, filters_limit

FIELDS = {"channels_per_pass": "input channels a PE interleaves in a pass (q)",
          "filters_per_pass": "filters a PE interleaves (p)"}


class MappingError(NPUConfigError):
    """A mapping (file or argument) names what the program lacks or asks for what the hardware cannot hold."""


@dataclass(frozen=True)
class LayerMapping:
    channels_per_pass: int | None = None
    filters_per_pass: int | None = None
    where: str = "mapping"  # the file and the layer, for errors

    def choose(self, layer: RSLayer, npu: NPUConfig) -> tuple[int, int]:
        """(q, p) for `layer` on `npu`: the given values, the mapper's for those not given; checked against the
        layer's channels and filters and the PE's scratchpads."""
        q_max = channels_limit(layer, npu)
        q = self.channels_per_pass or q_max
        if not 1 <= q <= q_max:
            raise MappingError(f"{self.where}: channels_per_pass = {q} is outside 1..{q_max} (the layer has "
                               f"{layer.c} channels a group; the input scratchpad holds {npu.ifmap_spad} values, "
                               f"{layer.s} a channel)")
        p_max = filters_limit(layer, npu, q)
        p = self.filters_per_pass or p_max
        if not 1 <= p <= p_max:
            raise MappingError(f"{self.where}: filters_per_pass = {p} is outside 1..{p_max} (the layer has {layer.m} "
                               f"filters; the partial-sum scratchpad holds {npu.psum_spad}, the filter scratchpad "
                               f"{npu.filter_spad} weights, {q * layer.s} a filter at {q} channels a pass)")
        return q, p


def load_mapping(path: str | os.PathLike[str]) -> dict[str, LayerMapping]:
    """A mapping file (TOML or JSON by its extension), checked for form: layer names to `LayerMapping`s."""
    where = os.fspath(path)
    suffix = Path(where).suffix.lower()
    if suffix not in (".toml", ".json"):
        raise MappingError(f"{where}: a mapping file is .toml or .json")
    try:
        with open(where, "rb") as f:
            data = tomllib.load(f) if suffix == ".toml" else json.load(f)
    except FileNotFoundError as e:
        raise MappingError(f"{where}: mapping file not found") from e
    except IsADirectoryError as e:
        raise MappingError(f"{where}: is a folder, not a mapping file") from e
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MappingError(f"{where}: not valid {suffix[1:].upper()}: {e}") from e
    return parse_mapping(data, where)


def parse_mapping(data: Any, where: str = "mapping") -> dict[str, LayerMapping]:
    """Layer names to `LayerMapping`s from parsed TOML or JSON (or a dict given to the API), checked field by field."""
    if not isinstance(data, Mapping):
        raise MappingError(f"{where}: expected a table of layers, got {type(data).__name__}")
    out = {}
    for name, fields in data.items():
        at = f"{where}: [{shown(name)}]"
        if not isinstance(fields, Mapping):
            raise MappingError(f"{at}: expected a table of {', '.join(FIELDS)}, got {type(fields).__name__}")
        unknown = sorted(set(fields) - set(FIELDS))
        if unknown:
            raise MappingError(f"{at}: unknown field {unknown[0]!r} (fields: {', '.join(FIELDS)})")
        if not fields:
            raise MappingError(f"{at}: no field given (fields: {', '.join(FIELDS)})")
        for key, value in fields.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise MappingError(f"{at}: {key} must be a whole number ({FIELDS[key]}), got {value!r}")
            if value < 1:
                raise MappingError(f"{at}: {key} must be at least 1, got {value}")
        out[str(name)] = LayerMapping(**fields, where=at)
    return out


Kernels = list[tuple[str, list[str]]]  # (kernel name, its graph nodes) in program order


def _hits(name: str, kernels: Kernels) -> list[int]:
    return [i for i, (kname, nodes) in enumerate(kernels) if name == kname or name in nodes]


def _unknown(name: str, m: LayerMapping) -> MappingError:
    return MappingError(f"{m.where}: no kernel or node of the program is named {shown(name)!r}")


def by_program(names: Mapping[str, LayerMapping],
               programs: Mapping[str, Kernels]) -> dict[str, dict[str, LayerMapping]]:
    """`names` split among several programs (an export-llm folder's prefill and decode, a partitioned artifact's
    segments): each program gets the layers it has; a name none has is an error."""
    out: dict[str, dict[str, LayerMapping]] = {kind: {} for kind in programs}
    for name, m in names.items():
        homes = [kind for kind, kernels in programs.items() if _hits(name, kernels)]
        if not homes:
            raise _unknown(name, m)
        for kind in homes:
            out[kind][name] = m
    return out


def by_kernel(names: Mapping[str, LayerMapping], kernels: Kernels) -> dict[int, LayerMapping]:
    """The mapping of each kernel (index) from `names`: a layer name is a kernel's name or one of its nodes'. A name
    no kernel has, or two names for one kernel, is an error."""
    out: dict[int, LayerMapping] = {}
    for name, m in names.items():
        hits = _hits(name, kernels)
        if not hits:
            raise _unknown(name, m)
        for i in hits:
            if i in out:
                raise MappingError(f"{m.where}: kernel {kernels[i][0]!r} is mapped already ({out[i].where})")
            out[i] = m
    return out
