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
    address, head = _cluster_of_one()
    nodes = [head]
    try:
        nodes.append(_ray_node(f"--address={address}"))
        yield address
    finally:
        _stop(*nodes)


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


def _cluster_of_one(*args: str) -> tuple[str, subprocess.Popen[bytes]]:
    """A head node on loopback (`args` added to `ray start`), once its port answers."""
    port = _free_port()
    node = _ray_node("--head", f"--port={port}", "--include-dashboard=false", *args)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.5)
    return f"127.0.0.1:{port}", node


def _stop(*nodes: subprocess.Popen[bytes]) -> None:
    """SIGTERM to every node's process group at once; what is still running after a few
    seconds of Ray's own shutdown is killed (its graceful one took up to a minute)."""
    for node in nodes:
        os.killpg(node.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for node in nodes:
        try:
            node.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(node.pid, signal.SIGKILL)  # raylet, GCS and workers share the group
        except ProcessLookupError:
            pass
        node.wait(timeout=30)


def _amd_study_refused(results: Path, *node_args: str) -> tuple[str, str]:
    """`peak-tune --trials 500 --device mi250` sent to a one-node cluster started with
    `node_args`: it must end in one line, exit status 2 and no results folder; the
    cluster's address and that line."""
    address, node = _cluster_of_one(*node_args)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "peak_tune.cli", "--trials", "500", "--device", "mi250",
             "--ray-address", address, "--results", str(results)],
            capture_output=True, text=True, timeout=300, env=CLUSTER_ENV)
    finally:
        _stop(node)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert not results.exists()
    return address, lines[0]


def test_a_cluster_without_the_devices_kind_is_one_line_and_nothing_created(
        tmp_path: Path) -> None:
    """`--device mi250 --ray-address` on a cluster whose nodes have no MI250: one line
    naming the Ray resource and what the nodes have, exit 2, no results folder."""
    address, line = _amd_study_refused(tmp_path / "results")
    assert (f"no GPU of the mi250 kind (gfx90a) is visible here or in the Ray cluster at "
            f"{address}") in line
    assert "accelerator_type:AMD-Instinct-MI250X-MI250" in line
    assert "its nodes have no GPU" in line


def test_the_device_is_probed_on_the_node_that_has_its_kind(tmp_path: Path) -> None:
    """A node labelled with the MI250's Ray resource gets the probe, and says what it
    found (this machine has no AMD GPU): the driver itself needs none, and asks no
    device here."""
    address, line = _amd_study_refused(
        tmp_path / "results", "--num-gpus=1",
        '--resources={"accelerator_type:AMD-Instinct-MI250X-MI250": 1}')
    assert line.startswith(f"peak-tune: error: on the Ray cluster at {address}: "), line
    assert "no AMD GPU of the mi250 kind (gfx90a)" in line
