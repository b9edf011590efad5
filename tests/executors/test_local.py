"""The local executor: builds on a pool, one timer thread fed in the order builds finish."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any, cast

import pytest

from peak_tune.backends.base import Artifact
from peak_tune.core import Outcome, ProblemSize, Status
from peak_tune.evaluation.pipeline import Pipeline
from peak_tune.executors.base import EvalJob, jobs_by_stage, time_report
from peak_tune.executors.local import LocalExecutor

SIZE = ProblemSize.of({"M": 8, "N": 8, "K": 8})


class SlowBuilds:
    """A pipeline whose builds take params["build_s"] and whose timings are recorded."""

    def __init__(self) -> None:
        self.timed: list[str] = []
        self.release = threading.Event()

    def must_run(self, context: Any, params: Mapping[str, int], size: ProblemSize) -> bool:
        return True

    def compile(self, context: Any, params: Mapping[str, int],
                time_limit_s: float = 0.0) -> Artifact:
        if params["build_s"] < 0:
            self.release.wait(10)  # held until the test lets it go
        time.sleep(max(params["build_s"], 0) / 1000)
        return Artifact(path=str(context), compile_key=str(context))

    def evaluate(self, context: Any, params: Mapping[str, int], size: ProblemSize,
                 slow_cutoff_ms: float = 0.0, artifact: Future[Artifact] | None = None
                 ) -> Outcome:
        assert artifact is not None and artifact.done()  # built before it is timed
        self.timed.append(str(context))
        return Outcome(Status.OK)


def job(name: str, build_ms: int) -> EvalJob:
    return EvalJob(context=cast(Any, name), params={"build_s": build_ms}, sizes=(SIZE,),
                   slow_cutoff_ms=(0.0,))


@pytest.fixture
def pipeline() -> SlowBuilds:
    return SlowBuilds()


def executor(pipeline: SlowBuilds) -> LocalExecutor:
    return LocalExecutor(cast(Pipeline, pipeline), build_workers=4)


def test_a_slow_build_does_not_hold_up_the_timings_of_ready_ones(pipeline):
    local = executor(pipeline)
    try:
        slow = local.submit(job("slow", -1))  # held until released
        quick = [local.submit(job(f"quick{i}", 1)) for i in range(3)]
        assert all(f.result(timeout=10)[0].status is Status.OK for f in quick)
        assert not slow.done()  # the device did not wait for it
        pipeline.release.set()
        assert slow.result(timeout=10)[0].status is Status.OK
        assert pipeline.timed[-1] == "slow" and len(pipeline.timed) == 4
    finally:
        pipeline.release.set()
        local.close()


def test_a_job_cancelled_while_it_builds_is_never_timed(pipeline):
    local = executor(pipeline)
    try:
        held = local.submit(job("held", -1))
        assert held.cancel()  # still building: the trial loop may stop it
        pipeline.release.set()
        later = local.submit(job("later", 1))
        assert later.result(timeout=10)[0].status is Status.OK
        assert pipeline.timed == ["later"]
    finally:
        pipeline.release.set()
        local.close()


def test_close_with_builds_in_flight_returns_and_times_nothing_more(pipeline):
    local = executor(pipeline)
    futures = [local.submit(job(f"j{i}", 200)) for i in range(12)]  # 3 rounds of 4 builds
    for f in futures:
        f.cancel()
    started = time.perf_counter()
    local.close()
    assert time.perf_counter() - started < 5
    assert pipeline.timed == []
    assert all(f.cancelled() for f in futures)


def test_each_job_reports_where_its_time_went(pipeline):
    local = executor(pipeline)
    try:
        done = [local.submit(job(f"j{i}", 50)) for i in range(3)]
        assert all(f.result(timeout=10) for f in done)
    finally:
        local.close()
    assert len(local.job_times) == 3
    for times in local.job_times:
        assert times.worker == "local" and times.build_s >= 0.05
        assert times.latency_s >= times.build_s + times.busy_s
    assert local.busy_seconds()["local"] == sum(t.busy_s for t in local.job_times)


def test_a_run_short_of_build_workers_shows_its_jobs_queued_for_them(pipeline):
    """Six 100 ms builds on two build workers: on average two jobs build and about as
    many wait for a worker (0, 0, 1, 1, 2 and 2 builds' time), and hardly any wait for
    the device."""
    local = LocalExecutor(cast(Pipeline, pipeline), build_workers=2)
    began = time.perf_counter()
    try:
        done = [local.submit(job(f"j{i}", 100)) for i in range(6)]
        assert all(f.result(timeout=10) for f in done)
    finally:
        local.close()
    stages = time_report(local, time.perf_counter() - began)["mean_jobs"]
    assert set(stages) == {"build_queue", "building", "device_queue", "on_device"}
    assert 1.0 <= stages["building"] <= 2.05  # never more than the two workers
    assert 0.5 <= stages["build_queue"] / stages["building"] <= 1.5
    assert stages["device_queue"] < 0.5 and stages["on_device"] < 0.5
    assert jobs_by_stage([], 1.0) == {}
