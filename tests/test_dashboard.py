"""`peak-tune dashboard` serves the study through the real optuna-dashboard."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.test_cli import last_json, peak

pytestmark = pytest.mark.skipif(importlib.util.find_spec("optuna_dashboard") is None,
                                reason="optuna-dashboard is not installed (test extra)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_dashboard_lists_the_study(tmp_path):
    done = peak("--trials", "2", "--size", "32", "--repeats", "3", "--json",
                "--results", str(tmp_path))
    assert done.returncode == 0, done.stderr
    study = last_json(done.stdout)["study"]
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "peak_tune.cli", "dashboard", "--results", str(tmp_path),
         "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies",
                                            timeout=5) as reply:
                    studies = json.loads(reply.read())["study_summaries"]
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.5)
        names = [s["study_name"] for s in studies]
        assert study in names
    finally:
        server.terminate()
        server.wait(timeout=30)
    # stopping `peak-tune dashboard` stops the server itself: nothing is left listening
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5)
