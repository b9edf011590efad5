"""Fixtures of the CUDA reference applier's tests: the CUDA catalog, the H200 profile
and the CUDA seed kernel (import them into a test module to use them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from peak_tune.catalog.loaders import load_device, load_spec, load_transformations
from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import KernelContext
from peak_tune.pipeline import seed_context

ROOT = Path(__file__).resolve().parents[2]
DEVICES = ROOT / "backends" / "devices"


@pytest.fixture(scope="module")
def catalog() -> dict[str, Transformation]:
    found = load_transformations([ROOT / "transforms"])
    return {tid: t for tid, t in found.items() if "cuda" in t.backends}


@pytest.fixture(scope="module")
def h200() -> DeviceProfile:
    return load_device(DEVICES / "h200.toml")


@pytest.fixture(scope="module")
def seed() -> KernelContext:
    return seed_context(load_spec(ROOT / "seeds" / "matmul"), "cuda")
