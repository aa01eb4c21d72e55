"""Which ops the compiler lowers, and the library kernel kinds each lowering may emit: the one source that the
lowering dispatches on and that op support (`npu_compiler.op_support`) is derived from."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..ir.graph import Node
    from .lower import Lowering

Handler = Callable[["Lowering", "Node"], None]

LOWERINGS: dict[str, Handler] = {}
KERNELS_OF: dict[str, tuple[str, ...]] = {}  # op -> library kernel kinds its lowering may emit (besides generated)


def lowers(*ops: str, kernels: tuple[str, ...] = ()) -> Callable[[Handler], Handler]:
    """Register `fn` as the lowering of `ops`."""

    def register(fn: Handler) -> Handler:
        for op in ops:
            if op in LOWERINGS:
                raise RuntimeError(f"two lowerings of {op}")  # a bug in the registry, at import
            LOWERINGS[op] = fn
            KERNELS_OF[op] = tuple(kernels)
        return fn

    return register
