"""The Observer seam: what a tuning session tells whoever watches it, as typed events.

The progress view, the batch runner and anything else that follows a run subscribe to
the session (TuneSession.subscribe) rather than reaching into it. Events arrive on the
session's own thread, a trial once the storage holds it.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from peak_tune.appliers.base import Applier
from peak_tune.appliers.wiring import LLMJournal
from peak_tune.core import Status
from peak_tune.search.trials import TrialRecord

__all__ = ["STATUS_LABELS", "BudgetSpent", "CallJournal", "Event", "NewBest", "Observer",
           "Observers", "RunEnded", "RunLedger", "TrialFinished", "VendorMeasured"]

# how a trial's outcome is named in the summary, the batch table and the report
STATUS_LABELS = {
    Status.OK: "ok",
    Status.INVALID: "invalid",
    Status.APPLY_ERROR: "apply error",
    Status.COMPILE_ERROR: "compile error",
    Status.WRONG_RESULT: "wrong result",
    Status.RUNTIME_ERROR: "crash",
    Status.TIMEOUT: "timeout",
}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrialFinished:
    """A trial told and stored; the study's best after it, and what it is measured
    against ("vendor" or "peak" and its GFLOP/s, "" and 0 for neither)."""

    record: TrialRecord
    best_gflops: float
    against: str
    denominator: float
    peak_gflops: float  # the device's documented peak (0: none)


@dataclass(frozen=True)
class NewBest:
    """A trial faster than every one before it in the study."""

    record: TrialRecord


@dataclass(frozen=True)
class VendorMeasured:
    size: str
    name: str
    gflops: float
    reason: str  # "start", a re-timing's reason, "end-of-run re-timing"
    noisy: bool


@dataclass(frozen=True)
class BudgetSpent:
    """The applier's model budget ran out: the run stops before its trials are done."""

    why: str


@dataclass(frozen=True)
class RunEnded:
    trials: int  # told in this run
    stopped: bool  # asked to stop (Ctrl-C, a budget) before its trials were done


Event = TrialFinished | NewBest | VendorMeasured | BudgetSpent | RunEnded


class Observer(Protocol):
    def notify(self, event: Event) -> None: ...


class Observers:
    """The subscribers of one session. An observer that raises is logged and kept: a
    broken view never stops a run (the study is what matters)."""

    def __init__(self) -> None:
        self._observers: list[Observer] = []

    def subscribe(self, observer: Observer) -> None:
        self._observers.append(observer)

    def notify(self, event: Event) -> None:
        for observer in list(self._observers):
            try:
                observer.notify(event)
            except Exception:
                log.exception("observer %r failed on %s", observer, type(event).__name__)


@dataclass
class RunLedger:
    """What this run did, heard from the session's events (the summary's `this_run`):
    its trials by outcome, those answered by the cache, the new bests, the vendor's
    timings, and whether it was stopped."""

    by_outcome: Counter[str] = field(default_factory=Counter)
    cached: int = 0
    new_bests: int = 0
    vendor_timings: int = 0
    stopped: bool = False
    budget_spent: str = ""  # why the applier's budget stopped the run ("" if it did not)

    def notify(self, event: Event) -> None:
        if isinstance(event, TrialFinished):
            self.by_outcome[STATUS_LABELS.get(event.record.status, event.record.status.value)] += 1
            self.cached += event.record.cached
        elif isinstance(event, NewBest):
            self.new_bests += 1
        elif isinstance(event, VendorMeasured):
            self.vendor_timings += 1
        elif isinstance(event, BudgetSpent):
            self.budget_spent = event.why
        elif isinstance(event, RunEnded):
            self.stopped = self.stopped or event.stopped

    def as_json(self) -> dict[str, Any]:
        return {"trials": sum(self.by_outcome.values()), "by_outcome": dict(self.by_outcome),
                "cached": self.cached, "new_bests": self.new_bests,
                "vendor_timings": self.vendor_timings, "stopped": self.stopped,
                "budget_spent": self.budget_spent}


@dataclass
class CallJournal:
    """Writes the applier's new LLM calls to the cache's journal (`peak-tune stats`) as
    each trial is stored and when the run ends, stopped or not (a stopped trial's calls
    cost too); `write` for the last ones, at close."""

    journal: LLMJournal
    applier: Applier
    study: str

    def notify(self, event: Event) -> None:
        if isinstance(event, TrialFinished | RunEnded):
            self.write()

    def write(self) -> None:
        self.journal.write(self.applier, self.study)
