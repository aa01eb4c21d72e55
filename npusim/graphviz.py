"""The fused graph of a CompiledProgram (kernels as nodes; an edge where a kernel reads a buffer an earlier kernel
wrote) as DOT or Mermaid text, and the artifact's size breakdown for `npusim describe`."""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

from npu_compiler.program import CompiledProgram

from .safe_text import printable


@dataclass
class Edge:
    src: str  # "k<i>" for a kernel, "in<j>" / "out<j>" for a graph input / output
    dst: str
    buffer: int


def fused_edges(program: CompiledProgram) -> list[Edge]:
    """Data edges in program order: each read comes from the latest kernel that wrote the buffer before it (the
    arena reuses memory across buffers, but buffer ids stay distinct, so ids are the right key)."""
    writer: dict[int, str] = {s.buffer: f"in{j}" for j, s in enumerate(program.inputs)}
    edges: list[Edge] = []
    seen: set[tuple[str, str]] = set()
    for i, k in enumerate(program.kernels):
        me = f"k{i}"
        for a in k.args:
            src = writer.get(a.buffer)
            if src is not None and src != me and (src, me) not in seen:
                seen.add((src, me))
                edges.append(Edge(src, me, a.buffer))
        for o in k.outs:
            writer[o.buffer] = me
    for j, s in enumerate(program.outputs):
        src = writer.get(s.buffer)
        if src is not None:
            edges.append(Edge(src, f"out{j}", s.buffer))
    return edges


def _kernel_label(i: int, program: CompiledProgram) -> list[str]:
    k = program.kernels[i]
    nodes = ", ".join(k.nodes[:3]) + (" ..." if len(k.nodes) > 3 else "")
    shape = "x".join(map(str, k.outs[0].shape)) if k.outs else ""
    return [f"#{i} {k.kind}", k.group, nodes, shape]


def _dot_escape(s: str) -> str:
    """Text from the program (names come from the IR) inside a DOT string: control characters shown as escapes,
    backslashes and quotes escaped, newlines as DOT's own line break."""
    return printable(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _dot_str(s: str) -> str:
    return '"' + _dot_escape(s) + '"'


def to_dot(program: CompiledProgram) -> str:
    lines = [f"digraph {_dot_str(program.model_name or 'program')} {{", "  rankdir=TB;",
             '  node [shape=box, fontname="Helvetica", fontsize=10];']
    for j, s in enumerate(program.inputs):
        lines.append(f"  in{j} [shape=ellipse, label={_dot_str(f'{s.name} {s.dtype}{list(s.shape)}')}];")
    for i in range(len(program.kernels)):
        label = "\\n".join(_dot_escape(x) for x in _kernel_label(i, program))
        lines.append(f'  k{i} [label="{label}"];')
    for j, s in enumerate(program.outputs):
        lines.append(f"  out{j} [shape=ellipse, label={_dot_str(f'{s.name} {s.dtype}{list(s.shape)}')}];")
    for e in fused_edges(program):
        lines.append(f"  {e.src} -> {e.dst};")
    lines.append("}")
    return "\n".join(lines) + "\n"


_MERMAID_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _.,:/+=()[]-")


def _mermaid_str(s: str) -> str:
    """Text from the program inside a Mermaid label: every character outside a plain set as an entity code (#34;),
    so no name can end the label, start a line (a `click` directive) or inject markup."""
    return "".join(c if c in _MERMAID_SAFE else f"#{ord(c)};" for c in s)


def to_mermaid(program: CompiledProgram) -> str:
    lines = ["flowchart TD"]
    for j, s in enumerate(program.inputs):
        lines.append(f'  in{j}(["{_mermaid_str(f"{s.name} {s.dtype}{list(s.shape)}")}"])')
    for i in range(len(program.kernels)):
        label = "<br/>".join(_mermaid_str(x) for x in _kernel_label(i, program) if x)
        lines.append(f'  k{i}["{label}"]')
    for j, s in enumerate(program.outputs):
        lines.append(f'  out{j}(["{_mermaid_str(f"{s.name} {s.dtype}{list(s.shape)}")}"])')
    for e in fused_edges(program):
        lines.append(f"  {e.src} --> {e.dst}")
    return "\n".join(lines) + "\n"


def size_breakdown(program: CompiledProgram) -> dict[str, int]:
    """Bytes of the .npubin by part (msgpack of each field; the rest is the header and field names), plus the
    weights' device bytes, which the artifact does not hold (they are loaded from the checkpoint)."""
    total = len(program.to_bytes())
    d = program.to_dict()
    constants = sum(len(b.data or b"") for b in program.buffers)
    kernels = len(msgpack.packb(d["kernels"], use_bin_type=True))
    buffers = len(msgpack.packb(d["buffers"], use_bin_type=True)) - constants
    return {"artifact_bytes": total, "kernel_bytes": kernels,
            "constant_bytes": constants, "buffer_table_bytes": max(buffers, 0),
            "other_metadata_bytes": max(total - kernels - constants - max(buffers, 0), 0),
            "weight_device_bytes": program.weight_bytes}
