"""Ordered tuning values (peak_tune.search.ordered): TPE's view of a tile-size choice
as positions in ascending order, so that good neighbours make a value likely."""

from __future__ import annotations

import warnings
from collections import Counter

import optuna
from optuna.distributions import CategoricalDistribution

from peak_tune.search.ordered import OrderedValues, OrdinalDistribution, ordinal
from peak_tune.search.samplers import make_sampler

SIZES = [8, 16, 32, 64, 128, 256, 512]


def test_a_choice_of_integers_becomes_their_positions_in_ascending_order():
    shown = ordinal(CategoricalDistribution([64, 16, 256, 32]))
    assert isinstance(shown, OrdinalDistribution)
    assert (shown.low, shown.high) == (0, 3)
    assert [shown.to_internal_repr(v) for v in (16, 32, 64, 256)] == [0.0, 1.0, 2.0, 3.0]
    assert [shown.to_external_repr(x) for x in (0.0, 1.4, 1.6, 3.0, 7.0)] == [16, 32, 64, 256,
                                                                             256]
    for unordered in ([False, True], ["a", "b", "c"], [1, 2], [1.5, 2.5, 3.5]):
        assert ordinal(CategoricalDistribution(unordered)) == CategoricalDistribution(unordered)


def _draws(sampler_name: str, seed: int) -> Counter[int]:
    """What the sampler draws after 32 was fast and 512 slow, six times each."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(sampler_name, seed))
    distribution = {"tb-tiling.BLOCK_M": CategoricalDistribution(SIZES)}
    for value, speed in [(32, 100.0), (512, 10.0)] * 6:
        study.add_trial(optuna.trial.create_trial(
            params={"tb-tiling.BLOCK_M": value}, distributions=distribution, value=speed))
    drawn: Counter[int] = Counter()
    for _ in range(60):
        trial = study.ask(distribution)
        drawn[trial.params["tb-tiling.BLOCK_M"]] += 1
        study.tell(trial, 50.0)
    # the study keeps the values and their categorical choice as a user set them
    assert all(isinstance(t.distributions["tb-tiling.BLOCK_M"], CategoricalDistribution)
               for t in study.trials)
    assert set(drawn) <= set(SIZES)
    return drawn


def test_a_fast_value_makes_its_neighbours_likely_not_every_untried_value():
    """Ordered, the octave either side of a fast 32 (16 and 64) is drawn more often than
    everything farther; as plain categories every untried value is as likely."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        ordered = sum((_draws("tpe-ordinal", seed) for seed in range(3)), Counter())
        plain = sum((_draws("tpe", seed) for seed in range(3)), Counter())

    def near_and_far(drawn: Counter[int]) -> tuple[int, int]:
        return drawn[16] + drawn[64], drawn[8] + drawn[128] + drawn[256] + drawn[512]

    near, far = near_and_far(ordered)
    assert near > far, ordered
    plain_near, plain_far = near_and_far(plain)
    assert plain_near < plain_far, plain  # what the ordered view changes
    assert near > plain_near


def test_the_view_keeps_finished_trials_and_leaves_the_study_as_it_is():
    sampler = OrderedValues(optuna.samplers.RandomSampler(seed=0))
    study = optuna.create_study(sampler=sampler)
    study.optimize(lambda t: t.suggest_categorical("x.TILE", [16, 32, 64]) +
                   int(t.suggest_categorical("use.x", [False, True])), n_trials=5)
    shown = sampler.shown(study.trials[0])
    assert isinstance(shown.distributions["x.TILE"], OrdinalDistribution)
    assert isinstance(shown.distributions["use.x"], CategoricalDistribution)
    assert shown.params == study.trials[0].params
    assert sampler.shown(study.trials[0]) is shown  # finished: worked out once
    assert isinstance(study.trials[0].distributions["x.TILE"], CategoricalDistribution)
