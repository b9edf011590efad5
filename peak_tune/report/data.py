"""What a report shows of one study, read from its storage (and the LLM journal beside
the cache): typed values the pictures are drawn from."""

from __future__ import annotations

import datetime
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import optuna
from optuna.trial import FrozenTrial, TrialState

from peak_tune.catalog.resolve import Catalog
from peak_tune.catalog.roofline import roofline
from peak_tune.core import ProblemSize, Status, geometric_mean, size_of
from peak_tune.errors import UserError
from peak_tune.harness.vendor import VENDOR_ATTR, figures_from_json
from peak_tune.search.trials import TrialAttrs
from peak_tune.session.confirmation import CONFIRM_ATTR, Confirmation

__all__ = ["PHASES", "StepSpeed", "StudyReport", "TrialPoint", "read_study"]

PHASES = ("ask", "apply", "build", "wait", "evaluate")  # a trial's "seconds" attribute
OUTCOMES = tuple(s.value for s in Status)


@dataclass(frozen=True)
class TrialPoint:
    number: int
    status: str  # a Status value, or "interrupted"
    gflops: float  # 0 unless OK
    sequence: tuple[str, ...]
    minutes: float  # since the study's first trial started
    cached: bool
    seconds: dict[str, float]


@dataclass(frozen=True)
class StepSpeed:
    """The best sequence's prefix after `step` steps ("" for the seed): the fastest
    finished trial of exactly that sequence, None when the study tried none."""

    step: str
    gflops: float | None


@dataclass(frozen=True)
class StudyReport:
    name: str
    identity: dict[str, object]
    trials: list[TrialPoint]
    vendor_gflops: float  # 0: none measured
    vendor_name: str
    peak_gflops: float  # the device's roofline on the kernel (catalog.roofline; 0: none)
    confirmed_gflops: float  # the end-of-run re-timing of the best (0: none)
    best_steps: list[StepSpeed]
    llm: dict[str, float] = field(default_factory=dict)  # calls, tokens, cost_usd
    # per transformation, model and position: applications, successes, each step
    # check's failures, repairs (appliers.llm.stats.summarize)
    llm_steps: list[dict[str, object]] = field(default_factory=list)

    @property
    def finished(self) -> list[TrialPoint]:
        return [t for t in self.trials if t.status == Status.OK.value]

    @property
    def best(self) -> TrialPoint | None:
        return max(self.finished, key=lambda t: t.gflops, default=None)

    def outcomes_by(self, key: str) -> dict[str, Counter[str]]:
        """Outcome counts per transformation (`key` "transformation": the trials whose
        sequence holds it) or per position in the sequence ("position": 1, 2, ...)."""
        found: dict[str, Counter[str]] = defaultdict(Counter)
        for t in self.trials:
            labels = (t.sequence if key == "transformation"
                      else [str(i) for i in range(1, len(t.sequence) + 1)])
            for label in labels or (["(seed)"] if key == "transformation" else []):
                found[label][t.status] += 1
        return dict(sorted(found.items(), key=lambda kv: (kv[0].isdigit() and int(kv[0]),
                                                           kv[0])))

    def time_spent(self) -> dict[str, float]:
        """Seconds per phase over every trial (trials of older runs hold none)."""
        return {phase: sum(t.seconds.get(phase, 0.0) for t in self.trials)
                for phase in PHASES}


def read_study(storage: optuna.storages.BaseStorage, name: str, cache_folder: Path,
               catalogs: tuple[str, ...] = ()) -> StudyReport:
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise UserError(f"no study {name!r} in the storage") from None
    frozen = study.get_trials(deepcopy=False)
    started = min((t.datetime_start for t in frozen if t.datetime_start), default=None)
    trials = [_point(t, started) for t in frozen if t.state.is_finished()]
    identity = dict(study.user_attrs.get("identity", {}))
    figures = figures_from_json(study.user_attrs.get(VENDOR_ATTR))
    vendor = geometric_mean([f.gflops for f in figures.values()])
    confirmation = Confirmation.from_json(study.user_attrs.get(CONFIRM_ATTR), "study")
    return StudyReport(
        name=name, identity=identity, trials=trials, vendor_gflops=vendor,
        vendor_name=next((f.name for f in figures.values()), ""),
        peak_gflops=_peak(identity, catalogs),
        confirmed_gflops=confirmation.kernel_gflops if confirmation else 0.0,
        best_steps=_best_steps(trials), **_llm(cache_folder, name))


def _point(trial: FrozenTrial, started: datetime.datetime | None) -> TrialPoint:
    attrs = TrialAttrs.of(trial)
    ok = trial.state == TrialState.COMPLETE and bool(trial.values)
    when = trial.datetime_complete or trial.datetime_start
    minutes = (when - started).total_seconds() / 60 if when and started else 0.0
    return TrialPoint(trial.number, attrs.status or trial.state.name.lower(),
                      float(trial.values[0]) if ok else 0.0,
                      attrs.sequence, minutes, attrs.cached, attrs.seconds)


def _best_steps(trials: list[TrialPoint]) -> list[StepSpeed]:
    """The paper's Figure 2: the speed after each step of the best sequence."""
    ok = [t for t in trials if t.status == Status.OK.value]
    if not ok:
        return []
    best = max(ok, key=lambda t: t.gflops)
    fastest: dict[tuple[str, ...], float] = {}
    for t in ok:
        fastest[t.sequence] = max(fastest.get(t.sequence, 0.0), t.gflops)
    return [StepSpeed(best.sequence[i - 1] if i else "", fastest.get(best.sequence[:i]))
            for i in range(len(best.sequence) + 1)]


def _peak(identity: dict[str, object], catalogs: tuple[str, ...]) -> float:
    """The device's roofline on the study's kernel and sizes (as the run's summary), or
    its documented peak where the kernel's spec is not in these catalogs."""
    try:
        catalog = Catalog.with_user_folders(catalogs)
        device = catalog.device(str(identity.get("device")))
    except UserError:
        return 0.0
    dtype = str(identity.get("dtype"))
    try:
        spec = catalog.spec(str(identity.get("kernel")))
        sizes = [ProblemSize.of(size_of(str(label), spec.size_symbols))
                 for label in cast(list[object], identity.get("sizes") or [])]
    except (UserError, ValueError):
        return float(device.peak_gflops.get(dtype, 0.0) or 0.0)
    return roofline(device, spec, dtype, sizes).gflops if sizes else float(
        device.peak_gflops.get(dtype, 0.0) or 0.0)


def _llm(cache_folder: Path, study: str) -> dict[str, Any]:
    """The study's LLM calls from the journal: totals, and the rows of `peak-tune stats`."""
    from peak_tune.appliers.llm.stats import read_records, summarize

    records = [r for r in read_records(cache_folder) if r.study == study]
    if not records:
        return {}
    return {"llm": {"calls": len(records),
                    "prompt_tokens": sum(r.prompt_tokens for r in records),
                    "completion_tokens": sum(r.completion_tokens for r in records),
                    "cost_usd": sum(r.cost_usd or 0.0 for r in records)},
            "llm_steps": summarize(records)}
