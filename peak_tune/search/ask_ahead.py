"""TPE's asks drawn in a process of its own, a few trials ahead of the driver.

Sampling was most of the driver's work: about 60 ms an ask with the history window full
and the CUDA catalog's ~15 parameter groups, spent between trials (155 of 262 s of a 4096
fp32 study's loop on the H200), holding the interpreter lock the applier thread needs as
well. Drawn ahead, asking took 18 of 246 s of the same study, and a 4096 fp16 study went
from 13.9 to 15.2 trials/s (benchmarks/results, search-15 to -17; fp32's rate is bound by
its NVRTC builds either way).

A sampler process keeps its own in-memory copy of the study and answers each request
with the relative parameters of a new trial (the sequence choice and the values of its
steps, as the driver's sampler would draw them); the driver enqueues them as the trial's
fixed parameters, so its own ask only creates the trial. A value outside them (a
parameter seen for the first time) the driver still samples itself.

The process keeps `depth` draws ready and learns every finished trial as the driver
tells it (the driver's own trials, the polisher's neighbours, other drivers' pulled
trials). The draws handed out and not yet told stay RUNNING in its study, so TPE's
constant liar keeps new points away from them as it does from running trials in the
driver. A draw is made up to `depth` asks before the driver uses it, and the order of
what the process learns depends on when trials finish: used only where trials are told
as they finish, which is not repeatable anyway.

Several processes can draw at once (`processes`, `--sampler-processes`): see AskAhead.
If a process fails, the driver logs it once and samples in its own thread again.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.storages import InMemoryStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState, create_trial

from peak_tune.search.focus import ParamRoles
from peak_tune.search.samplers import make_sampler
from peak_tune.study.piped_child import PipedChild, child_pipes, one_with_a_reply

__all__ = ["ASK_AHEAD", "ASK_AHEAD_MIN_CORES", "MAX_SAMPLER_PROCESSES", "SAMPLER_CORES",
           "AskAhead", "Draw", "sampler_processes_for"]

log = logging.getLogger(__name__)

ASK_AHEAD = 2  # the default depth: a draw ready at every ask, each a little stale
# On 2 cores the process competes with the driver and the study writer for a core: a
# study with an instant device ran 17.7 trials/s drawing ahead, 22.9 drawing in the
# driver (benchmarks/results/2026-11-30-cpu-driver-ahead.json)
ASK_AHEAD_MIN_CORES = 4
# Sampler processes at once, by default one per SAMPLER_CORES cores: the builds (one
# compiler process per core) and the driver keep the rest busy. On the H200's 16 cores
# that is 4 (see AskAhead).
SAMPLER_CORES = 4
MAX_SAMPLER_PROCESSES = 4


def sampler_processes_for(cores: int) -> int:
    return max(1, min(MAX_SAMPLER_PROCESSES, cores // SAMPLER_CORES))


@dataclass(frozen=True)
class Draw:
    """One trial's parameters drawn by a sampler process; `ticket` names the trial in
    every process's study (told back with the result)."""

    ticket: int
    params: dict[str, Any]


@dataclass(frozen=True)
class _Drawn:
    draw: Draw
    owner: int  # the process that drew it
    distributions: dict[str, BaseDistribution]


class AskAhead:
    """The sampler processes of one study: `processes` of them, each `sampler` (a name
    of `make_sampler`) seeded with `seed` plus its index, knowing the parameter `roles`
    (the sequence encoding; pickled), started with the `finished` trials, and keeping
    `depth` draws ready.

    Several processes draw as many trials at once, for a device that finishes trials
    faster than one process draws them (on the H200 a fp16 4096 study told 27 trials a
    second, most of them pruned at once or answered by the cache, and TPE's draws at
    about 36 ms each were the limit: the device was 18% busy). Every process learns
    every finished trial, and each draw handed out is shown to the others as a running
    trial, so their constant liars keep away from it as from their own: Optuna's
    parallel workers sharing one storage, with the storage kept in each process.
    """

    def __init__(self, sampler: str, seed: int | None, roles: ParamRoles | None,
                 directions: Sequence[StudyDirection], finished: Sequence[FrozenTrial],
                 depth: int, processes: int = 1) -> None:
        if depth < 1 or processes < 1:
            raise ValueError("depth and processes must be 1 or more")
        self.depth = depth
        self.processes = processes
        self.failure = ""  # why the processes stopped answering; then draw() gives None
        self._ready: deque[_Drawn] = deque()
        self._counts: deque[tuple[int, int]] = deque()
        self._children = [PipedChild("peak_tune.search.ask_ahead", f"sampler-feed-{i}")
                          for i in range(processes)]
        for index, child in enumerate(self._children):
            child.send("open", (sampler, None if seed is None else seed + index, roles,
                                list(directions), index, processes))
            for trial in finished:
                child.send("told", (None, trial))
            for _ in range(depth):
                child.send("ask")

    def draw(self) -> Draw | None:
        """The next ready draw (waiting for one), and a new one requested in its place;
        None once a process has failed."""
        while not self._ready and not self.failure:
            self._take_reply()
        if self.failure:
            return None
        drawn = self._ready.popleft()
        for index, child in enumerate(self._children):
            if index == drawn.owner:
                child.send("ask")
            else:
                child.send("running", (drawn.draw.ticket, drawn.draw.params,
                                       drawn.distributions))
        return drawn.draw

    def told(self, ticket: int | None, trial: FrozenTrial) -> None:
        """A finished trial of the study: the one drawn as `ticket`, or (None) one the
        processes did not draw."""
        if self.failure or (ticket is None and trial.state == TrialState.FAIL):
            return  # TPE leaves failed trials out; a drawn one must end its liar
        for child in self._children:
            child.send("told", (ticket, trial))

    def counts(self) -> list[tuple[int, int]]:
        """(finished, running) trials in each process's study, once it has taken in all
        sent so far (for checks; [] after a failure)."""
        for child in self._children:
            child.send("count")
        while len(self._counts) < self.processes and not self.failure:
            self._take_reply()
        counts = [self._counts.popleft() for _ in range(len(self._counts))]
        return [] if self.failure else counts

    def finished_count(self) -> int:
        """How many finished trials the processes' studies hold (the fewest of any; -1
        after a failure)."""
        return min((finished for finished, _ in self.counts()), default=-1)

    def close(self) -> None:
        for child in self._children:
            child.close()

    def _take_reply(self) -> None:
        """Wait for a process's next reply and take it in."""
        try:
            child = one_with_a_reply(self._children)
            kind, payload = child.receive()
        except (EOFError, OSError):
            ended = next((c for c in self._children if c.exit_code is not None),
                         self._children[0])
            self._fail(f"could not send it a {ended.send_error}" if ended.send_error
                       else f"it ended (exit code {ended.wait()})")
            return
        if kind == "drawn":
            ticket, params, distributions = payload
            self._ready.append(_Drawn(Draw(ticket, params),
                                      self._children.index(child), distributions))
        elif kind == "count":
            self._counts.append((int(payload[0]), int(payload[1])))
        elif kind == "failed":
            self._fail(str(payload))

    def _fail(self, why: str) -> None:
        self.failure = why
        log.warning("the sampler process stopped (%s); sampling in the driver from now on",
                    why)


def _serve(inbox: Connection, outbox: Connection) -> None:
    """A sampler process: draws on request, the others' draws taken in as running
    trials and finished trials as told, in the order the driver sent them, until the
    driver's end of the pipe goes away. A draw's ticket is its number in this process's
    study times the processes plus this one's index: the same in every process."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _, (name, seed, roles, directions, index, processes) = inbox.recv()
    storage = InMemoryStorage()
    study = optuna.create_study(storage=storage, directions=directions,
                                sampler=make_sampler(name, seed, roles))
    drawn: dict[int, optuna.Trial] = {}  # ticket -> a trial running here, not yet told
    while True:
        try:
            kind, payload = inbox.recv()
        except EOFError:
            return
        try:
            if kind == "told":
                _take_in(study, storage, drawn, *payload)
            elif kind == "ask":
                trial = study.ask()
                params = dict(trial.relative_params)
                space = trial.relative_search_space or {}
                ticket = trial.number * processes + index
                drawn[ticket] = trial
                outbox.send(("drawn", (ticket, params, {n: space[n] for n in params})))
            elif kind == "running":
                ticket, params, distributions = payload
                running = create_trial(state=TrialState.RUNNING, params=params,
                                       distributions=distributions)
                trial_id = storage.create_new_trial(study._study_id, template_trial=running)
                drawn[ticket] = optuna.Trial(study, trial_id)
            elif kind == "count":
                states = [t.state for t in study.get_trials(deepcopy=False)]
                outbox.send(("count", (sum(s.is_finished() for s in states),
                                       states.count(TrialState.RUNNING))))
        except OSError:  # the driver closed its end while a draw was on its way: done
            return
        except Exception as error:  # reported; the driver samples on its own from then on
            with contextlib.suppress(OSError):
                outbox.send(("failed", f"{type(error).__name__}: {error}"[:500]))
            return


def _take_in(study: optuna.Study, storage: InMemoryStorage, drawn: dict[int, optuna.Trial],
             ticket: int | None, told: FrozenTrial) -> None:
    """Finish the trial drawn as `ticket` (here or by another process) as `told`
    finished in the driver (its parameters are the driver's: the draw's and any it
    sampled itself), or add `told` as it is."""
    trial = drawn.pop(ticket, None) if ticket is not None else None
    if trial is None:
        study.add_trial(told)
        return
    for name, distribution in told.distributions.items():
        storage.set_trial_param(trial._trial_id, name,
                                distribution.to_internal_repr(told.params[name]), distribution)
    for step, value in told.intermediate_values.items():
        storage.set_trial_intermediate_value(trial._trial_id, step, value)
    if told.state == TrialState.COMPLETE:
        study.tell(trial, told.values)
    else:
        study.tell(trial, state=told.state)


if __name__ == "__main__":  # python -m peak_tune.search.ask_ahead IN OUT
    _serve(*child_pipes(sys.argv))
