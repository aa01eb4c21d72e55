"""The cyclic collector is paused while a program is compiled, read or loaded, and always left as it was."""

from __future__ import annotations

import gc

import pytest
import torch
from fused_cases import ir_dict

import npu_compiler
import npu_compiler.compiler as compiler
from npu_compiler.collector import collector_paused
from npu_compiler.errors import NPUCompileError
from npu_compiler.program import CompiledProgram


@pytest.fixture(autouse=True)
def _collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_inside_and_restored_after_nesting_and_errors() -> None:
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("inside")
    assert gc.isenabled()


def test_a_caller_that_switched_it_off_keeps_it_off() -> None:
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_compile_pauses_it_and_leaves_it_on(monkeypatch) -> None:
    seen = []
    real = compiler._compile

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(compiler, "_compile", spy)
    x = torch.randn(2, 8)
    prog = npu_compiler.compile(ir_dict(torch.nn.Linear(8, 4).eval(), [x], "lin"), "cpu")
    assert seen == [False] and gc.isenabled()
    with pytest.raises(NPUCompileError):
        npu_compiler.compile({"bad": 1}, "cpu")
    assert gc.isenabled()
    with collector_paused():  # reading the artifact back, inside a caller's own pause
        assert CompiledProgram.from_bytes(prog.to_bytes()).kernels
        assert not gc.isenabled()
    assert gc.isenabled()
