"""benchmarks/scaling.py on the CPU: several dtype:size configurations in one call, each
worker count's row with its configuration and its speedup against that configuration's
first count (the C backend through Ray, tiny sizes)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def scaling(benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark("scaling")


def test_configs_are_dtype_size_pairs_or_a_clear_error(scaling: ModuleType) -> None:
    parser_args = type("Args", (), {"configs": "float32:64,float64:48", "dtype": "x",
                                    "size": 1})
    assert scaling.configurations(parser_args) == [("float32", 64), ("float64", 48)]
    parser_args.configs = ""
    assert scaling.configurations(parser_args) == [("x", 1)]
    parser_args.configs = "float32:64,float16"
    with pytest.raises(SystemExit, match="'float16' is not dtype:size"):
        scaling.configurations(parser_args)


def test_two_configurations_in_one_call_each_with_its_rows_then_as_one_batch(
        tmp_path: Path) -> None:
    """Each configuration's study with its rows; then, `--batch`, the configurations as
    one batch of studies (peak-tune batch's own scheduling: C studies, timed on this CPU,
    one after another), total and per study. One call: it starts Ray once."""
    out = tmp_path / "scaling.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scaling.py"), "--backend", "c",
         "--configs", "float32:48,float64:40", "--workers", "1", "--trials", "3",
         "--seconds", "60", "--skip-llm", "--batch", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["devices"]
    assert [(r["dtype"], r["size"], r["workers"]) for r in rows] == [
        ("float32", 48, 1), ("float64", 40, 1)]
    assert all(r["trials"] > 0 and r["speedup"] == 1.0 for r in rows)
    assert all(r["mean_jobs"]["on_device"] > 0 for r in rows)  # where the time went
    assert "float64 40, devices 1:" in done.stdout
    batch = json.loads(out.read_text())["batches"]
    assert len(batch) == 1 and batch[0]["batch"] == ["float32:48", "float64:40"]
    studies = batch[0]["studies"]
    assert [s["study"] for s in studies] == ["scaling-float32-48", "scaling-float64-40"]
    assert all(s["state"] == "done" and s["trials"] == 3 for s in studies)
    assert batch[0]["trials"] == 6 and len(batch[0]["device_busy_fraction"]) == 2
    assert "batch of 2, devices 1:" in done.stdout
