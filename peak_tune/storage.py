"""The Optuna storage shared by every study of a results folder (or a cluster).

Several processes open one storage at once: two peak-tune runs, the dashboard, a batch
driver, a test polling the study. Two of them creating a new database race on its schema
("table ... already exists"); SQLite writers also wait on each other. `open_storage`
absorbs both, so that a user never sees either.
"""

from __future__ import annotations

import time
from pathlib import Path

from optuna.storages import BaseStorage, RDBStorage
from sqlalchemy.exc import DBAPIError

from peak_tune.errors import UserError

__all__ = ["driver_url", "open_storage", "redacted_url", "results_storage_url"]

SQLITE_BUSY_WAIT_S = 60  # how long a SQLite writer waits for another one's lock
_SCHEMA_RACE_TRIES = 8


def results_storage_url(results: Path) -> str:
    """The default storage: one SQLite database in the results folder."""
    return f"sqlite:///{(results / 'peak.db').resolve()}"


def driver_url(url: str) -> str:
    """`url` with the PostgreSQL driver that the postgres extra installs (psycopg 3) named,
    so that `postgresql://` works under SQLAlchemy 2.0 (whose default is psycopg2) and 2.1
    alike. Other URLs, and URLs naming a driver, are returned as given."""
    for scheme in ("postgresql://", "postgres://"):
        if url.startswith(scheme):
            return "postgresql+psycopg://" + url[len(scheme):]
    return url


def open_storage(url: str) -> BaseStorage:
    """An RDB storage for `url`, created if new, safe against concurrent creators."""
    engine_kwargs = {"connect_args": {"timeout": SQLITE_BUSY_WAIT_S}} if url.startswith(
        "sqlite") else {"pool_pre_ping": True}
    for attempt in range(_SCHEMA_RACE_TRIES):
        try:
            return RDBStorage(driver_url(url), engine_kwargs=engine_kwargs)
        except DBAPIError as error:
            # Another process is creating the same schema right now: its tables (on
            # PostgreSQL also its enum types) appear under us. Wait for it to finish and
            # open what it made.
            if attempt + 1 == _SCHEMA_RACE_TRIES or not _is_schema_race(error):
                reason = " ".join(str(error.orig).split())  # one line (psycopg adds hints)
                raise UserError(f"cannot open the study storage {redacted_url(url)}: "
                                f"{reason}") from error
            time.sleep(0.2 * (attempt + 1))
        except ImportError as error:  # e.g. postgresql:// without the postgres extra
            raise UserError(f"cannot open the study storage {redacted_url(url)}: {error} "
                            "(pip install 'peak-tune[postgres]')") from error
    raise AssertionError("unreachable")


def _is_schema_race(error: Exception) -> bool:
    text = str(error).lower()
    return any(s in text for s in ("already exists", "duplicate", "unique constraint",
                                   "database is locked"))


def redacted_url(url: str) -> str:
    """The URL without a password, for messages."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    credentials, host = rest.rsplit("@", 1)
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in credentials else url

