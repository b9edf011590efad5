"""The driver's study in memory, written through to the persistent storage.

TPE reads every trial several times per `ask`; against SQLite that made the driver itself
the bottleneck (3 trials/s where memory gives 30). So the sampler works on an in-memory
copy, and a writer process appends each finished trial to the persistent study (SQLite or
PostgreSQL) in the order they finished, those that queued up meanwhile in one
transaction (peak_tune.study.batch_insert). The persistent study only ever holds finished
trials: a killed driver leaves nothing RUNNING, and what it finished is there to resume.

The writer is a process, not a thread: SQLAlchemy spends 15-35 ms of Python per trial
written and a read of the whole study (for other drivers' trials) takes about a second
at 1000 trials, all of it holding the interpreter lock the sampler needs. It also reads
what other drivers of the same study finished, when asked (`request_pull`), and the
driver takes those trials in before asking (`take_pulled`).

It is `python -m peak_tune.study.mirror IN_FD OUT_FD` (peak_tune.study.piped_child). When the
driver ends, even killed, the writer reads the end of its pipe, having written
everything sent before, and exits.
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import NoReturn

import optuna
from optuna.distributions import BaseDistribution
from optuna.storages import BaseStorage, InMemoryStorage
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import SQLAlchemyError

from peak_tune.errors import EnvironmentFault, StorageFailed, UserError, environment_fault
from peak_tune.study.batch_insert import Unsupported, add_finished
from peak_tune.study.piped_child import Message, PipedChild, child_pipes
from peak_tune.study.storage import open_storage, redacted_url, sqlite_file

__all__ = ["StudyMirror", "open_mirrored_study"]

log = logging.getLogger(__name__)

DRIVER_ATTR = "peak_tune:driver"  # system attribute: which driver finished the trial
_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
_BATCH = 100  # trials written in one transaction at most
_KEPT = "; every trial stored before is kept"


class StudyMirror:
    """Copies finished trials of `working` into the persistent study at `url`, in a
    process of its own."""

    def __init__(self, working: optuna.Study, persistent: optuna.Study, url: str,
                 known: set[int]) -> None:
        self.working = working
        self.persistent = persistent
        self.driver = uuid.uuid4().hex
        self.url = url
        self._failure: Exception | None = None  # why the writer stopped writing
        self._stored: list[int] = []  # trials the writer has stored, not yet taken
        # working trial number -> the number the persistent study gave it, where they
        # differ or may: the storage numbers trials in the order they finished (and with
        # other drivers' in between), the working study in the order they were asked
        self._stored_as: dict[int, int] = {}
        # trials of other drivers (with their stored numbers), not yet taken in
        self._pulled: list[tuple[int, FrozenTrial]] = []
        self._pulls_pending = 0
        self._closed = False
        self._writer = PipedChild("peak_tune.study.mirror", "study-writer-feed")
        self._writer.send("open", (url, persistent.study_name, self.driver, known))

    # ------------------------------------------------------------- reading in

    def request_pull(self) -> None:
        """Ask the writer for the finished trials of other drivers (and earlier runs)
        that the working study lacks; `take_pulled` adds them once they arrive."""
        self._writer.send("pull")
        self._pulls_pending += 1

    def take_pulled(self) -> list[FrozenTrial]:
        """Add to the working study the pulled trials that have arrived; those trials."""
        while self._reply(block=False) is not None:
            pass
        fresh, self._pulled = self._pulled, []
        if not fresh:  # the driver asks before every trial: no listing of the study then
            return []
        first = len(self.working.get_trials(deepcopy=False))
        for at, (stored, trial) in enumerate(fresh):
            self.working.add_trial(trial)
            self._stored_as[first + at] = stored
        return [trial for _, trial in fresh]

    def pull(self) -> int:
        """Pull and wait: every finished trial of other drivers is in the working study;
        how many came."""
        self.request_pull()
        while self._pulls_pending:
            self._reply(block=True)
        return len(self.take_pulled())

    # ------------------------------------------------------------ writing out

    def finished(self, number: int) -> FrozenTrial:
        """Queue the working study's trial `number`, just told, for the persistent one;
        that trial. `take_stored` says when it is there."""
        self._raise_failure()
        trial = self.working.get_trials(deepcopy=False)[number]
        self._writer.send("trial", (number, _copy(trial, {**trial.system_attrs,
                                                          DRIVER_ATTR: self.driver})))
        return trial

    def take_stored(self) -> list[int]:
        """The numbers of the trials stored since the last call, in the order stored
        (once the storage has failed, those stored before; `finished` and `flush` raise)."""
        while self._reply(block=False) is not None:
            pass
        stored, self._stored = self._stored, []
        return stored

    def stored_number(self, number: int) -> int:
        """The persistent study's number of the working study's trial `number` (what the
        dashboard and `peak-tune show` call it); `number` itself where it is not stored
        yet, or was loaded from the storage (the same number there)."""
        return self._stored_as.get(number, number)

    def set_user_attr(self, key: str, value: object) -> None:
        self.working.set_user_attr(key, value)
        try:
            self.persistent.set_user_attr(key, value)
        except Exception as error:
            raise _storage_failure(error, f"storing the study attribute {key!r} in "
                                          f"{redacted_url(self.url)}") from error

    def flush(self) -> None:
        """Wait until every queued trial is in the persistent study."""
        self._writer.send("flush")
        self._wait_for("flushed")
        self._raise_failure()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        ended_early = self._writer.exit_code is not None  # before it was asked to
        if not ended_early:
            self._writer.send("flush")
            self._writer.send("close")
            self._wait_for("closed")
        self._writer.close()
        self._raise_failure()
        if ended_early:
            self._writer_ended()

    # ------------------------------------------------------------- the replies

    def _wait_for(self, kind: str) -> None:
        while self._reply(block=True) != kind:
            pass

    def _reply(self, block: bool) -> str | None:
        """Take in one reply of the writer (waiting for it if `block`); its kind, or None
        when none has come and `block` is false."""
        if not block and not self._writer.has_reply():
            return None
        try:
            kind, payload = self._writer.receive()
        except EOFError:
            self._writer.wait()
            self._writer_ended()
        if kind == "pulled":
            self._pulls_pending -= 1
            self._pulled.extend(payload)
        elif kind == "stored":
            for number, stored in payload:
                self._stored.append(number)
                if stored is not None:
                    self._stored_as[number] = stored
        elif kind == "failed" and self._failure is None:
            fault, message = payload
            self._failure = (EnvironmentFault(fault, message) if fault else
                             StorageFailed(f"writing to the study storage failed: {message}"))
        return str(kind)

    def _writer_ended(self) -> NoReturn:
        raise UserError(f"the study writer process ended unexpectedly (exit code "
                        f"{self._writer.exit_code}); trials finished since the last "
                        "flush may be missing from the storage")

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure


def _serve(inbox: Connection, outbox: Connection) -> None:
    """The writer: trials in, in order; other drivers' trials out when asked; until the
    driver closes it or its end of the pipe goes away."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    kind, (url, study_name, driver, known) = inbox.recv()
    writer = _Writer(url, study_name, driver, known, outbox)
    after: Message | None = None  # a message read while batching trials
    while True:
        if after is not None:
            (kind, payload), after = after, None
        else:
            try:
                kind, payload = inbox.recv()
            except EOFError:  # the driver is gone: everything it sent is written
                return
        if kind == "trial":
            trials = [payload]
            while len(trials) < _BATCH and inbox.poll():  # what has queued up meanwhile
                try:
                    message = inbox.recv()
                except EOFError:
                    break
                if message[0] != "trial":
                    after = message
                    break
                trials.append(message[1])
            writer.write(trials)
        elif kind == "pull":
            writer.pull()
        elif kind == "flush":
            outbox.send(("flushed", None))
        elif kind == "close":
            outbox.send(("closed", None))
            return


class _Writer:
    """The writer process's side of one persistent study. After its first failure it
    writes nothing more (the driver stops on hearing of it), so what is stored is a prefix
    of what the driver finished, and every trial it says is stored is there."""

    def __init__(self, url: str, study_name: str, driver: str, known: set[int],
                 outbox: Connection) -> None:
        self.url = url
        self.driver = driver
        self.known = known
        self.outbox = outbox
        self.batched = True  # add_finished works with this Optuna (else Study.add_trial)
        self.failed = False
        self.study: optuna.Study | None = None
        self._database = sqlite_file(url)
        self._identity = _file_identity(self._database)
        try:
            self.study = optuna.load_study(study_name=study_name, storage=open_storage(url))
        except Exception as error:  # noqa: BLE001 - reported; the driver raises it
            self._fail(error, "opening the study storage")

    def write(self, trials: list[tuple[int, FrozenTrial]]) -> None:
        if self.failed or self.study is None:
            return
        if self._database is not None and _file_identity(self._database) != self._identity:
            self._fail(None, f"the study database {self._database} was deleted or replaced "
                             f"during the run, so trial {trials[0][0]} and later ones cannot "
                             "be stored; the run stops")
            return
        written: list[int | None] = []  # the stored numbers, as far as known
        numbers = [number for number, _ in trials]
        try:
            self.batched = _write(self.study, [t for _, t in trials], self.batched, written)
        except Exception as error:  # noqa: BLE001 - reported; the driver raises it
            if written:
                self.outbox.send(("stored", list(zip(numbers, written, strict=False))))
            self._fail(error, f"storing trial {numbers[len(written)]}")
            return
        self.outbox.send(("stored", list(zip(numbers, written, strict=True))))

    def pull(self) -> None:
        fresh = []
        try:
            if self.study is not None and not self.failed:
                for trial in self.study.get_trials(deepcopy=False, states=_FINISHED):
                    if (trial._trial_id in self.known
                            or trial.system_attrs.get(DRIVER_ATTR) == self.driver):
                        continue
                    self.known.add(trial._trial_id)
                    fresh.append((trial.number, _copy(trial, trial.system_attrs)))
        except Exception as error:  # noqa: BLE001 - reported; the driver raises it
            self._fail(error, "reading the study storage")
        self.outbox.send(("pulled", fresh))

    def _fail(self, error: Exception | None, doing: str) -> None:
        """Tell the driver why nothing more is written: (the fault's kind or None, one
        line naming the storage)."""
        self.failed = True
        where = f"{doing} in {redacted_url(self.url)}"
        if error is None:
            self.outbox.send(("failed", (None, doing)))
            return
        fault = environment_fault(error, where)
        if fault is not None:
            self.outbox.send(("failed", (fault.kind, fault.message + _KEPT)))
            return
        reason = " ".join(str(_innermost(error)).split())[:500]
        self.outbox.send(("failed", (None, f"{reason} ({where})")))


def _write(study: optuna.Study, trials: list[FrozenTrial], batched: bool,
           written: list[int | None] | None = None) -> bool:
    """Append `trials` in one transaction where this Optuna allows (see study_batch),
    else one by one, adding to `written` the number each stored one got (None where
    Study.add_trial, which does not say, stored it); whether the next batch may be
    written in one transaction. A batch the storage refuses is written again one by one:
    the trials before the one at fault are kept, and the error is that trial's."""
    written = [] if written is None else written
    if batched:
        try:
            written.extend(add_finished(study, trials))
            return True
        except Unsupported as why:
            log.warning("writing trials one at a time: %s", why)
            batched = False
        except Exception:  # noqa: BLE001 - the one-by-one writes below raise it again
            pass
    for trial in trials:
        study.add_trial(trial)
        written.append(None)
    return batched


def _innermost(error: BaseException) -> BaseException:
    """The error a database layer wrapped (Optuna's 'invalid data' hides the real one)."""
    while error.__cause__ is not None:
        error = error.__cause__
    return getattr(error, "orig", None) or error


def _file_identity(path: Path | None) -> tuple[int, int] | None:
    """(device, inode) of the database file: another, or none, once it was deleted."""
    try:
        found = None if path is None else path.stat()
    except OSError:
        return None
    return None if found is None else (found.st_dev, found.st_ino)


def _copy(trial: FrozenTrial, system_attrs: dict[str, object]) -> FrozenTrial:
    distributions: dict[str, BaseDistribution] = dict(trial.distributions)
    copy = optuna.trial.create_trial(
        state=trial.state, values=trial.values, params=trial.params,
        distributions=distributions, user_attrs=dict(trial.user_attrs),
        system_attrs=system_attrs, intermediate_values=dict(trial.intermediate_values),
    )
    # create_trial stamps both times with "now": the dashboard's durations and timeline
    # need the trial's own.
    copy.datetime_start = trial.datetime_start
    copy.datetime_complete = trial.datetime_complete
    return copy


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
    try:
        persistent = create(storage)
        attributes = persistent.user_attrs
        finished = persistent.get_trials(deepcopy=False, states=_FINISHED)
    except (optuna.exceptions.StorageInternalError, SQLAlchemyError) as error:
        raise _storage_failure(error, f"opening the study in {redacted_url(url)}") from error
    working = optuna.create_study(storage=InMemoryStorage(), sampler=sampler,
                                  directions=persistent.directions,
                                  study_name=persistent.study_name)
    for key, value in attributes.items():
        working.set_user_attr(key, value)
    known = set()
    for trial in finished:
        known.add(trial._trial_id)
        working.add_trial(_copy(trial, trial.system_attrs))
    return StudyMirror(working, persistent, url, known)


def _storage_failure(error: Exception, doing: str) -> Exception:
    """`error` of a call the driver makes to the storage itself, as the run's one line."""
    fault = environment_fault(error, doing)
    if fault is not None:
        return EnvironmentFault(fault.kind, fault.message + _KEPT)
    reason = " ".join(str(_innermost(error)).split())[:500]
    return StorageFailed(f"the study storage failed: {reason} ({doing})")


if __name__ == "__main__":  # the writer process: python -m peak_tune.study.mirror IN OUT
    _serve(*child_pipes(sys.argv))

