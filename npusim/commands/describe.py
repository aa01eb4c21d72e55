"""npusim describe X.npubin [--json] [--segment N] [--source K] [--graph dot|mermaid]"""

from __future__ import annotations

import argparse
import json


def register(sub) -> None:
    p = sub.add_parser("describe", help="inspect a .npubin artifact",
                       description="Inputs/outputs, weights and their recipes, buffers and memory, kernels with the "
                                   "IR nodes each came from. A partitioned artifact (ops the target lacks on the CPU) "
                                   "shows its partition report (every node on the CPU, why, and whether the CPU "
                                   "reference or torch_ir runs it), its segments and transfers; --segment N describes "
                                   "one segment's program as a whole artifact.")
    p.add_argument("artifact", help=".npubin file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--source", default=None, metavar="KERNEL",
                   help="print one kernel (by index or name): its record, with expressions as formulas, and the "
                        "source its target renders from it (CUDA C for cuda, WGSL for webgpu at WebGPU's default "
                        "limits; the cpu backend interprets the record); "
                        "default: the whole program is described")
    p.add_argument("--segment", type=int, default=None, metavar="N",
                   help="of a partitioned artifact: describe segment N's program (--source and --graph need one; "
                        "default: the whole artifact, its report and segments)")
    p.add_argument("--graph", choices=("dot", "mermaid"), default=None,
                   help="print only the fused graph (kernels; edges where a kernel reads what another wrote) as "
                        "Graphviz DOT or Mermaid text")
    p.set_defaults(func=run)


def _order_name(order: list[int], rank: int) -> str:
    """A 4-d image's memory order by name (NHWC for channels-last), any other as the order of its dims. Size-1 dims
    (absent from `order`: their place does not matter) go before the first larger dim, so that one image stored
    channels-last reads NHWC, not HWCN."""
    full = list(order)
    for d in range(rank):
        if d not in full:
            full.insert(next((i for i, x in enumerate(full) if x > d), len(full)), d)
    if rank == 4:
        return "".join("NCHW"[d] for d in full) + " in memory"
    return f"dims in memory order {full}"


def run(args: argparse.Namespace) -> int:
    from npu_compiler.partitioned_program import PartitionedProgram, load_artifact

    from ..common import CLIError

    if args.graph and args.json:
        raise CLIError("--graph prints DOT or Mermaid text, --json the description: use one or the other")
    art = load_artifact(args.artifact)
    if isinstance(art, PartitionedProgram):
        if args.segment is None:
            return _partitioned(args, art)
        programs = [s.index for s in art.segments if s.program is not None]
        if args.segment not in programs:
            raise CLIError(f"--segment {args.segment}: not a program segment of {args.artifact} (those are "
                           f"{', '.join(map(str, programs)) or 'none'}; the others hold IR nodes run by torch_ir)")
        return _program(args, art.segments[args.segment].program)
    if args.segment is not None:
        raise CLIError(f"--segment: {args.artifact} is one program, not a partitioned artifact")
    return _program(args, art)


def _partitioned(args: argparse.Namespace, art) -> int:
    """A partitioned artifact: its report, its segments and transfers."""
    from npu_compiler.partition import format_report, runner_text

    from ..common import CLIError

    if args.source is not None or args.graph:
        raise CLIError(f"{args.artifact} is partitioned: pick a segment's program with --segment N for --source or "
                       "--graph")
    d = art.describe()
    if args.json:
        print(json.dumps(d, indent=1))
        return 0
    print(f"{d['model_name']}  target={d['target']}  compute={d['compute_dtype']}  format v{d['format_version']}  "
          f"partitioned: {len(art.segments)} segments, {art.kernel_count} kernels")
    if art.stats.get("compute_dtype_reason"):
        print(f"compute dtype: {art.stats['compute_dtype_reason']}")
    _print_io(d)
    print(format_report(art.plan()))
    print("segments:")
    for s in d["segments"]:
        who = runner_text(s["runner"], art.target)
        if "kernels" in s:
            kinds: dict[str, int] = {}
            for k in s["kernels"]:
                kinds[k["kind"]] = kinds.get(k["kind"], 0) + 1
            what = (f"{s['kernel_count']} kernels ({', '.join(f'{k} {n}' for k, n in kinds.items())}), weights "
                    f"{s['weight_bytes'] / 1e6:.3f} MB")
        else:
            what = "IR nodes: " + ", ".join(dict.fromkeys(s["ops"]))
        print(f"  {s['index']:>3} {who}: {len(s['nodes'])} node(s), {what}")
    print(f"next: npusim describe {args.artifact} --segment N (one segment's program, its kernels and sources)")
    return 0


def _program(args: argparse.Namespace, prog) -> int:
    from ..graphviz import size_breakdown, to_dot, to_mermaid

    if args.source is not None:
        return _print_kernel(prog, args.source)
    if args.graph:
        print(to_dot(prog) if args.graph == "dot" else to_mermaid(prog), end="")
        return 0
    d = prog.describe()
    d["sizes"] = size_breakdown(prog)
    device = _device(prog.target)
    if device:
        d["device"] = device
    if args.json:
        print(json.dumps(d, indent=1))
        return 0
    print(f"{d['model_name']}  target={d['target']}  compute={d['compute_dtype']}  format v{d['format_version']}")
    if prog.device is not None:
        p = prog.device
        print(f"planned for: {p.title} ({p.name}: {p.arch}, {p.multiprocessors} "
              f"{'CUs' if p.vendor == 'amd' else 'SMs'}, {p.shared_memory_per_block_optin // 1024} KiB shared memory "
              f"a block)")
    if device:
        print(f"device: {device}")
    if d["weights_sha256"]:
        print(f"weights: sha256 {d['weights_sha256']} (compiled or verified with; `npusim run` checks)")
    print(f"passes: {', '.join(d['passes'])}")
    _print_io(d)
    print(f"memory: weights {d['weight_bytes'] / 1e6:.3f} MB, buffers {d['buffer_bytes'] / 1e6:.3f} MB "
          f"(arena {d['arena_bytes'] / 1e6:.3f} MB for intermediates that would take "
          f"{d['unplanned_intermediate_bytes'] / 1e6:.3f} MB unshared)")
    z = d["sizes"]
    print(f"artifact: {z['artifact_bytes'] / 1e3:.1f} kB (kernel records {z['kernel_bytes'] / 1e3:.1f} kB, "
          f"constants {z['constant_bytes'] / 1e3:.1f} kB, "
          f"buffer table {z['buffer_table_bytes'] / 1e3:.1f} kB, other metadata "
          f"{z['other_metadata_bytes'] / 1e3:.1f} kB); weights {z['weight_device_bytes'] / 1e6:.3f} MB on the "
          "device, loaded from the checkpoint")
    recipes = {}
    for w in d["weights"]:
        recipes[w["recipe"]] = recipes.get(w["recipe"], 0) + 1
    layouts = {}
    for w in d["weights"]:
        if "layout" in w:
            layouts[str(w["layout"])] = layouts.get(str(w["layout"]), 0) + 1
    stored = "".join(f"; {n} stored with their dims in the order {o}" for o, n in layouts.items())
    print(f"weights: {len(d['weights'])} ({', '.join(f'{k} {v}' for k, v in recipes.items())}){stored}")
    print(f"kernels: {d['kernel_count']} ({', '.join(f'{k} {v}' for k, v in d['kernels_by_kind'].items())})")
    for k in d["kernels"]:
        nodes = ", ".join(k["nodes"][:6]) + (" ..." if len(k["nodes"]) > 6 else "")
        notes = []
        if "out_order" in k:
            notes.append(_order_name(k["out_order"], len(k["out_shape"])))
        if "splits" in k:
            notes.append(f"K split {k['splits']} ways")
        extra = f"  [{', '.join(notes)}]" if notes else ""
        print(f"  {k['index']:>4} {k['kind']:<20} {k['group']:<28} {str(k['out_shape']):<20} {k['format']:<20} "
              f"<- {nodes}{extra}")
    if d["fusion_groups"]:
        print(f"fusion groups: {len(d['fusion_groups'])} kernels stand for more than one IR node")
        for g in d["fusion_groups"]:
            print(f"  {g['kernel']:<22} {g['group']:<20} <- {', '.join(g['nodes'])}")
    if d["padding_plan"]:
        extra = sum(p["extra_bytes"] for p in d["padding_plan"])
        print(f"channel padding plan: {len(d['padding_plan'])} tensors, {extra / 1e6:.3f} MB extra")
    return 0


def _print_io(d: dict) -> None:
    print("inputs:")
    for t in d["inputs"]:
        # half-open, as generated inputs and `generate` use it: token ids 0..vocab-1 are [0, vocab)
        extra = f"  valid range [{t['value_range'][0]}, {t['value_range'][1]})" if "value_range" in t else ""
        print(f"  {t['name']:<24} {t['dtype']}{t['shape']} (device {t['device_dtype']}){extra}")
    print("outputs:")
    for t in d["outputs"]:
        extra = f"  (updates input '{t['alias_of']}' in place)" if "alias_of" in t else ""
        print(f"  {t['name']:<24} {t['dtype']}{t['shape']}{extra}")


def _device(target: str) -> str | None:
    """The device a backend of the artifact's target would run it on here, where that backend describes one (a
    webgpu artifact is rendered for the adapter's limits and features when it is loaded)."""
    from npu_runtime import backend as registry

    if target not in registry.registered_backends():
        return None
    why = registry.unavailable_reason(target)
    if why is not None:
        return f"none here for target '{target}' ({why})" if target == "webgpu" else None
    return registry.get_backend(target).describe()


def _print_kernel(prog, which: str) -> int:
    from npu_compiler.targets.codegen import get_codegen_target

    from ..common import CLIError

    by_name = {k.name: i for i, k in enumerate(prog.kernels)}
    if which in by_name:
        index = by_name[which]
    elif which.isdigit() and int(which) < len(prog.kernels):
        index = int(which)
    else:
        raise CLIError(f"--source {which!r}: no such kernel (give an index 0..{len(prog.kernels) - 1} or a name "
                       f"like {prog.kernels[0].name if prog.kernels else 'k0_generated'})")
    k = prog.kernels[index]
    print(f"kernel #{index} {k.name}: {k.kind} ({k.group}) <- {', '.join(k.nodes)}")
    if k.spec.library_reason:
        print(f"  a library kernel: {k.spec.library_reason}")
    for tag, refs in (("arg", k.args), ("out", k.outs)):
        for i, r in enumerate(refs):
            b = prog.buffers[r.buffer]
            print(f"  {tag}{i}: buffer {b.id} '{b.name}' ({b.kind}, {b.dtype}) shape {list(r.shape)} strides "
                  f"{list(r.strides)} offset {r.offset}")
    for line in k.spec.describe():
        print(f"  {line}")
    sources = get_codegen_target(prog.target, prog.device).kernel_sources(k, prog)
    if not sources:
        print(f"  (target '{prog.target}': the backend runs the record itself; there is no source text)")
    for j, text in enumerate(sources):
        print(f"---- {prog.target} source {j + 1}/{len(sources)} ----")
        print(text, end="" if text.endswith("\n") else "\n")
    return 0
