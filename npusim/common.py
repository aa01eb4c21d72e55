"""Helpers the subcommands share: options that mean the same everywhere, input files, generated inputs."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from npu_compiler.program import CompiledProgram, TensorSpec
from npu_runtime.errors import InputError
from npu_runtime.input_files import generate_input, how_generated

from . import argtypes

DTYPES = ("float32", "float16", "bfloat16")


class CLIError(InputError):
    """Options that do not go together, or a value the command cannot use: one line, exit status 2."""


# ---- options --------------------------------------------------------------------------------------------------------


def add_compile_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="auto", choices=("auto", *DTYPES),
                   help="compute dtype; auto: the model's own (its weights' dtype: an fp32 model stays fp32, a bf16 "
                        "checkpoint bf16) where the target computes it, else the nearest it does (from fp32: "
                        "float16 for a model with convolutions, bfloat16 otherwise); the choice and why are printed")
    from npu_compiler.compiler import OPTIONAL_PASSES

    p.add_argument("--disable-pass", action="append", default=[], metavar="NAME", choices=OPTIONAL_PASSES,
                   help="switch off an optional pass by name (repeatable), to bisect a numerical problem: "
                        + ", ".join(OPTIONAL_PASSES))
    p.add_argument("--no-fusion", action="store_true", help="switch off every fusion pass (BN folding stays)")
    p.add_argument("--rope-theta", type=argtypes.positive, default=None,
                   help="rotary base, to compute inv_freq buffers that no checkpoint holds (default: the IR's)")
    from npu_compiler.devices import chip_names

    p.add_argument("--device", default=None, metavar="NAME",
                   help="the GPU to plan the kernels for, a row of the chip table: " + ", ".join(chip_names())
                        + " (default: $NPUSIM_DEVICE, else the device present for the target, else the target's "
                          "default chip: cuda h100, webgpu the WebGPU specification's limits, hip mi250x); the "
                          "artifact records it")


def add_run_options(p: argparse.ArgumentParser) -> None:
    """Weights, inputs, backend and seed: what every command that runs a program takes."""
    p.add_argument("--weights", default=None,
                   help="safetensors file or folder of shards (default: the model file's stem + .safetensors beside "
                        "it, when present: out/m.npubin or out/m.json -> out/m.safetensors)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input array (repeatable); inputs not given are generated (and the command says so): "
                        "floats from N(0, 1), integers uniform inside their valid range")
    add_backend_option(p)
    p.add_argument("--seed", type=argtypes.seed, default=0, help="seed for generated inputs (0 to 2**63-1)")
    add_nonfinite_option(p)


def add_nonfinite_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-nonfinite-weights", action="store_true",
                   help="load weights that hold NaN or infinities (or become infinite in the compute dtype), with a "
                        "warning, instead of refusing them (an attention mask stored as a weight may hold -inf)")


def add_backend_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default=None,
                   help="cpu, cuda or webgpu (default: $NPUSIM_BACKEND, else the best available: cuda where a GPU and "
                        "CuPy are present, then webgpu on a GPU adapter, else cpu)")


WEIGHTS_SUFFIX = ".safetensors"


def beside(model_file: str) -> str | None:
    """The checkpoint beside an IR or artifact under the same stem (out/m.json, out/m.npubin -> out/m.safetensors),
    where `npusim export` writes it; None when there is none."""
    stem, ext = os.path.splitext(model_file)
    candidate = stem + WEIGHTS_SUFFIX
    return candidate if ext in (".json", ".npubin") and os.path.isfile(candidate) else None


def resolve_weights(args: argparse.Namespace, model_file: str, quiet: bool = False) -> str:
    """--weights, else the checkpoint beside the model file (and the command says which it took); a CLIError naming
    both ways when there is neither."""
    if args.weights is not None:
        return args.weights
    found = beside(model_file)
    if found is None:
        stem = os.path.splitext(model_file)[0]
        raise CLIError(f"give the weights: --weights FILE.safetensors (or a folder of shards); none given, and no "
                       f"{stem}{WEIGHTS_SUFFIX} beside {model_file}")
    if not quiet:
        import sys

        print(f"weights: {found} (beside {model_file}; --weights to give others)", file=sys.stderr)
    args.weights = found
    return found


def check_weights_digest(program: CompiledProgram, weights: str) -> dict | None:
    """When the artifact records the SHA-256 of the weights it was compiled or verified with: the given weights'
    digest beside it, and a warning when they differ (the results are then those of other weights)."""
    if program.weights_sha256 is None or not os.path.exists(weights):
        return None
    import warnings

    from npu_compiler.digest import short, weights_digest
    from npu_compiler.errors import NPUSimWarning

    given = weights_digest(weights)
    same = given == program.weights_sha256
    if not same:
        warnings.warn(NPUSimWarning(f"weights {weights} are not the ones the artifact was compiled or verified with "
                                    f"(sha256 {short(given)} given, {short(program.weights_sha256)} recorded): its "
                                    "results are those of other weights"), stacklevel=2)
    return {"recorded": program.weights_sha256, "given": given, "same": same}


def default_target(given: str | None) -> tuple[str, str]:
    """The target to compile for, and why: the one asked for, else the best available backend's (the one `run`,
    `verify` and `generate` take by default), so that what `compile` and `export-llm` write runs here as it is."""
    if given is not None:
        return given, "--target"
    from npu_runtime.backend import default_backend_name, get_backend

    name = default_backend_name()
    target = get_backend(name).compile_target()
    return target, (f"the default: the target of backend '{name}', the best available here, which `npusim run` "
                    f"uses; --target cpu for the reference backend")


def device_line(backend) -> str | None:
    """What the backend runs on, for the commands' output (None where it has nothing to say: the cpu)."""
    text = backend.describe()
    return f"device: {text}" if text else None


def add_timing_options(p: argparse.ArgumentParser, what: str = "timed runs") -> None:
    p.add_argument("--warmup", type=argtypes.integer(0, argtypes.MAX_RUNS, "count"), default=2,
                   help=f"untimed runs first (caches, lazy kernel builds; at most {argtypes.MAX_RUNS})")
    p.add_argument("--iters", type=argtypes.integer(1, argtypes.MAX_RUNS, "count"), default=10,
                   help=f"{what} (at most {argtypes.MAX_RUNS})")


def add_force_cpu_option(p: argparse.ArgumentParser) -> None:
    # One value per flag (commas allowed): a list-taking option would swallow the positional file argument.
    p.add_argument("--force-cpu", action="extend", default=[], metavar="OP", type=_comma_list,
                   help="run these ops (cumsum, add.Tensor, aten.add.Tensor) or node names on the CPU (the CPU "
                        "reference, which has every op the targets have) as segments of the same program; "
                        "repeatable, or comma-separated (--force-cpu relu_,add_)")


def _comma_list(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expects an op or node name")
    return items


def add_quiet_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress display")


def compile_kwargs(args: argparse.Namespace) -> dict:
    kw = {"dtype": None if args.dtype == "auto" else args.dtype, "disable_passes": list(args.disable_pass),
          "rope_theta": args.rope_theta, "device": getattr(args, "device", None)}
    if getattr(args, "no_fusion", False):
        from npu_compiler.compiler import FUSION_PASSES

        kw["disable_passes"] = sorted(set(kw["disable_passes"]) | set(FUSION_PASSES))
    return kw


def planned_device(kw: dict, target: str, backend=None) -> dict:
    """`kw` (compile_kwargs) with the device to plan for: --device, else $NPUSIM_DEVICE (the compiler reads it),
    else the device present for the target (the backend's, or the one a backend of the target would use here), else
    the target's default chip."""
    import os

    from npu_compiler.targets.codegen import DEVICE_ENV

    if kw.get("device") is None and target != "cpu" and not os.environ.get(DEVICE_ENV):
        if backend is not None:
            kw["device"] = backend.device_profile()
        else:
            from npu_runtime.backend import present_device

            kw["device"] = present_device(target)
    return kw


def dtype_line(program) -> str:
    """`compute dtype D (why)`: the policy's choice for this program or partitioned program
    (npu_compiler.passes.dtype)."""
    reason = program.stats.get("compute_dtype_reason") if isinstance(program.stats, dict) else None
    return f"compute dtype {program.compute_dtype}" + (f" ({reason})" if reason else "")


def check_output_folder(path: str, option: str = "-o") -> None:
    """Fail before any work (not after a minute of compiling) when an output file's folder does not exist, or when
    the path is not one npusim writes (a link, a FIFO, a device, one of the command's own inputs:
    `npu_compiler.atomic.check_target`)."""
    from npu_compiler.atomic import check_target

    if not path:
        raise CLIError(f"{option}: an empty file name")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CLIError(f"{option} {path}: folder {folder} does not exist")
    if os.path.isdir(path) and not os.path.islink(path):
        raise CLIError(f"{option} {path}: is a folder; give a file name")
    check_target(path, f"{option}: cannot write")


def check_outputs(folder: str, names: Sequence[str]) -> None:
    """Before any work: the files a command will write into `folder` (made if missing) are ones it may write (not
    a link, a FIFO, a device or one of the command's inputs: `npu_compiler.atomic.check_target`)."""
    from npu_compiler.atomic import check_target

    for name in names:
        check_target(os.path.join(folder, name))


# ---- inputs ---------------------------------------------------------------------------------------------------------


def parse_inputs(items: list[str]) -> dict[str, np.ndarray]:
    """--input NAME=FILE.npy arrays, each checked before it is read (npu_runtime/input_files.py)."""
    from npu_runtime.input_files import load_inputs

    return load_inputs(items)


def input_specs_from_ir(ir) -> list[TensorSpec]:
    """Input specs straight from an IR (for the partition path, where no single program exists)."""
    from npu_compiler.compiler import _value_range
    from npu_compiler.ir.reader import read_ir

    graph = read_ir(ir)
    return [TensorSpec(v.name, v.shape, v.dtype, v.dtype, -1, value_range=_value_range(graph, v)) for v in graph.inputs]


@dataclass
class Inputs:
    arrays: dict[str, np.ndarray]
    generated: list[str]  # one line per input that was generated, saying how

    def notice(self, seed: int) -> str | None:
        if not self.generated:
            return None
        return (f"generated {len(self.generated)} input(s) (seed {seed}; give --input NAME=FILE.npy for your own):\n"
                + "\n".join(f"  {line}" for line in self.generated))


def collect_inputs(program: CompiledProgram | Sequence[TensorSpec], given: dict[str, np.ndarray], seed: int = 0,
                   contract=None) -> Inputs:
    """The given inputs, checked by name, and the missing ones generated (`Inputs.generated` says which and how):
    those of a `contract` (an LLM graph's, `npusim.llm_contract`) consistent with each other, the rest each in its
    own valid range."""
    specs = list(program.inputs if isinstance(program, CompiledProgram) else program)
    known = {s.name for s in specs}
    unknown = sorted(set(given) - known)
    if unknown:
        raise InputError(f"--input {', '.join(unknown)}: no such input; the model's inputs are "
                         + ", ".join(f"{s.name} {s.dtype}{list(s.shape)}" for s in specs))
    warn_nonfinite("input", given)
    rng = np.random.default_rng(seed)
    out = dict(given)
    lines = []
    if contract is not None:
        made, lines = contract.generate(specs, given, rng)
        out.update(made)
    for spec in specs:
        if spec.name not in out:
            out[spec.name] = generate_input(spec, rng)
            lines.append(f"{spec.name} {spec.dtype}{list(spec.shape)}: {how_generated(spec)}")
    return Inputs(out, lines)


def warn_nonfinite(kind: str, arrays: dict[str, np.ndarray], effect: str = "") -> list[str]:
    """An NPUSimWarning for each array holding NaN or infinities (how many, the first); the names that do."""
    import warnings

    from npu_compiler.errors import NPUSimWarning
    from npu_runtime.metrics import nonfinite

    effect = effect or ("every output it reaches may be NaN or infinite" if kind == "input" else "")
    bad = []
    for name, a in arrays.items():
        found = nonfinite(a)
        if found is not None:
            bad.append(name)
            warnings.warn(NPUSimWarning(f"{kind} '{name}' holds {found.describe()}" + (f": {effect}" if effect
                                                                                           else "")), stacklevel=2)
    return bad


def complete_inputs(program: CompiledProgram | Sequence[TensorSpec], given: dict[str, np.ndarray], seed: int = 0
                    ) -> dict[str, np.ndarray]:
    return collect_inputs(program, given, seed).arrays
