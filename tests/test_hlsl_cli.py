"""The HLSL backend from the command line: a study on lavapipe end to end with the
reference applier, the documented-peak denominator where the device has no BLAS, and the
paper's Adreno profile on a machine without one (one line, nothing created)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.backends.test_hlsl_toolchain import COMPILERS_HERE, _no_vulkan

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--size", "64", "--repeats", "3"]
needs_vulkan = [pytest.mark.hlsl,
                pytest.mark.skipif(not COMPILERS_HERE, reason="no HLSL compiler on PATH"),
                pytest.mark.skipif(_no_vulkan() is not None, reason=f"no Vulkan: {_no_vulkan()}")]


def peak_tune(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "peak_tune.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600, check=False)


def summary_of(done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_adreno_profile_without_an_adreno_is_one_line_and_creates_nothing(tmp_path):
    done = peak_tune("--trials", "500", "--device", "adreno-x1-85", cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "adreno-x1-85" in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


class TestOnLavapipe:
    pytestmark = needs_vulkan

    def test_a_study_searches_hlsl_sequences_and_reports_gflops_alone(self, tmp_path):
        data = summary_of(peak_tune("--backend", "hlsl", "--device", "lavapipe",
                                    "--trials", "10", *SMALL, "--seed", "3", "--json",
                                    cwd=tmp_path))
        assert data["backend"] == "hlsl" and data["device"] == "lavapipe"
        assert data["best"]["gflops"] > 0
        assert data["vendor"]["library"] is False
        assert "no BLAS for Vulkan compute" in data["vendor"]["why_none"]
        assert data["ratio"] is None and data["ratio_to"] is None  # lavapipe: no peak
        assert data["confirmation"]["status"] == "confirmed"
        assert data["trials"]["total"] == 10 and data["trials"]["complete"] >= 2
        tried = set().union(*[set(s.split(" > ")) for s in
                              _sequences(tmp_path / "results")])
        assert {"refactor", "tb-tiling", "thread-tiling"} & tried

    def test_a_device_with_a_documented_peak_is_measured_against_it(self, tmp_path):
        """A user's profile of this Vulkan device with a documented peak (as the paper's
        Adreno): the ratio is the best over that peak, said so in the summary."""
        devices = tmp_path / "mine" / "devices"
        devices.mkdir(parents=True)
        (devices / "cpu-vulkan.toml").write_text(
            'name = "cpu-vulkan"\ntitle = "lavapipe, documented"\nbackend = "hlsl"\n'
            "memory_bandwidth_gbs = 20\n[peak_gflops]\nfloat32 = 40\n[facts]\n"
            'vulkan_device = "llvmpipe"\nmax_threads_per_group = 256\ngroupshared_kib = 32\n'
            'spirv_opt = "off"\n')  # as lavapipe's own profile: seconds a build on a CPU
        done = peak_tune("--device", "cpu-vulkan", "--catalog", str(tmp_path / "mine"),
                         "--trials", "4", *SMALL, "--seed", "1", "--json", cwd=tmp_path)
        data = summary_of(done)
        assert data["ratio_to"] == "peak" and data["peak"]["gflops"] == 40
        assert data["ratio"] == pytest.approx(data["best"]["gflops"] / 40)
        assert data["peak"]["ratio"] == pytest.approx(data["ratio"])
        text = peak_tune("--device", "cpu-vulkan", "--catalog", str(tmp_path / "mine"),
                         "--trials", "2", *SMALL, "--seed", "1", cwd=tmp_path)
        assert text.returncode == 0, text.stderr
        assert "x documented peak" in text.stdout + text.stderr

    def test_a_study_starts_from_a_cuda_studys_best_sequences(self, tmp_path):
        """--warm-start with a CUDA study (here a replay of the H200 recording): the HLSL
        study first runs its best sequences without the steps Vulkan lacks (pipelining,
        launch-bounds, split-k), with their values; a C study is refused in one line."""
        import optuna

        recording = ROOT / "benchmarks" / "results" / "landscapes" / \
            "landscape-float32-4096.json"
        cuda = peak_tune("--device", "h200", "--size", "4096", "--trials", "40", "--replay",
                         str(recording), "--study", "cuda", "--json", cwd=tmp_path)
        assert cuda.returncode == 0, cuda.stderr
        warm = peak_tune("--backend", "hlsl", "--device", "lavapipe", *SMALL, "--trials", "3",
                         "--warm-start", "cuda", "--warm-start-top", "2", "--no-branch-start",
                         "--study", "hlsl", "--json", cwd=tmp_path)
        assert summary_of(warm)["backend"] == "hlsl"
        storage = f"sqlite:///{tmp_path / 'results' / 'peak.db'}"
        source = optuna.load_study(study_name="cuda", storage=storage)
        ranked = sorted((t for t in source.trials if t.values), key=lambda t: -t.values[0])
        started = [t for t in optuna.load_study(study_name="hlsl", storage=storage).trials
                   if "warm_start_from" in t.user_attrs]
        # The stored study holds trials in the order they finished, which need not be the
        # order they were asked in (best first), so each is matched to its origin.
        origin = {f"cuda#{t.number}": t for t in ranked[:2]}
        assert sorted(t.user_attrs["warm_start_from"] for t in started) == sorted(origin)
        lacking = {"pipelining", "launch-bounds", "split-k"}
        for got in started:
            best = origin[got.user_attrs["warm_start_from"]]
            kept = [s for s in best.user_attrs["sequence"] if s not in lacking]
            assert got.user_attrs["sequence"] == kept
            assert {k: v for k, v in got.params.items() if k.split(".")[0] in kept} == \
                {k: v for k, v in best.params.items() if k.split(".")[0] in kept}
        assert any(lacking & set(t.user_attrs["sequence"]) for t in ranked[:2])  # not vacuous
        c = peak_tune("--study", "c", "--size", "32", "--trials", "1", cwd=tmp_path)
        assert c.returncode == 0, c.stderr
        refused = peak_tune("--backend", "hlsl", "--device", "lavapipe", *SMALL, "--trials",
                            "1", "--warm-start", "c", cwd=tmp_path)
        assert refused.returncode == 2
        assert refused.stderr.strip().splitlines() == [
            "peak-tune: error: --warm-start c: none of its best sequences has a step that "
            "the hlsl backend offers"]


def _sequences(results: Path) -> list[str]:
    import optuna

    storage = f"sqlite:///{results / 'peak.db'}"
    names = optuna.get_all_study_names(storage)
    study = optuna.load_study(study_name=names[0], storage=storage)
    return [" > ".join(t.user_attrs.get("sequence", [])) for t in study.trials
            if t.user_attrs.get("sequence")]
