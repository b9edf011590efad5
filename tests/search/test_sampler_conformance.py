"""What every registered sampler must do (peak_tune.search.samplers.SAMPLERS): a sampler
added to the registry gets these tests by being registered. Against a replay of real
recorded outcomes (tests/search/test_search_replay.py), so each runs in seconds."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from peak_tune.search.samplers import SAMPLERS, is_multi_objective
from tests.search.test_search_replay import SPACE, recorded_best, run

NEEDS = {"gp": "torch"}  # a sampler that needs an optional package, and which


def _sampler(name: str) -> str:
    package = NEEDS.get(name)
    if package and importlib.util.find_spec(package) is None:
        pytest.skip(f"the {name} sampler needs {package}, which is not installed")
    return name


@pytest.mark.parametrize("name", SAMPLERS)
def test_a_seed_repeats_the_search_and_another_seed_does_not(tmp_path: Path, name: str) -> None:
    sampler = _sampler(name)

    def points(folder: str, seed: int) -> list[tuple]:
        study = run(tmp_path / folder, 24, seed=seed, sampler=sampler).study
        return [(tuple(t.user_attrs["sequence"]), tuple(sorted(t.user_attrs["params"].items())))
                for t in study.trials]

    first = points("a", 3)
    assert first == points("b", 3)
    assert first != points("c", 4)


@pytest.mark.parametrize("name", SAMPLERS)
def test_it_asks_only_for_points_of_the_space_and_finds_most_of_the_best(
        tmp_path: Path, name: str) -> None:
    session = run(tmp_path, 40, seed=2, sampler=_sampler(name))
    trials = session.study.trials
    assert all(set(t.user_attrs["sequence"]) <= set(SPACE) for t in trials)
    assert all(t.state.is_finished() for t in trials)  # none left running
    assert session.searcher.best_gflops() >= 0.8 * recorded_best()
    if is_multi_objective(name):  # speed up, sequence length down
        assert len(session.study.directions) == 2
        assert all(len(t.values) == 2 for t in session.study.best_trials)
