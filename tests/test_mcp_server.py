"""`peak-tune mcp` driven as an MCP client drives it: a subprocess, JSON-RPC on its stdio."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TOOLS = {"list_transformations", "apply_transformation", "list_checkpoints", "show_checkpoint",
         "diff_checkpoints", "compare_checkpoints", "evaluate", "restore_checkpoint"}


class Client:
    def __init__(self, results: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "peak_tune.cli", "mcp", "--results", str(results),
             "--size", "64", "--repeats", "3"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "OPENAI_MODEL": "", "OPENAI_API_KEY": ""})
        self.lines: list[str] = []  # every line the server wrote to stdout
        self.next_id = 0

    def send(self, message: dict[str, Any] | str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((message if isinstance(message, str) else json.dumps(message))
                              + "\n")
        self.proc.stdin.flush()

    def read(self, timeout: float = 240) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, "the server did not answer"
        line = self.proc.stdout.readline()
        self.lines.append(line)
        return dict(json.loads(line))

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method,
                   **({"params": params} if params is not None else {})})
        reply = self.read()
        assert reply["jsonrpc"] == "2.0" and reply["id"] == self.next_id
        return reply

    def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        reply = self.request("tools/call", {"name": tool, "arguments": arguments})
        assert "result" in reply, reply
        return dict(reply["result"])

    def close(self) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, out, err


@pytest.fixture
def client(tmp_path: Path) -> Client:
    return Client(tmp_path / "results")


def test_initialize_list_and_apply_over_stdio(client, tmp_path):
    hello = client.request("initialize", {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "pytest", "version": "1"}})["result"]
    assert hello["protocolVersion"] == "2025-06-18"
    assert hello["serverInfo"]["name"] == "peak-tune"
    assert hello["capabilities"]["tools"] == {"listChanged": False}
    client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})  # no answer

    tools = client.request("tools/list")["result"]["tools"]
    assert {t["name"] for t in tools} == TOOLS
    apply_tool = next(t for t in tools if t["name"] == "apply_transformation")
    assert apply_tool["inputSchema"]["required"] == ["transformation"]

    result = client.call("apply_transformation", transformation="cache-blocking",
                         params={"MC": 32})
    assert result["isError"] is False
    text = result["content"][0]["text"]
    assert "--- a/seed" in text and "+++ b/cp1" in text and "ib += MC" in text
    assert "GFLOP/s" in text and "x vendor" in text and "checkpoint cp1" in text
    data = result["structuredContent"]
    assert data["status"] == "ok" and data["gflops"] > 0 and data["vendor"]["gflops"] > 0
    assert data["params"] == {"MC": 32, "NC": 256, "KC": 128}
    assert data["defaults_used"] == ["NC", "KC"]
    assert json.loads(result["content"][1]["text"]) == data
    saved = json.loads((tmp_path / "results" / "checkpoints.json").read_text())
    assert saved["current"] == "cp1"
    assert saved["checkpoints"]["cp1"]["context_hash"] == data["context_hash"]

    code, out, err = client.close()
    assert code == 0, err
    assert out == ""  # nothing after the last answer
    for line in client.lines:  # and nothing but JSON-RPC before it
        assert json.loads(line)["jsonrpc"] == "2.0"


def test_failures_are_errors_the_agent_can_read(client):
    client.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                  "clientInfo": {"name": "pytest", "version": "1"}})
    illegal = client.call("apply_transformation", transformation="tile-interchange")
    assert illegal["isError"] is True
    assert "tile-interchange requires register-blocking" in illegal["content"][0]["text"]
    missing = client.call("show_checkpoint", name="nope")
    assert missing["isError"] is True and "no checkpoint 'nope'" in missing["content"][0]["text"]

    unknown = client.request("tools/call", {"name": "rm_rf", "arguments": {}})
    assert unknown["error"]["code"] == -32602
    bad = client.request("tools/call", {"name": "show_checkpoint", "arguments": {"nme": "x"}})
    assert bad["error"]["code"] == -32602 and "nme" in bad["error"]["message"]
    typed = client.request("tools/call", {"name": "apply_transformation", "arguments": {
        "transformation": "unroll-k", "params": {"UNROLL_K": "four"}}})
    assert typed["error"]["code"] == -32602
    assert client.request("no/such/method")["error"]["code"] == -32601
    client.send("{not json")
    assert client.read()["error"]["code"] == -32700
    assert client.request("ping")["result"] == {}  # still serving

    listed = client.call("list_checkpoints")
    assert listed["structuredContent"] == {"current": "seed", "checkpoints": []}
    steps = client.call("list_transformations")
    found = {t["id"]: t for t in steps["structuredContent"]["transformations"]}
    assert found["tile-interchange"]["requires"] == ["register-blocking"]
    assert found["cache-blocking"]["params"]["MC"]["default"] == 64
    assert "tb-tiling" not in found  # only the c backend's steps
    assert "unroll-k:" in steps["content"][0]["text"]
    code, _, err = client.close()
    assert code == 0, err


def test_branch_compare_diff_evaluate_and_restore(client):
    client.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                  "clientInfo": {"name": "pytest", "version": "1"}})
    assert not client.call("apply_transformation", transformation="cache-blocking")["isError"]
    assert not client.call("apply_transformation", transformation="unroll-k")["isError"]
    branch = client.call("apply_transformation", transformation="prefetch", **{"from": "cp1"},
                         name="pf")
    assert branch["structuredContent"]["parent"] == "cp1"
    assert branch["structuredContent"]["checkpoint"] == "pf"
    tree = client.call("list_checkpoints")
    assert {c["name"]: c["parent"] for c in tree["structuredContent"]["checkpoints"]} == {
        "cp1": "seed", "cp2": "cp1", "pf": "cp1"}
    diff = client.call("diff_checkpoints", a="cp2", b="pf")["structuredContent"]["diff"]
    assert diff.startswith("--- a/cp2\n+++ b/pf\n")
    compared = client.call("compare_checkpoints", names=["cp2", "pf"])
    assert "vs first" in compared["content"][0]["text"]
    measured = client.call("evaluate", name="cp2", size="80")
    assert measured["isError"] is False and measured["structuredContent"]["gflops"] > 0
    assert measured["structuredContent"]["key"] == "cpu float32 80x80x80"
    shown = client.call("show_checkpoint", name="cp2")["structuredContent"]
    assert set(shown["timings"]) == {"cpu float32 64x64x64", "cpu float32 80x80x80"}
    assert shown["sequence"] == ["cache-blocking", "unroll-k"]
    assert client.call("restore_checkpoint", name="cp2")["isError"] is False
    assert client.call("list_checkpoints")["structuredContent"]["current"] == "cp2"
    code, _, err = client.close()
    assert code == 0, err
