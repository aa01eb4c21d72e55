"""`TargetConfig`: the accelerator being simulated (its constraints), chosen separately from the machine that
executes the code (`CodegenTarget`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class TargetConfig:
    name: str
    compute_dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16")
    channel_alignment_bytes: int = 1  # 4-D activations and conv weights have C padded to this many bytes
    max_dispatch_per_dim: int = 2**31 - 1
    max_rank: int = 8
    tile_m: int = 64
    tile_n: int = 64
    tile_k: int = 32
    # Figures for a cost model and for reporting the fraction of the physical limit.
    peak_tflops: dict[str, float] = field(default_factory=dict)
    memory_gbps: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


CPU_DEFAULT = TargetConfig(name="cpu")
CUDA_DEFAULT = TargetConfig(
    name="cuda",
    max_dispatch_per_dim=2**31 - 1,
    tile_m=128,
    tile_n=128,
    tile_k=64,
    peak_tflops={"bfloat16": 989.0, "float16": 989.0, "float32": 67.0},
    memory_gbps=3350.0,
)
WEBGPU_DEFAULT = TargetConfig(name="webgpu", max_dispatch_per_dim=65535)
# An NPU-like accelerator: half-precision only, 64-byte channel alignment, small dispatch grid.
NPU_STRICT = TargetConfig(
    name="npu",
    compute_dtypes=("float16", "bfloat16"),
    channel_alignment_bytes=64,
    max_dispatch_per_dim=65535,
)

PRESETS: dict[str, TargetConfig] = {c.name: c for c in (CPU_DEFAULT, CUDA_DEFAULT, WEBGPU_DEFAULT, NPU_STRICT)}


def default_config(target: str) -> TargetConfig:
    return PRESETS.get(target, CPU_DEFAULT)
