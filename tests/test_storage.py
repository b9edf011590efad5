"""The shared study storage: many processes opening one new database at once."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import optuna
import pytest

from peak_tune.errors import UserError
from peak_tune.study.storage import open_storage, results_storage_url


def _create_study(url: str, name: str) -> str:
    storage = open_storage(url)
    study = optuna.create_study(storage=storage, study_name=name)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    return name


def test_processes_creating_one_new_database_at_once_all_succeed(tmp_path: Path) -> None:
    url = results_storage_url(tmp_path)
    with multiprocessing.get_context("spawn").Pool(6) as pool:
        done = pool.starmap(_create_study, [(url, f"s{i}") for i in range(6)])
    assert sorted(done) == [f"s{i}" for i in range(6)]
    summaries = optuna.get_all_study_summaries(open_storage(url))
    assert sorted(s.n_trials for s in summaries) == [3] * 6


def test_unreachable_storage_is_one_clear_error() -> None:
    with pytest.raises(UserError, match=r"cannot open the study storage sqlite:////nonexistent"):
        open_storage("sqlite:////nonexistent/dir/peak.db")


def test_password_never_appears_in_the_error() -> None:
    with pytest.raises(UserError) as caught:
        open_storage("postgresql+psycopg2://tuner:s3cret@127.0.0.1:1/peak")
    assert "s3cret" not in str(caught.value)
    assert "tuner:***@127.0.0.1:1/peak" in str(caught.value)
