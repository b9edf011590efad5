"""Evaluation in this process: builds on a thread pool, timings on one timer thread.

NVRTC and gcc release the GIL, so threads build in parallel. The one timer thread is
what keeps two kernels from ever being timed at once on the device. A job reaches the
timer when its build is done, not in the order submitted: one slow build (a large
unrolled kernel) must not leave the device idle while builds behind it are ready.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

from peak_tune.backends.base import Artifact
from peak_tune.core import Outcome
from peak_tune.errors import BuildOverBudget
from peak_tune.evaluation.pipeline import Pipeline
from peak_tune.executors.base import EvalJob, JobTimes, busy_by_worker

__all__ = ["LocalExecutor"]


class LocalExecutor:
    name = "local"

    def __init__(self, pipeline: Pipeline, build_workers: int) -> None:
        self.pipeline = pipeline
        self.build_workers = build_workers
        self._builds = (ThreadPoolExecutor(build_workers, thread_name_prefix="build")
                        if build_workers > 1 else None)
        self._timer = ThreadPoolExecutor(1, thread_name_prefix="timer")
        self._lock = threading.Lock()
        self._closed = False
        self.job_times: list[JobTimes] = []  # one per job evaluated

    @property
    def slots(self) -> int:
        """1 when builds run one at a time (the C backend: a compiler beside a CPU
        timing would disturb it); else enough for the builds to stay ahead."""
        return 1 if self.build_workers == 1 else 2 * self.build_workers

    def submit(self, job: EvalJob) -> Future[list[Outcome]]:
        """With one build worker (the C backend) the build runs on the timer thread, so
        it never overlaps a timing even when several trials are in flight (LLM applier).
        The returned future may be cancelled until its timing starts."""
        result: Future[list[Outcome]] = Future()
        times = _Clock(time.perf_counter())
        if self._builds is not None and any(
                self.pipeline.must_run(job.context, job.params, size) for size in job.sizes):
            build = self._builds.submit(self._compile, job, times)
            build.add_done_callback(lambda built: self._to_timer(job, built, result, times))
        else:
            self._to_timer(job, None, result, times)
        return result

    def busy_seconds(self) -> dict[str, float]:
        """Seconds the device spent validating and timing, over the jobs so far."""
        return busy_by_worker(self.job_times, ("local",))

    def evaluations_by_worker(self) -> dict[str, int]:
        return {"local": len(self.job_times)}

    def _compile(self, job: EvalJob, times: _Clock) -> Artifact:
        started = time.perf_counter()
        try:
            artifact = self.pipeline.compile(job.context, job.params, job.build_limit_s)
            times.compiled = not artifact.reused
            return artifact
        except BuildOverBudget:
            times.compiled = True  # it ran until stopped: its time counts in the median
            raise
        finally:
            times.built = time.perf_counter()
            times.build_s = times.built - started

    def _build_here(self, job: EvalJob, times: _Clock) -> Future[Artifact]:
        """The build of a job with one build worker, as a finished future (the timing
        that follows takes its result or its error, as from the build pool). No build
        budget here: a host backend's builds never overlap its timings, so a slow one
        holds up nothing but itself."""
        built: Future[Artifact] = Future()
        try:
            built.set_result(self._compile(replace(job, build_limit_s=0.0), times))
        except BaseException as exc:  # raised again where the timing takes it
            built.set_exception(exc)
        return built

    def _to_timer(self, job: EvalJob, build: Future[Artifact] | None,
                  result: Future[list[Outcome]], times: _Clock) -> None:
        with self._lock:  # not after close() has shut the timer down
            if not self._closed and not (build is not None and build.cancelled()):
                self._timer.submit(self._run, job, build, result, times)
                return
        result.cancel()

    def _run(self, job: EvalJob, build: Future[Artifact] | None,
             result: Future[list[Outcome]], times: _Clock) -> None:
        if not result.set_running_or_notify_cancel():
            return  # the trial was stopped while it waited
        if build is None and self._builds is None and any(
                self.pipeline.must_run(job.context, job.params, size) for size in job.sizes):
            build = self._build_here(job, times)  # on this thread, timed apart
        started = time.perf_counter()
        outcomes: list[Outcome] = []
        failure: BaseException | None = None
        try:
            outcomes = [self.pipeline.evaluate(job.context, job.params, size, cutoff,
                                               artifact=build)
                        for size, cutoff in zip(job.sizes, job.slow_cutoff_ms, strict=True)]
        except BaseException as exc:
            failure = exc
        ended = time.perf_counter()  # the times are in before the result is
        self.job_times.append(JobTimes(
            "local", ended - times.submitted, times.build_s,
            started - (times.built or times.submitted), ended - started, times.compiled,
            job.trial))
        if failure is not None:
            result.set_exception(failure)
        else:
            result.set_result(outcomes)

    def close(self) -> None:
        if self._builds is not None:  # builds still running hand their jobs over first
            self._builds.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            self._closed = True
        self._timer.shutdown(wait=True, cancel_futures=True)


@dataclass
class _Clock:
    """When a job was handed over and built (0: not on the build pool), how long its
    build took, and whether the compiler ran."""

    submitted: float
    built: float = 0.0
    build_s: float = 0.0
    compiled: bool = False
