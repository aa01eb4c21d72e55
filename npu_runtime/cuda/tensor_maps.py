"""Tensor maps for the launches that copy tiles with Hopper's tensor memory accelerator (`Launch.tensor_maps`).

A tensor map describes a 2-D view of device memory (its base address, extents, row pitch, the tile a copy moves and
the shared-memory swizzle) in 128 opaque bytes that only the driver can write (`cuTensorMapEncodeTiled`). The
compiler describes each map over a launch's buffers; the runtime encodes it once the buffers have addresses and puts
a launch's maps, in order, in device memory, whose address the kernel gets as its first pointer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from npu_compiler.dtypes import itemsize

from ..errors import NPURuntimeError

MAP_BYTES = 128
ALIGN = 16  # bytes: a map's base address and row pitch
MAX_BOX = 256  # elements of a tile along either dim
_TYPES = {"bfloat16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", "float16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
          "float32": "CU_TENSOR_MAP_DATA_TYPE_FLOAT32"}


def encode(address: int, spec: dict, where: str) -> bytes:
    """The 128 bytes of one map (`spec` as `Launch.tensor_maps` describes it) over memory from `address`, the base of
    the buffer `spec["ref"]` names; `where` names the launch for the error that a map the driver refuses raises."""
    from cuda.bindings import driver as cu  # noqa: PLC0415  (the cuda extra's cuda-bindings)

    dtype = spec["dtype"]
    if dtype not in _TYPES:
        raise NPURuntimeError(f"{where}: a tensor map over {dtype} elements (supported: {', '.join(_TYPES)})")
    size = itemsize(dtype)
    base = address + int(spec["offset"]) * size
    inner, outer = (int(d) for d in spec["dims"])
    pitch = int(spec["pitch"]) * size
    box = [int(b) for b in spec["box"]]
    if base % ALIGN or pitch % ALIGN or not (0 < inner and 0 < outer) or not all(0 < b <= MAX_BOX for b in box):
        raise NPURuntimeError(f"{where}: cannot describe its operand as a tensor map (address {base:#x}, row pitch "
                              f"{pitch} bytes, {inner} x {outer} elements, tiles of {box}): the address and the "
                              f"pitch must be multiples of {ALIGN} bytes, the tiles at most {MAX_BOX} a dim")
    err, tmap = cu.cuTensorMapEncodeTiled(
        getattr(cu.CUtensorMapDataType, _TYPES[dtype]), 2, base,
        [cu.cuuint64_t(inner), cu.cuuint64_t(outer)], [cu.cuuint64_t(pitch)],
        [cu.cuuint32_t(box[0]), cu.cuuint32_t(box[1])], [cu.cuuint32_t(1), cu.cuuint32_t(1)],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise NPURuntimeError(f"{where}: the driver refused a tensor map (cuTensorMapEncodeTiled: {err.name}; address "
                              f"{base:#x}, {inner} x {outer} {dtype} elements, row pitch {pitch} bytes, tiles of "
                              f"{box})")
    raw = np.array([int(word) for word in tmap.opaque], dtype=np.uint64).tobytes()
    if len(raw) != MAP_BYTES:
        raise NPURuntimeError(f"{where}: a tensor map of {len(raw)} bytes, not {MAP_BYTES}")
    return raw


def encode_all(addresses: Sequence[int], specs: Sequence[dict], where: str) -> np.ndarray:
    """A launch's maps, in order, as the bytes to upload (each map's address a multiple of 128 bytes from the
    upload's start, which the driver requires to be 64-byte aligned)."""
    return np.frombuffer(b"".join(encode(a, s, where) for a, s in zip(addresses, specs, strict=True)), dtype=np.uint8)


__all__ = ["encode", "encode_all", "MAP_BYTES"]
