"""`peak-tune llm check`: is the endpoint reachable, does it list the model, does a
tiny completion come back? One line per finding; the key is never shown."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from peak_tune.errors import UserError

from .config import LLMConfig, redact_url

if TYPE_CHECKING:
    from openai import OpenAI

__all__ = ["CheckReport", "check_endpoint"]


@dataclass(frozen=True)
class CheckReport:
    """What `check_endpoint` found. `ok` when a completion came back."""

    endpoint: str  # the base URL without credentials
    model: str
    models_ok: bool  # GET /models answered
    model_listed: bool  # ... and listed the configured model
    completion_ok: bool  # a tiny chat completion came back
    latency_s: float
    messages: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.completion_ok


def check_endpoint(config: LLMConfig, client: OpenAI | None = None) -> CheckReport:
    """List the models and round-trip a tiny completion (one attempt each)."""
    from openai import OpenAI

    endpoint = redact_url(config.base_url)
    messages: list[str] = []
    try:
        key = config.api_key()
    except UserError as exc:
        return CheckReport(endpoint, config.model, False, False, False, 0.0, (str(exc),))
    if client is None:
        client = OpenAI(base_url=config.base_url, api_key=key,
                        timeout=min(config.timeout_s, 30.0), max_retries=0)
    models_ok = model_listed = completion_ok = False
    try:
        names = [m.id for m in client.models.list()]
        models_ok = True
        model_listed = config.model in names
        messages.append(f"models: {len(names)} listed" + (
            f", {config.model} among them" if model_listed
            else f", {config.model} not among them ({', '.join(names[:5])}...)"))
    except Exception as exc:
        messages.append(f"models: {_failure(exc, endpoint, key)}")
    started = time.monotonic()
    try:
        response = client.chat.completions.create(
            model=config.model, messages=[{"role": "user", "content": "Reply with: ok"}],
            temperature=0, max_tokens=5)
        text = (response.choices[0].message.content or "").strip()
        completion_ok = True
        messages.append(f"completion: {text[:40]!r} in {time.monotonic() - started:.2f} s")
    except Exception as exc:
        messages.append(f"completion: {_failure(exc, endpoint, key)}")
    return CheckReport(endpoint, config.model, models_ok, model_listed, completion_ok,
                       time.monotonic() - started, tuple(messages))


def _failure(exc: Exception, endpoint: str, key: str) -> str:
    import openai

    if isinstance(exc, openai.APITimeoutError):
        text = f"{endpoint} did not answer in time"
    elif isinstance(exc, openai.APIConnectionError):
        text = f"cannot connect to {endpoint} ({type(exc.__cause__ or exc).__name__})"
    elif isinstance(exc, openai.AuthenticationError):
        text = f"{endpoint} rejected the API key (401)"
    elif isinstance(exc, openai.APIStatusError):
        text = f"{endpoint} answered HTTP {exc.status_code}: {' '.join(str(exc).split())[:120]}"
    else:
        text = f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"
    return text.replace(key, "***") if key else text
