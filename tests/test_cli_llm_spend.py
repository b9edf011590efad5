"""`peak-tune --applier llm` end to end with samples, wrong-result repairs, budgets and
prices: the real openai client, the local protocol server, the real C backend and study."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import optuna
import pytest

from peak_tune.appliers.llm.stats import append_records, read_records
from tests.appliers.test_llm import INTERCHANGED, KEY, fenced
from tests.appliers.test_llm_repair import SKIPS_FIRST_K
from tests.llm_server import LLMServer, reply
from tests.test_cli import SMALL, last_json, peak
from tests.test_cli_llm import chat_calls, endpoint

pytestmark = pytest.mark.llm

PARALLEL = """\
#ifndef OMP_CHUNK
#error "OMP_CHUNK must be defined"
#endif
void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    #pragma omp parallel for schedule(static, OMP_CHUNK)
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) C[i * N + j] = 0;
        for (int k = 0; k < K; k++)
            for (int j = 0; j < N; j++) C[i * N + j] += A[i * K + k] * B[k * N + j];
    }
}
"""


def no_key_anywhere(folder: Path, *outputs: str) -> None:
    for text in outputs:
        assert KEY not in text
    for path in folder.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def test_samples_take_the_first_that_passes_and_a_repeat_makes_no_call(
    tmp_path: Path,
) -> None:
    args = ["--sequence", "loop-interchange", "--samples", "4", "--repairs", "0",
            "--trials", "2", *SMALL, "--json", "--results", str(tmp_path)]
    with LLMServer() as server:
        server.script(reply("I would swap the loops."), reply(fenced(SKIPS_FIRST_K)),
                      reply(fenced(INTERCHANGED)))
        done = peak(*args, env=endpoint(server.url + "/v1"))
        assert done.returncode == 0, done.stderr
        assert chat_calls(server) == 3  # sample 3 is never asked for
        data = last_json(done.stdout)
        assert data["best"]["sequence"] == ["loop-interchange"]
        assert data["trials"]["complete"] == 2
        assert data["llm"]["calls"] == 3 and data["llm"]["tokens"] == 3 * 150
        again = peak(*args, env=endpoint(server.url + "/v1"))
        assert again.returncode == 0, again.stderr
        assert chat_calls(server) == 3  # every sample comes from the cache
        assert last_json(again.stdout)["llm"]["calls"] == 0
    records = read_records(tmp_path / "cache")
    assert [(r.sample, r.outcome) for r in records] == [
        (0, "no_code"), (1, "wrong_result"), (2, "ok")]
    assert records[1].message.startswith("wrong result at 67x53x97")
    assert {r.study for r in records} == {data["study"]}
    shown = peak("stats", "--results", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert "no_code 1, wrong_result 1" in shown.stdout
    no_key_anywhere(tmp_path, done.stdout, done.stderr, shown.stdout)


def test_a_spent_token_budget_ends_the_run_and_the_study_resumes(tmp_path: Path) -> None:
    # one application at a time, so that exactly one trial is in flight when the budget ends
    args = ["--study", "s", "--sequence", "loop-interchange,openmp-parallel", *SMALL,
            "--apply-workers", "1", "--json", "--results", str(tmp_path)]
    with LLMServer() as server:
        server.script(reply(fenced(INTERCHANGED)))  # 150 tokens
        stopped = peak(*args, "--trials", "3", "--max-tokens-total", "100",
                       env=endpoint(server.url + "/v1"))
        assert stopped.returncode == 3, stopped.stderr
        assert "Traceback" not in stopped.stderr
        (line,) = [x for x in stopped.stderr.splitlines() if "budget" in x]
        assert line.startswith("peak-tune: LLM budget reached: token budget of 100 exhausted: "
                               "150 tokens used (this run: 150 tokens, cost unknown)")
        assert "resume with --study s" in line
        assert last_json(stopped.stdout)["trials"]["failed"] == 1
        assert chat_calls(server) == 1
        study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/peak.db")
        (trial,) = study.trials
        assert trial.state == optuna.trial.TrialState.FAIL
        assert "token budget of 100 exhausted" in trial.user_attrs["message"]
        assert len(read_records(tmp_path / "cache")) == 1  # the spent call is journaled

        server.script(reply(fenced(PARALLEL)))
        resumed = peak(*args, "--trials", "2", "--max-tokens-total", "1000",
                       env=endpoint(server.url + "/v1"))
        assert resumed.returncode == 0, resumed.stderr
        assert chat_calls(server) == 2  # loop-interchange came from the cache
    data = last_json(resumed.stdout)
    assert data["trials"] == {**data["trials"], "total": 3, "complete": 2, "failed": 1}
    assert data["best"]["sequence"] == ["loop-interchange", "openmp-parallel"]
    no_key_anywhere(tmp_path, stopped.stdout, stopped.stderr, resumed.stdout)


def test_a_study_scoped_budget_counts_the_earlier_runs_of_the_study(tmp_path: Path) -> None:
    """--budget-scope study: a resumed study whose journal already holds the budget makes
    no call; earlier calls journaled without a price are priced by today's table (or,
    with none, refused in one line); a larger budget lets the study go on."""
    args = ["--study", "s", "--sequence", "loop-interchange,openmp-parallel", *SMALL,
            "--apply-workers", "1", "--json", "--results", str(tmp_path),
            "--budget-scope", "study"]
    with LLMServer() as server:
        server.script(reply(fenced(INTERCHANGED)))  # 100 + 50 tokens
        first = peak(*args, "--trials", "3", "--max-tokens-total", "100",
                     env=endpoint(server.url + "/v1"))
        assert first.returncode == 3, first.stderr
        assert chat_calls(server) == 1
        again = peak(*args, "--trials", "3", "--max-tokens-total", "100",
                     env=endpoint(server.url + "/v1"))
        assert again.returncode == 3, again.stderr
        assert chat_calls(server) == 1  # nothing asked: the study's budget was spent
        (line,) = [x for x in again.stderr.splitlines() if "budget" in x]
        assert ("token budget of 100 exhausted: 150 tokens used (150 in earlier runs) "
                "(this run: 0 tokens") in line
        prices = tmp_path / "prices.toml"  # the first call, journaled unpriced, is priced now
        prices.write_text('[models."test-model"]\ninput = 2.0\noutput = 8.0\n')
        priced = peak(*args, "--trials", "1", "--max-cost", "0.0005", "--llm-prices",
                      str(prices), env=endpoint(server.url + "/v1"))
        assert priced.returncode == 3, priced.stderr
        assert chat_calls(server) == 1
        assert "cost budget of $0.0005 exhausted: $0.0006 spent ($0.0006 in earlier runs)" in (
            priced.stderr)
        append_records(tmp_path / "cache", [dataclasses.replace(
            read_records(tmp_path / "cache")[0], model="other-model")], "s")
        unpriced = peak(*args, "--trials", "1", "--max-cost", "1", "--llm-prices",
                        str(prices), env=endpoint(server.url + "/v1"))
        assert unpriced.returncode == 2
        assert unpriced.stderr.strip().splitlines() == [
            "peak-tune: error: --max-cost with --budget-scope study: study 's' has earlier "
            "calls without a price (model other-model); give it with --llm-prices FILE, or "
            "count this run only"]
        server.script(reply(fenced(PARALLEL)))
        more = peak(*args, "--trials", "2", "--max-tokens-total", "1000",
                    env=endpoint(server.url + "/v1"))
        assert more.returncode == 0, more.stderr
        assert chat_calls(server) == 2
    assert last_json(more.stdout)["best"]["sequence"] == ["loop-interchange", "openmp-parallel"]


def test_cost_in_the_summary_stats_and_csv_is_usage_times_price(tmp_path: Path) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text('[models."test-model"]\ninput = 2.0\noutput = 8.0\n')
    results = tmp_path / "results"
    args = ["--sequence", "loop-interchange", "--trials", "1", *SMALL, "--json",
            "--results", str(results)]
    with LLMServer() as server:
        refused = peak(*args, "--max-cost", "1", env=endpoint(server.url + "/v1"))
        assert refused.returncode == 2
        assert refused.stderr.strip().splitlines() == [
            "peak-tune: error: --max-cost needs the price of model 'test-model', which the "
            "price table lacks: give one with --llm-prices FILE"]
        assert chat_calls(server) == 0
        server.script(reply(fenced(INTERCHANGED), 1000, 500))
        done = peak(*args, "--max-cost", "1", "--llm-prices", str(prices),
                    env=endpoint(server.url + "/v1"))
        assert done.returncode == 0, done.stderr
    cost = (1000 * 2.0 + 500 * 8.0) / 1e6
    llm = last_json(done.stdout)["llm"]
    assert llm["cost_usd"] == pytest.approx(cost)
    assert llm["by_transformation"]["loop-interchange"]["cost_usd"] == pytest.approx(cost)
    assert "$0.0060 (this run)" in done.stderr  # the summary table
    table = tmp_path / "stats.csv"
    shown = peak("stats", "--results", str(results), "--csv", str(table))
    assert shown.returncode == 0, shown.stderr
    (row,) = csv.DictReader(table.open())
    assert float(row["cost_usd"]) == pytest.approx(cost)
    assert (row["prompt_tokens"], row["completion_tokens"]) == ("1000", "500")
    study = last_json(done.stdout)["study"]
    assert any(study in x and "$0.0060" in x for x in shown.stdout.splitlines())
    no_key_anywhere(tmp_path, done.stdout, done.stderr, shown.stdout,
                    json.dumps(llm))


def test_samples_need_the_llm_applier(tmp_path: Path) -> None:
    done = peak("--samples", "2", "--applier", "reference", "--trials", "1", *SMALL,
                "--results", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip() == ("peak-tune: error: --samples needs --applier llm (the "
                                   "reference applier is deterministic: every sample would "
                                   "be the same)")


def test_a_killed_llm_study_resumes_without_asking_twice(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.llm_server import slow

    args = ["--study", "s", "--sequence", "loop-interchange,openmp-parallel", *SMALL,
            "--json", "--results", str(tmp_path)]
    with LLMServer() as server:
        server.script(reply(fenced(INTERCHANGED)), slow(60, fenced(PARALLEL)))
        driver = subprocess.Popen(
            [sys.executable, "-m", "peak_tune.cli", *args, "--trials", "3"],
            env={**os.environ, **endpoint(server.url + "/v1")},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while chat_calls(server) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # the first answer is in; the second call is in flight
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        assert chat_calls(server) == 2
        server.script(reply(fenced(PARALLEL)))
        resumed = peak(*args, "--trials", "2", env=endpoint(server.url + "/v1"))
        assert resumed.returncode == 0, resumed.stderr
        asked = [r.body["messages"][-1]["content"] for r in server.chat_requests()]
    assert len(asked) == 3  # loop-interchange came from the cache, not from the model
    assert "OMP_CHUNK" in asked[2] and asked[2] == asked[1]
    assert last_json(resumed.stdout)["best"]["sequence"] == ["loop-interchange",
                                                             "openmp-parallel"]
