"""The in-memory working study and its write-through to the persistent storage."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from peak_tune.backends.worker import child_env
from peak_tune.errors import UserError
from peak_tune.study.mirror import StudyMirror, open_mirrored_study
from peak_tune.study.storage import open_storage, results_storage_url


def _driver(url: str) -> StudyMirror:
    return open_mirrored_study(
        open_storage(url),
        lambda storage: optuna.create_study(storage=storage, study_name="shared",
                                            load_if_exists=True, direction="maximize"),
        optuna.samplers.RandomSampler(seed=0),
    )


def _run(mirror: StudyMirror, trials: int) -> None:
    for _ in range(trials):
        trial = mirror.working.ask()
        value = trial.suggest_float("x", 0, 1)
        trial.set_user_attr("note", "kept")
        mirror.working.tell(trial, value)
        mirror.finished(trial.number)
    mirror.flush()


def test_finished_trials_reach_the_storage_and_running_ones_do_not(tmp_path: Path) -> None:
    url = results_storage_url(tmp_path)
    mirror = _driver(url)
    _run(mirror, 4)
    mirror.working.ask()  # left running, as by a driver killed mid-trial
    mirror.close()
    mirror.close()  # a second close does nothing
    stored = optuna.load_study(study_name="shared", storage=url).trials
    assert [t.state for t in stored] == [optuna.trial.TrialState.COMPLETE] * 4
    assert all(t.user_attrs["note"] == "kept" for t in stored)
    assert [t.params for t in stored] == [t.params for t in mirror.working.trials[:4]]


def test_stored_trials_keep_when_they_started_and_ended(tmp_path: Path) -> None:
    """The dashboard's durations and timeline read these: they are the trial's own
    times, not the moment the writer stored it."""
    url = results_storage_url(tmp_path)
    mirror = _driver(url)
    trial = mirror.working.ask()
    trial.suggest_float("x", 0, 1)
    time.sleep(0.2)
    mirror.working.tell(trial, 1.0)
    time.sleep(0.2)  # stored (at close) well after it ended
    mirror.finished(trial.number)
    mirror.close()
    worked = mirror.working.trials[0]
    stored = optuna.load_study(study_name="shared", storage=url).trials[0]
    assert stored.datetime_start == worked.datetime_start
    assert stored.datetime_complete == worked.datetime_complete
    assert stored.duration is not None and stored.duration.total_seconds() >= 0.2


def test_a_resumed_driver_starts_from_every_finished_trial(tmp_path: Path) -> None:
    url = results_storage_url(tmp_path)
    first = _driver(url)
    _run(first, 3)
    first.close()
    again = _driver(url)
    assert len(again.working.trials) == 3
    assert again.working.best_value == first.working.best_value


def test_two_drivers_of_one_study_see_each_other_without_duplicates(tmp_path: Path) -> None:
    url = results_storage_url(tmp_path)
    a, b = _driver(url), _driver(url)
    _run(a, 3)
    assert b.pull() == 3
    _run(b, 2)
    assert a.pull() == 2
    assert a.pull() == 0  # nothing new, nothing taken twice
    assert len(a.working.trials) == len(b.working.trials) == 5
    a.close()
    b.close()
    assert len(optuna.load_study(study_name="shared", storage=url).trials) == 5


def test_each_trial_is_known_by_the_number_the_storage_gave_it(tmp_path: Path) -> None:
    """Two drivers store their trials in the order they finish them, interleaved, so a
    working study's numbers are not the stored ones: the mirror knows which is which, for
    its own trials and those it pulled (what the run prints is what the dashboard shows)."""
    url = results_storage_url(tmp_path)
    a, b = _driver(url), _driver(url)
    _run(b, 2)  # stored as 0, 1
    _run(a, 3)  # a's 0, 1, 2 stored as 2, 3, 4
    assert [a.stored_number(n) for n in range(3)] == [2, 3, 4]
    assert [b.stored_number(n) for n in range(2)] == [0, 1]
    assert a.pull() == 2  # b's trials, 3 and 4 in a's working study
    assert [a.stored_number(n) for n in (3, 4)] == [0, 1]
    assert a.stored_number(99) == 99  # not stored (yet): its own number
    a.close()
    b.close()
    stored = optuna.load_study(study_name="shared", storage=url).trials
    for mirror, count in ((a, 5), (b, 2)):
        for number in range(count):
            assert stored[mirror.stored_number(number)].params == \
                mirror.working.trials[number].params


def test_a_trial_the_storage_refuses_is_a_clear_error_on_the_next_call(tmp_path: Path) -> None:
    mirror = _driver(results_storage_url(tmp_path))
    trial = mirror.working.ask()
    trial.set_user_attr("unstorable", object())  # memory takes it, the database cannot
    mirror.working.tell(trial, 1.0)
    mirror.finished(trial.number)
    with pytest.raises(UserError, match="writing to the study storage failed"):
        mirror.flush()


def test_a_killed_writer_is_a_clear_error_not_a_hang(tmp_path: Path) -> None:
    mirror = _driver(results_storage_url(tmp_path))
    mirror._writer.kill()
    mirror._writer.wait()
    with pytest.raises(UserError, match="study writer process ended unexpectedly"):
        mirror.flush()
    with pytest.raises(UserError, match="study writer process ended unexpectedly"):
        mirror.close()  # closing says so too, once the rest is cleaned up


SCRIPT = """
import optuna
from peak_tune.study.storage import open_storage
from peak_tune.study.mirror import open_mirrored_study
mirror = open_mirrored_study(
    open_storage({url!r}),
    lambda storage: optuna.create_study(storage=storage, study_name="script",
                                        direction="maximize"),
    optuna.samplers.RandomSampler(seed=0))
for _ in range(3):
    trial = mirror.working.ask()
    mirror.working.tell(trial, trial.suggest_float("x", 0, 1))
    mirror.finished(trial.number)
mirror.close()
print("stored", len(optuna.load_study(study_name="script", storage={url!r}).trials))
"""


def test_a_script_without_a_main_guard_runs_once(tmp_path: Path) -> None:
    """The writer is not a multiprocessing child: the user's script is not run again."""
    script = tmp_path / "tune_it.py"
    script.write_text(SCRIPT.format(url=results_storage_url(tmp_path)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env=child_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["stored", "3"]
