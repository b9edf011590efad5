"""Finished trials into an Optuna RDB study, many in one transaction.

`Study.add_trial` costs the study writer about 45 ms of SQLAlchemy per trial of the CUDA
catalog (26 parameters, 8 attributes): for every parameter it looks the trial up again
and checks the parameter's distribution against the study's earlier trials, three
queries each. A GPU study on the H200 finishes 14-18 trials a second, faster than that,
so the writer fell behind and a 200 s run waited another minute at its end for it.

The writer's trials come from the driver's in-memory study, whose storage has already
checked every distribution, and they are finished: `add_finished` inserts their rows
directly with Optuna's own table models, a batch per transaction, numbering each trial
as Optuna does. The models are Optuna's internals (stable since its 3.0 schema); if they
are not what this module expects, `add_finished` says so by raising `Unsupported`, and
the writer goes back to `Study.add_trial`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial

__all__ = ["Unsupported", "add_finished"]


class Unsupported(Exception):
    """This Optuna's storage is not the RDB schema add_finished writes."""


def add_finished(study: optuna.Study, trials: Sequence[FrozenTrial]) -> list[int]:
    """Append finished `trials` to `study` (an RDB storage) in one transaction; the
    numbers the study gave them."""
    try:
        from optuna.storages import RDBStorage
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session
    except ImportError as exc:
        raise Unsupported(str(exc)) from exc
    storage: Any = getattr(study, "_storage", None)
    storage = getattr(storage, "_backend", storage)  # under Optuna's cache wrapper
    if not isinstance(storage, RDBStorage):
        raise Unsupported(f"not an RDB storage: {type(storage).__name__}")
    study_id = study._study_id
    try:
        with _create_scoped_session(storage.scoped_session) as session:
            # the lock Optuna takes to number trials
            models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
            numbers = [_insert(session, models, study_id, trial) for trial in trials]
    except AttributeError as exc:  # a model or helper of another Optuna (rolled back)
        raise Unsupported(f"Optuna's table models differ: {exc}") from exc
    return numbers


def _insert(session: Any, models: Any, study_id: int, trial: FrozenTrial) -> int:
    row = models.TrialModel(study_id=study_id, number=None, state=trial.state,
                            datetime_start=trial.datetime_start,
                            datetime_complete=trial.datetime_complete)
    session.add(row)
    session.flush()  # its trial_id, for the rows below
    rows: list[Any] = []
    for objective, value in enumerate(trial.values or ()):
        stored, kind = models.TrialValueModel.value_to_stored_repr(value)
        rows.append(models.TrialValueModel(trial_id=row.trial_id, objective=objective,
                                           value=stored, value_type=kind))
    for name, value in trial.params.items():
        distribution = trial.distributions[name]
        rows.append(models.TrialParamModel(
            trial_id=row.trial_id, param_name=name,
            param_value=distribution.to_internal_repr(value),
            distribution_json=optuna.distributions.distribution_to_json(distribution)))
    for key, value in trial.user_attrs.items():
        rows.append(models.TrialUserAttributeModel(trial_id=row.trial_id, key=key,
                                                   value_json=json.dumps(value)))
    for key, value in trial.system_attrs.items():
        rows.append(models.TrialSystemAttributeModel(trial_id=row.trial_id, key=key,
                                                     value_json=json.dumps(value)))
    for step, value in trial.intermediate_values.items():
        stored, kind = models.TrialIntermediateValueModel.intermediate_value_to_stored_repr(
            value)
        rows.append(models.TrialIntermediateValueModel(
            trial_id=row.trial_id, step=step, intermediate_value=stored,
            intermediate_value_type=kind))
    session.add_all(rows)
    row.number = row.count_past_trials(session)
    return int(row.number)
