"""No misattribution: after a kernel that forks, forges a reply or leaves work running,
the next kernels evaluated by the same backend (one worker, as in one tuning run) get
their own outcomes: a wrong one is rejected as wrong, a right one accepted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from peak_tune.backends.base import EvalConfig, EvalRequest
from peak_tune.backends.c import CBackend
from peak_tune.catalog.loaders import load_device, load_spec
from peak_tune.core import KernelContext, KernelSpec, Measurement, ProblemSize
from peak_tune.errors import EvaluationError, WrongResult
from tests.adversarial.cases import KERNELS, MARK_DIR

ROOT = Path(__file__).resolve().parents[2]
SIZE = ProblemSize.of({"M": 96, "N": 96, "K": 96})
CONFIG = EvalConfig(timeout_s=30.0, repeats=5)
WRONG = (ROOT / "tests" / "fixtures" / "adversarial" / "skip_k.c").read_text()


@pytest.fixture(scope="module")
def spec() -> KernelSpec:
    return load_spec(ROOT / "seeds" / "matmul")


@pytest.fixture(scope="module")
def backend() -> Iterator[CBackend]:
    with CBackend(load_device(ROOT / "backends" / "devices" / "cpu.toml")) as driver:
        yield driver


def evaluate(backend: CBackend, spec: KernelSpec, source: str, build: Path) -> Measurement:
    context = KernelContext(kernel="matmul", backend="c", source=source, entry="matmul")
    artifact = backend.compile(context, {}, "float32", str(build))
    request = EvalRequest(spec=spec, context=context, params={}, dtype="float32", size=SIZE,
                          check_sizes=spec.check_sizes, config=CONFIG)
    return backend.evaluate(artifact, request)


@pytest.mark.parametrize("cheat", ["fork_once", "forge_timing_reply", "forge_reply",
                                   "thread_finish_late", "background_precompute"])
def test_kernels_after_a_cheat_get_their_own_outcome(
    backend: CBackend, spec: KernelSpec, tmp_path: Path, mark_dir: Path, cheat: str
) -> None:
    source = (KERNELS / "c" / f"{cheat}.c").read_text().replace(MARK_DIR, str(mark_dir))
    try:
        evaluate(backend, spec, source, tmp_path)
    except EvaluationError:
        pass  # rejected, as test_cli_kernels wants; here only what follows matters
    with pytest.raises(WrongResult, match=r"^wrong result at 67x53x97"):
        evaluate(backend, spec, WRONG, tmp_path)
    measurement = evaluate(backend, spec, spec.sources["c"], tmp_path)
    assert measurement.gflops > 0
