"""One-kernel programs of the integer kinds (`qgemm`, `qconv2d`, `qadd`) and `wgemm`, with the requantization edges
(shift 0 and 31 and beyond, saturation, negative zero points, double rounding, K not a multiple of a tile, odd
shapes), shared by the webgpu tests (run here on lavapipe) and the cuda tests (tests/gpu/). Every operand is a graph
input, so a case sets any integer it likes; the expected result is the CPU reference's (the spec: kernels/*.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npu_compiler.buffers import BufferSpec, TensorSpec
from npu_compiler.kernels import (
    KernelCall,
    QAddKernel,
    QConv2dKernel,
    QGemmKernel,
    Requant,
    ResidualAdd,
    WGemmKernel,
)
from npu_compiler.kernels.conv2d import conv_out_size
from npu_compiler.kernels.qconv2d import int_conv_sum
from npu_compiler.program import CompiledProgram
from npu_compiler.quant.fixed_point import quantize_multipliers
from npu_compiler.tensor import TensorRef, contiguous_strides

NP = {"int8": np.int8, "uint8": np.uint8, "int32": np.int32, "float32": np.float32}


@dataclass
class Case:
    name: str
    spec: object
    inputs: list[tuple[str, np.ndarray, str]]  # name, values, dtype
    out_shape: tuple[int, ...]
    out_dtype: str
    refs: list[TensorRef] | None = None  # argument views (default: each input whole)
    # the output's strides over its buffer (default: contiguous); the result compared is the buffer, as laid out
    out_strides: tuple[int, ...] | None = None


def program_of(case: Case, target: str) -> CompiledProgram:
    buffers, inputs, args = [], [], []
    for i, (name, arr, dt) in enumerate(case.inputs):
        buffers.append(BufferSpec(i, name, "input", dt, arr.size))
        inputs.append(TensorSpec(name, arr.shape, dt, dt, i))
        args.append(TensorRef(i, arr.shape, contiguous_strides(arr.shape)))
    ob = len(buffers)
    numel = int(np.prod(case.out_shape))
    buffers.append(BufferSpec(ob, "out", "output", case.out_dtype, numel))
    out = TensorRef(ob, case.out_shape, case.out_strides or contiguous_strides(case.out_shape))
    call = KernelCall("k0_" + case.spec.kind, case.spec, case.refs or args, [out], nodes=[case.name])
    case.spec.check(call, buffers)
    return CompiledProgram(case.name, target, "float32", {}, inputs,
                           [TensorSpec("out", case.out_shape, case.out_dtype, case.out_dtype, ob)], [], buffers,
                           [call], 0)


def with_split(program: CompiledProgram, dev, splits: int) -> CompiledProgram:
    """The one-kernel `program` with the cuda target's plan for `dev`, its K split `splits` ways, and the int32
    scratch the split needs (a buffer of its own)."""
    import dataclasses

    from npu_compiler.lowering.memory_plan import plan_memory
    from npu_compiler.targets.cuda import int8_conv

    k = program.kernels[0]
    k.plan = dataclasses.replace(int8_conv.plan(k, dev), splits=splits)
    (need,) = k.plan.scratch(k, program.buffers)
    b = BufferSpec(len(program.buffers), need.name, "arena", need.dtype, need.numel)
    program.buffers.append(b)
    k.scratch = [TensorRef(b.id, (need.numel,), (1,))]
    k.plan.check(k, program.buffers)
    program.arena_bytes = plan_memory(program.buffers, program.kernels)
    return program


def feeds(case: Case) -> dict[str, np.ndarray]:
    return {name: arr.astype(NP.get(dt, np.float32)) for name, arr, dt in case.inputs}


def _rows(rng, channels: int, acc: np.ndarray, axis: int) -> np.ndarray:
    """(M, n) rows that map the sums' spread to about +-100 (few saturate, so rounding shows), jittered per
    channel."""
    spread = float(np.std(acc)) or 1.0
    return quantize_multipliers(rng.uniform(0.5, 1.5, channels) * 40.0 / spread)


def qgemm_cases() -> list[Case]:
    rng = np.random.default_rng(0)
    out = []
    for name, (m, n, k), adt, za, zb, req, chans, bias, rows in [
        ("plain", (5, 7, 37), "int8", 3, 0, Requant(-7, -128, 127), 7, True, None),
        ("uint8 acts, k%4", (4, 9, 64), "uint8", 131, 0, Requant(5, -128, 127), 9, True, None),
        ("relu, per tensor", (3, 6, 33), "int8", -20, 0, Requant(-3, -3, 127), 1, False, None),
        ("double rounding", (2, 8, 48), "int8", 0, 0, Requant(0, -128, 127, "double"), 8, True, None),
        ("shift 0 saturates", (3, 5, 16), "int8", -128, 0, Requant(0, -128, 127), 5, True, "shift0"),
        ("shift 31", (3, 5, 40), "int8", 0, 0, Requant(-128, -128, 127), 5, False, "shift31"),
        ("odd tiles", (33, 17, 129), "int8", 2, 0, Requant(1, -100, 90), 17, True, None),
        ("b zero point", (2, 3, 12), "int8", 1, -3, Requant(0, -128, 127), 3, False, None),
        ("16-byte rows, tiles", (70, 130, 96), "int8", 3, 0, Requant(2, 2, 127), 1, True, None),
        ("16-byte rows, uint8, 16-byte stores", (40, 96, 64), "uint8", 131, 0, Requant(4, -128, 127), 96, True,
         None),
    ]:
        lo, hi = (0, 256) if adt == "uint8" else (-128, 128)
        a = rng.integers(lo, hi, (m, k))
        w = rng.integers(-127, 128, (n, k))
        b = rng.integers(-(1 << 14), 1 << 14, n)
        acc = (a - za) @ (w - zb).T + (b if bias else 0)
        r = _rows(rng, chans, acc, 1)
        if rows == "shift0":
            r[:, 0], r[:, 1] = rng.integers(1, 4, chans), 0
        elif rows == "shift31":
            r[:, 0] = np.minimum(r[:, 0].astype(np.int64) >> (r[:, 1].astype(np.int64) - 31), (1 << 31) - 1)
            r[:, 1] = 31
        ins = [("a", a, adt), ("w", w, "int8")]
        if bias:
            ins.append(("bias", b, "int32"))
        ins.append(("scale", r, "int32"))
        spec = QGemmKernel(m, n, k, (), za, zb, bias, chans, req)
        wt = TensorRef(1, (k, n), (1, k))  # the linear's weight as a transposed view, as the lowering makes it
        refs = [TensorRef(0, (m, k), (k, 1)), wt] + [TensorRef(i, arr.shape, contiguous_strides(arr.shape))
                                                    for i, (_, arr, _) in enumerate(ins) if i >= 2]
        out.append(Case(f"qgemm {name}", spec, ins, (m, n), "int8", refs))
    # a dequantizing qgemm: float32 out = sum * scale[c] + bias[c]
    m, n, k = 3, 5, 21
    ins = [("a", rng.integers(-128, 128, (m, k)), "int8"), ("w", rng.integers(-127, 128, (n, k)), "int8"),
           ("bias", rng.standard_normal(n).astype(np.float32), "float32"),
           ("scale", (rng.uniform(1e-4, 1e-3, n)).astype(np.float32), "float32")]
    refs = [TensorRef(0, (m, k), (k, 1)), TensorRef(1, (k, n), (1, k)), TensorRef(2, (n,), (1,)),
            TensorRef(3, (n,), (1,))]
    out.append(Case("qgemm dequantize", QGemmKernel(m, n, k, (), 4, 0, True, n, Requant(), True), ins, (m, n),
                    "float32", refs))
    return out


def qconv_cases() -> list[Case]:
    rng = np.random.default_rng(1)
    out = []
    for name, (n, c, h, w), (o, kh), (stride, pad, dil, groups), zx, req in [
        ("3x3 pad", (1, 3, 7, 6), (8, 3), (1, 1, 1, 1), 5, Requant(-5, -128, 127)),
        ("stride 2 relu", (2, 8, 9, 9), (16, 3), (2, 1, 1, 1), -9, Requant(-2, -2, 127)),
        ("1x1", (1, 19, 5, 4), (7, 1), (1, 0, 1, 1), 0, Requant(3, -128, 127)),
        ("groups dilation", (1, 4, 8, 8), (6, 3), (1, 2, 2, 2), 12, Requant(0, -128, 127, "double")),
        ("16-byte weight rows", (2, 16, 6, 5), (24, 3), (1, 1, 1, 1), -7, Requant(2, -128, 127)),
    ]:
        x = rng.integers(-128, 128, (n, c, h, w))
        wt = rng.integers(-127, 128, (o, c // groups, kh, kh))
        ho = conv_out_size(h, kh, stride, pad, dil)
        wo = conv_out_size(w, kh, stride, pad, dil)
        acc = int_conv_sum(x, wt, zx, (stride,) * 2, (pad,) * 2, (dil,) * 2, groups, (ho, wo))
        ins = [("x", x, "int8"), ("w", wt, "int8"), ("bias", rng.integers(-5000, 5000, o), "int32"),
               ("scale", _rows(rng, o, acc, 1), "int32")]
        spec = QConv2dKernel((stride, stride), (pad, pad), (dil, dil), groups, zx, True, o, req)
        out.append(Case(f"qconv2d {name}", spec, ins, (n, o, ho, wo), "int8"))
    return out


def qconv_channels_last_cases() -> list[Case]:
    """Convs whose input is channels-last and whose weight is [O, kh, kw, C] in memory (the lowering's layouts on a
    target with int8 matrix units): the 16-byte copy path of the cuda target (int8_conv.py). Padding filled with a
    nonzero zero point, uint8 flips, K and N tails, several tiles, shifts 0 and 31 on some channels."""
    rng = np.random.default_rng(4)
    out = []
    for name, (n, c, h, w), (o, kh), (stride, pad, dil), zx, dt, req, edges in [
        ("3x3 pad", (2, 32, 9, 7), (40, 3), (1, 1, 1), 0, "int8", Requant(-3, -128, 127), False),
        ("stride 2 zero point relu", (1, 16, 11, 10), (24, 3), (2, 1, 1), -7, "int8", Requant(-2, -2, 127), True),
        ("uint8 1x1", (2, 48, 5, 6), (70, 1), (1, 0, 1), 131, "uint8", Requant(4, -128, 127), False),
        ("uint8 dilation", (1, 16, 9, 9), (8, 3), (1, 2, 2), 128, "uint8", Requant(0, -128, 127, "double"), True),
        ("many tiles", (2, 64, 12, 12), (64, 1), (1, 0, 1), 0, "int8", Requant(5, -100, 120), True),
    ]:
        lo, hi = (0, 256) if dt == "uint8" else (-128, 128)
        x = rng.integers(lo, hi, (n, c, h, w))
        wt = rng.integers(-127, 128, (o, c, kh, kh))
        ho, wo = conv_out_size(h, kh, stride, pad, dil), conv_out_size(w, kh, stride, pad, dil)
        acc = int_conv_sum(x, wt, zx, (stride,) * 2, (pad,) * 2, (dil,) * 2, 1, (ho, wo))
        rows = _rows(rng, o, acc, 1)
        if edges:  # a channel at shift 0 (saturating) and one at shift 31
            rows[0] = (int(rng.integers(1, 4)), 0)
            rows[1, 0] = min(int(rows[1, 0]) >> max(int(rows[1, 1]) - 31, 0), (1 << 31) - 1)
            rows[1, 1] = 31
        ins = [("x", x.transpose(0, 2, 3, 1), dt), ("w", wt.transpose(0, 2, 3, 1), "int8"),
               ("bias", rng.integers(-5000, 5000, o), "int32"), ("scale", rows, "int32")]
        refs = [TensorRef(0, (n, c, h, w), (h * w * c, 1, w * c, c)),
                TensorRef(1, (o, c, kh, kh), (kh * kh * c, 1, kh * c, c)), TensorRef(2, (o,), (1,)),
                TensorRef(3, (o, 2), (2, 1))]
        spec = QConv2dKernel((stride, stride), (pad, pad), (dil, dil), 1, zx, True, o, req)
        # channels-last results where the output channels are whole 16-byte runs (the staged 16-byte stores)
        out_strides = (ho * wo * o, 1, wo * o, o) if o % 16 == 0 else None
        out.append(Case(f"qconv2d channels-last {name}", spec, ins, (n, o, ho, wo), "int8", refs, out_strides))
    return out


def qconv_residual_cases() -> list[Case]:
    """Convs with a fused residual add (QConv2dKernel.residual: the conv's requantized result plus a skip tensor, as
    qadd adds them), channels-last (the 16-byte copy path) and NCHW (the gathering kernel), int8 and uint8, the skip
    in either layout, a ReLU on the sum."""
    rng = np.random.default_rng(5)
    out = []
    for name, (n, c, h, w), (o, kh), pad, zx, dt, conv_req, skip_zp, add_req, layout in [
        ("channels-last 1x1 relu", (2, 32, 5, 6), (48, 1), 0, 0, "int8", Requant(3, -128, 127), -5,
         Requant(-20, -20, 127), "nhwc"),
        ("channels-last uint8 3x3, NCHW skip", (1, 16, 6, 6), (24, 3), 1, 128, "uint8", Requant(128, 0, 255), 131,
         Requant(120, 120, 255, "double"), "nhwc, nchw skip"),
        ("NCHW 3x3", (1, 5, 6, 7), (8, 3), 1, -3, "int8", Requant(-2, -128, 127), 7, Requant(0, -128, 127), "nchw"),
    ]:
        lo, hi = (0, 256) if dt == "uint8" else (-128, 128)
        x = rng.integers(lo, hi, (n, c, h, w))
        wt = rng.integers(-127, 128, (o, c, kh, kh))
        ho, wo = conv_out_size(h, kh, 1, pad, 1), conv_out_size(w, kh, 1, pad, 1)
        acc = int_conv_sum(x, wt, zx, (1, 1), (pad, pad), (1, 1), 1, (ho, wo))
        skip = rng.integers(lo, hi, (n, o, ho, wo))
        ma, mb, mo = (int(v) for v in rng.integers(1 << 30, 1 << 31, 3))
        ls = 20
        residual = ResidualAdd(dt, skip_zp, ls, ma, int(rng.integers(30, 33)), mb, int(rng.integers(30, 33)), mo,
                               int(rng.integers(30, 32)) + ls - 1, add_req)
        nhwc = layout.startswith("nhwc")
        last = lambda a: a.transpose(0, 2, 3, 1)  # noqa: E731
        ins = [("x", last(x) if nhwc else x, dt), ("w", last(wt) if nhwc else wt, "int8"),
               ("bias", rng.integers(-5000, 5000, o), "int32"), ("scale", _rows(rng, o, acc, 1), "int32"),
               ("skip", last(skip) if layout == "nhwc" else skip, dt)]
        cl = lambda s: (s[1] * s[2] * s[3], 1, s[3] * s[1], s[1])  # noqa: E731
        refs = [TensorRef(0, (n, c, h, w), cl((n, c, h, w)) if nhwc else contiguous_strides((n, c, h, w))),
                TensorRef(1, (o, c, kh, kh), cl((o, c, kh, kh)) if nhwc else contiguous_strides((o, c, kh, kh))),
                TensorRef(2, (o,), (1,)), TensorRef(3, (o, 2), (2, 1)),
                TensorRef(4, (n, o, ho, wo), cl((n, o, ho, wo)) if layout == "nhwc" else
                          contiguous_strides((n, o, ho, wo)))]
        spec = QConv2dKernel((1, 1), (pad, pad), (1, 1), 1, zx, True, o, conv_req, residual=residual)
        out_strides = cl((n, o, ho, wo)) if nhwc else None
        out.append(Case(f"qconv2d residual {name}", spec, ins, (n, o, ho, wo), dt, refs, out_strides))
    return out


def qadd_cases() -> list[Case]:
    rng = np.random.default_rng(2)
    out = []
    for name, shape, b_shape, za, zb, ls, req, dt in [
        ("residual", (2, 3, 5, 5), (2, 3, 5, 5), 3, -9, 20, Requant(-4, -128, 127), "int8"),
        ("relu broadcast", (3, 7), (1, 7), -128, 127, 20, Requant(-128, -60, 127), "int8"),
        ("uint8 wide shift", (4, 9), (4, 9), 200, 3, 24, Requant(10, 0, 255, "double"), "uint8"),
    ]:
        lo, hi = (0, 256) if dt == "uint8" else (-128, 128)
        a, b = rng.integers(lo, hi, shape), rng.integers(lo, hi, b_shape)
        ma, mb, mo = (int(v) for v in rng.integers(1 << 30, 1 << 31, 3))
        # inputs rescaled to about (a - za) << ls, the sum back to about +-100
        spec = QAddKernel(za, zb, ls, ma, int(rng.integers(30, 33)), mb, int(rng.integers(30, 33)), mo,
                          int(rng.integers(30, 32)) + ls - 1, req)
        refs = [TensorRef(0, shape, contiguous_strides(shape)),
                TensorRef(1, shape, tuple(0 if d == 1 else s for d, s in zip(b_shape, contiguous_strides(b_shape),
                                                                              strict=True)))]
        out.append(Case(f"qadd {name}", spec, [("a", a, dt), ("b", b, dt)], shape, dt, refs))
    # shift 0 on every rescale: the 64-bit products wrap as the reference's int64 do
    a, b = rng.integers(-128, 128, (2, 6)), rng.integers(-128, 128, (2, 6))
    spec = QAddKernel(0, 0, 24, (1 << 31) - 1, 0, 1 << 30, 0, 3, 0, Requant(0, -128, 127))
    out.append(Case("qadd shift 0", spec, [("a", a, "int8"), ("b", b, "int8")], (2, 6), "int8"))
    return out


def wgemm_cases() -> list[Case]:
    from npu_runtime.quant_recipes import weight_only

    rng = np.random.default_rng(3)
    out = []
    for name, (m, n, k), bits, bias in [("int8", (1, 12, 96), 8, True), ("int4", (2, 5, 256), 4, False),
                                        ("int8 odd k", (3, 7, 45), 8, False), ("int8 split k", (1, 300, 2048), 8, True),
                                        ("int4 row tail", (5, 37, 512), 4, False),
                                        ("int4 many tiles", (1, 200, 256), 4, True)]:
        w = rng.standard_normal((n, k)).astype(np.float32)
        c = weight_only(w, bits, 128 if bits == 4 else 0)
        ins = [("x", rng.standard_normal((m, k)).astype(np.float32), "float32"),
               ("q", c["qweight"], "int8" if bits == 8 else "uint8"), ("s", c["scale"], "float32")]
        if bits == 4:
            ins.append(("z", c["zero"], "uint8"))
        if bias:
            ins.append(("bias", rng.standard_normal(n).astype(np.float32), "float32"))
        spec = WGemmKernel(m, n, k, (), bits, 128 if bits == 4 else 0, bias)
        out.append(Case(f"wgemm {name}", spec, ins, (m, n), "float32"))
    return out


def integer_cases() -> list[Case]:
    return qgemm_cases() + qconv_cases() + qconv_channels_last_cases() + qconv_residual_cases() + qadd_cases()


def run_case(backend, case: Case) -> np.ndarray:
    program = program_of(case, backend.compile_target())
    return backend.create_executor(program).run_numpy(feeds(case))["out"]


def reference(case: Case) -> np.ndarray:
    from npu_runtime.cpu.backend import CpuBackend

    return run_case(CpuBackend(), case)


def check_bit_exact(backend, case: Case) -> None:
    """The backend's result of `case` equals the CPU reference's, dtype and bits."""
    want = reference(case)
    got = run_case(backend, case)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def assert_weight_only(got: np.ndarray, case: Case) -> None:
    """A wgemm's result within float32 summation-order error of the reference: 1e-5 of the sum of its products'
    magnitudes, sum_k |a[m, k] W[n, k]| + |bias[n]| (docs/tolerances.md), as the order of the sum is the kernel's."""
    from npu_compiler.kernels.wgemm import dequantize_weight

    ins = {name: value for name, value, _ in case.inputs}
    w = dequantize_weight(case.spec, ins["q"], ins["s"], ins.get("z"))
    magnitude = np.abs(ins["x"]).astype(np.float64) @ np.abs(w).astype(np.float64).T
    if "bias" in ins:
        magnitude += np.abs(ins["bias"])
    want = reference(case)
    assert got.shape == want.shape and got.dtype == want.dtype
    err = np.abs(got.astype(np.float64) - want)
    assert (err <= 1e-5 * magnitude + 1e-6).all(), f"{case.name}: worst error {err.max():.3g}"


def check_weight_only(backend, case: Case) -> None:
    """A backend's wgemm against the reference (assert_weight_only)."""
    assert_weight_only(run_case(backend, case), case)
