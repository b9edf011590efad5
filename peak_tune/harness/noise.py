"""When a timing is too noisy to trust, and what is done about it.

A timing (the samples of one evaluation, a kernel's or the vendor's) is noisy when its
spread passes MAX_SPREAD: (max - min) / median of the samples, leaving out the slowest
when there are MIN_SAMPLES_TO_TRIM or more (one run interrupted by the OS moves no median
of five). A timing taken while the machine was busy with other work is noisy too, where
that is watched (the vendor's: `watch_load`): processes outside this one and its children
kept more than MAX_FOREIGN_CORES cores busy meanwhile. numpy's threaded BLAS on a 2-core
machine with one core taken reads 2 GFLOP/s at 256 where it does 160 alone, with a
spread that looks steady (0.38), and every ratio divides by it.

A noisy timing is measured again, up to REMEASURES times; the steadiest attempt is kept,
and if even that one is noisy the result is flagged (`Outcome.noisy`, the trial's `noisy`
attribute, the summary) and never cached as final.

Why these values: on the 2-core CPU machine, idle, kernels of 1-10 ms at 512 showed
spreads of 0.06-0.49 over 7 runs (slowest left out); under load a 64^3 kernel read
[0.05, 24.4, 21.5] ms (a median 400 times too slow) and numpy's threaded BLAS 0.3-0.9
GFLOP/s at 128-256 where it does 75 alone, with spreads up to 2449%.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from peak_tune.core import Measurement

__all__ = ["MAX_FOREIGN_CORES", "MAX_SPREAD", "MIN_SAMPLES_TO_TRIM", "REMEASURES",
           "ForeignLoad", "NoisePolicy", "Steady", "measure_steadily", "timing_spread"]

MAX_SPREAD = 0.5  # a timing whose spread passes this is noisy
REMEASURES = 2  # a noisy timing is measured this many times more before it is flagged
MIN_SAMPLES_TO_TRIM = 5  # from this many samples on, the slowest is left out of the spread
MAX_FOREIGN_CORES = 0.5  # other processes' CPU use (cores) past which a timing is noisy
_FOREIGN_MIN_WINDOW_S = 0.2  # shorter windows: /proc's 10 ms ticks say too little


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
    noisy: bool  # even the steadiest attempt was noisy
    remeasured: int  # attempts after the first
    busy_cores: float = 0.0  # other processes' CPU use during the kept attempt (watched)
    why: str = ""  # why the kept attempt is noisy ("" when it is not)


@dataclass(frozen=True)
class NoisePolicy:
    max_spread: float = MAX_SPREAD
    remeasures: int = REMEASURES
    max_foreign_cores: float = MAX_FOREIGN_CORES

    def why_noisy(self, measurement: Measurement, busy_cores: float = 0.0) -> str:
        """Why a timing is noisy, or "". A single run (a slow kernel timed once) carries
        no spread."""
        spread = timing_spread(measurement)
        if spread > self.max_spread:
            return f"spread {100 * spread:.0f}% > {100 * self.max_spread:.0f}%"
        if busy_cores > self.max_foreign_cores:
            return f"other processes kept {busy_cores:.2f} cores busy"
        return ""

    def is_noisy(self, measurement: Measurement) -> bool:
        return bool(self.why_noisy(measurement))

    @classmethod
    def off(cls) -> NoisePolicy:
        """Nothing is noisy, nothing measured again: for timings replayed from a
        recording, which answer the same however often they are asked."""
        return cls(max_spread=math.inf, remeasures=0, max_foreign_cores=math.inf)


def measure_steadily(measure: Callable[[], Measurement],
                     policy: NoisePolicy = NoisePolicy(), watch_load: bool = False) -> Steady:
    """`measure()` once, and again while it is noisy (up to `policy.remeasures` times);
    the first steady attempt, else the one with the smallest spread. With `watch_load`
    other processes' CPU use during each attempt counts too (ForeignLoad). Errors of
    any attempt propagate: a kernel that fails on a second run is as wrong as one that
    fails on the first."""
    attempts: list[Steady] = []
    while len(attempts) <= policy.remeasures:
        meter = ForeignLoad() if watch_load else None
        measurement = measure()
        busy = meter.cores() if meter is not None else 0.0
        why = policy.why_noisy(measurement, busy)
        attempts.append(Steady(measurement, bool(why), len(attempts), busy, why))
        if not why:
            return attempts[-1]
    kept = min(attempts, key=lambda a: (a.busy_cores > policy.max_foreign_cores,
                                        timing_spread(a.measurement)))
    return Steady(kept.measurement, True, len(attempts) - 1, kept.busy_cores, kept.why)


class ForeignLoad:
    """CPU time that processes other than this one and its descendants used since it was
    made, in cores (Linux /proc: all CPUs' busy time, hypervisor steal included, less
    this process tree's). 0 elsewhere. A window shorter than _FOREIGN_MIN_WINDOW_S (a
    vendor timing at 512 takes about 0.1 s) is waited out to it: /proc's 10 ms ticks
    say too little over less."""

    def __init__(self) -> None:
        self._started = time.monotonic()
        self._busy = _machine_busy_s()
        self._own = _own_tree_s()

    def cores(self) -> float:
        if self._busy is None or self._own is None:
            return 0.0
        short = _FOREIGN_MIN_WINDOW_S - (time.monotonic() - self._started)
        if short > 0:
            time.sleep(short)
        elapsed = time.monotonic() - self._started
        busy, own = _machine_busy_s(), _own_tree_s()
        if busy is None or own is None:
            return 0.0
        return max(0.0, (busy - self._busy) - (own - self._own)) / elapsed


def _ticks_s(ticks: int) -> float:
    return ticks / os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float | None:
    """Busy CPU seconds of all CPUs since boot: user, nice, system, irq, softirq, steal."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
    except (OSError, ValueError, IndexError):
        return None
    return _ticks_s(user + nice + system + irq + softirq + steal)


def _own_tree_s() -> float | None:
    """CPU seconds of this process, its live descendants and the children they waited
    for (utime, stime, cutime, cstime of each)."""
    try:
        parents: dict[int, int] = {}
        times: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue  # it ended meanwhile
            parents[int(entry.name)] = int(fields[1])
            times[int(entry.name)] = sum(int(f) for f in fields[11:15])
    except (OSError, ValueError, IndexError):
        return None
    tree, frontier = {os.getpid()}, [os.getpid()]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        tree.update(children)
        frontier.extend(children)
    return _ticks_s(sum(times.get(pid, 0) for pid in tree))
