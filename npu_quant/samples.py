"""Calibration samples: arrays from a folder of .npy files, or generated at random (the CLI's two sources).

A folder for a model with one input holds .npy files each shaped like that input, or like K of them stacked
([K, *shape]: K samples); for several inputs, files named `SAMPLE.INPUT.npy`, one per input of each sample. Every
file is read by `npu_runtime.input_files.load_npy` (header checked first, no pickles)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import numpy as np

from npu_compiler.program import TensorSpec
from npu_runtime.dtypes import np_dtype
from npu_runtime.errors import InputError


def _cast(a: np.ndarray, spec: TensorSpec, where: str) -> np.ndarray:
    want = np_dtype(spec.dtype)
    if a.dtype.kind == "f" and want.kind != "f":
        raise InputError(f"{where}: holds {a.dtype} values for the integer input {spec.name} ({spec.dtype})")
    return a.astype(want, copy=False)


def folder_samples(folder: str, specs: Sequence[TensorSpec]) -> list[dict[str, np.ndarray]]:
    """The samples of a calibration folder (see the module's docstring), checked against the graph's inputs."""
    from npu_runtime.input_files import load_npy

    if not os.path.isdir(folder):
        raise InputError(f"--calibration {folder}: not a folder")
    files = sorted(f for f in os.listdir(folder) if f.endswith(".npy"))
    if not files:
        raise InputError(f"--calibration {folder}: holds no .npy files")
    by_name = {s.name: s for s in specs}
    samples: list[dict[str, np.ndarray]] = []
    if len(specs) == 1:
        spec = specs[0]
        for f in files:
            a = load_npy(spec.name, os.path.join(folder, f))
            where = f"--calibration {os.path.join(folder, f)}"
            if tuple(a.shape) == tuple(spec.shape):
                samples.append({spec.name: _cast(a, spec, where)})
            elif tuple(a.shape[1:]) == tuple(spec.shape):
                samples.extend({spec.name: _cast(x, spec, where)} for x in a)
            else:
                raise InputError(f"{where}: shape {list(a.shape)}; the input {spec.name} is {list(spec.shape)} (or "
                                 f"[K, {', '.join(map(str, spec.shape))}] for K samples)")
        return samples
    grouped: dict[str, dict[str, np.ndarray]] = {}
    for f in files:
        stem, _, name = f[:-4].rpartition(".")
        where = f"--calibration {os.path.join(folder, f)}"
        if not stem or name not in by_name:
            raise InputError(f"{where}: name it SAMPLE.INPUT.npy, INPUT one of {', '.join(by_name)}")
        a = load_npy(name, os.path.join(folder, f))
        if tuple(a.shape) != tuple(by_name[name].shape):
            raise InputError(f"{where}: shape {list(a.shape)}; the input {name} is {list(by_name[name].shape)}")
        grouped.setdefault(stem, {})[name] = _cast(a, by_name[name], where)
    for stem, sample in sorted(grouped.items()):
        missing = sorted(set(by_name) - set(sample))
        if missing:
            raise InputError(f"--calibration {folder}: sample {stem} has no file for {', '.join(missing)}")
        samples.append(sample)
    return samples


def random_samples(specs: Sequence[TensorSpec], n: int, seed: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """`n` samples drawn as `npusim run` draws missing inputs (floats N(0, 1), integers inside their valid range)."""
    from npu_runtime.input_files import generate_input

    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield {s.name: generate_input(s, rng) for s in specs}
