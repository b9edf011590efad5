"""The suite's CUDA cheats (tests/fixtures/adversarial_cuda/cheat_*.cu) build with NVRTC
on the host for fp32 and fp16: they are real kernels a GPU run can judge
(benchmarks/adversarial_cuda.py runs them and records what the harness made of them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from peak_tune.backends.cuda import CudaBackend
from peak_tune.catalog.loaders import load_device
from peak_tune.core import KernelContext
from tests.nvrtc import needs_nvrtc

ROOT = Path(__file__).resolve().parents[2]
CHEATS = sorted((ROOT / "tests" / "fixtures" / "adversarial_cuda").glob("cheat_*.cu"))
LAUNCH = {"grid_x": "ceil_div(N, 16)", "grid_y": "ceil_div(M, 16)", "block_x": "16",
          "block_y": "16"}


@pytest.fixture(scope="module")
def backend() -> Iterator[CudaBackend]:
    with CudaBackend(load_device(ROOT / "backends" / "devices" / "h200.toml")) as driver:
        yield driver


def test_there_are_enough_cuda_cheats() -> None:
    assert len(CHEATS) >= 6


@needs_nvrtc
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("path", CHEATS, ids=[p.stem for p in CHEATS])
def test_cuda_cheat_builds(backend: CudaBackend, tmp_path: Path, path: Path, dtype: str) -> None:
    context = KernelContext(kernel="matmul", backend="cuda", source=path.read_text(),
                            entry="matmul", launch=LAUNCH)
    artifact = backend.compile(context, {}, dtype, str(tmp_path))
    assert artifact.resources["registers"] > 0
