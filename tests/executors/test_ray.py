"""The Ray executor on a local Ray (CPU only, 2 CPUs): the C backend over device workers,
a worker killed mid-study, a driver killed and resumed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from peak_tune.backends.base import EvalConfig
from peak_tune.catalog.resolve import Catalog
from peak_tune.core import Outcome, ProblemSize, Status
from peak_tune.evaluation.pipeline import PipelineSetup, seed_context
from peak_tune.executors.base import EvalJob
from peak_tune.executors.ray import NAMESPACE, RayExecutor, RaySettings, build_variant
from peak_tune.session.config import TuneConfig
from peak_tune.session.tune import TuneSession, open_session
from tests.nvrtc import needs_nvrtc

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SIZE = {"M": 64, "N": 64, "K": 64}


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             namespace="peak-tune")
    yield
    ray.shutdown()


def ray_session(results: Path, **over: object) -> TuneSession:
    settings: dict = {"sizes": (SIZE,), "results": results, "executor": "ray",
                      "ray_workers": 2, "eval_config": EvalConfig(repeats=3), **over}
    config = TuneConfig.of(**settings)
    return open_session(config)


def slow_job(session: TuneSession) -> EvalJob:
    """The seed at 1024^3: several seconds of validation and timing, time to kill its worker."""
    return EvalJob(session.pipeline.seed, {}, (ProblemSize.of({"M": 1024, "N": 1024, "K": 1024}),),
                   (0.0,))


def killed_under(executor: RayExecutor, job: EvalJob) -> Future[list[Outcome]]:
    """Submit `job`, then kill its (only) worker while it runs; Ray restarts the worker."""
    pending = executor.submit(job)
    time.sleep(1.5)  # compiled and running: the naive kernel takes seconds at this size
    ray.kill(ray.get_actor(executor.worker_names[0], namespace=NAMESPACE), no_restart=False)
    return pending


def states(session: TuneSession) -> list[optuna.trial.TrialState]:
    stored = optuna.load_study(study_name=session.study.study_name,
                               storage=session.storage_url)
    return [t.state for t in stored.trials]


def test_c_backend_spreads_over_device_workers(local_ray: None, tmp_path: Path) -> None:
    session = ray_session(tmp_path)
    try:
        session.measure_vendor()
        records = []
        session.run(10, records.append)
        evaluations = dict(session.executor.evaluations)  # type: ignore[attr-defined]
        busy = session.executor.busy_seconds()  # type: ignore[attr-defined]
        started = time.perf_counter()
        session.run(3, records.append)
        busy_after = session.executor.busy_seconds()  # type: ignore[attr-defined]
        ran_for = time.perf_counter() - started
    finally:
        session.close()
    assert session.tell_as_finished  # auto on Ray: no trial waits behind a slower one
    assert len(records) == 13 and len({r.number for r in records}) == 13
    assert len(evaluations) == 2
    assert all(count > 0 for count in evaluations.values())
    assert set(busy) == set(evaluations) and all(b > 0 for b in busy.values())
    assert 0 < sum(busy_after.values()) - sum(busy.values()) <= 2 * ran_for
    assert any(r.status is Status.OK and r.gflops > 0 for r in records)
    assert optuna.trial.TrialState.RUNNING not in states(session)
    assert len(states(session)) == 13


def test_a_job_lost_with_its_worker_runs_again_on_the_restarted_worker(
        local_ray: None, tmp_path: Path) -> None:
    session = ray_session(tmp_path, ray_workers=1)
    try:
        executor = session.executor
        assert isinstance(executor, RayExecutor)
        job = slow_job(session)
        outcome = killed_under(executor, job).result(timeout=300)[0]
        assert executor.lost >= 1
        assert outcome.status is Status.OK and not outcome.cached
    finally:
        session.close()


def test_a_job_lost_too_often_fails_as_a_crash_and_is_not_cached(
        local_ray: None, tmp_path: Path) -> None:
    session = open_session(TuneConfig.of(sizes=(SIZE,), results=tmp_path, executor="local"))
    executor = RayExecutor(RaySettings(workers=1, retries_on_loss=0), session.pipeline, "c")
    try:
        job = slow_job(session)
        lost = killed_under(executor, job).result(timeout=120)[0]
        assert lost.status is Status.RUNTIME_ERROR
        assert "evaluation worker lost" in lost.message
        again = executor.submit(job).result(timeout=300)[0]  # restarted, and not cached
        assert again.status is Status.OK and not again.cached
    finally:
        executor.close()
        session.close()


def test_a_study_goes_on_when_a_worker_is_killed_mid_run(local_ray: None,
                                                         tmp_path: Path) -> None:
    session = ray_session(tmp_path)
    records: list = []

    def kill_after_three() -> None:
        while len(records) < 3:
            time.sleep(0.05)
        executor = session.executor
        assert isinstance(executor, RayExecutor)
        ray.kill(ray.get_actor(executor.worker_names[1], namespace=NAMESPACE),
                 no_restart=False)

    killer = threading.Thread(target=kill_after_three)
    killer.start()
    try:
        session.measure_vendor()
        session.run(12, records.append)
    finally:
        killer.join()
        session.close()
    assert len(records) == 12
    lost = [r.message for r in records if r.status is Status.RUNTIME_ERROR]
    assert not lost  # the job the killed worker held ran again
    assert sum(r.status is Status.OK for r in records) >= 6
    assert optuna.trial.TrialState.RUNNING not in states(session)


def test_a_killed_driver_resumes_without_repeating_finished_trials(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "peak_tune.cli", "--executor", "ray", "--ray-workers",
               "1", "--size", "64", "--repeats", "3", "--results", str(tmp_path),
               "--study", "resumable", "--json"]
    storage = f"sqlite:///{tmp_path}/peak.db"
    driver = subprocess.Popen([*command, "--trials", "200"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    finished = 0
    while time.monotonic() < deadline and finished < 5:
        time.sleep(1)
        try:
            finished = len(optuna.load_study(study_name="resumable", storage=storage).trials)
        except Exception:  # not created yet
            continue
    os.killpg(driver.pid, signal.SIGKILL)  # the driver and its Ray, at once
    driver.wait()
    before = optuna.load_study(study_name="resumable", storage=storage).trials
    assert len(before) >= 5
    assert all(t.state is not optuna.trial.TrialState.RUNNING for t in before)
    resumed = subprocess.run([*command, "--trials", str(len(before) + 3)],  # 3 more
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    after = optuna.load_study(study_name="resumable", storage=storage).trials
    assert len(after) == len(before) + 3
    assert [t.params for t in after[:len(before)]] == [t.params for t in before]


def test_variants_built_on_cpu_workers_are_shipped_to_the_device_worker(
        local_ray: None, tmp_path: Path) -> None:
    session = open_session(TuneConfig.of(sizes=(SIZE,), results=tmp_path, executor="local"))
    executor = RayExecutor(RaySettings(workers=1, build_on="cpu"), session.pipeline, "c")
    try:
        variant = session.pipeline.build(["loop-interchange"])[-1]
        job = EvalJob(variant, {}, tuple(session.sizes), (0.0,))
        (outcome,) = executor.submit(job).result(timeout=300)
        assert outcome.status is Status.OK and outcome.gflops > 0
        assert session.cache.counters.compiles == 1  # built once, by the CPU task
        (again,) = executor.submit(job).result(timeout=60)
        assert again.cached  # the driver stored it
    finally:
        executor.close()
        session.close()


@needs_nvrtc
def test_a_cuda_variant_builds_without_a_gpu_into_one_shippable_cubin() -> None:
    catalog = Catalog.with_user_folders()
    spec = catalog.spec("matmul")
    setup = PipelineSetup(spec, "float16", catalog.device("h200"), {}, EvalConfig())
    built = build_variant("cuda", setup, EvalJob(seed_context(spec, "cuda"), {}, (), ()))
    assert built.failed is None and built.artifact is not None
    assert built.payload[:4] == b"\x7fELF"  # the cubin itself travels, not a path
    broken = replace(seed_context(spec, "cuda"), source="extern \"C\" __global__ void matmul(")
    failed = build_variant("cuda", setup, EvalJob(broken, {}, (), ()))
    assert failed.artifact is None and failed.failed is not None
    assert failed.failed.status is Status.COMPILE_ERROR


def test_a_stopped_run_leaves_its_late_results_in_the_cache_and_nothing_failing(
        local_ray: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    crashed: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: crashed.append(args.exc_value))
    session = ray_session(tmp_path, ray_workers=1)

    class Stop(Exception):
        pass

    def stop_at_first(record: object) -> None:
        raise Stop

    try:
        session.measure_vendor()
        with pytest.raises(Stop):
            session.run(6, stop_at_first)
        time.sleep(3)  # the job still in flight comes back to a cancelled trial
        handled = sum(session.executor.evaluations.values())  # type: ignore[attr-defined]
        again: list[object] = []
        session.run(1, again.append)  # the executor still serves the next run
    finally:
        session.close()
    assert crashed == []
    assert handled == 2  # the first trial's and the late one's, kept for the cache
    assert len(again) == 1
    assert optuna.trial.TrialState.RUNNING not in states(session)
