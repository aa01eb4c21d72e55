"""Typed kernel records as data: every field written by its type, and read back checked against its type and its
range, so that a kernel record from an artifact is either exactly what a lowering could have built or an error that
names the field. Every field is written, and every field is required when read (a default applies to records a
lowering builds, never to one read from a file).

A record is a frozen dataclass. Field types understood: int, float, bool, str, tuple[int, ...], an expression
(`nodes.Expr`), a nested record, a tuple of records, and `X | None` of those. A field's metadata may bound it:
`lo`/`hi` (ints and each element of an int tuple) and `choices` (strings).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from functools import cache
from typing import Any

from ..expr import nodes as X

SIZE_MAX = 2**40  # no dimension, count or offset of a kernel is larger: bounds everything read before it is used


def bounded(lo: int = 0, hi: int = SIZE_MAX, **kw: Any) -> Any:
    """A dataclass field whose int value (or every element of an int tuple) lies in [lo, hi]."""
    return dataclasses.field(metadata={"lo": lo, "hi": hi}, **kw)


def one_of(*choices: str, **kw: Any) -> Any:
    return dataclasses.field(metadata={"choices": choices}, **kw)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def to_data(record: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        out[f.name] = _value_to_data(getattr(record, f.name))
    return out


def _value_to_data(v: Any) -> Any:
    if isinstance(v, X.Expr):
        return X.to_data(v)
    if dataclasses.is_dataclass(v):
        return to_data(v)
    if isinstance(v, tuple):
        return [_value_to_data(x) if dataclasses.is_dataclass(x) else x for x in v]
    return v


def from_data(cls: type, d: Any, where: str) -> Any:
    """A record of `cls` from its data, or ValueError naming `where` and the field."""
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected a mapping of fields, got {type(d).__name__}")
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in d if k not in names)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}")
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        # every field is required, those with a default in the record's definition too: a field an artifact lacks
        # (an edited one, its checksum recomputed) read as the default would make a kernel compute something else
        if f.name not in d:
            raise ValueError(f"{where}: missing field '{f.name}'")
        values[f.name] = _read(hints[f.name], d[f.name], f.metadata, f"{where}.{f.name}")
    return cls(**values)


def _read(tp: Any, v: Any, meta: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        opts = [a for a in typing.get_args(tp) if a is not type(None)]
        if v is None:
            return None
        return _read(opts[0], v, meta, where)
    if tp is bool:
        if not isinstance(v, bool):
            raise ValueError(f"{where}: expected true or false, got {_short(v)}")
        return v
    if tp is int:
        return _int(v, meta, where)
    if tp is float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"{where}: expected a number, got {_short(v)}")
        if isinstance(v, int) and abs(v) > 2**1023:
            raise ValueError(f"{where}: {v} is out of range")
        return float(v)
    if tp is str:
        if not isinstance(v, str):
            raise ValueError(f"{where}: expected a string, got {_short(v)}")
        choices = meta.get("choices")
        if choices and v not in choices:
            raise ValueError(f"{where}: {v!r} is not one of {', '.join(choices)}")
        return v
    if origin is tuple:
        if not isinstance(v, list | tuple):
            raise ValueError(f"{where}: expected a list, got {_short(v)}")
        if len(v) > 64:
            raise ValueError(f"{where}: {len(v)} entries (at most 64)")
        element = typing.get_args(tp)[0]
        if dataclasses.is_dataclass(element):
            return tuple(from_data(element, x, f"{where}[{i}]") for i, x in enumerate(v))
        return tuple(_int(x, meta, f"{where}[{i}]") for i, x in enumerate(v))
    if tp is X.Expr:
        try:
            return X.from_data(v)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    if dataclasses.is_dataclass(tp):
        return from_data(tp, v, where)
    raise TypeError(f"{where}: field type {tp!r} has no reader")  # a bug in a record definition


def _int(v: Any, meta: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{where}: expected an integer, got {_short(v)}")
    lo, hi = meta.get("lo", -SIZE_MAX), meta.get("hi", SIZE_MAX)
    if not lo <= v <= hi:
        raise ValueError(f"{where}: {v} is outside [{lo}, {hi}]")
    return v


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def finite(x: float, where: str) -> float:
    if not math.isfinite(x):
        raise ValueError(f"{where}: {x} is not finite")
    return x
