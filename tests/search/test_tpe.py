"""TPE with the ask's split shared by its groups draws what Optuna's TPE draws, cheaper."""

from __future__ import annotations

import warnings
from typing import Any

import optuna
from optuna.trial import TrialState

from peak_tune.search.focus import HistoryWindow
from peak_tune.search.tpe import SplitOnceTPE, split_once_tpe

optuna.logging.set_verbosity(optuna.logging.WARNING)


def steps(trial: optuna.Trial) -> float:
    """Several optional steps, each with a position and values of its own: many groups,
    as the catalog's sequences give; some points are pruned, some fail."""
    score = 0.0
    for step in ("a", "b", "c", "d"):
        if trial.suggest_categorical(f"use.{step}", [True, False]):
            where = trial.suggest_float(f"pos.{step}", 0.0, 1.0)
            tile = trial.suggest_categorical(f"{step}.TILE", [8, 16, 32, 64, 128])
            score += where * (1 + (tile == 32)) + trial.suggest_int(f"{step}.UNROLL", 1, 4)
    if score > 9:
        raise optuna.TrialPruned()
    if score > 8:
        raise RuntimeError("fails, as a kernel that does not build")
    return score


def _sampler(cls: type[optuna.samplers.TPESampler], seed: int) -> Any:
    with warnings.catch_warnings():  # multivariate, group and constant_liar: experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return HistoryWindow(cls(seed=seed, multivariate=True, group=True,
                                 constant_liar=True, n_startup_trials=6),
                             keep_best=8, keep_recent=12)


def _draws(sampler: Any, trials: int, running: int) -> list[dict[str, Any]]:
    """`running` asked trials kept open throughout (the constant liar sees them)."""
    study = optuna.create_study(direction="maximize", sampler=sampler)
    held = []
    for _ in range(running):
        held.append(study.ask())
        held[-1].suggest_categorical("use.a", [True, False])
    study.optimize(steps, n_trials=trials, catch=(RuntimeError,))
    for trial in held:
        study.tell(trial, state=TrialState.FAIL)
    return [t.params for t in study.trials]


def test_the_draws_are_optunas_own_value_for_value():
    for seed, running in ((0, 0), (1, 2)):
        shared = _draws(_sampler(SplitOnceTPE, seed), 70, running)
        assert shared == _draws(_sampler(optuna.samplers.TPESampler, seed), 70, running)
        assert len({str(p) for p in shared}) > 50  # the draws differ from trial to trial


def test_the_trials_are_split_once_per_ask_not_once_per_group():
    splits = []

    class Counting(SplitOnceTPE):
        def _shared(self, study: optuna.Study, trials: list[Any]) -> Any:
            key = tuple((t.number, t.state) for t in trials)
            if key != self._ask:
                splits.append(key)
            return super()._shared(study, trials)

    groups = []

    class Grouped(SplitOnceTPE):
        def _sample(self, study: optuna.Study, trial: Any, search_space: Any) -> Any:
            groups.append(trial.number)
            return super()._sample(study, trial, search_space)

    _draws(_sampler(Counting, 3), 40, 0)
    _draws(_sampler(Grouped, 3), 40, 0)
    asks = len(set(groups))
    assert len(groups) > 2 * asks  # several groups an ask ...
    assert len(splits) <= asks  # ... one split


def test_the_catalogs_sampler_is_the_split_once_one():
    sampler = split_once_tpe(seed=0, multivariate=True)
    assert isinstance(sampler, SplitOnceTPE)
