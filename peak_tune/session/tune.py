"""A tuning session: the parts of one run wired together, and the trial loop.

The driver asks the Searcher for a trial, turns it into a sequence and tuning values,
runs it through the pipeline (cache first) on the executor and tells the Searcher the
result; it alone writes the study and the cache. The target (session.target), the
vendor's figures (session.vendor_book) and the end-of-run re-timing are parts of their own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Any, cast

import optuna

from peak_tune.appliers.base import ModelCalls
from peak_tune.appliers.wiring import LLMJournal
from peak_tune.backends import capabilities
from peak_tune.backends.base import (
    BUILD_BUDGET_AFTER,
    BUILD_BUDGET_FLOOR_S,
    Artifact,
    Backend,
    EvalRequest,
)
from peak_tune.core import KernelContext, ProblemSize, Status, geometric_mean
from peak_tune.errors import ApplyError, EnvironmentFault, EvaluationError, InvalidPoint, UserError
from peak_tune.evaluation.cache import Cache
from peak_tune.evaluation.pipeline import Pipeline, PipelineSetup
from peak_tune.executors import EvalJob
from peak_tune.executors.base import time_report
from peak_tune.harness.noise import NoisePolicy
from peak_tune.harness.vendor import VENDOR_ATTR, figures_from_json
from peak_tune.search.polish import Polisher
from peak_tune.search.space import suggest_params
from peak_tune.search.study import Searcher
from peak_tune.search.trials import (
    TrialAttrs,
    TrialRecord,
    write_seconds,
    write_timing,
    write_variant,
)
from peak_tune.session import parts
from peak_tune.session.config import TuneConfig
from peak_tune.session.confirmation import CONFIRM_ATTR, BestConfirmer, Confirmation
from peak_tune.session.events import (
    BudgetSpent,
    CallJournal,
    NewBest,
    Observer,
    Observers,
    RunEnded,
    RunLedger,
    TrialFinished,
)
from peak_tune.session.target import check_results_folder, resolve_target
from peak_tune.session.vendor_book import VendorBook
from peak_tune.session.window import (
    ShownWhenStored,
    Started,
    StopWhenSpent,
    next_to_tell,
    settled,
    tells_as_finished,
    where_time_went,
)
from peak_tune.study.storage import results_storage_url

__all__ = ["TuneSession", "open_session"]

log = logging.getLogger(__name__)

# A kernel this many times slower than the best so far is timed once: no more careful
# timing makes it the best (runs of one kernel differ by a few percent), and the fp32
# studies at 8192 were bound by the device (98-100% busy in search-13 and search-14).
SLOW_FACTOR = 2.0
SHOW_STORED_EVERY_S = 0.02  # how often a waiting driver looks for trials newly stored


def _reason(exc: BaseException) -> str:
    """Why the run stopped in a trial, as its failure message."""
    return str(exc) if isinstance(exc, (UserError, EnvironmentFault)) else "interrupted"


class TuneSession:
    """Everything one `peak-tune tune` needs, opened and checked before any trial runs."""

    def __init__(self, config: TuneConfig) -> None:
        self.config = config
        target = resolve_target(config)
        self.spec, self.device, self.sizes = target.spec, target.device, target.sizes
        self.transformations = target.transformations
        backend_name = target.backend
        self.capabilities = capabilities(backend_name)
        self.backend: Backend = parts.backend_for(config.run, self.device, backend_name,
                                                   self.compile_workers)
        try:  # before anything is created: a device that is not here leaves nothing
            self.device = self.backend.probe()
            check_results_folder(config.store.results)
        except BaseException:
            self.backend.close()
            raise
        self.cache = Cache(config.store.results / "cache")
        self.applier = parts.wired_applier_for(config, self.backend, self.spec, self.cache)
        setup = PipelineSetup(self.spec, config.target.dtype, self.device,
                              self.transformations, config.run.eval_config,
                              config.applier.samples,
                              NoisePolicy.off() if config.run.replay else NoisePolicy())
        self.pipeline = Pipeline(setup, self.backend, self.applier, self.cache)
        self.encoding = parts.encoding_for(config.search, self.transformations)
        try:
            steps = self.transformations if config.search.encoding == "subset" else None
            polisher = Polisher(config.search.polish, transformations=steps)
        except ValueError as exc:
            raise UserError(f"--polish {config.search.polish}: {exc}") from exc
        # may refuse: before any process or study is made
        parts.count_earlier_spend(config.applier, config.store.study, self.applier,
                                  self.cache.folder)
        # before the study: fail first
        self.executor = parts.executor_for(config.run, self.pipeline, backend_name,
                                           self.compile_workers)
        attach = getattr(self.backend, "attach", None)  # a ClusterBackend's device workers
        if attach is not None:
            attach(self.executor)
        try:
            self.tell_as_finished = tells_as_finished(config.search.tell_order, self.executor,
                                                      replay=config.run.replay is not None)
            self._appliers = ThreadPoolExecutor(self.apply_workers,
                                                thread_name_prefix="apply")
            settings = parts.study_settings(config, self.spec, self.device, self.sizes,
                                            self.storage_url, backend_name,
                                            self.applier.identity)
            self.searcher = Searcher(settings, self.encoding,
                                     self.transformations, polisher, self.tell_as_finished)
        except BaseException:
            self._abandon()  # a refusal (e.g. a study made for another size) is one line
            raise
        self.observers = Observers()
        self.ledger = RunLedger()  # what this run did, for the summary
        self.observers.subscribe(self.ledger)
        self._best_announced = 0.0  # the speed of the last NewBest
        self.vendors = VendorBook(self.backend, self.pipeline, self.sizes,
                                  self.searcher.mirror.set_user_attr, self.observers.notify)
        self.confirmer = BestConfirmer(self.backend, self.pipeline, self.sizes, self.vendors,
                                       replay=config.run.replay is not None)
        self.confirmation: Confirmation | None = None  # the best re-timed (confirm_best)
        self.started_at = time.time()
        # the LLM calls, journaled as trials are stored and when the run ends
        self._journal = CallJournal(LLMJournal(self.cache), self.applier, self.study.study_name)
        self.observers.subscribe(self._journal)
        # where the trial loop's own thread spent its time: a study whose driver mostly
        # waits is limited by its devices, one that mostly asks by the sampler
        self.loop_seconds = {"asking": 0.0, "waiting": 0.0, "telling": 0.0}
        self.run_seconds = 0.0  # in the trial loops of `run`, the end-of-run re-timing aside

    def subscribe(self, observer: Observer) -> None:
        """`observer` is told what the run does (session.events)."""
        self.observers.subscribe(observer)

    @property
    def study(self) -> optuna.Study:
        return self.searcher.study

    @property
    def ask_ahead(self) -> Any:
        """The sampler process drawing ahead (search.ask_ahead), or None."""
        return self.searcher.ask_ahead

    @property
    def confirmation_note(self) -> str:
        """Why the best was not re-timed (when `confirmation` is None)."""
        return self.confirmer.note

    @property
    def storage_url(self) -> str:
        store = self.config.store
        return store.storage or results_storage_url(store.results)

    # ------------------------------------------------------------------- vendor

    def measure_vendor(self) -> None:
        """The vendor's figure at every size (session.vendor_book): the study's own, the
        cache's, else timed now. The run times it again between trials."""
        self.vendors.measure(figures_from_json(self.study.user_attrs.get(VENDOR_ATTR)))

    # ------------------------------------------------------------------- trials

    def run(self, trials: int, on_trial: Callable[[TrialRecord], None] | None = None,
            should_stop: Callable[[], bool] = lambda: False) -> None:
        """Run up to `trials` trials; `should_stop` is asked before each new trial.

        Trials flow through a window of the executor's `slots`: each is asked for (TPE's
        constant liar keeps them apart) and applied here, then built and timed by the
        executor while the next ones are prepared, so the devices rarely wait for a
        compiler or for the sampler. Results are told in the order asked, which keeps a
        seeded run repeatable, or as they finish (`tell_order`), so that one slow build
        or kernel does not hold up a window of finished trials.
        """
        should_stop = stop = StopWhenSpent(should_stop, self.applier)
        asked = 0
        pending: deque[Started] = deque()
        clock = self.loop_seconds
        shown = ShownWhenStored(lambda record: self._stored(record, on_trial))
        told_here = 0
        stopped = True
        began_run = time.perf_counter()
        try:
            try:
                while True:
                    while (len(pending) < self.window and asked < trials
                           and not should_stop()):
                        self.searcher.pull_other_drivers()
                        began = time.perf_counter()
                        trial = self._ask()
                        pending.append(Started(trial, began, ask_s=time.perf_counter() - began))
                        asked += 1
                        self._start(pending[-1])
                        clock["asking"] += time.perf_counter() - began
                    if not pending:
                        break
                    began = time.perf_counter()
                    item = next_to_tell(pending, self.tell_as_finished)
                    self._show_while_waiting(item, shown)
                    record = self._finish(item)
                    told = time.perf_counter()
                    self.searcher.tell(item.trial, record)
                    pending.remove(item)  # told: sent to the storage, shown once stored
                    shown.told(record)
                    told_here += 1
                    self.vendors.retime_if_due(record, TrialAttrs.of(item.trial).noisy)
                    self.searcher.learn(item.trial, record, item.chain[-1] if item.chain else None,
                                         item.params)
                    clock["waiting"] += told - began
                    clock["telling"] += time.perf_counter() - told
                    shown.stored(self.searcher.mirror.take_stored())
            except BaseException as exc:
                for item in pending:
                    if item.prepared:
                        item.prepared.cancel()
                    if item.outcomes:
                        item.outcomes.cancel()
                    self.searcher.fail_unfinished(item.trial, _reason(exc))
                raise
            finally:
                self.run_seconds += time.perf_counter() - began_run
                try:
                    self.searcher.mirror.flush()
                finally:  # what the storage holds, also when it failed
                    shown.stored(self.searcher.mirror.take_stored())
            stopped = should_stop()
            if stopped:
                self.confirmer.note = "not re-timed: the run was stopped"
            else:
                self.confirm_best()
        finally:
            if stop.why:
                self.observers.notify(BudgetSpent(stop.why))
            self.observers.notify(RunEnded(told_here, stopped))

    def time_report(self) -> dict[str, Any]:
        """Where the trial loops' time went (executors.base.time_report over
        `run_seconds`), with the driver's own seconds asking, waiting and telling, its
        window and the sampler process drawing ahead: what held the run back."""
        ahead = self.ask_ahead
        return {**time_report(self.executor, self.run_seconds),
                "run_s": round(self.run_seconds, 1),
                "driver_loop_s": {k: round(v, 1) for k, v in self.loop_seconds.items()},
                "in_flight": self.window,
                # draws the sampler process kept ready (0: the sampler drew in the driver)
                "ask_ahead": ahead.depth if ahead else 0,
                "sampler_processes": ahead.processes if ahead else 0,
                "ask_ahead_failure": ahead.failure if ahead else ""}

    def _stored(self, record: TrialRecord,
                on_trial: Callable[[TrialRecord], None] | None) -> None:
        """A told trial the storage now holds: to `on_trial` and the observers, by the
        number the storage gave it (the dashboard's and `peak-tune show`'s)."""
        record = replace(record, number=self.searcher.mirror.stored_number(record.number))
        if on_trial is not None:
            on_trial(record)
        best = self.searcher.best_gflops()
        against, denominator = self.vendors.denominator()
        self.observers.notify(TrialFinished(record, best, against, denominator,
                                            self.vendors.peak_gflops()))
        if record.status is Status.OK and best > 0 and record.gflops >= best and (
                record.gflops > self._best_announced):  # a tie is no new best
            self._best_announced = record.gflops
            self.observers.notify(NewBest(record))

    def _show_while_waiting(self, item: Started, shown: ShownWhenStored) -> None:
        """While `item` still runs, show the trials told before it as the storage takes
        them in (a few milliseconds after they are told), not one trial late."""
        while shown.waiting and not settled(item):
            running: list[Future[Any]] = [f for f in (item.prepared, item.outcomes)
                                          if f is not None]
            wait(running, timeout=SHOW_STORED_EVERY_S)
            shown.stored(self.searcher.mirror.take_stored())

    def _ask(self) -> optuna.Trial:
        return self.searcher.ask()

    @property
    def window(self) -> int:
        """Trials between ask and tell: enough to keep the executor and appliers busy, or
        the run's `in_flight`."""
        return self.config.run.in_flight or max(self.executor.slots, self.apply_workers)

    @property
    def compile_workers(self) -> int:
        return parts.compile_workers(self.config.run, self.capabilities.on_host)

    def _start(self, item: Started) -> None:
        """Choose the sequence here; apply it and hand the point to the executor on the
        apply pool, so that slow appliers (LLM calls) overlap one another."""
        try:
            item.sequence = self.encoding.suggest(item.trial)
        except InvalidPoint as exc:
            item.early = (Status.INVALID, str(exc))
            return
        item.prepared = self._appliers.submit(self._apply_and_submit, item)

    def _apply_and_submit(self, item: Started) -> None:
        began = time.perf_counter()
        try:
            item.chain = self.pipeline.build(item.sequence)
        except InvalidPoint as exc:
            item.early = (Status.INVALID, str(exc))
            return
        except ApplyError as exc:
            item.early = (Status.APPLY_ERROR, str(exc))
            return
        finally:
            item.apply_s = time.perf_counter() - began
        variant = item.chain[-1]
        item.params = suggest_params(item.trial, variant)
        write_variant(item.trial, variant.content_hash())
        item.outcomes = self.executor.submit(self._job(variant, item.params,
                                                       item.trial.number))

    @property
    def apply_workers(self) -> int:
        return parts.apply_workers(self.config.applier, self.applier)

    def _job(self, variant: KernelContext, params: dict[str, int], trial: int = -1
             ) -> EvalJob:
        """The point at every tuned size; one more than SLOW_FACTOR times slower than the
        best so far is timed once (its exact speed does not matter to the search)."""
        best = [self.best_median_ms(size) for size in self.sizes]
        return EvalJob(variant, params, tuple(self.sizes),
                       tuple(SLOW_FACTOR * ms if ms else 0.0 for ms in best),
                       self.build_limit_s(), trial)

    def build_limit_s(self) -> float:
        """How long a build may run now: --build-budget times the median of this run's
        builds, at least BUILD_BUDGET_FLOOR_S; 0 (no limit) before BUILD_BUDGET_AFTER
        builds or with a budget of 0. A build stopped at it counts as lasting that long."""
        budget = self.config.run.build_budget
        if budget <= 0:
            return 0.0
        builds = [job.build_s for job in list(self.executor.job_times) if job.compiled]
        if len(builds) < BUILD_BUDGET_AFTER:
            return 0.0
        return max(BUILD_BUDGET_FLOOR_S, budget * statistics.median(builds))

    def _finish(self, item: Started) -> TrialRecord:
        def ended(status: Status, message: str = "", gflops: float = 0.0,
                  cached: bool = False) -> TrialRecord:
            seconds = time.perf_counter() - item.started
            recent = self.executor.job_times[-4 * self.window - 8:]
            write_seconds(item.trial, where_time_went(item, seconds, recent))
            return TrialRecord(item.trial.number, status, tuple(item.sequence), item.params,
                               gflops, message, cached, seconds)

        if item.prepared is not None:
            item.prepared.result()  # the applier's own errors (UserError, ...) surface here
        if item.early or item.outcomes is None:
            return ended(*(item.early or (Status.RUNTIME_ERROR, "not evaluated")))
        outcomes = item.outcomes.result()
        failed = next((o for o in outcomes if o.status is not Status.OK), None)
        if failed:
            return ended(failed.status, failed.message, cached=failed.cached)
        if self.config.search.step_values:
            self._report_steps(item.trial, item.chain, item.params)
        write_timing(item.trial, {s.label(): o.gflops for s, o in zip(
            self.sizes, outcomes, strict=True)},
                     max(o.measurement.spread for o in outcomes if o.measurement),
                     any(o.noisy for o in outcomes), sum(o.remeasured for o in outcomes))
        return ended(Status.OK, gflops=geometric_mean([o.gflops for o in outcomes]),
                     cached=all(o.cached for o in outcomes))

    def best_median_ms(self, size: ProblemSize) -> float | None:
        flops = self.pipeline.flops(size)
        best = self.searcher.best_gflops()
        return flops / (best * 1e9) * 1e3 if best > 0 else None

    def _report_steps(self, trial: optuna.Trial, chain: list[Any], params: dict[str, int]) -> None:
        """Speed after each step of the sequence (the intermediate values)."""
        for step, prefix in enumerate(chain[:-1]):
            values = {p.name: params[p.name] for p in prefix.params}
            outcomes = self.executor.submit(self._job(prefix, values)).result()
            trial.report(geometric_mean([o.gflops for o in outcomes]), step)

    def sanitize_best(self, tries: int = 3) -> list[str]:
        """Run the backend's sanitizer (memory errors, races) on the fastest trials until
        one passes; rejected trials no longer count as best. Returns one line per try."""
        sanitize = self.backend_tool("sanitize")
        lines = []
        for trial in self.searcher.ranked_trials()[:tries]:
            built = self._rebuild(trial)
            if built is None:
                continue
            try:
                sanitize(*built)
            except EvaluationError as exc:
                self.searcher.reject(trial.number)
                lines.append(f"trial {self.searcher.stored_number(trial)}: rejected: {exc}")
                continue
            lines.append(f"trial {self.searcher.stored_number(trial)}: compute-sanitizer "
                         "found nothing")
            break
        best = self.searcher.best_trial()
        if self.confirmation is not None and best is not None and (
                self.searcher.stored_number(best) != self.confirmation.trial):
            self.confirm_best()  # the re-timed trial was rejected: re-time the new best
        return lines

    def profile_best(self) -> str:
        """Nsight Compute on the best trial: its key metrics as one line; the full CSV is
        kept as <results>/profiles/<study>-trial<N>.csv."""
        profile = self.backend_tool("profile")
        best = self.searcher.best_trial()
        built = self._rebuild(best) if best is not None else None
        if best is None or built is None:
            return "no finished trial to profile"
        report = profile(*built)
        folder = self.config.store.results / "profiles"
        folder.mkdir(parents=True, exist_ok=True)
        number = self.searcher.stored_number(best)
        path = folder / f"{self.study.study_name}-trial{number}.csv"
        path.write_text(report.raw)
        return f"trial {number}: {report.summary()} (all metrics: {path})"

    def backend_tool(self, name: str) -> Callable[[Artifact, EvalRequest], Any]:
        """The backend's `sanitize` or `profile`; UserError naming the option if it has
        none (the CLI asks before the run, so a wrong option costs no trial)."""
        offered = {"sanitize": self.backend.capabilities.sanitizer,
                   "profile": self.backend.capabilities.profiler}
        tool = getattr(self.backend, name, None) if offered.get(name) else None
        if tool is None:
            raise UserError(f"--{name} is not available on the {self.backend.name} backend")
        return cast(Callable[[Artifact, EvalRequest], Any], tool)

    def _rebuild(self, trial: optuna.trial.FrozenTrial) -> tuple[Artifact, EvalRequest] | None:
        """(artifact, request at the first size) of a finished trial, from the cache."""
        attrs = TrialAttrs.of(trial)
        context = self.cache.get_context(attrs.context_hash)
        if context is None:
            return None
        params = {p.name: attrs.params[p.name] for p in context.params}
        artifact = self.backend.compile(context, params, self.config.target.dtype,
                                        str(self.cache.builds))
        return artifact, self.pipeline.request(context, params, self.sizes[0], 0.0)

    # ------------------------------------------------------- confirming the best

    def confirm_best(self) -> Confirmation | None:
        """Re-time the best trial beside the vendor (session.confirmation); the summary
        prints it as the best, and the ratio over the vendor's figure."""
        best = self.searcher.best_trial()
        attrs = best.user_attrs if best is not None else {}
        number = self.searcher.stored_number(best) if best is not None else None
        self.confirmation = self.confirmer.confirm(
            number, attrs.get("context_hash", ""), attrs.get("params", {}),
            self.study.user_attrs.get(CONFIRM_ATTR))
        if self.confirmation is not None and self.confirmation.source != "study":
            self.searcher.mirror.set_user_attr(CONFIRM_ATTR, self.confirmation.to_json())
        return self.confirmation

    def _abandon(self) -> None:
        """Stop what a start that failed had opened: the workers, the study writer."""
        appliers = getattr(self, "_appliers", None)
        if appliers is not None:
            appliers.shutdown(wait=False, cancel_futures=True)
        for part in (getattr(self, "executor", None), getattr(self, "searcher", None),
                     getattr(self, "backend", None)):
            if part is not None:
                with contextlib.suppress(Exception):  # the error being raised matters
                    part.close()

    def close(self) -> None:
        """Write every finished trial to the storage and stop the backend's workers; the
        LLM calls of the run into the journal, one still waiting for its reply (a stop
        that did not wait for it) as interrupted."""
        try:
            try:
                self._appliers.shutdown(wait=True, cancel_futures=True)
            finally:
                if isinstance(self.applier, ModelCalls):
                    self.applier.abandon_in_flight()
                self._journal.write()
            self.executor.close()
            self.searcher.close()
        finally:
            self.backend.close()


def open_session(config: TuneConfig) -> TuneSession:
    if os.environ.get("PEAK_TUNE_DEBUG"):
        logging.getLogger("peak_tune").setLevel(logging.DEBUG)
    return TuneSession(config)

