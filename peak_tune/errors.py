"""Typed errors. Backends and appliers raise these; one runner maps them to Status.

`UserError` and its subclasses are problems a user can fix (bad input, missing tools):
the CLI prints their message on one line and exits with status 2. `EnvironmentFault` is
the machine failing under the run (disk full, host out of memory, a killed compiler): it
is no variant's result, so nothing caches it; the run stops with one line and status 1.
"""

from __future__ import annotations

import errno
import sqlite3

__all__ = [
    "COMPILER_KILLED",
    "DISK_FULL",
    "FILE_SIZE_LIMIT",
    "OUT_OF_MEMORY",
    "ApplyError",
    "BackendUnavailable",
    "BudgetReached",
    "BuildOverBudget",
    "CatalogError",
    "CompileError",
    "EndpointUnavailable",
    "EnvironmentFault",
    "EvaluationError",
    "ExpressionError",
    "InvalidPoint",
    "KernelCrash",
    "KernelTimeout",
    "NoVendorLibrary",
    "StorageFailed",
    "UserError",
    "WrongResult",
    "environment_fault",
]

# What an EnvironmentFault says first: the kind of fault, in plain words.
DISK_FULL = "disk full"
FILE_SIZE_LIMIT = "file size limit reached"
OUT_OF_MEMORY = "out of host memory"
COMPILER_KILLED = "compiler killed"

_KIND_OF_ERRNO = {errno.ENOSPC: DISK_FULL, errno.EDQUOT: DISK_FULL,
                  errno.EFBIG: FILE_SIZE_LIMIT, errno.ENOMEM: OUT_OF_MEMORY}
_KIND_OF_SQLITE = {sqlite3.SQLITE_FULL: DISK_FULL, sqlite3.SQLITE_NOMEM: OUT_OF_MEMORY}
_KIND_OF_SQLSTATE = {"53100": DISK_FULL, "53200": OUT_OF_MEMORY}  # PostgreSQL


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


class StorageFailed(UserError):
    """Writing to the study storage failed (not for want of space or memory, which is an
    EnvironmentFault): the run stops; trials stored before are kept."""


class EnvironmentFault(Exception):
    """The machine failed under the run, not the kernel and not the user's input: the disk
    is full, the host is out of memory, a compiler was killed from outside. Never turned
    into a variant's Outcome and never cached; the run stops with this one line."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind  # DISK_FULL, OUT_OF_MEMORY, ...
        self.message = message  # what was being done, and what the system said
        super().__init__(f"{kind}: {message}")


def environment_fault(error: BaseException, doing: str) -> EnvironmentFault | None:
    """`error`, met while `doing` something ("writing the cache entry X"), as an
    EnvironmentFault when the machine is at fault (an OSError's errno, a MemoryError, a
    SQLite or PostgreSQL error code, also where a database layer wrapped it); else None
    (raise `error` itself)."""
    found = _fault_in(error)
    if found is None:
        return None
    kind, culprit = found
    reason = getattr(culprit, "strerror", None) or " ".join(str(culprit).split()) or kind
    return EnvironmentFault(kind, f"{doing}: {reason}")


def _fault_in(error: BaseException) -> tuple[str, BaseException] | None:
    """(kind, the error that says so) along `error`'s causes, or None."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        kind = _own_kind(current)
        if kind is not None:
            return kind, current
        todo += [current.__cause__, getattr(current, "orig", None)]  # what it wraps
    return None


def _own_kind(error: BaseException) -> str | None:
    if isinstance(error, MemoryError):
        return OUT_OF_MEMORY
    if isinstance(error, OSError) and error.errno in _KIND_OF_ERRNO:
        return _KIND_OF_ERRNO[error.errno]
    if isinstance(error, sqlite3.Error):
        code = getattr(error, "sqlite_errorcode", None)
        return _KIND_OF_SQLITE.get(code & 0xFF) if isinstance(code, int) else None
    sqlstate = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
    return _KIND_OF_SQLSTATE.get(sqlstate) if isinstance(sqlstate, str) else None


class BackendUnavailable(UserError):
    """The backend's toolchain or device is missing on this machine."""


class NoVendorLibrary(BackendUnavailable):
    """The device has no vendor library to time (an Adreno GPU, lavapipe): the study's
    ratio is to the device's documented peak instead."""


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

    signal_number = 0  # the signal that ended the process, where one did


class KernelTimeout(EvaluationError):
    pass


class WrongResult(EvaluationError):
    """Output differs from the reference, inputs were changed, or guard bytes were hit."""
