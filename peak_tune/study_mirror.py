"""The driver's study in memory, written through to the persistent storage.

TPE reads every trial several times per `ask`; against SQLite that made the driver itself
the bottleneck (3 trials/s where memory gives 30). So the sampler works on an in-memory
copy, and a writer process appends each finished trial to the persistent study (SQLite or
PostgreSQL) in the order they finished. The persistent study only ever holds finished
trials: a killed driver leaves nothing RUNNING, and what it finished is there to resume.

The writer is a process, not a thread: SQLAlchemy spends 15-35 ms of Python per trial
written and a read of the whole study (for other drivers' trials) takes about a second
at 1000 trials, all of it holding the interpreter lock the sampler needs. It also reads
what other drivers of the same study finished, when asked (`request_pull`), and the
driver takes those trials in before asking (`take_pulled`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import uuid
from collections.abc import Callable
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.storages import BaseStorage, InMemoryStorage
from optuna.trial import FrozenTrial, TrialState

from peak_tune.errors import UserError

__all__ = ["StudyMirror", "open_mirrored_study"]

log = logging.getLogger(__name__)

DRIVER_ATTR = "peak_tune:driver"  # system attribute: which driver finished the trial
_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
_REPLY_WAIT_S = 1.0  # how often a wait for the writer checks that it is still alive


class StudyMirror:
    """Copies finished trials of `working` into the persistent study at `url`, in a
    process of its own."""

    def __init__(self, working: optuna.Study, persistent: optuna.Study, url: str,
                 known: set[int]) -> None:
        self.working = working
        self.persistent = persistent
        self.driver = uuid.uuid4().hex
        context = multiprocessing.get_context("spawn")  # the driver has threads: no fork
        self._inbox: Any = context.Queue()
        self._outbox: Any = context.Queue()
        self._failure = ""
        self._pulled: list[FrozenTrial] = []  # trials of other drivers, not yet taken in
        self._pulls_pending = 0
        self._writer = context.Process(
            target=_serve, name="study-writer", daemon=True,
            args=(url, persistent.study_name, self.driver, known, self._inbox,
                  self._outbox))
        self._writer.start()

    # ------------------------------------------------------------- reading in

    def request_pull(self) -> None:
        """Ask the writer for the finished trials of other drivers (and earlier runs)
        that the working study lacks; `take_pulled` adds them once they arrive."""
        self._inbox.put(("pull", None))
        self._pulls_pending += 1

    def take_pulled(self) -> int:
        """Add to the working study the pulled trials that have arrived; how many."""
        while self._reply(block=False) is not None:
            pass
        fresh, self._pulled = self._pulled, []
        for trial in fresh:
            self.working.add_trial(trial)
        return len(fresh)

    def pull(self) -> int:
        """Pull and wait: every finished trial of other drivers is in the working study."""
        self.request_pull()
        while self._pulls_pending:
            self._reply(block=True)
        return self.take_pulled()

    # ------------------------------------------------------------ writing out

    def finished(self, number: int) -> None:
        """Queue the working study's trial `number`, just told, for the persistent one."""
        self._raise_failure()
        trial = self.working.get_trials(deepcopy=False)[number]
        self._inbox.put(("trial", _copy(trial, {**trial.system_attrs,
                                                 DRIVER_ATTR: self.driver})))

    def set_user_attr(self, key: str, value: object) -> None:
        self.working.set_user_attr(key, value)
        self.persistent.set_user_attr(key, value)

    def flush(self) -> None:
        """Wait until every queued trial is in the persistent study."""
        self._inbox.put(("flush", None))
        self._wait_for("flushed")
        self._raise_failure()

    def close(self) -> None:
        if self._writer.is_alive():
            self._inbox.put(("flush", None))
            self._inbox.put(("close", None))
            self._wait_for("closed")
        self._writer.join(timeout=10)
        for channel in (self._inbox, self._outbox):
            channel.close()
            channel.join_thread()
        self._raise_failure()

    # ------------------------------------------------------------- the replies

    def _wait_for(self, kind: str) -> None:
        while self._reply(block=True) != kind:
            pass

    def _reply(self, block: bool) -> str | None:
        """Take in one reply of the writer (waiting for it if `block`); its kind, or None
        when none has come and `block` is false."""
        while True:
            try:
                kind, payload = (self._outbox.get(timeout=_REPLY_WAIT_S) if block
                                 else self._outbox.get_nowait())
                break
            except queue.Empty:
                if not block:
                    return None
                if not self._writer.is_alive():
                    raise UserError("the study writer process ended unexpectedly (exit "
                                    f"code {self._writer.exitcode}); trials finished since "
                                    "the last flush may be missing from the storage") from None
        if kind == "pulled":
            self._pulls_pending -= 1
            self._pulled.extend(payload)
        elif kind == "failed":
            self._failure = payload
        return str(kind)

    def _raise_failure(self) -> None:
        if self._failure:
            raise UserError(f"writing to the study storage failed: {self._failure}")


def _serve(url: str, study_name: str, driver: str, known: set[int], inbox: Any,
           outbox: Any) -> None:
    """The writer process: trials in, in order; other drivers' trials out when asked. It
    ends with its driver, even a killed one, once it has written what the driver sent."""
    from peak_tune.storage import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=open_storage(url))
    driver_pid = os.getppid()
    failed = False
    while True:
        try:
            kind, payload = inbox.get(timeout=_REPLY_WAIT_S)
        except queue.Empty:
            if os.getppid() != driver_pid:  # the driver is gone (this process was adopted)
                return
            continue
        if kind == "trial" and not failed:
            try:
                study.add_trial(payload)
            except Exception as error:  # reported; the driver raises on its next call
                failed = True
                outbox.put(("failed", " ".join(str(error).split())[:500]))
        elif kind == "pull":
            fresh = []
            for trial in study.get_trials(deepcopy=False, states=_FINISHED):
                if trial._trial_id in known or trial.system_attrs.get(DRIVER_ATTR) == driver:
                    continue
                known.add(trial._trial_id)
                fresh.append(_copy(trial, trial.system_attrs))
            outbox.put(("pulled", fresh))
        elif kind == "flush":
            outbox.put(("flushed", None))
        elif kind == "close":
            outbox.put(("closed", None))
            return


def _copy(trial: FrozenTrial, system_attrs: dict[str, object]) -> FrozenTrial:
    distributions: dict[str, BaseDistribution] = dict(trial.distributions)
    return optuna.trial.create_trial(
        state=trial.state, values=trial.values, params=trial.params,
        distributions=distributions, user_attrs=dict(trial.user_attrs),
        system_attrs=system_attrs, intermediate_values=dict(trial.intermediate_values),
    )


def open_mirrored_study(
    storage: BaseStorage,
    create: Callable[[BaseStorage], optuna.Study],
    sampler: optuna.samplers.BaseSampler,
) -> StudyMirror:
    """The persistent study made or opened by `create(storage)` (an RDB storage: the
    writer process opens its URL again), and an in-memory working copy holding its
    finished trials and attributes, sampled by `sampler`."""
    url = getattr(storage, "url", None)
    if not isinstance(url, str):
        raise UserError(f"the study storage must be a database URL, not {type(storage)}")
    persistent = create(storage)
    working = optuna.create_study(storage=InMemoryStorage(), sampler=sampler,
                                  directions=persistent.directions,
                                  study_name=persistent.study_name)
    for key, value in persistent.user_attrs.items():
        working.set_user_attr(key, value)
    known = set()
    for trial in persistent.get_trials(deepcopy=False, states=_FINISHED):
        known.add(trial._trial_id)
        working.add_trial(_copy(trial, trial.system_attrs))
    return StudyMirror(working, persistent, url, known)
