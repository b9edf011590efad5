"""`peak-tune batch` as a user runs it: real C backend, real SQLite storage, real cache."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from peak_tune.batch.files import BatchStudy, load_batch
from peak_tune.errors import UserError
from tests.conftest import _gpu_missing
from tests.test_cli import last_json, peak

TWO_STUDIES = """
name = "b"
trials = {trials}
repeats = 3
[matrix]
devices = ["cpu"]
dtypes = ["float32", "float64"]
sizes = ["48"]
"""
NAMES = ["b-matmul-cpu-float32-48x48x48", "b-matmul-cpu-float64-48x48x48"]


def write(folder: Path, text: str, name: str = "batch.toml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def studies(results: Path) -> dict[str, list[optuna.trial.FrozenTrial]]:
    storage = f"sqlite:///{results}/peak.db"
    return {s.study_name: optuna.load_study(study_name=s.study_name, storage=storage).trials
            for s in optuna.get_all_study_summaries(storage)}


def points(trials: list[optuna.trial.FrozenTrial]) -> list[tuple[object, ...]]:
    """What each trial evaluated: its sequence and its parameter values."""
    return [(tuple(t.user_attrs["sequence"]), tuple(sorted(t.user_attrs["params"].items())))
            for t in trials]


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    folder = tmp_path_factory.mktemp("batch")
    results = folder / "results"
    path = write(folder, TWO_STUDIES.format(trials=3))
    done = peak("batch", str(path), "--results", str(results), "--json")
    assert done.returncode == 0, done.stderr
    return path, results, last_json(done.stdout)


def test_batch_makes_one_named_study_per_entry(batch):
    _, results, data = batch
    assert [s["study"] for s in data["studies"]] == NAMES
    assert [s["dtype"] for s in data["studies"]] == ["float32", "float64"]
    for study in data["studies"]:
        assert study["state"] == "done" and study["new_trials"] == 3
        assert study["best"]["gflops"] > 0 and study["vendor"]["gflops"] > 0
        # where the study's time went: the CPU's busy share and its builds
        busy = study["device_time"]["device_busy_fraction"]
        assert len(busy) == 1 and 0 < next(iter(busy.values())) <= 1
        assert study["device_time"]["builds"]["count"] >= 1
    stored = studies(results)
    assert sorted(stored) == NAMES
    for trials in stored.values():
        assert len(trials) == 3
        assert all(t.state.is_finished() for t in trials)
    assert data["failed"] == 0 and data["storage"] == f"sqlite:///{results.resolve()}/peak.db"


def test_batch_again_runs_nothing_and_compiles_nothing(batch):
    path, results, _ = batch
    again = peak("batch", str(path), "--results", str(results), "--json")
    assert again.returncode == 0, again.stderr
    data = last_json(again.stdout)
    assert [s["new_trials"] for s in data["studies"]] == [0, 0]
    assert [s["finished_trials"] for s in data["studies"]] == [3, 3]
    assert sum(s["cache"]["compiles"] for s in data["studies"]) == 0
    assert [len(t) for t in studies(results).values()] == [3, 3]


def test_a_larger_count_continues_each_study_without_repeating_a_point(batch):
    _, results, _ = batch
    before = {name: points(trials) for name, trials in studies(results).items()}
    path = write(results.parent, TWO_STUDIES.format(trials=5), "more.toml")
    more = peak("batch", str(path), "--results", str(results), "--json")
    assert more.returncode == 0, more.stderr
    assert [s["new_trials"] for s in last_json(more.stdout)["studies"]] == [2, 2]
    for name, trials in studies(results).items():
        assert points(trials)[:3] == before[name]  # the finished trials are untouched
        assert not set(points(trials)[3:]) & set(before[name])  # and none is repeated


def test_a_failing_study_is_reported_and_the_others_run(tmp_path):
    if _gpu_missing() is None:
        pytest.skip("this machine has a GPU: the h200 study would not fail")
    path = write(tmp_path, 'trials = 2\nrepeats = 3\n[[study]]\ndevice = "h200"\n'
                           'sizes = ["64"]\n[[study]]\nsizes = ["48"]\n')
    done = peak("batch", str(path), "--results", str(tmp_path / "r"), "--json")
    assert done.returncode == 1
    gpu, cpu = last_json(done.stdout)["studies"]
    assert gpu["state"] == "failed" and "CUDA backend needs a GPU" in gpu["reason"]
    assert cpu["state"] == "done" and cpu["finished_trials"] == 2
    assert "CUDA backend needs a GPU" in done.stderr and "Traceback" not in done.stderr
    assert gpu["reason"] in done.stderr.replace("\n", "")  # shown as it is, [extras] too
    assert list(studies(tmp_path / "r")) == [cpu["study"]]  # nothing made for the failed one


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("trials = 2\ncolour = 1\n[matrix]\n", "colour: unknown key"),
        ("[matrix]\ndevices = ['cpu', 'tpu9']\n", "matrix.devices[1]: unknown device 'tpu9'"),
        ("[matrix]\nkernels = ['conv9']\n", "matrix.kernels[0]: unknown kernel 'conv9'"),
        ("[matrix]\nsizes = [64, 'big']\n", "matrix.sizes[1]: size 'big'"),
        ("[[study]]\nsizes = [{M = 8, N = 8}]\n", "study[0].sizes[0]: size {'M': 8, 'N': 8}"),
        ("transforms = ['warp-magic']\n[matrix]\n", "transforms[0]: unknown transformation"),
        ("[[study]]\ndtype = 'int3'\n", "study[0].dtype: dtype 'int3' is not offered by matmul"),
        ("[[study]]\nsizes = ['12x0']\n", "study[0].sizes[0]: size '12x0'"),
        ("[[study]]\ntrials = -1\n", "study[0].trials: must be at least 0"),
        ("[[study]]\npolish = 1\n", "study[0].polish: must be below 1"),
        ("sampler = 'annealing'\n[matrix]\n", "sampler: 'annealing' is not one of"),
        ("trials = '3'\n[matrix]\n", "trials: expected an integer"),
        ("[[study]]\ntransforms = ['warp-magic']\n", "study[0].transforms[0]: unknown "
                                                   "transformation 'warp-magic'"),
        ("[[study]]\nname = 'x'\n[[study]]\nname = 'x'\n", "study[1]: a second study named 'x'"),
        ("executor = 'slurm'\n[matrix]\n", "executor: 'slurm' is not available"),
        ("catalogs = ['nowhere']\n[matrix]\n", "catalogs[0]: folder 'nowhere' does not exist"),
        ("trials = 2\n", "no studies: add a [matrix] table or [[study]] entries"),
        ("[matrix\n", "not valid TOML"),
    ],
)
def test_bad_batch_file_names_file_and_key(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(UserError, match="^" + str(path)) as caught:
        load_batch(path)
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_device_of_a_backend_this_version_lacks_is_named(tmp_path):
    devices = tmp_path / "mine" / "devices"
    devices.mkdir(parents=True)
    (devices / "m3.toml").write_text('name = "m3"\ntitle = "Apple M3"\nbackend = "metal"\n'
                                     "memory_bandwidth_gbs = 100\n[peak_gflops]\n")
    path = write(tmp_path, f"catalogs = ['{tmp_path / 'mine'}']\n[[study]]\ndevice = 'm3'\n")
    with pytest.raises(UserError,
                       match="study\\[0\\].device: device 'm3' needs the 'metal' backend"):
        load_batch(path)


def test_bad_batch_file_is_one_line_exit_2_and_nothing_written(tmp_path):
    path = write(tmp_path, '[matrix]\ndtypes = ["float32", "float8"]\n')
    done = peak("batch", str(path), "--results", str(tmp_path / "r"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"peak-tune: error: {path}: matrix.dtypes[1]: dtype 'float8' is not "
        "offered by matmul (choose from float32, float64, float16, bfloat16)"]
    assert not (tmp_path / "r").exists()
    missing = peak("batch", str(tmp_path / "nope.toml"), "--results", str(tmp_path / "r"))
    assert missing.returncode == 2 and "nope.toml' does not exist" in missing.stderr
    assert not (tmp_path / "r").exists()


def test_example_batch_file_is_valid():
    plan = load_batch(Path(__file__).parent.parent / "examples" / "batch.toml")
    assert len(plan.studies) == 4
    assert {s.config.target.dtype for s in plan.studies} == {"float32", "float64"}
    assert all(s.config.target.device == "cpu" and s.exclusive for s in plan.studies)


@pytest.mark.slow
def test_ctrl_c_stops_the_batch_and_every_study_resumes(tmp_path):
    path = write(tmp_path, TWO_STUDIES.format(trials=400))
    results = tmp_path / "r"
    proc = subprocess.Popen([sys.executable, "-m", "peak_tune.cli", "batch", str(path),
                             "--results", str(results), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not sum(map(len, _quiet_studies(results))):
        time.sleep(1)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    data = json.loads(stdout.strip().splitlines()[-1])
    assert data["interrupted"] and [s["state"] for s in data["studies"]] == ["stopped"] * 2
    first = studies(results)[NAMES[0]]
    assert first and all(t.state.is_finished() for t in first)
    resumed = peak("batch", str(write(tmp_path, TWO_STUDIES.format(trials=len(first) + 1),
                                      "again.toml")), "--results", str(results), "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert [s["new_trials"] for s in last_json(resumed.stdout)["studies"]] == [1, len(first) + 1]


def _quiet_studies(results: Path) -> list[list[optuna.trial.FrozenTrial]]:
    """The studies' trials so far; none while the database is being made."""
    try:
        return list(studies(results).values())
    except Exception:
        return []


def test_parallel_never_overlaps_cpu_timed_studies_or_one_device():
    from peak_tune.batch.run import StudyProgress, _fits
    from peak_tune.session.config import TuneConfig

    def item(device: str, backend: str) -> StudyProgress:
        return StudyProgress(BatchStudy(device, TuneConfig.of(device=device, backend=backend), 1))

    cpu, h200, h100 = item("cpu", "c"), item("h200", "cuda"), item("h100", "cuda")
    assert _fits(cpu, []) and _fits(h200, [])
    assert not _fits(cpu, [h200])  # a compiler or driver beside it disturbs CPU timing
    assert not _fits(h200, [cpu])
    assert not _fits(item("h200", "cuda"), [h200])  # one study per device
    assert _fits(h100, [h200])


RAY_STUDIES = """
name = "r"
executor = "ray"
trials = 5
[matrix]
devices = ["h200"]
dtypes = ["float32", "float16", "bfloat16"]
sizes = ["4096"]
[[study]]
device = "h100"
dtype = "float16"
sizes = ["4096"]
ray_workers = 3
"""


def test_parallel_ray_studies_share_their_kinds_devices(tmp_path):
    """`--parallel 2` on Ray: the three H200 studies take half of the node's four H200s
    each, so two run at once and the third waits; the H100 study keeps the share its
    entry asked for."""
    from peak_tune.batch.devices import share_devices
    from peak_tune.batch.run import StudyProgress, _fits

    plan = load_batch(write(tmp_path, RAY_STUDIES), tmp_path / "results")
    counts = {"h200": 4, "h100": 8}
    shared, devices = share_devices(plan, 2, lambda s: counts[s.config.target.device])
    assert devices == counts
    workers = {s.name: s.config.run.ray_workers for s in shared.studies}
    assert workers == {"r-matmul-h200-float32-4096x4096x4096": 2,
                       "r-matmul-h200-float16-4096x4096x4096": 2,
                       "r-matmul-h200-bfloat16-4096x4096x4096": 2,
                       "r-matmul-h100-float16-4096x4096x4096": 3}
    fp32, fp16, bf16, h100 = (StudyProgress(s) for s in shared.studies)
    assert _fits(fp16, [fp32], devices)
    assert not _fits(bf16, [fp32, fp16], devices)  # all four H200s are held
    assert _fits(h100, [fp32, fp16], devices)
    # one at a time, or nothing on Ray: the plan is left as it was
    assert share_devices(plan, 1, lambda s: 4) == (plan, {})
    assert [s.config.run.ray_workers for s in plan.studies] == [0, 0, 0, 3]
    # a study that asks for more than its kind has holds all of them
    greedy = dataclasses.replace(h100.study, config=h100.study.config.with_options(
        ray_workers=20))
    assert not _fits(StudyProgress(greedy), [h100], devices)
    assert _fits(StudyProgress(greedy), [fp32], devices)


def test_shares_never_drop_below_one_device(tmp_path):
    plan = load_batch(write(tmp_path, RAY_STUDIES), tmp_path / "results")
    from peak_tune.batch.devices import share_devices

    shared, devices = share_devices(plan, 3, lambda s: 2)
    assert devices == {"h200": 2, "h100": 2}
    assert [s.config.run.ray_workers for s in shared.studies] == [1, 1, 1, 3]


def test_ray_workers_in_a_batch_file_is_checked(tmp_path):
    bad = RAY_STUDIES.replace("ray_workers = 3", "ray_workers = 0")
    with pytest.raises(UserError, match=r"study\[0\].ray_workers: must be at least 1"):
        load_batch(write(tmp_path, bad), tmp_path / "results")


@pytest.mark.ray
def test_parallel_ray_batch_counts_the_clusters_devices_and_names_what_is_missing(tmp_path):
    """`peak-tune batch --parallel 2` with executor = "ray" (refused before studies could
    share a cluster): the batch starts a local Ray to count the H200s, and on a machine
    without one each study fails with its reason while the batch ends, exit status 1."""
    pytest.importorskip("ray")
    if not _gpu_missing():
        pytest.skip("this machine has a GPU: the studies would run")
    path = write(tmp_path, RAY_STUDIES.split("[[study]]")[0].replace(', "bfloat16"', ""))
    done = peak("batch", str(path), "--parallel", "2", "--results", str(tmp_path / "r"),
                "--json", env={"RAY_AUTH_MODE": "disabled"})
    assert done.returncode == 1, done.stderr
    summary = last_json(done.stdout)
    assert [s["state"] for s in summary["studies"]] == ["failed", "failed"]
    assert all("CUDA backend needs a GPU" in s["reason"] for s in summary["studies"])


def test_in_flight_in_a_batch_file_reaches_each_study(tmp_path):
    plan = load_batch(write(tmp_path, TWO_STUDIES.format(trials=3)), tmp_path / "results")
    assert [s.config.run.in_flight for s in plan.studies] == [0, 0]
    text = TWO_STUDIES.format(trials=3).replace("repeats = 3", "repeats = 3\nin_flight = 40")
    plan = load_batch(write(tmp_path, text), tmp_path / "results")
    assert [s.config.run.in_flight for s in plan.studies] == [40, 40]
    with pytest.raises(UserError, match="in_flight: must be at least 0"):
        load_batch(write(tmp_path, text.replace("40", "-2")), tmp_path / "results")


def test_a_study_whose_devices_cannot_be_counted_fails_alone(tmp_path):
    """Counting a kind's devices resolves a study's target; one that cannot be resolved
    (too large for this host's memory) used to end the whole batch at its start. Now it
    claims one device and fails on its own line while the others share their devices."""
    from peak_tune.batch.devices import kind_of, share_devices
    from peak_tune.batch.run import StudyProgress, _fits

    plan = load_batch(write(tmp_path, RAY_STUDIES), tmp_path / "results")

    def count(study):
        if study.config.target.dtype == "float32":
            raise UserError("the problem needs 400 GB of host memory; this machine has 125")
        return 4

    shared, devices = share_devices(plan, 2, count)
    assert devices == {"h200": 4, "h100": 4}
    workers = {f"{s.config.target.dtype}-{kind_of(s)}": s.config.run.ray_workers
               for s in shared.studies}
    assert workers == {"float32-h200": 1, "float16-h200": 2, "bfloat16-h200": 2,
                       "float16-h100": 3}
    fp32, fp16, bf16, _ = (StudyProgress(s) for s in shared.studies)
    assert _fits(fp32, [fp16], devices) and not _fits(bf16, [fp32, fp16], devices)
