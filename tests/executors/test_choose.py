"""Which executor a run gets when the user does not say."""

from __future__ import annotations

import pytest

from peak_tune.errors import UserError
from peak_tune.executors import choose_executor, gpu_count


def test_auto_picks_ray_for_several_gpus_or_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert gpu_count() == 2
    assert choose_executor("auto", None, "cuda") == "ray"
    assert choose_executor("auto", None, "c") == "local"  # one CPU host: one timing at once
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert choose_executor("auto", None, "cuda") == "local"
    assert choose_executor("auto", "ray://head:10001", "c") == "ray"
    assert choose_executor("local", "ray://head:10001", "cuda") == "local"


def test_unknown_executor_is_one_clear_error() -> None:
    with pytest.raises(UserError, match="unknown executor 'dask'"):
        choose_executor("dask", None, "c")


def test_unreachable_ray_cluster_is_one_line_and_no_study(tmp_path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "peak_tune.cli", "--executor", "ray", "--ray-address",
         "127.0.0.1:1", "--trials", "1", "--size", "64", "--results", str(tmp_path)],
        capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "peak-tune: error: cannot reach the Ray cluster at 127.0.0.1:1: Connection refused")
    assert not (tmp_path / "peak.db").exists() or "run1" not in subprocess.run(
        [sys.executable, "-c", "import optuna,sys; print(optuna.get_all_study_names("
         f"'sqlite:///{tmp_path}/peak.db'))"], capture_output=True, text=True).stdout
