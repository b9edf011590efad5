"""A Ray cluster of two nodes on this machine: `peak-tune --ray-address` uses both."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow]

# A throwaway cluster on loopback: no token (Ray's default asks every node for one) and
# the loopback address (the machine's own may not be reachable from itself).
CLUSTER_ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray_node(*args: str) -> subprocess.Popen[bytes]:
    ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
    return subprocess.Popen([ray, "start", "--block", "--node-ip-address=127.0.0.1",
                             "--num-cpus=1", "--disable-usage-stats", *args],
                            env=CLUSTER_ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


@pytest.fixture
def two_node_cluster() -> Iterator[str]:
    port = _free_port()
    address = f"127.0.0.1:{port}"
    nodes = [_ray_node("--head", f"--port={port}", "--include-dashboard=false")]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        nodes.append(_ray_node(f"--address={address}"))
        yield address
    finally:
        for node in nodes:
            os.killpg(node.pid, signal.SIGTERM)
        for node in nodes:
            node.wait(timeout=60)


def test_a_run_on_a_two_node_cluster_uses_a_worker_on_each(two_node_cluster: str,
                                                           tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "peak_tune.cli", "--ray-address", two_node_cluster,
         "--ray-workers", "2", "--size", "64", "--repeats", "3", "--trials", "8",
         "--results", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=300, env=CLUSTER_ENV)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout.strip().splitlines()[-1])
    assert data["executor"]["name"] == "ray"
    # each worker needs one CPU and each node has one: the two ran on different nodes
    by_worker = data["executor"]["evaluations_by_worker"]
    assert len(by_worker) == 2 and all(n > 0 for n in by_worker.values()), by_worker
    assert data["trials"]["total"] == 8
