"""Keeping the sampler's ask cheap, so that the driver never becomes a study's limit.

Optuna's TPE (multivariate, grouped) rebuilds its Parzen estimators at every ask, for
every group of parameters the study has ever seen and from every trial: with the CUDA
catalog's ~25 groups an ask cost 0.2-0.3 s on a 2-core VM, which capped a study at about
4 trials/s whatever the GPUs could do. Two wrappers, both transparent to TPE:

- `HistoryWindow` shows the sampler every unfinished trial (the constant liar needs
  them), the best finished ones and the most recent ones, so an ask costs the same at
  trial 5000 as at 200. TPE's "good" set is the best tenth of what it sees, at most 25
  trials: with `keep_best` >= 25 it is what the whole history would give; the "bad" set
  becomes the recent part of the rest. Until a study outgrows the window nothing changes.
- `SequenceFirst` samples the parameters that choose the sequence (`use.<id>`,
  `step.<i>`) first, then only the groups of the transformations chosen: the tile sizes
  of a step the trial does not use are never drawn, and they were most of the groups.
"""

from __future__ import annotations

import copy
import heapq
from collections.abc import Container, Mapping
from typing import Any, Protocol

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

__all__ = ["HistoryWindow", "ParamRoles", "SequenceFirst"]

_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


class ParamRoles(Protocol):
    """What a sequence encoding knows about its parameter names."""

    def chooses_sequence(self, name: str) -> bool:
        """`name` is part of the choice of sequence (sampled before the rest)."""
        ...

    def in_use(self, choices: Mapping[str, Any], name: str) -> bool:
        """Given the sequence `choices`, whether the trial may suggest `name`."""
        ...


class _Forwarding(BaseSampler):
    """A sampler that hands every call to `inner`; subclasses change what they need."""

    def __init__(self, inner: BaseSampler) -> None:
        self.inner = inner

    def __str__(self) -> str:
        return f"{type(self).__name__}({self.inner})"

    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.inner.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return self.inner.sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Any) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()


class HistoryWindow(_Forwarding):
    """`inner` samples from the best `keep_best` completed trials, the latest
    `keep_recent` finished ones and every unfinished one."""

    def __init__(self, inner: BaseSampler, keep_best: int = 50, keep_recent: int = 150) -> None:
        if keep_best < 1 or keep_recent < 1:
            raise ValueError("keep_best and keep_recent must be 1 or more")
        super().__init__(inner)
        self.keep_best = keep_best
        self.keep_recent = keep_recent

    def _view(self, study: optuna.Study) -> optuna.Study:
        return _WindowedStudy(study, self)  # type: ignore[return-value]  # duck-typed

    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.inner.infer_relative_search_space(self._view(study), trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return self.inner.sample_relative(self._view(study), trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.inner.sample_independent(self._view(study), trial, param_name,
                                             param_distribution)

    def window(self, trials: list[FrozenTrial], direction: StudyDirection) -> list[FrozenTrial]:
        """The trials the sampler sees, in study order."""
        finished = [t for t in trials if t.state in _FINISHED]
        if len(finished) <= self.keep_best + self.keep_recent:
            return trials
        sign = 1.0 if direction == StudyDirection.MAXIMIZE else -1.0
        complete = (t for t in finished if t.state == TrialState.COMPLETE and t.values)
        kept = {t.number for t in heapq.nlargest(self.keep_best, complete,
                                                 key=lambda t: sign * t.values[0])}
        kept.update(t.number for t in finished[-self.keep_recent:])
        return [t for t in trials if t.number in kept or t.state not in _FINISHED]


class _WindowedStudy:
    """The study as the wrapped sampler sees it: everything as is, but fewer trials."""

    def __init__(self, study: optuna.Study, history: HistoryWindow) -> None:
        self._study = study
        self._history = history

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None,
                    use_cache: bool = False) -> list[FrozenTrial]:
        every = self._study._get_trials(deepcopy=False, use_cache=use_cache)
        if not self._study._is_multi_objective():  # Pareto fronts need every trial
            every = self._history.window(every, self._study.direction)
        chosen = every if states is None else [t for t in every if t.state in states]
        return copy.deepcopy(chosen) if deepcopy else chosen

    def get_trials(self, deepcopy: bool = True,
                   states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        return self._get_trials(deepcopy, states)


class SequenceFirst(_Forwarding):
    """Relative sampling in two steps: the sequence choice, then only the parameters
    `roles` says the chosen sequence uses. A parameter skipped here that the trial still
    suggests (a repair kept a step) is sampled on its own, as any new parameter is."""

    def __init__(self, inner: BaseSampler, roles: ParamRoles) -> None:
        super().__init__(inner)
        self.roles = roles

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        first = {n: d for n, d in search_space.items() if self.roles.chooses_sequence(n)}
        choices = self.inner.sample_relative(study, trial, first) if first else {}
        rest = {n: d for n, d in search_space.items()
                if n not in first and self.roles.in_use(choices, n)}
        return {**choices, **(self.inner.sample_relative(study, trial, rest) if rest else {})}
