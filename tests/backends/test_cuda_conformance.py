"""The harness's contract (tests/backends/conformance.py) on the CUDA backend, on a GPU.
Skipped (with the reason) where CuPy sees no CUDA device."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from peak_tune.backends.cuda import CudaBackend, profile_for_gpu, visible_gpu
from peak_tune.catalog.loaders import load_devices, load_spec
from peak_tune.core import KernelContext, KernelSpec, ProblemSize
from peak_tune.evaluation.pipeline import seed_context
from tests.backends.conformance import *  # noqa: F403  (the shared tests)
from tests.backends.conformance import FIXTURES, Kernel

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def spec() -> KernelSpec:
    return load_spec(ROOT / "seeds" / "matmul")


@pytest.fixture(scope="module")
def backend() -> Iterator[CudaBackend]:
    name, arch = visible_gpu()
    profile = profile_for_gpu(name, arch,
                              load_devices([ROOT / "backends" / "devices"]).values())
    if profile is None:
        pytest.skip(reason=f"no device profile for {name} ({arch})")
    with CudaBackend(profile) as driver:
        yield driver


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cuda-conformance"))


@pytest.fixture(scope="module")
def size() -> ProblemSize:
    return ProblemSize.of({"M": 512, "N": 384, "K": 256})


@pytest.fixture(scope="module")
def kernel(spec: KernelSpec) -> Kernel:
    def load(name: str) -> KernelContext:
        path = FIXTURES / "cuda" / f"{name}.cu"
        if not path.exists():  # shared with the adversarial fixtures
            path = ROOT / "tests" / "fixtures" / "adversarial_cuda" / f"{name}.cu"
        source = path.read_text()
        return dataclasses.replace(seed_context(spec, "cuda"), source=source)

    return load
