"""Studies in a real PostgreSQL server: two drivers of one study, a batch, a killed driver."""

from __future__ import annotations

import multiprocessing
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from peak_tune.study.mirror import DRIVER_ATTR
from peak_tune.study.storage import open_storage
from tests.test_batch import TWO_STUDIES, points, write
from tests.test_cli import SMALL, last_json, peak
from tests.test_storage import _create_study

pytestmark = pytest.mark.postgres

TUNE = ["--size", "48", "--repeats", "3", "--json"]


def trials_of(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=open_storage(url)).trials


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "peak_tune.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_processes_creating_the_schema_at_once_all_succeed(postgres_url):
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        done = pool.starmap(_create_study, [(postgres_url, f"s{i}") for i in range(4)])
    assert sorted(done) == [f"s{i}" for i in range(4)]
    summaries = optuna.get_all_study_summaries(open_storage(postgres_url))
    assert sorted(s.n_trials for s in summaries) == [3] * 4


def test_two_drivers_of_one_study_lose_nothing(postgres_url, tmp_path):
    # Each driver has a seed of its own: with one seed both would ask for the same points.
    drivers = [start("--trials", "4", *TUNE, "--study", "shared", "--storage", postgres_url,
                     "--results", str(tmp_path), "--seed", str(seed)) for seed in (1, 2)]
    outputs = [driver.communicate(timeout=300) for driver in drivers]
    for driver, (stdout, stderr) in zip(drivers, outputs, strict=True):
        assert driver.returncode == 0, stderr
        assert last_json(stdout)["study"] == "shared"
    trials = trials_of(postgres_url, "shared")
    assert len(trials) == 8
    assert all(t.state.is_finished() and "status" in t.user_attrs for t in trials)
    by_driver = [t.system_attrs[DRIVER_ATTR] for t in trials]
    assert sorted(by_driver.count(d) for d in set(by_driver)) == [4, 4]
    assert sorted(t.number for t in trials) == list(range(8))


def test_batch_into_postgres(postgres_url, tmp_path):
    path = write(tmp_path, TWO_STUDIES.format(trials=2))
    done = peak("batch", str(path), "--storage", postgres_url, "--results", str(tmp_path / "r"),
                "--json")
    assert done.returncode == 0, done.stderr
    data = last_json(done.stdout)
    assert "peak_" in data["storage"] and [s["state"] for s in data["studies"]] == ["done"] * 2
    summaries = optuna.get_all_study_summaries(open_storage(postgres_url))
    assert sorted((s.study_name, s.n_trials) for s in summaries) == [
        ("b-matmul-cpu-float32-48x48x48", 2), ("b-matmul-cpu-float64-48x48x48", 2)]
    assert not (tmp_path / "r" / "peak.db").exists()  # nothing went to SQLite


@pytest.mark.slow
def test_killed_driver_resumes_without_repeating_a_finished_trial(postgres_url, tmp_path):
    args = [*SMALL, "--study", "killed", "--storage", postgres_url, "--results", str(tmp_path)]
    driver = start("--trials", "200", *args)
    deadline = time.monotonic() + 180
    before: list[optuna.trial.FrozenTrial] = []
    while time.monotonic() < deadline and len(before) < 3 and driver.poll() is None:
        time.sleep(0.5)
        before = _trials_so_far(postgres_url)
    driver.send_signal(signal.SIGKILL)
    driver.communicate(timeout=60)
    before = trials_of(postgres_url, "killed")
    assert len(before) >= 3, "the driver finished too few trials before it was killed"
    assert all(t.state.is_finished() for t in before)  # a killed driver leaves none RUNNING

    resumed = peak("--trials", str(len(before) + 3), *args, "--json")  # in all: 3 more
    assert resumed.returncode == 0, resumed.stderr
    data = last_json(resumed.stdout)
    assert data["study"] == "killed" and data["trials"]["total"] == len(before) + 3
    after = trials_of(postgres_url, "killed")
    assert len(after) == len(before) + 3
    assert TrialState.RUNNING not in {t.state for t in after}
    assert points(after[:len(before)]) == points(before)  # finished trials kept as they were
    assert not set(points(after[len(before):])) & set(points(before))  # none evaluated again


def _trials_so_far(url: str) -> list[optuna.trial.FrozenTrial]:
    try:
        return trials_of(url, "killed")
    except KeyError:  # the driver has not made the study yet
        return []


def test_postgres_url_without_a_server_is_one_line(tmp_path):
    done = peak("--trials", "1", *SMALL, "--storage", "postgresql://peak@127.0.0.1:1/none",
                "--results", str(tmp_path))
    assert done.returncode == 2
    assert "cannot open the study storage postgresql://peak@127.0.0.1:1/none" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_storage_flag_reaches_every_batch_study(tmp_path: Path):
    path = write(tmp_path, TWO_STUDIES.format(trials=1))
    from peak_tune.batch.files import load_batch

    plan = load_batch(path, storage="postgresql://u@h/db")
    assert {s.config.store.storage for s in plan.studies} == {"postgresql://u@h/db"}
