"""npusim export MODEL -o DIR: IR JSON (+ safetensors) for your own nn.Module (MODULE:FACTORY) or a built-in model."""

from __future__ import annotations

import argparse
import os
import sys

from .. import argtypes
from ..common import DTYPES, CLIError, check_outputs

BUILTIN = ("resnet18", "resnet50", "qwen2")

# The kinds of model each option applies to (options not listed apply to all): given to another kind, an option is
# an error, never silently ignored.
APPLIES_TO = {
    "input_shape": {"module"}, "checkpoint": {"module"}, "name": {"module"}, "factory_arg": {"module"},
    "seed": {"module", "resnet"},
    "batch": {"resnet"}, "image_size": {"resnet"}, "num_classes": {"resnet"}, "width": {"resnet"},
    "model_dir": {"qwen2"}, "config": {"qwen2"}, "max_cache_len": {"qwen2"}, "prefill_len": {"qwen2"},
    "attn": {"qwen2"},
}


class _DeprecatedDtype(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"npusim export: warning: {option_string} is deprecated; use --dtype", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _input_spec(text: str) -> tuple[str, str]:
    return ("shape", text)


def _input_npy(text: str) -> tuple[str, str]:
    return ("npy", text)


def register(sub) -> None:
    p = sub.add_parser(
        "export", help="export your nn.Module (MODULE:FACTORY) or a built-in model to IR JSON + safetensors",
        description="Export a PyTorch model with torch.export through pytorch-ir: writes DIR/NAME.json (the graph) "
                    "and DIR/NAME.safetensors (its weights).\n\n"
                    "  npusim export mymodels:make_net --input-shape 1,3,224,224 -o out\n"
                    "  npusim export models/net.py:Net --input-shape 1,16 --input-shape 1,16:int64 -o out\n"
                    "  npusim export mymodels:make_net --input-npy x.npy --checkpoint trained.pt -o out\n"
                    "  npusim export resnet18 -o out        (built-in ResNet, random weights)\n"
                    "  npusim export qwen2 --config tiny -o out   (static-cache prefill/decode graphs)\n\n"
                    "MODULE:FACTORY is imported from the current folder (or FILE.py:FACTORY from a file); FACTORY "
                    "is called and must return a torch.nn.Module (a class or an instance works too).")
    p.add_argument("model", metavar="MODEL",
                   help="MODULE:FACTORY or FILE.py:FACTORY (your model), or a built-in: " + ", ".join(BUILTIN))
    p.add_argument("-o", "--output", required=True, help="output folder (created if missing)")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="cast the model's floating weights to this dtype before export (default: the model's own "
                        "dtype; qwen2: bfloat16)")
    p.add_argument("--llm-dtype", dest="dtype", choices=DTYPES, action=_DeprecatedDtype, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=argtypes.seed, default=0,
                   help="torch seed set before the model is built (random weights)")
    own = p.add_argument_group("your model (MODULE:FACTORY)")
    own.add_argument("--input-shape", dest="input_shape", action="append", type=_input_spec, default=[],
                     metavar="SHAPE[:DTYPE]",
                     help="an example input, one per forward argument in order: 1,3,224,224 (a float input in the "
                          "model's dtype) or 1,128:int64 (repeatable)")
    own.add_argument("--input-npy", dest="input_shape", action="append", type=_input_npy, default=[],
                     metavar="FILE.npy",
                     help="an example input with the shape and dtype of this array (repeatable; mixes with "
                          "--input-shape in command-line order)")
    own.add_argument("--checkpoint", default=None,
                     help="load this state dict into the model first: .safetensors, or .pt/.pth/.bin saved with "
                          "torch.save(model.state_dict()) (default: the factory's own weights)")
    own.add_argument("--name", default=None, help="file stem of the outputs (default: the factory's name)")
    own.add_argument("--factory-arg", action="append", default=[], metavar="KEY=VALUE",
                     help="keyword argument for the factory, a Python literal or a string (repeatable)")
    cnn = p.add_argument_group("resnet18, resnet50")
    cnn.add_argument("--batch", type=argtypes.integer(1, 1 << 16, "size"), default=1, help="batch size")
    cnn.add_argument("--image-size", type=argtypes.integer(1, 1 << 16, "size"), default=224,
                     help="input height and width")
    cnn.add_argument("--num-classes", type=argtypes.integer(1, 1 << 24, "count"), default=1000,
                     help="classifier outputs")
    cnn.add_argument("--width", type=argtypes.integer(1, 1 << 16, "count"), default=64,
                     help="base width (64 = the real model)")
    llm = p.add_argument_group("qwen2")
    llm.add_argument("--model-dir", default=None, help="a Hugging Face model folder (config.json + safetensors)")
    llm.add_argument("--config", default=None, help="a built-in config instead: tiny, qwen2.5-0.5b, qwen2.5-1.5b")
    llm.add_argument("--max-cache-len", type=argtypes.integer(1, 1 << 20, "length"), default=256,
                     help="static KV cache length")
    llm.add_argument("--prefill-len", type=argtypes.integer(1, 1 << 20, "length"), default=32,
                     help="prefill chunk length")
    llm.add_argument("--attn", default="eager", choices=["eager", "sdpa"], help="attention implementation")
    p.set_defaults(func=run, _defaults={a.dest: a.default for a in p._actions})


def _family(model: str) -> str:
    from npu_export.model_ref import is_model_ref

    if model in ("resnet18", "resnet50"):
        return "resnet"
    if model == "qwen2":
        return "qwen2"
    if is_model_ref(model):
        return "module"
    raise CLIError(f"MODEL {model!r}: give MODULE:FACTORY (e.g. mymodels:make_net), FILE.py:FACTORY, or a built-in "
                   f"({', '.join(BUILTIN)})")


def _check_options(args: argparse.Namespace, family: str) -> None:
    given = [d for d, kinds in APPLIES_TO.items() if family not in kinds and getattr(args, d) != args._defaults[d]]
    if given:
        flags = ", ".join("--" + d.replace("_", "-") for d in given)
        own = ", ".join("--" + d.replace("_", "-") for d, kinds in APPLIES_TO.items() if family in kinds)
        raise CLIError(f"{flags} {'does' if len(given) == 1 else 'do'} not apply to {args.model}; its options: {own}")


def run(args: argparse.Namespace) -> int:
    family = _family(args.model)
    _check_options(args, family)
    if family == "module":
        return _export_module(args)
    if family == "resnet":
        return _export_resnet(args)
    return _export_qwen2(args)


def _example_inputs(items: list[tuple[str, str]]) -> list:
    import numpy as np

    from npu_export.errors import ExportError

    out = []
    for kind, text in items:
        if kind == "npy":
            if not os.path.isfile(text):
                raise ExportError(f"--input-npy {text}: file not found")
            try:
                out.append(np.load(text, mmap_mode="r", allow_pickle=False))
            except ValueError as e:
                raise ExportError(f"--input-npy {text}: not a .npy array file ({e})") from e
            continue
        shape_text, _, dtype = text.partition(":")
        try:
            shape = tuple(int(n) for n in shape_text.replace("x", ",").split(",") if n.strip())
        except ValueError:
            raise ExportError(f"--input-shape {text!r}: expected sizes separated by commas, like 1,3,224,224 or "
                              "1,128:int64") from None
        if not shape and shape_text.strip():
            raise ExportError(f"--input-shape {text!r}: no sizes")
        out.append((shape, dtype) if dtype else shape)
    return out


def _print_result(res, what: str, weights_note: str) -> None:
    print(f"exported {what} -> {res.ir_path}, {res.weights_path} ({weights_note})")
    for name, shape, dtype in res.inputs:
        print(f"  input  {name:<16} {dtype}{shape}")
    for name, shape, dtype in res.outputs:
        print(f"  output {name:<16} {dtype}{shape}")
    print("next:\n" + "\n".join(f"  {line}" for line in next_steps(res)))


def next_steps(res) -> list[str]:
    """The commands that work for this export on this machine: for the backend `run` and `verify` pick by default,
    the target to compile for and the compute dtype it will get (and the half dtype to try); where some ops have no
    lowering for that target, which ones (they run on the CPU in the same artifact) and where to see why."""
    import npu_runtime
    from npu_compiler.errors import NPUSimError
    from npu_compiler.ir.reader import read_ir
    from npu_compiler.op_support import support_predicate
    from npu_compiler.partition import partition
    from npu_compiler.passes.dtype import explain_compute_dtype, has_convolutions
    from npu_compiler.targets.config import default_config

    ir, weights = str(res.ir_path), str(res.weights_path)
    art = os.path.splitext(ir)[0] + ".npubin"
    own_inputs = " ".join(f"--input {name}=FILE.npy" for name, _, _ in res.inputs)
    backend = npu_runtime.get_backend()
    target = backend.compile_target()
    try:
        graph = read_ir(ir)
        fallback = partition(ir, support_predicate(target)).fallback
        choice = explain_compute_dtype(graph, default_config(target), None)
    except NPUSimError as e:  # the export itself is fine; say why no more can be suggested
        return [f"npusim verify {ir} --weights {weights}     (compile, run, compare with PyTorch)",
                f"(the graph does not compile for '{target}' as it is: {e})"]
    steps = [f"npusim verify {ir} --weights {weights}     (compile for {target}, run on {backend.name}, compare with "
             "PyTorch)",
             f"npusim compile {ir} -o {art} --target {target}     (compute dtype {choice.dtype}, {choice.reason})"]
    if fallback:
        ops = sorted({f.op for f in fallback})
        steps.append(f"npusim describe {art}     ({len(fallback)} node(s) have no lowering for '{target}' and run on "
                     f"the CPU in the same artifact: {', '.join(ops[:4])}{', ...' if len(ops) > 4 else ''}; this "
                     "says where and why)")
    steps.append(f"npusim run {art} --weights {weights}     (inputs generated; {own_inputs} for your own)")
    half = "float16" if has_convolutions(graph) else "bfloat16"
    if choice.dtype == "float32" and half in default_config(target).compute_dtypes:
        steps.append(f"in {half}, the precision an NPU computes in: add --dtype {half} to verify and compile")
    return steps


def _export_module(args: argparse.Namespace) -> int:
    import torch

    from npu_export import export_model
    from npu_export.checkpoint import load_checkpoint
    from npu_export.model_ref import load_model, parse_factory_args

    if not args.input_shape:
        raise CLIError("give the example inputs: --input-shape 1,3,224,224 (or --input-npy FILE.npy), one per "
                       "argument of the model's forward")
    inputs = _example_inputs(args.input_shape)
    torch.manual_seed(args.seed)
    model, factory = load_model(args.model, parse_factory_args(args.factory_arg))
    if args.checkpoint:
        load_checkpoint(model, args.checkpoint)
    name = args.name or factory.lower()
    check_outputs(args.output, [f"{name}.json", f"{name}.safetensors"])
    os.makedirs(args.output, exist_ok=True)
    res = export_model(model, inputs, args.output, name, dtype=args.dtype)
    note = f"weights from {args.checkpoint}" if args.checkpoint else f"the factory's weights, torch seed {args.seed}"
    _print_result(res, type(model).__name__, note)
    return 0


def _export_resnet(args: argparse.Namespace) -> int:
    import torch

    from npu_export import export_model, resnet

    check_outputs(args.output, [f"{args.model}.json", f"{args.model}.safetensors"])
    torch.manual_seed(args.seed)
    model = getattr(resnet, args.model)(num_classes=args.num_classes, width=args.width).eval()
    os.makedirs(args.output, exist_ok=True)
    res = export_model(model, [(args.batch, 3, args.image_size, args.image_size)], args.output, args.model,
                       dtype=args.dtype)
    _print_result(res, args.model, f"random weights, seed {args.seed}")
    return 0


def _export_qwen2(args: argparse.Namespace) -> int:
    from npu_export.qwen2 import export_qwen2, qwen2_config

    if (args.model_dir is None) == (args.config is None):
        raise CLIError("qwen2: give --model-dir DIR or --config NAME (one of them)")
    source = args.model_dir or qwen2_config(args.config)
    check_outputs(args.output, ["prefill.json", "decode.json", "cache_map.json"])
    os.makedirs(args.output, exist_ok=True)
    res = export_qwen2(source, args.output, max_cache_len=args.max_cache_len, prefill_len=args.prefill_len,
                       dtype=args.dtype or "bfloat16", attn_implementation=args.attn)
    print(f"exported qwen2 -> {res.prefill_path}, {res.decode_path}, {res.cache_map_path}")
    print("next: npusim export-llm compiles both graphs into a folder that `npusim generate` runs "
          "(--random-weights when you have no checkpoint)")
    return 0
