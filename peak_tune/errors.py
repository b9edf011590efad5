"""Typed errors. Backends and appliers raise these; one runner maps them to Status.

`UserError` and its subclasses are problems a user can fix (bad input, missing tools):
the CLI prints their message on one line and exits with status 2.
"""

from __future__ import annotations

__all__ = [
    "ApplyError",
    "BackendUnavailable",
    "BudgetReached",
    "BuildOverBudget",
    "CatalogError",
    "CompileError",
    "EndpointUnavailable",
    "EvaluationError",
    "ExpressionError",
    "InvalidPoint",
    "KernelCrash",
    "KernelTimeout",
    "UserError",
    "WrongResult",
]


class UserError(Exception):
    """A problem with the user's input or machine; its message is one line."""


class CatalogError(UserError):
    """A catalog file (transformation, seed spec, device profile) is missing or malformed."""

    def __init__(self, path: object, field: str, problem: str) -> None:
        self.path = str(path)
        self.field = field
        self.problem = problem
        where = f"{self.path}: {field}: " if field else f"{self.path}: "
        super().__init__(where + problem)


class ExpressionError(UserError):
    """An expression in a catalog file uses something the safe evaluator does not allow."""


class EndpointUnavailable(UserError):
    """The LLM endpoint failed as a whole (unreachable, refusing, budget spent): the study
    stops with its finished trials kept, and nothing about the transformation is cached."""


class BudgetReached(EndpointUnavailable):
    """A spending limit of the applier (tokens, cost) is reached: no further call starts.
    The CLI ends the run with the summary and exit status 3; the study can be resumed."""


class BackendUnavailable(UserError):
    """The backend's toolchain or device is missing on this machine."""


class InvalidPoint(Exception):
    """A sequence or tuning point that cannot be legal (precondition, resources): pruned."""


class BuildOverBudget(InvalidPoint):
    """A build stopped at the search's build budget (a multiple of the study's median
    build): pruned like an invalid point, but not cached, since the budget belongs to the
    study and the machine, not to the point."""


class ApplyError(Exception):
    """An applier could not carry out a transformation on a context."""


class EvaluationError(Exception):
    """Base of the failures of a variant; carries the tool's log in `detail`."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


class CompileError(EvaluationError):
    pass


class KernelCrash(EvaluationError):
    """The kernel crashed its process (signal, illegal address)."""


class KernelTimeout(EvaluationError):
    pass


class WrongResult(EvaluationError):
    """Output differs from the reference, inputs were changed, or guard bytes were hit."""
