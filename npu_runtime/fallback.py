"""CPU fallback: runs a partition's sub-IR through `torch_ir.IRExecutor`, and converts tensors between NumPy and
torch without losing bf16.

This is the only module of the runtime that imports torch, and only inside functions: importing `npu_runtime`
(or this module) never loads torch.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from .errors import NPURuntimeError

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["to_torch", "to_numpy", "CpuFallback", "executable_ir", "load_ir_for_executor", "require_torch",
           "check_torch_ops", "aten_kernels_for", "EXTRA"]

EXTRA = "pip install 'npu-simulation[export]'"  # what brings torch and torch_ir
# ATen ops with effects outside their tensors (a file read, a print): never run from an artifact
_REFUSED_OPS = frozenset({"from_file", "_print", "save"})

_BF16 = np.dtype(ml_dtypes.bfloat16)

# oneDNN's bf16/fp16 convolution primitives, which ATen picks on CPUs with AVX512-BF16/AVX512-FP16 or AMX only, compute
# some shapes wrong (strided convolutions: pytorch/pytorch#169688, #163347): the same graph gave other values on the
# GPU host's Xeon than on an AVX2 machine (wav2vec2's strided feature convs in bf16, Pearson 0.96). ATen's own
# kernels, the ones every AVX2 host runs, accumulate in fp32 on every host; float32 keeps oneDNN (correct, and fast).
_REDUCED_FLOATS = frozenset({"bfloat16", "float16", "torch.bfloat16", "torch.float16"})


def aten_kernels_for(dtypes: Iterable[Any]) -> contextlib.AbstractContextManager:
    """The context a torch computation in `dtypes` runs in (the reference, and CPU partitions of a program): oneDNN
    off where any of them is a half float, so the result does not depend on the host's instruction set."""
    if any(str(d) in _REDUCED_FLOATS for d in dtypes):
        import torch

        return torch.backends.mkldnn.flags(enabled=False)
    return contextlib.nullcontext()


def _sub_ir_dtypes(ir: Mapping[str, Any]) -> set[str]:
    metas = [*ir.get("graph_inputs", ()), *ir.get("weights", ()),
             *(o for n in ir.get("nodes", ()) for o in n.get("outputs", ()))]
    return {str(m.get("dtype")) for m in metas if isinstance(m, Mapping)}


def written_weights(ir: Mapping[str, Any]) -> set[str]:
    """State-dict keys of the weights an op of `ir` writes in place: the first operand of an in-place op (`add_`,
    `index_copy_`), and the running statistics of a batch norm that computes batch statistics (ATen updates them).
    The fallback gets its own copy of these, so neither the caller's arrays nor the next run see the writes."""
    mapping = ir.get("weight_name_mapping") or {}
    names: set[str] = set()
    for node in ir.get("nodes", []):
        op = str(node.get("op_type", "")).removeprefix("aten.")
        base = op.partition(".")[0]
        inputs = [i.get("name") for i in node.get("inputs", []) if isinstance(i, Mapping)]
        if base.endswith("_") and not base.startswith("_") and inputs:
            names.add(inputs[0])
        if base in ("batch_norm", "_native_batch_norm_legit", "native_batch_norm") and \
                (node.get("attrs") or {}).get("training", base != "batch_norm"):
            names.update(inputs[3:5])
    return {mapping.get(n, n) for n in names if n is not None}


def to_torch(array: Any, copy: bool = True) -> torch.Tensor:
    """NumPy (ml_dtypes bf16 included) -> torch tensor of the same dtype. torch cannot read ml_dtypes arrays, so
    bf16 travels as its bit pattern (int16 view) and is reinterpreted on the other side: no rounding."""
    import torch

    if isinstance(array, torch.Tensor):
        return array.clone() if copy else array
    a = np.asarray(array)
    if a.dtype == _BF16:
        bits = np.require(a, requirements="C").view(np.int16)
        return torch.from_numpy(bits.copy() if copy else bits).view(torch.bfloat16)
    a = np.require(a, requirements="C")  # ascontiguousarray would make a 0-d array 1-d
    # A copy, so an in-place ATen op of the fallback (relu_, index_copy_) never writes into the caller's array.
    return torch.from_numpy(a.copy() if copy else a)


def to_numpy(tensor: Any) -> np.ndarray:
    """torch tensor -> NumPy array of the same dtype (bf16 as ml_dtypes.bfloat16)."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        return np.asarray(tensor)
    t = tensor.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().copy().view(_BF16)
    return t.numpy().copy()


def require_torch(what: str, ops: list[str]) -> None:
    """Raise a clear error, naming the ops and the extra to install, where torch or torch_ir is missing."""
    try:
        import torch  # noqa: F401
        import torch_ir  # noqa: F401
    except ImportError as e:
        shown = ", ".join(dict.fromkeys(ops[:6])) + (" ..." if len(set(ops)) > 6 else "")
        raise NPURuntimeError(f"{what} runs {shown} through torch_ir (nothing else here implements them), which needs "
                              f"PyTorch and pytorch-ir ({e}): {EXTRA}") from None


def check_torch_ops(ir: Mapping[str, Any], what: str) -> None:
    """Every op of `ir` must be an operator overload of torch.ops.aten (or getitem) before torch_ir may call it: a
    name that resolves to anything else (a Python attribute of the namespace) or an op with effects outside its
    tensors is refused, naming the node."""
    import torch

    from npu_compiler.errors import ArtifactError
    from npu_compiler.partitioned_program import GETITEM_OPS, torch_op_problem

    for node in ir.get("nodes", []):
        op_type = node.get("op_type")
        where = f"{what}: node '{node.get('name')}'"
        problem = torch_op_problem(op_type)
        if problem:
            raise ArtifactError(f"{where}: {problem}")
        if op_type in GETITEM_OPS:
            continue
        _, name, overload = op_type.split(".")
        if name in _REFUSED_OPS:
            raise ArtifactError(f"{where}: {op_type} acts outside its tensors (files, printing); an artifact may not "
                                "run it")
        packet = getattr(torch.ops.aten, name, None)
        op = getattr(packet, overload, None) if isinstance(packet, torch._ops.OpOverloadPacket) else None
        if not isinstance(op, torch._ops.OpOverload):
            raise NPURuntimeError(f"{where}: {op_type} is not an operator of this PyTorch ({torch.__version__})")


class CpuFallback:
    """One CPU partition: its sub-IR loaded once into an `IRExecutor` with the weights it reads (torch tensors
    keyed by state-dict key)."""

    def __init__(self, sub_ir: Mapping[str, Any], weights: Mapping[str, Any], name: str = "cpu partition") -> None:
        from torch_ir import IRExecutor

        self.name = name
        self.ir_dict = sub_ir
        self.input_names = [t["name"] for t in sub_ir["graph_inputs"]]
        self.output_names = [t["name"] for t in sub_ir["graph_outputs"]]
        self._out_dtypes = {t["name"]: str(t["dtype"]) for t in sub_ir["graph_outputs"]}
        ir = executable_ir(load_ir_for_executor(sub_ir, device="cpu"))  # the CPU's, whatever device the IR names
        written = written_weights(sub_ir)
        # a copy where ATen writes the weight, or where the array is read-only (a memory-mapped checkpoint)
        tensors = {k: to_torch(v, copy=k in written or not getattr(v, "flags", None) or not v.flags.writeable)
                   for k, v in weights.items()}
        self.executor = IRExecutor(ir, weights=tensors)
        self._dtypes = _sub_ir_dtypes(sub_ir)
        _size_torch_threads()

    def run(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Inputs and outputs by tensor name, as torch tensors (NumPy inputs are converted)."""
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise NPURuntimeError(f"{self.name}: missing input tensor(s) {missing}")
        args = tuple(to_torch(inputs[n], copy=False) for n in self.input_names)
        try:
            with aten_kernels_for(self._dtypes):
                outs = self.executor.execute(args)
        except Exception as e:  # torch_ir wraps op failures; its message names the node and op
            raise NPURuntimeError(f"{self.name}: CPU fallback failed: {e}") from e
        result = dict(zip(self.output_names, outs))
        for n, t in result.items():
            want = self._out_dtypes[n]
            if str(t.dtype).removeprefix("torch.") != want:
                raise NPURuntimeError(f"{self.name}: output tensor '{n}' came back as {t.dtype}, the IR says {want}")
        return result


def _size_torch_threads() -> None:
    """torch's intra-op pool sized like the CPU backend's BLAS pool: to the cores this process may use, unless the
    user set a thread variable (torch, like OpenBLAS, counts the machine's cores, not the process's)."""
    import torch

    from .cpu.threads import configure_threads

    setting = configure_threads()
    if setting.threads is not None and torch.get_num_threads() > setting.threads:
        torch.set_num_threads(setting.threads)


# ---- an IR dict (torch objects in attrs stringified) as a torch_ir.IR that IRExecutor runs ---------------------------

_SCALAR_TYPE, _DEVICE, _LAYOUT, _MEMORY_FORMAT = "ScalarType", "Device", "Layout", "MemoryFormat"
_KIND_RE = re.compile(rf"\b({_SCALAR_TYPE}|{_DEVICE}|{_LAYOUT}|{_MEMORY_FORMAT})\b")
# Used only for ops whose schema cannot be resolved: the attr name is then the only hint.
_KIND_BY_NAME = {"dtype": _SCALAR_TYPE, "device": _DEVICE, "layout": _LAYOUT, "memory_format": _MEMORY_FORMAT}


_OP_RE = re.compile(r"(aten|quantized_decomposed)\.([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?\Z")


@functools.cache
def _resolve_op(op_type: str) -> Any | None:
    """The ATen overload `op_type` names ("aten.NAME.OVERLOAD", or "aten.NAME" for its default), or None. The
    name is looked up in PyTorch's operator registry before any attribute is read, so no name from an IR reaches
    `getattr` on a Python object (`aten.__class__.__init__` is not an operator: None)."""
    import torch

    m = _OP_RE.match(op_type)
    if m is None:
        return None
    namespace, name, overload = m.group(1), m.group(2), m.group(3) or "default"
    if namespace == QUANTIZED_NAMESPACE:
        _register_quantized_ops()
    schemas = torch._C._jit_get_schemas_for_operator(f"{namespace}::{name}")
    if not any((s.overload_name or "default") == overload for s in schemas):
        return None
    op = getattr(getattr(getattr(torch.ops, namespace), name), overload)
    return op if isinstance(op, torch._ops.OpOverload) else None


def _check_runnable(node_name: str, op_type: str) -> None:
    """An op the CPU fallback will run: an ATen overload from PyTorch's registry, or one of torch_ir's own executors
    (getitem). Anything else is refused before IRExecutor resolves it by attribute lookups."""
    from torch_ir.ops.registry import get_execution_fn

    if get_execution_fn(op_type) is None and _resolve_op(op_type) is None:
        raise NPURuntimeError(f"node '{node_name}': op '{op_type}' is not an ATen operator PyTorch knows, so the CPU "
                              "fallback cannot run it")


@functools.cache
def _torch_objects(kind: str) -> dict[str, Any]:
    """Every torch dtype, layout or memory format by name ("float32", "strided", "channels_last"), from the torch
    module's own attributes (a table: no attribute named by an IR is ever looked up)."""
    import torch

    cls = {_SCALAR_TYPE: torch.dtype, _LAYOUT: torch.layout, _MEMORY_FORMAT: torch.memory_format}[kind]
    return {name: obj for name, obj in vars(torch).items() if isinstance(obj, cls)}


QUANTIZED_NAMESPACE = "quantized_decomposed"


@functools.cache
def _register_quantized_ops() -> None:
    """PT2E's quantize/dequantize ops (`npu_compiler/ir/quant_ops.py`) for IRExecutor, which calls only `aten` ops by
    itself: each node calls its `torch.ops.quantized_decomposed` op with the node's tensors and attributes by name."""
    import importlib

    import torch
    from torch_ir import register_executor

    importlib.import_module("torch.ao.quantization.fx._decomposed")  # registers torch.ops.quantized_decomposed
    from npu_compiler.ir.quant_ops import QUANT_OPS

    for name in dict.fromkeys(short.split(".")[1] for short in QUANT_OPS):
        packet = getattr(torch.ops.quantized_decomposed, name)
        for overload in packet.overloads():  # `.tensor` too (scales as tensors), which the compiler does not read
            op = getattr(packet, overload)
            tensors = [a.name for a in op._schema.arguments if "Tensor" in str(a.type)]

            def run(inputs, attrs, op=op, tensors=tensors):
                return [op(**dict(zip(tensors, inputs)), **attrs)]

            register_executor(f"{QUANTIZED_NAMESPACE}.{name}.{overload}")(run)


@functools.cache
def _torch_kinds(op_type: str) -> dict[str, str] | None:
    """Schema arg name -> the torch enum-like kind it holds, for the args of `op_type` that hold one."""
    op = _resolve_op(op_type)
    if op is None or not hasattr(op, "_schema"):
        return None
    kinds = {}
    for arg in op._schema.arguments:
        # `type` shows ScalarType/Layout/MemoryFormat as plain int; `real_type` keeps the name.
        match = _KIND_RE.search(str(getattr(arg, "real_type", arg.type)))
        if match:
            kinds[arg.name] = match.group(1)
    return kinds


def _to_torch_attr(value: Any, kind: str, device: Any, where: str) -> Any:
    import torch

    if isinstance(value, list):
        return [_to_torch_attr(v, kind, device, where) for v in value]
    if not isinstance(value, str):
        return value
    if kind == _DEVICE:
        if device is not None:
            return device
        parsed = torch.device(value)
        return torch.device("cpu") if parsed.type == "meta" else parsed
    obj = _torch_objects(kind).get(value.removeprefix("torch."))
    if obj is None:
        raise NPURuntimeError(f"{where}: {value!r} is not a torch {kind} (the CPU fallback cannot run it)")
    return obj


@functools.cache
def _scalar_args(op_type: str) -> tuple[tuple[str, bool, Any], ...]:
    """(name, positional with a default, default) of the op's non-tensor args, in schema order."""
    op = _resolve_op(op_type)
    if op is None or not hasattr(op, "_schema"):
        return ()
    return tuple((a.name, a.has_default_value() and not a.kwarg_only,
                  a.default_value if a.has_default_value() else None)
                 for a in op._schema.arguments if "Tensor" not in str(a.type))


def _fill_skipped_defaults(node_op: str, attrs: dict[str, Any]) -> None:
    """The IR omits args at their default. IRExecutor rebuilds the call in schema order and stops at the first
    omitted positional arg, so every later arg is lost with it: `scaled_dot_product_attention(q, k, v, scale=1.0)`
    would run with the default scale (the IR of Whisper, OPT and T5 then disagrees with the model). Omitted
    positional args before the last given one are written out with their defaults."""
    args = _scalar_args(node_op)
    given = [i for i, (name, _, _) in enumerate(args) if name in attrs]
    for name, positional_default, default in args[:given[-1] if given else 0]:
        if positional_default and name not in attrs:
            attrs[name] = default


def _restore_attrs(node: dict[str, Any], device: Any) -> None:
    where = f"node {node['name']} ({node['op_type']})"
    kinds = _torch_kinds(node["op_type"])
    attrs = node.get("attrs") or {}
    for name, value in attrs.items():
        kind = kinds.get(name) if kinds is not None else _KIND_BY_NAME.get(name)
        if kind is not None:
            attrs[name] = _to_torch_attr(value, kind, device, f"{where} attr '{name}'")
    node["attrs"] = attrs


def executable_ir(ir: Any) -> Any:
    """`ir` (a torch_ir.IR) made safe for IRExecutor: omitted args that would cut its call short are written out
    (`_fill_skipped_defaults`), and an in-place `detach_` (which transformers applies to tensors its forward makes)
    runs as `detach`: the same values, but torch refuses `detach_` on the weight views IRExecutor is handed. Every
    IRExecutor of the project runs an IR through this."""
    for node in ir.nodes:
        _check_runnable(node.name, node.op_type)
        _fill_skipped_defaults(node.op_type, node.attrs)
        if node.op_type == "aten.detach_.default":
            node.op_type = "aten.detach.default"
    return ir


def load_ir_for_executor(source: str | os.PathLike[str] | Mapping[str, Any], *, device: Any = None):
    """Reload IR JSON (a path or a dict) into a `torch_ir.IR` that `torch_ir.IRExecutor` can run.

    Stringified dtypes/devices/layouts/memory formats go back to torch objects wherever the op's ATen schema says
    the argument holds one. `device`, when given, replaces every device attr (e.g. to run on "cuda").
    """
    import json

    import torch
    from torch_ir import IR

    if isinstance(source, Mapping):
        data = copy.deepcopy(dict(source))
    else:
        with open(source, encoding="utf-8") as f:
            data = json.load(f)
    dev = torch.device(device) if device is not None else None
    for node in data["nodes"]:
        _restore_attrs(node, dev)
    # IR.from_dict maps constant dtypes with a table that lacks bfloat16 (it would come back as float32).
    raw_constants = data.pop("constants", {}) or {}
    ir = IR.from_dict(data)
    dtypes = _torch_objects(_SCALAR_TYPE)
    ir.constants = {}
    for name, c in raw_constants.items():
        dtype = dtypes.get(str(c["dtype"]).removeprefix("torch."))
        if dtype is None:
            raise NPURuntimeError(f"constant '{name}': {c['dtype']!r} is not a torch dtype")
        ir.constants[name] = torch.tensor(c["data"], dtype=dtype)
    return ir
