"""TuneConfig: every choice checked once, for the CLI, batch files and the workbench."""

from __future__ import annotations

import dataclasses

import pytest

from peak_tune.errors import UserError
from peak_tune.session.config import CHOICES, Encoding, TellOrder, TuneConfig


def test_a_choice_given_as_text_is_held_as_its_enum() -> None:
    config = TuneConfig(encoding="steps", tell_order="finished")
    assert config.encoding is Encoding.STEPS and config.tell_order is TellOrder.FINISHED
    assert config.encoding == "steps"  # and still equals its text


@pytest.mark.parametrize("field", sorted(CHOICES))
def test_a_choice_outside_its_list_names_the_option_and_what_it_allows(field: str) -> None:
    with pytest.raises(UserError) as raised:
        TuneConfig(**{field: "bogus"})
    option = "--" + field.replace("_", "-")
    assert str(raised.value) == (f"{option} must be one of {', '.join(CHOICES[field])}, "
                                 f"not 'bogus'")


def test_a_changed_config_is_checked_again() -> None:
    with pytest.raises(UserError, match="--illegal must be one of repair, prune"):
        dataclasses.replace(TuneConfig(), illegal="ignore")
