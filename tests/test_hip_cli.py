"""The HIP backend from the command line, on a machine without an AMD GPU: the user's
first command says so in one line and creates nothing; `peak-tune dry-run` compiles and
checks the space for the device's architecture and shows each point's resources."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from peak_tune.backends import _hip_amd
from peak_tune.backends.hip import visible_amd_gpus
from peak_tune.errors import BackendUnavailable


def peak_tune(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "peak_tune.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600, check=False)


def _no_amd_clang() -> str | None:
    try:
        _hip_amd.find_toolchain()
    except BackendUnavailable as exc:
        return str(exc)
    return None


@pytest.mark.skipif(bool(visible_amd_gpus()), reason="this machine has an AMD GPU")
@pytest.mark.parametrize("device", ["mi250", "mi250x", "mi300x"])
def test_no_amd_gpu_is_one_line_exit_2_and_nothing_created(device, tmp_path):
    done = peak_tune("--trials", "500", "--device", device, cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no AMD GPU" in lines[0] and device in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []  # no results folder, no study


def test_visible_amd_gpus_reads_the_kernel_drivers_topology(tmp_path):
    for node, version in (("0", "0"), ("1", "90010"), ("2", "90402")):
        (tmp_path / node).mkdir()
        (tmp_path / node / "properties").write_text(
            f"cpu_cores_count 0\ngfx_target_version {version}\nsimd_count 440\n")
    assert visible_amd_gpus(tmp_path) == ["gfx90a", "gfx942"]
    assert visible_amd_gpus(tmp_path / "absent") == []


@pytest.mark.hip
@pytest.mark.skipif(_no_amd_clang() is not None, reason=f"no HIP compiler: {_no_amd_clang()}")
def test_dry_run_compiles_the_space_for_gfx90a_and_shows_resources(tmp_path):
    done = peak_tune("dry-run", "--device", "mi250", "--points", "4", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    outcomes = {p["outcome"] for p in report["points"]}
    assert outcomes <= {"ok", "pruned"} and "ok" in outcomes
    steps = {s for p in report["points"] for s in p["sequence"]}
    assert {"refactor", "tb-tiling", "thread-tiling", "warp-tiling"} <= steps
    assert not steps & {"pipelining", "tensor-core", "wgmma", "tma"}  # NVIDIA-only: pruned
    built = [p for p in report["points"] if p["outcome"] == "ok"]
    assert all(p["resources"]["vgprs"] > 0 and p["resources"]["wavefront_size"] == 64
               for p in built)
    pruned = [p for p in report["points"] if p["outcome"] == "pruned"]
    assert all(p["message"] for p in pruned)
    assert list(tmp_path.iterdir()) == []


def test_dry_run_on_the_cpu_and_its_bad_input(tmp_path):
    done = peak_tune("dry-run", "--device", "cpu", "--points", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("cpu (")
    bad = peak_tune("dry-run", "--device", "tpu9", cwd=tmp_path)
    assert bad.returncode == 2 and "unknown device 'tpu9'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_amd_only_steps_are_left_out_for_nvidia_devices(tmp_path):
    done = peak_tune("--trials", "1", "--backend", "hip", "--device", "h200", "--sequence",
                     "refactor,tb-tiling,mfma", cwd=tmp_path)
    assert done.returncode == 2
    assert "transformation 'mfma' is for amd devices, not h200 (nvidia)" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.hip
@pytest.mark.skipif(_no_amd_clang() is not None, reason=f"no HIP compiler: {_no_amd_clang()}")
def test_dry_run_offers_mfma_on_amd_and_shows_its_matrix_accumulators(tmp_path):
    done = peak_tune("dry-run", "--device", "mi300x", "--dtype", "float16", "--points", "0",
                     "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    mfma = [p for p in json.loads(done.stdout)["points"] if "mfma" in p["sequence"]]
    assert mfma and all(p["outcome"] in ("ok", "pruned") for p in mfma)


def _fake_topology(root: Path, version: str) -> Path:
    (root / "1").mkdir(parents=True)
    (root / "1" / "properties").write_text(f"gfx_target_version {version}\n")
    return root


def test_an_amd_gpu_without_cupys_rocm_build_names_what_to_install(tmp_path, monkeypatch):
    """ROCm shows a gfx90a (a topology like the kernel driver's) but CuPy is not
    installed: probe() says in one line what the HIP runtime needs."""
    from peak_tune.backends import hip
    from peak_tune.catalog.loaders import load_device

    pytest.importorskip("numpy")
    if __import__("importlib").util.find_spec("cupy") is not None:
        pytest.skip(reason="CuPy is installed here (the GPU test checks its platform)")
    monkeypatch.setattr(hip, "_KFD_NODES", _fake_topology(tmp_path / "nodes", "90010"))
    root = Path(__file__).resolve().parents[1]
    with hip.HipBackend(load_device(root / "backends" / "devices" / "mi250.toml")) as backend:
        with pytest.raises(BackendUnavailable, match="CuPy built for ROCm.*cupy is not installed"):
            backend.probe()
    monkeypatch.setattr(hip, "_KFD_NODES", _fake_topology(tmp_path / "other", "90402"))
    with hip.HipBackend(load_device(root / "backends" / "devices" / "mi250.toml")) as backend:
        with pytest.raises(BackendUnavailable, match=r"no AMD GPU of the mi250 kind \(gfx90a\)"
                                                     r" is visible here \(it shows gfx942\)"):
            backend.probe()


def test_hip_runtime_versions_read_as_rocm_writes_them():
    from peak_tune.backends._cuda_worker import _runtime_label

    assert _runtime_label(60032830, hip=True) == "6.0"  # ROCm 6.0.2's HIP_VERSION
    assert _runtime_label(50422804, hip=True) == "5.4"
    assert _runtime_label(12040, hip=False) == "12.4"
