"""The study writer's batched inserts: the same trials Optuna's add_trial would store,
in order, and a trial the storage refuses costs only itself and those after it."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import InMemoryStorage
from optuna.trial import FrozenTrial, TrialState, create_trial

from peak_tune.errors import UserError
from peak_tune.study.batch_insert import Unsupported, add_finished
from peak_tune.study.mirror import open_mirrored_study
from peak_tune.study.storage import open_storage, results_storage_url


def finished_trials(count: int) -> list[FrozenTrial]:
    """Trials as the tuner finishes them: complete, pruned and failed, with categorical,
    integer and float parameters, attributes, intermediate values."""
    trials = []
    for i in range(count):
        state = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)[i % 3]
        trials.append(create_trial(
            state=state, value=float(i) * 1.5 if state == TrialState.COMPLETE else None,
            params={"use:tb-tiling": bool(i % 2), "BLOCK_M": 16 << (i % 4), "x": i / 7},
            distributions={"use:tb-tiling": CategoricalDistribution([False, True]),
                           "BLOCK_M": IntDistribution(16, 128, log=True),
                           "x": FloatDistribution(0, 100)},
            user_attrs={"status": state.name.lower(), "gflops": {"4096": i * 10.0},
                        "sequence": ["refactor", "tb-tiling"][: i % 3]},
            system_attrs={"peak_tune:driver": "d1"},
            intermediate_values={0: float(i), 1: float("inf")} if i % 4 == 0 else {}))
    return trials


def stored(trial: FrozenTrial) -> tuple[object, ...]:
    return (trial.number, trial.state, trial.values, trial.params, trial.distributions,
            trial.user_attrs, trial.system_attrs, trial.intermediate_values)


def same_as_add_trial(url: str) -> None:
    storage = open_storage(url)
    batched = optuna.create_study(storage=storage, study_name="batched")
    one_by_one = optuna.create_study(storage=storage, study_name="one-by-one")
    trials = finished_trials(25)
    assert add_finished(batched, trials[:10]) == list(range(10))  # the numbers it gave
    assert add_finished(batched, trials[10:]) == list(range(10, 25))
    for trial in trials:
        one_by_one.add_trial(trial)
    got = optuna.load_study(study_name="batched", storage=open_storage(url)).trials
    assert [stored(t) for t in got] == [stored(t) for t in one_by_one.trials]
    assert [t.number for t in got] == list(range(25))


def test_batched_trials_are_those_add_trial_stores_sqlite(tmp_path: Path) -> None:
    same_as_add_trial(results_storage_url(tmp_path))


@pytest.mark.postgres
def test_batched_trials_are_those_add_trial_stores_postgres(postgres_url: str) -> None:
    same_as_add_trial(postgres_url)


def test_a_storage_that_is_not_a_database_is_unsupported() -> None:
    study = optuna.create_study(storage=InMemoryStorage())
    with pytest.raises(Unsupported, match="not an RDB storage"):
        add_finished(study, finished_trials(1))


def test_a_burst_of_trials_lands_in_order_and_an_unstorable_one_stops_only_itself(
        tmp_path: Path) -> None:
    url = results_storage_url(tmp_path)
    mirror = open_mirrored_study(
        open_storage(url),
        lambda storage: optuna.create_study(storage=storage, study_name="burst"),
        optuna.samplers.RandomSampler(seed=0))
    # the failure is raised by the driver's next call to the mirror after the writer's
    with pytest.raises(UserError, match="writing to the study storage failed: Object of "
                                        "type object is not JSON serializable"):
        for i in range(300):  # sent faster than one by one would write them: batched
            trial = mirror.working.ask()
            trial.suggest_float("x", 0, 1)
            if i == 250:
                trial.set_user_attr("unstorable", object())  # memory takes it, SQL cannot
            mirror.working.tell(trial, float(i))
            mirror.finished(trial.number)
        mirror.flush()
    with pytest.raises(UserError, match="writing to the study storage failed"):
        mirror.close()  # says it again, having ended the writer
    kept = optuna.load_study(study_name="burst", storage=url).trials
    assert [t.value for t in kept] == [float(i) for i in range(250)]
    assert [t.number for t in kept] == list(range(250))


def test_another_optunas_models_fall_back_to_add_trial(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from optuna.storages._rdb import models

    from peak_tune.study.mirror import _write

    monkeypatch.delattr(models.TrialValueModel, "value_to_stored_repr")  # not what we expect
    study = optuna.create_study(storage=open_storage(results_storage_url(tmp_path)))
    trials = finished_trials(4)
    with pytest.raises(Unsupported, match="table models differ"):
        add_finished(study, trials[:2])
    assert not study.trials  # the refused batch was rolled back
    monkeypatch.undo()  # add_trial needs the helper too; the writer meets the refusal

    def refused(study: optuna.Study, trials: list[FrozenTrial]) -> None:
        raise Unsupported("Optuna's table models differ")

    monkeypatch.setattr("peak_tune.study.mirror.add_finished", refused)
    assert _write(study, trials, batched=True) is False  # one by one from now on
    assert [(t.number, t.values, t.params) for t in study.trials] == [
        (i, t.values, t.params) for i, t in enumerate(trials)]
