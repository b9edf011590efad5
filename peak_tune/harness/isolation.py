"""What a worker process leaves behind: processes it started, found through /proc.

Host code runs in a job process forked, per evaluation, by a worker that is a child
subreaper (`become_subreaper`): whatever the kernel starts, however it detaches (double
fork, setsid), stays a descendant of the worker, so walking the worker's children
(`tree`) finds it. Where the subreaper cannot be set (not Linux), the worker is the
leader of its own session and group and carries a token in its environment
(`TOKEN_VARIABLE`), and `descendants` also scans /proc for those; a process that leaves
the session and scrubs its environment escapes that scan (the README's threat model).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

__all__ = ["TOKEN_VARIABLE", "become_subreaper", "children", "descendants", "end", "stopped",
           "tree"]

TOKEN_VARIABLE = "PEAK_TUNE_WORKER_TOKEN"
_PROC = Path("/proc")


# The judge reads these files after every run of a kernel: plain os calls, at half the
# cost of pathlib's.


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError:
        return None


def _tasks(pid: int) -> tuple[str, list[str]] | None:
    folder = f"/proc/{pid}/task"
    try:
        return folder, os.listdir(folder)
    except OSError:
        return None


def children(pid: int) -> set[int]:
    """Direct children of `pid` (all its threads'), from /proc/<pid>/task/*/children."""
    found: set[int] = set()
    tasks = _tasks(pid)
    if tasks is None:
        return found
    folder, names = tasks
    for name in names:
        text = _read(f"{folder}/{name}/children")
        if text:
            found.update(map(int, text.split()))
    return found


def tree(pid: int) -> set[int]:
    """Every descendant of `pid` (children, their children, ...)."""
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        for child in children(frontier.pop()):
            if child not in found and child != pid:
                found.add(child)
                frontier.append(child)
    return found


def become_subreaper() -> bool:
    """Make this process the child subreaper of its descendants (Linux prctl); whether
    it worked."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(36, 1, 0, 0, 0)) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def stopped(pid: int) -> bool | None:
    """Whether every thread of `pid` is stopped (state T); None if it is gone."""
    tasks = _tasks(pid)
    if tasks is None:
        return None
    folder, names = tasks
    for name in names:
        text = _read(f"{folder}/{name}/stat")
        if text is None:
            continue
        state = text[text.rindex(b")") + 2:text.rindex(b")") + 3]
        if state in (b"Z", b"X"):  # it died: not stopped, gone
            return None
        if state not in (b"T", b"t"):
            return False
    return True


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # after "pid (comm) "


def _has_token(pid: int, token: bytes) -> bool:
    try:
        return token in (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False


def descendants(leader: int, token: str, scan_all: bool = True) -> set[int]:
    """Processes other than `leader` that it started: its children and their children,
    and (`scan_all`) any process in its session or carrying its token."""
    found = tree(leader)
    if not scan_all:
        return found
    marker = f"{TOKEN_VARIABLE}={token}".encode()
    me = os.getpid()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid in (leader, me) or pid in found:
            continue
        fields = _stat_fields(pid)
        if fields is None:
            continue
        session, group = int(fields[3]), int(fields[2])
        if session == leader or group == leader or _has_token(pid, marker):
            found.add(pid)
    return found


def end(pids: set[int]) -> None:
    """SIGKILL each process (those already gone are skipped)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
