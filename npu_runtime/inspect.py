"""Per-node numeric comparison: every intermediate that survives lowering and fusion, captured right after the
kernel that writes it and mapped back to the IR value it stands for, compared with the reference's value of that
IR node. Also the repro dump of one kernel (its inputs, expected output and a script that reruns just it).

No torch here: the expected values come in as plain arrays (npu_export.reference.run_reference_all makes them).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from npu_compiler.atomic import atomic_path, check_writable, write_text
from npu_compiler.errors import OutputError
from npu_compiler.kernels import INTEGER_KINDS
from npu_compiler.program import BufferSpec, CompiledProgram, KernelCall, TensorRef

from .errors import NPURuntimeError
from .metrics import ONE_UNIT, WHOLE_MODEL_UNITS, Comparison, compare, compare_codes


@dataclass
class KernelCheck:
    index: int
    name: str
    kind: str
    group: str
    nodes: list[str]
    value: str | None  # the IR value the kernel's output holds (None: an internal step of a multi-kernel node)
    comparison: Comparison | None  # None when there is nothing to compare (see `note`)
    note: str = ""
    segment: int | None = None  # of a partitioned program: the segment whose program (or torch_ir run) this is

    @property
    def label(self) -> str:
        return self.name if self.segment is None else f"s{self.segment}:{self.name}"

    @property
    def passed(self) -> bool | None:
        return None if self.comparison is None else self.comparison.passed

    def to_dict(self) -> dict[str, Any]:
        d = {"index": self.index, "name": self.name, "kind": self.kind, "group": self.group, "nodes": self.nodes,
             "value": self.value, "note": self.note,
             "comparison": self.comparison.to_dict() if self.comparison else None}
        if self.segment is not None:
            d["segment"] = self.segment
        return d


def kernel_values(program: CompiledProgram, node_outputs: Mapping[str, list[str]] | None = None
                  ) -> list[str | None]:
    """Per kernel, the IR value its first output holds once it has run, or None.

    The value is the output of the kernel's last IR node (`nodes[-1]`: a fused conv+batch_norm writes the
    batch_norm's value); `node_outputs` (IR node name -> its output value names) resolves it, falling back to the
    names the lowering recorded (`out_values`). When a node lowers to several kernels only the last one holds the
    node's value; the earlier ones write scratch (a contiguous copy, a partial reduction)."""
    values: list[str | None] = []
    for k in program.kernels:
        v = None
        if k.nodes and node_outputs and k.nodes[-1] in node_outputs and node_outputs[k.nodes[-1]]:
            v = node_outputs[k.nodes[-1]][0]
        elif k.out_values:
            v = k.out_values[0]
        values.append(v if k.outs else None)
    last: dict[str, int] = {}
    for i, v in enumerate(values):
        if v is not None:
            last[v] = i
    return [v if v is not None and last[v] == i else None for i, v in enumerate(values)]


class Captured(dict):
    """Every kernel's first output by kernel index, and in `buffers_before`, for the kernels `isolatable` names, the
    whole buffers each one touches just before it ran (from which `check_kernels` reruns it alone)."""

    def __init__(self) -> None:
        super().__init__()
        self.buffers_before: dict[int, dict[int, np.ndarray]] = {}


def integer_program(program: CompiledProgram) -> bool:
    """Whether `program` has integer kernels: its numbers follow the integer rules (docs/tolerances.md)."""
    return any(k.kind in INTEGER_KINDS for k in program.kernels)


def tolerance_dtype(compute_dtype: str, programs: Iterable[CompiledProgram]) -> str:
    """The row of the default tolerances for these programs (an artifact's, or a partitioned one's segments): their
    compute dtype's, or int8's where one has integer kernels."""
    return "int8" if any(integer_program(p) for p in programs) else compute_dtype


def partitioned_tolerance_dtype(dag) -> str:
    """`tolerance_dtype` of a partitioned program (a DAGExecutor): int8's where any segment has integer kernels."""
    return tolerance_dtype(dag.program.compute_dtype, [st.program for st in dag.stages if st and st.program])


CODE_DTYPES = ("int8", "uint8")
ALONE = "alone, on the reference's inputs"  # the note of a kernel check_kernels reran alone


def isolatable(program: CompiledProgram, integer: bool | None = None) -> set[int]:
    """The kernels of an integer program that are rerun alone on the reference's inputs (`check_kernels`): the
    integer kernels, and every kernel that writes integer codes (int8, uint8: a quantize). The whole-model reference's
    codes differ from ours by the units earlier layers moved them; one kernel's own error is what these rows judge.
    `integer`: whether the whole program is an integer one (a partitioned program's GPU segment has quantizes but its
    integer kernels are in CPU segments); default: whether `program` has integer kernels."""
    if not (integer_program(program) if integer is None else integer):
        return set()
    return {i for i, k in enumerate(program.kernels)
            if k.outs and (k.kind in INTEGER_KINDS or program.buffers[k.outs[0].buffer].dtype in CODE_DTYPES)}


def capture_outputs(executor, inputs: Mapping[str, Any], weights=None, integer: bool | None = None) -> Captured:
    """Run kernel by kernel and copy every kernel's first output right after it runs (the arena is shared, so
    reading the buffers at the end would show later kernels' data); the buffers of `isolatable` kernels too, just
    before they run."""
    program: CompiledProgram = executor.program
    got = Captured()
    alone = isolatable(program, integer)

    def before(i: int) -> None:
        if i in alone:
            k = program.kernels[i]
            got.buffers_before[i] = {b: np.array(executor.flat[b]) for b in {r.buffer for r in (*k.args, *k.outs)}}

    def after(i: int) -> None:
        k = program.kernels[i]
        if k.outs:
            got[i] = np.array(executor.view(k.outs[0]))

    executor.run_observed(inputs, weights, before=before if alone else None, after=after)
    return got


def _comparable(out: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray | None, str]:
    """The kernel's output shaped like the reference, or why it cannot be (a padded channel layout, a view)."""
    if out.shape == ref.shape:
        return out, ""
    if out.size == ref.size:
        return out.reshape(ref.shape), ""
    return None, f"shape {list(out.shape)} vs IR {list(ref.shape)}"


def kernel_reference(k: KernelCall, value: np.ndarray) -> np.ndarray:
    """The part of its IR value's reference that kernel `k` computes: the rows `out_rows` names where slice hoisting
    left it only those, else all of it."""
    ref = np.asarray(value)
    if k.out_rows:
        d, a, b = k.out_rows
        if d < ref.ndim and b <= ref.shape[d]:
            return ref[(slice(None),) * d + (slice(a, b),)]
    return ref


def _on_reference_inputs(program: CompiledProgram, index: int, buffers: Mapping[int, np.ndarray],
                         values: list[str | None], expected: Mapping[str, np.ndarray]) -> dict[int, np.ndarray] | None:
    """Kernel `index`'s buffers as they were before it ran, with every input an earlier kernel wrote replaced by the
    reference's value of that kernel's IR value; None where one has no reference (then it cannot be isolated)."""
    k = program.kernels[index]
    bufs = {b: a.copy() for b, a in buffers.items()}
    outs = {r.buffer for r in k.outs}
    for b in {a.buffer for a in k.args} - outs:
        j = next((j for j in range(index - 1, -1, -1) if program.kernels[j].outs
                  and program.kernels[j].outs[0].buffer == b), None)
        if j is None:  # an input (a segment's: another segment's output, moved as ours), a weight, a constant
            name = next((t.name for t in program.inputs if t.buffer == b), None)
            if name in expected and np.size(expected[name]) == bufs[b].size:
                bufs[b][...] = np.asarray(expected[name]).reshape(-1).astype(bufs[b].dtype)
            continue
        ref = expected.get(values[j]) if values[j] is not None else None
        o = program.kernels[j].outs[0]
        if ref is None or np.size(ref) != math.prod(o.shape):
            return None
        flat = bufs[b]
        view = np.lib.stride_tricks.as_strided(flat[o.offset:], shape=o.shape,
                                               strides=tuple(st * flat.itemsize for st in o.strides), writeable=True)
        view[...] = np.asarray(ref).reshape(o.shape).astype(flat.dtype)
    return bufs


def _check_alone(program: CompiledProgram, index: int, backend, buffers: Mapping[int, np.ndarray],
                 values: list[str | None], expected: Mapping[str, np.ndarray], dtype: str
                 ) -> tuple[Comparison | None, str]:
    """Kernel `index` rerun alone on `backend` with the reference's inputs, against the reference: codes within
    ONE_UNIT, a float result (an integer kernel that dequantizes) under `dtype`'s tolerance; (None, why) where it
    cannot be isolated."""
    bufs = _on_reference_inputs(program, index, buffers, values, expected)
    if bufs is None:
        return None, "an input has no reference value"
    k = program.kernels[index]
    ex = backend.create_executor(kernel_program(program, index, bufs))
    ex.run({})
    ref = kernel_reference(k, expected[values[index]])
    out, why = _comparable(np.array(ex.view(ex.program.kernels[0].outs[0])), ref)
    if out is None:
        return None, why
    if ref.dtype.kind in "iu":
        return compare_codes(values[index], out, ref, ONE_UNIT, "given the reference's inputs"), ""
    return compare(values[index], out, ref, dtype), ""


def check_kernels(program: CompiledProgram, captured: Mapping[int, np.ndarray], expected: Mapping[str, np.ndarray],
                  node_outputs: Mapping[str, list[str]] | None = None, backend=None, row_dtype: str | None = None
                  ) -> list[KernelCheck]:
    """Every kernel's captured output against the reference's value of its IR node, under the program's row of the
    default tolerances (`tolerance_dtype`). In an integer program a kernel that writes codes is judged in units of
    its output's scale (docs/tolerances.md, "Integer programs"): rerun alone on `backend` with the reference's
    inputs (a `Captured` holds its buffers), within one unit; where it cannot be isolated, the whole model's codes
    within WHOLE_MODEL_UNITS. `row_dtype`: the tolerance row where the program is a segment of a larger one."""
    values = kernel_values(program, node_outputs)
    dtype = row_dtype or tolerance_dtype(program.compute_dtype, [program])
    before = getattr(captured, "buffers_before", {})
    rows: list[KernelCheck] = []
    for i, k in enumerate(program.kernels):
        v = values[i]
        row = KernelCheck(i, k.name, k.kind, k.group, list(k.nodes), v, None)
        if v is None:
            row.note = "internal step of its node"
        elif v not in expected:
            row.note = f"no reference value '{v}'"
        elif i not in captured:
            row.note = "no output"
        else:
            ref = kernel_reference(k, expected[v])
            out, why = _comparable(captured[i], ref)
            if out is None:
                row.note = why
            else:
                if i in before and backend is not None:
                    row.comparison, why = _check_alone(program, i, backend, before[i], values, expected, dtype)
                    row.note = ALONE if row.comparison else f"not isolated: {why}"
                if row.comparison is None and ref.dtype.kind in "iu" and i in before:
                    row.comparison = compare_codes(v, out, ref, WHOLE_MODEL_UNITS, "the whole model's inputs")
                elif row.comparison is None:
                    row.comparison = compare(v, out, ref, dtype)
        rows.append(row)
    return rows


def capture_partitioned(dag, inputs: Mapping[str, Any]) -> dict[int, tuple[dict[str, Any], dict[int, np.ndarray]]]:
    """Run a partitioned program (a DAGExecutor) once, each program segment kernel by kernel: per segment, the inputs
    it was given and every kernel's first output (`capture_outputs`). Torch segments' outputs stay in `dag`."""
    got: dict[int, tuple[dict[str, Any], dict[int, np.ndarray]]] = {}
    integer = partitioned_tolerance_dtype(dag) == "int8"

    def run_stage(stage, ins: dict[str, Any]):
        if not hasattr(stage.executor, "run_observed"):
            raise NPURuntimeError(f"per-node checks need a backend that can stop after every kernel (cpu, webgpu); "
                                  f"{stage.executor.backend.name} cannot yet: add --backend cpu")
        got[stage.segment.index] = (dict(ins), capture_outputs(stage.executor, ins, stage.weights, integer))
        return stage.executor.outputs()

    dag.launch(inputs, run_stage=run_stage)
    return got


def check_partitioned(dag, captured: Mapping[int, tuple[dict[str, Any], dict[int, np.ndarray]]],
                      expected: Mapping[str, np.ndarray], node_outputs: Mapping[str, list[str]] | None = None
                      ) -> list[KernelCheck]:
    """Per segment in the order they ran: every kernel of a program segment against the reference value of its IR
    node (`check_kernels`), and every output of a torch_ir segment against the reference's."""
    rows: list[KernelCheck] = []
    row_dtype = partitioned_tolerance_dtype(dag)
    for st in dag.stages:
        if st is None:
            continue
        seg = st.segment
        if st.program is not None:
            for r in check_kernels(st.program, captured[seg.index][1], expected, node_outputs, st.executor.backend,
                                   row_dtype):
                r.segment = seg.index
                rows.append(r)
            continue
        for i, t in enumerate(seg.outputs):
            row = KernelCheck(i, "torch_ir", "torch_ir", "cpu fallback", list(seg.nodes), t.name, None,
                              segment=seg.index)
            if t.name not in expected:
                row.note = f"no reference value '{t.name}'"
            else:
                row.comparison = compare(t.name, dag.host_value(t.name), expected[t.name], row_dtype)
            rows.append(row)
    return rows


def first_failure(rows: list[KernelCheck]) -> KernelCheck | None:
    return next((r for r in rows if r.passed is False), None)


def _r(pearson: float | None) -> str:
    return "-" if pearson is None else f"{pearson:.6f}"


def format_table(rows: list[KernelCheck]) -> str:
    # columns as wide as their longest entry: a cut name ("adaptive_avg_pool2d.defaul") is a wrong name
    kw = max([len("kernel"), *(len(r.label) for r in rows)])
    gw = max([len("group"), *(len(r.group) for r in rows)])
    vw = max([len("IR value"), *(len(str(r.value or "-")) for r in rows)])
    lines = [f"{'#':>4} {'kernel':<{kw}} {'group':<{gw}} {'IR value':<{vw}} {'max_abs':>10} {'max_rel':>10} "
             f"{'pearson':>10}  result"]
    for r in rows:
        c = r.comparison
        if c is None:
            lines.append(f"{r.index:>4} {r.label:<{kw}} {r.group:<{gw}} {str(r.value or '-'):<{vw}} "
                         f"{'-':>10} {'-':>10} {'-':>10}  ({r.note})")
        else:
            lines.append(f"{r.index:>4} {r.label:<{kw}} {r.group:<{gw}} {str(r.value):<{vw}} {c.max_abs:>10.3g} "
                         f"{c.max_rel:>10.3g} {_r(c.pearson):>10}  {'ok' if c.passed else 'FAIL'}"
                         + (f" ({r.note})" if r.note else ""))
    return "\n".join(lines)


# ---- repro ---------------------------------------------------------------------------------------------------------

REPRO_SCRIPT = '''"""Rerun one kernel (kernel.json names the model and the kernel) alone on the CPU backend and compare
it with the reference.
Written by `npusim verify --per-node --dump-repro`. Exit status 1 when the kernel is outside the tolerance."""

import json
import os
import sys

import numpy as np

from npu_compiler.program import CompiledProgram
from npu_runtime.cpu.backend import CpuBackend
from npu_runtime.metrics import compare, compare_codes

here = os.path.dirname(os.path.abspath(__file__))
meta = json.load(open(os.path.join(here, "kernel.json")))
prog = CompiledProgram.load(os.path.join(here, "kernel.npubin"))
ex = CpuBackend().create_executor(prog)
ex.run({{}})
out = np.array(ex.view(prog.kernels[0].outs[0]))
expected = np.load(os.path.join(here, "expected.npy"), allow_pickle=False)
out = out.reshape(expected.shape).astype(expected.dtype) if out.size == expected.size else out
if meta.get("units") is not None:  # an integer program's codes, the kernel given the reference's inputs
    c = compare_codes(meta["value"], out, expected, meta["units"], "given the reference's inputs")
else:
    c = compare(meta["value"], out, expected, meta.get("tolerance", prog.compute_dtype))
kc = meta["kernel"]
print(f"kernel {{kc['name']}} ({{kc['group']}}; IR nodes {{', '.join(kc['nodes'])}})")
pr = "-" if c.pearson is None else f"{{c.pearson:.6f}}"
rule = c.why or "tolerance of " + meta.get("tolerance", prog.compute_dtype)
print(f"  max_abs {{c.max_abs:.4g}}  max_rel {{c.max_rel:.4g}}  pearson {{pr}}  "
      f"{{'ok' if c.passed else 'MISMATCH'}} ({{rule}})")
sys.exit(0 if c.passed else 1)
'''


def kernel_program(program: CompiledProgram, index: int, buffers: Mapping[int, np.ndarray]) -> CompiledProgram:
    """A program of kernel `index` alone: every buffer it touches becomes a constant holding the data it had just
    before the kernel ran (outputs too, so in-place kernels see their old contents), renumbered from 0. The CPU
    executor then runs it through exactly the code path of the full program."""
    k = program.kernels[index]
    ids = sorted({r.buffer for r in (*k.args, *k.outs)})
    remap = {b: i for i, b in enumerate(ids)}
    specs = []
    for b in ids:
        src: BufferSpec = program.buffers[b]
        data = np.require(buffers[b], requirements="C").tobytes()
        specs.append(BufferSpec(remap[b], src.name, "constant", src.dtype, src.numel, -1, data))

    def ref(r: TensorRef) -> TensorRef:
        return TensorRef(remap[r.buffer], tuple(r.shape), tuple(r.strides), r.offset)

    # (the record alone: the CPU reference computes it without the plan's scratch)
    call = dataclasses.replace(k, args=[ref(a) for a in k.args], outs=[ref(o) for o in k.outs], plan=None, scratch=[])
    return CompiledProgram(f"{program.model_name}:{k.name}", program.target, program.compute_dtype, {}, [], [], [],
                           specs, [call], 0)


def capture_kernel_buffers(executor, inputs: Mapping[str, Any], weights, index: int) -> dict[int, np.ndarray]:
    """The whole buffers kernel `index` reads and writes, as they are just before it runs."""
    k: KernelCall = executor.program.kernels[index]
    got: dict[int, np.ndarray] = {}

    def before(i: int) -> None:
        if i == index:
            for b in {r.buffer for r in (*k.args, *k.outs)}:
                got[b] = np.array(executor.flat[b])

    executor.run_observed(inputs, weights, before=before)
    return got


def _npy_safe(a: np.ndarray) -> np.ndarray:
    # .npy has no bfloat16: store those as float32 (the comparison upcasts anyway)
    return a.astype(np.float32) if a.dtype.name == "bfloat16" else a


def dump_repro(folder: str | os.PathLike, executor, inputs: Mapping[str, Any], weights, check: KernelCheck,
               expected: np.ndarray, reference: Mapping[str, np.ndarray] | None = None,
               node_outputs: Mapping[str, list[str]] | None = None, row_dtype: str | None = None) -> str:
    """Write kernel `check.index`'s inputs (arg{j}.npy, as views), expected output, kernel.json, a one-kernel
    program (kernel.npubin) and repro.py, each file atomically. The folder is made if its parent exists. Nothing of
    the model goes into the script's text: it reads every name from kernel.json (JSON, escaped by the encoder).
    A kernel that per-node ran alone (an integer program's, `check_kernels`) gets the reference's values of its
    inputs (from `reference`, every IR value's) and is judged as there: codes within one unit. `row_dtype`: the
    tolerance row (default: the program's). Returns the script's path."""
    folder = os.fspath(folder)
    program: CompiledProgram = executor.program
    k = program.kernels[check.index]
    check_repro_folder(folder, len(k.args))
    if not os.path.isdir(folder):
        _make_folder(folder)
    bufs = capture_kernel_buffers(executor, inputs, weights, check.index)
    units = None
    if check.note == ALONE and reference is not None:
        bufs = _on_reference_inputs(program, check.index, bufs, kernel_values(program, node_outputs), reference) or bufs
        units = ONE_UNIT if np.asarray(expected).dtype.kind in "iu" else None
    mini = kernel_program(program, check.index, bufs)
    mini.save(os.path.join(folder, "kernel.npubin"))
    for j, a in enumerate(k.args):
        flat = bufs[a.buffer]
        view = np.lib.stride_tricks.as_strided(flat[a.offset:], shape=a.shape,
                                               strides=tuple(s * flat.itemsize for s in a.strides))
        _save_npy(os.path.join(folder, f"arg{j}.npy"), _npy_safe(np.require(view, requirements="C")))
    _save_npy(os.path.join(folder, "expected.npy"), _npy_safe(kernel_reference(k, expected)))
    call = k.to_dict()
    meta = {"model": program.model_name, "index": check.index, "value": check.value,
            "compute_dtype": program.compute_dtype,
            "tolerance": row_dtype or tolerance_dtype(program.compute_dtype, [program]), "units": units,
            "kernel": call, "buffers": {str(b): {"name": program.buffers[b].name, "dtype": program.buffers[b].dtype,
                                                 "numel": program.buffers[b].numel} for b in sorted(bufs)},
            "comparison": check.comparison.to_dict() if check.comparison else None}
    write_text(os.path.join(folder, "kernel.json"), json.dumps(meta, indent=1, default=list))
    script = os.path.join(folder, "repro.py")
    write_text(script, REPRO_SCRIPT.format())
    return script


REPRO_FILES = ("kernel.npubin", "expected.npy", "kernel.json", "repro.py")  # and arg0.npy, arg1.npy, ...


def check_repro_folder(folder: str | os.PathLike, args: int = 0) -> None:
    """Before any work: the repro folder's parent exists, and none of the files a repro writes (its fixed names,
    and `args` argument files) is a link, a FIFO, a device or an input of the command (`atomic.check_target`)."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        if os.path.lexists(folder):
            raise OutputError(f"--dump-repro {folder}: not a folder")
        parent = os.path.dirname(os.path.abspath(folder))
        if not os.path.isdir(parent):
            raise OutputError(f"--dump-repro {folder}: folder {parent} does not exist")
        return
    for name in (*REPRO_FILES, *(f"arg{j}.npy" for j in range(args))):
        check_writable(os.path.join(folder, name), "--dump-repro: cannot write")


def _make_folder(folder: str) -> None:
    parent = os.path.dirname(os.path.abspath(folder))
    if not os.path.isdir(parent):
        raise OutputError(f"--dump-repro {folder}: folder {parent} does not exist")
    try:
        os.mkdir(folder)
    except OSError as e:
        raise OutputError(f"--dump-repro {folder}: cannot create it: {e.strerror or e}") from None


def _save_npy(path: str, a: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, a)


__all__ = ["KernelCheck", "kernel_values", "capture_outputs", "check_kernels", "first_failure", "format_table",
           "kernel_program", "dump_repro", "capture_partitioned", "check_partitioned"]
