"""ATen's alias ops (`ir/aliases.py`): each rewritten into the op it stands for, its arguments renamed."""

from __future__ import annotations

from ..ir.aliases import ALIASES, renamed
from ..ir.graph import Node, Value
from .registry import Rewriter, decomposes


def _register() -> None:
    for alias, (target, names) in ALIASES.items():

        def rewrite(rw: Rewriter, node: Node, target: str = target, names: dict = names) -> list[Value]:
            return rw.ops(target, *node.inputs, **renamed(node.attrs, names))

        decomposes(alias, emits=(target,))(rewrite)


_register()
