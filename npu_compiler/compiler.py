"""`compile()`: IR JSON -> `CompiledProgram`, through the passes of DESIGN.md."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .collector import collector_paused
from .decompose import decompose
from .dtypes import INT_DTYPES
from .errors import ConstraintError, InternalError, NPUCompileError, NPUSimError, UnsupportedOpError, entry_point
from .ir.graph import Graph
from .ir.reader import read_ir
from .ir.schema import lookup
from .limits import MAX_BYTES_ENV, Limits, format_bytes
from .lowering.column_epilogues import fold_column_epilogues
from .lowering.lower import Lowering
from .lowering.memory_plan import check_plan, plan_memory
from .lowering.planning import plan_folded
from .lowering.side_convs import fold_side_convs
from .memory_check import check_memory, check_sizes
from .output_roles import class_outputs
from .passes.bn_fold import fold_batchnorm
from .passes.constraints import check_constraints, plan_channel_padding
from .passes.dead_code import remove_unread
from .passes.dtype import apply_compute_dtype, explain_compute_dtype
from .passes.normalize import canonicalize_conv_padding, inplace_to_outofplace, remove_noops
from .passes.slice_hoisting import hoist_slices
from .program import CompiledProgram, Recipe, WeightSpec
from .quant.fold import fold_quantized
from .quant.weight_only import DEFAULT_GROUP, HEAD_DTYPES, WEIGHTS_DTYPES, quantize_weights_only
from .targets.codegen import get_codegen_target
from .targets.config import TargetConfig, default_config

# Fusion passes, in the order they run; `--no-fusion` switches off all of them.
FUSION_PASSES = ("rmsnorm", "rope", "attention", "attention_valid_len", "masked_softmax", "concat_linears",
                 "gemm_epilogue", "conv_epilogue", "elementwise_fusion")
# Lowering choices that trade memory for speed on targets with a fast GEMM library.
LOWERING_OPTIONS = ("conv_im2col", "conv_tensor_cores", "gemm_prologue", "column_epilogue", "conv_side")
# Passes that can be switched off by name (to bisect a numerical problem to one pass).
OPTIONAL_PASSES = ("bn_fold", "quant_fold", "slice_hoisting", *FUSION_PASSES, *LOWERING_OPTIONS)


@dataclass
class CompileOptions:
    target: str = "cpu"
    dtype: str | None = None  # compute dtype; None/"auto": chosen from the weights
    config: TargetConfig | None = None
    disabled_passes: set[str] = field(default_factory=set)
    rope_theta: float | None = None  # to compute rotary inv_freq buffers that no checkpoint holds
    value_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)


@entry_point("compiling the IR")
@collector_paused()
def compile(ir: str | os.PathLike | Mapping[str, Any] | Graph, target: str = "cpu", *, dtype: str | None = None,
            config: TargetConfig | None = None, disable_passes: list[str] | tuple[str, ...] = (),
            fusion: bool = True, rope_theta: float | None = None, verify_plan: bool = True,
            limits: Limits | None = None, weights_dtype: str | None = None,
            lm_head_dtype: str | None = None, device=None) -> CompiledProgram:
    """Compile an IR (path, JSON string, dict or Graph) for `target` ('cpu', 'cuda', ...) on `device` (a row of the
    chip table by name, or a DeviceProfile: devices.py; default: the target's default chip).

    `disable_passes` switches off optional passes by name (OPTIONAL_PASSES); `fusion=False` switches off every
    fusion pass (FUSION_PASSES) at once. `limits` bounds tensor and program sizes (default: `Limits()`, from the
    environment). `weights_dtype` "int8" or "int4" quantizes every linear's weight at load time, weight-only
    (`quant/weight_only.py`: decoding's W8A16 / W4A16); `lm_head_dtype` ("int8", "int4" or "float") gives the LM head
    (a linear writing a graph output) another format than the rest (default: the same). Bad input raises an
    NPUCompileError (or ConstraintError for a size above a limit) naming the node; a bug raises InternalError."""
    lim = limits or Limits()
    if not fusion:
        disable_passes = (*disable_passes, *FUSION_PASSES)
    unknown = set(disable_passes) - set(OPTIONAL_PASSES)
    if unknown:
        raise NPUCompileError(f"unknown pass(es) {sorted(unknown)}; passes that can be disabled: "
                              f"{', '.join(OPTIONAL_PASSES)}")
    codegen = get_codegen_target(target, device)
    cfg = config or default_config(target)
    if rope_theta is not None and not (isinstance(rope_theta, int | float) and math.isfinite(rope_theta)
                                       and rope_theta > 0):
        raise NPUCompileError(f"rope_theta must be a positive number, got {rope_theta!r}")
    if weights_dtype is not None and weights_dtype not in WEIGHTS_DTYPES:
        raise NPUCompileError(f"weights_dtype {weights_dtype!r} is not one of {', '.join(WEIGHTS_DTYPES)}")
    if lm_head_dtype is not None and (weights_dtype is None or lm_head_dtype not in HEAD_DTYPES):
        raise NPUCompileError(f"lm_head_dtype {lm_head_dtype!r}: give it with weights_dtype, one of "
                              f"{', '.join(HEAD_DTYPES)}")
    graph = ir if isinstance(ir, Graph) else read_ir(ir, lim)
    unknown_ops = [n for n in graph.nodes if n.op != "getitem" and lookup(n.op) is None]
    if unknown_ops:
        # refused even where the node is dead: an op nothing here knows may not be dropped silently (dead nodes of
        # known ops, random ones included, are dropped by the dead-code pass)
        n = unknown_ops[0]
        raise UnsupportedOpError(n.name, f"aten.{n.op}", target, "an op the compiler does not know")
    return _compile(graph, target, codegen, cfg, dtype, set(disable_passes), rope_theta, verify_plan, lim,
                    weights_dtype, lm_head_dtype)


def _run_pass(name: str, fn, *args):
    """Run one graph pass; a failure inside it (on a graph the reader accepted: a bug) names the pass, and how to
    compile without it where it is optional."""
    try:
        return fn(*args)
    except NPUSimError:
        raise
    except Exception as e:  # noqa: BLE001  (re-raised as the project's own error, with the original as its cause)
        hint = f" (compile without it: --disable-pass {name})" if name in OPTIONAL_PASSES else ""
        raise InternalError(f"running the pass '{name}'{hint}", e) from e


def _compile(graph: Graph, target: str, codegen, cfg: TargetConfig, dtype: str | None, disable_passes: set[str],
             rope_theta: float | None, verify_plan: bool, lim: Limits, weights_dtype: str | None = None,
             lm_head_dtype: str | None = None) -> CompiledProgram:
    passes: list[str] = []
    recipes: dict[str, Recipe] = {}
    class_outputs_of = class_outputs(graph)  # from the IR as read, before any pass rewrites it

    n = _run_pass("dead_code", remove_unread, graph)  # before anything asks whether a node's op can run
    if n:
        passes.append(f"dead_code({n})")
    n = _run_pass("remove_noops", remove_noops, graph)
    passes.append(f"remove_noops({n})")
    n = _run_pass("inplace_to_outofplace", inplace_to_outofplace, graph)
    passes.append(f"inplace_to_outofplace({n})")
    n = _run_pass("decompose", decompose, graph)
    if n:
        passes.append(f"decompose({n})")
        n = _run_pass("remove_noops", remove_noops, graph)  # what the rewrites made of no-ops (a same-type cast)
        if n:
            passes.append(f"remove_noops({n})")
    n = _run_pass("conv_padding", canonicalize_conv_padding, graph)
    if n:
        passes.append(f"conv_padding({n})")
    if "bn_fold" not in disable_passes:
        n = _run_pass("bn_fold", fold_batchnorm, graph, recipes)
        passes.append(f"bn_fold({n})")
    graph.remove_dead()
    if "quant_fold" not in disable_passes:
        folded, missing = _run_pass("quant_fold", fold_quantized, graph, recipes, codegen.library_kernels)
        if missing:
            g = missing[0]
            raise UnsupportedOpError(g.core.name, f"aten.{g.core.op}", target,
                                     f"an int8 {g.core.op.split('.')[0]} (its quantize/dequantize pattern folds into "
                                     f"a {g.kind} kernel, which target '{target}' does not provide; the partition "
                                     "path runs it on the CPU)")
        if folded:
            passes.append(f"quant_fold({folded})")
    if "slice_hoisting" not in disable_passes:
        n = _run_pass("slice_hoisting", hoist_slices, graph)
        if n:
            passes.append(f"slice_hoisting({n})")

    choice = explain_compute_dtype(graph, cfg, dtype)
    compute = choice.dtype
    # By position: the passes below replace output values (a fused node's output stands for the IR's).
    input_types = [v.dtype for v in graph.inputs]
    output_types = [v.dtype for v in graph.outputs]
    remap = _run_pass("compute_dtype", apply_compute_dtype, graph, compute)
    passes.append(f"compute_dtype({compute}{', ' + str(remap) if remap else ''})")
    _run_pass("constraints", check_constraints, graph, cfg)
    padding = _run_pass("channel_padding", plan_channel_padding, graph, cfg)

    def weight_only() -> None:
        # after the dtype pass (the scales stay float32 whatever the compute dtype) and after concat_linears (q/k/v
        # and gate/up quantized as one weight: one GEMV each, as the float program has), before the epilogue fusions
        # that match float linears only
        if weights_dtype is not None:
            n = _run_pass("weight_only", quantize_weights_only, graph, recipes, weights_dtype, DEFAULT_GROUP,
                          lm_head_dtype)
            head = f", lm head {lm_head_dtype}" if lm_head_dtype not in (None, weights_dtype) else ""
            passes.append(f"weight_only({weights_dtype}{head}, {n})")

    passes.extend(_fuse(graph, recipes, disable_passes, weight_only))

    lowering = Lowering(graph, codegen, greedy_fusion="elementwise_fusion" not in disable_passes,
                        conv_im2col="conv_im2col" not in disable_passes,
                        conv_tensor_cores="conv_tensor_cores" not in disable_passes,
                        gemm_prologue="gemm_prologue" not in disable_passes)
    lowering.run()
    if "column_epilogue" not in disable_passes and "elementwise_fusion" not in disable_passes:
        n = _run_pass("column_epilogue", fold_column_epilogues, lowering.kernels, lowering.buffers, codegen)
        if n:
            passes.append(f"column_epilogue({n})")
    if "conv_side" not in disable_passes and "conv_epilogue" not in disable_passes:
        n = _run_pass("conv_side", fold_side_convs, lowering.kernels, lowering.buffers, codegen)
        if n:
            passes.append(f"conv_side({n})")
    n = _run_pass("plan_folded", plan_folded, lowering.kernels, lowering.buffers, codegen)
    if n:
        passes.append(f"plan_folded({n})")
    arena = _run_pass("memory_plan", plan_memory, lowering.buffers, lowering.kernels)
    need = arena + sum(b.nbytes for b in lowering.buffers if b.kind in ("input", "output", "constant"))
    if need > lim.max_bytes:
        raise ConstraintError(f"the program '{graph.name}' needs {format_bytes(need)} of buffers (intermediates, "
                              f"inputs, outputs, constants), above the limit of {format_bytes(lim.max_bytes)} "
                              f"(${MAX_BYTES_ENV})")
    if verify_plan:
        _run_pass("memory_plan_check", check_plan, lowering.buffers, lowering.kernels)
        try:
            check_memory(lowering.buffers, lowering.kernels, lowering.outputs)
        except ValueError as e:
            raise InternalError("planning memory", f"the compiled plan is not memory-safe: {e}") from e
    try:
        # a kernel's temporaries (a broadcast view, an iteration space with its reduction) are bounded like tensors
        check_sizes(lowering.buffers, lowering.kernels, lim.max_bytes, codegen.materializes_iteration_space)
    except ValueError as e:
        raise ConstraintError(f"the program '{graph.name}': {e}") from None

    # The user-facing dtypes stay those of the IR; the device holds the compute dtype.
    for spec, v, dt in zip(lowering.inputs, graph.inputs, input_types):
        spec.dtype = dt
        if spec.dtype in INT_DTYPES:
            spec.value_range = _value_range(graph, v)
    for spec, dt in zip(lowering.outputs, output_types):
        spec.dtype = dt

    weights = _weight_specs(graph, lowering, recipes, rope_theta)
    program = CompiledProgram(
        model_name=graph.name,
        target=target,
        compute_dtype=compute,
        config=cfg.to_dict(),
        inputs=lowering.inputs,
        outputs=lowering.outputs,
        weights=weights,
        buffers=lowering.buffers,
        kernels=lowering.kernels,
        arena_bytes=arena,
        passes=passes,
        padding_plan=padding,
        device=codegen.profile,
    )
    codegen.check_program(program)
    program.fusion_groups = [
        {"kernel": k.name, "group": k.group, "nodes": k.nodes} for k in program.kernels if len(k.nodes) > 1
    ]
    program.stats = {
        "ir_nodes": graph.meta.get("ir_node_count", 0),
        "kernels": len(program.kernels),
        "intermediate_bytes_unshared": sum(b.nbytes for b in program.buffers if b.kind == "arena"),
        "peak_intermediate_bytes": arena,
        "compute_dtype_reason": choice.reason,
        "class_outputs": class_outputs_of,
    }
    return program


def _fuse(graph: Graph, recipes: dict[str, Recipe], disabled: set[str], after_concat=None) -> list[str]:
    """The pattern fusions (after the dtype pass, so the dtypes they record are the compute dtypes); `after_concat`
    runs once the linears that share an input are one (the weight-only pass)."""
    from .fusion import patterns as P

    steps = [
        ("rmsnorm", lambda: P.fuse_rmsnorm(graph)),
        ("rope", lambda: P.fuse_rope(graph)),
        ("attention", lambda: P.fuse_attention(graph, "attention_valid_len" not in disabled)),
        ("masked_softmax", lambda: P.fuse_masked_softmax(graph)),
        ("concat_linears", lambda: P.concat_linears(graph, recipes)),
        ("gemm_epilogue", lambda: P.fuse_gemm_epilogue(graph)),
        ("conv_epilogue", lambda: P.fuse_conv_epilogue(graph)),
    ]
    done = []
    for name, run in steps:
        if name not in disabled:
            done.append(f"{name}({_run_pass(name, run)})")
            graph.remove_dead()
        if name == "concat_linears" and after_concat is not None:
            after_concat()
    return done


def _value_range(graph: Graph, v) -> tuple[int, int] | None:
    """Integer inputs that index something get their valid range: token ids below the embedding's row count, cache
    positions below the cache length."""
    for node in graph.nodes:
        if node.op == "embedding.default" and len(node.inputs) > 1 and node.inputs[1] is v:
            return (0, node.inputs[0].shape[0])
        if node.op == "index_copy.default" and len(node.inputs) == 3 and node.inputs[1] is v:
            target = node.inputs[0]
            rank = len(target.shape)  # a 0-d target's dim 0 names its one element
            return (0, target.shape[int(node.attrs["dim"]) % rank] if rank else 1)
    return None


def _weight_specs(graph: Graph, lowering: Lowering, recipes: dict[str, Recipe],
                  rope_theta: float | None) -> list[WeightSpec]:
    specs = []
    used_keys = set(graph.weight_keys.values())
    all_keys = graph.meta.get("ir_weights", {})
    for name, v in graph.weights.items():
        key = graph.weight_keys[name]
        recipe = recipes.get(name)
        if recipe is None:
            recipe = Recipe("load", {"weight": key})
            # A tied lm_head: the checkpoint stores only the embedding. Offer the unused IR weights of the same
            # shape as fallbacks, in order.
            recipe.fallback_keys = [k for k, shape in all_keys.items()
                                    if k not in used_keys and tuple(shape) == v.shape and k != key]
            if key.endswith("rotary_emb.inv_freq") and rope_theta is not None:
                recipe = Recipe("rope_inv_freq", {}, {"base": float(rope_theta), "dim": 2 * v.shape[0]},
                                fallback_keys=[key])
        specs.append(WeightSpec(name, key, v.shape, v.dtype, v.shape, lowering.weight_buffers[name], recipe,
                                lowering.weight_layouts.get(name, ())))
    return specs
