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

from peak_tune.catalog.sequences import check_sequence
from peak_tune.core import KernelContext, Status
from peak_tune.errors import ApplyError, InvalidPoint
from peak_tune.session.tune import TuneSession

__all__ = ["legal_sequences", "record_space"]


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
