"""Every kernel kind's one count (`KernelSpec.cost`, npu_compiler/kernels/counting.py), which `npusim profile` and
`npusim estimate` both read, against counts worked out by hand from the op's definition.

The rules the hand counts follow (docs/read-a-profile.md, docs/npu_model.md): a multiply-add is one MAC; a vector
operation on data is one per element it produces (a reduction one per element it takes in); address arithmetic
(window positions, padding guards, gather rows, scatter positions) and casts are free; bytes are each distinct
element read or written once.
"""

from __future__ import annotations

import torch
from conftest import export_ir

import npu_compiler
from npu_compiler.buffers import BufferSpec
from npu_compiler.kernels import AttentionKernel, GemmKernel, KernelCall
from npu_compiler.npu import VectorWork, kernel_work
from npu_compiler.program import CompiledProgram
from npu_compiler.tensor import TensorRef, contiguous_strides
from npu_runtime.profiling import format_table, summarize


def _compile(make, inputs, **kw):
    return npu_compiler.compile(export_ir(make, inputs), "cpu", **kw)


def _only(prog, kind=None):
    ks = [k for k in prog.kernels if kind is None or k.kind == kind]
    assert len(ks) == 1, [k.name for k in prog.kernels]
    return ks[0], ks[0].spec.cost(ks[0], prog.buffers)


def test_a_max_pool_is_one_comparison_per_window_element():
    # 3x3 windows, stride 2, padding 1 over 16 channels of 32 x 32: 16 x 16 x 16 outputs of 9 comparisons each.
    # The window's positions and its padding guard are addresses: no FLOPs at all.
    prog = _compile(lambda: torch.nn.MaxPool2d(3, 2, 1), [torch.empty(1, 16, 32, 32)])
    k, c = _only(prog)
    assert (c.macs, c.arith, c.compares, c.flops) == (0, 0, 16 * 16 * 16 * 9, 0)
    assert c.compares == 36_864  # "about 37 k comparisons", not 1.18 MFLOP
    assert c.bytes_read == 16 * 32 * 32 * 4 and c.bytes_written == 16 * 16 * 16 * 4
    assert c.bytes_by_dtype() == {"float32": {"read": 65_536, "written": 16_384}}
    # the NPU model's vector unit does the same 36,864 operations
    w = kernel_work(prog, k)
    assert isinstance(w, VectorWork) and w.ops == 36_864
    # and the profile's table shows them as comparisons
    report = summarize(prog, [[]], "cpu")
    row = format_table(report).splitlines()[1].split()
    assert row[5:8] == ["0.082", "0.000", "0.037"]  # MB, MFLOP, Mcmp


def test_average_pool_sums_the_window_and_divides_once():
    # 2x2 windows over 4 x 8 x 8: 64 outputs, 4 adds and one divide each; the divisor comes from indices (free).
    _, c = _only(_compile(lambda: torch.nn.AvgPool2d(2), [torch.empty(1, 4, 8, 8)]))
    assert (c.arith, c.compares) == (64 * (4 + 1), 0)


def test_elementwise_chain_and_softmax_and_a_norm():
    class AddRelu(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(x + y)

    _, c = _only(_compile(AddRelu, [torch.empty(4, 8), torch.empty(4, 8)]))
    assert (c.arith, c.compares, c.bytes_read, c.bytes_written) == (32, 32, 2 * 32 * 4, 32 * 4)

    # softmax over rows of 10 (3 rows), as the kernel computes it: the row max once per element taken in (30
    # comparisons); exp(x - max) once inside the row sum and once for the output (2 subtracts, 2 exps), the sum's
    # add, the divide: 6 operations per element.
    _, c = _only(_compile(lambda: torch.nn.Softmax(-1), [torch.empty(3, 10)]))
    assert (c.arith, c.compares) == (30 * 6, 30)

    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(10))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w

    # per element: square, the sum's add, the divide by the root, the weight's multiply (4 x 30); per row: the
    # mean's divide, + eps, the square root (3 x 3), not per element
    k, c = _only(_compile(Norm, [torch.empty(3, 10)]))
    assert k.group == "npu.rmsnorm" and (c.arith, c.compares) == (4 * 30 + 3 * 3, 0)
    assert [(t.index, t.bytes) for t in c.reads] == [(0, 120), (1, 40)]


def test_gemm_and_conv_count_macs_bias_and_epilogue():
    k, c = _only(_compile(lambda: torch.nn.Linear(8, 4), [torch.empty(2, 8)]))
    assert (c.macs, c.arith, c.compares, c.flops) == (2 * 4 * 8, 2 * 4, 0, 2 * 64 + 8)
    assert c.mac_dtypes == ("float32", "float32")
    assert [t.bytes for t in c.reads] == [2 * 8 * 4, 8 * 4 * 4, 4 * 4]  # x, weight, bias

    def conv():
        return torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1, groups=2), torch.nn.ReLU())

    _, c = _only(_compile(conv, [torch.empty(1, 4, 6, 6)]), "conv2d")
    out = 8 * 6 * 6
    # each output takes Cin/g x 3 x 3 = 18 MACs; the bias add and the ReLU (a max) per output element
    assert (c.macs, c.arith, c.compares) == (out * 18, out, out)
    assert c.bytes_written == out * 4 and c.bytes_read == (4 * 36 + 8 * 2 * 9 + 8) * 4


def test_gathers_scatters_and_iota_move_bytes_only():
    _, c = _only(_compile(lambda: torch.nn.Embedding(10, 4), [torch.zeros(2, 3, dtype=torch.long)]))
    # 6 ids (int64) and the 6 rows they pick (not the whole table)
    assert (c.arith, c.compares) == (0, 0)
    assert c.bytes_by_dtype() == {"int64": {"read": 48, "written": 0}, "float32": {"read": 96, "written": 96}}

    class Arange(torch.nn.Module):
        def forward(self, x):
            return x + torch.arange(8, dtype=torch.float32, device=x.device)

    prog = _compile(Arange, [torch.empty(2, 8)])
    counts = [(k.spec.cost(k, prog.buffers).arith, k.spec.cost(k, prog.buffers).compares) for k in prog.kernels]
    assert sorted(counts) == [(0, 0), (16, 0)]  # the arange's values are indices (free); the add

    class CacheWrite(torch.nn.Module):
        def forward(self, cache, pos, new):
            return cache.index_copy(2, pos, new)

    prog = _compile(CacheWrite, [torch.empty(1, 2, 16, 4), torch.zeros(3, dtype=torch.long), torch.empty(1, 2, 3, 4)])
    scatters = [k for k in prog.kernels if k.spec.scatter is not None]
    assert len(scatters) == 1
    c = scatters[0].spec.cost(scatters[0], prog.buffers)
    # writes the 2 x 3 rows of 4 it is given (not the cache), reads them and the 3 positions; no operations
    assert (c.arith, c.compares, c.bytes_written) == (0, 0, 2 * 3 * 4 * 4)
    assert sorted(t.bytes for t in c.reads) == [3 * 8, 2 * 3 * 4 * 4]


def _call(spec, shapes_dtypes, outs, kinds=None):
    """A kernel call built by hand: one buffer per tensor (contiguous), args then outs."""
    buffers, refs = [], []
    for i, (shape, dtype) in enumerate([*shapes_dtypes, *outs]):
        n = 1
        for d in shape:
            n *= d
        buffers.append(BufferSpec(i, f"t{i}", (kinds or {}).get(i, "input"), dtype, n))
        refs.append(TensorRef(i, tuple(shape), contiguous_strides(shape)))
    call = KernelCall("k0", spec, refs[:len(shapes_dtypes)], refs[len(shapes_dtypes):])
    spec.check(call, buffers)
    return call, buffers


def test_attention_counts_and_a_decode_reads_only_the_context():
    b, h, hk, t, lk, d = 1, 4, 2, 1, 64, 16
    spec = AttentionKernel(scale=0.25, is_causal=False, mask="additive", batch=b, heads=h, kv_heads=hk, q_len=t,
                           kv_len=lk, head_dim=d, v_dim=d, valid_len=True)
    call, buffers = _call(spec, [((b, h, t, d), "float16"), ((b, hk, lk, d), "float16"), ((b, hk, lk, d), "float16"),
                                 ((b, h, t, lk), "float16"), ((1,), "int64")], [((b, h, t, d), "float16")])
    scores = b * h * t * lk
    c = spec.cost(call, buffers)
    # per score: scale, mask add, subtract max, exp, sum, divide (6) and the max (1); 2 x 16 MACs
    assert (c.macs, c.arith, c.compares) == (scores * 2 * d, scores * 6, scores)
    assert c.read_of(1) == b * hk * lk * d * 2 and c.read_of(3) == scores * 2
    # a decode at context 10 reads 10 cached keys and values per kv head, and 10 mask entries per row
    c10 = spec.cost(call, buffers, context_len=10)
    assert c10.macs == b * h * t * 10 * 2 * d and c10.read_of(1) == b * hk * 10 * d * 2
    assert c10.read_of(3) == b * h * t * 10 * 2 and c10.read_of(4) == 8


def test_an_int8_gemm_record_counts_int8_macs_and_bytes():
    """Records as the int8 programs will carry them (int8 operands, int32 output): the count keeps their formats."""
    spec = GemmKernel(m=4, n=32, k=64, batch=())
    call, buffers = _call(spec, [((4, 64), "int8"), ((64, 32), "int8")], [((4, 32), "int32")], {1: "weight"})
    c = spec.cost(call, buffers)
    assert (c.macs, c.mac_dtypes) == (4 * 32 * 64, ("int8", "int8"))
    assert c.bytes_by_dtype() == {"int8": {"read": 4 * 64 + 64 * 32, "written": 0},
                                  "int32": {"read": 0, "written": 4 * 32 * 4}}


def test_counts_survive_the_artifact(tmp_path):
    """Identical subtrees count once whether or not the tree shares them (an artifact read back shares none)."""
    prog = _compile(lambda: torch.nn.Softmax(-1), [torch.empty(3, 10)])
    prog.save(tmp_path / "s.npubin")
    back = CompiledProgram.load(tmp_path / "s.npubin")
    for a, b in zip(prog.kernels, back.kernels):
        assert a.spec.cost(a, prog.buffers) == b.spec.cost(b, back.buffers)
