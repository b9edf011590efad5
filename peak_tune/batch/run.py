"""Running a batch: every study opened, resumed up to its trial count, and summarised.

Studies run one after another by default. With `parallel > 1` several run at once in
threads, but never two on one device, and a study timed on the host CPU (the C backend)
only runs alone: anything beside it would disturb its timings. Studies on Ray share the
devices of their kind (`batch.devices`): each holds its share while it runs. A study
that fails (its device's backend is missing here, its storage refuses it) is reported
with its reason and the others still run. A stop request lets each running study finish
the trials it has in flight; studies not started yet are left as they are, ready to
resume.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from peak_tune.batch.devices import DeviceCounts, claim, kind_of
from peak_tune.batch.files import BatchPlan, BatchStudy
from peak_tune.errors import EnvironmentFault, UserError
from peak_tune.search.trials import TrialRecord
from peak_tune.session.tune import TuneSession, open_session
from peak_tune.study.storage import results_storage_url

__all__ = ["BatchRun", "StudyProgress"]

log = logging.getLogger(__name__)

WAITING, OPENING, RUNNING, DONE, FAILED, STOPPED = (
    "waiting", "opening", "running", "done", "failed", "stopped")


@dataclass
class StudyProgress:
    """Where one study of the batch stands; the view and the summary read it."""

    study: BatchStudy
    state: str = WAITING
    done: int = 0  # finished trials the study holds
    new: int = 0  # trials this batch run added
    best_gflops: float = 0.0
    vendor_gflops: float = 0.0
    peak_gflops: float = 0.0  # the documented peak, where the device has no vendor library
    reason: str = ""  # why it failed
    summary: dict[str, Any] | None = None  # report.summary once it ran
    seconds: float = 0.0
    # where its time went (TuneSession.time_report): each device worker's busy share
    # of the study's run, job and build times; what says whether devices sat idle
    device_time: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        """The best over the vendor's figure, else over the documented peak."""
        denominator = self.vendor_gflops or self.peak_gflops
        return self.best_gflops / denominator if denominator else None

    def as_json(self) -> dict[str, Any]:
        target = self.study.config.target
        data: dict[str, Any] = self.summary or {
            "study": self.study.name, "kernel": target.kernel, "device": target.device,
            "backend": self.study.backend, "dtype": target.dtype,
            "sizes": [s if isinstance(s, str) else "x".join(str(v) for v in s.values())
                      for s in target.sizes],
        }
        return {**data, "state": self.state, "target_trials": self.study.trials,
                "finished_trials": self.done, "new_trials": self.new, "reason": self.reason,
                "device_time": self.device_time}


@dataclass
class BatchRun:
    """Runs a plan's studies; `changed(progress)` is called from any thread on news."""

    plan: BatchPlan
    changed: Callable[[StudyProgress], None] = lambda progress: None
    should_stop: Callable[[], bool] = lambda: False
    parallel: int = 1
    devices: DeviceCounts = field(default_factory=dict)  # kinds shared (batch.devices)
    items: list[StudyProgress] = field(init=False)
    interrupted: bool = False
    fault: EnvironmentFault | None = None  # the machine failed: the batch stops

    def __post_init__(self) -> None:
        self.items = [StudyProgress(s) for s in self.plan.studies]
        self._lock = threading.Lock()

    @property
    def storage_url(self) -> str:
        return self.plan.storage or results_storage_url(self.plan.results)

    @property
    def failed(self) -> list[StudyProgress]:
        return [item for item in self.items if item.state == FAILED]

    def run(self) -> None:
        """Run every study; a hard stop (KeyboardInterrupt) ends the batch cleanly."""
        try:
            if self.parallel <= 1:
                for item in self.items:
                    self._run_or_skip(item)
            else:
                self._run_parallel()
        except KeyboardInterrupt:
            self.interrupted = True
        for item in self.items:
            if item.state in (WAITING, OPENING, RUNNING):
                self._set(item, STOPPED)
        self.interrupted = self.interrupted or self.should_stop()

    def _set(self, item: StudyProgress, state: str, reason: str = "") -> None:
        with self._lock:
            item.state = state
            item.reason = reason or item.reason
        self.changed(item)

    def _stopping(self) -> bool:
        """Asked to stop, or the machine failed under a study (disk full, out of
        memory): the studies after it would fail the same way."""
        return self.fault is not None or self.should_stop()

    def _run_or_skip(self, item: StudyProgress) -> None:
        if self._stopping():
            self._set(item, STOPPED)
        else:
            self._run_study(item)

    def _run_parallel(self) -> None:
        waiting = list(self.items)
        running: dict[Future[None], StudyProgress] = {}
        with ThreadPoolExecutor(self.parallel, thread_name_prefix="study") as pool:
            while waiting or running:
                if self._stopping():
                    waiting.clear()  # left as they are; `run` marks them stopped
                for item in list(waiting):
                    if len(running) < self.parallel and _fits(item, list(running.values()),
                                                                  self.devices):
                        waiting.remove(item)
                        running[pool.submit(self._run_study, item)] = item
                finished, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in finished:
                    running.pop(future)
                    future.result()

    def _run_study(self, item: StudyProgress) -> None:
        started = time.perf_counter()
        self._set(item, OPENING)
        try:
            session = open_session(item.study.config)
        except Exception as exc:
            self._set(item, FAILED, _one_line(exc))
            return
        try:
            self._resume(item, session)
        except KeyboardInterrupt:
            self._set(item, STOPPED)
            raise
        except EnvironmentFault as exc:
            self.fault = exc
            self._set(item, FAILED, str(exc))
        except Exception as exc:
            self._set(item, FAILED, _one_line(exc))
        finally:
            self._close(item, session, started)

    def _resume(self, item: StudyProgress, session: TuneSession) -> None:
        """Run the trials the study still lacks (none when it holds its count)."""
        item.done = session.searcher.finished_trials()
        item.best_gflops = session.searcher.best_gflops()
        self._set(item, RUNNING)
        session.measure_vendor()
        item.vendor_gflops = session.vendors.gflops()
        against, gflops = session.vendors.denominator()
        item.peak_gflops = gflops if against == "peak" else 0.0
        self.changed(item)

        def on_trial(record: TrialRecord) -> None:
            with self._lock:
                item.new += 1
                item.done += 1
                item.best_gflops = session.searcher.best_gflops()
                item.vendor_gflops = session.vendors.gflops()  # re-timed through the run
            self.changed(item)

        session.run(max(0, item.study.trials - item.done), on_trial, self._stopping)
        complete = session.searcher.finished_trials() >= item.study.trials
        self._set(item, DONE if complete or not self.should_stop() else STOPPED)

    def _close(self, item: StudyProgress, session: TuneSession, started: float) -> None:
        from peak_tune.session.progress import summary

        try:
            session.close()
        except Exception as exc:
            self._set(item, FAILED, _one_line(exc))
        item.seconds = time.perf_counter() - started
        item.done = session.searcher.finished_trials()
        item.summary = summary(session, item.seconds)
        item.device_time = item.summary["time"]
        # the end of `session.run` re-timed the best (TuneSession.confirm_best)
        item.best_gflops = item.summary["best"]["gflops"]
        item.vendor_gflops = item.summary["vendor"]["gflops"]
        self.changed(item)


def _fits(item: StudyProgress, running: list[StudyProgress],
          devices: DeviceCounts | None = None) -> bool:
    """Whether `item` may start beside the running studies without disturbing them: a
    CPU-timed study only alone, and on each device kind no more devices claimed than it
    has (one study per device unless the batch shares a Ray cluster's devices)."""
    if item.study.exclusive:
        return not running
    if any(r.study.exclusive for r in running):
        return False
    devices = devices or {}
    kind = kind_of(item.study)
    total = devices.get(kind, 1)
    held = sum(claim(r.study, devices) for r in running if kind_of(r.study) == kind)
    return held + claim(item.study, devices) <= total


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, UserError):
        return str(exc)
    log.debug("study failed", exc_info=exc)
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}"[:300]
