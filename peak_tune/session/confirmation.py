"""The end-of-run re-timing of the best trial beside the vendor.

The best of many noisy trials is their luckiest timing (a 1024 CPU study's best read 98.1
GFLOP/s where the exported kernel does 88.6 alone), so the summary prints this re-timing:
at every tuned size CONFIRM_ROUNDS rounds of a fresh, validated evaluation of the kernel,
then a timing of the vendor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from peak_tune.backends.base import Backend
from peak_tune.core import KernelContext, Measurement, ProblemSize, Status, geometric_mean
from peak_tune.errors import EvaluationError, InvalidPoint
from peak_tune.evaluation.cache import confirmation_key
from peak_tune.evaluation.pipeline import Pipeline, evaluate_built, outcome_of_error
from peak_tune.harness.noise import ForeignLoad
from peak_tune.harness.vendor import settle_own_processes
from peak_tune.session.vendor_book import VendorBook

__all__ = ["CONFIRM_ATTR", "CONFIRM_ROUNDS", "BestConfirmer", "Confirmation",
           "SizeConfirmation"]

log = logging.getLogger(__name__)

CONFIRM_ATTR = "confirmed_best"  # the study's user attribute: Confirmation.to_json()
CONFIRM_ROUNDS = 3  # rounds of kernel then vendor, each one steady evaluation of both


@dataclass(frozen=True)
class SizeConfirmation:
    """The best trial re-timed at one size, interleaved with the vendor: each round one
    fresh evaluation of the kernel (new secret inputs, validated), then one timing of
    the vendor, each measured steadily (harness.noise). Raw samples, per round."""

    status: Status  # OK, or how the kernel failed its re-validation
    message: str = ""
    flops: float = 0.0
    kernel_ms: tuple[tuple[float, ...], ...] = ()
    vendor_ms: tuple[tuple[float, ...], ...] = ()
    vendor_name: str = ""
    noisy_because: str = ""  # why the re-timing is noisy ("" when steady)
    busy_cores: float = 0.0  # other processes' CPU use during the rounds
    at: float = 0.0  # Unix time

    def _gflops(self, rounds: tuple[tuple[float, ...], ...]) -> float:
        samples = tuple(s for r in rounds for s in r)
        return Measurement(samples, self.flops).gflops if samples else 0.0

    @property
    def kernel_gflops(self) -> float:
        """The median over every round's samples."""
        return self._gflops(self.kernel_ms)

    @property
    def vendor_gflops(self) -> float:
        return self._gflops(self.vendor_ms)

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status.value, "message": self.message, "flops": self.flops,
                "kernel_ms": [list(r) for r in self.kernel_ms],
                "vendor_ms": [list(r) for r in self.vendor_ms],
                "vendor_name": self.vendor_name, "noisy_because": self.noisy_because,
                "busy_cores": self.busy_cores, "at": self.at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SizeConfirmation:
        return cls(Status(data["status"]), str(data["message"]), float(data["flops"]),
                   tuple(tuple(float(s) for s in r) for r in data["kernel_ms"]),
                   tuple(tuple(float(s) for s in r) for r in data["vendor_ms"]),
                   str(data["vendor_name"]), str(data["noisy_because"]),
                   float(data["busy_cores"]), float(data["at"]))


@dataclass(frozen=True)
class Confirmation:
    """The end-of-run re-timing of the best trial at every tuned size; `source`: timed
    by this run, or taken from the study (resumed, same best) or the cache."""

    trial: int
    context_hash: str
    params: dict[str, int]
    by_size: dict[str, SizeConfirmation]
    source: str = "timed"

    @property
    def failure(self) -> tuple[str, SizeConfirmation] | None:
        """(size, its record) where the kernel failed its re-validation, or None."""
        return next(((label, c) for label, c in self.by_size.items()
                     if c.status is not Status.OK), None)

    @property
    def noisy_because(self) -> str:
        return "; ".join(f"{label}: {c.noisy_because}" for label, c in self.by_size.items()
                         if c.noisy_because)

    @property
    def kernel_gflops(self) -> float:
        return geometric_mean([c.kernel_gflops for c in self.by_size.values()])

    @property
    def vendor_gflops(self) -> float:
        return geometric_mean([c.vendor_gflops for c in self.by_size.values()])

    def is_of(self, context_hash: str, params: Mapping[str, int], sizes: list[str]) -> bool:
        return (self.context_hash == context_hash and self.params == dict(params)
                and list(self.by_size) == sizes)

    def to_json(self) -> dict[str, Any]:
        return {"trial": self.trial, "context_hash": self.context_hash,
                "params": self.params, "rounds": CONFIRM_ROUNDS,
                "by_size": {label: c.to_json() for label, c in self.by_size.items()}}

    @classmethod
    def from_json(cls, data: Any, source: str) -> Confirmation | None:
        """The study attribute's confirmation; None for one unreadable or of other rounds."""
        try:
            if data["rounds"] != CONFIRM_ROUNDS:
                return None
            return cls(int(data["trial"]), str(data["context_hash"]), dict(data["params"]),
                       {str(k): SizeConfirmation.from_json(v)
                        for k, v in data["by_size"].items()}, source)
        except (KeyError, TypeError, ValueError):
            return None


class BestConfirmer:
    """Re-times a best trial's variant: `confirm`, and `note` saying why it did not."""

    def __init__(self, backend: Backend, pipeline: Pipeline, sizes: list[ProblemSize],
                 vendors: VendorBook, replay: bool) -> None:
        self._backend = backend
        self._pipeline = pipeline
        self._cache = pipeline.cache
        self._sizes = sizes
        self._vendors = vendors
        self._replay = replay
        self.note = "not re-timed: the run stopped before its end"

    def confirm(self, trial: int | None, context_hash: str, params: Mapping[str, int],
                held: Any) -> Confirmation | None:
        """The best trial (number `trial`, None: no finished trial) re-timed at every
        size: a fresh, uncached evaluation of its variant (validated on new secret
        inputs), then the vendor, CONFIRM_ROUNDS times (harness.noise re-measures each;
        the vendor's timings join its figure). `held` is the study's confirmation: a
        resumed study whose best is the one it holds re-times nothing, nor does a size the
        cache holds (a run answered by the cache); a noisy re-timing is flagged and not
        cached; a kernel that fails is reported."""
        context = self._cache.get_context(context_hash) if trial is not None else None
        if trial is None or context is None or self._replay:
            self.note = ("nothing to re-time: no finished trial" if trial is None
                         else "not re-timed: a replay" if context is not None
                         else "not re-timed: its variant is not in the cache")
            return None
        values = {p.name: params[p.name] for p in context.params}
        known = Confirmation.from_json(held, "study")
        labels = [s.label() for s in self._sizes]
        if known is not None and known.is_of(context.content_hash(), values, labels) and (
                not known.noisy_because):
            return replace(known, trial=trial)
        try:
            return self._confirmed(trial, context, values)
        except EvaluationError as exc:  # the vendor's timing: the kernel's are outcomes
            log.warning("re-timing the best trial: the vendor failed: %s", exc)
            self.note = f"not re-timed: timing the vendor failed: {exc}"
            return None
        finally:
            self._vendors.publish()  # the vendor's timings beside it joined its figure

    def _confirmed(self, trial: int, context: KernelContext, params: dict[str, int]
                   ) -> Confirmation:
        """The re-timing at every size: from the cache, else timed now (and cached)."""
        by_size: dict[str, SizeConfirmation] = {}
        timed = False
        dtype = self._pipeline.setup.dtype
        for size in self._sizes:
            key = confirmation_key(context.content_hash(), params, size.as_dict(), dtype,
                                   self._pipeline.vendor_key(size), CONFIRM_ROUNDS)
            stored = self._cache.get_confirmation(key)
            try:
                known = SizeConfirmation.from_json(stored) if stored else None
            except (KeyError, TypeError, ValueError):
                known = None  # a damaged entry is timed again
            if known is None:
                if not timed:
                    settle_own_processes()  # the builds and the study writer idle
                known, timed = self._retime_steadily(context, params, size), True
                if not known.noisy_because:
                    self._cache.put_confirmation(key, known.to_json())
            by_size[size.label()] = known
        return Confirmation(trial, context.content_hash(), params, by_size,
                            "timed" if timed else "cache")

    def _retime_steadily(self, context: KernelContext, params: dict[str, int],
                         size: ProblemSize) -> SizeConfirmation:
        """The re-timing at `size`, again while it is noisy (up to the noise policy's
        re-measures, as for any timing): the first steady one, else the last."""
        attempt = self._retime_at(context, params, size)
        for _ in range(self._pipeline.setup.noise.remeasures):
            if not attempt.noisy_because or attempt.status is not Status.OK:
                break
            log.info("re-timing the best at %s was noisy (%s): again", size.label(),
                     attempt.noisy_because)
            attempt = self._retime_at(context, params, size)
        return attempt

    def _retime_at(self, context: KernelContext, params: dict[str, int],
                   size: ProblemSize) -> SizeConfirmation:
        """CONFIRM_ROUNDS rounds of the kernel, then the vendor, at `size`."""
        setup = self._pipeline.setup
        policy = setup.noise
        meter, began = ForeignLoad(), time.time()
        try:
            artifact = self._backend.compile(context, params, setup.dtype,
                                             str(self._cache.builds))
        except (InvalidPoint, EvaluationError) as exc:
            failed = outcome_of_error(exc)
            return SizeConfirmation(failed.status, failed.message, at=began)
        artifact = self._pipeline.pinned(artifact)
        kernel: list[tuple[float, ...]] = []
        vendor: list[tuple[float, ...]] = []
        name, flops, noisy = "", 0.0, []
        for round_ in range(1, CONFIRM_ROUNDS + 1):
            outcome = evaluate_built(self._backend, setup, artifact, context, params, size,
                                     0.0)
            if outcome.status is not Status.OK or outcome.measurement is None:
                log.warning("the best trial failed its re-validation at %s (round %d): %s",
                            size.label(), round_, outcome.message)
                return SizeConfirmation(outcome.status, f"round {round_}: {outcome.message}",
                                        flops, tuple(kernel), tuple(vendor), name, at=began)
            kernel.append(outcome.measurement.samples_ms)
            flops = outcome.measurement.flops
            if outcome.noisy:
                noisy.append(f"kernel round {round_}: "
                             f"{policy.why_noisy(outcome.measurement) or 'spread'}")
            if not self._vendors.library:
                continue  # the documented peak: nothing to time beside the kernel
            name, timing = self._vendors.timing(size, "end-of-run re-timing")
            self._vendors.keep(size, name, timing)
            vendor.append(timing.samples_ms)
            if timing.noisy:
                noisy.append(f"vendor round {round_}: {timing.noisy_because}")
        busy = meter.cores()
        if busy > policy.max_foreign_cores:
            noisy.append(f"other processes kept {busy:.2f} cores busy")
        return SizeConfirmation(Status.OK, "", flops, tuple(kernel), tuple(vendor), name,
                                "; ".join(noisy), busy, began)
