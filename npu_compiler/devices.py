"""Device profiles: the facts about a GPU that a schedule depends on, as data.

A `DeviceProfile` is one row of the chip table `CHIPS` (figures from the vendors' documentation, cited beside each
row), or a profile the runtime fills from the device present (`npu_runtime.cuda.backend.device_profile`, the wgpu
adapter's limits). The compiler plans for a profile chosen by name (`npusim compile --device NAME`; default: the
device present, else the target's `default_device`), the artifact records it (`CompiledProgram.device`) and the
reader checks it like every other field. Generators read sizes from the profile they are given, never from
literals: an A100, an L4, an H200 and an AMD part differ by a row of this table.

Sources (the row comments name which one each figure comes from):
- [CC] NVIDIA CUDA C++ Programming Guide, "Compute Capabilities", table "Technical Specifications per Compute
  Capability": warp size, threads, blocks and warps per SM, registers, shared memory per SM and per block (with and
  without opt-in), the 48 KiB static limit; and "Features Supported per Compute Capability" (cp.async from 8.0,
  thread block clusters, TMA and warpgroup MMA (`wgmma`, sm_90a only) from 9.0).
- [PTX] NVIDIA PTX ISA: `mma.sync` shapes (m16n8k16 for f16/bf16, sm_80+), `wgmma.mma_async` (m64nNk16, N = 8..256 in
  steps of 8, sm_90a), `tcgen05.mma` (sm_100a; M = 64 or 128, N up to 256, K = 16 for 16-bit operands).
- [H100-WP] NVIDIA H100 Tensor Core GPU Architecture whitepaper (SXM5: 132 SMs, 50 MB L2) and the H100 datasheet
  (SXM: 80 GB HBM3, 3.35 TB/s, 989 dense FP16 tensor TFLOPS). [H200-DS] NVIDIA H200 datasheet (SXM: 141 GB HBM3e,
  4.8 TB/s, 989 TFLOPS: the H100's GH100 SM array).
- [A100-WP] NVIDIA A100 Tensor Core GPU Architecture whitepaper (108 SMs, 40 MB L2, 1410 MHz boost) and the A100
  datasheet (80 GB SXM: 2,039 GB/s, 312 FP16 tensor TFLOPS).
- [ADA-WP] NVIDIA Ada GPU Architecture whitepaper (RTX 4090: 128 SMs, 72 MB L2, 2520 MHz boost, 24 GB GDDR6X at
  1,008 GB/s) and the L4 datasheet (24 GB GDDR6, 300 GB/s, 121 dense FP16 tensor TFLOPS; AD104 with 58 SMs, 48 MB L2,
  2040 MHz boost).
- [B200-DS] NVIDIA DGX B200 datasheet (8 GPUs: 1,440 GB HBM3e, 64 TB/s: 180 GB and 8 TB/s a GPU) and the Blackwell
  architecture technical brief; 148 SMs (two dies of 74) is what the CUDA device attribute reports on a B200.
- [ROCM] AMD ROCm documentation, "GPU hardware specifications" (compute units, wavefront size 64, LDS 64 KiB, L2,
  VGPR file 512 KiB a CU) and the CDNA2 / CDNA3 instruction set references (MFMA shapes: v_mfma_f32_32x32x8 and
  16x16x16 for f16 and bf16; at most 1,024 work-items a workgroup; eight wave slots a SIMD, four SIMDs a CU).
  [MI300X-DS] AMD Instinct MI300X data sheet (192 GB HBM3, 5.3 TB/s, 2,100 MHz peak engine clock).
  [MI250X-DS] AMD Instinct MI250X data sheet (128 GB HBM2e at 3.2 TB/s over its two GCDs, 1,700 MHz peak clock).
- The clock of an NVIDIA row is the boost clock at which the vendor's peak tensor figure is stated (H100 SXM:
  989.4 TFLOPS = 132 SMs x 4,096 FLOPs a clock x 1.83 GHz), so that peak figures derived from a profile agree with
  the datasheet.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from .errors import ArtifactError, NPUCompileError
from .kernels.fields import bounded, from_data, one_of, to_data

KIB = 1024
MIB = 1024 * 1024
GB = 10**9

VENDORS = ("nvidia", "amd", "generic")
MMA_INSTRUCTIONS = ("mma.sync", "wgmma", "tcgen05.mma", "mfma")


@dataclass(frozen=True)
class MmaShape:
    """One matrix instruction a device runs: `instruction` computes an m x n x k product of `operands` into float32
    accumulators. `n_step` > 0: n may be any multiple of it up to `n` (the warpgroup MMA's N = 8..256)."""

    instruction: str = one_of(*MMA_INSTRUCTIONS)
    m: int = bounded(1, 512)
    n: int = bounded(1, 512)
    k: int = bounded(1, 512)
    operands: str = one_of("float16/bfloat16", "float16", "bfloat16", "int8", "float8")
    n_step: int = bounded(0, 512, default=0)


@dataclass(frozen=True)
class DeviceProfile:
    """What a schedule may assume of a device. Sizes in bytes, counts per multiprocessor (an NVIDIA SM, an AMD CU)
    unless named otherwise. Read with `profile.x`; never extended by a target: a new fact is a new field here,
    filled in every row of `CHIPS`."""

    name: str  # the table's key ("h100"), or the name the runtime gives a device it fills ("nvidia-h200-present")
    title: str  # the product, for people ("NVIDIA H100 SXM5 80GB")
    vendor: str = one_of(*VENDORS)
    # the architecture the code is generated for: "sm_90" (NVIDIA: compute capability major * 10 + minor in
    # `compute_capability`), "gfx90a" / "gfx942" (AMD: the LLVM target name), "webgpu"
    arch: str = ""
    compute_capability: int = bounded(0, 1000, default=0)  # NVIDIA: 90 for 9.0; 0 elsewhere
    multiprocessors: int = bounded(1, 4096, default=1)  # SMs / CUs: a grid of this many blocks is one wave
    warp_width: int = bounded(1, 128, default=32)  # threads of a warp / wavefront / subgroup
    max_threads_per_block: int = bounded(1, 4096, default=1024)
    max_threads_per_multiprocessor: int = bounded(1, 1 << 16, default=2048)
    max_blocks_per_multiprocessor: int = bounded(1, 1024, default=32)
    # shared memory (AMD: LDS; WebGPU: workgroup storage): a block may use `shared_memory_per_block` without asking,
    # up to `shared_memory_per_block_optin` when its launch opts in; an SM holds `shared_memory_per_multiprocessor`
    shared_memory_per_block: int = bounded(0, 1 << 30, default=48 * KIB)
    shared_memory_per_block_optin: int = bounded(0, 1 << 30, default=48 * KIB)
    shared_memory_per_multiprocessor: int = bounded(0, 1 << 30, default=48 * KIB)
    registers_per_multiprocessor: int = bounded(0, 1 << 30, default=65536)  # 32-bit registers
    registers_per_block: int = bounded(0, 1 << 30, default=65536)
    max_registers_per_thread: int = bounded(0, 4096, default=255)
    mma: tuple[MmaShape, ...] = ()  # matrix instructions, fastest first
    async_copy: bool = False  # cp.async (global -> shared without registers), NVIDIA sm_80+
    tma: bool = False  # the tensor memory accelerator (bulk tensor copies described by tensor maps), sm_90+
    warpgroup_mma: bool = False  # wgmma.mma_async (four warps, operands in shared memory): sm_90a only
    cluster_blocks: int = bounded(0, 64, default=0)  # thread block cluster's portable size (0: no clusters)
    programmatic_launch: bool = False  # programmatic dependent launch (griddepcontrol), sm_90+
    vector_bytes: int = bounded(1, 64, default=16)  # the widest load or store one thread issues
    l2_bytes: int = bounded(0, 1 << 40, default=0)
    memory_bytes: int = bounded(0, 1 << 50, default=0)
    memory_gbps: float = 0.0  # peak DRAM bandwidth, GB/s (1e9 bytes/s)
    clock_mhz: int = bounded(0, 100_000, default=0)  # boost clock

    # ---- derived ------------------------------------------------------------------------------------------------
    @property
    def resident_threads(self) -> int:
        """Threads the whole device holds at once."""
        return self.multiprocessors * self.max_threads_per_multiprocessor

    def has_mma(self, instruction: str) -> bool:
        return any(s.instruction == instruction for s in self.mma)

    def mma_shape(self, instruction: str) -> MmaShape | None:
        return next((s for s in self.mma if s.instruction == instruction), None)

    # ---- data ---------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return to_data(self)

    @classmethod
    def from_dict(cls, d: Any, where: str = "device") -> DeviceProfile:
        """A profile from its data form (an artifact's `device`), every field checked: ArtifactError naming the
        field otherwise."""
        try:
            profile = from_data(cls, d, where)
            profile.check(where)
        except ValueError as e:
            raise ArtifactError(str(e)) from None
        return profile

    def check(self, where: str = "device") -> None:
        """The cross-field facts every profile satisfies (ValueError naming the field)."""
        for name in ("name", "title", "arch"):
            v = getattr(self, name)
            if not v or len(v) > 128 or not v.isprintable():
                raise ValueError(f"{where}.{name}: {v!r} is not a name of 1 to 128 printable characters")
        if not (math.isfinite(self.memory_gbps) and 0 <= self.memory_gbps <= 1e7):
            raise ValueError(f"{where}.memory_gbps: {self.memory_gbps} is not a bandwidth in GB/s")
        if self.max_threads_per_block % self.warp_width:
            raise ValueError(f"{where}.max_threads_per_block: {self.max_threads_per_block} is not a whole number "
                             f"of {self.warp_width}-wide warps")
        if self.max_threads_per_block > self.max_threads_per_multiprocessor:
            raise ValueError(f"{where}.max_threads_per_block: {self.max_threads_per_block} is more than a "
                             f"multiprocessor holds ({self.max_threads_per_multiprocessor})")
        if not (self.shared_memory_per_block <= self.shared_memory_per_block_optin
                <= self.shared_memory_per_multiprocessor):
            raise ValueError(f"{where}: shared memory per block ({self.shared_memory_per_block}) <= per block "
                             f"opted in ({self.shared_memory_per_block_optin}) <= per multiprocessor "
                             f"({self.shared_memory_per_multiprocessor}) does not hold")
        if self.registers_per_block > self.registers_per_multiprocessor:
            raise ValueError(f"{where}.registers_per_block: {self.registers_per_block} is more than a "
                             f"multiprocessor has ({self.registers_per_multiprocessor})")
        if self.vendor == "nvidia":
            if self.arch != f"sm_{self.compute_capability}" or self.warp_width != 32:
                raise ValueError(f"{where}: an NVIDIA profile's arch is sm_<compute_capability> and its warps 32 "
                                 f"wide (got arch {self.arch!r}, compute capability {self.compute_capability}, "
                                 f"warp width {self.warp_width})")
            if (self.warpgroup_mma or self.tma or self.cluster_blocks) and self.compute_capability < 90:
                raise ValueError(f"{where}: TMA, warpgroup MMA and clusters need compute capability 9.0 or later "
                                 f"(this profile's is {self.compute_capability})")
        elif self.compute_capability:
            raise ValueError(f"{where}.compute_capability: only an NVIDIA profile has one")
        if len(self.mma) > 16:
            raise ValueError(f"{where}.mma: {len(self.mma)} shapes (at most 16)")

    def replace(self, **changes: Any) -> DeviceProfile:
        return dataclasses.replace(self, **changes)


# ---- the chip table -------------------------------------------------------------------------------------------------

# NVIDIA's matrix instructions on 16-bit operands [PTX]
_MMA_SYNC = MmaShape("mma.sync", 16, 8, 16, "float16/bfloat16")
_WGMMA = MmaShape("wgmma", 64, 256, 16, "float16/bfloat16", n_step=8)
_TCGEN05 = MmaShape("tcgen05.mma", 128, 256, 16, "float16/bfloat16", n_step=16)
# AMD CDNA2 / CDNA3 MFMA on 16-bit operands [ROCM]
_MFMA = (MmaShape("mfma", 32, 32, 8, "float16/bfloat16"), MmaShape("mfma", 16, 16, 16, "float16/bfloat16"))


def nvidia_features(cc: int) -> dict[str, Any]:
    """What an NVIDIA compute capability runs [CC] [PTX]: cp.async and mma.sync from 8.0; TMA, clusters (8 blocks,
    portable) and programmatic dependent launch from 9.0; the warpgroup MMA on 9.0 only (sm_90a); tcgen05.mma on the
    data-centre Blackwells (10.x)."""
    mma: tuple[MmaShape, ...] = (_MMA_SYNC,) if cc >= 80 else ()
    if cc == 90:
        mma = (_WGMMA, *mma)
    if 100 <= cc < 110:
        mma = (_TCGEN05, *mma)
    return dict(mma=mma, async_copy=cc >= 80, tma=cc >= 90, warpgroup_mma=cc == 90,
                cluster_blocks=8 if cc >= 90 else 0, programmatic_launch=cc >= 90)


# [CC] per compute capability: threads, blocks and shared memory of an SM, shared memory a block may opt in to
_NVIDIA_LIMITS: dict[int, dict[str, int]] = {
    80: dict(max_threads_per_multiprocessor=2048, max_blocks_per_multiprocessor=32,
             shared_memory_per_multiprocessor=164 * KIB, shared_memory_per_block_optin=163 * KIB),
    89: dict(max_threads_per_multiprocessor=1536, max_blocks_per_multiprocessor=24,
             shared_memory_per_multiprocessor=100 * KIB, shared_memory_per_block_optin=99 * KIB),
    90: dict(max_threads_per_multiprocessor=2048, max_blocks_per_multiprocessor=32,
             shared_memory_per_multiprocessor=228 * KIB, shared_memory_per_block_optin=227 * KIB),
    100: dict(max_threads_per_multiprocessor=2048, max_blocks_per_multiprocessor=32,
              shared_memory_per_multiprocessor=228 * KIB, shared_memory_per_block_optin=227 * KIB),
}


def _nvidia(name: str, title: str, cc: int, sms: int, *, l2_mb: float, memory_gb: float, gbps: float,
            clock: int) -> DeviceProfile:
    """An NVIDIA row: the per-compute-capability facts from [CC] and [PTX], the per-product figures given."""
    return DeviceProfile(
        name=name, title=title, vendor="nvidia", arch=f"sm_{cc}", compute_capability=cc, multiprocessors=sms,
        warp_width=32, max_threads_per_block=1024, shared_memory_per_block=48 * KIB,  # [CC] without opt-in
        registers_per_multiprocessor=65536, registers_per_block=65536, max_registers_per_thread=255,
        vector_bytes=16,  # 128-bit loads and stores (ld.global.v4)
        l2_bytes=int(l2_mb * MIB), memory_bytes=int(memory_gb * GB), memory_gbps=gbps, clock_mhz=clock,
        **_NVIDIA_LIMITS[cc], **nvidia_features(cc))


def _cdna(name: str, title: str, arch: str, cus: int, *, l2_mb: float, memory_gb: float, gbps: float,
          clock: int) -> DeviceProfile:
    """An AMD CDNA row [ROCM]: 64-wide wavefronts, 64 KiB of LDS a CU (all of it a workgroup may take), 1,024
    work-items a workgroup, 4 SIMDs x 8 wave slots = 2,048 work-items a CU, a 512 KiB VGPR file a CU (131,072
    32-bit registers; 512 a work-item counting the accumulation registers), 16-byte loads (global_load_dwordx4),
    MFMA; no TMA, warpgroup MMA, clusters or programmatic launch."""
    return DeviceProfile(
        name=name, title=title, vendor="amd", arch=arch, compute_capability=0, multiprocessors=cus, warp_width=64,
        max_threads_per_block=1024, max_threads_per_multiprocessor=2048, max_blocks_per_multiprocessor=32,
        shared_memory_per_block=64 * KIB, shared_memory_per_block_optin=64 * KIB,
        shared_memory_per_multiprocessor=64 * KIB, registers_per_multiprocessor=131072,
        registers_per_block=131072, max_registers_per_thread=512, mma=_MFMA, vector_bytes=16,
        l2_bytes=int(l2_mb * MIB), memory_bytes=int(memory_gb * GB), memory_gbps=gbps, clock_mhz=clock)


_ROWS = (
    # [H100-WP] SXM5: 132 SMs, 50 MB L2; datasheet: 80 GB HBM3 at 3.35 TB/s; 1830 MHz (see the module's note)
    _nvidia("h100", "NVIDIA H100 SXM5 80GB", 90, 132, l2_mb=50, memory_gb=80, gbps=3350.0, clock=1830),
    # [H200-DS] the H100's GH100 with 141 GB HBM3e at 4.8 TB/s
    _nvidia("h200", "NVIDIA H200 SXM 141GB", 90, 132, l2_mb=50, memory_gb=141, gbps=4800.0, clock=1830),
    # [A100-WP] 108 SMs, 40 MB L2, 1410 MHz; datasheet (80 GB SXM): 2,039 GB/s
    _nvidia("a100", "NVIDIA A100 SXM4 80GB", 80, 108, l2_mb=40, memory_gb=80, gbps=2039.0, clock=1410),
    # [ADA-WP] L4: AD104, 58 SMs, 48 MB L2, 2040 MHz; datasheet: 24 GB GDDR6 at 300 GB/s
    _nvidia("l4", "NVIDIA L4 24GB", 89, 58, l2_mb=48, memory_gb=24, gbps=300.0, clock=2040),
    # [ADA-WP] RTX 4090: AD102, 128 SMs, 72 MB L2, 2520 MHz boost, 24 GB GDDR6X at 1,008 GB/s
    _nvidia("rtx4090", "NVIDIA GeForce RTX 4090", 89, 128, l2_mb=72, memory_gb=24, gbps=1008.0, clock=2520),
    # [B200-DS] 148 SMs, 180 GB HBM3e at 8 TB/s. L2: NVIDIA's documents do not state it; 126 MiB is what the CUDA
    # device attribute reports on a B200 as third parties publish it (no schedule here reads it). Clock: 1965 MHz
    # boost as nvidia-smi reports it (not in the datasheet).
    _nvidia("b200", "NVIDIA B200 180GB", 100, 148, l2_mb=126, memory_gb=180, gbps=8000.0, clock=1965),
    # [ROCM] MI300X (CDNA3, gfx942): 304 CUs, 32 MB L2 (4 per XCD; plus 256 MB Infinity Cache); [MI300X-DS] 192 GB
    # HBM3 at 5.3 TB/s, 2,100 MHz
    _cdna("mi300x", "AMD Instinct MI300X", "gfx942", 304, l2_mb=32, memory_gb=192, gbps=5300.0, clock=2100),
    # [ROCM] MI250X (CDNA2, gfx90a), one GCD (what HIP presents as a device): 110 CUs, 8 MB L2; [MI250X-DS] 64 GB
    # HBM2e at 1.6 TB/s a GCD, 1,700 MHz
    _cdna("mi250x", "AMD Instinct MI250X (one GCD)", "gfx90a", 110, l2_mb=8, memory_gb=64, gbps=1638.4,
          clock=1700),
    # A WebGPU adapter whose figures are not known (wgpu reports limits, not compute units): the WebGPU
    # specification's guaranteed limits (16 KiB of workgroup storage, 256 invocations a workgroup), sized for a large
    # discrete GPU's parallelism (the H100's 132 SMs) so that grids fill one; the runtime replaces the limits by the
    # adapter's.
    DeviceProfile(name="webgpu", title="WebGPU adapter (the specification's guaranteed limits)", vendor="generic",
                  arch="webgpu", multiprocessors=132, warp_width=32, max_threads_per_block=256,
                  max_threads_per_multiprocessor=2048, shared_memory_per_block=16 * KIB,
                  shared_memory_per_block_optin=16 * KIB, shared_memory_per_multiprocessor=16 * KIB,
                  registers_per_multiprocessor=65536, registers_per_block=65536, max_registers_per_thread=255,
                  vector_bytes=16),
)

CHIPS: dict[str, DeviceProfile] = {p.name: p for p in _ROWS}


def chip_names() -> list[str]:
    return list(CHIPS)


def get_profile(name: str) -> DeviceProfile:
    """The chip table's row `name` (case-insensitive), or NPUCompileError listing the known ones."""
    profile = CHIPS.get(name.lower()) if isinstance(name, str) else None
    if profile is None:
        raise NPUCompileError(f"unknown device {name!r} (known: {', '.join(CHIPS)})")
    return profile


def match_chip(product: str, compute_capability: int = 0) -> DeviceProfile | None:
    """The table row whose product a device name (as CUDA or an adapter reports it: "NVIDIA H100 80GB HBM3") names,
    where its compute capability (if given) agrees; None if none does."""
    text = product.lower().replace(" ", "").replace("-", "")
    for p in _ROWS:
        if p.vendor == "generic":
            continue
        key = {"rtx4090": "4090", "mi250x": "mi250", "mi300x": "mi300"}.get(p.name, p.name)
        if key in text and (not compute_capability or compute_capability == p.compute_capability):
            return p
    return None


def profile_for_arch(compute_capability: int) -> DeviceProfile:
    """The table's first NVIDIA row of a compute capability (a renderer asked for an arch rather than a device: the
    tests, `CudaTarget(80)`); NPUCompileError where the table has none (fill a profile from the device instead)."""
    for p in _ROWS:
        if p.vendor == "nvidia" and p.compute_capability == compute_capability:
            return p
    known = sorted({p.compute_capability for p in _ROWS if p.vendor == "nvidia"})
    raise NPUCompileError(f"no NVIDIA row of compute capability {compute_capability} in the chip table (it has "
                          f"{', '.join(map(str, known))})")


def cannot_run(present: DeviceProfile, planned: DeviceProfile) -> str | None:
    """Why code planned for `planned` cannot run on `present` (None: it can). Every feature and limit the plan may
    assume must be there: the vendor and architecture family, each matrix instruction, async copies, TMA, the
    warpgroup MMA (sm_90a code runs on sm_90 only), clusters, programmatic launch, and shared memory, threads and
    registers a block may take. Counts that only size grids (multiprocessors, caches, bandwidth) may differ: such
    code runs correctly, sized for the other device."""
    if present.vendor != planned.vendor:
        return f"a {planned.vendor} plan on a {present.vendor} device"
    if planned.vendor == "nvidia" and present.compute_capability < planned.compute_capability:
        return f"planned for {planned.arch}, the device is {present.arch}"
    if planned.vendor == "amd" and present.arch != planned.arch:
        return f"planned for {planned.arch}, the device is {present.arch}"
    missing = [s.instruction for s in planned.mma if s not in present.mma]
    if missing:
        return f"the device has no {missing[0]}"
    for f in ("async_copy", "tma", "warpgroup_mma", "programmatic_launch"):
        if getattr(planned, f) and not getattr(present, f):
            return f"the device has no {f.replace('_', ' ')}"
    for f in ("cluster_blocks", "shared_memory_per_block", "shared_memory_per_block_optin", "max_threads_per_block",
              "registers_per_block", "max_registers_per_thread"):
        if getattr(planned, f) > getattr(present, f):
            return f"{f} {getattr(planned, f)} planned, the device has {getattr(present, f)}"
    if planned.warp_width != present.warp_width:
        return f"planned for {planned.warp_width}-wide warps, the device's are {present.warp_width} wide"
    return None


def render_device(planned: DeviceProfile | None, present: DeviceProfile) -> DeviceProfile:
    """The device a runtime renders a program for: the one it was planned for where `present` runs what that plan
    assumes (an H100's plan on an H200, an A100's on either), else the device present."""
    return planned if planned is not None and cannot_run(present, planned) is None else present


def nvidia_profile(props: dict[str, Any]) -> DeviceProfile:
    """The profile of the NVIDIA device present from its CUDA device properties (`cudaGetDeviceProperties`'s fields,
    as `cupy.cuda.runtime.getDeviceProperties` returns them): every count and limit the device reports, its
    features from its compute capability, the rest (bandwidth, clock where CUDA no longer reports it) from the
    table's row for the same product where there is one."""
    cc = int(props["major"]) * 10 + int(props["minor"])
    raw = props.get("name", b"")
    product = (raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)).strip() or f"sm_{cc} GPU"
    row = match_chip(product, cc)

    def get(key: str, fallback: int) -> int:
        v = props.get(key)
        return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else fallback

    base = row or DeviceProfile(name="nvidia", title=product, vendor="nvidia", arch=f"sm_{cc}",
                                compute_capability=cc)
    bus, mem_khz = get("memoryBusWidth", 0), get("memoryClockRate", 0)
    gbps = row.memory_gbps if row else 2 * mem_khz * 1e3 * bus / 8 / 1e9  # double data rate
    name = "present-" + "".join(c if c.isalnum() else "-" for c in product.lower()).strip("-")[:100]
    return base.replace(
        name=name, title=product[:128], arch=f"sm_{cc}", compute_capability=cc,
        multiprocessors=get("multiProcessorCount", base.multiprocessors), warp_width=get("warpSize", 32),
        max_threads_per_block=get("maxThreadsPerBlock", base.max_threads_per_block),
        max_threads_per_multiprocessor=get("maxThreadsPerMultiProcessor", base.max_threads_per_multiprocessor),
        max_blocks_per_multiprocessor=get("maxBlocksPerMultiProcessor", base.max_blocks_per_multiprocessor),
        shared_memory_per_block=get("sharedMemPerBlock", base.shared_memory_per_block),
        shared_memory_per_block_optin=get("sharedMemPerBlockOptin", base.shared_memory_per_block_optin),
        shared_memory_per_multiprocessor=get("sharedMemPerMultiprocessor", base.shared_memory_per_multiprocessor),
        registers_per_multiprocessor=get("regsPerMultiprocessor", base.registers_per_multiprocessor),
        registers_per_block=get("regsPerBlock", base.registers_per_block),
        l2_bytes=get("l2CacheSize", base.l2_bytes), memory_bytes=get("totalGlobalMem", base.memory_bytes),
        memory_gbps=gbps, clock_mhz=base.clock_mhz or get("clockRate", 0) // 1000, **nvidia_features(cc))


def webgpu_profile(info: dict[str, Any], limits: dict[str, Any]) -> DeviceProfile:
    """The profile of a WebGPU adapter from its info and limits (wgpu's `adapter.info`, `adapter.limits`): the
    workgroup limits and subgroup width it reports, the multiprocessors of the table's row for its product where
    there is one (WebGPU does not report them), else the `webgpu` row's."""
    product = str(info.get("device", "") or info.get("description", "") or "WebGPU adapter").strip()
    row = match_chip(product)
    base = CHIPS["webgpu"]

    def get(key: str, fallback: int) -> int:
        v = limits.get(key)
        return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else fallback

    # wgpu-native 0.32 spells the subgroup sizes "stackgroup"
    sub = next((info[k] for k in ("subgroup_min_size", "stackgroup_min_size") if isinstance(info.get(k), int)), 0)
    threads = get("max-compute-invocations-per-workgroup", base.max_threads_per_block)
    warp = sub if 0 < sub <= threads and threads % sub == 0 else base.warp_width
    storage = get("max-compute-workgroup-storage-size", base.shared_memory_per_block)
    name = "present-" + "".join(c if c.isalnum() else "-" for c in product.lower()).strip("-")[:100]
    return base.replace(
        name=name, title=product[:128] or base.title, warp_width=warp, max_threads_per_block=threads,
        max_threads_per_multiprocessor=max(threads, base.max_threads_per_multiprocessor),
        multiprocessors=row.multiprocessors if row else base.multiprocessors,
        shared_memory_per_block=storage, shared_memory_per_block_optin=storage,
        shared_memory_per_multiprocessor=storage)


__all__ = ["CHIPS", "DeviceProfile", "MmaShape", "cannot_run", "chip_names", "get_profile", "match_chip",
           "nvidia_features", "nvidia_profile", "profile_for_arch", "render_device", "webgpu_profile"]
