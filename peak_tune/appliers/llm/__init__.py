"""The `llm` applier: carries out a natural transformation with any OpenAI-compatible
chat-completions endpoint (OpenAI, Azure, vLLM, llama.cpp server, Ollama).

One chat call per pass of the transformation; for the C-like backends the "device" and
"macros" regions are the whole source and a "launch" pass returns the launch geometry
as JSON. Replies are read strictly and checked against the step (step_check): one
fenced block, not cut off, the entry point's signature kept, the code changed, every
tuning parameter that must be there present and live. A reply that fails a check, a
compile error found by the optional `compile_check`, or (after the last pass) a wrong
result found by the optional `result_check`, is sent back to the model with what was
wrong; all share `repairs` attempts per pass, and the last failure is raised typed
(.errors). Every HTTP attempt is kept in `records`; `usage()` sums tokens and dollars per
transformation.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from peak_tune.appliers.base import derive_child
from peak_tune.backends import capabilities, first_error
from peak_tune.backends._cuda_launch import DEVICE_NAMES
from peak_tune.catalog.loaders import SHADER_GROUP_NAMES
from peak_tune.catalog.types import DeviceProfile, Pass, Transformation
from peak_tune.core import KernelContext
from peak_tune.errors import ApplyError

from .check import CheckReport, check_endpoint
from .client import CallRecord, ChatSession, Usage, Where, make_client
from .compile_check import backend_compile_check
from .config import LLMConfig
from .errors import (
    BadLaunchError,
    BudgetExhausted,
    EndpointError,
    MissingParameterError,
    NoCodeError,
    ScopeError,
    TruncatedError,
    UncompilableError,
    WrongResultError,
)
from .parse import code_block, parse_launch, require_params, require_signature
from .prompts import (
    PROMPT_VERSION,
    launch_keys,
    pass_messages,
    repair_message,
    step_repair_message,
    wrong_result_message,
)
from .regions import merge_reply
from .result_check import ResultCheck, backend_result_check
from .step_check import DeadParameterError, UnchangedError, dead_parameters, require_change

if TYPE_CHECKING:
    from openai import OpenAI

__all__ = [
    "PROMPT_VERSION",
    "BadLaunchError",
    "BudgetExhausted",
    "CallRecord",
    "CheckReport",
    "CompileCheck",
    "DeadParameterError",
    "EndpointError",
    "LLMApplier",
    "LLMConfig",
    "MissingParameterError",
    "NoCodeError",
    "ResultCheck",
    "ScopeError",
    "TruncatedError",
    "UncompilableError",
    "UnchangedError",
    "Usage",
    "WrongResultError",
    "backend_compile_check",
    "backend_result_check",
    "check_endpoint",
]

log = logging.getLogger(__name__)

CompileCheck = Callable[[KernelContext], "str | None"]
SIZE_SYMBOLS = ("M", "N", "K")
_OUTCOMES = {NoCodeError: "no_code", ScopeError: "scope", BadLaunchError: "bad_launch",
             MissingParameterError: "missing_param", UnchangedError: "unchanged",
             DeadParameterError: "dead_param", TruncatedError: "truncated"}


class LLMApplier:
    """Applier that asks a chat model to follow each pass of a transformation.

    `config`: the endpoint (default: LLMConfig.from_env()). `compile_check`: returns the
    compiler's error text for a candidate child, or None when it compiles.
    `result_check`: returns the validator's mismatch summary for a candidate child that
    computes wrong results, or None. `client`: an openai.OpenAI to use instead of one
    built from the config (tests, custom transports). Safe to use from several threads.
    """

    def __init__(
        self,
        config: LLMConfig | None = None,
        *,
        compile_check: CompileCheck | None = None,
        result_check: ResultCheck | None = None,
        client: OpenAI | None = None,
        size_symbols: tuple[str, ...] = SIZE_SYMBOLS,
        build_notes: str = "",
    ) -> None:
        self.config = config if config is not None else LLMConfig.from_env()
        self._compile_check = compile_check
        self._result_check = result_check
        self._client = client
        self._size_symbols = size_symbols
        self._build_notes = build_notes  # how candidates are built and checked (prompts)
        self._client_lock = threading.Lock()
        self._session = ChatSession(self.config, self._openai)

    @property
    def identity(self) -> str:
        return f"llm/{self.config.model}@t{self.config.temperature}/p{PROMPT_VERSION}"

    @property
    def records(self) -> list[CallRecord]:
        """Every HTTP attempt so far, in order (a copy)."""
        return list(self._session.records)

    @property
    def concurrency(self) -> int:
        return self.config.concurrency

    def usage(self) -> dict[str, Usage]:
        """Calls, tokens and dollars per transformation id (dollars None: no price)."""
        totals: dict[str, Usage] = {}
        for r in self._session.records:
            old = totals.get(r.transform_id, Usage(0, 0, 0))
            cost = None if old.cost_usd is None or r.cost_usd is None else \
                old.cost_usd + r.cost_usd
            totals[r.transform_id] = Usage(old.calls + 1, old.prompt_tokens + r.prompt_tokens,
                                           old.completion_tokens + r.completion_tokens, cost)
        return totals

    def budget_left(self) -> bool:
        """False once the token or cost budget is spent (no further call would start)."""
        return self._session.budget_left()

    def budget_spent(self) -> str:
        """Which budget is spent and by how much, or "" while both last."""
        return self._session.budget_spent()

    def abandon_in_flight(self) -> int:
        """Journal the calls still waiting for a reply as interrupted (a stopped study)."""
        return self._session.abandon_in_flight()

    def count_earlier(self, earlier: Usage) -> None:
        """Let the budget count `earlier` calls too (the study's earlier runs)."""
        self._session.count_earlier(earlier)

    def apply(
        self,
        context: KernelContext,
        transformation: Transformation,
        device: DeviceProfile,
        sample: int = 0,
    ) -> KernelContext:
        """The child after every pass. Samples differ only through the model's sampling
        (temperature); each sample index is its own cache entry in the pipeline."""
        if not transformation.passes:
            raise ApplyError(f"{transformation.id} has no passes")
        source, launch = context.source, dict(context.launch)
        for index, step in enumerate(transformation.passes):
            source, launch = self._run_pass(context, transformation, device,
                                            (index, sample), step, source, launch)
        return derive_child(context, transformation, self.identity, source=source,
                            launch=launch)

    # ------------------------------------------------------------------ passes

    def _run_pass(
        self, parent: KernelContext, transformation: Transformation, device: DeviceProfile,
        at: tuple[int, int], step: Pass, source: str, launch: dict[str, str],
    ) -> tuple[str, dict[str, str]]:
        """(source, launch) after pass `at[0]` of sample `at[1]`, with repairs of replies
        that fail a step check, do not compile or compute wrong results."""
        index, sample = at
        if step.region == "launch" and not capabilities(parent.backend).launch_region:
            raise ApplyError(f"{transformation.id}: the {parent.backend} backend has no "
                             "launch region")
        current = derive_child(parent, transformation, self.identity, source=source,
                               launch=launch)
        messages = pass_messages(current, transformation, step, index, device,
                                 self._size_symbols, self._build_notes)
        last = index == len(transformation.passes) - 1
        problem = ("", "")
        for turn in range(self.config.repairs + 1):
            where = Where(transformation.id, index, step.region, turn,
                          parent=parent.content_hash()[:16], position=len(parent.applied),
                          sample=sample)
            reply, record, truncated = self._session.complete(messages, where)
            try:
                if truncated:
                    raise TruncatedError("the reply was cut off at the endpoint's token "
                                         "limit (finish_reason: length)")
                source, launch = self._read_reply(parent, current, step, reply)
                candidate = derive_child(parent, transformation, self.identity,
                                         source=source, launch=launch)
                if step.region != "launch" or last:
                    _check_step(parent, candidate, transformation, last)
            except ApplyError as exc:  # the reply does not do what the step says
                self._session.mark(record, _outcome(exc), str(exc))
                log.info("%s pass %d: %s, %s", transformation.id, index + 1, _outcome(exc),
                         "repairing" if turn < self.config.repairs else "no repairs left")
                if turn == self.config.repairs:
                    raise _refused(exc, transformation.id, index, turn) from None
                messages = messages + [{"role": "assistant", "content": reply},
                                       step_repair_message(str(exc))]
                continue
            found = self._problem(candidate, last)
            if found is None:
                return source, launch
            problem = found
            self._session.mark(record, problem[0], _recorded(*problem))
            log.info("%s pass %d: %s, %s", transformation.id, index + 1, problem[0],
                     "repairing" if turn < self.config.repairs else "no repairs left")
            follow_up = (repair_message(problem[1]) if problem[0] == "compile_error"
                         else wrong_result_message(problem[1]))
            messages = messages + [{"role": "assistant", "content": reply}, follow_up]
        raise _exhausted(transformation.id, index, self.config.repairs, *problem)

    def _problem(self, candidate: KernelContext, last: bool) -> tuple[str, str] | None:
        """("compile_error", log) or ("wrong_result", summary) for a candidate, or None.
        Results are checked after the last pass only: earlier passes may leave the
        kernel and its launch out of step."""
        error = self._compile_check(candidate) if self._compile_check else None
        if error is not None:
            return "compile_error", error
        if last and self._result_check is not None:
            summary = self._result_check(candidate)
            if summary is not None:
                return "wrong_result", summary
        return None

    def _read_reply(self, parent: KernelContext, current: KernelContext, step: Pass,
                    reply: str) -> tuple[str, dict[str, str]]:
        if step.region == "launch":
            names = set(self._size_symbols) | {p.name for p in current.params}
            keys, required = launch_keys(current.backend)
            if current.backend == "hlsl":
                names |= SHADER_GROUP_NAMES  # the shader's numthreads
            else:
                names |= set(DEVICE_NAMES)  # the running device's (SMS), as the worker's
            return current.source, parse_launch(reply, names, keys, required)
        source = merge_reply(current.source, step.region, code_block(reply))
        require_signature(parent.source, source, parent.entry)
        return source, dict(current.launch)

    def _openai(self) -> OpenAI:
        with self._client_lock:
            if self._client is None:
                self._client = make_client(self.config)
            return self._client


def _check_step(parent: KernelContext, candidate: KernelContext,
                transformation: Transformation, last: bool) -> None:
    """After the last pass the step changed the kernel or its launch; after every pass
    each tuning parameter that must be there (the earlier steps'; after the last pass,
    this step's too) is present and live (one the launch uses counts as live there).
    Typed ApplyErrors (see step_check)."""
    if last:
        require_change(parent, candidate, transformation.id)
    names = [p.name for p in (candidate.params if last else parent.params)]
    require_params(candidate.source, tuple(names))
    launched = {n for n in names
                if any(re.search(rf"\b{re.escape(n)}\b", v) for v in candidate.launch.values())}
    dead = dead_parameters(candidate, [n for n in names if n not in launched])
    if dead:
        raise DeadParameterError(
            f"tuning parameter(s) {', '.join(dead)} no longer change the code (the kernel "
            "is the same at two of their allowed values): each must stay a macro set "
            "from outside, guarded by #ifndef / #error, and used where its step uses it, "
            "never #define'd to a fixed value or dropped")


def _refused(exc: ApplyError, tid: str, index: int, repairs: int) -> ApplyError:
    """`exc` (its own type) named with the step and the repairs it had."""
    after = f" (after {repairs} repair(s))" if repairs else ""
    return type(exc)(f"{tid} pass {index + 1}: {exc}{after}")


def _outcome(exc: ApplyError) -> str:
    return next((name for cls, name in _OUTCOMES.items() if isinstance(exc, cls)), "error")


def _exhausted(tid: str, index: int, repairs: int, outcome: str, text: str) -> ApplyError:
    if outcome == "wrong_result":
        return WrongResultError(f"{tid} pass {index + 1}: still computes wrong results after "
                                f"{repairs} repair(s): {_first_line(text)}")
    return UncompilableError(f"{tid} pass {index + 1}: still fails to compile after "
                             f"{repairs} repair(s): {_recorded(outcome, text)}")


def _recorded(outcome: str, text: str) -> str:
    """What the journal keeps of a problem: a compile log's first error line (not the
    command that starts it), else the first line."""
    return first_error(text, 1)[:200] if outcome == "compile_error" else _first_line(text)


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:200] if (text or "").strip() else ""
