"""Where a benchmark's record came from: the day, the command as typed, and the commit.

Every record under benchmarks/results/ carries these three (with the device, which each
benchmark reads its own way). The commit is PEAK_TUNE_COMMIT's where it is set: a device
machine gets a copy of the tree whose .git, where it has one, may name an older commit
than the files it holds (seen: a run at 0d38f93 read d8498dc), so the script that runs the
benchmark there says it (`export PEAK_TUNE_COMMIT=$(git rev-parse HEAD)` before the
call). Else git's HEAD, marked "+changes" where tracked files differ from it; "unknown"
where neither is there.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git(*args: str) -> str:
    """git's output in the checkout, "" where git or the checkout's .git is missing."""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=False).stdout.strip()
    except OSError:  # no git on this machine
        return ""


def commit() -> str:
    """PEAK_TUNE_COMMIT where set, else HEAD's full hash (+changes where the tracked files
    differ from it), else "unknown"."""
    if os.environ.get("PEAK_TUNE_COMMIT"):
        return os.environ["PEAK_TUNE_COMMIT"]
    head = git("rev-parse", "HEAD")
    if not head:
        return "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def command() -> str:
    """The command line as a user would type it again."""
    return shlex.join(["python3", *sys.argv])


def provenance() -> dict[str, str]:
    """The record's "date", "command" and "commit"."""
    return {"date": time.strftime("%Y-%m-%d"), "command": command(), "commit": commit()}
