"""Optuna samplers by name (`--sampler`)."""

from __future__ import annotations

import warnings

import optuna

from peak_tune.errors import UserError
from peak_tune.search.focus import HistoryWindow, ParamRoles, SequenceFirst
from peak_tune.search.ordered import OrderedValues

__all__ = ["SAMPLERS", "make_sampler", "is_multi_objective"]

SAMPLERS = ("tpe", "tpe-ordinal", "random", "cmaes", "gp", "nsga2")


def _tpe(seed: int | None, ordered: bool = False) -> optuna.samplers.BaseSampler:
    with warnings.catch_warnings():  # multivariate, group and constant_liar are "experimental"
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _tpe_sampler(seed, ordered)


def _tpe_sampler(seed: int | None, ordered: bool) -> optuna.samplers.BaseSampler:
    # multivariate + group: sequences switch parameters on and off (conditional spaces);
    # constant_liar keeps parallel workers from drawing the same point; the history
    # window keeps an ask from growing slower with every trial (peak_tune.search.focus).
    tpe = optuna.samplers.TPESampler(
        seed=seed, multivariate=True, group=True, constant_liar=True, n_startup_trials=10)
    return HistoryWindow(OrderedValues(tpe) if ordered else tpe)


def make_sampler(name: str, seed: int | None,
                 roles: ParamRoles | None = None) -> optuna.samplers.BaseSampler:
    """`roles` (the sequence encoding) lets TPE draw the sequence first and then only
    the values that sequence uses."""
    if name in ("tpe", "tpe-ordinal"):
        tpe = _tpe(seed, ordered=name == "tpe-ordinal")
        return tpe if roles is None else SequenceFirst(tpe, roles)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        # CMA-ES models the numeric choices (step positions); the categorical ones
        # (which transformations, tile sizes) go to TPE.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return optuna.samplers.CmaEsSampler(
                seed=seed, independent_sampler=_tpe(seed), warn_independent_sampling=False)
    if name == "gp":
        try:
            import torch  # noqa: F401
        except ImportError as exc:
            raise UserError("the gp sampler needs PyTorch: pip install torch") from exc
        return optuna.samplers.GPSampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    raise UserError(f"unknown sampler {name!r} (choose from {', '.join(SAMPLERS)})")


def is_multi_objective(name: str) -> bool:
    """NSGA-II optimises speed and cost (sequence length) together."""
    return name == "nsga2"
