"""0-d (scalar) tensors are ordinary tensors everywhere (issue 53): as inputs (a 0-d .npy), outputs and weights, and
for every op and fusion pattern that takes them. ATen wraps a 0-d tensor's dim as if the tensor were 1-d: dim 0 and
-1 name its one element, so `sum`, `mean`, `amax`, `argmax`, `any`, `softmax`, `cumsum`, `topk`, `index_copy`, ...
all take a 0-d operand (their lowering failed with an IndexError, the RMSNorm pattern with a modulo by zero).

The op cases are drawn from the op conformance table (`tests/test_op_conformance.py`): each case whose op PyTorch
runs with every operand made 0-d (and, separately, with its last operand made 0-d, a scalar tensor broadcast against
the others), one case per op, so that an op added to the table gets its 0-d case here without an edit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import _dtype_name, run_module
from test_op_conformance import CASES, Case
from tolerances import assert_close

import npu_runtime
from npusim.cli import main

CPU = npu_runtime.get_backend("cpu")


def _zero(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1)[:1].reshape(()) if t.numel() else t


def _variants(c: Case) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]] | None:
    torch.manual_seed(0)
    ins = c.inputs(c.dtypes[0])
    if not ins or not all(isinstance(t, torch.Tensor) for t in ins):
        return None
    every = tuple(_zero(t) for t in ins)
    last = (*ins[:-1], _zero(ins[-1])) if len(ins) > 1 else None
    return every, last


def _make(c: Case):
    dt = c.dtypes[0]
    return (lambda: c.make().to(dt)) if dt.is_floating_point else c.make


def _eager_runs(c: Case, inputs) -> bool:
    try:
        with torch.no_grad():
            _make(c)().eval()(*[t.clone() for t in inputs])
    except Exception:  # noqa: BLE001  (PyTorch refuses 0-d operands for this op: not a 0-d case)
        return False
    return True


def _cases() -> list:
    """(case, which operands are 0-d), one per op of the table PyTorch runs 0-d (the pattern cases, whose ops are
    several, each)."""
    out, seen = [], {"every": set(), "last": set()}
    for c in CASES:
        v = _variants(c)
        if v is None:
            continue
        for which, inputs in zip(("every", "last"), v):
            if inputs is None or not _eager_runs(c, inputs):
                continue
            if c.ops and set(c.ops) <= seen[which]:
                continue
            seen[which] |= set(c.ops)
            out.append(pytest.param(c, which, id=f"{c.name}-{which}"))
    return out


# Cases whose 0-d form torch.export cannot write as an IR, or that ATen runs unchecked: refused by the reader, by
# name, instead of being run.
NOT_EXPORTABLE = {
    # x[:, i] with a 0-d index tensor: torch.export takes the index's value (aten.item) and writes a select whose
    # index is a symbol, which torch_ir drops: the IR's select has no index
    "index_one_dim-last": r"required attribute 'index' \(int\) is missing",
    # _weight_norm_interface(v, g) with a 0-d g: ATen's CPU kernel reads g at every index of v's dim 0 without
    # checking g's size (values past its one element: garbage), so the reader refuses it, naming the sizes
    "weight_norm_interface-last": r"g has 1 elements; dim 0 of v \[4, 3, 2\] needs 4",
}


@pytest.mark.parametrize("c,which", _cases())
def test_op_over_zero_dim_operands(c: Case, which: str):
    every, last = _variants(c)
    inputs = every if which == "every" else last
    refused = NOT_EXPORTABLE.get(f"{c.name}-{which}")
    if refused is not None:
        from npu_compiler.errors import NPUCompileError

        with pytest.raises(NPUCompileError, match=refused):
            run_module(CPU, _make(c), inputs)
        return
    _, got, ref = run_module(CPU, _make(c), inputs)
    assert len(got) == len(ref)
    for i, (g, r) in enumerate(zip(got, ref)):
        want = r.float().numpy() if r.dtype.is_floating_point else r.numpy()
        assert tuple(np.shape(g)) == tuple(want.shape), (i, np.shape(g), want.shape)
        assert_close(g, want, _dtype_name(r.dtype), c.kind, "cpu", what=f"output {i} {list(r.shape)}")


@pytest.mark.parametrize("op", ["sum", "mean", "amax", "argmax", "any", "softmax", "cumsum", "topk", "index_copy",
                                "rmsnorm"])
def test_the_named_cases_on_every_backend(backend, op):
    """The reductions, the RMSNorm pattern and index_copy of the issue, over a 0-d operand, on each backend."""
    f = {
        "sum": lambda x: x.sum(-1),
        "mean": lambda x: x.mean(-1, keepdim=True),
        "amax": lambda x: x.amax(0),
        "argmax": lambda x: x.argmax(-1),
        "any": lambda x: (x > 0).any(-1),
        "softmax": lambda x: torch.softmax(x, -1),
        "cumsum": lambda x: x.cumsum(0),
        "topk": lambda x: x.topk(1).values,
        "index_copy": lambda x, i: x.index_copy(0, i, x * 3.0),
        "rmsnorm": lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
    }[op]

    class M(torch.nn.Module):
        def forward(self, x, *i):
            return f(x, *i)

    inputs = [torch.tensor(-0.75)] + ([torch.tensor([0])] if op == "index_copy" else [])
    _, got, ref = run_module(backend, M, inputs)
    r = ref[0]
    want = r.float().numpy() if r.dtype.is_floating_point else r.numpy()
    assert np.shape(got[0]) == () and want.shape == ()
    assert_close(got[0], want, _dtype_name(r.dtype), "accumulate", backend.name)


class _ScalarWeight(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(1.5))
        self.register_buffer("shift", torch.tensor(-0.25))

    def forward(self, x, v):
        return (x * self.scale + self.shift).exp() + v.sum(), v.amax(-1).argmax()


def test_zero_dim_inputs_outputs_and_weights_through_the_cli(tmp_path, capsys, monkeypatch):
    """The newcomer's commands on a model with a 0-d input, 0-d weights and 0-d outputs: a 0-d .npy is taken as
    it is (it was read as [1] and refused), and the outputs stay 0-d in the summary and in -o's .npz."""
    here = str(__import__("pathlib").Path(__file__).parent)
    (tmp_path / "m.py").write_text(f"import sys\nsys.path.insert(0, {here!r})\n"
                                   "from test_zero_dim import _ScalarWeight\n"
                                   "def make():\n    return _ScalarWeight()\n")
    monkeypatch.chdir(tmp_path)
    assert main(["export", "m.py:make", "--input-shape", "", "--input-shape", "3,4", "-o", "out"]) == 0
    ir = json.loads((tmp_path / "out" / "make.json").read_text())
    assert ir["graph_inputs"][0]["shape"] == [] and {tuple(o["shape"]) for o in ir["graph_outputs"]} == {()}
    np.save(tmp_path / "x.npy", np.array(0.25, np.float32))
    np.save(tmp_path / "v.npy", np.arange(12, dtype=np.float32).reshape(3, 4))
    given = ["--input", "x=x.npy", "--input", "v=v.npy"]
    assert main(["verify", "out/make.json", *given]) == 0
    assert main(["compile", "out/make.json", "-o", "out/make.npubin"]) == 0
    capsys.readouterr()
    assert main(["run", "out/make.npubin", *given, "--iters", "1", "--warmup", "0", "-o", "o.npz"]) == 0
    out = capsys.readouterr().out
    want = float(np.exp(np.float32(0.25) * np.float32(1.5) - np.float32(0.25)) + np.float32(66.0))
    assert "float32[]: min" in out and "int64[]: min 2" in out
    with np.load(tmp_path / "o.npz") as z:
        outs = dict(z)
    assert {k: v.shape for k, v in outs.items()} == {k: () for k in outs}
    floats = [v for v in outs.values() if v.dtype == np.float32]
    assert abs(float(floats[0]) - want) < 1e-4


def test_no_array_helper_that_makes_a_0d_array_1d():
    """np.ascontiguousarray and np.atleast_1d turn shape () into (1,) (how a 0-d .npy input was refused): the
    runtime and the CLI use np.require(a, requirements="C"), which keeps the shape."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = [f"{p.relative_to(root)}:{i}" for pkg in ("npu_compiler", "npu_runtime", "npu_export", "npusim")
             for p in sorted((root / pkg).rglob("*.py"))
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if ("ascontiguousarray(" in line or "atleast_1d(" in line) and not line.lstrip().startswith("#")]
    assert not found, found
