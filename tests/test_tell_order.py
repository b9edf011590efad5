"""Trials are told in the order asked, or as they finish: no wait behind one slow trial."""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import optuna
import pytest

from peak_tune.errors import UserError
from peak_tune.session.config import TuneConfig
from peak_tune.session.tune import open_session
from peak_tune.session.window import Started, tells_as_finished
from peak_tune.session.window import next_to_tell as next_in_window


def started(prepared_done: bool = True, outcome_done: bool | None = False) -> Started:
    item = Started(trial=None, started=0.0)  # type: ignore[arg-type]  # not read here
    item.prepared = Future()
    if prepared_done:
        item.prepared.set_result(None)
    if outcome_done is not None:
        item.outcomes = Future()
        if outcome_done:
            item.outcomes.set_result([])
    return item


def next_to_tell(pending: deque[Started], as_finished: bool) -> Started:
    return next_in_window(pending, as_finished)


def test_as_finished_the_first_done_trial_goes_before_a_slow_older_one():
    slow, done = started(), started(outcome_done=True)
    assert next_to_tell(deque([slow, done]), as_finished=True) is done
    assert next_to_tell(deque([slow, done]), as_finished=False) is slow


def test_a_trial_decided_before_the_executor_is_ready_at_once():
    slow, pruned = started(), started(outcome_done=None)  # applied, never submitted
    unapplied = started(prepared_done=False, outcome_done=None)
    assert next_to_tell(deque([unapplied, slow, pruned]), as_finished=True) is pruned


def test_with_none_done_it_waits_for_the_first_to_finish():
    first, second = started(), started()
    threading.Timer(0.3, lambda: second.outcomes.set_result([])).start()  # type: ignore[union-attr]
    assert next_to_tell(deque([first, second]), as_finished=True) is second


def test_an_unknown_tell_order_is_refused(tmp_path: Path):
    with pytest.raises(UserError, match="--tell-order must be one of auto, asked, finished"):
        open_session(TuneConfig.of(sizes=({"M": 32, "N": 32, "K": 32},), results=tmp_path,
                                   tell_order="random"))


def test_auto_tells_in_the_order_asked_on_the_local_executor(tmp_path: Path):
    session = open_session(TuneConfig.of(sizes=({"M": 32, "N": 32, "K": 32},),
                                         results=tmp_path))
    try:
        assert session.tell_as_finished is False
        records: list[Any] = []
        session.run(4, records.append)
    finally:
        session.close()
    assert [r.number for r in records] == [0, 1, 2, 3]


def test_auto_tells_as_finished_where_builds_run_ahead():
    class Executor:
        def __init__(self, name: str, slots: int) -> None:
            self.name, self.slots = name, slots

    assert tells_as_finished("auto", Executor("ray", 1))
    assert tells_as_finished("auto", Executor("local", 32))  # GPU builds on a pool
    assert not tells_as_finished("auto", Executor("local", 1))  # the C backend
    assert not tells_as_finished("asked", Executor("ray", 8))
    assert tells_as_finished("finished", Executor("local", 1))
    assert not tells_as_finished("auto", Executor("local", 32), replay=True)  # repeatable


def test_in_flight_sets_the_trials_between_ask_and_tell(tmp_path: Path):
    """--in-flight N: the run keeps up to N trials asked and not yet told (here 3 on the C
    backend, whose own window is 1), and never more."""
    session = open_session(TuneConfig.of(sizes=({"M": 32, "N": 32, "K": 32},),
                                         results=tmp_path, in_flight=3))
    running: list[int] = []
    try:
        assert session.window == 3

        def told(record: Any) -> None:  # the trials asked and not yet told
            running.append(len(session.study.get_trials(
                deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))))

        session.run(8, told)
    finally:
        session.close()
    assert len(running) == 8 and max(running) == 3
    default = open_session(TuneConfig.of(sizes=({"M": 32, "N": 32, "K": 32},),
                                         results=tmp_path / "default"))
    try:
        assert default.window == 1  # the C backend: one at a time
    finally:
        default.close()


def test_a_negative_in_flight_is_one_clear_error(tmp_path: Path):
    with pytest.raises(UserError, match="--in-flight must be 0"):
        TuneConfig.of(results=tmp_path, in_flight=-1)
