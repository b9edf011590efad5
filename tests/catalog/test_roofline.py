"""The roofline: what a device can reach on a kernel, from its profile and the spec."""

from pathlib import Path

import pytest

from peak_tune.catalog.resolve import Catalog
from peak_tune.catalog.roofline import roofline
from peak_tune.core import ProblemSize

USER = Path(__file__).parents[1] / "fixtures" / "catalogs"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.with_user_folders((str(USER / "softmax"),))


def test_a_softmax_is_bound_by_memory_and_a_large_matmul_by_compute(catalog):
    h200 = catalog.device("h200")
    softmax = roofline(h200, catalog.spec("softmax"), "float32",
                       [ProblemSize.of({"ROWS": 4096, "COLS": 4096})])
    # 5 flops per element over 8 bytes moved (read X, write Y) at 4800 GB/s
    assert softmax.bound == "memory" and softmax.gflops == pytest.approx(4800 * 5 / 8)
    assert softmax.peak_gflops == 67000
    matmul = roofline(h200, catalog.spec("matmul"), "float32",
                      [ProblemSize.of({"M": 4096, "N": 4096, "K": 4096})])
    assert matmul.bound == "compute" and matmul.gflops == pytest.approx(67000)


def test_sizes_on_both_sides_of_the_ridge_are_mixed_and_averaged(catalog):
    h200 = catalog.device("h200")
    small, large = ProblemSize.of({"M": 8, "N": 8, "K": 8}), ProblemSize.of(
        {"M": 4096, "N": 4096, "K": 4096})
    both = roofline(h200, catalog.spec("matmul"), "float32", [small, large])
    # 1024 flops over 768 bytes at 8: 6400 GFLOP/s; the geometric mean with 67000
    assert both.bound == "mixed"
    assert both.gflops == pytest.approx((4800 * 1024 / 768 * 67000) ** 0.5)


def test_a_device_documenting_nothing_has_no_roofline(catalog):
    lavapipe = catalog.device("lavapipe")
    found = roofline(lavapipe, catalog.spec("matmul"), "float32",
                     [ProblemSize.of({"M": 64, "N": 64, "K": 64})])
    assert found.gflops == 0 and found.bound == ""
