"""The harness's contract (tests/backends/conformance.py) on the HLSL backend, on
Mesa's lavapipe (a CPU Vulkan device; NVIDIA's driver on a GPU machine takes the same
tests through HlslBackend's profile for it). Skipped, with the reason, without an HLSL
compiler or a Vulkan driver."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from peak_tune.backends.hlsl import HlslBackend
from peak_tune.catalog.loaders import load_device, load_spec
from peak_tune.core import KernelContext, KernelSpec, ProblemSize
from peak_tune.evaluation.pipeline import seed_context
from tests.backends.conformance import *  # noqa: F403  (the shared tests)
from tests.backends.conformance import FIXTURES, Kernel
from tests.backends.test_hlsl_toolchain import COMPILERS_HERE, _no_vulkan

pytestmark = [pytest.mark.hlsl,
              pytest.mark.skipif(not COMPILERS_HERE, reason="no HLSL compiler on PATH"),
              pytest.mark.skipif(_no_vulkan() is not None, reason=f"no Vulkan: {_no_vulkan()}")]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def spec() -> KernelSpec:
    return load_spec(ROOT / "seeds" / "matmul")


@pytest.fixture(scope="module")
def backend() -> Iterator[HlslBackend]:
    with HlslBackend(load_device(ROOT / "backends" / "devices" / "lavapipe.toml")) as driver:
        driver.probe()
        yield driver


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("hlsl-conformance"))


@pytest.fixture(scope="module")
def size() -> ProblemSize:
    return ProblemSize.of({"M": 48, "N": 40, "K": 56})


@pytest.fixture(scope="module")
def kernel(spec: KernelSpec) -> Kernel:
    def load(name: str) -> KernelContext:
        path = FIXTURES / "hlsl" / f"{name}.hlsl"
        if name == "every_other_call":
            pytest.skip(reason="a shader carries nothing from one dispatch to the next: it "
                               "sees only its bound buffers, written afresh before every run")
        return dataclasses.replace(seed_context(spec, "hlsl"), source=path.read_text())

    return load
