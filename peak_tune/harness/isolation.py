"""What a worker process leaves behind: processes it started, found through /proc.

A kernel runs in a worker that is the leader of its own session and process group and
carries a token in its environment (`TOKEN_VARIABLE`). Anything it forks is its child,
stays in its session unless it calls setsid(), and inherits the token unless it scrubs
its own environment block. `descendants` finds all three kinds; `end` kills them. A
process that leaves the session, rewrites its environment and is reparented away can
still escape this scan (see the README's threat model); the timeout and the next
worker's fresh start bound what it can do to later results.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

__all__ = ["TOKEN_VARIABLE", "children", "descendants", "end"]

TOKEN_VARIABLE = "PEAK_TUNE_WORKER_TOKEN"
_PROC = Path("/proc")


def children(pid: int) -> set[int]:
    """Direct children of `pid` (all its threads'), from /proc/<pid>/task/*/children."""
    found: set[int] = set()
    try:
        tasks = list((_PROC / str(pid) / "task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found.update(int(p) for p in (task / "children").read_text().split())
        except OSError:
            continue
    return found


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
    found: set[int] = set()
    frontier = [leader]
    while frontier:
        for child in children(frontier.pop()):
            if child not in found and child != leader:
                found.add(child)
                frontier.append(child)
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
