"""GPU tests of the cuda backend: marked `gpu`, skipped where the backend is unavailable (no CuPy or no device)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _cuda_ok() -> tuple[bool, str]:
    try:
        from npu_runtime.cuda.backend import is_available
    except ImportError as e:  # pragma: no cover
        return False, f"npu_runtime.cuda does not import: {e}"
    if not is_available():
        return False, "the cuda backend is unavailable (CuPy missing or no NVIDIA GPU)"
    if not torch.cuda.is_available():
        return False, "torch has no CUDA device for the reference"
    return True, ""


CUDA_OK, CUDA_REASON = _cuda_ok()


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason=CUDA_REASON)
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not CUDA_OK:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def cuda_backend():
    from npu_runtime import get_backend

    # the reference must not use TF32 either (ours never does)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return get_backend("cuda")
