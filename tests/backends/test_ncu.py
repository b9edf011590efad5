"""Reading Nsight Compute's CSV (a real H200 report) into the summary a person reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from peak_tune.backends._ncu import (
    STALL_METRIC,
    ProfileReport,
    find_cuda_tool,
    parse_ncu_csv,
    profile_request,
)
from peak_tune.errors import BackendUnavailable

REPORT = Path(__file__).parents[1] / "fixtures" / "ncu" / "h200-fp16-mma.csv"


def test_metrics_come_with_their_units():
    metrics = parse_ncu_csv(REPORT.read_text())
    assert metrics["Registers Per Thread"] == ("128", "register/thread")
    assert metrics["Achieved Occupancy"] == ("24.78", "%")
    assert metrics["Local Memory Spilling Requests"][0] == "16,384"


def test_summary_names_the_limits_first():
    report = ProfileReport(parse_ncu_csv(REPORT.read_text()), REPORT.read_text())
    assert report.summary().startswith("SM 37.84 %, memory 49.36 %, DRAM 5.74 %, "
                                       "occupancy 24.78 %, registers 128, ")


def test_no_metrics_summary_and_missing_tool(monkeypatch, tmp_path):
    assert ProfileReport({}, "").summary() == "no metrics"
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    if Path("/usr/local/cuda/bin/ncu").is_file():
        pytest.skip("a CUDA toolkit is installed in /usr/local/cuda")
    with pytest.raises(BackendUnavailable, match="^ncu not found"):
        find_cuda_tool("ncu")


def test_summary_names_the_three_largest_stalls():
    metrics = parse_ncu_csv(REPORT.read_text())
    for name, value in (("barrier", "2.5"), ("long_scoreboard", "0.75"), ("wait", "1,204.0"),
                        ("mio_throttle", "0.10")):
        metrics[STALL_METRIC.format(name)] = (value, "")
    summary = ProfileReport(metrics, "").summary()
    assert summary.endswith("stalls per issue: wait 1204.00, barrier 2.50, "
                            "long_scoreboard 0.75")


def test_an_ncu_without_the_stall_metrics_still_profiles(monkeypatch, tmp_path):
    """ncu refuses an unknown metric: the profile is taken again with the sections alone."""
    calls = tmp_path / "calls"
    fake = tmp_path / "ncu"
    fake.write_text(f"""#!/bin/sh
echo "$*" >> {calls}
case "$*" in *--metrics*) echo "==ERROR== Failed to find metric" >&2; exit 1;; esac
cat {REPORT}
""")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    report = profile_request(tmp_path / "request.json", "peak_tune.backends._cuda_worker",
                             "matmul", dict(os.environ))
    assert report.metrics["Registers Per Thread"] == ("128", "register/thread")
    first, second = calls.read_text().splitlines()
    assert STALL_METRIC.format("barrier") in first and "--metrics" not in second
