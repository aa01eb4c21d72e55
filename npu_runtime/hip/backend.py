"""The hip backend's entry in the registry. npusim has no HIP runtime: no AMD GPU is reachable to build and test one
on, so the hip target is compile-only (its kernels render as HIP C++ and compile with hipcc; docs/hip.md). The
backend is never available; naming it (`--backend hip`, $NPUSIM_BACKEND), or running a program compiled for hip,
says so and what runs a model instead."""

from __future__ import annotations

from typing import Any

from ..backend import Backend
from ..errors import BackendUnavailable

REASON = ("npusim has no HIP runtime (the hip target is compile-only: no AMD GPU is reachable to run or test it "
          "on); compile the model for cpu, cuda or webgpu to run it")


class HipBackend(Backend):
    name = "hip"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return REASON

    def allocate(self, shape: tuple[int, ...], dtype: str) -> Any:
        raise BackendUnavailable(REASON)

    def upload(self, array: Any, dtype: str | None = None) -> Any:
        raise BackendUnavailable(REASON)

    def create_executor(self, program: Any, **kwargs: Any) -> Any:
        raise BackendUnavailable(REASON)


BACKEND = HipBackend
