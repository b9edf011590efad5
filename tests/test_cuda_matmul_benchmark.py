"""benchmarks/cuda_matmul.py without a GPU (the instant CUDA stand-in): a later call given
the same results folder and --study continues each study where the last one stopped."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import optuna
import pytest

from peak_tune.session import parts
from tests.instant_backend import InstantCudaBackend

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench(benchmark: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch
          ) -> ModuleType:
    monkeypatch.setattr(parts, "make_backend", lambda name, device: InstantCudaBackend(device))
    return benchmark("cuda_matmul")


def test_a_named_study_continues_in_a_later_call(bench: ModuleType, tmp_path: Path) -> None:
    first = bench.study_row("float32", 256, 6, tmp_path, 600.0, study="s-float32-256")
    second = bench.study_row("float32", 256, 5, tmp_path, 600.0, study="s-float32-256")
    assert first["study"] == second["study"] == "s-float32-256"
    assert first["trials_this_run"] == first["trials"]["total"] == 6
    assert (second["trials_this_run"], second["trials"]["total"]) == (5, 11)
    assert second["best"]["gflops"] >= first["best"]["gflops"]  # the whole study's best
    assert second["trials_per_second"] == pytest.approx(5 / second["seconds"])
    fresh = bench.study_row("float32", 256, 3, tmp_path, 600.0)
    assert fresh["study"].endswith("-run1") and fresh["trials"]["total"] == 3


def test_a_larger_size_can_start_from_the_smaller_ones_best(bench: ModuleType,
                                                            tmp_path: Path) -> None:
    small = bench.study_row("float32", 256, 6, tmp_path, 600.0)
    larger = bench.study_row("float32", 512, 4, tmp_path, 600.0,
                             warm_start=(small["study"],))
    trials = optuna.load_study(study_name=larger["study"],
                               storage=f"sqlite:///{tmp_path}/peak.db").trials
    assert trials[1].user_attrs["warm_start_from"].startswith(small["study"] + "#")
    assert trials[1].user_attrs["sequence"] == small["best"]["sequence"]
