"""The Executor seam: the driver hands over points to evaluate and gets Outcomes back.

The driver alone asks and tells the study; an executor builds, validates and times. A
job is a plain frozen value, so that it can cross to another process or node.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from peak_tune.core import KernelContext, Outcome, ProblemSize

__all__ = ["EvalJob", "Executor", "JobTimes", "busy_by_worker", "jobs_by_stage", "time_report"]


@dataclass(frozen=True)
class JobTimes:
    """Where one job's time went: `latency_s` from handing it over to its result,
    `build_s` compiling, `waited_s` built but waiting for its device, `busy_s` on it;
    `compiled`: the compiler ran (not an identical build found on disk)."""

    worker: str
    latency_s: float
    build_s: float
    waited_s: float
    busy_s: float
    compiled: bool = False
    trial: int = -1  # the job's EvalJob.trial


def busy_by_worker(times: list[JobTimes], workers: tuple[str, ...] = ()) -> dict[str, float]:
    """Seconds each device worker spent validating and timing, over the jobs so far."""
    busy = dict.fromkeys(workers, 0.0)
    for job in list(times):
        busy[job.worker] = busy.get(job.worker, 0.0) + job.busy_s
    return busy


@dataclass(frozen=True)
class EvalJob:
    """One point: a variant and its parameter values, evaluated at each tuned size.

    A size whose first run is slower than its `slow_cutoff_ms` (0: none) is timed once.
    A build still running after `build_limit_s` (0: no limit) is stopped: the point is
    over the study's build budget.
    """

    context: KernelContext
    params: Mapping[str, int]
    sizes: tuple[ProblemSize, ...]
    slow_cutoff_ms: tuple[float, ...]
    build_limit_s: float = 0.0
    trial: int = -1  # the study's trial it evaluates (-1: none), named in its JobTimes


class Executor(Protocol):
    name: str
    job_times: list[JobTimes]  # one per job a device evaluated, as they finish

    @property
    def slots(self) -> int:
        """Jobs worth keeping in flight: enough to keep every device busy."""
        ...

    def submit(self, job: EvalJob) -> Future[list[Outcome]]:
        """Start evaluating; the future holds one Outcome per size, in order. Failures of
        the kernel are Outcomes; the future raises only for the run's own errors."""
        ...

    def busy_seconds(self) -> dict[str, float]:
        """Seconds each device worker spent validating and timing so far."""
        ...

    def evaluations_by_worker(self) -> dict[str, int]:
        """Jobs each device worker evaluated so far."""
        ...

    def close(self) -> None:
        """Wait for running jobs, cancel queued ones, release devices and workers."""
        ...


def time_report(executor: Executor, seconds: float) -> dict[str, Any]:
    """How busy each device was over `seconds`, the median job's times, how many jobs
    were in each stage on average (jobs_by_stage), and the builds (how many ran the
    compiler, their median, 95th percentile, longest and total seconds): what a
    benchmark prints to say what held a run back."""
    jobs = list(executor.job_times)
    builds = sorted(job.build_s for job in jobs if job.compiled)
    return {
        "device_busy_fraction": {name.rsplit("-", 1)[-1]: round(b / seconds, 2)
                                 for name, b in executor.busy_seconds().items()},
        "job_median_s": {part: round(statistics.median(getattr(j, part) for j in jobs), 3)
                         for part in ("latency_s", "build_s", "waited_s", "busy_s")}
        if jobs else {},
        "mean_jobs": jobs_by_stage(jobs, seconds),
        "builds": {"count": len(builds), "median_s": round(statistics.median(builds), 3),
                   "p95_s": round(builds[int(0.95 * (len(builds) - 1))], 3),
                   "max_s": round(builds[-1], 3), "total_s": round(sum(builds), 1)}
        if builds else {},
    }


def jobs_by_stage(jobs: list[JobTimes], seconds: float) -> dict[str, float]:
    """How many jobs were, on average over `seconds`, waiting for a build worker (with
    Ray, also on their way to a node), building, built and waiting for a device, and on
    one (Little's law: the seconds all jobs spent in a stage over the run's). A full
    window whose jobs sit in
    `build_queue` is bound by the compilers; one whose jobs sit in `device_queue`, by the
    devices; a window with few jobs in any stage, by the driver (asking, applying,
    telling)."""
    if not jobs or seconds <= 0:
        return {}
    total = {"build_queue": 0.0, "building": 0.0, "device_queue": 0.0, "on_device": 0.0}
    for job in jobs:
        total["build_queue"] += max(0.0, job.latency_s - job.build_s - job.waited_s - job.busy_s)
        total["building"] += job.build_s
        total["device_queue"] += job.waited_s
        total["on_device"] += job.busy_s
    return {stage: round(s / seconds, 2) for stage, s in total.items()}
