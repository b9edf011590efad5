"""Where a benchmark's record came from: the day, the command as typed, and the commit.

Every record under benchmarks/results/ carries these three (with the device, which each
benchmark reads its own way). The commit is git's where the checkout has its .git; a
device machine gets a copy of the tree without it, so there the script that runs the
benchmark says it in PEAK_TUNE_COMMIT (`export PEAK_TUNE_COMMIT=$(git rev-parse HEAD)`
before the call); "unknown" where neither is there.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    """HEAD's full hash, PEAK_TUNE_COMMIT's where git has none, else "unknown"."""
    try:
        found = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                               text=True, check=False).stdout.strip()
    except OSError:  # no git on this machine
        found = ""
    return found or os.environ.get("PEAK_TUNE_COMMIT", "unknown")


def command() -> str:
    """The command line as a user would type it again."""
    return shlex.join(["python3", *sys.argv])


def provenance() -> dict[str, str]:
    """The record's "date", "command" and "commit"."""
    return {"date": time.strftime("%Y-%m-%d"), "command": command(), "commit": commit()}
