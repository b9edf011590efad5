"""A throwaway PostgreSQL server for the tests marked `postgres`.

`initdb` makes a cluster in a temporary folder, `pg_ctl` starts it on a free port of
127.0.0.1 (its unix socket in the same folder), and each test gets a database of its own.
PostgreSQL refuses to run as root, so as root the server runs as the `postgres` user (the
Debian package makes it) or else `nobody`. Tests skip, with the reason, where the server
binaries or psycopg are missing.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["PostgresServer", "postgres_server", "postgres_url"]

_SUPERUSER = "peak"


def _binaries() -> tuple[str, str] | None:
    """initdb and pg_ctl: on PATH, else Debian's /usr/lib/postgresql/<version>/bin."""
    found = shutil.which("initdb"), shutil.which("pg_ctl")
    if all(found):
        return found[0] or "", found[1] or ""
    folders = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                     key=lambda f: int(Path(f).parent.name) if Path(f).parent.name.isdigit()
                     else 0)
    for folder in reversed(folders):
        initdb, pg_ctl = Path(folder, "initdb"), Path(folder, "pg_ctl")
        if initdb.is_file() and pg_ctl.is_file():
            return str(initdb), str(pg_ctl)
    return None


def _server_user() -> pwd.struct_passwd | None:
    """Who runs the server: this user, or as root an unprivileged one."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    pytest.skip("running as root and neither a 'postgres' nor a 'nobody' user exists to "
                "run PostgreSQL as")
    raise AssertionError("unreachable")


def _open_to_all(folder: str) -> bool:
    """Whether every user may pass through `folder` and each folder above it."""
    path = Path(folder).resolve()
    return all(os.stat(p).st_mode & 0o001 for p in (path, *path.parents))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class PostgresServer:
    folder: Path
    port: int
    pg_ctl: str
    user: pwd.struct_passwd | None
    _databases: itertools.count = itertools.count(1)  # type: ignore[type-arg]

    def run(self, *command: str) -> subprocess.CompletedProcess[str]:
        """Run a server binary as the server's user, in its folder."""
        as_user = {} if self.user is None else {
            "user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        env = {"PATH": os.environ.get("PATH", ""), "LC_ALL": "C", "HOME": str(self.folder)}
        return subprocess.run(command, cwd=self.folder, env=env, capture_output=True,
                              text=True, timeout=120, **as_user)  # type: ignore[call-overload]

    def url(self, database: str) -> str:
        return f"postgresql://{_SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        import psycopg

        name = f"peak_{next(self._databases)}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user=_SUPERUSER,
                             dbname="postgres", autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {name}")
        return self.url(name)


def _start(initdb: str, pg_ctl: str) -> PostgresServer:
    user = _server_user()
    # The server's user must reach its folder: not under a temp dir only root may enter.
    base = tempfile.gettempdir() if user is None or _open_to_all(tempfile.gettempdir()) else "/tmp"
    folder = Path(tempfile.mkdtemp(prefix="peak-tune-pg-", dir=base))
    if user is not None:
        os.chown(folder, user.pw_uid, user.pw_gid)
    server = PostgresServer(folder, _free_port(), pg_ctl, user)
    made = server.run(initdb, "-D", str(folder / "data"), "-U", _SUPERUSER, "--auth=trust",
                      "--no-locale", "-E", "UTF8", "--no-sync")
    if made.returncode != 0:
        raise RuntimeError(f"initdb failed: {made.stderr.strip() or made.stdout.strip()}")
    options = (f"-p {server.port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off "
               "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
    started = server.run(pg_ctl, "-D", str(folder / "data"), "-l", str(folder / "log"),
                         "-o", options, "-w", "-t", "60", "start")
    if started.returncode != 0:
        log = (folder / "log").read_text() if (folder / "log").is_file() else ""
        raise RuntimeError(f"pg_ctl start failed: {started.stderr.strip()} {log[-2000:]}")
    return server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    binaries = _binaries()
    if binaries is None:
        pytest.skip("PostgreSQL server not installed (no initdb/pg_ctl on PATH or in "
                    "/usr/lib/postgresql/*/bin): apt-get install postgresql")
    pytest.importorskip("psycopg", reason="psycopg missing: pip install -e '.[test]'")
    server = _start(*binaries)
    try:
        yield server
    finally:
        server.run(server.pg_ctl, "-D", str(server.folder / "data"), "-m", "immediate",
                   "-w", "stop")
        shutil.rmtree(server.folder, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """The URL of a fresh, empty database on the test session's server."""
    return postgres_server.new_database()
