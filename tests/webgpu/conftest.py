"""Tests of the webgpu backend: marked `webgpu`, skipped where no WebGPU adapter exists, except in CI, which installs
Mesa's Vulkan driver (.ci/run): there a missing adapter fails instead of silently skipping the backend."""

from __future__ import annotations

import os

import pytest

from npu_runtime.backend import unavailable_reason

WEBGPU_WHY = unavailable_reason("webgpu")


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason=f"webgpu backend unavailable: {WEBGPU_WHY}")
    for item in items:
        if "tests/webgpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.webgpu)
            if WEBGPU_WHY is not None and not os.environ.get("CI"):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def webgpu():
    from npu_runtime import get_backend

    return get_backend("webgpu")
