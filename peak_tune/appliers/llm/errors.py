"""Typed failures of the LLM applier. All but EndpointError are ApplyErrors (this
transformation failed, recorded and cached); EndpointError means the endpoint itself
failed, so the study stops (a UserError, never cached)."""

from __future__ import annotations

from peak_tune.errors import ApplyError, BudgetReached, EndpointUnavailable

__all__ = [
    "BadLaunchError",
    "BudgetExhausted",
    "EndpointError",
    "MissingParameterError",
    "NoCodeError",
    "ScopeError",
    "TruncatedError",
    "UncompilableError",
    "WrongResultError",
]


class NoCodeError(ApplyError):
    """The reply held no fenced code block (or more than one)."""


class ScopeError(ApplyError):
    """The reply changed what it must keep: the entry point's signature."""


class MissingParameterError(ApplyError):
    """A tuning parameter the transformation declares never appears in the code."""


class TruncatedError(ApplyError):
    """The endpoint cut the reply off at its token limit (finish_reason "length")."""


class BadLaunchError(ApplyError):
    """A launch pass's reply is not a JSON object of valid launch expressions."""


class UncompilableError(ApplyError):
    """The code still failed the compile check after every repair."""


class EndpointError(EndpointUnavailable):
    """The endpoint is unreachable, refused the request (4xx other than 429), kept
    failing after every retry, or the token budget is spent."""


class WrongResultError(ApplyError):
    """The code compiled but still computed wrong results at the check sizes after
    every repair."""


class BudgetExhausted(EndpointError, BudgetReached):
    """The token or cost budget is spent: no further call starts."""
