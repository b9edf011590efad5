"""When a timing is too noisy to trust, and what is done about it.

A timing (the samples of one evaluation, a kernel's or the vendor's) is noisy when its
spread passes MAX_SPREAD: (max - min) / median of the samples, leaving out the slowest
when there are MIN_SAMPLES_TO_TRIM or more (one run interrupted by the OS moves no median
of five). A noisy timing is measured again, up to REMEASURES times; the steadiest of the
attempts is kept, and if even that one is noisy the result is flagged (`Outcome.noisy`,
the trial's `noisy` attribute, the summary) and never cached as final.

Why these values: on the 2-core CPU machine, idle, kernels of 1-10 ms at 512 showed
spreads of 0.06-0.49 over 7 runs (slowest left out); under load a 64^3 kernel read
[0.05, 24.4, 21.5] ms (a median 400 times too slow) and numpy's threaded BLAS 0.3-0.9
GFLOP/s at 128-256 where it does 75 alone, with spreads up to 2449%.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from peak_tune.core import Measurement

__all__ = ["MAX_SPREAD", "MIN_SAMPLES_TO_TRIM", "REMEASURES", "NoisePolicy", "Steady",
           "measure_steadily", "timing_spread"]

MAX_SPREAD = 0.5  # a timing whose spread passes this is noisy
REMEASURES = 2  # a noisy timing is measured this many times more before it is flagged
MIN_SAMPLES_TO_TRIM = 5  # from this many samples on, the slowest is left out of the spread


def timing_spread(measurement: Measurement) -> float:
    """(max - min) / median of the samples, without the slowest of 5 or more."""
    ordered = sorted(measurement.samples_ms)
    if len(ordered) >= MIN_SAMPLES_TO_TRIM:
        ordered = ordered[:-1]
    median = measurement.median_ms
    if len(ordered) < 2 or median <= 0:
        return 0.0
    return (ordered[-1] - ordered[0]) / median


@dataclass(frozen=True)
class Steady:
    """The steadiest of the attempts at one timing."""

    measurement: Measurement
    noisy: bool  # even the steadiest attempt passed the threshold
    remeasured: int  # attempts after the first


@dataclass(frozen=True)
class NoisePolicy:
    max_spread: float = MAX_SPREAD
    remeasures: int = REMEASURES

    def is_noisy(self, measurement: Measurement) -> bool:
        """A single run (a slow kernel timed once) carries no spread: never noisy."""
        return timing_spread(measurement) > self.max_spread


def measure_steadily(measure: Callable[[], Measurement],
                     policy: NoisePolicy = NoisePolicy()) -> Steady:
    """`measure()` once, and again while it is noisy (up to `policy.remeasures` times);
    the attempt with the smallest spread. Errors of any attempt propagate: a kernel that
    fails on a second run is as wrong as one that fails on the first."""
    attempts = [measure()]
    while policy.is_noisy(attempts[-1]) and len(attempts) <= policy.remeasures:
        attempts.append(measure())
    steadiest = min(attempts, key=timing_spread)
    return Steady(steadiest, policy.is_noisy(steadiest), len(attempts) - 1)
