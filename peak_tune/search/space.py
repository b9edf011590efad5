"""How an Optuna trial encodes a transformation sequence and its tuning values.

Optuna needs the same choices under a parameter name in every trial, so sequences are
encoded in one of two ways (`--encoding`):

- `subset` (default): for every transformation a boolean `use.<id>` and, when used, a
  position `pos.<id>` in [0, 1]; the sequence is the used ones sorted by position.
  Each choice keeps its meaning across trials, which TPE learns quickly.
- `steps`: `step.0`, `step.1`, ... each drawn from one fixed list (`end` + every id).

An illegal pick (a requirement missing or after, a conflict, a repeat) is either
repaired (`--illegal repair`: steps are reordered after their requirements, and steps
that still cannot apply are dropped) or the trial is pruned (`--illegal prune`).
Tuning values are drawn as `<transformation id>.<MACRO>` over the declared values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import optuna

from peak_tune.catalog.sequences import check_sequence
from peak_tune.catalog.types import Transformation
from peak_tune.core import KernelContext, ParamDomain

__all__ = [
    "FixedEncoding",
    "SequenceEncoding",
    "StepsEncoding",
    "SubsetEncoding",
    "branch_sequences",
    "branch_trial_params",
    "param_key",
    "repair_sequence",
    "suggest_params",
]

END = "end"


class SequenceEncoding(Protocol):
    def suggest(self, trial: optuna.Trial) -> list[str]:
        """The sequence for this trial; raises InvalidPoint when it must be pruned."""
        ...

    def chooses_sequence(self, name: str) -> bool:
        """`name` is one of the parameters that choose the sequence."""
        ...

    def in_use(self, choices: Mapping[str, Any], name: str) -> bool:
        """Whether a trial whose sequence parameters are `choices` may suggest `name`
        (a position or tuning value of a chosen step, or of no step at all)."""
        ...


def repair_sequence(
    sequence: Sequence[str], transformations: Mapping[str, Transformation]
) -> list[str]:
    """Make a sequence legal with the fewest changes: drop repeats, move each step after
    the requirements that appear later, drop steps whose requirements are absent or that
    conflict with an earlier step."""
    wanted: list[str] = []
    for tid in sequence:
        if tid not in wanted:
            wanted.append(tid)
    placed: list[str] = []
    pending = list(wanted)
    progress = True
    while pending and progress:
        progress = False
        for tid in list(pending):
            t = transformations[tid]
            if any(r not in wanted for r in t.requires) or any(c in placed for c in t.conflicts):
                pending.remove(tid)
                wanted.remove(tid)
                progress = True
                break
            if all(r in placed for r in t.requires):
                placed.append(tid)
                pending.remove(tid)
                progress = True
                break
    return placed


class _Checked:
    def __init__(self, transformations: Mapping[str, Transformation], repair: bool) -> None:
        self.transformations = dict(transformations)
        self.ids = sorted(self.transformations)
        self.repair = repair

    def _finish(self, sequence: list[str]) -> list[str]:
        if self.repair:
            return repair_sequence(sequence, self.transformations)
        check_sequence(sequence, self.transformations)
        return sequence

    def _owner(self, name: str) -> str | None:
        """The transformation a position (`pos.<id>`) or value (`<id>.<MACRO>`) is of."""
        prefix, _, rest = name.partition(".")
        owner = rest if prefix == "pos" else prefix
        return owner if owner in self.transformations else None


class SubsetEncoding(_Checked):
    def suggest(self, trial: optuna.Trial) -> list[str]:
        chosen: list[tuple[float, str]] = []
        for tid in self.ids:
            if trial.suggest_categorical(f"use.{tid}", [False, True]):
                chosen.append((trial.suggest_float(f"pos.{tid}", 0.0, 1.0), tid))
        return self._finish([tid for _, tid in sorted(chosen)])

    def chooses_sequence(self, name: str) -> bool:
        return name.startswith("use.")

    def in_use(self, choices: Mapping[str, Any], name: str) -> bool:
        owner = self._owner(name)
        return owner is None or bool(choices.get(f"use.{owner}", True))


class StepsEncoding(_Checked):
    def __init__(
        self, transformations: Mapping[str, Transformation], repair: bool, max_steps: int
    ) -> None:
        super().__init__(transformations, repair)
        self.max_steps = max_steps

    def suggest(self, trial: optuna.Trial) -> list[str]:
        sequence: list[str] = []
        for index in range(self.max_steps):
            pick = trial.suggest_categorical(f"step.{index}", [END, *self.ids])
            if pick == END:
                break
            if self.repair and pick in sequence:
                continue
            sequence.append(str(pick))
        return self._finish(sequence)

    def chooses_sequence(self, name: str) -> bool:
        return name.startswith("step.")

    def in_use(self, choices: Mapping[str, Any], name: str) -> bool:
        picked = {v for k, v in choices.items() if k.startswith("step.")}
        owner = self._owner(name)
        return owner is None or not picked or owner in picked


class FixedEncoding:
    """One given sequence (e.g. a paper's hand-picked one): only parameters are tuned."""

    def __init__(
        self, sequence: Sequence[str], transformations: Mapping[str, Transformation]
    ) -> None:
        check_sequence(sequence, transformations)
        self.sequence = list(sequence)

    def suggest(self, trial: optuna.Trial) -> list[str]:
        return list(self.sequence)

    def chooses_sequence(self, name: str) -> bool:
        return False  # nothing to choose: every value is of the fixed sequence

    def in_use(self, choices: Mapping[str, Any], name: str) -> bool:
        return True




def param_key(domain: ParamDomain) -> str:
    """The Optuna name of a tuning value: `<id of the step that introduced it>.<MACRO>`."""
    return f"{domain.introduced_by or 'seed'}.{domain.name}"


def suggest_params(trial: optuna.Trial, context: KernelContext) -> dict[str, int]:
    """Values for every tuning parameter of the variant, named by who introduced it."""
    return {domain.name: int(trial.suggest_categorical(param_key(domain), list(domain.values)))
            for domain in context.params}


def branch_sequences(transformations: Mapping[str, Transformation]) -> list[list[str]]:
    """The first trials of a new study: legal sequences that cover every branch of the
    catalog's conflict graph.

    Transformations that exclude each other (SIMT thread tiles vs tensor cores, register
    staging vs cp.async stages) split the catalog into branches. A branch that needs
    several steps before it pays off is rarely drawn at random, so a study starts with
    trials in dependency order (ties by id): each branch with every step that can join
    it without a conflict, and each step that declares conflicts alone (with what it
    requires), since the extras that fill a branch can also slow it down.
    """
    order = _dependency_order(transformations)
    roots = sorted({tid for tid, t in transformations.items() if t.conflicts}
                   | {c for t in transformations.values() for c in t.conflicts
                      if c in transformations})
    found: list[list[str]] = []
    for root in roots:
        alone = _with_requirements(root, transformations)
        chosen = set(alone)
        for tid in order:
            wanted = _with_requirements(tid, transformations)
            if not _conflicting(wanted | chosen, transformations):
                chosen |= wanted
        declares = bool(transformations[root].conflicts)
        for members in ((alone, chosen) if declares else (chosen,)):
            sequence = [tid for tid in order if tid in members]
            if sequence not in found:
                found.append(sequence)
    return found


def _dependency_order(transformations: Mapping[str, Transformation]) -> list[str]:
    placed: list[str] = []
    pending = sorted(transformations)
    while pending:
        ready = [tid for tid in pending
                 if all(r in placed or r not in transformations
                        for r in transformations[tid].requires)]
        if not ready:  # a requirement cycle: the catalog loader reports it elsewhere
            return placed + pending
        placed.append(ready[0])
        pending.remove(ready[0])
    return placed


def _with_requirements(tid: str, transformations: Mapping[str, Transformation]) -> set[str]:
    wanted, stack = set(), [tid]
    while stack:
        current = stack.pop()
        if current in wanted or current not in transformations:
            continue
        wanted.add(current)
        stack.extend(transformations[current].requires)
    return wanted


def _conflicting(ids: set[str], transformations: Mapping[str, Transformation]) -> bool:
    return any(c in ids for tid in ids for c in transformations[tid].conflicts)


def branch_trial_params(
    sequence: Sequence[str], transformations: Mapping[str, Transformation], encoding: str
) -> dict[str, Any]:
    """The enqueued trial's parameters for `sequence`: its steps in the chosen encoding
    and each transformation's declared default values (undeclared ones are sampled)."""
    params: dict[str, Any]
    if encoding == "steps":
        params = {f"step.{i}": tid for i, tid in enumerate(sequence)}
        params[f"step.{len(sequence)}"] = END
    else:
        params = {f"use.{tid}": tid in sequence for tid in transformations}
        for index, tid in enumerate(sequence):
            params[f"pos.{tid}"] = (index + 0.5) / len(sequence)
    for tid in sequence:
        for name, value in transformations[tid].defaults.items():
            params[f"{tid}.{name}"] = value
    return params
