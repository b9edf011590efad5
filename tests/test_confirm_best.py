"""The end-of-run re-timing of the best trial as a user sees it: the summary's best and
ratio are the re-timing's (the search's best kept apart), a run answered by the cache
and a resumed study print the same ratio without timing anything, a noisy re-timing is
flagged and never cached, and a best that fails its re-validation is reported. Real C
backend, real timings, real wrong results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from peak_tune.harness.noise import REMEASURES, NoisePolicy
from peak_tune.session.confirmation import CONFIRM_ATTR, CONFIRM_ROUNDS
from tests.user_kernels import SLEEPY_C, one_seed_catalog

SMALL = ["--size", "64", "--repeats", "3"]

# The naive matmul, right in the first $FLAKY_LUCKY_JOBS job processes that run it and
# wrong (C left unwritten) in every later one: a kernel whose trial passed, by luck, and
# that fails when it is evaluated again on fresh inputs. Each evaluation is a job process
# of its own, and a trial takes 1 + REMEASURES jobs at most (a noisy timing is taken
# again, as under CI's load), so the search's are all lucky; the re-timing's
# CONFIRM_ROUNDS rounds take more jobs than are left. $FLAKY_JOBS_FILE counts the jobs.
FLAKY_C = r"""
#include <stdio.h>
#include <stdlib.h>
static int lucky = -1;
static int lucky_job(void) {
    const char *path = getenv("FLAKY_JOBS_FILE"), *limit = getenv("FLAKY_LUCKY_JOBS");
    long jobs = 0;
    FILE *file = path ? fopen(path, "r") : NULL;
    if (file) {
        if (fscanf(file, "%ld", &jobs) != 1) jobs = 0;
        fclose(file);
    }
    if (path && (file = fopen(path, "w"))) {
        fprintf(file, "%ld", jobs + 1);
        fclose(file);
    }
    return limit && jobs < atol(limit);
}
void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    if (lucky < 0) lucky = lucky_job();
    if (!lucky) return;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
}
"""



def peak(*args: str, env: dict[str, str] | None = None, timeout: float = 300
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "peak_tune.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def last_json(done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def confirmations(results: Path) -> list[Path]:
    return list((results / "cache" / "confirmations").rglob("*.json"))


def study_of(results: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{results}/peak.db")




def test_the_summary_prints_the_end_of_run_retiming(tmp_path):
    done = peak("--trials", "4", *SMALL, "--json", "--results", str(tmp_path))
    data = last_json(done)
    confirmation, best = data["confirmation"], data["best"]
    if confirmation["status"] == "noisy":  # a busy machine: flagged, and shown as such
        assert data["ratio_noisy"] and "NOISY" in done.stderr
    else:
        assert confirmation["status"] == "confirmed", confirmation
    assert confirmation["source"] == "timed" and confirmation["trial"] == best["trial"]
    # what is printed as the best and the ratio is the re-timing, not the search's best
    assert best["confirmed"] and best["gflops"] == confirmation["kernel_gflops"]
    assert data["ratio"] == pytest.approx(best["gflops"] / data["vendor"]["gflops"])
    stability = data["vendor"]["by_size"]["64x64x64"]  # its timings beside it joined the figure
    study = study_of(tmp_path, data["study"])
    reasons = [t["reason"] for t in study.user_attrs["vendor"]["64x64x64"]["timings"]]
    attempts, rest = divmod(reasons.count("end-of-run re-timing"), CONFIRM_ROUNDS)
    assert rest == 0 and 1 <= attempts <= 1 + NoisePolicy().remeasures  # again while noisy
    assert stability["timings"] == len(reasons)
    assert best["search_gflops"] == max(t.values[0] for t in study.trials if t.values)
    assert data["search_ratio"] == pytest.approx(best["search_gflops"]
                                                 / data["vendor"]["gflops"])
    timed = confirmation["by_size"]["64x64x64"]
    assert len(timed["kernel_samples_ms"]) == len(timed["vendor_samples_ms"]) == CONFIRM_ROUNDS
    assert "end-of-run re-timing" in done.stderr and f"{best['gflops']:.2f}" in done.stderr
    assert f"search timed {best['search_gflops']:.2f}" in done.stderr
    held = study.user_attrs[CONFIRM_ATTR]
    assert held["context_hash"] == best["context_hash"] and held["params"] == best["params"]


def test_a_cached_rerun_and_a_resumed_study_print_the_same_ratio(tmp_path):
    args = ["--trials", "3", *SMALL, "--json", "--results", str(tmp_path)]
    first = last_json(peak(*args))
    assert first["confirmation"]["source"] == "timed"
    noisy = first["confirmation"]["status"] == "noisy"
    assert bool(confirmations(tmp_path)) is not noisy  # a noisy re-timing is not cached

    resumed = last_json(peak("--trials", "0", "--study", first["study"], *args[2:]))
    again = last_json(peak(*args))  # a new study, answered by the cache
    assert again["study"] != first["study"]
    if noisy:  # timed again by the resumed study; cached only if steady that time
        assert resumed["confirmation"]["source"] == "timed"
        if resumed["confirmation"]["status"] == "confirmed" and first["trials"]["noisy"] == 0:
            assert again["confirmation"]["source"] == "cache"
            assert again["ratio"] == resumed["ratio"]
        return
    assert resumed["confirmation"]["source"] == "study"
    assert resumed["ratio"] == first["ratio"]
    assert resumed["best"]["gflops"] == first["best"]["gflops"]
    if first["trials"]["noisy"] == 0:  # every trial cached: the same best, nothing timed
        assert again["cache"]["compiles"] == 0
        assert again["confirmation"]["source"] == "cache"
        assert again["ratio"] == first["ratio"]
        assert again["best"]["gflops"] == first["best"]["gflops"]
        assert again["confirmation"]["by_size"] == first["confirmation"]["by_size"]


def test_no_finished_trial_has_nothing_to_retime(tmp_path):
    done = peak("--trials", "0", *SMALL, "--json", "--results", str(tmp_path))
    data = last_json(done)
    assert data["confirmation"] == {"status": "none",
                                    "why": "nothing to re-time: no finished trial"}
    assert data["best"]["gflops"] == 0.0 and not data["best"]["confirmed"]
    assert "nothing to re-time" in done.stderr
    assert not confirmations(tmp_path)


def test_a_best_that_fails_its_revalidation_is_reported(tmp_path):
    catalog = one_seed_catalog(tmp_path / "catalog", "flaky", FLAKY_C)
    results = tmp_path / "results"
    done = peak("--kernel", "flaky", "--catalog", str(catalog), "--trials", "1",
                "--size", "64", "--repeats", "7", "--json", "--results", str(results),
                env={"FLAKY_JOBS_FILE": str(tmp_path / "jobs"),
                     "FLAKY_LUCKY_JOBS": str(1 + REMEASURES)})
    data = last_json(done)
    assert data["trials"]["by_outcome"]["ok"] == 1, data["trials"]  # it passed, by luck
    confirmation = data["confirmation"]
    assert confirmation["status"] == "failed"
    assert confirmation["by_size"]["64x64x64"]["status"] == "wrong_result"
    assert "failed its re-validation at 64x64x64: wrong_result" in confirmation["why"]
    assert data["ratio"] is None and not data["best"]["confirmed"]
    assert data["best"]["gflops"] == data["best"]["search_gflops"] > 0
    assert "FAILED" in done.stderr and "re-validation" in done.stderr
    study = study_of(results, data["study"])  # marked in the study
    held = study.user_attrs[CONFIRM_ATTR]["by_size"]["64x64x64"]
    assert held["status"] == "wrong_result" and "not written" in held["message"]


def test_a_noisy_retiming_is_flagged_and_not_cached(tmp_path):
    catalog = one_seed_catalog(tmp_path / "catalog", "sleepy", SLEEPY_C)
    results = tmp_path / "results"
    done = peak("--kernel", "sleepy", "--catalog", str(catalog), "--trials", "1",
                "--size", "32", "--json", "--results", str(results))
    data = last_json(done)
    confirmation = data["confirmation"]
    assert confirmation["status"] == "noisy"
    assert "kernel round" in confirmation["why"] and "spread" in confirmation["why"]
    assert data["ratio_noisy"] and data["best"]["confirmed"]
    assert "NOISY, not cached" in done.stderr
    assert not confirmations(results)
