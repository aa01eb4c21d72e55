"""`--input NAME=FILE.npy`: an array file read without trusting it. The header is read first (NumPy's own format
reader, no pickle), its dtype and shape checked against the program's input and the file's size before any data is
read, so a `.npy` whose header claims 10**12 elements is refused in a line and never allocated. `.npz` archives,
pickles, object, string, complex and structured arrays are refused by name; a big-endian or Fortran-ordered array
of the right type is accepted (converted to native order)."""

from __future__ import annotations

import os

import numpy as np

from npu_compiler.atomic import note_input
from npu_compiler.buffers import TensorSpec
from npu_compiler.errors import InputError
from npu_compiler.limits import Limits, format_bytes
from npu_runtime.dtypes import NP_DTYPES, np_dtype


def parse_input_args(items: list[str]) -> dict[str, str]:
    """NAME=FILE pairs (each name once)."""
    out: dict[str, str] = {}
    for item in items or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--input expects NAME=FILE.npy, got {item!r}")
        if name in out:
            raise InputError(f"--input {name} is given twice")
        out[name] = path
    return out


def load_npy(name: str, path: str) -> np.ndarray:
    """One input array from a .npy file (see the module's docstring)."""
    where = f"--input {name}={path}"
    if not os.path.exists(path):
        raise InputError(f"--input {name}: file not found: {path}")
    if os.path.isdir(path):
        raise InputError(f"{where}: is a folder, not a .npy file")
    try:
        with open(path, "rb") as f:
            note_input(path)
            head = f.read(6)
            if head[:2] == b"PK":
                raise InputError(f"{where}: is an .npz archive; save each input as its own .npy (numpy.save)")
            if head != b"\x93NUMPY":
                raise InputError(f"{where}: not a .npy array file (no NumPy header; pickles are not read)")
            f.seek(0)
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f, max_header_size=1 << 16)
            offset = f.tell()
            size = os.fstat(f.fileno()).st_size
    except InputError:
        raise
    except (ValueError, OSError, EOFError, SyntaxError) as e:
        raise InputError(f"{where}: not a readable .npy file ({str(e).splitlines()[0][:120] if str(e) else e})") \
            from None
    if dtype.hasobject or dtype.fields is not None or dtype.kind not in "biuf" and dtype.name != "bfloat16":
        raise InputError(f"{where}: holds {dtype} values; inputs are arrays of numbers (float, int or bool)")
    native = dtype.newbyteorder("=") if dtype.byteorder not in ("=", "|") else dtype
    if native not in NP_DTYPES.values():
        raise InputError(f"{where}: holds {dtype} values, which no program input takes")
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * dtype.itemsize
    limit = Limits().max_bytes
    if nbytes > limit:
        raise InputError(f"{where}: its header says {list(shape)} {dtype} ({format_bytes(nbytes)}), above the limit "
                         f"of {format_bytes(limit)} ($NPUSIM_MAX_BYTES)")
    if size - offset < nbytes:
        raise InputError(f"{where}: truncated: its header says {nbytes} bytes of data, the file holds "
                         f"{max(size - offset, 0)}")
    arr = np.fromfile(path, dtype=dtype, count=numel, offset=offset)
    arr = arr.reshape(shape, order="F" if fortran else "C")
    return np.require(arr, dtype=native, requirements="C")


def load_inputs(items: list[str]) -> dict[str, np.ndarray]:
    return {name: load_npy(name, path) for name, path in parse_input_args(items).items()}


# ---- inputs drawn at random: what `npusim run` and calibration draw where none is given ----------------------------


def generate_input(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """Floats at random; integers inside their valid range (token ids below the embedding's rows)."""
    dt = np_dtype(spec.dtype)
    if spec.dtype == "bool":
        return rng.random(spec.shape) < 0.5
    if dt.kind in "iu":
        lo, hi = _int_range(spec)
        return rng.integers(lo, hi, size=spec.shape).astype(dt)
    return rng.standard_normal(spec.shape).astype(np.float32).astype(dt)


def _int_range(spec: TensorSpec) -> tuple[int, int]:
    lo, hi = spec.value_range or (0, 16)
    return lo, max(hi, lo + 1)


def how_generated(spec: TensorSpec) -> str:
    """What `generate_input` draws for `spec`, in words."""
    if spec.dtype == "bool":
        return "random booleans"
    if np_dtype(spec.dtype).kind in "iu":
        lo, hi = _int_range(spec)
        why = "its valid range" if spec.value_range else "no valid range known"
        return f"uniform integers in [{lo}, {hi}) ({why})"
    return "N(0, 1) random values"
