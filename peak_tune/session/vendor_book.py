"""The vendor's figures of one run: timed at the start (or taken from the study or the
cache), timed again on a schedule between trials, and what the best is measured against
(the vendor, else the device's roofline: its documented peak or memory bandwidth)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from peak_tune.backends.base import Backend
from peak_tune.catalog.roofline import Roofline, roofline
from peak_tune.core import Measurement, ProblemSize, Status, geometric_mean
from peak_tune.errors import EvaluationError, NoVendorLibrary
from peak_tune.evaluation.pipeline import Pipeline
from peak_tune.harness.noise import measure_steadily
from peak_tune.harness.vendor import (
    DEVICE_SCHEDULE,
    VENDOR_ATTR,
    VendorClock,
    VendorFigure,
    VendorSchedule,
    VendorStore,
    VendorTiming,
    load_average,
    settle_own_processes,
)
from peak_tune.search.trials import TrialRecord
from peak_tune.session.events import VendorMeasured

__all__ = ["VendorBook"]

log = logging.getLogger(__name__)

# what a trial ran on the device, for the re-timing schedule
_RAN = (Status.OK, Status.WRONG_RESULT, Status.RUNTIME_ERROR, Status.TIMEOUT)


class VendorBook:
    """`publish(attr, value)` keeps the figures in the study (its user attribute);
    `tell` hears of every timing."""

    def __init__(self, backend: Backend, pipeline: Pipeline, sizes: list[ProblemSize],
                 publish: Callable[[str, Any], None],
                 tell: Callable[[VendorMeasured], None] = lambda event: None) -> None:
        self._backend = backend
        self._pipeline = pipeline
        self._sizes = sizes
        self._publish_attr = publish
        self._tell = tell  # each timing, to the session's observers
        self._store = VendorStore(pipeline.cache.folder)
        self.chosen: dict[str, tuple[str, Measurement]] = {}  # size -> its chosen timing
        self.figures: dict[str, VendorFigure] = {}  # size -> every timing
        # kernels timed on this machine's CPU share it with everything else: the host's
        # schedule, and its load watched; a device's timings are neither moved by it
        self._on_host = backend.capabilities.on_host
        self.clock = VendorClock(VendorSchedule() if self._on_host else DEVICE_SCHEDULE)
        # False once the backend said the device has no vendor library (NoVendorLibrary):
        # the ratio is then to the documented peak (`denominator`), nothing is re-timed
        self.library = True
        self._roofline: Roofline | None = None
        self.no_library_because = ""

    def measure(self, held: Mapping[str, VendorFigure]) -> None:
        """The figure at every size: the study's own timings (`held`, a resumed study),
        else the cache's (an earlier run on this fingerprint: a run answered by the cache
        reports that run's ratio), else timed now by the backend's timer, once this run's
        helper processes have settled."""
        for size in self._sizes:
            label = size.label()
            known = held.get(label) or self._store.load(self._pipeline.vendor_key(size))
            if known is not None:
                self.figures[label] = known
        missing = [s for s in self._sizes if s.label() not in self.figures]
        if not missing:
            self.publish()
            return
        settle_own_processes()
        try:
            self.time(missing, "start")
        except NoVendorLibrary as exc:
            self.library, self.no_library_because = False, str(exc)
            log.info("no vendor library: %s", exc)

    def gflops(self) -> float:
        return geometric_mean([m.gflops for _, m in self.chosen.values()])

    def roofline(self) -> Roofline:
        """What the device can reach on this kernel at the study's sizes: its documented
        peak, or less where the kernel is bound by memory (catalog.roofline)."""
        if self._roofline is None:  # fixed for the run; asked after every trial
            setup = self._pipeline.setup
            self._roofline = roofline(setup.device, setup.spec, setup.dtype, self._sizes)
        return self._roofline

    def peak_gflops(self) -> float:
        """The roofline's attainable GFLOP/s (0: the profile documents nothing)."""
        return self.roofline().gflops

    def denominator(self) -> tuple[str, float]:
        """What the best is measured against: ("vendor", its figure) where the device has
        a vendor library, else ("peak", the roofline: the documented peak, or the memory
        bandwidth's share for a memory-bound kernel) as the PEAK paper did for its Adreno
        GPU, else ("", 0.0): GFLOP/s alone (lavapipe documents no peak)."""
        vendor = self.gflops()
        if vendor > 0:
            return "vendor", vendor
        peak = self.peak_gflops()
        return ("peak", peak) if peak > 0 and not self.library else ("", 0.0)

    def retime_if_due(self, record: TrialRecord, noisy: bool) -> None:
        """After a trial is told: time the vendor again when the schedule says so (every
        so many timed trials or seconds, or the run's conditions changed)."""
        self.clock.saw_trial(record.status in _RAN and not record.cached, noisy)
        reason = self.clock.due()
        if reason is None or not self.figures:
            return
        try:
            self.time(self._sizes, reason)
        except EvaluationError as exc:  # the figure so far stands; the next one may do
            log.warning("timing the vendor again (%s) failed: %s", reason, exc)
            self.clock.timed_vendor()

    def time(self, sizes: list[ProblemSize], reason: str) -> None:
        """Time the vendor at `sizes` (a noisy timing again, see harness.noise); keep
        the timing in the study, and its steady figure in the cache."""
        for size in sizes:
            self.keep(size, *self.timing(size, reason))
        self.clock.timed_vendor()
        self.publish()

    def keep(self, size: ProblemSize, name: str, timing: VendorTiming) -> None:
        """Add a timing to the vendor's figure at `size`; a steady one to the cache's."""
        label = size.label()
        figure = self.figures.get(label, VendorFigure(name))
        self.figures[label] = figure = figure.adding(timing, name)
        log.info("vendor at %s (%s): %.2f GFLOP/s, figure %.2f over %d timings%s",
                 label, timing.reason, timing.gflops, figure.gflops, len(figure.timings),
                 " (noisy)" if timing.noisy else "")
        if not timing.noisy:
            self._store.save(self._pipeline.vendor_key(size), figure.steady_part())
        self._tell(VendorMeasured(label, name, timing.gflops, timing.reason, timing.noisy))

    def timing(self, size: ProblemSize, reason: str) -> tuple[str, VendorTiming]:
        """(vendor name, the steadiest of its timings at `size`)."""
        setup = self._pipeline.setup
        names: list[str] = []

        def once() -> Measurement:
            name, measurement = self._backend.time_vendor(setup.spec, setup.dtype, size,
                                                          setup.eval_config)
            names.append(name)
            return measurement

        steady = measure_steadily(once, setup.noise, watch_load=self._on_host)
        return names[-1], VendorTiming(
            steady.measurement.samples_ms, steady.measurement.flops, time.time(),
            load_average(), reason, steady.why, steady.remeasured, steady.busy_cores)

    def publish(self) -> None:
        """The chosen timing per size for the summary and progress; the figures into the
        study."""
        self.chosen = {}
        for label, figure in self.figures.items():
            chosen = figure.chosen()
            if chosen is not None:
                self.chosen[label] = (figure.name, chosen.measurement)
        self._publish_attr(VENDOR_ATTR, {label: f.to_json()
                                         for label, f in self.figures.items()})
