"""One probe for what this machine can run: tests marked `gpu` skip, with the reason,
where CuPy cannot see a CUDA device (no GPU, no driver, no cupy). And `benchmark`: a
script of benchmarks/ imported as a module."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def benchmark(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """Imports a script of benchmarks/ by name (that folder is not a package: it goes on
    sys.path for the test, as the scripts find each other when run)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    return importlib.import_module


@functools.cache
def _gpu_missing() -> str | None:
    """Why no GPU test can run here, or None. Imports cupy only when asked."""
    try:
        import cupy
    except Exception as exc:
        return f"cupy cannot be imported ({exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"cupy sees no CUDA device ({str(exc).splitlines()[0]})"
    return None if count else "cupy sees no CUDA device"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and _gpu_missing() is not None:
        skip = pytest.mark.skip(reason=f"needs a GPU: {_gpu_missing()}")
        for item in gpu_items:
            item.add_marker(skip)


from tests.postgres import postgres_server, postgres_url  # noqa: E402, F401  (fixtures)
