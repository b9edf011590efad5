"""Record every point of a (small) search space with a real backend, for replay.

The recording is what `ReplayBackend` serves: outcomes keyed by sequence, parameter
values and size, plus the vendor's timing from the same run.
"""

from __future__ import annotations

import datetime
import itertools
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import optuna

from peak_tune.backends.replay import replay_key
from peak_tune.catalog.sequences import check_sequence
from peak_tune.core import KernelContext, Status
from peak_tune.errors import ApplyError, InvalidPoint
from peak_tune.harness.vendor import VENDOR_ATTR, figures_from_json
from peak_tune.search.trials import TrialAttrs
from peak_tune.session.tune import TuneSession
from peak_tune.study.storage import results_storage_url

__all__ = ["legal_sequences", "record_space", "study_outcomes"]


def legal_sequences(session: TuneSession, ids: Sequence[str]) -> Iterator[list[str]]:
    """Every ordering of every subset of `ids` that the catalog allows (seed first)."""
    for length in range(len(ids) + 1):
        for sequence in itertools.permutations(ids, length):
            try:
                check_sequence(sequence, session.transformations)
            except InvalidPoint:
                continue
            yield list(sequence)


def _param_points(variant: KernelContext) -> Iterator[dict[str, int]]:
    names = [p.name for p in variant.params]
    for values in itertools.product(*(p.values for p in variant.params)):
        yield dict(zip(names, values, strict=True))


def record_space(session: TuneSession, ids: Sequence[str], output: Path) -> int:
    """Evaluate every legal point at the session's sizes; write the recording."""
    session.measure_vendor()
    outcomes: list[dict[str, Any]] = []
    for sequence in legal_sequences(session, ids):
        try:
            variant = session.pipeline.build(sequence)[-1]
        except (InvalidPoint, ApplyError):
            continue
        for params in _param_points(variant):
            for size in session.sizes:
                outcome = session.pipeline.evaluate(variant, params, size)
                if outcome.status is Status.INVALID:
                    continue
                m = outcome.measurement
                outcomes.append({
                    "sequence": sequence, "params": params, "size": size.label(),
                    "status": outcome.status.value, "message": outcome.message,
                    "samples_ms": list(m.samples_ms) if m else None,
                    "flops": m.flops if m else None,
                })
    vendor = {label: {"name": name, "samples_ms": list(m.samples_ms), "flops": m.flops}
              for label, (name, m) in session.vendors.chosen.items()}
    output.write_text(json.dumps({
        "recorded": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "backend": session.backend.name,
        "device": dict(session.backend.fingerprint()),
        "dtype": session.config.target.dtype,
        "transformations": list(ids),
        "vendor": vendor,
        "outcomes": outcomes,
    }, indent=0))
    return len(outcomes)


# a told trial's status -> the recording's (INVALID is kept: a point the backend refused
# at build time, e.g. ptxas out of registers, is pruned on replay as it was when recorded)
_RECORDED = {s.value for s in Status} - {Status.APPLY_ERROR.value}


def study_outcomes(results: Path, studies: Sequence[str]
                   ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every distinct point that the named studies in `results`' storage told, as a
    recording's outcomes (a point told more than once, by a cache hit or by another
    study, keeps its first timing), and the first study's vendor figures at each size."""
    url = results_storage_url(results)
    outcomes: dict[str, dict[str, Any]] = {}
    vendor: dict[str, Any] = {}
    for name in studies:
        study = optuna.load_study(study_name=name, storage=url)
        for label, figure in figures_from_json(study.user_attrs.get(VENDOR_ATTR)).items():
            chosen = figure.chosen()
            if chosen is not None and label not in vendor:
                vendor[label] = {"name": figure.name, "samples_ms": list(chosen.samples_ms),
                                 "flops": chosen.flops}
        for trial in study.get_trials(deepcopy=False):
            attrs = TrialAttrs.of(trial)
            if attrs.status not in _RECORDED:
                continue
            sizes = attrs.gflops_by_size or {label: 0.0 for label in vendor}
            for label, gflops in sizes.items():
                key = replay_key(attrs.sequence, attrs.params, label)
                if key in outcomes or (attrs.status == Status.OK.value and gflops <= 0):
                    continue
                flops = vendor[label]["flops"] if label in vendor else 0.0
                outcomes[key] = {
                    "sequence": list(attrs.sequence), "params": attrs.params,
                    "size": label, "status": attrs.status,
                    "message": attrs.message.splitlines()[0][:200] if attrs.message else "",
                    # the harness's median, as one sample (what replay's ratio reads)
                    "samples_ms": [flops / gflops / 1e6] if gflops > 0 else None,
                    "flops": flops or None,
                }
    return list(outcomes.values()), vendor
