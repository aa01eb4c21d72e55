"""No GPU size is a literal in a target's generator: multiprocessor counts, shared-memory limits and the like come
from the device profile the target is given (devices.py), so that an A100, an L4 or an AMD part differs from
an H100 by a row of the chip table, not by an edit of a generator.

The check reads every module under npu_compiler/targets (but the chip table itself) with `ast` and refuses an integer
constant, a product of constants (`227 * 1024`) or a factor of one (`132 * 2048`), equal to a size some row of the
table holds that is not also an everyday power of two: each row's multiprocessor count and twice it, its shared
memory a block may opt in to and an SM holds, and the 48 KiB a CUDA block has without opting in (a size only a GPU
has)."""

from __future__ import annotations

import ast
from pathlib import Path

from npu_compiler.devices import CHIPS

TARGETS = Path(__file__).resolve().parent.parent / "npu_compiler" / "targets"


def _gpu_sizes() -> dict[int, str]:
    sizes: dict[int, str] = {}
    for p in CHIPS.values():
        if p.vendor == "generic":
            continue
        for value, what in ((p.multiprocessors, "multiprocessors"), (2 * p.multiprocessors, "2 x multiprocessors"),
                            (p.shared_memory_per_block_optin, "shared_memory_per_block_optin"),
                            (p.shared_memory_per_multiprocessor, "shared_memory_per_multiprocessor")):
            if value & (value - 1):  # not a power of two: 128 SMs or 64 KiB are every-day tile sizes too
                sizes.setdefault(value, f"{p.name}.{what}")
    sizes[48 * 1024] = "CUDA's shared memory a block without opting in (shared_memory_per_block)"
    return sizes


def _constant(node: ast.AST) -> int | None:
    """The value of an int literal or of a product of int literals, else None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        a, b = _constant(node.left), _constant(node.right)
        return a * b if a is not None and b is not None else None
    return None


def _literals(path: Path) -> list[tuple[int, int]]:
    """(line, value) of every int constant and every product of constants in a module (the factors of a product
    too: `132 * 2048` is an H100's resident threads)."""
    found: list[tuple[int, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        value = _constant(node)
        if value is not None:
            found.append((node.lineno, value))
    return found


def test_no_gpu_size_is_a_literal_in_a_generator() -> None:
    sizes = _gpu_sizes()
    assert {132, 264, 108, 148, 58, 304, 110, 227 * 1024, 99 * 1024, 48 * 1024} <= set(sizes)
    offences = []
    modules = sorted(p for p in TARGETS.rglob("*.py") if p.name != "devices.py")
    assert len(modules) > 20
    for path in modules:
        for line, value in _literals(path):
            if value in sizes:
                offences.append(f"{path.relative_to(TARGETS.parent.parent)}:{line}: {value} "
                                f"(a GPU size: {sizes[value]}; read it from the device profile)")
    assert not offences, "\n".join(offences)


def test_the_check_sees_a_literal(tmp_path) -> None:
    """The scan finds sizes however they are written (a plain literal, a product), not products with names."""
    path = tmp_path / "probe.py"
    path.write_text("SMS = 132\nMAX = 227 * 1024\nFEW = 2 * 132\nOK = 2 * dev.multiprocessors\nTILE = 128 * 2\n")
    sizes = _gpu_sizes()
    assert [v for _, v in _literals(path) if v in sizes] == [132, 227 * 1024, 264, 132]
