"""The sampler's ask stays cheap: a bounded history, and only the values a sequence uses."""

from __future__ import annotations

import warnings
from typing import Any

import optuna
import pytest
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from peak_tune.catalog.types import Transformation
from peak_tune.core import ParamDomain
from peak_tune.search.focus import HistoryWindow, SequenceFirst
from peak_tune.search.samplers import make_sampler
from peak_tune.search.space import SubsetEncoding, suggest_params

optuna.logging.set_verbosity(optuna.logging.WARNING)


def objective(trial: optuna.Trial) -> float:
    x = trial.suggest_float("x", -4.0, 4.0)
    tile = trial.suggest_categorical("tile", [8, 16, 32, 64])
    return -(x - 1.0) ** 2 - abs(tile - 32) / 8


class Recording(optuna.samplers.TPESampler):
    """TPE that notes how many trials (and which states) each relative sample saw."""

    def __init__(self) -> None:
        super().__init__(seed=0, multivariate=True, n_startup_trials=3)
        self.seen: list[list[FrozenTrial]] = []

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        self.seen.append(study.get_trials(deepcopy=False))
        return super().sample_relative(study, trial, search_space)


def test_the_sampler_sees_the_best_the_latest_and_the_running():
    inner = Recording()
    study = optuna.create_study(direction="maximize",
                                sampler=HistoryWindow(inner, keep_best=3, keep_recent=5))
    study.optimize(objective, n_trials=30)
    running = study.ask()
    running.suggest_float("x", -4.0, 4.0)  # TPE samples on the first suggestion
    last = inner.seen[-1]
    finished = [t for t in study.trials if t.state == TrialState.COMPLETE]
    best = sorted(finished, key=lambda t: -t.values[0])[:3]
    assert {t.number for t in last} == ({t.number for t in best}
                                        | {t.number for t in finished[-5:]} | {running.number})
    assert [t.number for t in last] == sorted(t.number for t in last)  # study order
    assert max(len(seen) for seen in inner.seen) <= 3 + 5 + 1


def test_a_study_inside_the_window_samples_exactly_as_plain_tpe():
    def run(sampler: optuna.samplers.BaseSampler) -> list[dict[str, Any]]:
        study = optuna.create_study(direction="maximize", sampler=sampler)
        study.optimize(objective, n_trials=25)
        return [t.params for t in study.trials]

    plain = optuna.samplers.TPESampler(seed=3, multivariate=True, n_startup_trials=5)
    windowed = HistoryWindow(optuna.samplers.TPESampler(seed=3, multivariate=True,
                                                        n_startup_trials=5))
    assert run(windowed) == run(plain)


def conditional(trial: optuna.Trial) -> float:
    """Branches with parameters of their own (TPE's groups), and some failures."""
    branch = trial.suggest_categorical("branch", ["a", "b", "c"])
    x = trial.suggest_float(f"x_{branch}", -4.0, 4.0)
    if branch == "b":
        x += trial.suggest_int("shift", -2, 2)
    if branch == "c" and x > 3.0:
        raise RuntimeError("fails, as a kernel that does not build")
    return -(x - 1.0) ** 2


def test_grouped_tpe_shown_only_new_parameter_sets_samples_as_plain_tpe():
    """The group decomposition is given each set of parameter names once, and failed
    trials never: the same draws as TPE that sees everything at every ask."""
    def run(sampler: optuna.samplers.BaseSampler) -> list[dict[str, Any]]:
        study = optuna.create_study(direction="maximize", sampler=sampler)
        study.optimize(conditional, n_trials=40, catch=(RuntimeError,))
        return [t.params for t in study.trials]

    def tpe() -> optuna.samplers.TPESampler:
        with warnings.catch_warnings():  # group is "experimental"
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=5, multivariate=True, group=True,
                                              n_startup_trials=5)

    windowed = run(HistoryWindow(tpe()))
    assert windowed == run(tpe())
    assert {p["branch"] for p in windowed} == {"a", "b", "c"}


def test_the_window_keeps_finding_the_optimum():
    study = optuna.create_study(direction="maximize", sampler=HistoryWindow(
        optuna.samplers.TPESampler(seed=1, multivariate=True), keep_best=10, keep_recent=20))
    study.optimize(objective, n_trials=120)
    assert study.best_value > -0.05  # x near 1, tile 32


def test_window_sizes_must_be_positive():
    with pytest.raises(ValueError, match="1 or more"):
        HistoryWindow(optuna.samplers.RandomSampler(), keep_best=0)


def step(tid: str, *params: str) -> Transformation:
    return Transformation(id=tid, version=1, title=tid, kernels=("matmul",), backends=("c",),
                          requires=(), conflicts=(), passes=(), constraints=(),
                          params=tuple(ParamDomain(name, (1, 2, 4, 8), tid) for name in params))


class Spy(optuna.samplers.BaseSampler):
    """Hands every call to the real TPE and remembers what was sampled relatively."""

    def __init__(self) -> None:
        self.tpe = make_sampler("tpe", 0)
        self.relative: list[set[str]] = []

    def infer_relative_search_space(self, study, trial):
        return self.tpe.infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        drawn = self.tpe.sample_relative(study, trial, search_space)
        self.relative.append(set(drawn))
        return drawn

    def sample_independent(self, study, trial, name, distribution):
        return self.tpe.sample_independent(study, trial, name, distribution)


def owner(name: str) -> str:
    prefix, _, rest = name.partition(".")
    return rest if prefix == "pos" else prefix


def test_only_the_values_of_chosen_steps_are_drawn():
    steps = {t.id: t for t in (step("a", "A_TILE"), step("b", "B_TILE", "B_UNROLL"),
                               step("c", "C_TILE"))}
    encoding = SubsetEncoding(steps, repair=True)
    spy = Spy()
    study = optuna.create_study(direction="maximize", sampler=SequenceFirst(spy, encoding))
    for _ in range(40):
        before = len(spy.relative)
        trial = study.ask()
        sequence = encoding.suggest(trial)  # TPE samples on the first suggestion
        later = {n for drawn in spy.relative[before:] for n in drawn if not n.startswith("use.")}
        values = {}
        for tid in sequence:  # the values of the chosen steps, as the pipeline asks them
            values.update(suggest_params(trial, _context(steps[tid])))
        study.tell(trial, sum(values.values()) + 3 * ("b" in sequence))
        assert {owner(n) for n in later} <= set(sequence)
    assert any("b.B_TILE" in drawn for drawn in spy.relative)  # values are still learned
    assert study.best_trial.params["use.b"] is True


def _context(transformation: Transformation) -> Any:
    class Context:  # what suggest_params reads of a variant
        params = transformation.params
    return Context


class Unremembered(HistoryWindow):
    """The window worked out again at every read, as before it was kept per ask."""

    scans = 0

    def window(self, trials: list[FrozenTrial], direction: Any,
               asking: int = -1) -> list[FrozenTrial]:
        Unremembered.scans += 1
        return self._window(trials, direction)


def test_the_window_is_worked_out_once_per_ask_and_samples_the_same():
    def run(sampler: HistoryWindow) -> list[dict[str, Any]]:
        study = optuna.create_study(direction="maximize", sampler=sampler)
        study.optimize(conditional, n_trials=60, catch=(RuntimeError,))
        return [t.params for t in study.trials]

    def tpe() -> optuna.samplers.TPESampler:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=7, multivariate=True, group=True,
                                              n_startup_trials=5)

    kept = HistoryWindow(tpe(), keep_best=3, keep_recent=5)
    scans: list[int] = []
    original = kept._window

    def counted(trials: list[FrozenTrial], direction: Any) -> list[FrozenTrial]:
        scans.append(len(trials))
        return original(trials, direction)

    kept._window = counted  # type: ignore[method-assign]
    assert run(kept) == run(Unremembered(tpe(), keep_best=3, keep_recent=5))
    assert Unremembered.scans > 2 * len(scans) and len(scans) <= 60  # once per ask at most
