"""Settings of the LLM applier. The API key is read from the environment at use time
and is never a field: it cannot reach a repr, an identity, a cache key or a log."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from peak_tune.errors import UserError

__all__ = ["LLMConfig", "load_llm_settings", "redact_url"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"


@dataclass(frozen=True, repr=False)
class LLMConfig:
    """One OpenAI-compatible chat-completions endpoint and how to use it.

    `max_retries`: extra attempts of one call after 429, 5xx, timeouts or a lost
    connection (backoff `backoff_s`, doubling). `repairs`: follow-up calls that send a
    compile error or a wrong result back to the model, per pass. `max_tokens_total`:
    prompt plus completion tokens all calls may spend (0: no budget); `max_cost_usd`:
    dollars they may spend, priced by the table (prices.py) plus `prices_file` (0: no
    budget; the model must then have a price). `concurrency`: requests in flight at
    once; `requests_per_minute`: request starts per minute (0: no cap).
    """

    model: str
    base_url: str = DEFAULT_BASE_URL
    temperature: float = 0.2
    timeout_s: float = 120.0
    max_retries: int = 4
    repairs: int = 2
    max_tokens_total: int = 0
    backoff_s: float = 1.0
    concurrency: int = 4
    requests_per_minute: float = 0.0
    max_cost_usd: float = 0.0
    prices_file: str = ""  # a TOML price table extending the built-in one
    api_key_env: str = "OPENAI_API_KEY"  # the variable's name, never its value

    def __post_init__(self) -> None:
        if not self.model:
            raise UserError("the LLM applier needs a model name (--model or OPENAI_MODEL)")
        if not self.base_url.startswith(("http://", "https://")):
            raise UserError(f"LLM base URL {redact_url(self.base_url)!r} is not http(s)")
        checks = {
            "temperature": self.temperature >= 0, "timeout_s": self.timeout_s > 0,
            "max_retries": self.max_retries >= 0, "repairs": self.repairs >= 0,
            "max_tokens_total": self.max_tokens_total >= 0, "backoff_s": self.backoff_s >= 0,
            "concurrency": self.concurrency >= 1,
            "requests_per_minute": self.requests_per_minute >= 0,
            "max_cost_usd": self.max_cost_usd >= 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise UserError(f"LLM setting(s) out of range: {', '.join(bad)}")

    @classmethod
    def from_env(
        cls, model: str | None = None, environ: Mapping[str, str] | None = None, **settings: object
    ) -> LLMConfig:
        """Model from the argument or OPENAI_MODEL, base URL from OPENAI_BASE_URL (unless
        given in `settings`); other settings as keyword arguments."""
        env = os.environ if environ is None else environ
        known = {f.name for f in fields(cls)} - {"model"}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise UserError(f"unknown LLM setting(s): {', '.join(unknown)}")
        if "base_url" not in settings and env.get("OPENAI_BASE_URL"):
            settings["base_url"] = env["OPENAI_BASE_URL"]
        return cls(model=model or env.get("OPENAI_MODEL", ""), **settings)  # type: ignore[arg-type]

    def api_key(self) -> str:
        """The key, read now from the environment; UserError if unset."""
        key = os.environ.get(self.api_key_env, "")
        if not key:
            raise UserError(f"{self.api_key_env} is not set (servers that need no key, such "
                            f"as a local vLLM or Ollama, accept any value, e.g. 'none')")
        return key

    def __repr__(self) -> str:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["base_url"] = redact_url(self.base_url)
        return "LLMConfig(" + ", ".join(f"{k}={v!r}" for k, v in values.items()) + ")"


def load_llm_settings(path: Path) -> dict[str, object]:
    """An LLM config file (TOML): LLMConfig fields by name, e.g. one per study:

        model = "gpt-4o-mini"
        base_url = "http://localhost:8000/v1"
        temperature = 0.2
        repairs = 3

    Unknown keys and a key written into the file are errors: keys come from the
    environment (`api_key_env` names the variable)."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise UserError(f"{path}: cannot read the LLM config: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML: {exc}") from exc
    if any("key" in name and name != "api_key_env" for name in data):
        raise UserError(f"{path}: API keys do not go in files; set {LLMConfig.api_key_env} "
                        "(or name another variable with api_key_env)")
    known = {f.name: f.type for f in fields(LLMConfig)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise UserError(f"{path}: unknown LLM setting(s) {', '.join(unknown)} (known: "
                        f"{', '.join(sorted(known))})")
    return dict(data)


def redact_url(url: str) -> str:
    """The URL without user:password and without its query string."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "") if parts.username else parts.netloc
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
