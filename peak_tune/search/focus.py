"""Keeping the sampler's ask cheap, so that the driver never becomes a study's limit.

Optuna's TPE (multivariate, grouped) rebuilds its Parzen estimators at every ask, for
every group of parameters the study has ever seen and from every trial: with the CUDA
catalog's ~25 groups an ask cost 0.2-0.3 s on a 2-core VM, which capped a study at about
4 trials/s whatever the GPUs could do. Two wrappers, both transparent to TPE:

- `HistoryWindow` shows the sampler every running trial (the constant liar needs
  them), the best finished ones and the most recent ones, so an ask costs the same at
  trial 5000 as at 200. TPE's "good" set is the best tenth of what it sees, at most 25
  trials: with `keep_best` >= 25 it is what the whole history would give; the "bad" set
  becomes the recent part of the rest. Until a study outgrows the window nothing changes.
- The window also spares TPE's group decomposition its repeats: TPE keeps its groups
  between asks but adds every trial's parameter set to them again at every ask, and
  adding a set it has seen changes nothing, so it is shown only the trials whose set of
  parameter names is new (at the CUDA catalog's ~200 trials and ~50 groups that was a
  tenth of every ask).
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

__all__ = ["FixedFirst", "Forwarding", "HistoryWindow", "ParamRoles", "SequenceFirst",
           "StudyView"]

_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
_UNFINISHED = (TrialState.RUNNING, TrialState.WAITING)


class ParamRoles(Protocol):
    """What a sequence encoding knows about its parameter names."""

    def chooses_sequence(self, name: str) -> bool:
        """`name` is part of the choice of sequence (sampled before the rest)."""
        ...

    def in_use(self, choices: Mapping[str, Any], name: str) -> bool:
        """Given the sequence `choices`, whether the trial may suggest `name`."""
        ...


class Forwarding(BaseSampler):
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


class HistoryWindow(Forwarding):
    """`inner` samples from the best `keep_best` completed trials, the latest
    `keep_recent` finished ones and every running or waiting one."""

    def __init__(self, inner: BaseSampler, keep_best: int = 50, keep_recent: int = 150) -> None:
        if keep_best < 1 or keep_recent < 1:
            raise ValueError("keep_best and keep_recent must be 1 or more")
        super().__init__(inner)
        self.keep_best = keep_best
        self.keep_recent = keep_recent
        self._shapes_seen: set[frozenset[str]] = set()  # parameter sets shown to the groups
        self._kept: set[int] = set()  # the window's finished trials, by number ...
        self._kept_for = (-1, -1)  # ... for this many trials and finished trials
        # The window of the ask in progress, for (the asked trial's number, the number of
        # trials): an ask reads it once per parameter group (~20 times), and nothing it
        # shows changes before the ask ends (the asked trial itself, whose parameters
        # grow, TPE leaves out); forgotten at every trial's start and end as well. At
        # trial 2000 the scans were a fifth of an ask.
        self._this_ask: tuple[tuple[int, int], list[FrozenTrial]] | None = None

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._this_ask = None
        self.inner.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Any) -> None:
        self._this_ask = None
        self.inner.after_trial(study, trial, state, values)

    def _view(self, study: optuna.Study, trial: FrozenTrial) -> optuna.Study:
        return _WindowedStudy(study, self, trial.number)  # type: ignore[return-value]

    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        view = _WindowedStudy(study, self, trial.number,
                              new_shapes_only=_decomposes_in_groups(self.inner))
        return self.inner.infer_relative_search_space(view, trial)  # type: ignore[arg-type]

    def new_shapes(self, trials: list[FrozenTrial]) -> list[FrozenTrial]:
        """The trials whose set of parameter names has not been shown before (and are
        finished: a running trial's set may still grow); they count as shown now."""
        fresh = []
        for trial in trials:
            shape = frozenset(trial.distributions)
            if trial.state in _FINISHED and shape not in self._shapes_seen:
                self._shapes_seen.add(shape)
                fresh.append(trial)
        return fresh

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return self.inner.sample_relative(self._view(study, trial), trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.inner.sample_independent(self._view(study, trial), trial, param_name,
                                             param_distribution)

    def window(self, trials: list[FrozenTrial], direction: StudyDirection,
               asking: int = -1) -> list[FrozenTrial]:
        """The trials the sampler sees while it asks for trial number `asking`, in study
        order (failed ones never: TPE ignores them). The kept numbers are worked out
        again only when a trial has finished or started since the last call."""
        key = (asking, len(trials))
        if self._this_ask is None or self._this_ask[0] != key or asking < 0:
            self._this_ask = key, self._window(trials, direction)
        return self._this_ask[1]

    def _window(self, trials: list[FrozenTrial], direction: StudyDirection
                ) -> list[FrozenTrial]:
        finished = [t for t in trials if t.state in _FINISHED]
        if len(finished) <= self.keep_best + self.keep_recent:
            return [t for t in trials if t.state in _FINISHED or t.state in _UNFINISHED]
        key = (len(trials), len(finished))  # trials only start and finish: the same set
        if self._kept_for != key:
            sign = 1.0 if direction == StudyDirection.MAXIMIZE else -1.0
            complete = (t for t in finished if t.state == TrialState.COMPLETE and t.values)
            self._kept = {t.number for t in heapq.nlargest(self.keep_best, complete,
                                                           key=lambda t: sign * t.values[0])}
            self._kept.update(t.number for t in finished[-self.keep_recent:])
            self._kept_for = key
        return [t for t in trials if t.number in self._kept or t.state in _UNFINISHED]


class StudyView:
    """A study as a wrapped sampler sees it: everything as is but its trials, which a
    subclass's `_get_trials` chooses or changes (Optuna's samplers read them there)."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None,
                    use_cache: bool = False) -> list[FrozenTrial]:
        raise NotImplementedError

    def get_trials(self, deepcopy: bool = True,
                   states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        return self._get_trials(deepcopy, states)


class _WindowedStudy(StudyView):
    """The study as the wrapped sampler sees it: everything as is, but fewer trials."""

    def __init__(self, study: optuna.Study, history: HistoryWindow, asking: int,
                 new_shapes_only: bool = False) -> None:
        super().__init__(study)
        self._history = history
        self._asking = asking  # the number of the trial being asked for
        self._new_shapes_only = new_shapes_only

    def _get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None,
                    use_cache: bool = False) -> list[FrozenTrial]:
        every = self._study._get_trials(deepcopy=False, use_cache=use_cache)
        if not self._study._is_multi_objective():  # Pareto fronts need every trial
            every = self._history.window(every, self._study.direction, self._asking)
        chosen = every if states is None else [t for t in every if t.state in states]
        if self._new_shapes_only:
            chosen = self._history.new_shapes(chosen)
        return copy.deepcopy(chosen) if deepcopy else chosen


def _decomposes_in_groups(sampler: BaseSampler) -> bool:
    """TPE with group=True: its group decomposition only ever refines, so a parameter set
    it has been given once never changes it again."""
    while isinstance(sampler, Forwarding):  # e.g. search.ordered's view in between
        sampler = sampler.inner
    return isinstance(sampler, optuna.samplers.TPESampler) and bool(
        getattr(sampler, "_group", False))


class SequenceFirst(Forwarding):
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


class FixedFirst(Forwarding):
    """No relative sampling for a trial that was enqueued with fixed parameters (drawn
    by the sampler process, a polisher's neighbour, a warm start): a value it lacks is
    sampled on its own. Without this, one such value made `inner` draw every group of
    the trial again only to use none of them."""

    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if trial.system_attrs.get("fixed_params"):
            return {}
        return self.inner.infer_relative_search_space(study, trial)
