"""The Searcher: the Optuna study behind one typed seam the session drives.

It creates, names, resumes and warm-starts the study, enqueues a new study's first
trials (the seed, warm starts, one per branch of the catalog's conflicts), asks for
trials (a polisher's neighbour, a draw of the sampler process, or the sampler here),
tells their results (the outcome-to-state mapping), and ranks what the study holds. The
study works in memory; its mirror writes it through to the storage.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from peak_tune.catalog.types import Transformation
from peak_tune.core import KernelContext, Status
from peak_tune.errors import UserError
from peak_tune.search.ask_ahead import (
    ASK_AHEAD,
    ASK_AHEAD_MIN_CORES,
    AskAhead,
    sampler_processes_for,
)
from peak_tune.search.best import BestSoFar
from peak_tune.search.focus import FixedFirst
from peak_tune.search.polish import Polisher
from peak_tune.search.samplers import is_multi_objective, make_sampler
from peak_tune.search.space import (
    SequenceEncoding,
    branch_sequences,
    branch_trial_params,
    repair_sequence,
)
from peak_tune.search.trials import TrialAttrs, TrialRecord, write_interrupted, write_record
from peak_tune.study.mirror import open_mirrored_study
from peak_tune.study.storage import open_storage, redacted_url

__all__ = ["PULL_EVERY_S", "SANITIZER_REJECTED", "Searcher", "StudySettings", "resumed_seed"]

log = logging.getLogger(__name__)

PULL_EVERY_S = 10.0  # how often a driver takes in trials other drivers of its study told
# study attribute: the stored numbers of the trials compute-sanitizer rejected (no best)
SANITIZER_REJECTED = "sanitizer_rejected"

# trial states that count as run (a running or waiting trial does not)
_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


@dataclass(frozen=True)
class StudySettings:
    storage_url: str
    name: str | None  # resume (or create) this study; None: a new one per run
    base_name: str  # a new study's name before its "-run<N>"
    identity: Mapping[str, Any]  # what the study tunes: a resumed one must match
    applier_identity: Any
    sampler: str = "tpe"
    seed: int | None = 0
    encoding: str = "subset"  # the encoding's name (the seed's and branches' parameters)
    fixed_sequence: bool = False  # only parameters are tuned: no seed or branch trials
    branch_start: bool = True
    warm_start: tuple[str, ...] = ()
    warm_start_top: int = 10
    # draws a sampler process keeps ready; -1: ASK_AHEAD where trials are told as they
    # finish with TPE on a machine of ASK_AHEAD_MIN_CORES or more, else 0
    ask_ahead: int = -1
    sampler_processes: int = -1  # -1: sampler_processes_for(the machine's cores)


def resumed_seed(seed: int, finished: int) -> int:
    """The sampler seed of a run that resumes a study holding `finished` trials:
    repeatable, and different from the seed that asked for those trials."""
    return (seed * 1_000_003 + finished) % 2**32


class Searcher:
    def __init__(self, settings: StudySettings, encoding: SequenceEncoding,
                 transformations: Mapping[str, Transformation], polisher: Polisher,
                 tell_as_finished: bool) -> None:
        self.settings = settings
        self._encoding = encoding
        self._transformations = transformations
        self._polisher = polisher
        self.multi_objective = is_multi_objective(settings.sampler)
        self.sampler_seed = settings.seed
        self.ask_ahead: AskAhead | None = None
        self._drawn: dict[int, int] = {}  # trial number -> its ticket in the sampler process
        self._last_pull = time.monotonic()  # the mirror pulled other drivers' trials
        self._best = BestSoFar()
        self.study = self._open()
        try:
            self.ask_ahead = self._start_ask_ahead(tell_as_finished)
        except BaseException:
            self.mirror.close()
            raise

    # ------------------------------------------------------------------ the study

    def _open(self) -> optuna.Study:
        """The working (in-memory) study; `self.mirror` writes it through to storage."""
        s = self.settings
        maximize, minimize = StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE
        directions = [maximize, minimize] if self.multi_objective else [maximize]

        def create(storage: BaseStorage, name: str, resume: bool) -> optuna.Study:
            return optuna.create_study(storage=storage, study_name=name,
                                       load_if_exists=resume, directions=directions)

        warm = self._warm_start_points()  # checked before a study is made
        self.mirror = open_mirrored_study(
            open_storage(s.storage_url),
            lambda storage: (create(storage, s.name, True) if s.name
                             else self._new_study(storage, create)),
            make_sampler(s.sampler, s.seed, self._encoding),
        )
        study = self.mirror.working
        try:
            self._prepare(study, warm)
        except BaseException:
            self.mirror.close()
            raise
        return study

    def _prepare(self, study: optuna.Study, warm: list[tuple[dict[str, Any], str]]) -> None:
        s = self.settings
        if study.trials and s.seed is not None:
            # A resumed study: seeded as at its start, the sampler would ask again for the
            # points its earlier runs finished. Continue from a seed of its own instead.
            self.sampler_seed = resumed_seed(s.seed, len(study.trials))
            study.sampler = make_sampler(s.sampler, self.sampler_seed, self._encoding)
        existing = study.user_attrs.get("identity")
        identity = dict(s.identity)
        if existing and existing != identity:
            raise UserError(f"study {study.study_name!r} was made for {existing}, not {identity}")
        if not existing:
            self.mirror.set_user_attr("identity", identity)
            self.mirror.set_user_attr("applier", s.applier_identity)
        if not study.trials and not s.fixed_sequence:
            study.enqueue_trial(self._seed_params(), skip_if_exists=True)
            for params, origin in warm:
                study.enqueue_trial(params, user_attrs={"warm_start_from": origin},
                                    skip_if_exists=True)
            if s.branch_start:
                for branch in branch_sequences(self._transformations):
                    study.enqueue_trial(branch_trial_params(branch, self._transformations,
                                                            s.encoding), skip_if_exists=True)

    def _warm_start_points(self) -> list[tuple[dict[str, Any], str]]:
        """The parameters of the best `warm_start_top` trials of each warm-start study,
        best first, each once, with where they come from ("study#trial"). A study of the
        same kernel on another backend (CUDA's for an HLSL study, say) gives its best
        sequences as far as this backend has their steps, with their values."""
        s = self.settings
        points: list[tuple[dict[str, Any], str]] = []
        if not s.warm_start:
            return points
        if s.warm_start_top < 1:
            raise UserError("--warm-start-top must be 1 or more")
        seen: set[tuple[tuple[str, Any], ...]] = set()
        storage = open_storage(s.storage_url)
        for name in s.warm_start:
            try:
                source = optuna.load_study(study_name=name, storage=storage)
            except KeyError:
                raise UserError(f"--warm-start {name}: no such study in "
                                f"{redacted_url(s.storage_url)}") from None
            made_for = source.user_attrs.get("identity", {})
            if made_for.get("kernel") != s.identity["kernel"]:
                raise UserError(f"--warm-start {name}: a study of kernel "
                                f"{made_for.get('kernel')!r}, not {s.identity['kernel']!r}")
            foreign = made_for.get("backend") != s.identity["backend"]
            finished = source.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            finished.sort(key=lambda t: -(t.values[0] if t.values else 0.0))
            taken = 0
            for trial in finished:
                if taken >= s.warm_start_top:
                    break
                params = self._translated(trial) if foreign else dict(trial.params)
                key = tuple(sorted(params.items()))
                if key in seen or not params:
                    continue
                seen.add(key)
                taken += 1
                points.append((params, f"{name}#{trial.number}"))
            if foreign and not taken:
                raise UserError(f"--warm-start {name}: none of its best sequences has a step "
                                f"that the {s.identity['backend']} backend offers")
        return points

    def _translated(self, trial: FrozenTrial) -> dict[str, Any]:
        """Another backend's trial in this study's terms: its sequence without the steps
        this backend lacks (made legal again), each kept step's values where it had them
        ({} when no step is left)."""
        sequence = [tid for tid in TrialAttrs.of(trial).sequence if tid in self._transformations]
        sequence = repair_sequence(sequence, self._transformations)
        if not sequence:
            return {}
        params = branch_trial_params(sequence, self._transformations, self.settings.encoding)
        allowed = {f"{tid}.{domain.name}": domain.values for tid in sequence
                   for domain in self._transformations[tid].params}
        for key, value in trial.params.items():  # values are named <step id>.<MACRO>
            if value in allowed.get(key, ()):
                params[key] = value
        return params

    def _new_study(self, storage: BaseStorage,
                   create: Callable[[BaseStorage, str, bool], optuna.Study]) -> optuna.Study:
        """A fresh study per run: `<base name>-run<N>`.

        With the same seed a new run asks for the same points as the last one, so the
        cache answers all of them; naming a study resumes it instead. Two runs started at
        once on one storage take different numbers.
        """
        taken = {s.study_name for s in storage.get_all_studies()}
        for n in itertools.count(1):
            name = f"{self.settings.base_name}-run{n}"
            if name in taken:
                continue
            try:
                return create(storage, name, False)
            except optuna.exceptions.DuplicatedStudyError:
                taken.add(name)  # another run took it between the listing and now
        raise AssertionError("unreachable")

    def _seed_params(self) -> dict[str, Any]:
        if self.settings.encoding == "steps":
            return {"step.0": "end"}
        return {f"use.{tid}": False for tid in self._transformations}

    def _start_ask_ahead(self, tell_as_finished: bool) -> AskAhead | None:
        """The sampler process, where the study draws ahead (StudySettings.ask_ahead)."""
        s = self.settings
        depth = s.ask_ahead
        if depth < 0:  # a core of its own beside the driver, the writer and the builds
            cores = os.cpu_count() or 1
            depth = (ASK_AHEAD if tell_as_finished and s.sampler == "tpe"
                     and cores >= ASK_AHEAD_MIN_CORES else 0)
        if depth == 0:
            return None
        finished = self.study.get_trials(deepcopy=False, states=(
            TrialState.COMPLETE, TrialState.PRUNED))
        processes = (s.sampler_processes if s.sampler_processes > 0
                     else sampler_processes_for(os.cpu_count() or 1))
        ask_ahead = AskAhead(s.sampler, self.sampler_seed, self._encoding,
                             self.study.directions, finished, depth, processes)
        self.study.sampler = FixedFirst(self.study.sampler)
        return ask_ahead

    # ------------------------------------------------------------- ask and tell

    def ask(self) -> optuna.Trial:
        """A new trial: a waiting one (a polisher's neighbour, a warm start), else one
        the sampler process drew, else one the study's sampler draws here."""
        if self._queue_a_neighbour() or self.ask_ahead is None:
            return self.study.ask()
        draw = self.ask_ahead.draw()
        if draw is None:  # the process failed (logged): sample here from now on
            return self.study.ask()
        self.study.enqueue_trial(draw.params)
        trial = self.study.ask()
        self._drawn[trial.number] = draw.ticket
        return trial

    def _queue_a_neighbour(self) -> bool:
        """Enqueue the polisher's next neighbour when one is due (after the trials a new
        study starts with, which are enqueued first); whether a trial is waiting."""
        if self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return True
        neighbour = self._polisher.next()
        if neighbour is None:
            return False
        self.study.enqueue_trial(neighbour.params, user_attrs={
            "neighbour_of": neighbour.origin, "moved": neighbour.moved})
        return True

    def tell(self, trial: optuna.Trial, record: TrialRecord) -> None:
        """The trial's result into the study: OK is COMPLETE with its speed (and its
        length, for a multi-objective sampler), INVALID is PRUNED, the rest FAIL."""
        write_record(trial, record)
        if record.status is Status.OK:
            values: list[float] = [record.gflops]
            if self.multi_objective:
                values.append(float(len(record.sequence)))
            self.study.tell(trial, values)
        elif record.status is Status.INVALID:
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, state=TrialState.FAIL)
        self._finished(trial.number)

    def fail_unfinished(self, trial: optuna.Trial, reason: str) -> None:
        """Mark a trial the run stopped in as failed, so the study holds no RUNNING trial
        (one already told, and sent to the storage, is left as it is)."""
        if self.study.get_trials(deepcopy=False)[trial.number].state.is_finished():
            return
        write_interrupted(trial, reason)
        self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        self._finished(trial.number)

    def _finished(self, number: int) -> None:
        """Trial `number` was just told: to the storage, and to the sampler process."""
        trial = self.mirror.finished(number)
        if self.ask_ahead is not None:
            self.ask_ahead.told(self._drawn.pop(number, None), trial)

    def learn(self, trial: optuna.Trial, record: TrialRecord, variant: KernelContext | None,
              params: dict[str, int]) -> None:
        """What the polisher learns from a told trial (a best to polish, a point to
        repair, or one more point seen)."""
        if record.status is Status.OK and variant is not None:
            self._polisher.offer(trial.number, trial.params, variant, params, record.gflops)
        elif record.status is Status.INVALID and variant is not None and params:
            self._polisher.repair(trial.number, trial.params, variant, params)
        else:
            self._polisher.saw(trial.params)

    def pull_other_drivers(self) -> None:
        """Take in trials other drivers of this study finished, as the study writer
        reports them; every few seconds ask it to look again."""
        for trial in self.mirror.take_pulled():
            if self.ask_ahead is not None:
                self.ask_ahead.told(None, trial)
        now = time.monotonic()
        if now - self._last_pull >= PULL_EVERY_S:
            self._last_pull = now
            self.mirror.request_pull()

    # ---------------------------------------------------------------- results

    def ranked_trials(self) -> list[FrozenTrial]:
        """Completed trials, fastest first, without those the sanitizer rejected."""
        rejected = self._rejected()
        done = [t for t in self.study.get_trials(deepcopy=False)
                if t.state == TrialState.COMPLETE and t.values
                and self.stored_number(t) not in rejected]
        return sorted(done, key=lambda t: -t.values[0])

    def stored_number(self, trial: FrozenTrial) -> int:
        """The trial's number in the persistent study (the dashboard's), which a resumed
        run's working study gives it again."""
        return self.mirror.stored_number(trial.number)

    def finished_trials(self) -> int:
        """Trials the study holds that were evaluated (not those a hard stop cut short):
        what `--trials` and a batch file's `trials` count towards."""
        return sum(1 for t in self.study.get_trials(deepcopy=False, states=_FINISHED)
                   if not TrialAttrs.of(t).interrupted)

    def best_trial(self) -> FrozenTrial | None:
        """ranked_trials' first, without ranking the study (search.best)."""
        return self._best.of(self.study.get_trials(deepcopy=False), self._rejected(),
                             self.mirror.stored_number)

    def _rejected(self) -> frozenset[int]:
        """The stored numbers of the trials the sanitizer rejected."""
        return frozenset(self.study.user_attrs.get(SANITIZER_REJECTED, []))

    def best_gflops(self) -> float:
        best = self.best_trial()
        return best.values[0] if best else 0.0

    def reject(self, number: int) -> None:
        """Trial `number` no longer counts as a best (the sanitizer found it wrong). The
        study keeps its stored number: the working numbers of a later run are those."""
        rejected = self.study.user_attrs.get(SANITIZER_REJECTED, [])
        self.mirror.set_user_attr(SANITIZER_REJECTED,
                                  [*rejected, self.mirror.stored_number(number)])

    def close(self) -> None:
        """Write every finished trial to the storage; stop the sampler process."""
        try:
            self.mirror.close()
        finally:
            if self.ask_ahead is not None:
                self.ask_ahead.close()
