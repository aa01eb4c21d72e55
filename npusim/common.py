"""Helpers the subcommands share: input files, generated inputs, compile options."""

from __future__ import annotations

import argparse
import os

import numpy as np

from npu_compiler.program import CompiledProgram, TensorSpec
from npu_runtime.dtypes import np_dtype
from npu_runtime.errors import InputError


def add_compile_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="auto",
                   help="compute dtype: auto (from the weights: fp16 CNNs, bf16 LLMs), float32, float16, bfloat16")
    from npu_compiler.compiler import OPTIONAL_PASSES

    p.add_argument("--disable-pass", action="append", default=[], metavar="NAME", choices=OPTIONAL_PASSES,
                   help="switch off an optional pass by name (repeatable), to bisect a numerical problem: "
                        + ", ".join(OPTIONAL_PASSES))
    p.add_argument("--no-fusion", action="store_true", help="switch off every fusion pass (BN folding stays)")
    p.add_argument("--rope-theta", type=float, default=None,
                   help="rotary base, to compute inv_freq buffers that no checkpoint holds")


def add_run_options(p: argparse.ArgumentParser) -> None:
    """Weights, inputs, backend and seed: what every command that runs a program takes."""
    p.add_argument("--weights", required=True, help="safetensors file or folder of shards")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input array (repeatable); inputs not given are generated: floats at random, integers "
                        "inside their valid range")
    p.add_argument("--backend", default=None, help="cpu, cuda (default: best available, or $NPUSIM_BACKEND)")
    p.add_argument("--seed", type=int, default=0, help="seed for generated inputs")


def compile_kwargs(args: argparse.Namespace) -> dict:
    kw = {"dtype": None if args.dtype == "auto" else args.dtype, "disable_passes": list(args.disable_pass),
          "rope_theta": args.rope_theta}
    if getattr(args, "no_fusion", False):
        from npu_compiler.compiler import FUSION_PASSES

        kw["disable_passes"] = sorted(set(kw["disable_passes"]) | set(FUSION_PASSES))
    return kw


def parse_inputs(items: list[str]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for item in items or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--input expects NAME=FILE.npy, got {item!r}")
        if not os.path.exists(path):
            raise InputError(f"--input {name}: file not found: {path}")
        try:
            out[name] = np.load(path, allow_pickle=False)
        except ValueError as e:
            raise InputError(f"--input {name}: {path} is not a .npy array file: {e}") from e
    return out


def generate_input(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """Floats at random; integers inside their valid range (token ids below the embedding's rows)."""
    dt = np_dtype(spec.dtype)
    if spec.dtype == "bool":
        return rng.random(spec.shape) < 0.5
    if dt.kind in "iu":
        lo, hi = spec.value_range or (0, 16)
        return rng.integers(lo, max(hi, lo + 1), size=spec.shape).astype(dt)
    return rng.standard_normal(spec.shape).astype(np.float32).astype(dt)


def input_specs_from_ir(ir) -> list[TensorSpec]:
    """Input specs straight from an IR (for the partition path, where no single program exists)."""
    from npu_compiler.compiler import _value_range
    from npu_compiler.ir.reader import read_ir

    graph = read_ir(ir)
    return [TensorSpec(v.name, v.shape, v.dtype, v.dtype, -1, value_range=_value_range(graph, v)) for v in graph.inputs]


def complete_inputs(program: CompiledProgram | list[TensorSpec], given: dict[str, np.ndarray], seed: int = 0
                    ) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = dict(given)
    specs = program.inputs if isinstance(program, CompiledProgram) else program
    for spec in specs:
        if spec.name not in out:
            out[spec.name] = generate_input(spec, rng)
    return out
