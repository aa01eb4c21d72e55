"""One-kernel programs of the integer kinds (`qgemm`, `qconv2d`, `qadd`) and `wgemm`, with the requantization edges
(shift 0 and 31 and beyond, saturation, negative zero points, double rounding, K not a multiple of a tile, odd
shapes), shared by the webgpu tests (run here on lavapipe) and the cuda tests (tests/gpu/). Every operand is a graph
input, so a case sets any integer it likes; the expected result is the CPU reference's (the spec: kernels/*.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npu_compiler.buffers import BufferSpec, TensorSpec
from npu_compiler.kernels import KernelCall, QAddKernel, QConv2dKernel, QGemmKernel, Requant, WGemmKernel
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


def program_of(case: Case, target: str) -> CompiledProgram:
    buffers, inputs, args = [], [], []
    for i, (name, arr, dt) in enumerate(case.inputs):
        buffers.append(BufferSpec(i, name, "input", dt, arr.size))
        inputs.append(TensorSpec(name, arr.shape, dt, dt, i))
        args.append(TensorRef(i, arr.shape, contiguous_strides(arr.shape)))
    ob = len(buffers)
    numel = int(np.prod(case.out_shape))
    buffers.append(BufferSpec(ob, "out", "output", case.out_dtype, numel))
    out = TensorRef(ob, case.out_shape, contiguous_strides(case.out_shape))
    call = KernelCall("k0_" + case.spec.kind, case.spec, case.refs or args, [out], nodes=[case.name])
    case.spec.check(call, buffers)
    return CompiledProgram(case.name, target, "float32", {}, inputs,
                           [TensorSpec("out", case.out_shape, case.out_dtype, case.out_dtype, ob)], [], buffers,
                           [call], 0)


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
    return qgemm_cases() + qconv_cases() + qadd_cases()


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
