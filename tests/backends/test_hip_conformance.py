"""The harness's contract (tests/backends/conformance.py) on the HIP backend: HIP on
the visible NVIDIA GPU (HIP-on-CUDA headers, NVRTC, the CUDA worker, cuBLAS), with the
CUDA conformance kernels as HIP sources (they use only the names HIP shares with CUDA).
Skipped, with the reason, without a GPU: an AMD GPU's run of the same suite waits for
an AMD machine (HipBackend on ROCm)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from peak_tune.backends import make_backend
from peak_tune.backends.base import Backend
from peak_tune.backends.cuda import profile_for_gpu, visible_gpu
from peak_tune.catalog.loaders import load_devices, load_spec
from peak_tune.core import KernelContext, KernelSpec, ProblemSize
from peak_tune.evaluation.pipeline import seed_context
from tests.backends.conformance import *  # noqa: F403  (the shared tests)
from tests.backends.conformance import FIXTURES, Kernel

pytestmark = [pytest.mark.gpu, pytest.mark.hip]

ROOT = Path(__file__).resolve().parents[2]
HIP_HEADER = "#include <hip/hip_runtime.h>\n#include <hip/hip_fp16.h>\n"


@pytest.fixture(scope="module")
def spec() -> KernelSpec:
    return load_spec(ROOT / "seeds" / "matmul")


@pytest.fixture(scope="module")
def backend() -> Iterator[Backend]:
    try:
        name, arch = visible_gpu()
    except Exception as exc:  # noqa: BLE001 - no CuPy or no device: skip with why
        pytest.skip(reason=f"needs a GPU: {exc}")
    profile = profile_for_gpu(name, arch,
                              load_devices([ROOT / "backends" / "devices"]).values())
    if profile is None:
        pytest.skip(reason=f"no device profile for {name} ({arch})")
    with make_backend("hip", profile) as driver:
        driver.probe()
        yield driver


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("hip-conformance"))


@pytest.fixture(scope="module")
def size() -> ProblemSize:
    return ProblemSize.of({"M": 512, "N": 384, "K": 256})


@pytest.fixture(scope="module")
def kernel(spec: KernelSpec) -> Kernel:
    def load(name: str) -> KernelContext:
        path = FIXTURES / "cuda" / f"{name}.cu"
        if not path.exists():  # shared with the adversarial fixtures
            path = ROOT / "tests" / "fixtures" / "adversarial_cuda" / f"{name}.cu"
        return dataclasses.replace(seed_context(spec, "hip"),
                                   source=HIP_HEADER + path.read_text())

    return load
