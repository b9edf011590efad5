"""A build pinned for running survives the cache being cleared (peak_tune.evaluation.build_pins)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from peak_tune.backends.base import Artifact
from peak_tune.evaluation.build_pins import BuildPins


def _library(folder: Path, value: int, name: str = "k") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "answer.c"
    source.write_text(f"int answer(void) {{ return {value}; }}\n")
    library = folder / f"{name}.so"
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


def test_a_pinned_build_loads_after_its_cache_folder_is_deleted(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "builds"
    built = Artifact(str(_library(cache, 42)), "k")
    pins = BuildPins()
    pinned = pins.pin(built)
    shutil.rmtree(tmp_path / "cache")
    assert ctypes.CDLL(pinned.path).answer() == 42
    assert pinned.compile_key == built.compile_key


def test_a_build_already_gone_is_handed_back_as_it_was(tmp_path: Path) -> None:
    built = Artifact(str(tmp_path / "gone.so"), "gone")
    assert BuildPins().pin(built) == built


def test_a_lost_pin_is_placed_again_and_the_oldest_pins_are_let_go(tmp_path: Path) -> None:
    pins = BuildPins(kept=2)
    first = Artifact(str(_library(tmp_path, 1, "a")), "a")
    pinned = pins.pin(first)
    Path(pinned.path).unlink()
    assert Path(pins.pin(first).path).exists()  # placed again, not handed out missing
    for name in ("b", "c"):
        assert Path(pins.pin(Artifact(str(_library(tmp_path, 2, name)), name)).path).exists()
    assert not Path(pinned.path).exists()  # the oldest of three, with two kept
