"""The HLSL worker's drawn problems (backends._hlsl_worker._Draws): drawn once per size
and used in turn, so that a timed run costs no drawing, yet no two consecutive runs share
inputs and each run's buffers hold exactly its own problem when it starts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from peak_tune.backends import _hlsl_worker
from peak_tune.catalog.loaders import load_spec
from peak_tune.core import ProblemSize
from peak_tune.evaluation.projections import check_projected

ROOT = Path(__file__).resolve().parents[2]
SIZE = ProblemSize.of({"M": 24, "N": 16, "K": 8})


@pytest.fixture
def draws(monkeypatch: pytest.MonkeyPatch) -> _hlsl_worker._Draws:
    spec = load_spec(ROOT / "seeds" / "matmul")
    entry = 4 * (24 * 8 + 8 * 16 + 24 * 16)
    monkeypatch.setattr(_hlsl_worker, "_DRAWS_BYTES", 3 * entry)  # room for three
    return _hlsl_worker._Draws("key", spec, SIZE, "float32")


def test_runs_take_the_drawn_problems_in_turn_each_written_when_taken(draws):
    seen = []
    for _ in range(7):
        problem, projections = draws.next()
        arrays = problem.arrays()
        assert np.array_equal(arrays["A"], problem.originals["A"])  # written for its run
        assert np.array_equal(arrays["C"], problem.poison["C"], equal_nan=True)
        assert {p.side for p in projections} == {"left", "right"}
        seen.append(arrays["A"].copy())
    assert len(draws.drawn) == 3  # no more than the memory allows
    for earlier, later in zip(seen, seen[1:], strict=False):
        assert not np.array_equal(earlier, later)  # consecutive runs: other inputs
    assert np.array_equal(seen[0], seen[3]) and np.array_equal(seen[1], seen[4])


def test_a_correct_output_passes_each_problems_projections_and_a_stale_one_fails(draws):
    first, first_projections = draws.next()
    a, b = first.originals["A"].astype(np.float64), first.originals["B"].astype(np.float64)
    first.arrays()["C"][...] = (a @ b).astype(np.float32)
    check_projected(first, first_projections)
    stale = first.arrays()["C"].copy()
    second, second_projections = draws.next()
    second.arrays()["C"][...] = stale  # the last run's answer, kept by a lazy kernel
    with pytest.raises(Exception, match="wrong result"):
        check_projected(second, second_projections)


def test_another_size_or_kernel_draws_anew(draws):
    spec = draws.base.spec
    kept = _hlsl_worker._draws_for({"name": "matmul"}, spec, SIZE, "float32")
    assert _hlsl_worker._draws_for({"name": "matmul"}, spec, SIZE, "float32") is kept
    other = ProblemSize.of({"M": 8, "N": 8, "K": 8})
    assert _hlsl_worker._draws_for({"name": "matmul"}, spec, other, "float32") is not kept
    assert _hlsl_worker._draws_for({"name": "other"}, spec, other, "float32") is not kept
