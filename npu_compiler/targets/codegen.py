"""`CodegenTarget`: how kernels are written for the machine that executes them, and what the lowering may assume
of it (its capabilities). Targets are found through a registry of module names, imported only when asked for."""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from typing import ClassVar

from ..errors import NPUCompileError

# A chip table row every GPU target plans for when a compile names no device (the GPU tests run so on one GPU as
# another: NPUSIM_DEVICE=a100 plans for an A100 on an H200)
DEVICE_ENV = "NPUSIM_DEVICE"

# name -> the module that defines it (as `TARGET`). Adding a target adds a module and a line here.
TARGET_MODULES: dict[str, str] = {
    "cpu": "npu_compiler.targets.cpu",
    "cuda": "npu_compiler.targets.cuda.target",
    "hip": "npu_compiler.targets.hip.target",
    "webgpu": "npu_compiler.targets.webgpu.target",
}


class CodegenTarget:
    """A target's name, the library kernel kinds it runs, and the lowering choices it wants."""

    name: ClassVar[str] = ""
    # the chip table's row (devices.py) a compile plans for when no device is named and none is present
    # ("": the target renders for no GPU)
    default_device: ClassVar[str] = ""
    library_kernels: ClassVar[frozenset[str]] = frozenset()
    # k x k convolutions as an im2col copy + GEMM: right where the GEMM library is much faster than a direct conv
    gemm_im2col: ClassVar[bool] = False
    # attention with at least this many query rows per head runs as two GEMMs around a row softmax (its GEMM library
    # is far faster than an attention kernel of its own there); 0: never
    attention_gemm_min_rows: ClassVar[int] = 0
    # expression kernels are evaluated over their whole iteration space (with the reduction) at once, so that space
    # is memory and is bounded like a tensor (the NumPy interpreter); a GPU thread grid is not
    materializes_iteration_space: ClassVar[bool] = False
    # a GEMM of at most this many rows may compute its operand in a prologue (`gemm_prologue`); 0: never. Row results
    # (norms) with at most this many rows are kept pending for one.
    gemm_prologue_rows: ClassVar[int] = 0
    # a row kernel may also store an elementwise value it reads (`GeneratedKernel.side`: a residual sum its norm
    # reads, written by the norm instead of by a pass of its own)
    row_side_outputs: ClassVar[bool] = False
    # the lowering asks `plan` for every conv2d record it builds, not only those on matrix units (a target that splits
    # the K of its direct convs)
    plans_convs: ClassVar[bool] = False
    # an integer add (qadd) whose operand an integer conv computes, fused into that conv's epilogue
    # (QConv2dKernel.residual) where the other operand is already computed
    qconv_residual: ClassVar[bool] = False

    def __init__(self, device=None) -> None:
        # the device profile (devices.py) kernels are planned and rendered for; None: a target that renders
        # for no GPU (the cpu reference)
        if device is not None:
            raise NPUCompileError(f"the {self.name} target renders for no device: drop the device ({device!r})")
        self.profile = None

    def gemm_epilogue_apart(self, m: int, batch: tuple[int, ...], a_dtype: str, out_dtype: str) -> bool:
        """Whether a GEMM of m rows (these operand and result dtypes) runs its epilogue (residual add, activation) as
        a pass of its own after the product is stored, so the lowering may leave the epilogue to the kernels that
        read the result (`Lowering` keeps it pending). Default: no (the GEMM kernel computes its epilogue)."""
        return False

    def attention_on_tensor_cores(self, dtypes: tuple[str, str, str], probs_dtype: str, q_len: int, head_dim: int,
                                  v_dim: int, refs: tuple) -> bool:
        """Whether attention over q, k, v (these dtypes, these views) runs as one tiled kernel on matrix units (then
        it is one record however many query rows it has). Default: no."""
        return False

    def plan(self, call, buffers):
        """How this target computes the record of `call` (a KernelCall over `buffers`) on its device (`profile`): a
        plan of the record's kind (kernels/plans.py: key or K splits and the scratch they need), or None where the
        target plans nothing for it (the record's own schedule: no splits). The one place a target's schedule is
        decided; the lowering asks it for every record it builds for the target's matrix units and attention, and
        a backend asks it again for a program planned for a device it cannot run that plan on. Default: None."""
        return None

    def convs_on_tensor_cores(self, convs: list[tuple]) -> list[bool]:
        """Which of a program's conv2d nodes run as one implicit-GEMM kernel on matrix units, each given as (dtypes of
        input, weight and output, groups, input shape, weight shape, output shape). The kernel reads its input,
        weight and residual through their strides; where any conv runs so, the lowering keeps image activations
        channels-last and those convs' weights as [O, kh, kw, C] (a layout: what the program's buffers hold), and
        asks `plan` how each is split. Default: none."""
        return [False] * len(convs)

    def gemm_prologue(self, m: int, k: int, batch: tuple[int, ...], a_dtype: str, b, b_dtype: str,
                      reduces: bool) -> bool:
        """Whether a GEMM of [batch..., m, k] x `b` (a TensorRef [batch..., k, n] of `b_dtype`) may compute its operand
        a (of `a_dtype`) in a prologue instead of reading it: an elementwise producer, or a row producer (a norm;
        `reduces`), folded into the kernel (`GemmKernel.prologue`). Default: no."""
        return False

    def wgemm_prologue(self, m: int, k: int, bits: int, group: int, a_dtype: str, reduces: bool) -> bool:
        """Whether a weight-only GEMM (`wgemm`) of m rows, K = `k`, `bits`-bit codes (int4: `group` codes a scale),
        may compute its operand (of `a_dtype`) in a prologue, as `gemm_prologue` asks for a float GEMM. Default: no."""
        return False

    def wgemm_column_groups(self, call, buffers) -> bool:
        """Whether the target runs this `wgemm` call with an epilogue over column groups, as `gemm_column_groups`
        asks for a float GEMM. Default: no."""
        return False

    def gemm_column_groups(self, call, buffers) -> bool:
        """Whether the target runs this GEMM call (a KernelCall over `buffers`) whose epilogue combines groups of the
        product's columns (`GemmKernel.acc_groups`, lowering/column_epilogues.py). Default: no."""
        return False

    def conv_splits(self, pixels: int, out_channels: int, k: int, groups: int) -> int:
        """Across how many blocks a direct conv of `pixels` output pixels, `out_channels` output channels of a
        group and a K of `k` splits its K, where the target plans its direct convs (`plans_convs`): the lowering
        keeps a 1x1 conv the target splits a conv instead of a GEMM. Default: 1 (no split)."""
        return 1

    def conv_side(self, call, buffers) -> bool:
        """Whether the target runs this conv2d call (a KernelCall over `buffers`) with a side conv
        (`Conv2dKernel.side_stride`, lowering/side_convs.py). Default: no."""
        return False

    def check_program(self, program) -> None:
        """Refuse, at compile time, what the target cannot run (dtypes, sizes). Default: everything runs."""

    def kernel_sources(self, call, program) -> list[str]:
        """The source text the target renders for one kernel (none where a backend interprets the record)."""
        return []

    def check_target(self, program) -> None:
        """Refuse to render a program compiled for another target."""
        if program.target != self.name:
            raise NPUCompileError(f"program was compiled for target '{program.target}', not '{self.name}'")

    @contextlib.contextmanager
    def rendering(self, call) -> Iterator[None]:
        """Around rendering one kernel: a renderer's slip on a record the reader accepted (a bug, or a record no
        check foresaw) becomes an NPUCompileError naming the kernel, not a traceback."""
        try:
            yield
        except NPUCompileError:
            raise
        except (KeyError, ValueError, IndexError, TypeError, ZeroDivisionError) as e:
            raise NPUCompileError(f"kernel {call.name} ({call.kind}, nodes {call.nodes[:4]}): cannot render for "
                                  f"{self.name}: {type(e).__name__}: {e}") from e


def target_class(name: str) -> type[CodegenTarget]:
    """The class of target `name`, for what it declares whatever the device (its `library_kernels`, its name)."""
    module = TARGET_MODULES.get(name) if isinstance(name, str) else None
    if module is None:
        raise NPUCompileError(f"unknown target {name!r} (known: {', '.join(sorted(TARGET_MODULES))})")
    try:
        return importlib.import_module(module).TARGET
    except ImportError as e:
        raise NPUCompileError(f"target '{name}' is not installed: {e}") from e


def get_codegen_target(name: str, device=None) -> CodegenTarget:
    """The target `name`, planning and rendering for `device` (a DeviceProfile, or a chip table row's name; None:
    $NPUSIM_DEVICE for a target that renders for a GPU, else the target's default chip)."""
    cls = target_class(name)
    if device is None and cls.default_device and os.environ.get(DEVICE_ENV):
        chosen = os.environ[DEVICE_ENV]
        try:
            return cls(chosen)
        except NPUCompileError as e:
            # the variable applies to every target a process compiles for, and may name a chip of another vendor
            raise NPUCompileError(f"${DEVICE_ENV}={chosen!r} chooses a device that target '{name}' cannot plan "
                                  f"for: {e} (unset {DEVICE_ENV}, or pass the target's device: compile(..., "
                                  f"device=...), npusim compile --device; its default is '{cls.default_device}')"
                                  ) from None
    return cls(device) if device is not None else cls()


def available_targets() -> list[str]:
    out = []
    for name in sorted(TARGET_MODULES):
        try:
            target_class(name)
        except NPUCompileError:
            continue
        out.append(name)
    return out
