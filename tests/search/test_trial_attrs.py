"""A trial's attributes in the study: written by the write_* functions and read back as
one typed record, with the defaults of a trial that never got so far, and the keys an
earlier version's studies hold."""

from __future__ import annotations

import optuna

from peak_tune.core import Status
from peak_tune.search.trials import (
    TrialAttrs,
    TrialRecord,
    write_interrupted,
    write_record,
    write_seconds,
    write_timing,
    write_variant,
)


def _trial() -> tuple[optuna.Study, optuna.Trial]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    return study, study.ask()


def test_what_is_written_reads_back_as_one_record() -> None:
    study, trial = _trial()
    record = TrialRecord(0, Status.OK, ("refactor", "tb-tiling"), {"BLOCK_M": 64}, 12.5,
                         "", cached=False, seconds=0.4)
    write_record(trial, record)
    write_variant(trial, "abc123")
    write_timing(trial, {"64x64x64": 12.5}, spread=0.1, noisy=True, remeasured=2)
    write_seconds(trial, {"build": 0.3, "time": 0.1})
    study.tell(trial, 12.5)
    attrs = TrialAttrs.of(study.trials[0])
    assert attrs == TrialAttrs(status="ok", sequence=("refactor", "tb-tiling"),
                               params={"BLOCK_M": 64}, cached=False, context_hash="abc123",
                               gflops_by_size={"64x64x64": 12.5}, spread=0.1, noisy=True,
                               remeasured=2, seconds={"build": 0.3, "time": 0.1})
    # the storage's own keys, as studies of earlier versions hold them
    assert study.trials[0].user_attrs["gflops"] == {"64x64x64": 12.5}


def test_a_trial_never_told_reads_as_the_defaults_and_an_interrupted_one_says_so() -> None:
    study, trial = _trial()
    assert TrialAttrs.of(trial) == TrialAttrs()
    assert write_interrupted(trial, "x" * 900)
    attrs = TrialAttrs.of(trial)
    assert attrs.interrupted and len(attrs.message) == 500
    told = study.ask()
    write_record(told, TrialRecord(1, Status.WRONG_RESULT, (), {}, 0.0, "wrong", False, 0.1))
    assert not write_interrupted(told, "stopped")  # told already: left as it was
    assert TrialAttrs.of(told).status == "wrong_result"
