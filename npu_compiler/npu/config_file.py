"""NPU description files: the presets shipped in `presets/` and the user's own TOML files, read into an `NPUConfig`.

A file is TOML with the sections and keys that `NPUConfig`'s field metadata names (`array.rows`, `dram.latency_ns`,
...). `base = "PRESET"` starts from a preset and overrides only the keys the file gives. Every problem is one line
that names the file and the field: unknown keys, wrong types, negative or zero sizes, an unknown dataflow.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from pathlib import Path
from typing import Any

from ..errors import NPUCompileError
from ..targets.config import DATAFLOWS, FORMAT_BITS, NPUConfig
from ..text import unsafe_char

PRESET_DIR = Path(__file__).with_name("presets")


class NPUConfigError(NPUCompileError):
    """An NPU description file (or preset name) is missing or wrong."""


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def load_npu(spec: str | os.PathLike[str]) -> NPUConfig:
    """A preset by name ('tpu-v1', 'eyeriss', 'edge-4tops') or a TOML file by path."""
    text = os.fspath(spec)
    path = Path(text)
    if not path.suffix and not path.exists():
        preset = PRESET_DIR / f"{text}.toml"
        if not preset.is_file():
            raise NPUConfigError(f"unknown NPU preset {text!r}; presets: {', '.join(preset_names())}, or give the "
                                 "path of a .toml file")
        path = preset
    return _load_file(path, seen=())


def _load_file(path: Path, seen: tuple[str, ...]) -> NPUConfig:
    where = str(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError as e:
        raise NPUConfigError(f"{where}: NPU file not found") from e
    except IsADirectoryError as e:
        raise NPUConfigError(f"{where}: is a folder, not an NPU file") from e
    except tomllib.TOMLDecodeError as e:
        raise NPUConfigError(f"{where}: not valid TOML: {e}") from e
    except UnicodeDecodeError as e:
        raise NPUConfigError(f"{where}: not a text file: {e}") from e
    return from_mapping(data, where, seen)


def _flatten(data: dict[str, Any], where: str) -> dict[str, Any]:
    tables = {f.metadata["key"] for f in dataclasses.fields(NPUConfig) if f.metadata["check"] == "formats"}
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            for sub, v in value.items():
                if isinstance(v, dict) and f"{key}.{sub}" not in tables:
                    raise NPUConfigError(f"{where}: {key}.{sub}: unexpected table (sections nest one level)")
                flat[f"{key}.{sub}"] = v
        else:
            flat[key] = value
    return flat


def from_mapping(data: dict[str, Any], where: str = "<npu>", seen: tuple[str, ...] = ()) -> NPUConfig:
    """An NPUConfig from parsed TOML (sections as nested dicts), checked field by field."""
    flat = _flatten(data, where)
    fields = {f.metadata["key"]: f for f in dataclasses.fields(NPUConfig)}
    values: dict[str, Any] = {}
    base = flat.pop("base", None)
    if base is not None:
        if not isinstance(base, str):
            raise NPUConfigError(f"{where}: base: expected a preset name (string), got {type(base).__name__}")
        if base in seen:
            raise NPUConfigError(f"{where}: base: preset {base!r} includes itself")
        preset = PRESET_DIR / f"{base}.toml"
        if not preset.is_file():
            raise NPUConfigError(f"{where}: base: unknown preset {base!r}; presets: {', '.join(preset_names())}")
        values = dataclasses.asdict(_load_file(preset, (*seen, base)))
    unknown = sorted(set(flat) - set(fields))
    if unknown:
        known = ", ".join(sorted(fields))
        raise NPUConfigError(f"{where}: unknown key {unknown[0]!r}; known keys: base, {known}")
    for key, value in flat.items():
        f = fields[key]
        values[f.name] = check_value(where, key, f, value)
    missing = [f.metadata["key"] for f in dataclasses.fields(NPUConfig)
               if f.name not in values and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise NPUConfigError(f"{where}: missing {missing[0]!r} ({fields[missing[0]].metadata['doc']})"
                             + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
    return NPUConfig(**values)


def check_value(where: str, key: str, f: dataclasses.Field, value: Any) -> Any:
    """`value` for the NPUConfig field `f` (file key `key`), checked and converted, or a one-line error naming
    `where` and the key."""
    check = f.metadata["check"]
    want = f.type if isinstance(f.type, str) else f.type.__name__

    def bad(expected: str) -> NPUConfigError:
        return NPUConfigError(f"{where}: {key}: expected {expected}, got {value!r}")

    if want == "str":
        if not isinstance(value, str) or unsafe_char(value):
            raise bad("a string without control characters")
        if check == "dataflow":
            name = value.lower()
            full = {v: k for k, v in DATAFLOWS.items()}.get(name, name)
            if full not in DATAFLOWS:
                raise bad(f"one of {', '.join(DATAFLOWS)}")
            return full
        return value
    if check == "formats":
        if not isinstance(value, dict):
            raise bad("a table of number formats, e.g. { int8 = 1.0, int16 = 0.25 }")
        out = {}
        for fmt, v in value.items():
            if fmt not in FORMAT_BITS:
                raise NPUConfigError(f"{where}: {key}.{fmt}: unknown number format; formats: "
                                     f"{', '.join(FORMAT_BITS)}")
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise NPUConfigError(f"{where}: {key}.{fmt}: expected a number >= 0, got {v!r}")
            out[fmt] = float(v)
        return out
    if want == "bool":
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad("an integer" if want == "int" else "a number")
    if want == "int" and not isinstance(value, int):
        raise bad("an integer")
    if not math.isfinite(value):
        raise bad("a finite number")
    if check == "positive" and value <= 0:
        raise bad("a positive " + ("integer" if want == "int" else "number"))
    if check == "non_negative" and value < 0:
        raise bad("a number >= 0")
    return int(value) if want == "int" else float(value)
