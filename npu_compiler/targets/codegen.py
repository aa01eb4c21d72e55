"""`CodegenTarget`: how kernels are written for the machine that executes them. A target renders generated
(expression) kernels from its own table of primitives and names the library kernels it maps to."""

from __future__ import annotations

from abc import ABC, abstractmethod

from ..errors import NPUCompileError
from ..program import CompiledProgram, KernelCall


class CodegenTarget(ABC):
    name: str = ""
    library_kernels: frozenset[str] = frozenset()

    @abstractmethod
    def render_generated(self, kernel: KernelCall, program: CompiledProgram) -> str:
        """Source text of one generated kernel."""

    def render(self, program: CompiledProgram) -> None:
        """Fill `program.sources` (deduplicated by text) and point each generated kernel at its source."""
        by_text: dict[str, str] = {}
        for k in program.kernels:
            if k.kind != "generated":
                if k.kind not in self.library_kernels:
                    raise NPUCompileError(f"kernel {k.name} (nodes {k.nodes}): library kernel '{k.kind}' is not "
                                          f"provided by target '{self.name}'")
                continue
            text = self.render_generated(k, program)
            name = by_text.get(text)
            if name is None:
                name = f"src{len(by_text)}"
                by_text[text] = name
                program.sources[name] = text
            k.source = name


_TARGETS: dict[str, type[CodegenTarget]] = {}


def register_target(cls: type[CodegenTarget]) -> type[CodegenTarget]:
    _TARGETS[cls.name] = cls
    return cls


def get_codegen_target(name: str) -> CodegenTarget:
    # Always: once another target has registered (the CUDA module imported first), `_TARGETS` is not empty but
    # 'cpu' may be missing from it.
    from . import numpy_target  # noqa: F401  (registers itself)
    try:
        from . import cuda  # noqa: F401
    except ImportError:
        pass
    if name not in _TARGETS:
        raise NPUCompileError(f"unknown target '{name}' (known: {', '.join(sorted(_TARGETS))})")
    return _TARGETS[name]()


def available_targets() -> list[str]:
    get_codegen_target("cpu")
    return sorted(_TARGETS)
