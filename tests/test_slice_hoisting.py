"""Slice hoisting (`npu_compiler/passes/slice_hoisting.py`): rows a program never reads are not computed, and the
results stay PyTorch's. Each case compiles a small model whose output keeps some rows (the last tokens, a [CLS]
token), runs it on the CPU backend and compares with PyTorch eager; the kernels' shapes show which ops now run on
fewer rows, and the same program with the pass off is the control."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from helpers import state_dict_numpy
from tolerances import assert_close

import npu_compiler
import npu_runtime
from npu_export.ir_io import ir_to_dict

CPU = npu_runtime.get_backend("cpu")
B, T, D, H = 2, 6, 16, 2


class _Block(torch.nn.Module):
    """A transformer block whose output keeps rows `keep` of the sequence dim: a pre-norm attention (SDPA with an
    additive mask, or causal), a GELU MLP, a residual stream read whole by the keys and values."""

    def __init__(self, keep, causal: bool = False) -> None:
        super().__init__()
        self.keep, self.causal = keep, causal
        self.norm = torch.nn.LayerNorm(D)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(D, D) for _ in range(4))
        self.up, self.down = torch.nn.Linear(D, 2 * D), torch.nn.Linear(2 * D, D)

    def forward(self, x, mask):
        h = self.norm(x)
        heads = [p(h).view(B, T, H, D // H).transpose(1, 2) for p in (self.q, self.k, self.v)]
        if self.causal:
            a = torch.nn.functional.scaled_dot_product_attention(*heads, is_causal=True)
        else:
            a = torch.nn.functional.scaled_dot_product_attention(*heads, attn_mask=mask)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, D))
        x = x + self.down(torch.nn.functional.gelu(self.up(x)))
        return self.keep(x)


def _export(module: torch.nn.Module, *inputs: np.ndarray) -> dict:
    import torch_ir

    meta = copy.deepcopy(module).to("meta")
    with torch.no_grad():
        return ir_to_dict(torch_ir.extract_ir(meta, tuple(torch.from_numpy(x).to("meta") for x in inputs),
                                              model_name=type(module).__name__))


def _compile_and_run(module: torch.nn.Module, dtype: str = "float32", **kw):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    mask = np.where(rng.random((B, 1, T, T)) < 0.3, -1e4, 0.0).astype(np.float32)
    ir = _export(module, x, mask)
    with torch.no_grad():
        want = module(torch.from_numpy(x), torch.from_numpy(mask))
    prog = npu_compiler.compile(ir, "cpu", dtype=dtype, **kw)
    ws = npu_runtime.load_weights(prog, state_dict_numpy(module), CPU)
    names = [s.name for s in prog.inputs]
    got = CPU.create_executor(prog).run_numpy(dict(zip(names, (x, mask))), ws)
    return prog, next(iter(got.values())), want.numpy()


def _gemm_rows(prog) -> list[int]:
    return [math.prod(k.outs[0].shape[:-1]) for k in prog.kernels if k.kind == "gemm"]


def _hoisted(prog) -> int:
    return next((int(p[len("slice_hoisting("):-1]) for p in prog.passes if p.startswith("slice_hoisting(")), 0)


@pytest.mark.parametrize("keep,rows", [(lambda x: x[:, -1:], 1), (lambda x: x[:, 0], 1), (lambda x: x[:, 1:4], 3)],
                         ids=["last", "cls", "middle"])
def test_rows_kept_by_the_output_are_the_only_ones_computed(keep, rows):
    torch.manual_seed(0)
    module = _Block(keep).eval()
    prog, got, want = _compile_and_run(module)
    assert_close(got, want, "float32", "accumulate", what="hoisted block vs torch")
    plain, got_plain, _ = _compile_and_run(module, disable_passes=["slice_hoisting"])
    assert_close(got_plain, want, "float32", "accumulate", what="block without the pass vs torch")
    assert _hoisted(prog) > 0 and _hoisted(plain) == 0
    # without the pass: q/k/v (one GEMM, concat_linears), o, up, down on every row; with it the keys and values
    # (and the norm they read) stay whole, q, o, up and down run on the kept rows only
    assert sorted(_gemm_rows(plain)) == [B * T] * 4
    assert sorted(_gemm_rows(prog)) == sorted([B * T] + [B * rows] * 4), _gemm_rows(prog)
    attention = [k for k in prog.kernels if k.kind == "attention"]
    assert attention and all(k.outs[0].shape[2] == rows for k in attention)


def test_per_node_verify_compares_the_rows_a_kernel_computed(tmp_path):
    """`verify --per-node` maps each kernel to the IR value it holds: a kernel that computes some rows of it is
    compared with those rows of the reference (not refused for its shape), also after a round trip of the artifact."""
    from npu_compiler.program import CompiledProgram
    from npu_export.reference import run_reference_all
    from npu_runtime import inspect as npi

    torch.manual_seed(4)
    module = _Block(lambda x: x[:, -1:]).eval()
    rng = np.random.default_rng(5)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    mask = np.where(rng.random((B, 1, T, T)) < 0.3, -1e4, 0.0).astype(np.float32)
    ir = _export(module, x, mask)
    prog = CompiledProgram.from_bytes(npu_compiler.compile(ir, "cpu", dtype="float32").to_bytes())
    ws = npu_runtime.load_weights(prog, state_dict_numpy(module), CPU)
    feeds = dict(zip([s.name for s in prog.inputs], (x, mask)))
    sd = {k: torch.from_numpy(v) for k, v in state_dict_numpy(module).items()}
    values, node_outputs = run_reference_all(ir, sd, feeds)
    rows = npi.check_kernels(prog, npi.capture_outputs(CPU.create_executor(prog), feeds, ws), values, node_outputs)
    # (a node's internal steps, such as attention's scratch launches, hold no value to compare)
    partial = [r for r, k in zip(rows, prog.kernels) if k.out_rows and r.value is not None]
    assert all(k.out_rows[1:] == [T - 1, T] for k in prog.kernels if k.out_rows)
    assert len(partial) >= 5 and all(r.comparison is not None and r.passed for r in partial), npi.format_table(rows)
    assert npi.first_failure(rows) is None


def test_causal_attention_keeps_all_its_query_rows():
    """A causal mask is aligned to the first query: a slice of the queries would change which keys each row sees,
    so the attention (and the projections before it) keep every row; what follows it still runs on one."""
    torch.manual_seed(1)
    module = _Block(lambda x: x[:, -1:], causal=True).eval()
    prog, got, want = _compile_and_run(module)
    assert_close(got, want, "float32", "accumulate", what="causal block vs torch")
    attention = [k for k in prog.kernels if k.kind == "attention"]
    assert attention and all(k.outs[0].shape[2] == T for k in attention)
    assert sorted(_gemm_rows(prog)) == sorted([B * T] + [B] * 3)  # q/k/v whole; o, up, down on one row


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_dtypes(dtype):
    torch.manual_seed(2)
    module = _Block(lambda x: x[:, -2:]).eval()
    prog, got, _ = _compile_and_run(module, dtype)
    _, got_plain, _ = _compile_and_run(module, dtype, disable_passes=["slice_hoisting"])
    assert _hoisted(prog) > 0
    # the kept rows are computed by the same ops on the same operands: the same numbers, to the GEMM's order
    assert_close(got.astype(np.float32), got_plain.astype(np.float32), dtype, "accumulate", what="with vs without")


class _Readers(torch.nn.Module):
    """Several readers of one value taking different rows (the hull is computed), a strided slice (not hoisted), a
    view that merges the sliced dim into another (not hoisted past it), and a value also returned whole."""

    def forward(self, x, mask):
        y = torch.tanh(x * 2.0 + 1.0)  # [B, T, D]
        a = y[:, 1:3] + y[:, 4:5].exp()  # hull 1:5
        z = torch.sin(x)
        s = (z * 3.0)[:, ::2]  # step 2: stays where it is
        m = (z - 1.0).reshape(B * T, D)[2:5]  # rows of a merged dim
        return a, s, m, (mask * 2.0)[..., :2, :]


def test_readers_of_different_rows_and_slices_that_stay():
    rng = np.random.default_rng(3)
    ins = (rng.standard_normal((B, T, D)).astype(np.float32), rng.standard_normal((B, 1, T, T)).astype(np.float32))
    module = _Readers().eval()
    ir = _export(module, *ins)
    with torch.no_grad():
        want = module(*map(torch.from_numpy, ins))
    prog = npu_compiler.compile(ir, "cpu", dtype="float32", fusion=False)
    got = CPU.create_executor(prog).run_numpy(dict(zip([s.name for s in prog.inputs], ins)))
    for g, w in zip(got.values(), want):
        assert_close(g, w.numpy(), "float32", "elementwise", what="readers vs torch")
    shapes = {tuple(k.outs[0].shape) for k in prog.kernels if k.outs}
    assert (B, 4, D) in shapes  # tanh (and x * 2 + 1) over the hull 1:5 of y's rows
    # z, z * 3 and z - 1 whole: a strided slice is not hoisted, nor one of a dim the reshape merged
    assert sum(s in ((B, T, D), (B * T, D)) for s in [tuple(k.outs[0].shape) for k in prog.kernels]) == 3
    assert (B, 1, 2, T) in shapes  # mask * 2 on the two rows kept


def test_tiny_qwen2_prefill_with_last_logits_only(tmp_path):
    """The LLM case: the prefill keeps the last token's logits; its last layer's q, o and MLP run on that token,
    its keys and values (written to the cache) on all of them. Logits and caches equal the pass-off program's and
    the model's."""
    from transformers import Qwen2ForCausalLM

    from npu_export.qwen2 import export_qwen2, make_additive_mask, tiny_qwen2_config
    from npu_runtime.dtypes import np_dtype

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_qwen2_config()).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    model.save_pretrained(tmp_path / "hf")
    length, cache = 8, 16
    exp = export_qwen2(tmp_path / "hf", tmp_path / "npu", max_cache_len=cache, prefill_len=length, dtype="float32",
                       attn_implementation="sdpa", prefill_last_logits_only=True)
    g, cm = exp.cache_map["graphs"]["prefill"], exp.cache_map
    tokens = np.random.default_rng(1).integers(0, 256, size=length)
    pos = np.arange(length, dtype=np.int64)
    ins = {g["inputs"]["input_ids"]: tokens.reshape(1, -1), g["inputs"]["position_ids"]: pos.reshape(1, -1),
           g["inputs"]["cache_position"]: pos,
           g["inputs"]["attention_mask"]: make_additive_mask(length, length, cache, torch.float32).numpy()}
    for lay in g["layers"]:
        for kind in "kv":
            ins[lay[f"{kind}_input"]] = np.zeros(cm["cache"]["shape"], np_dtype(cm["cache"]["dtype"]))
    outs = {}
    for off in ([], ["slice_hoisting"]):
        prog = npu_compiler.compile(exp.prefill_path, "cpu", dtype="float32", rope_theta=cm["rope"]["theta"],
                                    disable_passes=off)
        ws = npu_runtime.load_weights(prog, tmp_path / "hf", CPU)
        outs[bool(off)] = CPU.create_executor(prog).run_numpy({k: v.copy() for k, v in ins.items()}, ws)
        one_row = sum(r == 1 for r in _gemm_rows(prog))
        # the logits alone without the pass; with it also the last layer's q, o, gate and up (one GEMM where
        # concat_linears joins them) and down projections
        if off:
            assert one_row == 1 and _hoisted(prog) == 0
        else:
            assert one_row >= 5 and _hoisted(prog) > 0, one_row
    with torch.no_grad():
        ref = model(torch.from_numpy(tokens).reshape(1, -1)).logits[0, -1].numpy()
    logits = g["outputs"]["logits"]
    assert_close(outs[False][logits].reshape(-1), ref, "float32", "accumulate", what="last-token logits vs HF")
    for name in outs[True]:
        assert_close(outs[False][name], outs[True][name], "float32", "accumulate", what=f"{name} with vs without")


class _Rules(torch.nn.Module):
    """The other rules: embedding rows, transpose, permute, unsqueeze + expand, a reshape that keeps the dim, cat and
    softmax over another dim, reductions with keepdim, matmul broadcasting a weight, squeeze; two readers (a slice
    and a select) whose hull is rows 2:4."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(32, D)
        self.w = torch.nn.Parameter(torch.randn(3 * D, D) * 0.1)

    def forward(self, ids, x):
        y = (self.emb(ids) + x).transpose(0, 1).permute(1, 0, 2)
        z = y.unsqueeze(2).expand(B, T, 2, D).reshape(B, T, 2 * D)
        s = torch.softmax(torch.cat([z, x], dim=-1), dim=-1)
        m = s.amax(dim=-1, keepdim=True) + s.sum(-1, keepdim=True)
        out = torch.matmul(s.unsqueeze(2), self.w).squeeze(2) * m
        return out[:, 2:4], out[:, 3]


def test_the_other_rules_against_torch():
    torch.manual_seed(6)
    module = _Rules().eval()
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 32, size=(B, T)).astype(np.int64)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    ir = _export(module, ids, x)
    with torch.no_grad():
        want = module(torch.from_numpy(ids), torch.from_numpy(x))
    prog = npu_compiler.compile(ir, "cpu", dtype="float32")
    ws = npu_runtime.load_weights(prog, state_dict_numpy(module), CPU)
    got = CPU.create_executor(prog).run_numpy(dict(zip([s.name for s in prog.inputs], (ids, x))), ws)
    for g, w in zip(got.values(), want):
        assert_close(g, w.numpy(), "float32", "accumulate", what="rules vs torch")
    # every op from the embedding on runs on the two rows kept: no kernel writes all T rows
    assert _hoisted(prog) >= 10
    assert not [k.name for k in prog.kernels if any(T in tuple(o.shape)[:2] for o in k.outs)], \
        [(k.name, k.group, [tuple(o.shape) for o in k.outs]) for k in prog.kernels]
