"""TPE drawing in a process of its own: it learns what the driver tells it, its draws
become the trials' values, and a failed process leaves the driver sampling on its own."""

from __future__ import annotations

import logging
import statistics
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.study import StudyDirection
from optuna.trial import TrialState

from peak_tune.errors import UserError
from peak_tune.search.ask_ahead import AskAhead, sampler_processes_for
from peak_tune.search.focus import FixedFirst
from peak_tune.session import parts, tune
from peak_tune.session.config import TuneConfig
from tests.instant_backend import InstantCudaBackend

optuna.logging.set_verbosity(optuna.logging.WARNING)


def objective(trial: optuna.Trial) -> float:
    x = trial.suggest_float("x", -4.0, 4.0)
    tile = trial.suggest_categorical("tile", [8, 16, 32, 64])
    return -(x - 1.0) ** 2 - abs(tile - 32) / 8


def drive(study: optuna.Study, ahead: AskAhead, trials: int) -> list[float]:
    """The driver's side: each trial from a draw, told back with its result."""
    values = []
    for _ in range(trials):
        draw = ahead.draw()
        assert draw is not None, ahead.failure
        study.enqueue_trial(draw.params)
        trial = study.ask()
        value = objective(trial)
        study.tell(trial, value)
        values.append(value)
        ahead.told(draw.ticket, study.trials[trial.number])
    return values


def open_ahead(depth: int = 2, roles: Any = None) -> AskAhead:
    return AskAhead("tpe", 0, roles, [StudyDirection.MAXIMIZE], [], depth)


def random_start(seed: int = 0) -> optuna.Study:
    """A study whose own sampler (used only for values a draw lacks: TPE's random
    start-up) is seeded, so that the whole run repeats itself."""
    return optuna.create_study(direction="maximize",
                               sampler=optuna.samplers.RandomSampler(seed=seed))


def test_the_process_learns_every_told_trial_and_its_draws_improve():
    study = random_start()
    ahead = open_ahead()
    try:
        values = drive(study, ahead, 60)
        assert ahead.finished_count() == 60
    finally:
        ahead.close()
    assert all("fixed_params" in t.system_attrs for t in study.trials)
    # after TPE's 10 random start-up trials the draws use what the process was told:
    # the last 20 beat random search's last 20 (medians -2.1 against -8.6 here)
    blind = random_start()
    blind.optimize(objective, n_trials=60)
    searched = statistics.median(values[-20:])
    assert searched > statistics.median(t.value for t in blind.trials[-20:]) + 2.0


def test_the_processes_stderr_stays_quiet_when_closed_with_draws_on_their_way(
        capfd: pytest.CaptureFixture[str]):
    ahead = open_ahead(depth=4)
    ahead.draw()
    ahead.close()  # four asks outstanding, some answered into a closed pipe
    assert "Traceback" not in capfd.readouterr().err


def test_a_study_resumed_starts_the_process_with_its_finished_trials():
    study = optuna.create_study(direction="maximize")
    study.optimize(objective, n_trials=12)
    ahead = AskAhead("tpe", 0, None, [StudyDirection.MAXIMIZE], study.trials, 2)
    try:
        assert ahead.finished_count() == 12
        draw = ahead.draw()  # past TPE's start-up: a relative draw of both values
        assert draw is not None and set(draw.params) == {"x", "tile"}
    finally:
        ahead.close()


def test_draws_not_yet_told_are_kept_apart():
    """Outstanding draws are RUNNING in the process's study: the constant liar."""
    study = optuna.create_study(direction="maximize")
    study.optimize(objective, n_trials=12)
    ahead = AskAhead("tpe", 0, None, [StudyDirection.MAXIMIZE], study.trials, 6)
    try:
        draws = [ahead.draw() for _ in range(6)]
        assert ahead.finished_count() == 12  # none told back: none finished
    finally:
        ahead.close()
    points = {tuple(sorted(d.params.items())) for d in draws if d is not None}
    assert len(points) == 6


def test_several_processes_each_learn_every_trial_and_see_the_others_draws_running():
    study = optuna.create_study(direction="maximize")
    study.optimize(objective, n_trials=12)
    ahead = AskAhead("tpe", 0, None, [StudyDirection.MAXIMIZE], study.trials, 2,
                     processes=3)
    try:
        assert ahead.counts() == [(12, 2)] * 3  # its own two draws ready, running
        draws = [ahead.draw() for _ in range(4)]
        assert all(d is not None for d in draws)
        # each keeps two of its own draws running and has seen the four handed out:
        # those that it drew itself and those of the others, as running trials
        assert ahead.counts() == [(12, 2 + 4)] * 3
        assert len({d.ticket for d in draws if d}) == 4
        for draw in draws[:3]:
            assert draw is not None
            study.enqueue_trial(draw.params)
            trial = study.ask()
            study.tell(trial, objective(trial))
            ahead.told(draw.ticket, study.trials[trial.number])
        assert ahead.counts() == [(15, 2 + 1)] * 3
    finally:
        ahead.close()


def test_several_processes_draw_different_points_that_improve():
    study = random_start()
    ahead = AskAhead("tpe", 0, None, [StudyDirection.MAXIMIZE], [], 2, processes=2)
    try:
        values = drive(study, ahead, 60)
        assert ahead.finished_count() == 60
    finally:
        ahead.close()
    blind = random_start()
    blind.optimize(objective, n_trials=60)
    assert statistics.median(values[-20:]) > statistics.median(
        t.value for t in blind.trials[-20:]) + 2.0
    assert len({(t.params["x"], t.params["tile"]) for t in study.trials}) == 60


def test_a_killed_process_is_reported_once_and_draws_stop(caplog: pytest.LogCaptureFixture):
    study = optuna.create_study(direction="maximize")
    ahead = open_ahead()
    try:
        drive(study, ahead, 3)
        ahead._children[0].kill()
        with caplog.at_level(logging.WARNING, logger="peak_tune.search.ask_ahead"):
            draws = [ahead.draw() for _ in range(4)]
        # the two draws asked for before the kill may have been sent already
        first_none = draws.index(None)
        assert first_none <= 2 and draws[first_none:] == [None] * (4 - first_none)
        assert "ended" in ahead.failure
        ahead.told(None, study.trials[0])  # ignored from now on, no error
    finally:
        ahead.close()
    assert len([r for r in caplog.records if "sampler process stopped" in r.message]) == 1


def test_roles_that_cannot_be_sent_are_a_failure_not_a_hang():
    ahead = open_ahead(roles=lambda: None)  # a lambda does not pickle
    try:
        assert ahead.draw() is None
        assert "could not send it a 'open' message" in ahead.failure
    finally:
        ahead.close()


def test_a_depth_below_one_is_refused():
    with pytest.raises(ValueError, match="depth"):
        open_ahead(depth=0)


def test_fixed_values_are_never_drawn_again_by_the_driver():
    """FixedFirst: a trial enqueued with fixed values gets what it lacks sampled on its
    own, not a relative draw of every group."""
    relative_draws: list[int] = []

    class Counting(optuna.samplers.TPESampler):
        def sample_relative(self, study: Any, trial: Any, space: Any) -> dict[str, Any]:
            if space:  # Optuna asks with an empty space too; that costs nothing
                relative_draws.append(trial.number)
            return super().sample_relative(study, trial, space)

    study = optuna.create_study(direction="maximize", sampler=FixedFirst(
        Counting(seed=0, multivariate=True, n_startup_trials=3)))
    study.optimize(objective, n_trials=8)
    before = len(relative_draws)
    study.enqueue_trial({"x": 1.0})
    study.optimize(objective, n_trials=1)
    assert len(relative_draws) == before  # "tile" was sampled on its own
    assert study.trials[-1].params["x"] == 1.0
    study.optimize(objective, n_trials=1)
    assert len(relative_draws) == before + 1


def instant_session(tmp_path: Path, **config: Any) -> tune.TuneSession:
    parts.make_backend = lambda name, device: InstantCudaBackend(device)  # type: ignore
    return tune.open_session(TuneConfig.of(**{
        "backend": "cuda", "device": "h200", "dtype": "float32",
        "sizes": ({"M": 256, "N": 256, "K": 256},), "results": tmp_path,
        "executor": "local", "seed": 0, "compile_workers": 4, "ask_ahead": 2, **config}))


@pytest.fixture
def restore_backend():
    original = parts.make_backend
    yield
    parts.make_backend = original


def test_a_gpu_study_draws_ahead_and_the_process_sees_all_it_finished(
        tmp_path: Path, restore_backend: None):
    session = instant_session(tmp_path)
    try:
        assert session.tell_as_finished and session.ask_ahead is not None
        records: list[Any] = []
        session.run(60, records.append)
        finished = session.study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
        assert session.ask_ahead.finished_count() == len(finished)
    finally:
        session.close()
    assert len(records) == 60
    drawn = [t for t in session.study.trials if "fixed_params" in t.system_attrs
             and "neighbour_of" not in t.user_attrs and "warm_start_from" not in t.user_attrs]
    assert len(drawn) >= 20  # the rest: the seed kernel, branch starts, neighbours


def test_a_study_goes_on_when_its_sampler_process_dies(
        tmp_path: Path, restore_backend: None, caplog: pytest.LogCaptureFixture):
    session = instant_session(tmp_path)
    records: list[Any] = []
    try:
        session.run(20, records.append)
        assert session.ask_ahead is not None
        session.ask_ahead._children[0].kill()
        with caplog.at_level(logging.WARNING, logger="peak_tune.search.ask_ahead"):
            session.run(30, records.append)
    finally:
        session.close()
    assert len(records) == 50
    assert any("sampling in the driver from now on" in r.message for r in caplog.records)
    assert not session.study.get_trials(states=(TrialState.RUNNING,))


def test_ask_ahead_zero_samples_in_the_driver(tmp_path: Path, restore_backend: None):
    session = instant_session(tmp_path, ask_ahead=0)
    try:
        assert session.ask_ahead is None
        assert not isinstance(session.study.sampler, FixedFirst)
    finally:
        session.close()


@pytest.mark.parametrize(("cores", "drawn_ahead"), [(2, False), (16, True)])
def test_by_default_it_draws_ahead_where_there_is_a_core_for_it(
        tmp_path: Path, restore_backend: None, monkeypatch: pytest.MonkeyPatch,
        cores: int, drawn_ahead: bool):
    monkeypatch.setattr(tune.os, "cpu_count", lambda: cores)
    session = instant_session(tmp_path, ask_ahead=-1)
    try:
        assert (session.ask_ahead is not None) is drawn_ahead
    finally:
        session.close()


def test_a_gpu_study_with_several_sampler_processes_tells_each_every_trial(
        tmp_path: Path, restore_backend: None):
    session = instant_session(tmp_path, sampler_processes=3)
    records: list[Any] = []
    try:
        assert session.ask_ahead is not None and session.ask_ahead.processes == 3
        session.run(60, records.append)
        finished = session.study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
        # every process holds every finished trial, and only its own ready draws run
        assert session.ask_ahead.counts() == [(len(finished), 2)] * 3
    finally:
        session.close()
    assert len(records) == 60
    assert not session.study.get_trials(states=(TrialState.RUNNING,))


@pytest.mark.parametrize(("cores", "processes"), [(2, 1), (4, 1), (8, 2), (16, 4), (64, 4)])
def test_by_default_one_sampler_process_draws_per_four_cores(
        tmp_path: Path, restore_backend: None, monkeypatch: pytest.MonkeyPatch,
        cores: int, processes: int):
    assert sampler_processes_for(cores) == processes
    if cores == 16:
        monkeypatch.setattr(tune.os, "cpu_count", lambda: cores)
        session = instant_session(tmp_path, ask_ahead=-1)
        try:
            assert session.ask_ahead is not None and session.ask_ahead.processes == 4
        finally:
            session.close()


def test_sampler_processes_must_be_one_or_more():
    with pytest.raises(UserError, match="--sampler-processes must be 1 or more"):
        TuneConfig.of(sampler_processes=0)
