"""The vendor baseline and noisy timings as a user sees them: the same ratio from a
resumed or cached run, noisy timings flagged and never cached, a sane CPU peak, and the
vendor's figure kept in the study. Real C backend, real timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optuna
import pytest

from peak_tune.backends.c import CBackend
from peak_tune.catalog.resolve import Catalog
from peak_tune.core import Measurement, ProblemSize
from peak_tune.errors import WrongResult
from peak_tune.harness.noise import NoisePolicy, measure_steadily, timing_spread
from peak_tune.harness.vendor import VENDOR_ATTR, VendorClock, VendorFigure, VendorSchedule
from tests.instant_backend import InstantCudaBackend
from tests.user_kernels import SLEEPY_C, one_seed_catalog

SMALL = ["--size", "64", "--repeats", "3"]



def peak(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "peak_tune.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ))


def last_json(done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def vendor_entries(results: Path) -> list[Path]:
    return [p for p in (results / "cache" / "vendor").rglob("*.json")]


def test_resumed_and_cached_runs_print_the_same_ratio(tmp_path):
    args = ["--trials", "3", *SMALL, "--json", "--results", str(tmp_path)]
    first = last_json(peak(*args))
    assert first["vendor"]["timings_this_run"] >= 1  # timed in this run, not taken on trust

    resumed = last_json(peak("--trials", "0", "--study", first["study"], *args[2:]))
    assert resumed["study"] == first["study"]
    if first["confirmation"]["status"] == "confirmed":  # a noisy one is re-timed, not kept
        assert resumed["vendor"]["timings_this_run"] == 0  # nothing timed: nothing re-timed
        assert resumed["vendor"]["gflops"] == first["vendor"]["gflops"]
        assert resumed["ratio"] == first["ratio"]

    cached_vendor = vendor_entries(tmp_path)
    again = last_json(peak(*args))  # a new study; its points are in the cache
    assert again["study"] != first["study"]
    if first["vendor"]["noisy"]:  # a noisy vendor figure is never cached: timed again
        assert not cached_vendor
        assert again["vendor"]["timings_this_run"] >= 1
    elif first["trials"]["noisy"] == 0:  # everything cached: the same figures, the same ratio
        assert again["cache"]["compiles"] == 0
        assert again["vendor"]["timings_this_run"] == 0
        assert again["vendor"]["gflops"] == first["vendor"]["gflops"]
        assert again["ratio"] == first["ratio"]


def test_the_vendor_figure_is_in_the_study(tmp_path):
    data = last_json(peak("--trials", "2", *SMALL, "--json", "--results", str(tmp_path)))
    study = optuna.load_study(study_name=data["study"],
                              storage=f"sqlite:///{tmp_path}/peak.db")
    stored = study.user_attrs[VENDOR_ATTR]["64x64x64"]
    figure = VendorFigure.from_json(stored)
    assert figure.name == data["vendor"]["name"]
    assert figure.timings and all(len(t.samples_ms) >= 1 for t in figure.timings)
    assert figure.timings[0].reason == "start"
    assert figure.gflops == pytest.approx(data["vendor"]["gflops"])
    stability = data["vendor"]["by_size"]["64x64x64"]
    assert stability["timings"] == len(figure.timings)
    assert stability["min_gflops"] <= stability["median_gflops"] <= stability["max_gflops"]




def test_a_noisy_kernel_is_flagged_and_not_cached(tmp_path):
    catalog = one_seed_catalog(tmp_path / "catalog", "sleepy", SLEEPY_C)
    results = tmp_path / "results"
    args = ["--kernel", "sleepy", "--catalog", str(catalog), "--size", "32", "--trials", "1",
            "--json", "--results", str(results)]
    done = peak(*args)
    data = last_json(done)
    assert data["trials"]["complete"] == 1
    assert data["trials"]["noisy"] == 1 and data["best"]["noisy"]
    assert data["trials"]["remeasured"] == NoisePolicy().remeasures  # measured 3 times
    assert data["ratio_noisy"]
    assert "noisy" in done.stderr  # the summary table says so too
    study = optuna.load_study(study_name=data["study"], storage=f"sqlite:///{results}/peak.db")
    assert study.trials[0].user_attrs["noisy"] is True
    assert not list((results / "cache" / "evaluations").rglob("*.json"))  # not cached

    again = last_json(peak(*args))  # measured again, never answered from the cache
    assert again["trials"]["noisy"] == 1 and again["trials"]["remeasured"] >= 1
    assert not list((results / "cache" / "evaluations").rglob("*.json"))


def test_a_busy_machine_flags_the_vendor_and_keeps_it_out_of_the_cache(tmp_path):
    """Two processes spinning beside the tuner (both cores of the CI machine): the
    vendor's timing is noisy, says why, and is not cached as the vendor's figure."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(max(2, os.cpu_count() or 1))]
    try:
        time.sleep(0.3)
        done = peak("--trials", "0", "--size", "128", "--json", "--results", str(tmp_path))
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    data = last_json(done)
    stability = data["vendor"]["by_size"]["128x128x128"]
    assert data["vendor"]["noisy"] and data["ratio_noisy"] is not None
    assert stability["noisy_timings"] == stability["timings"] == 1
    assert stability["remeasured"] == NoisePolicy().remeasures
    assert stability["noisy_because"]
    assert "NOISY" in done.stderr
    assert not vendor_entries(tmp_path)


def test_the_cpu_peak_is_above_numpy_and_below_an_absurd_bound():
    backend = CBackend(Catalog.with_user_folders().device("cpu"))
    try:
        profile = backend.probe()
    finally:
        backend.close()
    peak32, peak64 = profile.peak_gflops["float32"], profile.peak_gflops["float64"]
    a = np.random.default_rng(0).random((512, 512), dtype=np.float32)
    best_s = min(_seconds(lambda: a @ a) for _ in range(20))
    numpy_gflops = 2 * 512**3 / best_s / 1e9
    cores = os.cpu_count() or 1
    assert numpy_gflops < peak32 < 1000 * cores  # no core does 1 TFLOP/s in fp32
    assert peak64 == pytest.approx(peak32 / 2)
    assert profile.facts["clock_ghz"] > 0 and profile.facts["fma_units"] >= 1


def test_a_speed_over_the_cpu_peak_is_rejected():
    backend = CBackend(Catalog.with_user_folders().device("cpu"))
    try:
        peak32 = backend.probe().peak_gflops["float32"]
        spec = Catalog.with_user_folders().spec("matmul")
        size = ProblemSize.of({"M": 1024, "N": 1024, "K": 1024})
        flops = 2 * 1024**3
        honest = Measurement((flops / (0.5 * peak32 * 1e9) * 1e3,), flops)
        backend._reject_impossible_speed(spec, "float32", size, honest)
        faked = Measurement((flops / (2 * peak32 * 1e9) * 1e3,), flops)
        with pytest.raises(WrongResult, match="impossible speed"):
            backend._reject_impossible_speed(spec, "float32", size, faked)
    finally:
        backend.close()


def _seconds(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def test_a_noisy_timing_is_measured_again_and_the_steady_one_kept():
    timings = iter([Measurement((1.0, 5.0, 9.0), 1e9), Measurement((2.0, 2.1, 2.2), 1e9)])
    steady = measure_steadily(lambda: next(timings))
    assert not steady.noisy and steady.remeasured == 1
    assert steady.measurement.samples_ms == (2.0, 2.1, 2.2)

    noisy = [Measurement((1.0, 5.0, 9.0), 1e9), Measurement((1.0, 3.0, 4.0), 1e9),
             Measurement((1.0, 2.0, 9.0), 1e9)]
    flagged = measure_steadily(iter(noisy).__next__)
    assert flagged.noisy and flagged.remeasured == 2 and "spread" in flagged.why
    assert flagged.measurement == min(noisy, key=timing_spread)

    # one slow run among seven is no noise: the median does not move
    assert not NoisePolicy().is_noisy(Measurement((1.0, 1.05, 1.0, 1.02, 40.0, 1.01, 1.0),
                                                  1e9))


def test_the_vendor_is_timed_again_only_after_timed_trials():
    clock = VendorClock(VendorSchedule(early=(1, 3), every=5, every_s=1e9, load_step=1e9))
    reasons = []
    for _ in range(12):
        clock.saw_trial(timed=True, noisy=False)
        reason = clock.due()
        if reason:
            reasons.append((clock.timed, reason))
            clock.timed_vendor()
    assert [t for t, _ in reasons] == [1, 3, 8]
    for _ in range(50):  # answered by the cache: nothing ran, nothing to compare with
        clock.saw_trial(timed=False, noisy=False)
        assert clock.due() is None


def test_a_gpu_study_times_the_vendor_by_the_clock_and_not_by_the_hosts_load(
        tmp_path, monkeypatch):
    """A GPU study beside spinning processes (the builds of a real one keep the host
    busy): the vendor is timed at the start and after the 1st and 10th timed trials, not
    every 25 as on the CPU, and the host's load neither re-times nor flags it (the C
    backend's test above: flagged, re-measured)."""
    from peak_tune.session import parts, tune
    from peak_tune.session.config import TuneConfig

    monkeypatch.setattr(parts, "make_backend", lambda name, device: InstantCudaBackend(device))
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(max(2, os.cpu_count() or 1))]
    try:
        session = tune.open_session(TuneConfig.of(
            backend="cuda", device="h200", dtype="float32", results=tmp_path, seed=0,
            sizes=({"M": 256, "N": 256, "K": 256},), executor="local", ask_ahead=0))
        try:
            session.measure_vendor()
            session.run(80, lambda record: None)
            timed = session.vendors.clock.timed
            timings = session.vendors.figures["256x256x256"].timings
        finally:
            session.close()
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert timed >= 26  # the host's schedule would have timed it every 25 by now
    reasons = [t.reason for t in timings]
    assert reasons[:3] == ["start", "after 1 timed trial", "after 10 timed trials"]
    # then the best re-timed at the run's end, and on a slow CI machine the clock
    assert set(reasons[3:]) <= {"every 30 s", "end-of-run re-timing"}
    assert not any(t.noisy or t.remeasured for t in timings)


REPLAY = Path(__file__).parent / "fixtures" / "replay" / "matmul-c-small.json"


def _replayed_run(results: Path, trials: int, study: str | None = None) -> dict:
    from peak_tune.session.config import TuneConfig
    from peak_tune.session.progress import summary
    from peak_tune.session.tune import open_session

    config = TuneConfig.of(sizes=({"M": 96, "N": 96, "K": 96},), results=results, seed=2,
                           only=("loop-interchange", "unroll-k", "openmp-parallel",
                              "restrict-align"), replay=REPLAY, study=study)
    session = open_session(config)
    try:
        session.measure_vendor()
        session.run(trials, lambda record: None)
    finally:
        session.close()
    return summary(session, 0.0)


def test_a_run_answered_by_the_cache_takes_the_vendor_figure_from_it(tmp_path):
    """Exact, from a recording: the first run times the vendor (start, then after the
    1st, 3rd and 10th timed trial); the same run again, a new study answered by the
    cache, times nothing and reports the same figure and ratio; so does the first
    study resumed."""
    first = _replayed_run(tmp_path, 12)
    assert first["vendor"]["timings_this_run"] == 4
    assert first["vendor"]["by_size"]["96x96x96"]["timings"] == 4
    again = _replayed_run(tmp_path, 12)
    assert again["study"] != first["study"] and again["cache"]["compiles"] == 0
    assert again["vendor"]["timings_this_run"] == 0
    assert again["vendor"]["timings"] == 4  # the first run's, from the cache
    assert again["ratio"] == first["ratio"]
    resumed = _replayed_run(tmp_path, 0, study=first["study"])
    assert resumed["vendor"] == {**first["vendor"], "by_size": {
        label: {**s, "this_run": 0} for label, s in first["vendor"]["by_size"].items()},
        "timings_this_run": 0}
    assert resumed["ratio"] == first["ratio"]
