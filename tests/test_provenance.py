"""benchmarks/provenance.py: the commit a benchmark's record names."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def provenance(benchmark: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch,
               tmp_path: Path) -> ModuleType:
    """The module, reading a fresh repository of one commit instead of this checkout."""
    monkeypatch.delenv("PEAK_TUNE_COMMIT", raising=False)
    provenance = benchmark("provenance")

    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "kernel.cu").write_text("one\n")
    subprocess.run([*git, "add", "kernel.cu"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    return provenance


def head(repo: Path) -> str:
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_the_record_names_head_and_says_where_tracked_files_differ(
        provenance: ModuleType, tmp_path: Path) -> None:
    assert provenance.commit() == head(tmp_path)
    (tmp_path / "notes.txt").write_text("untracked files are not the benchmark's code\n")
    assert provenance.commit() == head(tmp_path)
    (tmp_path / "kernel.cu").write_text("two\n")
    assert provenance.commit() == head(tmp_path) + "+changes"


def test_peak_tune_commit_wins_over_a_copy_whose_git_is_older(
        provenance: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PEAK_TUNE_COMMIT", "0d38f939bcdf50cc648f066dc52b04a7e8d1330c")
    assert provenance.commit() == "0d38f939bcdf50cc648f066dc52b04a7e8d1330c"


def test_no_git_and_no_variable_is_unknown(provenance: ModuleType, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provenance, "ROOT", tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert provenance.commit() == "unknown"
