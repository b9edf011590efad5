"""Reading Nsight Compute's CSV (a real H200 report) into the summary a person reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from peak_tune.backends._ncu import ProfileReport, find_cuda_tool, parse_ncu_csv
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
