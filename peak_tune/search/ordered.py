"""Tile sizes as ordered values: TPE learns that 64 lies between 32 and 128.

Tuning values are suggested as categorical choices (`<id>.<MACRO>` over the declared
values, e.g. 16, 32, 64, 128, 256), and TPE's kernel over a categorical choice gives
weight only to the values the good trials used: a good 64 says nothing about 32 or 128.
`OrderedValues` shows the wrapped sampler every categorical choice of three or more
integers as an integer distribution over the sorted values' positions
(`OrdinalDistribution`), whose Parzen kernels spread to the neighbouring values, an
octave at a time for powers of two. Only the sampler's view changes: the study stores
and suggests the values as before, and the drawn position is given back as its value.

Relative sampling (TPE's multivariate groups) sees the ordered view; a value sampled on
its own (a new parameter, too few trials) stays categorical, since the random sampler
TPE falls back to would return a position where a value is expected.
"""

from __future__ import annotations

import copy
from collections.abc import Container
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from peak_tune.search.focus import Forwarding, StudyView

__all__ = ["OrderedValues", "OrdinalDistribution", "ordinal"]

_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


class OrdinalDistribution(IntDistribution):
    """The positions 0 .. n-1 of a categorical choice's values in ascending order:
    internal representation a position, external the value there."""

    def __init__(self, categorical: CategoricalDistribution) -> None:
        super().__init__(0, len(categorical.choices) - 1)
        self.categorical = categorical
        self.ordered = tuple(sorted(categorical.choices))  # type: ignore[type-var]

    def to_external_repr(self, param_value_in_internal_repr: float) -> Any:
        position = min(max(int(round(param_value_in_internal_repr)), 0), len(self.ordered) - 1)
        return self.ordered[position]

    def to_internal_repr(self, param_value_in_external_repr: Any) -> float:
        return float(self.ordered.index(param_value_in_external_repr))


def ordinal(distribution: BaseDistribution) -> BaseDistribution:
    """`distribution` as the ordered view shows it: a categorical choice among three or
    more integers (not booleans) becomes an OrdinalDistribution."""
    if isinstance(distribution, CategoricalDistribution) and len(distribution.choices) >= 3 \
            and all(type(c) is int for c in distribution.choices):
        return OrdinalDistribution(distribution)
    return distribution


def _categorical(distribution: BaseDistribution) -> BaseDistribution:
    return distribution.categorical if isinstance(distribution, OrdinalDistribution) \
        else distribution


class OrderedValues(Forwarding):
    """`inner` samples relatively from a view of the study in which categorical
    integer choices are ordinal (module docstring); what it infers and draws is given
    back in the study's own distributions and values."""

    def __init__(self, inner: optuna.samplers.BaseSampler) -> None:
        super().__init__(inner)
        self._shown: dict[int, FrozenTrial] = {}  # finished trials as the view shows them
        self._ordinals: dict[tuple[Any, ...], BaseDistribution] = {}

    def _ordinal(self, distribution: BaseDistribution) -> BaseDistribution:
        if not isinstance(distribution, CategoricalDistribution):
            return distribution
        key = tuple(distribution.choices)
        if key not in self._ordinals:
            self._ordinals[key] = ordinal(distribution)
        return self._ordinals[key]

    def shown(self, trial: FrozenTrial) -> FrozenTrial:
        """`trial` with its categorical integer choices ordinal (kept once finished)."""
        kept = self._shown.get(trial.number)
        if kept is not None and kept.state == trial.state:
            return kept
        view = copy.copy(trial)
        view.distributions = {n: self._ordinal(d) for n, d in trial.distributions.items()}
        if trial.state in _FINISHED:
            self._shown[trial.number] = view
        return view

    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        space = self.inner.infer_relative_search_space(
            _OrderedStudy(study, self), trial)  # type: ignore[arg-type]
        return {n: _categorical(d) for n, d in space.items()}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        ordered = {n: self._ordinal(d) for n, d in search_space.items()}
        return self.inner.sample_relative(_OrderedStudy(study, self), trial,  # type: ignore[arg-type]
                                          ordered)


class _OrderedStudy(StudyView):
    """The study as the wrapped sampler sees it: its trials through `OrderedValues.shown`."""

    def __init__(self, study: optuna.Study, ordered: OrderedValues) -> None:
        super().__init__(study)
        self._ordered = ordered

    def _get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None,
                    use_cache: bool = False) -> list[FrozenTrial]:
        trials = self._study._get_trials(deepcopy=False, states=states, use_cache=use_cache)
        shown = [self._ordered.shown(t) for t in trials]
        return copy.deepcopy(shown) if deepcopy else shown
