"""The window of trials between ask and tell: what one trial carries while it is
applied, built and timed, when it can be told, and showing told trials once stored."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any

import optuna

from peak_tune.appliers.base import Applier, budget_spent_of
from peak_tune.core import KernelContext, Outcome, Status
from peak_tune.executors import Executor
from peak_tune.executors.base import JobTimes
from peak_tune.search.trials import TrialRecord

__all__ = ["ShownWhenStored", "Started", "StopWhenSpent", "next_to_tell", "settled",
           "tells_as_finished", "where_time_went"]


@dataclass
class Started:
    """A trial asked for and prepared, waiting to be timed."""

    trial: optuna.Trial
    started: float
    sequence: list[str] = field(default_factory=list)
    chain: list[KernelContext] = field(default_factory=list)
    params: dict[str, int] = field(default_factory=dict)
    early: tuple[Status, str] | None = None  # decided without running anything
    prepared: Future[None] | None = None  # applied and handed to the executor
    outcomes: Future[list[Outcome]] | None = None  # one per tuned size, from the executor
    ask_s: float = 0.0  # the sampler's time for it
    apply_s: float = 0.0  # the applier's


def tells_as_finished(order: str, executor: Executor, replay: bool = False) -> bool:
    """`auto`: as trials finish wherever builds run ahead of the timings (Ray, and the
    local executor's build pool for GPU backends), so that one slow build does not hold
    up a window of finished trials; in the order asked where one thing runs at a time
    (the C backend) or nothing runs (a replay), which costs nothing there and keeps a
    seeded run repeatable."""
    ahead = executor.name == "ray" or executor.slots > 1
    return order == "finished" or (order == "auto" and ahead and not replay)


def settled(item: Started) -> bool:
    """Nothing of the trial is still running: it can be finished without waiting."""
    if item.prepared is None:  # decided before anything was started
        return True
    if not item.prepared.done():
        return False
    return item.outcomes is None or item.outcomes.done()


@dataclass
class ShownWhenStored:
    """Told trials, handed to `on_trial` (the progress view) once the storage holds them,
    in the order told: a trial shown is a trial stored, even when the storage fails."""

    on_trial: Callable[[TrialRecord], None]
    unshown: deque[TrialRecord] = field(default_factory=deque)
    held: set[int] = field(default_factory=set)  # stored, not yet shown

    @property
    def waiting(self) -> bool:
        return bool(self.unshown)

    def told(self, record: TrialRecord) -> None:
        self.unshown.append(record)

    def stored(self, numbers: list[int]) -> None:
        self.held.update(numbers)
        while self.unshown and self.unshown[0].number in self.held:
            record = self.unshown.popleft()
            self.held.discard(record.number)
            self.on_trial(record)


def next_to_tell(pending: deque[Started], as_finished: bool) -> Started:
    """The oldest trial, or, telling as trials finish, the oldest finished one (after
    waiting for any to finish)."""
    if not as_finished:
        return pending[0]
    while True:
        ready = next((item for item in pending if settled(item)), None)
        if ready is not None:
            return ready
        running: list[Future[Any]] = [f for item in pending
                                      for f in (item.outcomes or item.prepared,)
                                      if f is not None]
        wait(running, timeout=1.0, return_when=FIRST_COMPLETED)


def where_time_went(item: Started, seconds: float, jobs: list[JobTimes]) -> dict[str, float]:
    """The trial's seconds: asking the sampler, applying, building, waiting for the
    device, validating and timing on it (`jobs`: the executor's latest JobTimes; the
    rest of `seconds` is waiting to be told)."""
    number = item.trial.number
    job = next((j for j in reversed(jobs) if j.trial == number), None)
    spent = {"ask": item.ask_s, "apply": item.apply_s, "build": 0.0, "wait": 0.0,
             "evaluate": 0.0, "total": seconds}
    if job is not None:
        spent.update(build=job.build_s, wait=job.waited_s, evaluate=job.busy_s)
    return {k: round(v, 4) for k, v in spent.items()}


class StopWhenSpent:
    """A run's stop question: the caller's `should_stop`, or the applier's model budget
    spent (then `why` says how)."""

    def __init__(self, should_stop: Callable[[], bool], applier: Applier) -> None:
        self._should_stop = should_stop
        self._applier = applier
        self.why = ""

    def __call__(self) -> bool:
        if self._should_stop():
            return True
        self.why = budget_spent_of(self._applier)
        return bool(self.why)
