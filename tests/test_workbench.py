"""`peak-tune apply` and `peak-tune checkpoint` as an engineer runs them: real gcc, real
runs, real cache; each command a real subprocess."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.test_cli import last_json, peak

SMALL = ["--size", "64", "--repeats", "3"]


def apply(results: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return peak("apply", *args, "--results", str(results))


def checkpoint(results: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return peak("checkpoint", *args, "--results", str(results))


def index(results: Path) -> dict:
    return json.loads((results / "checkpoints.json").read_text())


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """seed > cp1 (cache-blocking, defaults) > cp2 (register-blocking MR=8, NR=16), and a
    branch cp1 > cp3 (unroll-k). Tests that change it work on a copy."""
    results = tmp_path_factory.mktemp("bench")
    made = []
    for args in (["cache-blocking", *SMALL], ["register-blocking", "--params", "MR=8,NR=16"],
                 ["unroll-k", "--from", "cp1"]):
        done = apply(results, *args, "--json")
        assert done.returncode == 0, done.stderr
        made.append({"data": last_json(done.stdout), "stderr": done.stderr})
    return results, made


def copy_of(chain: tuple[Path, list[dict]], tmp_path: Path) -> Path:
    target = tmp_path / "results"
    shutil.copytree(chain[0], target)
    return target


def test_apply_shows_the_diff_the_speed_and_saves_a_checkpoint(chain):
    results, made = chain
    first, shown = made[0]["data"], made[0]["stderr"]
    assert "--- a/seed" in shown and "+++ b/cp1" in shown
    assert "+    for (int ib = 0; ib < M; ib += MC) {" in shown
    assert "-            C[i * N + j] = acc;" in shown
    assert "defaults   used for MC, NC, KC" in shown
    assert first["status"] == "ok" and first["gflops"] > 0
    assert first["vendor"]["name"].startswith("numpy") and first["vendor"]["gflops"] > 0
    assert first["ratio"] == pytest.approx(first["gflops"] / first["vendor"]["gflops"])
    assert first["params"] == {"MC": 64, "NC": 256, "KC": 128}  # the declared defaults
    assert first["defaults_used"] == ["MC", "NC", "KC"]
    assert first["cache"] == {"application_hit": False, "evaluation_hit": False, "compiles": 1}
    saved = index(results)["checkpoints"]["cp1"]
    assert (saved["parent"], saved["transformation"]) == ("seed", "cache-blocking")
    assert saved["context_hash"] == first["context_hash"]
    assert saved["timings"]["cpu float32 64x64x64"]["gflops"] == first["gflops"]
    digest = first["context_hash"]
    assert (results / "cache" / "contexts" / digest[:2] / f"{digest}.json").is_file()


def test_given_values_override_and_parent_values_are_inherited(chain):
    second = chain[1][1]
    assert second["data"]["params"] == {"MC": 64, "NC": 256, "KC": 128, "MR": 8, "NR": 16}
    assert second["data"]["defaults_used"] == []
    assert "MC=64 (inherited)" in second["stderr"] and "MR=8 (given)" in second["stderr"]


def test_the_same_apply_again_is_free_and_makes_no_new_checkpoint(chain, tmp_path):
    results = copy_of(chain, tmp_path)
    builds = sorted(p.name for p in (results / "cache" / "builds").rglob("*"))
    again = apply(results, "cache-blocking", "--from", "seed", "--json")
    assert again.returncode == 0, again.stderr
    data = last_json(again.stdout)
    assert data["cache"] == {"application_hit": True, "evaluation_hit": True, "compiles": 0}
    assert data["checkpoint"] == "cp1" and data["reused"] is True
    assert data["gflops"] == chain[1][0]["data"]["gflops"]
    assert "applied    cache-blocking to seed (cached: no applier call)" in again.stderr
    assert sorted(p.name for p in (results / "cache" / "builds").rglob("*")) == builds
    assert sorted(index(results)["checkpoints"]) == ["cp1", "cp2", "cp3"]
    assert index(results)["current"] == "cp1"


def test_branch_from_an_older_checkpoint_shows_in_the_tree(chain):
    results, made = chain
    assert made[2]["data"]["parent"] == "cp1" and made[2]["data"]["checkpoint"] == "cp3"
    assert made[2]["data"]["params"] == {"MC": 64, "NC": 256, "KC": 128, "UNROLL_K": 4}
    listed = checkpoint(results, "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].startswith("seed (matmul, c)")
    rows = {_name(line): line for line in lines[1:]}
    assert rows["cp1"].startswith("└── cp1")
    assert rows["cp2"].startswith("    ├── cp2")  # both children of cp1, side by side
    assert rows["cp3"].startswith("    └── cp3 *")  # the newest is current
    assert "register-blocking" in rows["cp2"] and "MR=8" in rows["cp2"]
    assert "GFLOP/s" in rows["cp3"]


def _name(line: str) -> str:
    return line.replace("│", " ").replace("├──", " ").replace("└──", " ").split()[0]


def test_show_diff_and_compare(chain):
    results, made = chain
    shown = checkpoint(results, "show", "cp2")
    assert shown.returncode == 0, shown.stderr
    assert "path       seed > cp1 > cp2" in shown.stdout
    assert "sequence   cache-blocking > register-blocking" in shown.stdout
    assert "MR=8" in shown.stdout and "constraints MC % MR == 0" in shown.stdout
    assert shown.stdout.rstrip().endswith("}")  # the source comes last
    diff = checkpoint(results, "diff", "cp1", "cp2")
    assert diff.stdout.startswith("--- a/cp1\n+++ b/cp2\n")
    assert any(line.startswith("+") and "MR" in line for line in diff.stdout.splitlines())
    assert checkpoint(results, "diff", "seed", "cp1").stdout.startswith("--- a/seed\n")
    compared = checkpoint(results, "compare", "cp1", "cp2", "cp3")
    assert compared.returncode == 0, compared.stderr
    # checkpoint, parent, step, measured at (device dtype size), GFLOP/s, vendor, ratio, ...
    rows = {line.split()[0]: line.split() for line in compared.stdout.splitlines()[1:]}
    for name, run in zip(("cp1", "cp2", "cp3"), made, strict=True):
        assert rows[name][3:6] == ["cpu", "float32", "64x64x64"]
        assert rows[name][6] == f"{run['data']['gflops']:.2f}"
        assert rows[name][8] == f"{run['data']['ratio']:.3f}x"
    assert rows["cp1"][9] == "1.00x"


def test_restore_moves_where_the_next_apply_starts(chain, tmp_path):
    results = copy_of(chain, tmp_path)
    # From the current cp3 (no register tile) tile-interchange is illegal ...
    refused = apply(results, "tile-interchange")
    assert refused.returncode == 2 and "requires register-blocking" in refused.stderr
    out = tmp_path / "cp2.c"
    restored = checkpoint(results, "restore", "cp2", "-o", str(out))
    assert restored.returncode == 0, restored.stderr
    # ... from cp2 it applies.
    done = apply(results, "tile-interchange", "--json")
    assert done.returncode == 0, done.stderr
    assert last_json(done.stdout)["parent"] == "cp2"
    text = out.read_text()
    assert "checkpoint cp2" in text and "#define MR 8" in text
    built = subprocess.run(["gcc", "-O2", "-fopenmp", "-c", "-DDTYPE=float", str(out), "-o",
                            str(tmp_path / "cp2.o")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr


def test_delete_keeps_the_tree_whole(chain, tmp_path):
    results = copy_of(chain, tmp_path)
    refused = checkpoint(results, "delete", "cp1")
    assert refused.returncode == 2 and "has children (cp2, cp3)" in refused.stderr
    assert checkpoint(results, "delete", "cp3").returncode == 0
    assert index(results)["current"] == "cp1"  # the deleted one's parent
    assert sorted(index(results)["checkpoints"]) == ["cp1", "cp2"]
    made = apply(results, "prefetch", "--json")  # a new name, never the deleted one's
    assert last_json(made.stdout)["checkpoint"] == "cp4"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["apply", "no-such-step"], "unknown transformation 'no-such-step'"),
        (["apply", "tile-interchange", "--from", "cp1"],
         "cannot apply tile-interchange to cp1: tile-interchange requires register-blocking"),
        (["apply", "loop-interchange", "--from", "cp2"], "conflicts with register-blocking"),
        (["apply", "unroll-k", "--from", "nope"], "no checkpoint 'nope'"),
        (["apply", "prefetch", "--name", "cp1"], "checkpoint 'cp1' exists already"),
        (["apply", "prefetch", "--name", "seed"], "'seed' is reserved"),
        (["apply", "register-blocking", "--from", "cp1", "--params", "MR=5"],
         "MR=5 is not allowed"),
        (["apply", "prefetch", "--params", "TILE=4"], "has no parameter TILE"),
        (["apply", "prefetch", "--backend", "cuda", "--device", "h200"],
         "checkpoint 'cp3' is a c variant, not cuda"),
        (["checkpoint", "show", "nope"], "no checkpoint 'nope' (checkpoints: cp1, cp2, cp3)"),
        (["checkpoint", "diff", "cp1", "nope"], "no checkpoint 'nope'"),
        (["checkpoint", "restore", "nope"], "no checkpoint 'nope'"),
        (["checkpoint", "delete", "nope"], "no checkpoint 'nope'"),
    ],
)
def test_mistakes_are_one_line_exit_2_and_change_nothing(chain, args, expected):
    results, _ = chain
    before = (results / "checkpoints.json").read_bytes()
    done = peak(*args, "--results", str(results))
    assert done.returncode == 2, done.stderr
    assert expected in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert (results / "checkpoints.json").read_bytes() == before


STEP_WITHOUT_APPLIER = """---
id: my-step
version: 1
title: A step no applier here can carry out
kernels: [matmul]
backends: [c]
params: {}
passes:
  - region: device
---
## Pass 1: device
Rewrite the kernel in a way only a person knows.
"""


def test_a_step_the_applier_cannot_do_fails_cleanly_and_saves_nothing(chain, tmp_path):
    results = copy_of(chain, tmp_path)
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "my-step.md").write_text(STEP_WITHOUT_APPLIER)
    before = (results / "checkpoints.json").read_bytes()
    done = apply(results, "my-step", "--catalog", str(tmp_path / "cat"))
    assert done.returncode == 1
    assert "apply error" in done.stderr and "my-step" in done.stderr
    assert "Traceback" not in done.stderr
    assert (results / "checkpoints.json").read_bytes() == before


@pytest.mark.llm
def test_apply_with_the_llm_applier_asks_once_and_journals_the_call(tmp_path):
    from tests.appliers.test_llm import INTERCHANGED, KEY, fenced
    from tests.llm_server import LLMServer, reply
    from tests.test_cli_llm import endpoint

    results = tmp_path / "results"
    with LLMServer() as server:
        server.script(reply(fenced(INTERCHANGED)))
        env = endpoint(server.url + "/v1")
        done = peak("apply", "loop-interchange", "--applier", "llm", *SMALL, "--json",
                    "--results", str(results), env=env)
        assert done.returncode == 0, done.stderr
        again = peak("apply", "loop-interchange", "--applier", "llm", "--from", "seed",
                     "--json", "--results", str(results), env=env)
        assert again.returncode == 0, again.stderr
        assert len(server.chat_requests()) == 1  # the repeat came from the cache
    data = last_json(done.stdout)
    assert data["status"] == "ok" and data["gflops"] > 0
    assert "--- a/seed" in done.stderr  # the diff of what the model wrote
    journal = (results / "cache" / "llm-calls.jsonl").read_text().splitlines()
    assert len(journal) == 1 and "loop-interchange" in journal[0]
    for path in results.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
