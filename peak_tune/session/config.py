"""What one tuning run is asked to do: every choice of `peak-tune tune`, as one value.

The choices are enums (a StrEnum equals its text, so "subset" and Encoding.SUBSET are
one), checked once, here, for the CLI, batch files and the workbench alike; the
applier and the sampler are registries (a new one is registered, not added here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from peak_tune.appliers import APPLIERS
from peak_tune.backends.base import BUILD_BUDGET, EvalConfig
from peak_tune.errors import UserError
from peak_tune.search.samplers import SAMPLERS

__all__ = ["CHOICES", "TELL_ORDERS", "BudgetScope", "Encoding",
           "ExecutorChoice", "Illegal", "TellOrder", "TuneConfig"]


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


# field -> its allowed values, and the option that sets it
CHOICES: dict[str, tuple[str, ...]] = {
    "applier": tuple(APPLIERS), "sampler": SAMPLERS,
    "encoding": tuple(Encoding), "illegal": tuple(Illegal), "tell_order": tuple(TellOrder),
    "executor": tuple(ExecutorChoice), "budget_scope": tuple(BudgetScope),
}
_ENUMS: dict[str, type[StrEnum]] = {
    "encoding": Encoding, "illegal": Illegal, "tell_order": TellOrder,
    "executor": ExecutorChoice, "budget_scope": BudgetScope,
}
TELL_ORDERS = tuple(TellOrder)


@dataclass(frozen=True)
class TuneConfig:
    kernel: str = "matmul"
    backend: str | None = None  # None: the device's backend
    device: str | None = None  # None: what this machine has (no GPU: cpu)
    dtype: str = "float32"
    # empty: the spec's default size; a text is a size as `--size` takes it (core.size_of)
    sizes: tuple[Mapping[str, int] | str, ...] = ()
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
    encoding: Encoding = Encoding.SUBSET
    illegal: Illegal = Illegal.REPAIR
    sequence: tuple[str, ...] = ()  # fixed sequence: only parameters are tuned
    only: tuple[str, ...] = ()  # search only these transformations (empty: all)
    replay: Path | None = None  # answer evaluations from this recording (ReplayBackend)
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
    step_values: bool = False
    compile_workers: int = 0  # builds at once; 0: 1 for the C backend, else one per core
    build_budget: float = BUILD_BUDGET  # stop builds past this times the median (0: never)
    apply_workers: int = 0  # applications at once; 0: 1 (reference) or --llm-concurrency
    executor: ExecutorChoice = ExecutorChoice.AUTO  # auto: ray with several GPUs or an address
    ray_address: str | None = None
    ray_workers: int = 0  # device actors on Ray; 0: one per GPU (per node for C)
    eval_config: EvalConfig = field(default_factory=EvalConfig)
    # what the LLM budget counts: this run's calls ("run") or, from the journal, the
    # study's calls in every run so far as well ("study")
    budget_scope: BudgetScope = BudgetScope.RUN
    # a new study's first trials: the best `warm_start_top` of these studies (same storage,
    # kernel and backend; another size, dtype or device), e.g. 8192 starting from 4096
    warm_start: tuple[str, ...] = ()
    warm_start_top: int = 10

    def __post_init__(self) -> None:
        """Every choice checked, and held as its enum: UserError naming the option."""
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                option = "--" + name.replace("_", "-")
                raise UserError(f"{option} must be one of {', '.join(allowed)}, "
                                f"not {value!r}")
            if name in _ENUMS:
                object.__setattr__(self, name, _ENUMS[name](value))
