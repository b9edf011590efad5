"""Optuna's TPE, with what every parameter group of one ask shares worked out once.

With `group=True` TPE samples each group of parameters that occur together on its own,
and for every group it split the trials the ask sees into the better and the worse
(`_split_trials`, which also scores each trial's constraints) and read every trial's
parameters again. Neither depends on the group. The CUDA catalog gives about 19 groups
an ask (a position per chosen step, the values of each step, the step choices): on a
fp16 4096 replay (benchmarks/results/landscapes) the splits were 29 s and the reads 25 s
of the 106 s TPE spent in 800 trials, and on the H200 the sampler process, drawing at
its limit, kept the device 18% busy (random search: 90%).

Here both are worked out once per ask (the trials the ask sees, by number and state, name
it) and reused by its groups. The draws are TPESampler's own, value for value
(tests/search/test_tpe.py); the random numbers are drawn in the same order. Where an
Optuna version lacks the internals this builds on, `split_once_tpe` gives the plain one.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers._tpe import sampler as _tpe_internals
from optuna.trial import FrozenTrial, TrialState

__all__ = ["SplitOnceTPE", "split_once_tpe"]

_NEEDS = ("_split_trials", "default_gamma", "default_gamma_multiobjective")


class SplitOnceTPE(optuna.samplers.TPESampler):
    """TPESampler whose groups of one ask share its split of the trials and their
    parameters."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._ask: tuple[tuple[int, TrialState], ...] | None = None  # the ask's trials
        self._split: tuple[list[FrozenTrial], list[FrozenTrial]] = ([], [])
        self._params: dict[int, dict[str, Any]] = {}  # trial number -> its parameters

    def _shared(self, study: optuna.Study, trials: list[FrozenTrial]
                ) -> tuple[list[FrozenTrial], list[FrozenTrial]]:
        key = tuple((t.number, t.state) for t in trials)
        if key != self._ask:
            if self._gamma is None:
                self._gamma = (_tpe_internals.default_gamma if len(study.directions) <= 1
                               else _tpe_internals.default_gamma_multiobjective)
            # running trials are not counted (optuna/optuna#4073)
            n = sum(t.state != TrialState.RUNNING for t in trials)
            self._split = _tpe_internals._split_trials(study, trials, self._gamma(n))
            self._params = {}
            self._ask = key
        return self._split

    def _get_params(self, trial: FrozenTrial, study: optuna.Study) -> dict[str, Any]:
        if self._ask is None:
            return super()._get_params(trial, study)
        params = self._params.get(trial.number)
        if params is None:
            params = self._params[trial.number] = super()._get_params(trial, study)
        return params

    def _sample(self, study: optuna.Study, trial: FrozenTrial,
                search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        # TPESampler._sample, with the split shared by the ask's groups
        states = [TrialState.COMPLETE, TrialState.PRUNED]
        if self._constant_liar:
            states.append(TrialState.RUNNING)
        trials = study._get_trials(deepcopy=False, states=states,
                                   use_cache=not self._constant_liar)
        if self._constant_liar:
            trials = [t for t in trials if t.number != trial.number]
        below, above = self._shared(study, trials)
        mpe_below = self._build_parzen_estimator(study, search_space, below,
                                                 handle_below=True)
        mpe_above = self._build_parzen_estimator(study, search_space, above,
                                                 handle_below=False)
        samples = mpe_below.sample(self._rng.rng, self._n_ei_candidates)
        chosen = self._compare(samples, self._compute_acquisition_func(samples, mpe_below,
                                                                       mpe_above))
        return {name: dist.to_external_repr(chosen[name])
                for name, dist in search_space.items()}

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Any) -> None:
        self._ask = None  # a finished trial changes what the next ask sees
        super().after_trial(study, trial, state, values)


def split_once_tpe(**kwargs: Any) -> optuna.samplers.TPESampler:
    """SplitOnceTPE where this Optuna has what it builds on, else TPESampler."""
    usable = all(hasattr(_tpe_internals, name) for name in _NEEDS) and all(
        hasattr(optuna.samplers.TPESampler, name)
        for name in ("_sample", "_get_params", "_build_parzen_estimator", "_compare",
                     "_compute_acquisition_func"))
    return (SplitOnceTPE if usable else optuna.samplers.TPESampler)(**kwargs)
