"""The vendor baseline through a run: when it is timed, what its figure is, where it lives.

The vendor library is timed by the backend's own timer, like the kernels, and between
them: at the start (once the tuner's own helper processes have settled), after the first
few timed trials, then every `VendorSchedule.every` timed trials or `every_s` seconds,
and whenever the run's conditions change (the load average moved, or a trial came back
noisy). On a GPU (`DEVICE_SCHEDULE`) by the clock and on noise alone: the host's load
does not move a device timing, and at 4096 a study times thousands of trials. Each
timing is kept (its samples, when, the load then, whether it was noisy);
the figure at a size is the median timing of the steady ones (`VendorFigure.chosen`).

The figure is stored in the study (user attribute VENDOR_ATTR), so a resumed study
reports the same ratio for the same kernel, and its steady timings in the cache
(VendorStore, keyed like a kernel's evaluation), so a new study whose evaluations all come
from the cache reports the ratio of the run that timed them. A run that times nothing
(everything cached) times no vendor either.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from peak_tune.atomic_files import write_json_atomically
from peak_tune.core import Measurement
from peak_tune.harness.noise import timing_spread

__all__ = ["DEVICE_SCHEDULE", "MAX_TIMINGS", "VENDOR_ATTR", "VendorClock", "VendorFigure",
           "VendorSchedule", "VendorStore", "VendorTiming", "figures_from_json", "load_average",
           "settle_own_processes"]

_log = logging.getLogger(__name__)

VENDOR_ATTR = "vendor"  # the study's user attribute: size label -> VendorFigure.to_json()
MAX_TIMINGS = 48  # timings kept per size (the newest)
_SETTLE_WINDOW_S = 0.1
_SETTLE_BUSY_S = 0.02  # children's CPU seconds per window below which they count as idle
_SETTLE_MAX_S = 5.0


@dataclass(frozen=True)
class VendorTiming:
    """One timing of the vendor at one size (the steadiest of its attempts)."""

    samples_ms: tuple[float, ...]
    flops: float
    at: float  # Unix time
    load: float  # the 1-minute load average then
    reason: str  # why it was timed: "start", "every 25 timed trials", "load 0.3 -> 1.9"
    noisy_because: str = ""  # why it is noisy (harness.noise), "" when steady
    remeasured: int = 0
    busy_cores: float = 0.0  # other processes' CPU use while it ran

    @property
    def noisy(self) -> bool:
        return bool(self.noisy_because)

    @property
    def measurement(self) -> Measurement:
        return Measurement(self.samples_ms, self.flops)

    @property
    def gflops(self) -> float:
        return self.measurement.gflops

    def to_json(self) -> dict[str, Any]:
        return {"samples_ms": list(self.samples_ms), "flops": self.flops, "at": self.at,
                "load": self.load, "reason": self.reason, "noisy": self.noisy_because,
                "remeasured": self.remeasured, "busy_cores": self.busy_cores}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VendorTiming:
        return cls(tuple(float(s) for s in data["samples_ms"]), float(data["flops"]),
                   float(data["at"]), float(data["load"]), str(data["reason"]),
                   str(data.get("noisy", "")), int(data.get("remeasured", 0)),
                   float(data.get("busy_cores", 0.0)))


@dataclass(frozen=True)
class VendorFigure:
    """Every timing of the vendor at one size that this study (or cache entry) holds."""

    name: str  # e.g. "numpy (openblas 0.3.31)"
    timings: tuple[VendorTiming, ...] = ()

    @property
    def steady(self) -> tuple[VendorTiming, ...]:
        return tuple(t for t in self.timings if not t.noisy)

    @property
    def noisy(self) -> bool:
        """No timing was steady: the figure is a noisy one."""
        return bool(self.timings) and not self.steady

    def chosen(self) -> VendorTiming | None:
        """The median timing (the lower of two middle ones) of the steady timings, or of
        all of them when none was steady."""
        pool = sorted(self.steady or self.timings, key=lambda t: t.gflops)
        return pool[(len(pool) - 1) // 2] if pool else None

    @property
    def gflops(self) -> float:
        chosen = self.chosen()
        return chosen.gflops if chosen else 0.0

    def adding(self, timing: VendorTiming, name: str) -> VendorFigure:
        return VendorFigure(name, (*self.timings, timing)[-MAX_TIMINGS:])

    def steady_part(self) -> VendorFigure:
        """What may be cached: the noisy timings left out."""
        return replace(self, timings=self.steady)

    def stability(self, since: float = 0.0) -> dict[str, Any]:
        """How stable the vendor was: timings (those at or after `since` counted apart),
        min/median/max GFLOP/s over the steady timings (all when none was; the median is
        the chosen timing's), the spread between them, and the chosen one's own spread."""
        pool = [t.gflops for t in (self.steady or self.timings)]
        chosen = self.chosen()
        median = chosen.gflops if chosen else 0.0
        return {
            "timings": len(self.timings),
            "this_run": sum(t.at >= since for t in self.timings),
            "noisy_timings": len(self.timings) - len(self.steady),
            "remeasured": sum(t.remeasured for t in self.timings),
            "min_gflops": min(pool, default=0.0),
            "median_gflops": median,
            "max_gflops": max(pool, default=0.0),
            "spread": (max(pool) - min(pool)) / median if median else 0.0,
            "sample_spread": timing_spread(chosen.measurement) if chosen else 0.0,
            "busy_cores": chosen.busy_cores if chosen else 0.0,  # other processes' CPU use
            "noisy": self.noisy,
            "noisy_because": chosen.noisy_because if chosen else "",
        }

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "timings": [t.to_json() for t in self.timings]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VendorFigure:
        return cls(str(data["name"]),
                   tuple(VendorTiming.from_json(t) for t in data["timings"]))


def figures_from_json(data: Any) -> dict[str, VendorFigure]:
    """The study attribute's figures; those of another shape (an older peak-tune) are
    left out, with a log line, and timed again."""
    figures: dict[str, VendorFigure] = {}
    if not isinstance(data, dict):
        return figures
    for label, value in data.items():
        try:
            figures[str(label)] = VendorFigure.from_json(value)
        except (KeyError, TypeError, ValueError) as exc:
            _log.warning("vendor figure at %s in the study is unreadable (%s): timed again",
                         label, exc)
    return {label: f for label, f in figures.items() if f.timings}


@dataclass(frozen=True)
class VendorSchedule:
    """When the vendor is timed again. "Timed trials" are trials of this run that ran a
    kernel (not answered by the cache); a run that times none never re-times."""

    early: tuple[int, ...] = (1, 3, 10)  # after this many timed trials
    every: int = 25  # then every this many timed trials
    every_s: float = 120.0  # or after this many seconds, if a trial was timed meanwhile
    load_step: float = 0.75  # or when the 1-minute load average moved this much
    min_gap: int = 10  # timed trials between two timings started by load or noise


# A GPU's vendor timing: on the H200 (2026-12-05, fp16 4096) a 150 s study timed cuBLAS
# 47 times by the host's schedule (every 25 timed trials), on the driver's path while the
# device waited; what drifts on a GPU is its clock and temperature, over seconds, not
# per trial, and the host's load (its compilers) does not move a device timing.
DEVICE_SCHEDULE = VendorSchedule(early=(1, 10), every=500, every_s=30.0,
                                 load_step=math.inf, min_gap=50)


class VendorClock:
    """What the schedule needs to know: timed trials, the last timing's time and load."""

    def __init__(self, schedule: VendorSchedule = VendorSchedule()) -> None:
        self.schedule = schedule
        self.timed = 0  # timed trials this run
        self.timings = 0  # vendor timings this run
        self._timed_at_last = 0
        self._last_at = time.monotonic()
        self._last_load = load_average()
        self._noisy_since_last = False

    def saw_trial(self, timed: bool, noisy: bool) -> None:
        self.timed += timed
        self._noisy_since_last |= noisy

    def due(self) -> str | None:
        """Why the vendor should be timed now, or None."""
        s, since = self.schedule, self.timed - self._timed_at_last
        if since == 0:
            return None
        if self.timed in s.early:
            return f"after {self.timed} timed trial{'s' if self.timed > 1 else ''}"
        if since >= s.every:
            return f"every {s.every} timed trials"
        if time.monotonic() - self._last_at >= s.every_s:
            return f"every {s.every_s:g} s"
        if since < s.min_gap:
            return None
        load = load_average()
        if abs(load - self._last_load) >= s.load_step:
            return f"load {self._last_load:.2f} -> {load:.2f}"
        if self._noisy_since_last:
            return "a noisy trial"
        return None

    def timed_vendor(self) -> None:
        self.timings += 1
        self._timed_at_last = self.timed
        self._last_at = time.monotonic()
        self._last_load = load_average()
        self._noisy_since_last = False


@dataclass(frozen=True)
class VendorStore:
    """The vendor's steady timings in the results folder's cache (<cache>/vendor/)."""

    cache_folder: Path

    def _path(self, key: str) -> Path:
        return self.cache_folder / "vendor" / key[:2] / f"{key}.json"

    def load(self, key: str) -> VendorFigure | None:
        try:
            figure = VendorFigure.from_json(json.loads(self._path(key).read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return None  # a damaged entry is a miss; it is rewritten
        return figure if figure.timings else None

    def save(self, key: str, figure: VendorFigure) -> None:
        path = self._path(key)
        write_json_atomically(path, figure.to_json(), f"writing the vendor's timings to {path}")


def load_average() -> float:
    """The 1-minute load average (0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return 0.0


def settle_own_processes(max_wait_s: float = _SETTLE_MAX_S) -> float:
    """Wait (at most `max_wait_s`) until this process's children (the study writer, the
    sampler, workers) are idle: a timing beside their start-up work measures that work.
    Returns the seconds waited; returns at once where /proc lists no children."""
    started = time.monotonic()
    before = _children_cpu_s()
    if before is None:
        return 0.0
    while time.monotonic() - started < max_wait_s:
        time.sleep(_SETTLE_WINDOW_S)
        after = _children_cpu_s() or 0.0
        if after - before < _SETTLE_BUSY_S:
            break
        before = after
    return time.monotonic() - started


def _children_cpu_s() -> float | None:
    """CPU seconds used so far by this process's children (Linux), None elsewhere."""
    tasks = Path(f"/proc/{os.getpid()}/task")
    try:
        pids = {int(p) for f in tasks.glob("*/children") for p in f.read_text().split()}
    except (OSError, ValueError):
        return None
    if not tasks.is_dir():
        return None
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, ValueError, IndexError):
            continue  # it ended meanwhile
    return ticks / os.sysconf("SC_CLK_TCK")
