"""The build budget: a build running past --build-budget times the run's median build is
stopped, its trial pruned with a message that says so, and nothing about it cached.

The driver's side, with a stand-in CUDA backend whose builds sleep (a tail of slow ones,
as large unrolled kernels are); that the real backend stops NVRTC mid-build is tested in
tests/backends/test_cuda_compile.py.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

from peak_tune.backends.base import OVER_BUDGET, Artifact, over_budget_message
from peak_tune.cli import app as cli
from peak_tune.core import KernelContext
from peak_tune.errors import BuildOverBudget
from peak_tune.session import parts, tune
from peak_tune.session import progress as report
from peak_tune.session.config import TuneConfig
from tests.instant_backend import InstantCudaBackend

SLOW_S, QUICK_S = 1.0, 0.01


class SlowTailBackend(InstantCudaBackend):
    """Builds of a fifth of the points take SLOW_S, the others QUICK_S; a build given a
    shorter time limit stops at it, as the CUDA backend's compiler process does."""

    def compile(self, context: KernelContext, params: Mapping[str, int], dtype: str,
                build_dir: str, time_limit_s: float = 0.0) -> Artifact:
        key = hashlib.sha256(repr((context.content_hash(), sorted(params.items())))
                             .encode()).hexdigest()
        seconds = SLOW_S if int(key[:4], 16) % 5 == 0 else QUICK_S
        if 0 < time_limit_s < seconds:
            time.sleep(time_limit_s)
            raise BuildOverBudget(over_budget_message(time_limit_s))
        time.sleep(seconds)
        return Artifact(path="/dev/null", compile_key=key)


@pytest.fixture
def slow_tail(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(parts, "make_backend", lambda name, device: SlowTailBackend(device))
    monkeypatch.setattr(tune, "BUILD_BUDGET_FLOOR_S", 0.2)
    yield


def run_study(tmp_path: Path, trials: int, **config: Any) -> tune.TuneSession:
    session = tune.open_session(TuneConfig.of(**{
        "backend": "cuda", "device": "h200", "dtype": "float32",
        "sizes": ({"M": 256, "N": 256, "K": 256},), "results": tmp_path,
        "executor": "local", "seed": 0, "compile_workers": 4, "ask_ahead": 0, **config}))
    try:
        session.run(trials, lambda record: None)
    finally:
        session.close()
    return session


def over_budget(session: tune.TuneSession) -> list[Any]:
    return [t for t in session.study.get_trials(deepcopy=False)
            if str(t.user_attrs.get("message", "")).startswith(OVER_BUDGET)]


def test_slow_builds_are_stopped_pruned_and_not_cached(tmp_path: Path, slow_tail: None):
    session = run_study(tmp_path, 120)
    stopped = over_budget(session)
    assert stopped, "no build was stopped"
    complete = session.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    for trial in stopped:
        assert trial.state == TrialState.PRUNED
        # QUICK_S builds: the median is tiny, so the floor is the limit
        assert trial.user_attrs["message"] == over_budget_message(0.2)
        context = session.cache.get_context(trial.user_attrs["context_hash"])
        assert context is not None
        params = {p.name: trial.user_attrs["params"][p.name] for p in context.params}
        cached = session.pipeline.cached(context, params, session.sizes[0])
        # The same point asked while fewer than twenty builds had finished had no limit
        # and may have been built in full beside this one: that build may be cached,
        # the stopped one never.
        twins = [t for t in complete if t.user_attrs.get("params") == trial.user_attrs["params"]
                 and t.user_attrs.get("context_hash") == trial.user_attrs["context_hash"]]
        assert cached is None or (cached.status.value == "ok" and twins), cached
    assert len(complete) > len(stopped)
    told = report.summary(session, 1.0)["trials"]
    assert told["over_build_budget"] == len(stopped) <= told["by_outcome"]["invalid"]
    assert session.build_limit_s() == pytest.approx(0.2)


def test_no_build_is_stopped_before_the_twentieth(tmp_path: Path, slow_tail: None):
    session = run_study(tmp_path, 12)
    assert not over_budget(session)
    assert session.build_limit_s() == 0.0


def test_a_budget_of_zero_never_stops_a_build(tmp_path: Path, slow_tail: None):
    session = run_study(tmp_path, 60, build_budget=0.0)
    assert not over_budget(session)
    assert session.build_limit_s() == 0.0


def test_a_negative_budget_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as ended:
        cli.main(["tune", "--build-budget", "-1"])
    assert ended.value.code == 2
    assert "argument --build-budget: '-1': use a number, 0 or more" in capsys.readouterr().err
