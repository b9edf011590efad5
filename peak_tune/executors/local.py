"""Evaluation in this process: builds on a thread pool, timings on one timer thread.

NVRTC and gcc release the GIL, so threads build in parallel. The one timer thread is
what keeps two kernels from ever being timed at once on the device.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from peak_tune.backends.base import Artifact
from peak_tune.core import Outcome
from peak_tune.executors.base import EvalJob
from peak_tune.pipeline import Pipeline

__all__ = ["LocalExecutor"]


class LocalExecutor:
    name = "local"

    def __init__(self, pipeline: Pipeline, build_workers: int) -> None:
        self.pipeline = pipeline
        self.build_workers = build_workers
        self._builds = (ThreadPoolExecutor(build_workers, thread_name_prefix="build")
                        if build_workers > 1 else None)
        self._timer = ThreadPoolExecutor(1, thread_name_prefix="timer")

    @property
    def slots(self) -> int:
        """1 when builds run one at a time (the C backend: a compiler beside a CPU
        timing would disturb it); else enough for the builds to stay ahead."""
        return 1 if self.build_workers == 1 else 2 * self.build_workers

    def submit(self, job: EvalJob) -> Future[list[Outcome]]:
        """With one build worker (the C backend) the build runs on the timer thread, so
        it never overlaps a timing even when several trials are in flight (LLM applier)."""
        build: Future[Artifact] | None = None
        if self._builds is not None and any(
                self.pipeline.must_run(job.context, job.params, size) for size in job.sizes):
            build = self._builds.submit(self.pipeline.compile, job.context, job.params)
        return self._timer.submit(self._evaluate, job, build)

    def _evaluate(self, job: EvalJob, build: Future[Artifact] | None) -> list[Outcome]:
        return [self.pipeline.evaluate(job.context, job.params, size, cutoff, artifact=build)
                for size, cutoff in zip(job.sizes, job.slow_cutoff_ms, strict=True)]

    def close(self) -> None:
        self._timer.shutdown(wait=True, cancel_futures=True)
        if self._builds is not None:
            self._builds.shutdown(wait=True, cancel_futures=True)
