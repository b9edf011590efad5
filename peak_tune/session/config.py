"""What one tuning run is asked to do: every choice of `peak-tune tune`, as one value in
five typed parts, each the concern of one layer:

    TargetSettings   what is tuned, where (session.target resolves it)
    ApplierSettings  who applies the steps (appliers.wiring, the LLM budget)
    SearchSettings   how the sequences and parameters are sampled (search/)
    StoreSettings    where the study and the cache are kept (study/, evaluation.cache)
    RunSettings      how evaluations run (executors/, backends/)

The CLI, batch files and the benchmarks name a choice by one flat vocabulary, the tune
command's option names (`TuneConfig.of(sampler="random", apply_workers=4)`; OPTIONS says
which part holds which); the code reads the part it needs (`config.search.sampler`).
The choices are enums (a StrEnum equals its text, so "subset" and Encoding.SUBSET are
one), checked once, here, for all of them alike; the applier and the sampler are
registries (a new one is registered, not added here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from peak_tune.appliers import APPLIERS
from peak_tune.backends.base import BUILD_BUDGET, EvalConfig
from peak_tune.errors import UserError
from peak_tune.search.samplers import SAMPLERS

__all__ = ["CHOICES", "OPTIONS", "TELL_ORDERS", "ApplierSettings", "BudgetScope",
           "Encoding", "ExecutorChoice", "Illegal", "RunSettings", "SearchSettings",
           "StoreSettings", "TargetSettings", "TellOrder", "TuneConfig"]


class Encoding(StrEnum):
    SUBSET = "subset"  # a flag per transformation, in the catalog's order
    STEPS = "steps"  # a choice per position, up to max_steps


class Illegal(StrEnum):
    REPAIR = "repair"  # an illegal sequence is made legal (requirements added, conflicts cut)
    PRUNE = "prune"  # an illegal sequence is a pruned trial


class TellOrder(StrEnum):
    AUTO = "auto"
    ASKED = "asked"
    FINISHED = "finished"


class ExecutorChoice(StrEnum):
    AUTO = "auto"
    LOCAL = "local"
    RAY = "ray"


class BudgetScope(StrEnum):
    RUN = "run"
    STUDY = "study"


# option -> its allowed values
CHOICES: dict[str, tuple[str, ...]] = {
    "applier": tuple(APPLIERS), "sampler": SAMPLERS,
    "encoding": tuple(Encoding), "illegal": tuple(Illegal), "tell_order": tuple(TellOrder),
    "executor": tuple(ExecutorChoice), "budget_scope": tuple(BudgetScope),
}
TELL_ORDERS = tuple(TellOrder)


def _hold_choices(part: object, choices: Mapping[str, tuple[str, type[StrEnum] | None]]
                  ) -> None:
    """Check each `field: (option, enum)` of a frozen part against CHOICES[option] and
    hold it as its enum: UserError naming the option."""
    for name, (option, enum) in choices.items():
        value = getattr(part, name)
        if value not in CHOICES[option]:
            raise UserError(f"--{option.replace('_', '-')} must be one of "
                            f"{', '.join(CHOICES[option])}, not {value!r}")
        if enum is not None:
            object.__setattr__(part, name, enum(value))


@dataclass(frozen=True)
class TargetSettings:
    """What is tuned, where."""

    kernel: str = "matmul"
    backend: str | None = None  # None: the device's backend
    device: str | None = None  # None: what this machine has (no GPU: cpu)
    dtype: str = "float32"
    # empty: the spec's default size; a text is a size as `--size` takes it (core.size_of)
    sizes: tuple[Mapping[str, int] | str, ...] = ()
    catalogs: tuple[str, ...] = ()  # extra catalog folders


@dataclass(frozen=True)
class ApplierSettings:
    """Who carries out the transformations, and what the LLM one may spend."""

    name: str = "reference"  # option --applier
    model: str | None = None  # the LLM applier's model (else OPENAI_MODEL)
    llm_settings: Mapping[str, Any] = field(default_factory=dict)  # temperature, repairs, ...
    samples: int = 1  # independent LLM applications per step; the first that passes is used
    workers: int = 0  # option --apply-workers: at once; 0: 1 (reference) or --llm-concurrency
    # what the LLM budget counts: this run's calls ("run") or, from the journal, the
    # study's calls in every run so far as well ("study")
    budget_scope: BudgetScope = BudgetScope.RUN

    def __post_init__(self) -> None:
        _hold_choices(self, {"name": ("applier", None),
                             "budget_scope": ("budget_scope", BudgetScope)})


@dataclass(frozen=True)
class SearchSettings:
    """How the sampler chooses sequences and parameter values."""

    sampler: str = "tpe"
    seed: int | None = 0  # the same seed and catalog ask for the same points
    encoding: Encoding = Encoding.SUBSET
    illegal: Illegal = Illegal.REPAIR
    sequence: tuple[str, ...] = ()  # fixed sequence: only parameters are tuned
    only: tuple[str, ...] = ()  # search only these transformations (empty: all)
    max_steps: int = 12
    branch_start: bool = True  # first trials: a few per branch of the catalog's conflicts
    polish: float = 0.5  # share of trials spent on neighbours of the best (search.polish)
    # "asked": tell trials in the order asked (a seeded run repeats itself); "finished":
    # as they finish (one slow build no longer holds up the rest); "auto": finished on
    # Ray, where several devices answer in their own order anyway, else asked
    tell_order: TellOrder = TellOrder.AUTO
    # draws a sampler process keeps ready (search.ask_ahead); 0: the driver samples
    # itself; -1 (auto): ASK_AHEAD where trials are told as they finish with TPE on a
    # machine of ASK_AHEAD_MIN_CORES or more, else 0
    ask_ahead: int = -1
    # sampler processes drawing ahead at once; -1 (auto): one per SAMPLER_CORES cores,
    # at most MAX_SAMPLER_PROCESSES (search.ask_ahead)
    sampler_processes: int = -1
    step_values: bool = False  # each step's speed along the best's sequence, per trial
    # a new study's first trials: the best `warm_start_top` of these studies (same storage
    # and kernel; another size, dtype, device or backend), e.g. 8192 starting from 4096
    warm_start: tuple[str, ...] = ()
    warm_start_top: int = 10

    def __post_init__(self) -> None:
        _hold_choices(self, {"sampler": ("sampler", None),
                             "encoding": ("encoding", Encoding),
                             "illegal": ("illegal", Illegal),
                             "tell_order": ("tell_order", TellOrder)})
        if self.sampler_processes == 0 or self.sampler_processes < -1:
            raise UserError("--sampler-processes must be 1 or more (-1: one per 4 cores)")


@dataclass(frozen=True)
class StoreSettings:
    """Where the study, its cache and its files are kept."""

    study: str | None = None  # the study's name (None: a new one per run)
    results: Path = Path("results")
    storage: str | None = None  # None: SQLite in the results folder


@dataclass(frozen=True)
class RunSettings:
    """How the variants are built and evaluated."""

    executor: ExecutorChoice = ExecutorChoice.AUTO  # auto: ray with several GPUs or an address
    ray_address: str | None = None
    ray_workers: int = 0  # device actors on Ray; 0: one per GPU (per node for C)
    compile_workers: int = 0  # builds at once; 0: 1 for the C backend, else one per core
    build_budget: float = BUILD_BUDGET  # stop builds past this times the median (0: never)
    # trials between ask and tell; 0: enough for the executor (twice its builds at once)
    # and the appliers
    in_flight: int = 0
    eval_config: EvalConfig = field(default_factory=EvalConfig)
    replay: Path | None = None  # answer evaluations from this recording (ReplayBackend)

    def __post_init__(self) -> None:
        _hold_choices(self, {"executor": ("executor", ExecutorChoice)})
        if self.in_flight < 0:
            raise UserError("--in-flight must be 0 (as many as the builds need) or more")


_PARTS: dict[str, type] = {"target": TargetSettings, "applier": ApplierSettings,
                           "search": SearchSettings, "store": StoreSettings,
                           "run": RunSettings}
_OPTION_OF_FIELD = {("applier", "name"): "applier", ("applier", "workers"): "apply_workers"}
# option name -> (part, field): the one flat vocabulary of the CLI and batch files
OPTIONS: dict[str, tuple[str, str]] = {
    _OPTION_OF_FIELD.get((part, f.name), f.name): (part, f.name)
    for part, cls in _PARTS.items() for f in fields(cls)}


@dataclass(frozen=True)
class TuneConfig:
    target: TargetSettings = field(default_factory=TargetSettings)
    applier: ApplierSettings = field(default_factory=ApplierSettings)
    search: SearchSettings = field(default_factory=SearchSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    run: RunSettings = field(default_factory=RunSettings)

    @classmethod
    def of(cls, **options: Any) -> TuneConfig:
        """A config from option names (OPTIONS), the rest left at their defaults."""
        return cls().with_options(**options)

    def with_options(self, **options: Any) -> TuneConfig:
        """This config with the named options changed; UserError for an unknown name."""
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise UserError(f"unknown tuning option{'s' * (len(unknown) > 1)}: "
                            f"{', '.join(unknown)}")
        changes: dict[str, dict[str, Any]] = {}
        for option, value in options.items():
            part, name = OPTIONS[option]
            changes.setdefault(part, {})[name] = value
        return replace(self, **{part: replace(getattr(self, part), **values)
                                for part, values in changes.items()})
