"""The checkpoint index: names, lineage rules, damage and concurrent writers."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from peak_tune.errors import UserError
from peak_tune.workbench.checkpoints import SEED, Checkpoint, CheckpointStore, Timing


def draft(parent: str = SEED, step: str = "unroll-k", digest: str = "ab" * 32) -> Checkpoint:
    return Checkpoint(
        name="", parent=parent, transformation=step, transform_version=1,
        params={"UNROLL_K": 4}, defaults_used=("UNROLL_K",), context_hash=digest,
        kernel="matmul", backend="c", device="cpu", dtype="float32",
        size={"M": 64, "N": 64, "K": 64}, applier="reference/1", created="now",
        timings={"cpu float32 64x64x64": Timing("ok", gflops=2.0, vendor_gflops=8.0)})


def test_round_trip_and_auto_names(tmp_path):
    store = CheckpointStore(tmp_path)
    first = store.add(draft(), None)
    second = store.add(draft(parent="cp1", step="prefetch"), None)
    assert (first.name, second.name) == ("cp1", "cp2")
    again = CheckpointStore(tmp_path).get("cp2")
    assert again == second and again.timing() == Timing("ok", gflops=2.0, vendor_gflops=8.0)
    assert again.timing().ratio == 0.25
    assert store.current() == "cp2"
    store.delete("cp2")
    assert store.add(draft(parent="cp1"), None).name == "cp3"  # never a deleted name


def test_a_child_needs_its_parent_and_a_parent_keeps_its_children(tmp_path):
    store = CheckpointStore(tmp_path)
    with pytest.raises(UserError, match="no checkpoint 'cp9'"):
        store.add(draft(parent="cp9"), None)
    store.add(draft(), "base")
    store.add(draft(parent="base"), "child")
    with pytest.raises(UserError, match="has children"):
        store.delete("base")
    with pytest.raises(UserError, match="exists already"):
        store.add(draft(), "child")
    with pytest.raises(UserError, match="reserved"):
        store.add(draft(), "seed")
    with pytest.raises(UserError, match="use letters"):
        store.add(draft(), "../etc")


def test_a_damaged_index_is_reported_and_left_alone(tmp_path):
    store = CheckpointStore(tmp_path)
    store.add(draft(), None)
    store.path.write_text('{"format": 1, "checkpoints": {"cp1": {"name": ')
    with pytest.raises(UserError, match="cannot be read.*left as it is"):
        store.all()
    with pytest.raises(UserError):
        store.add(draft(), None)
    assert store.path.read_text() == '{"format": 1, "checkpoints": {"cp1": {"name": '


def test_concurrent_writers_lose_nothing(tmp_path: Path):
    store = CheckpointStore(tmp_path)

    def add_many() -> None:
        for _ in range(10):
            CheckpointStore(tmp_path).add(draft(), None)

    threads = [threading.Thread(target=add_many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(c.name for c in store.all()) == sorted(f"cp{i}" for i in range(1, 41))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
