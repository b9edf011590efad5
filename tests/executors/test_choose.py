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
