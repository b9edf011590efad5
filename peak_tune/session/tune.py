"""A tuning session: the study, the pipeline, the vendor baseline, and the trial loop.

The driver asks Optuna for a trial, turns it into a sequence and tuning values, runs it
through the pipeline (cache first) and tells Optuna the result. It is the only writer of
the study and the cache.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import statistics
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import optuna
from optuna.storages import BaseStorage
from optuna.study import StudyDirection

from peak_tune.appliers.base import Applier
from peak_tune.appliers.wiring import AppliedWith, LLMJournal, wired_applier
from peak_tune.backends import BACKENDS, capabilities, make_backend
from peak_tune.backends.base import (
    BUILD_BUDGET,
    BUILD_BUDGET_AFTER,
    BUILD_BUDGET_FLOOR_S,
    Artifact,
    Backend,
    EvalConfig,
    EvalRequest,
)
from peak_tune.catalog.resolve import Catalog
from peak_tune.catalog.types import Transformation
from peak_tune.core import (
    KernelContext,
    KernelSpec,
    Measurement,
    Outcome,
    ProblemSize,
    Status,
)
from peak_tune.errors import (
    ApplyError,
    EnvironmentFault,
    EvaluationError,
    InvalidPoint,
    NoVendorLibrary,
    UserError,
)
from peak_tune.evaluation.cache import Cache, confirmation_key
from peak_tune.evaluation.pipeline import (
    Pipeline,
    PipelineSetup,
    check_sequence,
    evaluate_built,
    outcome_of_error,
)
from peak_tune.executors import EvalJob, Executor, LocalExecutor, choose_executor
from peak_tune.expr import evaluate_int
from peak_tune.harness.noise import ForeignLoad, NoisePolicy, measure_steadily
from peak_tune.harness.vendor import (
    VENDOR_ATTR,
    VendorClock,
    VendorFigure,
    VendorStore,
    VendorTiming,
    figures_from_json,
    load_average,
    settle_own_processes,
)
from peak_tune.search.ask_ahead import ASK_AHEAD, ASK_AHEAD_MIN_CORES, AskAhead
from peak_tune.search.focus import FixedFirst
from peak_tune.search.polish import Polisher
from peak_tune.search.samplers import is_multi_objective, make_sampler
from peak_tune.search.space import (
    FixedEncoding,
    SequenceEncoding,
    StepsEncoding,
    SubsetEncoding,
    branch_sequences,
    branch_trial_params,
    suggest_params,
)
from peak_tune.study.storage import open_storage, redacted_url, results_storage_url

if TYPE_CHECKING:
    from peak_tune.executors.ray import RaySettings
from peak_tune.study.mirror import open_mirrored_study

__all__ = ["CONFIRM_ATTR", "CONFIRM_ROUNDS", "Confirmation", "SizeConfirmation", "TrialRecord",
           "TuneConfig", "TuneSession", "open_session"]

log = logging.getLogger(__name__)

# A kernel this many times slower than the best so far is timed once: no more careful
# timing makes it the best (runs of one kernel differ by a few percent), and the fp32
# studies at 8192 were bound by the device (98-100% busy in search-13 and search-14).
SLOW_FACTOR = 2.0
BUDGET_SCOPES = ("run", "study")
PULL_EVERY_S = 10.0  # how often a driver takes in trials other drivers of its study told
SHOW_STORED_EVERY_S = 0.02  # how often a waiting driver looks for trials newly stored
# The end of a run re-times its best trial beside the vendor (TuneSession.confirm_best):
# the best of many noisy trials is their luckiest timing (a 1024 CPU study's best read
# 98.1 GFLOP/s where the exported kernel does 88.6 alone), so the summary prints this.
CONFIRM_ATTR = "confirmed_best"  # the study's user attribute: Confirmation.to_json()
CONFIRM_ROUNDS = 3  # rounds of kernel then vendor, each one steady evaluation of both


@dataclass(frozen=True)
class TuneConfig:
    kernel: str = "matmul"
    backend: str | None = None  # None: the device's backend
    device: str | None = None  # None: what this machine has (no GPU: cpu)
    dtype: str = "float32"
    sizes: tuple[dict[str, int], ...] = ()  # empty: the spec's default size
    applier: str = "reference"
    model: str | None = None  # the LLM applier's model (else OPENAI_MODEL)
    llm_settings: Mapping[str, Any] = field(default_factory=dict)  # temperature, repairs, ...
    samples: int = 1  # independent LLM applications per step; the first that passes is used
    sampler: str = "tpe"
    seed: int | None = 0  # the same seed and catalog ask for the same points
    study: str | None = None
    results: Path = Path("results")
    storage: str | None = None  # None: SQLite in the results folder
    catalogs: tuple[str, ...] = ()
    encoding: str = "subset"
    illegal: str = "repair"
    sequence: tuple[str, ...] = ()  # fixed sequence: only parameters are tuned
    only: tuple[str, ...] = ()  # search only these transformations (empty: all)
    replay: Path | None = None  # answer evaluations from this recording (ReplayBackend)
    max_steps: int = 12
    branch_start: bool = True  # first trials: a few per branch of the catalog's conflicts
    polish: float = 0.5  # share of trials spent on neighbours of the best (search.polish)
    # "asked": tell trials in the order asked (a seeded run repeats itself); "finished":
    # as they finish (one slow build no longer holds up the rest); "auto": finished on
    # Ray, where several devices answer in their own order anyway, else asked
    tell_order: str = "auto"
    # draws a sampler process keeps ready (search.ask_ahead); 0: the driver samples
    # itself; -1 (auto): ASK_AHEAD where trials are told as they finish with TPE on a
    # machine of ASK_AHEAD_MIN_CORES or more, else 0
    ask_ahead: int = -1
    step_values: bool = False
    compile_workers: int = 0  # builds at once; 0: 1 for the C backend, else one per core
    build_budget: float = BUILD_BUDGET  # stop builds past this times the median (0: never)
    apply_workers: int = 0  # applications at once; 0: 1 (reference) or --llm-concurrency
    executor: str = "auto"  # local, ray, or auto: ray with several GPUs or a Ray address
    ray_address: str | None = None
    ray_workers: int = 0  # device actors on Ray; 0: one per GPU (per node for C)
    eval_config: EvalConfig = field(default_factory=EvalConfig)
    # what the LLM budget counts: this run's calls ("run") or, from the journal, the
    # study's calls in every run so far as well ("study")
    budget_scope: str = "run"
    # a new study's first trials: the best `warm_start_top` of these studies (same storage,
    # kernel and backend; another size, dtype or device), e.g. 8192 starting from 4096
    warm_start: tuple[str, ...] = ()
    warm_start_top: int = 10


@dataclass
class _Started:
    """A trial asked for and prepared, waiting to be timed."""

    trial: optuna.Trial
    started: float
    sequence: list[str] = field(default_factory=list)
    chain: list[KernelContext] = field(default_factory=list)
    params: dict[str, int] = field(default_factory=dict)
    early: tuple[Status, str] | None = None  # decided without running anything
    prepared: Future[None] | None = None  # applied and handed to the executor
    outcomes: Future[list[Outcome]] | None = None  # one per tuned size, from the executor


TELL_ORDERS = ("auto", "asked", "finished")


def tells_as_finished(order: str, executor: Executor, replay: bool = False) -> bool:
    """`auto`: as trials finish wherever builds run ahead of the timings (Ray, and the
    local executor's build pool for GPU backends), so that one slow build does not hold
    up a window of finished trials; in the order asked where one thing runs at a time
    (the C backend) or nothing runs (a replay), which costs nothing there and keeps a
    seeded run repeatable."""
    ahead = executor.name == "ray" or executor.slots > 1
    return order == "finished" or (order == "auto" and ahead and not replay)


def _settled(item: _Started) -> bool:
    """Nothing of the trial is still running: it can be finished without waiting."""
    if item.prepared is None:  # decided before anything was started
        return True
    if not item.prepared.done():
        return False
    return item.outcomes is None or item.outcomes.done()


@dataclass
class _ShownWhenStored:
    """Told trials, handed to `on_trial` (the progress view) once the storage holds them,
    in the order told: a trial shown is a trial stored, even when the storage fails."""

    on_trial: Callable[[TrialRecord], None]
    unshown: deque[TrialRecord] = field(default_factory=deque)
    held: set[int] = field(default_factory=set)  # stored, not yet shown

    @property
    def waiting(self) -> bool:
        return bool(self.unshown)

    def told(self, record: TrialRecord) -> None:
        self.unshown.append(record)

    def stored(self, numbers: list[int]) -> None:
        self.held.update(numbers)
        while self.unshown and self.unshown[0].number in self.held:
            record = self.unshown.popleft()
            self.held.discard(record.number)
            self.on_trial(record)


@dataclass(frozen=True)
class TrialRecord:
    """What one trial did, as the progress view and the summary see it."""

    number: int
    status: Status
    sequence: tuple[str, ...]
    params: dict[str, int]
    gflops: float
    message: str
    cached: bool
    seconds: float


@dataclass(frozen=True)
class SizeConfirmation:
    """The best trial re-timed at one size, interleaved with the vendor: each round one
    fresh evaluation of the kernel (new secret inputs, validated), then one timing of
    the vendor, each measured steadily (harness.noise). Raw samples, per round."""

    status: Status  # OK, or how the kernel failed its re-validation
    message: str = ""
    flops: float = 0.0
    kernel_ms: tuple[tuple[float, ...], ...] = ()
    vendor_ms: tuple[tuple[float, ...], ...] = ()
    vendor_name: str = ""
    noisy_because: str = ""  # why the re-timing is noisy ("" when steady)
    busy_cores: float = 0.0  # other processes' CPU use during the rounds
    at: float = 0.0  # Unix time

    def _gflops(self, rounds: tuple[tuple[float, ...], ...]) -> float:
        samples = tuple(s for r in rounds for s in r)
        return Measurement(samples, self.flops).gflops if samples else 0.0

    @property
    def kernel_gflops(self) -> float:
        """The median over every round's samples."""
        return self._gflops(self.kernel_ms)

    @property
    def vendor_gflops(self) -> float:
        return self._gflops(self.vendor_ms)

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status.value, "message": self.message, "flops": self.flops,
                "kernel_ms": [list(r) for r in self.kernel_ms],
                "vendor_ms": [list(r) for r in self.vendor_ms],
                "vendor_name": self.vendor_name, "noisy_because": self.noisy_because,
                "busy_cores": self.busy_cores, "at": self.at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SizeConfirmation:
        return cls(Status(data["status"]), str(data["message"]), float(data["flops"]),
                   tuple(tuple(float(s) for s in r) for r in data["kernel_ms"]),
                   tuple(tuple(float(s) for s in r) for r in data["vendor_ms"]),
                   str(data["vendor_name"]), str(data["noisy_because"]),
                   float(data["busy_cores"]), float(data["at"]))


@dataclass(frozen=True)
class Confirmation:
    """The end-of-run re-timing of the best trial at every tuned size; `source`: timed
    by this run, or taken from the study (resumed, same best) or the cache."""

    trial: int
    context_hash: str
    params: dict[str, int]
    by_size: dict[str, SizeConfirmation]
    source: str = "timed"

    @property
    def failure(self) -> tuple[str, SizeConfirmation] | None:
        """(size, its record) where the kernel failed its re-validation, or None."""
        return next(((label, c) for label, c in self.by_size.items()
                     if c.status is not Status.OK), None)

    @property
    def noisy_because(self) -> str:
        return "; ".join(f"{label}: {c.noisy_because}" for label, c in self.by_size.items()
                         if c.noisy_because)

    @property
    def kernel_gflops(self) -> float:
        return geometric_mean([c.kernel_gflops for c in self.by_size.values()])

    @property
    def vendor_gflops(self) -> float:
        return geometric_mean([c.vendor_gflops for c in self.by_size.values()])

    def is_of(self, context_hash: str, params: Mapping[str, int], sizes: list[str]) -> bool:
        return (self.context_hash == context_hash and self.params == dict(params)
                and list(self.by_size) == sizes)

    def to_json(self) -> dict[str, Any]:
        return {"trial": self.trial, "context_hash": self.context_hash,
                "params": self.params, "rounds": CONFIRM_ROUNDS,
                "by_size": {label: c.to_json() for label, c in self.by_size.items()}}

    @classmethod
    def from_json(cls, data: Any, source: str) -> Confirmation | None:
        """The study attribute's confirmation; None for one unreadable or of other rounds."""
        try:
            if data["rounds"] != CONFIRM_ROUNDS:
                return None
            return cls(int(data["trial"]), str(data["context_hash"]), dict(data["params"]),
                       {str(k): SizeConfirmation.from_json(v)
                        for k, v in data["by_size"].items()}, source)
        except (KeyError, TypeError, ValueError):
            return None


def _check_results_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # A probe of its own: drivers started at once must not remove each other's.
        handle, probe = tempfile.mkstemp(prefix=".write-test-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        raise UserError(f"results folder {str(folder)!r} is not writable: {exc.strerror}") from exc


def _sizes(config: TuneConfig, symbols: tuple[str, ...], default: ProblemSize) -> list[
        ProblemSize]:
    if not config.sizes:
        return [default]
    sizes = []
    for given in config.sizes:
        if set(given) != set(symbols):
            raise UserError(f"size {given} does not name {', '.join(symbols)}")
        sizes.append(ProblemSize.of({s: given[s] for s in symbols}))
    return sizes


def _check_fixed_sequence(sequence: tuple[str, ...],
                          transformations: Mapping[str, Transformation]) -> None:
    try:
        check_sequence(sequence, transformations)
    except InvalidPoint as exc:
        raise UserError(f"--sequence {','.join(sequence)}: {exc}") from None


_ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def _check_host_memory(spec: KernelSpec, sizes: list[ProblemSize], dtype: str) -> None:
    """A size whose buffers alone need more memory than this host has is refused before
    anything starts (the harness holds them, and a float64 reference, in host memory)."""
    have = _host_memory_bytes()
    element = _ELEMENT_BYTES.get(dtype, 4)
    buffers = [a for a in spec.args if a.kind == "buffer"]
    for size in sizes:
        values = size.as_dict()
        need = sum(element * math.prod(evaluate_int(e, values) for e in a.shape)
                   for a in buffers)
        if have and need > have:
            raise UserError(
                f"size {size.label()} needs at least {need / 1e9:.1f} GB of host memory for "
                f"its buffers ({', '.join(a.name for a in buffers)} in {dtype}), and this "
                f"machine has {have / 1e9:.1f} GB: choose a smaller --size")


def _host_memory_bytes() -> int:
    """This machine's memory, or its container's limit if lower (0: unknown)."""
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        have = 0
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        limit = "max"
    return min(have, int(limit)) if limit.isdigit() and have else have


def _default_device(catalog: Catalog, backend: str | None) -> str:
    """cpu without a backend or with c; otherwise the user must say which device."""
    if backend in (None, "c"):
        return "cpu"
    choices = sorted(d.name for d in catalog.devices.values() if d.backend == backend)
    if not choices:
        return "cpu"  # the backend check that follows names the problem
    raise UserError(f"--backend {backend} needs --device (one of {', '.join(choices)})")


def _reason(exc: BaseException) -> str:
    """Why the run stopped in a trial, as its failure message."""
    return str(exc) if isinstance(exc, (UserError, EnvironmentFault)) else "interrupted"


def resumed_seed(seed: int, finished: int) -> int:
    """The sampler seed of a run that resumes a study holding `finished` trials:
    repeatable, and different from the seed that asked for those trials."""
    return (seed * 1_000_003 + finished) % 2**32


def geometric_mean(values: list[float]) -> float:
    if not values or min(values) <= 0:
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))


class TuneSession:
    """Everything one `peak-tune tune` needs, opened and checked before any trial runs."""

    def __init__(self, config: TuneConfig) -> None:
        self.config = config
        catalog = Catalog.with_user_folders(config.catalogs)
        self.spec = catalog.spec(config.kernel)
        self.device = catalog.device(config.device or _default_device(catalog, config.backend))
        backend_name = config.backend or self.device.backend
        if backend_name not in BACKENDS:
            known = ", ".join(sorted(BACKENDS))
            if config.backend is None:  # the device profile names a backend not built yet
                raise UserError(f"device {self.device.name!r} needs the {backend_name!r} "
                                f"backend, which this version does not have ({known})")
            raise UserError(f"unknown backend {backend_name!r} (available: {known})")
        if config.dtype not in self.spec.dtypes:
            raise UserError(
                f"dtype {config.dtype!r} is not offered by {self.spec.name} "
                f"(choose from {', '.join(self.spec.dtypes)})"
            )
        self.sizes = _sizes(config, self.spec.size_symbols, self.spec.default_size)
        self.transformations = {
            t.id: t for t in catalog.transformations_for(self.spec.name, backend_name,
                                                         config.dtype, self.device.vendor)
        }
        if backend_name not in self.spec.sources:
            raise UserError(f"kernel {self.spec.name!r} has no seed for backend {backend_name!r}")
        every_type = {t.id for t in catalog.transformations_for(self.spec.name, backend_name)}
        for tid in config.sequence + config.only:
            wanted = catalog.transformations.get(tid)
            if tid in every_type and wanted is not None and wanted.vendors and \
                    self.device.vendor not in wanted.vendors:
                raise UserError(f"transformation {tid!r} is for {', '.join(wanted.vendors)} "
                                f"devices, not {self.device.name} "
                                f"({self.device.vendor or 'no GPU'})")
            if tid in every_type and tid not in self.transformations:
                allowed = ", ".join(catalog.element_types(tid)) or "no element type"
                raise UserError(f"transformation {tid!r} does not apply to {config.dtype} "
                                f"(it is for {allowed})")
            if tid not in self.transformations:
                raise UserError(f"unknown transformation {tid!r} for {self.spec.name} on "
                                f"{backend_name} (see `peak-tune transforms list`)")
        if config.only:
            self.transformations = {t: self.transformations[t] for t in config.only}
        _check_fixed_sequence(config.sequence, self.transformations)
        if config.replay is None:  # a replay allocates nothing
            _check_host_memory(self.spec, self.sizes, config.dtype)
        self.capabilities = capabilities(backend_name)
        self.backend: Backend = self._backend(backend_name)
        try:  # before anything is created: a device that is not here leaves nothing
            self.device = self.backend.probe()
            _check_results_folder(config.results)
        except BaseException:
            self.backend.close()
            raise
        self.cache = Cache(config.results / "cache")
        self.applier = self._applier()
        setup = PipelineSetup(self.spec, config.dtype, self.device, self.transformations,
                              config.eval_config, config.samples,
                              NoisePolicy.off() if config.replay else NoisePolicy())
        self.pipeline = Pipeline(setup, self.backend, self.applier, self.cache)
        self.encoding = self._encoding()
        try:
            steps = self.transformations if config.encoding == "subset" else None
            self.polisher = Polisher(config.polish, transformations=steps)
        except ValueError as exc:
            raise UserError(f"--polish {config.polish}: {exc}") from exc
        self.sampler_seed = config.seed
        self.ask_ahead: AskAhead | None = None
        self._drawn: dict[int, int] = {}  # trial number -> its ticket in the sampler process
        if config.tell_order not in TELL_ORDERS:
            raise UserError(f"--tell-order must be one of {', '.join(TELL_ORDERS)}, "
                            f"not {config.tell_order!r}")
        self._count_earlier_spend()  # may refuse: before any process or study is made
        self.executor = self._executor(backend_name)  # before the study: fail first
        attach = getattr(self.backend, "attach", None)  # a ClusterBackend's device workers
        if attach is not None:
            attach(self.executor)
        try:
            self.tell_as_finished = tells_as_finished(config.tell_order, self.executor,
                                                      replay=config.replay is not None)
            self._appliers = ThreadPoolExecutor(self.apply_workers,
                                                thread_name_prefix="apply")
            self.study = self._study(backend_name)
            self.ask_ahead = self._ask_ahead()
        except BaseException:
            self._abandon()  # a refusal (e.g. a study made for another size) is one line
            raise
        self.vendor: dict[str, tuple[str, Measurement]] = {}  # size -> its chosen timing
        self.vendor_figures: dict[str, VendorFigure] = {}  # size -> every timing
        self.vendor_clock = VendorClock()
        # False once the backend said the device has no vendor library (NoVendorLibrary):
        # the ratio is then to the documented peak (`denominator`), nothing is re-timed
        self.vendor_library = True
        self.no_vendor_because = ""
        self.confirmation: Confirmation | None = None  # the best re-timed (confirm_best)
        self.confirmation_note = "not re-timed: the run stopped before its end"
        self.started_at = time.time()
        self._journal = LLMJournal(self.cache)
        self._last_pull = time.monotonic()  # the mirror pulled other drivers' trials
        # where the trial loop's own thread spent its time: a study whose driver mostly
        # waits is limited by its devices, one that mostly asks by the sampler
        self.loop_seconds = {"asking": 0.0, "waiting": 0.0, "telling": 0.0}

    def _count_earlier_spend(self) -> None:
        """With budget_scope "study", the LLM budget also counts the calls the journal
        holds for this study from earlier runs (only a study named with --study has
        any: a new run's study is new)."""
        scope = self.config.budget_scope
        if scope not in BUDGET_SCOPES:
            raise UserError(f"--budget-scope must be run or study, not {scope!r}")
        count = getattr(self.applier, "count_earlier", None)
        if scope == "run" or count is None:
            return
        from peak_tune.appliers.llm.client import Usage
        from peak_tune.appliers.llm.prices import price_for
        from peak_tune.appliers.llm.stats import read_records

        name = self.config.study
        if not name:
            return
        earlier = [r for r in read_records(self.cache.folder) if r.study == name]
        prices = str(self.config.llm_settings.get("prices_file") or "")
        cost, unpriced = 0.0, set()
        for r in earlier:  # a call journaled without a price is priced by today's table
            if r.cost_usd is not None:
                cost += r.cost_usd
            elif (price := price_for(r.model, prices)) is not None:
                cost += price.cost_usd(r.prompt_tokens, r.completion_tokens)
            else:
                unpriced.add(r.model)
        if unpriced and self.config.llm_settings.get("max_cost_usd"):
            raise UserError(f"--max-cost with --budget-scope study: study {name!r} has earlier "
                            f"calls without a price (model {', '.join(sorted(unpriced))}); "
                            "give it with --llm-prices FILE, or count this run only")
        count(Usage(len(earlier), sum(r.prompt_tokens for r in earlier),
                    sum(r.completion_tokens for r in earlier), cost))

    def _applier(self) -> Applier:
        """The reference applier, or the LLM one wired to this backend's compiler and
        validation so that compile errors and wrong results go back to the model."""
        if self.config.samples < 1:
            raise UserError("--samples must be 1 or more")
        if self.config.applier != "llm":
            if self.config.samples > 1:
                raise UserError("--samples needs --applier llm (the reference applier is "
                                "deterministic: every sample would be the same)")
        against = AppliedWith(self.backend, self.spec, self.config.dtype, self.cache,
                              self.config.eval_config, run_kernels=self.config.replay is None)
        return wired_applier(self.config.applier, self.config.model, self.config.llm_settings,
                             against)

    def _executor(self, backend_name: str) -> Executor:
        c = self.config
        choice = choose_executor(c.executor, c.ray_address, backend_name)
        if choice == "local":
            return LocalExecutor(self.pipeline, self.compile_workers)
        if c.replay is not None:
            raise UserError("--replay answers from a recording: use --executor local")
        from peak_tune.executors.ray import RayExecutor

        return RayExecutor(self._ray_settings(), self.pipeline, backend_name)

    def _ray_settings(self) -> RaySettings:
        from peak_tune.executors.ray import RaySettings

        c = self.config
        return RaySettings(address=c.ray_address, workers=c.ray_workers,
                           builds_per_worker=max(1, self.compile_workers // 2))

    def _backend(self, name: str) -> Backend:
        """The backend here; with a Ray address, the cluster's (ClusterBackend: the
        device is probed and the vendor timed there, none is needed here)."""
        c = self.config
        if c.replay is None and c.ray_address and \
                choose_executor(c.executor, c.ray_address, name) == "ray":
            from peak_tune.executors.cluster_backend import ClusterBackend

            return ClusterBackend(name, self.device, self._ray_settings())
        if self.config.replay is None:
            return make_backend(name, self.device)
        from peak_tune.backends.replay import ReplayBackend

        return ReplayBackend(self.device, self.config.replay)

    def _encoding(self) -> SequenceEncoding:
        c = self.config
        if c.sequence:
            return FixedEncoding(c.sequence, self.transformations)
        if c.illegal not in ("repair", "prune"):
            raise UserError(f"--illegal must be repair or prune, not {c.illegal!r}")
        repair = c.illegal == "repair"
        if c.encoding == "subset":
            return SubsetEncoding(self.transformations, repair)
        if c.encoding == "steps":
            return StepsEncoding(self.transformations, repair, c.max_steps)
        raise UserError(f"unknown encoding {c.encoding!r} (choose subset or steps)")

    @property
    def storage_url(self) -> str:
        return self.config.storage or results_storage_url(self.config.results)

    def _study(self, backend_name: str) -> optuna.Study:
        """The working (in-memory) study; `self.mirror` writes it through to storage."""
        c = self.config
        identity = {
            "kernel": self.spec.name, "backend": backend_name, "device": self.device.name,
            "dtype": c.dtype, "sizes": [s.label() for s in self.sizes],
        }
        maximize, minimize = StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE
        directions = [maximize, minimize] if is_multi_objective(c.sampler) else [maximize]

        def create(storage: BaseStorage, name: str, resume: bool) -> optuna.Study:
            return optuna.create_study(storage=storage, study_name=name,
                                       load_if_exists=resume, directions=directions)

        warm = self._warm_start_points(identity)  # checked before a study is made
        self.mirror = open_mirrored_study(
            open_storage(self.storage_url),
            lambda storage: (create(storage, c.study, True) if c.study
                             else self._new_study(storage, create)),
            make_sampler(c.sampler, c.seed, self.encoding),
        )
        study = self.mirror.working
        if study.trials and c.seed is not None:
            # A resumed study: seeded as at its start, the sampler would ask again for the
            # points its earlier runs finished. Continue from a seed of its own instead.
            self.sampler_seed = resumed_seed(c.seed, len(study.trials))
            study.sampler = make_sampler(c.sampler, self.sampler_seed, self.encoding)
        existing = study.user_attrs.get("identity")
        if existing and existing != identity:
            raise UserError(f"study {study.study_name!r} was made for {existing}, not {identity}")
        if not existing:
            self.mirror.set_user_attr("identity", identity)
            self.mirror.set_user_attr("applier", self.applier.identity)
        if not study.trials and not c.sequence:
            study.enqueue_trial(self._seed_params(), skip_if_exists=True)
            for params, origin in warm:
                study.enqueue_trial(params, user_attrs={"warm_start_from": origin},
                                    skip_if_exists=True)
            if c.branch_start:
                for branch in branch_sequences(self.transformations):
                    study.enqueue_trial(branch_trial_params(branch, self.transformations,
                                                            c.encoding), skip_if_exists=True)
        return study

    def _warm_start_points(self, identity: Mapping[str, Any]
                           ) -> list[tuple[dict[str, Any], str]]:
        """The parameters of the best `warm_start_top` trials of each warm-start study,
        best first, each once, with where they come from ("study#trial")."""
        c = self.config
        points: list[tuple[dict[str, Any], str]] = []
        if not c.warm_start:
            return points
        if c.warm_start_top < 1:
            raise UserError("--warm-start-top must be 1 or more")
        seen: set[tuple[tuple[str, Any], ...]] = set()
        storage = open_storage(self.storage_url)
        for name in c.warm_start:
            try:
                source = optuna.load_study(study_name=name, storage=storage)
            except KeyError:
                raise UserError(f"--warm-start {name}: no such study in "
                                f"{redacted_url(self.storage_url)}") from None
            made_for = source.user_attrs.get("identity", {})
            for part in ("kernel", "backend"):
                if made_for.get(part) != identity[part]:
                    raise UserError(f"--warm-start {name}: a study of {part} "
                                    f"{made_for.get(part)!r}, not {identity[part]!r}")
            finished = source.get_trials(deepcopy=False,
                                         states=(optuna.trial.TrialState.COMPLETE,))
            finished.sort(key=lambda t: -(t.values[0] if t.values else 0.0))
            taken = 0
            for trial in finished:
                key = tuple(sorted(trial.params.items()))
                if taken >= c.warm_start_top or key in seen:
                    continue
                seen.add(key)
                taken += 1
                points.append((dict(trial.params), f"{name}#{trial.number}"))
        return points

    def _new_study(self, storage: BaseStorage,
                   create: Callable[[BaseStorage, str, bool], optuna.Study]) -> optuna.Study:
        """A fresh study per run: `<kernel>-<device>-<dtype>-<sizes>[-fixed]-run<N>`.

        With the same seed a new run asks for the same points as the last one, so the
        cache answers all of them; `--study NAME` resumes a study instead. Two runs
        started at once on one storage take different numbers.
        """
        base = "-".join([self.spec.name, self.device.name, self.config.dtype,
                         "_".join(s.label() for s in self.sizes)])
        if self.config.sequence:
            base += "-fixed"
        taken = {s.study_name for s in storage.get_all_studies()}
        for n in itertools.count(1):
            name = f"{base}-run{n}"
            if name in taken:
                continue
            try:
                return create(storage, name, False)
            except optuna.exceptions.DuplicatedStudyError:
                taken.add(name)  # another run took it between the listing and now
        raise AssertionError("unreachable")

    def _seed_params(self) -> dict[str, Any]:
        if self.config.encoding == "steps":
            return {"step.0": "end"}
        return {f"use.{tid}": False for tid in self.transformations}

    # ------------------------------------------------------------------- vendor

    def measure_vendor(self) -> None:
        """The vendor's figure at every size (peak_tune.harness.vendor): the study's own
        timings (a resumed study), else the cache's (an earlier run on this fingerprint:
        a run answered by the cache reports that run's ratio), else timed now by the
        backend's timer, once this run's helper processes have settled. The run times it
        again between trials (`retime_vendor_if_due`)."""
        held = figures_from_json(self.study.user_attrs.get(VENDOR_ATTR))
        store = VendorStore(self.cache.folder)
        for size in self.sizes:
            label = size.label()
            known = held.get(label) or store.load(self.pipeline.vendor_key(size))
            if known is not None:
                self.vendor_figures[label] = known
        missing = [s for s in self.sizes if s.label() not in self.vendor_figures]
        if not missing:
            self._publish_vendor()
            return
        settle_own_processes()
        try:
            self._time_vendor(missing, "start")
        except NoVendorLibrary as exc:
            self.vendor_library, self.no_vendor_because = False, str(exc)
            log.info("no vendor library: %s", exc)

    def vendor_gflops(self) -> float:
        return geometric_mean([m.gflops for _, m in self.vendor.values()])

    def peak_gflops(self) -> float:
        """The device profile's documented peak for the study's element type (0: none)."""
        return float(self.device.peak_gflops.get(self.config.dtype, 0.0) or 0.0)

    def denominator(self) -> tuple[str, float]:
        """What the best is measured against: ("vendor", its figure) where the device has
        a vendor library, else ("peak", the documented peak) as the PEAK paper did for
        its Adreno GPU, else ("", 0.0): GFLOP/s alone (lavapipe documents no peak)."""
        vendor = self.vendor_gflops()
        if vendor > 0:
            return "vendor", vendor
        peak = self.peak_gflops()
        return ("peak", peak) if peak > 0 and not self.vendor_library else ("", 0.0)

    def retime_vendor_if_due(self, trial: optuna.Trial, record: TrialRecord) -> None:
        """After a trial is told: time the vendor again when the schedule says so (every
        so many timed trials or seconds, or the run's conditions changed)."""
        ran = record.status in (Status.OK, Status.WRONG_RESULT, Status.RUNTIME_ERROR,
                                Status.TIMEOUT)
        self.vendor_clock.saw_trial(ran and not record.cached,
                                    bool(trial.user_attrs.get("noisy")))
        reason = self.vendor_clock.due()
        if reason is None or not self.vendor_figures:
            return
        try:
            self._time_vendor(self.sizes, reason)
        except EvaluationError as exc:  # the figure so far stands; the next one may do
            log.warning("timing the vendor again (%s) failed: %s", reason, exc)
            self.vendor_clock.timed_vendor()

    def _time_vendor(self, sizes: list[ProblemSize], reason: str) -> None:
        """Time the vendor at `sizes` (a noisy timing again, see harness.noise); keep
        the timing in the study, and its steady figure in the cache."""
        for size in sizes:
            self._keep_vendor_timing(size, *self._vendor_timing(size, reason))
        self.vendor_clock.timed_vendor()
        self._publish_vendor()

    def _keep_vendor_timing(self, size: ProblemSize, name: str, timing: VendorTiming) -> None:
        """Add a timing to the vendor's figure at `size`; a steady one to the cache's."""
        label = size.label()
        figure = self.vendor_figures.get(label, VendorFigure(name))
        self.vendor_figures[label] = figure = figure.adding(timing, name)
        log.info("vendor at %s (%s): %.2f GFLOP/s, figure %.2f over %d timings%s",
                 label, timing.reason, timing.gflops, figure.gflops, len(figure.timings),
                 " (noisy)" if timing.noisy else "")
        if not timing.noisy:
            VendorStore(self.cache.folder).save(self.pipeline.vendor_key(size),
                                                figure.steady_part())

    def _vendor_timing(self, size: ProblemSize, reason: str) -> tuple[str, VendorTiming]:
        """(vendor name, the steadiest of its timings at `size`)."""
        names: list[str] = []

        def once() -> Measurement:
            name, measurement = self.backend.time_vendor(
                self.spec, self.config.dtype, size, self.config.eval_config)
            names.append(name)
            return measurement

        steady = measure_steadily(once, self.pipeline.setup.noise, watch_load=True)
        return names[-1], VendorTiming(
            steady.measurement.samples_ms, steady.measurement.flops, time.time(),
            load_average(), reason, steady.why, steady.remeasured, steady.busy_cores)

    def _publish_vendor(self) -> None:
        """The chosen timing per size for the summary and progress; the figures into the
        study."""
        self.vendor = {}
        for label, figure in self.vendor_figures.items():
            chosen = figure.chosen()
            if chosen is not None:
                self.vendor[label] = (figure.name, chosen.measurement)
        self.mirror.set_user_attr(VENDOR_ATTR, {label: f.to_json() for label, f
                                                in self.vendor_figures.items()})

    # ------------------------------------------------------------------- trials

    def run(self, trials: int, on_trial: Callable[[TrialRecord], None],
            should_stop: Callable[[], bool] = lambda: False) -> None:
        """Run up to `trials` trials; `should_stop` is asked before each new trial.

        Trials flow through a window of the executor's `slots`: each is asked for (TPE's
        constant liar keeps them apart) and applied here, then built and timed by the
        executor while the next ones are prepared, so the devices rarely wait for a
        compiler or for the sampler. Results are told in the order asked, which keeps a
        seeded run repeatable, or as they finish (`tell_order`), so that one slow build
        or kernel does not hold up a window of finished trials.
        """
        asked = 0
        pending: deque[_Started] = deque()
        clock = self.loop_seconds
        shown = _ShownWhenStored(on_trial)
        try:
            while True:
                while (len(pending) < self.window and asked < trials
                       and not should_stop()):
                    self._pull_other_drivers()
                    began = time.perf_counter()
                    pending.append(_Started(self._ask(), began))
                    asked += 1
                    self._start(pending[-1])
                    clock["asking"] += time.perf_counter() - began
                if not pending:
                    break
                began = time.perf_counter()
                item = self._next_to_tell(pending)
                self._show_while_waiting(item, shown)
                record = self._finish(item)
                told = time.perf_counter()
                self._tell(item.trial, record)
                pending.remove(item)  # told: sent to the storage, shown once stored
                shown.told(record)
                self.retime_vendor_if_due(item.trial, record)
                self._offer_to_polisher(item, record)
                clock["waiting"] += told - began
                clock["telling"] += time.perf_counter() - told
                self._journal_llm_calls()
                shown.stored(self.mirror.take_stored())
        except BaseException as exc:
            self._journal_llm_calls()  # the calls of the stopped trials cost too
            for item in pending:
                if item.prepared:
                    item.prepared.cancel()
                if item.outcomes:
                    item.outcomes.cancel()
                self._fail_unfinished(item.trial, _reason(exc))
            raise
        finally:
            try:
                self.mirror.flush()
            finally:  # what the storage holds, also when it failed
                shown.stored(self.mirror.take_stored())
        if should_stop():
            self.confirmation_note = "not re-timed: the run was stopped"
        else:
            self.confirm_best()

    def _show_while_waiting(self, item: _Started, shown: _ShownWhenStored) -> None:
        """While `item` still runs, show the trials told before it as the storage takes
        them in (a few milliseconds after they are told), not one trial late."""
        while shown.waiting and not _settled(item):
            running: list[Future[Any]] = [f for f in (item.prepared, item.outcomes)
                                          if f is not None]
            wait(running, timeout=SHOW_STORED_EVERY_S)
            shown.stored(self.mirror.take_stored())

    def _next_to_tell(self, pending: deque[_Started]) -> _Started:
        """The oldest trial, or, telling as trials finish, the oldest finished one (after
        waiting for any to finish)."""
        if not self.tell_as_finished:
            return pending[0]
        while True:
            ready = next((item for item in pending if _settled(item)), None)
            if ready is not None:
                return ready
            running: list[Future[Any]] = [f for item in pending
                                          for f in (item.outcomes or item.prepared,)
                                          if f is not None]
            wait(running, timeout=1.0, return_when=FIRST_COMPLETED)

    def _ask(self) -> optuna.Trial:
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
        if self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            return True
        neighbour = self.polisher.next()
        if neighbour is None:
            return False
        self.study.enqueue_trial(neighbour.params, user_attrs={
            "neighbour_of": neighbour.origin, "moved": neighbour.moved})
        return True

    def _ask_ahead(self) -> AskAhead | None:
        """The sampler process, where the study draws ahead (see TuneConfig.ask_ahead)."""
        c = self.config
        depth = c.ask_ahead
        if depth < 0:  # a core of its own beside the driver, the writer and the builds
            cores = os.cpu_count() or 1
            depth = (ASK_AHEAD if self.tell_as_finished and c.sampler == "tpe"
                     and cores >= ASK_AHEAD_MIN_CORES else 0)
        if depth == 0:
            return None
        finished = self.study.get_trials(deepcopy=False, states=(
            optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))
        ask_ahead = AskAhead(c.sampler, self.sampler_seed, self.encoding,
                             self.study.directions, finished, depth)
        self.study.sampler = FixedFirst(self.study.sampler)
        return ask_ahead

    def _finished(self, number: int) -> None:
        """Trial `number` was just told: to the storage, and to the sampler process."""
        trial = self.mirror.finished(number)
        if self.ask_ahead is not None:
            self.ask_ahead.told(self._drawn.pop(number, None), trial)

    def _offer_to_polisher(self, item: _Started, record: TrialRecord) -> None:
        if record.status is Status.OK and item.chain:
            self.polisher.offer(item.trial.number, item.trial.params, item.chain[-1],
                                item.params, record.gflops)
        elif record.status is Status.INVALID and item.chain and item.params:
            self.polisher.repair(item.trial.number, item.trial.params, item.chain[-1],
                                 item.params)
        else:
            self.polisher.saw(item.trial.params)

    @property
    def window(self) -> int:
        """Trials between ask and tell: enough to keep the executor and appliers busy."""
        return max(self.executor.slots, self.apply_workers)

    def _pull_other_drivers(self) -> None:
        """Take in trials other drivers of this study finished, as the study writer
        reports them; every few seconds ask it to look again."""
        for trial in self.mirror.take_pulled():
            if self.ask_ahead is not None:
                self.ask_ahead.told(None, trial)
        now = time.monotonic()
        if now - self._last_pull >= PULL_EVERY_S:
            self._last_pull = now
            self.mirror.request_pull()

    def _journal_llm_calls(self) -> None:
        self._journal.write(self.applier, self.study.study_name)

    @property
    def compile_workers(self) -> int:
        """Builds at once: 1 for the C backend (a compiler beside a CPU timing would
        disturb it), else one per host core."""
        if self.config.compile_workers > 0:
            return self.config.compile_workers
        return 1 if self.capabilities.on_host else max(1, os.cpu_count() or 1)

    def _fail_unfinished(self, trial: optuna.Trial, reason: str) -> None:
        """Mark a trial the run stopped in as failed, so the study holds no RUNNING trial
        (one already told, and sent to the storage, is left as it is)."""
        if self.study.get_trials(deepcopy=False)[trial.number].state.is_finished():
            return
        if "status" not in trial.user_attrs:
            trial.set_user_attr("status", "interrupted")
            trial.set_user_attr("message", reason[:500])
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        self._finished(trial.number)

    def _start(self, item: _Started) -> None:
        """Choose the sequence here; apply it and hand the point to the executor on the
        apply pool, so that slow appliers (LLM calls) overlap one another."""
        try:
            item.sequence = self.encoding.suggest(item.trial)
        except InvalidPoint as exc:
            item.early = (Status.INVALID, str(exc))
            return
        item.prepared = self._appliers.submit(self._apply_and_submit, item)

    def _apply_and_submit(self, item: _Started) -> None:
        try:
            item.chain = self.pipeline.build(item.sequence)
        except InvalidPoint as exc:
            item.early = (Status.INVALID, str(exc))
            return
        except ApplyError as exc:
            item.early = (Status.APPLY_ERROR, str(exc))
            return
        variant = item.chain[-1]
        item.params = suggest_params(item.trial, variant)
        item.trial.set_user_attr("context_hash", variant.content_hash())
        item.outcomes = self.executor.submit(self._job(variant, item.params))

    @property
    def apply_workers(self) -> int:
        """Applications at once: one for the reference applier (fast, and a seeded run
        stays repeatable), several for the LLM one (each call waits on the network)."""
        if self.config.apply_workers > 0:
            return self.config.apply_workers
        llm_config = getattr(self.applier, "config", None)  # the LLM client's request cap
        return int(getattr(llm_config, "concurrency", 1)) if self.config.applier == "llm" else 1

    def _job(self, variant: KernelContext, params: dict[str, int]) -> EvalJob:
        """The point at every tuned size; one more than SLOW_FACTOR times slower than the
        best so far is timed once (its exact speed does not matter to the search)."""
        best = [self.best_median_ms(size) for size in self.sizes]
        return EvalJob(variant, params, tuple(self.sizes),
                       tuple(SLOW_FACTOR * ms if ms else 0.0 for ms in best),
                       self.build_limit_s())

    def build_limit_s(self) -> float:
        """How long a build may run now: --build-budget times the median of this run's
        builds, at least BUILD_BUDGET_FLOOR_S; 0 (no limit) before BUILD_BUDGET_AFTER
        builds or with a budget of 0. A build stopped at it counts as lasting that long."""
        if self.config.build_budget <= 0:
            return 0.0
        builds = [job.build_s for job in list(self.executor.job_times) if job.compiled]
        if len(builds) < BUILD_BUDGET_AFTER:
            return 0.0
        return max(BUILD_BUDGET_FLOOR_S, self.config.build_budget * statistics.median(builds))

    def _finish(self, item: _Started) -> TrialRecord:
        def ended(status: Status, message: str = "", gflops: float = 0.0,
                  cached: bool = False) -> TrialRecord:
            return TrialRecord(item.trial.number, status, tuple(item.sequence), item.params,
                               gflops, message, cached, time.perf_counter() - item.started)

        if item.prepared is not None:
            item.prepared.result()  # the applier's own errors (UserError, ...) surface here
        if item.early or item.outcomes is None:
            return ended(*(item.early or (Status.RUNTIME_ERROR, "not evaluated")))
        outcomes = item.outcomes.result()
        failed = next((o for o in outcomes if o.status is not Status.OK), None)
        if failed:
            return ended(failed.status, failed.message, cached=failed.cached)
        if self.config.step_values:
            self._report_steps(item.trial, item.chain, item.params)
        item.trial.set_user_attr("gflops", {s.label(): o.gflops for s, o in zip(
            self.sizes, outcomes, strict=True)})
        item.trial.set_user_attr("spread", max(o.measurement.spread for o in outcomes
                                               if o.measurement))
        item.trial.set_user_attr("noisy", any(o.noisy for o in outcomes))  # not cached
        if any(o.remeasured for o in outcomes):
            item.trial.set_user_attr("remeasured", sum(o.remeasured for o in outcomes))
        return ended(Status.OK, gflops=geometric_mean([o.gflops for o in outcomes]),
                     cached=all(o.cached for o in outcomes))

    def best_median_ms(self, size: ProblemSize) -> float | None:
        flops = self.pipeline.flops(size)
        best = self.best_gflops()
        return flops / (best * 1e9) * 1e3 if best > 0 else None

    def _report_steps(self, trial: optuna.Trial, chain: list[Any], params: dict[str, int]) -> None:
        """Speed after each step of the sequence (the intermediate values)."""
        for step, prefix in enumerate(chain[:-1]):
            values = {p.name: params[p.name] for p in prefix.params}
            outcomes = self.executor.submit(self._job(prefix, values)).result()
            trial.report(geometric_mean([o.gflops for o in outcomes]), step)

    def _tell(self, trial: optuna.Trial, record: TrialRecord) -> None:
        trial.set_user_attr("status", record.status.value)
        trial.set_user_attr("sequence", list(record.sequence))
        trial.set_user_attr("params", record.params)
        if record.message:
            trial.set_user_attr("message", record.message[:500])
        trial.set_user_attr("cached", record.cached)
        if record.status is Status.OK:
            values: list[float] = [record.gflops]
            if is_multi_objective(self.config.sampler):
                values.append(float(len(record.sequence)))
            self.study.tell(trial, values)
        elif record.status is Status.INVALID:
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        self._finished(trial.number)

    # ------------------------------------------------------------------ results

    def ranked_trials(self) -> list[optuna.trial.FrozenTrial]:
        """Completed trials, fastest first, without those the sanitizer rejected."""
        rejected = set(self.study.user_attrs.get("sanitizer_rejected", []))
        done = [t for t in self.study.get_trials(deepcopy=False)
                if t.state == optuna.trial.TrialState.COMPLETE and t.values
                and t.number not in rejected]
        return sorted(done, key=lambda t: -t.values[0])

    def best_trial(self) -> optuna.trial.FrozenTrial | None:
        ranked = self.ranked_trials()
        return ranked[0] if ranked else None

    def sanitize_best(self, tries: int = 3) -> list[str]:
        """Run the backend's sanitizer (memory errors, races) on the fastest trials until
        one passes; rejected trials no longer count as best. Returns one line per try."""
        sanitize = self.backend_tool("sanitize")
        lines = []
        for trial in self.ranked_trials()[:tries]:
            built = self._rebuild(trial)
            if built is None:
                continue
            try:
                sanitize(*built)
            except EvaluationError as exc:
                rejected = self.study.user_attrs.get("sanitizer_rejected", [])
                self.mirror.set_user_attr("sanitizer_rejected", [*rejected, trial.number])
                lines.append(f"trial {trial.number}: rejected: {exc}")
                continue
            lines.append(f"trial {trial.number}: compute-sanitizer found nothing")
            break
        best = self.best_trial()
        if self.confirmation is not None and best is not None and (
                best.number != self.confirmation.trial):
            self.confirm_best()  # the re-timed trial was rejected: re-time the new best
        return lines

    def profile_best(self) -> str:
        """Nsight Compute on the best trial: its key metrics as one line; the full CSV is
        kept as <results>/profiles/<study>-trial<N>.csv."""
        profile = self.backend_tool("profile")
        best = self.best_trial()
        built = self._rebuild(best) if best is not None else None
        if best is None or built is None:
            return "no finished trial to profile"
        report = profile(*built)
        folder = self.config.results / "profiles"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.study.study_name}-trial{best.number}.csv"
        path.write_text(report.raw)
        return f"trial {best.number}: {report.summary()} (all metrics: {path})"

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
        context = self.cache.get_context(trial.user_attrs["context_hash"])
        if context is None:
            return None
        params = {p.name: trial.user_attrs["params"][p.name] for p in context.params}
        artifact = self.backend.compile(context, params, self.config.dtype,
                                        str(self.cache.builds))
        return artifact, self.pipeline.request(context, params, self.sizes[0], 0.0)

    # ------------------------------------------------------- confirming the best

    def confirm_best(self) -> Confirmation | None:
        """Re-time the best trial at the end of the run: at every tuned size a fresh,
        uncached evaluation of its variant (validated on new secret inputs), then the
        vendor, CONFIRM_ROUNDS times (harness.noise re-measures each; the vendor's timings
        join its figure). The summary prints it as the best, and the ratio over the
        vendor's figure. A resumed study whose best is the one it holds
        re-times nothing, nor does a size the cache holds (a run answered by the cache); a
        noisy re-timing is flagged and not cached; a kernel that fails is reported."""
        self.confirmation = None
        best = self.best_trial()
        context = self.cache.get_context(best.user_attrs["context_hash"]) if best else None
        if best is None or context is None or self.config.replay is not None:
            self.confirmation_note = ("nothing to re-time: no finished trial" if best is None
                                      else "not re-timed: a replay" if context is not None
                                      else "not re-timed: its variant is not in the cache")
            return None
        params = {p.name: best.user_attrs["params"][p.name] for p in context.params}
        held = Confirmation.from_json(self.study.user_attrs.get(CONFIRM_ATTR), "study")
        labels = [s.label() for s in self.sizes]
        if held is not None and held.is_of(context.content_hash(), params, labels) and (
                not held.noisy_because):
            self.confirmation = replace(held, trial=best.number)
            return self.confirmation
        try:
            confirmation = self._confirmed(best.number, context, params)
        except EvaluationError as exc:  # the vendor's timing: the kernel's are outcomes
            log.warning("re-timing the best trial: the vendor failed: %s", exc)
            self.confirmation_note = f"not re-timed: timing the vendor failed: {exc}"
            return None
        finally:
            self._publish_vendor()  # the vendor's timings beside it joined its figure
        self.mirror.set_user_attr(CONFIRM_ATTR, confirmation.to_json())
        self.confirmation = confirmation
        return confirmation

    def _confirmed(self, trial: int, context: KernelContext, params: dict[str, int]
                   ) -> Confirmation:
        """The re-timing at every size: from the cache, else timed now (and cached)."""
        by_size: dict[str, SizeConfirmation] = {}
        timed = False
        for size in self.sizes:
            key = confirmation_key(context.content_hash(), params, size.as_dict(),
                                   self.config.dtype, self.pipeline.vendor_key(size),
                                   CONFIRM_ROUNDS)
            stored = self.cache.get_confirmation(key)
            try:
                known = SizeConfirmation.from_json(stored) if stored else None
            except (KeyError, TypeError, ValueError):
                known = None  # a damaged entry is timed again
            if known is None:
                if not timed:
                    settle_own_processes()  # the builds and the study writer idle
                known, timed = self._retime_steadily(context, params, size), True
                if not known.noisy_because:
                    self.cache.put_confirmation(key, known.to_json())
            by_size[size.label()] = known
        return Confirmation(trial, context.content_hash(), params, by_size,
                            "timed" if timed else "cache")

    def _retime_steadily(self, context: KernelContext, params: dict[str, int],
                         size: ProblemSize) -> SizeConfirmation:
        """The re-timing at `size`, again while it is noisy (up to the noise policy's
        re-measures, as for any timing): the first steady one, else the last."""
        attempt = self._retime_at(context, params, size)
        for _ in range(self.pipeline.setup.noise.remeasures):
            if not attempt.noisy_because or attempt.status is not Status.OK:
                break
            log.info("re-timing the best at %s was noisy (%s): again", size.label(),
                     attempt.noisy_because)
            attempt = self._retime_at(context, params, size)
        return attempt

    def _retime_at(self, context: KernelContext, params: dict[str, int],
                   size: ProblemSize) -> SizeConfirmation:
        """CONFIRM_ROUNDS rounds of the kernel, then the vendor, at `size`."""
        policy = self.pipeline.setup.noise
        meter, began = ForeignLoad(), time.time()
        try:
            artifact = self.backend.compile(context, params, self.config.dtype,
                                            str(self.cache.builds))
        except (InvalidPoint, EvaluationError) as exc:
            failed = outcome_of_error(exc)
            return SizeConfirmation(failed.status, failed.message, at=began)
        kernel: list[tuple[float, ...]] = []
        vendor: list[tuple[float, ...]] = []
        name, flops, noisy = "", 0.0, []
        for round_ in range(1, CONFIRM_ROUNDS + 1):
            outcome = evaluate_built(self.backend, self.pipeline.setup, artifact, context,
                                     params, size, 0.0)
            if outcome.status is not Status.OK or outcome.measurement is None:
                log.warning("the best trial failed its re-validation at %s (round %d): %s",
                            size.label(), round_, outcome.message)
                return SizeConfirmation(outcome.status, f"round {round_}: {outcome.message}",
                                        flops, tuple(kernel), tuple(vendor), name, at=began)
            kernel.append(outcome.measurement.samples_ms)
            flops = outcome.measurement.flops
            if outcome.noisy:
                noisy.append(f"kernel round {round_}: "
                             f"{policy.why_noisy(outcome.measurement) or 'spread'}")
            if not self.vendor_library:
                continue  # the documented peak: nothing to time beside the kernel
            name, timing = self._vendor_timing(size, "end-of-run re-timing")
            self._keep_vendor_timing(size, name, timing)
            vendor.append(timing.samples_ms)
            if timing.noisy:
                noisy.append(f"vendor round {round_}: {timing.noisy_because}")
        busy = meter.cores()
        if busy > policy.max_foreign_cores:
            noisy.append(f"other processes kept {busy:.2f} cores busy")
        return SizeConfirmation(Status.OK, "", flops, tuple(kernel), tuple(vendor), name,
                                "; ".join(noisy), busy, began)

    def best_gflops(self) -> float:
        best = self.best_trial()
        return best.values[0] if best else 0.0

    def _abandon(self) -> None:
        """Stop what a start that failed had opened: the workers, the study writer."""
        appliers = getattr(self, "_appliers", None)
        if appliers is not None:
            appliers.shutdown(wait=False, cancel_futures=True)
        for part in (getattr(self, "executor", None), getattr(self, "mirror", None),
                     getattr(self, "ask_ahead", None), getattr(self, "backend", None)):
            if part is not None:
                with contextlib.suppress(Exception):  # the error being raised matters
                    part.close()

    def close(self) -> None:
        """Write every finished trial to the storage and stop the backend's workers."""
        try:
            self._appliers.shutdown(wait=True, cancel_futures=True)
            self.executor.close()
            self.mirror.close()
        finally:
            if self.ask_ahead is not None:
                self.ask_ahead.close()
            self.backend.close()


def open_session(config: TuneConfig) -> TuneSession:
    if os.environ.get("PEAK_TUNE_DEBUG"):
        logging.getLogger("peak_tune").setLevel(logging.DEBUG)
    return TuneSession(config)

