"""The Observer seam: what a tuning session tells whoever watches it, as typed events.

The progress view, the batch runner and anything else that follows a run subscribe to
the session (TuneSession.subscribe) rather than reaching into it. Events arrive on the
session's own thread, a trial once the storage holds it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from peak_tune.search.trials import TrialRecord

__all__ = ["Event", "NewBest", "Observer", "Observers", "RunEnded", "TrialFinished",
           "VendorMeasured"]

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
class RunEnded:
    trials: int  # told in this run
    stopped: bool  # asked to stop (Ctrl-C, a budget) before its trials were done


Event = TrialFinished | NewBest | VendorMeasured | RunEnded


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
