"""The harness's contract (tests/backends/conformance.py) on the C backend."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from peak_tune.backends.c import CBackend
from peak_tune.catalog.loaders import load_device, load_spec
from peak_tune.core import KernelContext, KernelSpec, ProblemSize
from tests.backends.conformance import *  # noqa: F403  (the shared tests)
from tests.backends.conformance import FIXTURES, Kernel

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def spec() -> KernelSpec:
    return load_spec(ROOT / "seeds" / "matmul")


@pytest.fixture(scope="module")
def backend() -> Iterator[CBackend]:
    with CBackend(load_device(ROOT / "backends" / "devices" / "cpu.toml")) as driver:
        yield driver


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("c-conformance"))


@pytest.fixture(scope="module")
def size() -> ProblemSize:
    return ProblemSize.of({"M": 96, "N": 80, "K": 112})


@pytest.fixture(scope="module")
def kernel() -> Kernel:
    def load(name: str) -> KernelContext:
        source = (FIXTURES / "c" / f"{name}.c").read_text()
        context = KernelContext(kernel="matmul", backend="c", source=source, entry="matmul")
        return dataclasses.replace(context)

    return load
