"""TuneConfig: five typed parts, one flat vocabulary of option names for the CLI, batch
files and the benchmarks, and every choice checked once."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from peak_tune.backends.base import EvalConfig
from peak_tune.errors import UserError
from peak_tune.session.config import (
    CHOICES,
    OPTIONS,
    ApplierSettings,
    Encoding,
    ExecutorChoice,
    SearchSettings,
    TellOrder,
    TuneConfig,
)


def test_a_choice_given_as_text_is_held_as_its_enum() -> None:
    config = TuneConfig.of(encoding="steps", tell_order="finished", executor="local")
    assert config.search.encoding is Encoding.STEPS
    assert config.search.tell_order is TellOrder.FINISHED
    assert config.run.executor is ExecutorChoice.LOCAL
    assert config.search.encoding == "steps"  # and still equals its text


@pytest.mark.parametrize("field", sorted(CHOICES))
def test_a_choice_outside_its_list_names_the_option_and_what_it_allows(field: str) -> None:
    with pytest.raises(UserError) as raised:
        TuneConfig.of(**{field: "bogus"})
    option = "--" + field.replace("_", "-")
    assert str(raised.value) == (f"{option} must be one of {', '.join(CHOICES[field])}, "
                                 f"not 'bogus'")


def test_a_changed_part_is_checked_again() -> None:
    with pytest.raises(UserError, match="--illegal must be one of repair, prune"):
        dataclasses.replace(SearchSettings(), illegal="ignore")
    with pytest.raises(UserError, match="--applier must be one of"):
        TuneConfig.of().with_options(applier="oracle")


def test_each_option_lands_in_its_part_and_the_rest_keep_their_defaults() -> None:
    config = TuneConfig.of(kernel="softmax", sampler="random", apply_workers=3,
                           applier="llm", study="s1", results=Path("r"), ray_workers=2,
                           eval_config=EvalConfig(repeats=3))
    assert (config.target.kernel, config.search.sampler) == ("softmax", "random")
    assert config.applier == ApplierSettings(name="llm", workers=3)
    assert (config.store.study, config.store.results) == ("s1", Path("r"))
    assert config.run.ray_workers == 2 and config.run.eval_config.repeats == 3
    assert config.search.polish == SearchSettings().polish  # untouched
    again = config.with_options(sampler="cmaes")
    assert again.search.sampler == "cmaes" and again.applier is config.applier
    assert OPTIONS["apply_workers"] == ("applier", "workers")
    assert OPTIONS["applier"] == ("applier", "name")
    assert "name" not in OPTIONS and "workers" not in OPTIONS  # only the option names


def test_an_unknown_option_is_named() -> None:
    with pytest.raises(UserError, match="unknown tuning options: colour, speed"):
        TuneConfig.of(speed=1, colour="red")
