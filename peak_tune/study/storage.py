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
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from peak_tune.errors import UserError, environment_fault

__all__ = ["check_sqlite_file", "driver_url", "open_storage", "redacted_url",
           "results_storage_url", "sqlite_file"]

SQLITE_BUSY_WAIT_S = 60  # how long a SQLite writer waits for another one's lock
_SCHEMA_RACE_TRIES = 8
_SQLITE_HEADER = b"SQLite format 3\x00"  # how every SQLite database file begins
_NEW_FILE_WAIT_S = 5.0  # a 0-byte database this new may be one another process creates


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
    """An RDB storage for `url`, created if new, safe against concurrent creators.

    A URL that is none, of an unknown kind of database, or a SQLite file that is not a
    database (0 bytes, or another file) is a UserError naming it; the file is left as it
    was. A disk or memory too full to create the database is an EnvironmentFault."""
    database = sqlite_file(url)
    if database is not None:
        check_sqlite_file(database)
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
                fault = environment_fault(error, f"creating the study storage "
                                                 f"{redacted_url(url)}")
                if fault is not None:
                    raise fault from error
                reason = " ".join(str(error.orig).split())  # one line (psycopg adds hints)
                raise UserError(f"cannot open the study storage {redacted_url(url)}: "
                                f"{reason}") from error
            time.sleep(0.2 * (attempt + 1))
        except ImportError as error:  # e.g. postgresql:// without the postgres extra
            raise UserError(f"cannot open the study storage {redacted_url(url)}: {error} "
                            "(pip install 'peak-tune[postgres]')") from error
    raise AssertionError("unreachable")


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (None for another database or an in-memory one); a URL
    that names no database SQLAlchemy knows is a UserError."""
    try:
        parsed = make_url(driver_url(url))
        parsed.get_dialect()
    except ImportError:  # the dialect's own module: opening the storage says what to install
        return None
    except NoSuchModuleError:
        raise UserError(f"the study storage {redacted_url(url)!r} names an unknown kind of "
                        f"database {url.split(':', 1)[0]!r} (use sqlite:///FILE or "
                        "postgresql://USER@HOST/DB)") from None
    except ArgumentError:
        raise UserError(f"the study storage {redacted_url(url)!r} is not a database URL "
                        "(use sqlite:///FILE or postgresql://USER@HOST/DB)") from None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    if parsed.query.get("uri") or parsed.database.startswith("file:"):
        return None  # a SQLite URI: SQLite reads it
    return Path(parsed.database)


def check_sqlite_file(path: Path) -> None:
    """UserError unless `path` is missing (a new database) or a SQLite database. SQLite
    itself takes a 0-byte file for a new database, and the studies once in it would be
    gone without a word; another file it refuses only when first read."""
    if path.is_dir():
        raise UserError(f"the study database {path} is a folder, not a database file")
    header = _header(path)
    deadline = time.monotonic() + _NEW_FILE_WAIT_S
    while header == b"" and _just_made(path) and time.monotonic() < deadline:
        time.sleep(0.1)  # another process may be creating it right now: its schema comes
        header = _header(path)
    if header is None or header == _SQLITE_HEADER:
        return
    what = "is empty (0 bytes)" if header == b"" else "is not a SQLite database"
    raise UserError(f"the study database {path} {what}: it holds no study; move it away "
                    "if it should not be there, or give another --results or --storage")


def _header(path: Path) -> bytes | None:
    """The first bytes of `path` (b"" if it is empty), or None if there is no such file."""
    try:
        with path.open("rb") as handle:
            return handle.read(len(_SQLITE_HEADER))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UserError(f"cannot read the study database {path}: {exc.strerror}") from exc


def _just_made(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime < _NEW_FILE_WAIT_S
    except OSError:
        return False


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

