"""Chat calls through the openai client: retries with exponential backoff on 429, 5xx,
timeouts and lost connections (a 429's Retry-After is honoured; the client's own retries
are off so every attempt is recorded), a per-call timeout, caps on requests in flight
and per minute, token and cost accounting, and token and cost budgets."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from peak_tune.errors import UserError

from .config import LLMConfig, redact_url
from .errors import BudgetExhausted, EndpointError
from .limits import RequestGate
from .prices import Price, price_for

if TYPE_CHECKING:
    from openai import OpenAI

__all__ = ["CallRecord", "ChatSession", "Usage", "Where", "make_client"]

log = logging.getLogger(__name__)

_MAX_BACKOFF_S = 60.0
_REFUSED_ATTEMPTS = 2  # a refused connection before any answer: tried this often


@dataclass(frozen=True)
class CallRecord:
    """One HTTP attempt of one chat call.

    `turn` is 0 for a pass's first request and n for its n-th repair; `attempt` counts
    from 1 over the retries of that request. `outcome` is "ok", a transport class
    ("rate_limited", "server_error", "timeout", "connection", "refused") or, set after
    the reply is read, a reply class ("no_code", "scope", "missing_param", "bad_launch",
    "compile_error", "wrong_result"). `sample` is the application's sample index;
    `cost_usd` is None when the model has no price; `study` is set when journaled.
    """

    transform_id: str
    pass_index: int
    region: str
    turn: int
    attempt: int
    outcome: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    message: str = ""
    model: str = ""
    parent: str = ""  # the parent variant's hash (16 hex): one application per parent
    position: int = -1  # steps applied before this one in the sequence
    sample: int = 0
    cost_usd: float | None = None
    study: str = ""


@dataclass(frozen=True)
class Usage:
    """Calls, tokens and dollars (None: the model has no price) spent on one
    transformation."""

    calls: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None = 0.0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def make_client(config: LLMConfig) -> OpenAI:
    """An openai client for the config's endpoint, the key read from the environment now."""
    from openai import OpenAI

    return OpenAI(base_url=config.base_url, api_key=config.api_key(),
                  timeout=config.timeout_s, max_retries=0)


@dataclass(frozen=True)
class Where:
    """Which pass of which transformation a call serves (for the records)."""

    transform_id: str
    pass_index: int
    region: str
    turn: int
    parent: str = ""
    position: int = -1
    sample: int = 0


class ChatSession:
    """Sends chat requests for one applier and keeps the records of every attempt.

    UserError at once when a cost budget is set and the model has no price."""

    def __init__(self, config: LLMConfig, client: Callable[[], OpenAI],
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._config = config
        self._client = client
        self._sleep = sleep
        self._lock = threading.Lock()
        self._gate = RequestGate(config.concurrency, config.requests_per_minute, sleep)
        self.price: Price | None = price_for(config.model, config.prices_file)
        if config.max_cost_usd and self.price is None:
            raise UserError(f"--max-cost needs the price of model {config.model!r}, which "
                            "the price table lacks: give one with --llm-prices FILE")
        self.records: list[CallRecord] = []
        self._earlier = Usage(0, 0, 0, 0.0)  # what the budget counts besides this run
        # requests sent and not answered yet: call id -> (where, attempt, sent at)
        self._in_flight: dict[int, tuple[Where, int, float]] = {}
        self._calls = 0
        self._answered = False  # the endpoint has answered a request of this run

    def count_earlier(self, earlier: Usage) -> None:
        """Let the budget count `earlier` calls too (a study's earlier runs)."""
        self._earlier = earlier

    def tokens_used(self) -> int:
        with self._lock:
            return sum(r.prompt_tokens + r.completion_tokens for r in self.records)

    def cost_used(self) -> float | None:
        """Dollars spent so far; None when the model has no price."""
        if self.price is None:
            return None
        with self._lock:
            return sum(r.cost_usd or 0.0 for r in self.records)

    def budget_left(self) -> bool:
        """False once the token or cost budget is spent."""
        return not self.budget_spent()

    def budget_spent(self) -> str:
        """Which budget is spent and by how much, or "" while both last."""
        try:
            self._check_budget()
        except BudgetExhausted as exc:
            return str(exc)
        return ""

    def mark(self, index: int, outcome: str, message: str) -> None:
        """Set the outcome of record `index` once its reply has been judged."""
        with self._lock:
            self.records[index] = replace(self.records[index], outcome=outcome,
                                          message=message[:200])

    def complete(self, messages: list[dict[str, str]], where: Where) -> tuple[str, int, bool]:
        """The reply's text, the index of its record and whether the endpoint cut it off
        at its token limit (finish_reason "length"); EndpointError when every attempt
        failed, the endpoint refused, or the token budget is spent."""
        self._check_budget()
        attempts = self._config.max_retries + 1
        for attempt in range(1, attempts + 1):
            started = time.monotonic()
            with self._lock:
                self._calls += 1
                call = self._calls
                self._in_flight[call] = (where, attempt, started)
            try:
                response = self._send(messages)
            except Exception as exc:
                if not self._landed(call):
                    raise EndpointError("the study stopped before the endpoint "
                                        "answered") from exc
                outcome, retry = _classify(exc)
                message = f"{type(exc).__name__}: {_one_line(exc)}"
                self._record(where, attempt, outcome, None, time.monotonic() - started, message)
                at = redact_url(self._config.base_url)
                if not retry:
                    raise EndpointError(f"the endpoint {at} refused the request "
                                        f"({message})") from exc
                if attempt == attempts:
                    raise EndpointError(f"the endpoint {at} failed {attempts} time(s); "
                                        f"last: {message}") from exc
                if attempt >= _REFUSED_ATTEMPTS and not self._answered and _refused(exc):
                    # nothing listens there (a wrong URL, a server not started): say so
                    # now rather than after the whole backoff meant for a busy server
                    raise EndpointError(f"cannot connect to the endpoint {at}: connection "
                                        f"refused {attempt} times (is the server running "
                                        f"and the URL right?)") from exc
                delay = min(max(self._config.backoff_s * 2 ** (attempt - 1),
                                _retry_after_s(exc)), _MAX_BACKOFF_S)
                log.info("%s pass %d: %s; retry %d in %.1f s", where.transform_id,
                         where.pass_index + 1, outcome, attempt, delay)
                self._sleep(delay)
                continue
            if not self._landed(call):  # journaled as interrupted when the study stopped
                raise EndpointError("the study stopped before the endpoint answered")
            self._answered = True
            index = self._record(where, attempt, "ok", getattr(response, "usage", None),
                                 time.monotonic() - started, "")
            return _reply_text(response), index, _finish_reason(response) == "length"
        raise AssertionError("unreachable")  # pragma: no cover

    def _landed(self, call: int) -> bool:
        """The reply to `call` is in: False when the call was given up meanwhile."""
        with self._lock:
            return self._in_flight.pop(call, None) is not None

    def abandon_in_flight(self) -> int:
        """Record every request still waiting for its reply as "interrupted" (the study
        stopped: the endpoint may bill it all the same); how many there were. A reply
        that arrives later is not recorded again."""
        with self._lock:
            waiting, self._in_flight = list(self._in_flight.values()), {}
        for where, attempt, started in waiting:
            self._record(where, attempt, "interrupted", None, time.monotonic() - started,
                         "the study stopped before the endpoint answered")
        return len(waiting)

    def _send(self, messages: list[dict[str, str]]) -> Any:
        client = self._client()
        with self._gate.slot():
            return client.chat.completions.create(
                model=self._config.model, messages=messages,  # type: ignore[arg-type]
                temperature=self._config.temperature, timeout=self._config.timeout_s,
            )

    def _record(self, where: Where, attempt: int, outcome: str, usage: Any,
                latency_s: float, message: str) -> int:
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion = int(getattr(usage, "completion_tokens", 0) or 0)
        cost = self.price.cost_usd(prompt, completion) if self.price else None
        record = CallRecord(where.transform_id, where.pass_index, where.region, where.turn,
                            attempt, outcome, prompt, completion, latency_s, message[:200],
                            self._config.model, where.parent, where.position, where.sample,
                            cost)
        log.debug("%s pass %d turn %d attempt %d: %s (%d + %d tokens, %.2f s)",
                  where.transform_id, where.pass_index + 1, where.turn, attempt, outcome,
                  prompt, completion, latency_s)
        with self._lock:
            self.records.append(record)
            return len(self.records) - 1

    def _check_budget(self) -> None:
        earlier = self._earlier  # shown only where there were earlier calls
        budget = self._config.max_tokens_total
        used = self.tokens_used() + earlier.total_tokens
        if budget and used >= budget:
            note = f" ({earlier.total_tokens} in earlier runs)" if earlier.calls else ""
            raise BudgetExhausted(f"token budget of {budget} exhausted: {used} tokens "
                                  f"used{note}")
        dollars = self._config.max_cost_usd
        spent = self.cost_used()
        if dollars and spent is not None and earlier.cost_usd is not None:
            spent += earlier.cost_usd
            if spent >= dollars:
                note = f" (${earlier.cost_usd:.4f} in earlier runs)" if earlier.calls else ""
                raise BudgetExhausted(f"cost budget of ${dollars:g} exhausted: "
                                      f"${spent:.4f} spent{note}")


def _refused(exc: BaseException) -> bool:
    """The connection was refused (nothing listens at the address), anywhere in the
    exception's chain of causes."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError) or "connection refused" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _classify(exc: Exception) -> tuple[str, bool]:
    """(outcome class, whether to retry) for an exception from the openai client."""
    import openai

    if isinstance(exc, openai.APITimeoutError):  # a subclass of APIConnectionError
        return "timeout", True
    if isinstance(exc, openai.APIConnectionError):
        return "connection", True
    if isinstance(exc, openai.RateLimitError):
        return "rate_limited", True
    if isinstance(exc, openai.InternalServerError):
        return "server_error", True
    if isinstance(exc, openai.APIStatusError):
        return ("server_error", True) if exc.status_code >= 500 else ("refused", False)
    if isinstance(exc, openai.APIError):  # a malformed response body
        return "bad_response", False
    raise exc


def _retry_after_s(exc: Exception) -> float:
    """The seconds a 429 or 503 asks to wait (Retry-After), else 0."""
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    try:
        return max(0.0, float(headers.get("retry-after", 0) or 0))
    except ValueError:  # an HTTP date: fall back to the backoff
        return 0.0


def _reply_text(response: Any) -> str:
    try:
        content = response.choices[0].message.content
    except (AttributeError, IndexError, TypeError) as exc:
        raise EndpointError("the endpoint's response has no choices[0].message") from exc
    return content if isinstance(content, str) else ""


def _finish_reason(response: Any) -> str:
    try:
        return str(response.choices[0].finish_reason or "")
    except (AttributeError, IndexError, TypeError):
        return ""


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:160]
