"""The `peak-tune` command as a user runs it: real C backend, real study, real cache."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from peak_tune.catalog.resolve import Catalog

SMALL = ["--size", "64", "--repeats", "3"]


def peak(*args: str, env: dict[str, str] | None = None, timeout: float = 300
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "peak_tune.cli", *args], capture_output=True, text=True,
        timeout=timeout, env={**os.environ, **(env or {})},
    )


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


TUNED_TABLE: list[str] = []  # the tuned run's summary table (stderr, beside --json)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    results = tmp_path_factory.mktemp("results")
    done = peak("--trials", "8", *SMALL, "--seed", "4", "--json", "--results", str(results))
    assert done.returncode == 0, done.stderr
    TUNED_TABLE[:] = [done.stderr]
    return results, last_json(done.stdout)


def test_tune_json_summary(tuned):
    _, data = tuned
    assert data["best"]["gflops"] > 0
    assert isinstance(data["best"]["sequence"], list)
    assert len(data["best"]["context_hash"]) == 64
    assert data["vendor"]["name"].startswith("numpy") and data["vendor"]["gflops"] > 0
    assert data["ratio"] == pytest.approx(data["best"]["gflops"] / data["vendor"]["gflops"])
    trials = data["trials"]
    assert trials["complete"] + trials["pruned"] + trials["failed"] == trials["total"] == 8
    assert data["cache"]["compiles"] >= 1
    catalog = Catalog.with_user_folders()
    introduced = {p.name for tid in data["best"]["sequence"]
                  for p in catalog.transformation(tid).params}
    assert set(data["best"]["params"]) == introduced


def test_the_summary_says_where_the_runs_time_went(tuned):
    """The C backend builds and times one trial at a time: the window holds one job, on
    average split between its build and its timing, and the device's busy share is the
    seconds its jobs spent on it."""
    _, data = tuned
    time_went = data["time"]
    assert time_went["in_flight"] == 1
    assert 0 < time_went["run_s"] <= data["seconds"]
    jobs = time_went["mean_jobs"]
    assert 0.3 < jobs["building"] + jobs["on_device"] + jobs["device_queue"] <= 1.01
    assert jobs["on_device"] == pytest.approx(time_went["device_busy_fraction"]["local"],
                                              abs=0.011)
    assert time_went["builds"]["count"] == data["cache"]["compiles"]
    assert set(time_went["driver_loop_s"]) == {"asking", "waiting", "telling"}
    words = " ".join(TUNED_TABLE[0].replace("│", " ").split())  # the table's cells unwrapped
    assert "where it went" in words and "waiting for a build worker" in words


def test_study_opens_with_optuna(tuned):
    results, data = tuned
    study = optuna.load_study(study_name=data["study"], storage=f"sqlite:///{results}/peak.db")
    assert len(study.trials) == 8
    best = max((t for t in study.trials if t.values), key=lambda t: t.values[0])
    assert best.user_attrs["context_hash"] == data["best"]["context_hash"]
    assert {t.user_attrs["status"] for t in study.trials} <= {
        "ok", "invalid", "compile_error", "wrong_result", "crash", "timeout", "apply_error"}
    assert study.trials[0].user_attrs["sequence"] == []  # the seed is always measured


def test_same_command_again_compiles_nothing(tmp_path):
    args = ["--trials", "5", *SMALL, "--json", "--results", str(tmp_path)]
    first = last_json(peak(*args).stdout)
    again = peak(*args)
    assert again.returncode == 0, again.stderr
    second = last_json(again.stdout)
    assert second["study"] != first["study"]  # a new study, the same points
    assert second["cache"]["compiles"] == 0
    assert second["cache"]["hits"] > 0
    assert second["best"]["context_hash"] == first["best"]["context_hash"]
    if first["confirmation"]["status"] == "confirmed":  # a noisy re-timing is not cached
        assert second["confirmation"]["source"] == "cache"
        assert second["best"]["gflops"] == first["best"]["gflops"]


def test_study_resumes_by_name_and_trials_count_the_study_in_all(tmp_path):
    """--trials is the study's count in all, as in batch files: the same command again
    runs nothing more, a larger count only the difference."""
    args = [*SMALL, "--json", "--results", str(tmp_path)]
    first = last_json(peak("--trials", "3", *args).stdout)
    again = peak("--trials", "3", *args, "--study", first["study"])
    assert again.returncode == 0, again.stderr
    assert last_json(again.stdout)["trials"]["total"] == 3
    assert last_json(again.stdout)["this_run"]["trials"] == 0
    assert "holds 3 finished trials; --trials 3 asks for no more" in again.stderr
    resumed = peak("--trials", "5", *args, "--study", first["study"])
    assert resumed.returncode == 0, resumed.stderr
    data = last_json(resumed.stdout)
    assert data["study"] == first["study"] and data["trials"]["total"] == 5
    this_run = data["this_run"]  # what the summary heard from the run's events
    assert this_run["trials"] == sum(this_run["by_outcome"].values()) == 2
    assert first["this_run"]["trials"] == 3 and first["this_run"]["new_bests"] >= 1
    assert "holds 3 finished trials; running 2 more for --trials 5" in resumed.stderr


def test_show_export_and_cache_stats(tuned, tmp_path):
    results, data = tuned
    shown = peak("show", "--results", str(results))
    assert shown.returncode == 0, shown.stderr
    assert data["best"]["context_hash"] in shown.stdout and "lineage" in shown.stdout
    out = tmp_path / "best.c"
    exported = peak("export", "--results", str(results), "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    text = out.read_text()
    assert "Exported by peak-tune" in text and data["best"]["context_hash"] in text
    for name, value in data["best"]["params"].items():
        assert f"#define {name} {value}" in text
    stats = peak("cache", "stats", "--json", "--results", str(results))
    assert json.loads(stats.stdout)["evaluations"]["entries"] >= 1


def test_show_and_export_pass_over_a_best_the_sanitizer_rejected(tmp_path):
    """A trial compute-sanitizer rejected (--sanitize: the study keeps its stored number)
    is no best for `show` and `export` either, as for the run's own summary."""
    data = last_json(peak(*SMALL, "--trials", "6", "--json", "--results", str(tmp_path)).stdout)
    storage = f"sqlite:///{tmp_path}/peak.db"
    study = optuna.load_study(study_name=data["study"], storage=storage)
    ranked = sorted((t for t in study.trials if t.values), key=lambda t: -t.values[0])
    assert len({t.values[0] for t in ranked[:2]}) == 2  # the runner-up is another trial
    shown = peak("show", "--results", str(tmp_path))
    assert f"(trial {ranked[0].number})" in shown.stdout
    study.set_user_attr("sanitizer_rejected", [ranked[0].number])
    shown = peak("show", "--results", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert f"(trial {ranked[1].number})" in shown.stdout
    out = tmp_path / "best.c"
    assert peak("export", "--results", str(tmp_path), "-o", str(out)).returncode == 0
    assert f"trial {ranked[1].number}," in out.read_text()


def test_exported_kernel_compiles_standalone(tuned, tmp_path):
    results, _ = tuned
    out = tmp_path / "best.c"
    peak("export", "--results", str(results), "-o", str(out))
    for flags in (["-O2", "-fopenmp"], []):  # as it is: its element type is in it
        built = subprocess.run(["gcc", *flags, "-c", str(out), "-o", str(tmp_path / "best.o")],
                               capture_output=True, text=True)
        assert built.returncode == 0, built.stderr


def test_catalog_listings():
    listed = peak("transforms", "list")
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) >= 10
    shown = peak("transforms", "show", "cache-blocking")
    assert "## Pass 1" in shown.stdout and "MC" in shown.stdout
    assert "element types any" in shown.stdout
    tensor = peak("transforms", "show", "tensor-core")
    assert "element types float16, bfloat16" in tensor.stdout
    devices = peak("devices")
    rows = {line.split()[0]: line for line in devices.stdout.splitlines()}
    assert "tuned on the device" in rows["h200"]
    assert "built for it, never run on it" in rows["mi250"]
    assert "profile only, never built or run" in rows["adreno-x1-85"]


def test_a_mistaken_option_is_one_line_not_the_usage(tmp_path):
    done = peak("--size", "abc", "--results", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "peak-tune tune: error: argument --size: size 'abc': use N, AxBx... (in the kernel's "
        "order) or NAME=V,NAME=V,... with positive integers (see peak-tune tune --help)"]


def test_no_trial_is_no_ratio_and_no_trial_number(tmp_path):
    done = peak("--trials", "0", "--size", "32", "--results", str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    data = last_json(done.stdout)
    assert data["ratio"] is None and data["search_ratio"] is None
    assert data["peak"]["ratio"] is None and data["best"]["trial"] is None
    shown = peak("--trials", "0", "--size", "32", "--results", str(tmp_path))
    table = shown.stdout + shown.stderr
    assert "trial None" not in table and "0.000x" not in table
    assert "no finished trial" in table


def test_a_broken_spec_of_another_kernel_in_a_catalog_is_named(tmp_path):
    broken = tmp_path / "cat" / "seeds" / "softmax"
    broken.mkdir(parents=True)
    (broken / "spec.toml").write_text("name = 'softmax'\nthis is not toml\n")
    done = peak("--trials", "1", "--size", "32", "--results", str(tmp_path),
                "--catalog", str(tmp_path / "cat"))
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("peak-tune: error: ") and str(broken / "spec.toml") in line


BROKEN = """---
id: broken-step
version: 1
title: Broken
kernels: [matmul]
backends: [c]
params:
  TILE: [8, "sixteen"]
passes:
  - region: device
---
## Pass 1: device
Text.
"""


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--sequence", "no-such-step"], "unknown transformation 'no-such-step'"),
        (["--backend", "cuda", "--device", "h200", "--sequence", "refactor,tb-tiling,wgmma"],
         "transformation 'wgmma' does not apply to float32 (it is for bfloat16, float16)"),
        (["--device", "tpu9"], "unknown device 'tpu9'"),
        (["--kernel", "conv9"], "unknown kernel 'conv9'"),
        (["--backend", "cobol"], "unknown backend 'cobol'"),
        (["--dtype", "int3"], "dtype 'int3'"),
        (["--size", "0"], "size '0'"),
        (["--sanitize"], "--sanitize is not available on the c backend"),
        (["--profile"], "--profile is not available on the c backend"),
        (["--device", "mi250"], "no AMD GPU of the mi250 kind (gfx90a) is visible here"),
        (["--device", "adreno-x1-85"], "no Vulkan device of the adreno-x1-85 kind"),
        (["--device", "h200"], "CUDA backend needs a GPU"),
        (["--backend", "cuda"], "--backend cuda needs --device"),
        (["--sampler", "gp"], "the gp sampler needs PyTorch"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, expected):
    done = peak("--trials", "1", "--results", str(tmp_path), *args)
    assert done.returncode == 2
    assert expected in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--storage", "foo://x"], "'foo://x' names an unknown kind of database 'foo'"),
        (["--storage", "notaurl"], "'notaurl' is not a database URL"),
        (["--sequence", "pack-a"], "--sequence pack-a: pack-a requires cache-blocking before it"),
        (["--repeats", "0"], "--repeats must be 1 or more"),
        (["--timeout", "0"], "--timeout must be a number of seconds above 0"),
        (["--timeout", "0.01"], "the vendor baseline did not finish within --timeout 0.01 s"),
    ],
)
def test_bad_options_are_one_line_on_stderr_and_exit_2(tmp_path, args, expected):
    done = peak("--trials", "1", "--results", str(tmp_path), *args)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()  # one line, no traceback
    assert line.startswith("peak-tune: error: ") and expected in line


def test_a_size_too_large_for_this_machine_says_what_it_needs_and_what_it_has(tmp_path):
    done = peak("--trials", "1", "--results", str(tmp_path), "--size", "100000")
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert re.fullmatch(r"peak-tune: error: size 100000x100000x100000 needs at least 120\.0 GB "
                        r"of host memory for its buffers \(A, B, C in float32\), and this "
                        r"machine has [0-9.]+ GB: choose a smaller --size", line), line


def test_broken_catalog_file_names_file_and_field(tmp_path):
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "broken-step.md").write_text(BROKEN)
    done = peak("--trials", "1", "--results", str(tmp_path / "r"), "--catalog",
                str(tmp_path / "cat"))
    assert done.returncode == 2
    assert "broken-step.md: params.TILE[1]: expected int" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_unwritable_results_and_missing_compiler(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = peak("--trials", "1", "--results", str(blocker / "sub"))
    assert done.returncode == 2 and "not writable" in done.stderr
    done = peak("--trials", "1", "--results", str(tmp_path / "r"),
                env={"CC": "/nonexistent/cc"})
    assert done.returncode == 2 and "/nonexistent/cc" in done.stderr
    assert "Traceback" not in done.stderr


def test_broken_study_data_is_kept_after_bad_input(tuned):
    results, data = tuned
    peak("--trials", "1", "--results", str(results), "--device", "tpu9")
    study = optuna.load_study(study_name=data["study"], storage=f"sqlite:///{results}/peak.db")
    assert len(study.trials) >= 8


def start_a_long_run(results: Path, own_group: bool = False
                     ) -> tuple[subprocess.Popen[str], str]:
    """A 400-trial run (in a process group of its own, as at a terminal, if `own_group`)
    and its storage, once it has 4 trials there."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "peak_tune.cli", "--trials", "400", *SMALL, "--json",
         "--results", str(results)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=own_group,
    )
    storage = f"sqlite:///{results}/peak.db"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(1)
        try:
            studies = optuna.get_all_study_summaries(storage)
        except Exception:  # the database may not exist yet
            continue
        if studies and studies[0].n_trials >= 4:
            break
    return proc, storage


@pytest.mark.slow
def test_ctrl_c_keeps_finished_trials(tmp_path):
    proc, storage = start_a_long_run(tmp_path)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    study = optuna.load_study(study_name=last_json(stdout)["study"], storage=storage)
    states = {t.state for t in study.trials}
    assert optuna.trial.TrialState.RUNNING not in states
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials) >= 3


@pytest.mark.slow
def test_ctrl_c_at_a_terminal_leaves_the_study_writer_alone(tmp_path):
    """A terminal sends Ctrl-C to the whole foreground process group: the driver's
    helper processes must not die of it before the driver has written its trials."""
    proc, storage = start_a_long_run(tmp_path, own_group=True)
    os.killpg(proc.pid, signal.SIGINT)  # the driver and every process of its group
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "ended unexpectedly" not in stderr
    study = optuna.load_study(study_name=last_json(stdout)["study"], storage=storage)
    assert last_json(stdout)["trials"]["total"] == len(study.trials)


def test_user_catalog_adds_a_device_profile(tmp_path):
    devices = tmp_path / "cat" / "devices"
    devices.mkdir(parents=True)
    (devices / "my-laptop.toml").write_text(
        'name = "my-laptop"\ntitle = "My laptop"\nbackend = "c"\nmemory_bandwidth_gbs = 50\n'
        "[peak_gflops]\nfloat32 = 0\n")
    listed = peak("devices", "--catalog", str(tmp_path / "cat"))
    assert "my-laptop" in listed.stdout
    done = peak("--trials", "2", *SMALL, "--json", "--device", "my-laptop", "--catalog",
                str(tmp_path / "cat"), "--results", str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr
    assert last_json(done.stdout)["device"] == "my-laptop"


def test_a_new_study_starts_from_the_best_of_another(tmp_path):
    """--warm-start: after the seed, the new study (another size) first runs the best
    trials of the given study, best first; an unknown study is one line and exit 2."""
    base = ["--repeats", "3", "--json", "--results", str(tmp_path)]
    small = peak("--study", "small", "--size", "64", "--trials", "10", *base)
    assert small.returncode == 0, small.stderr
    larger = peak("--study", "larger", "--size", "96", "--trials", "4", "--warm-start",
                  "small", "--warm-start-top", "2", "--no-branch-start", *base)
    assert larger.returncode == 0, larger.stderr
    storage = f"sqlite:///{tmp_path}/peak.db"
    source = optuna.load_study(study_name="small", storage=storage)
    ranked = sorted((t for t in source.trials if t.values), key=lambda t: -t.values[0])
    started = optuna.load_study(study_name="larger", storage=storage).trials
    warm = [t for t in started if "warm_start_from" in t.user_attrs]
    assert [t.number for t in warm] == [1, 2]  # right after the seed
    assert warm[0].user_attrs["warm_start_from"] == f"small#{ranked[0].number}"
    assert warm[0].params == ranked[0].params
    assert warm[0].user_attrs["sequence"] == ranked[0].user_attrs["sequence"]
    assert warm[1].params != warm[0].params
    missing = peak("--size", "96", "--trials", "1", "--warm-start", "nope", *base)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"peak-tune: error: --warm-start nope: no such study in sqlite:///{tmp_path}/peak.db"]
    none = peak("--size", "96", "--trials", "1", "--warm-start", "small", "--warm-start-top",
                "0", *base)
    assert none.returncode == 2
    assert none.stderr.strip().splitlines() == [
        "peak-tune: error: --warm-start-top must be 1 or more"]
    assert sorted(optuna.get_all_study_names(storage)) == ["larger", "small"]  # none made


def test_a_study_of_another_size_is_one_line_and_left_as_it_was(tmp_path):
    base = ["--study", "s", "--repeats", "3", "--json", "--results", str(tmp_path)]
    made = peak("--size", "64", "--trials", "2", *base)
    assert made.returncode == 0, made.stderr
    other = peak("--size", "96", "--trials", "2", *base)
    assert other.returncode == 2
    (line,) = other.stderr.strip().splitlines()
    assert line.startswith("peak-tune: error: study 's' was made for ") and "64x64x64" in line
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/peak.db")
    assert len([t for t in study.trials if t.state.is_finished()]) == 2


BMM = Path(__file__).parent / "fixtures" / "catalogs" / "bmm"


@pytest.mark.parametrize("size", ["BATCH=2,M=24,N=16,K=8", "2x24x16x8"])
def test_a_users_batched_kernel_tunes_with_its_own_sizes(tmp_path, size):
    done = peak("--kernel", "bmm", "--catalog", str(BMM), "--size", size, "--trials", "2",
                "--json", "--results", str(tmp_path))
    assert done.returncode == 0, done.stderr
    data = last_json(done.stdout)
    assert data["sizes"] == ["2x24x16x8"] and data["trials"]["by_outcome"]["ok"] >= 1


def test_a_size_that_misses_a_kernels_name_says_which_it_has(tmp_path):
    done = peak("--kernel", "bmm", "--catalog", str(BMM), "--size", "M=24,N=16,K=8",
                "--trials", "1", "--results", str(tmp_path))
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line == ("peak-tune: error: size 'M=24,N=16,K=8' names K, M, N; this kernel's "
                    "sizes are BATCH, M, N, K")


SOFTMAX = Path(__file__).parent / "fixtures" / "catalogs" / "softmax"


def edited_softmax(tmp_path: Path, name: str, old: str, new: str) -> Path:
    """A copy of the softmax catalog whose seeds/softmax/`name` has `old` made `new`."""
    catalog = tmp_path / "cat"
    shutil.copytree(SOFTMAX, catalog)
    edited = catalog / "seeds" / "softmax" / name
    edited.write_text(edited.read_text().replace(old, new))
    return catalog


def test_a_users_softmax_tunes_against_its_reduction_reference(tmp_path):
    done = peak("--kernel", "softmax", "--catalog", str(SOFTMAX), "--size", "32x100",
                "--trials", "2", "--json", "--results", str(tmp_path))
    assert done.returncode == 0, done.stderr
    data = last_json(done.stdout)
    assert data["trials"]["by_outcome"]["ok"] == data["trials"]["total"] >= 1
    assert data["vendor"]["name"] == "numpy (reference expression in float32)"


def test_a_softmax_without_a_vendor_is_measured_against_the_memory_roofline(tmp_path):
    """[vendor] c = "none": no numpy baseline; a softmax moves 8 bytes per 5 flops, so
    the ratio is to the CPU's bandwidth share of its peak, and the summary says so."""
    catalog = edited_softmax(tmp_path, "spec.toml", 'c = "reference"', 'c = "none"')
    done = peak("--kernel", "softmax", "--catalog", str(catalog), "--size", "32x100",
                "--trials", "1", "--json", "--results", str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr
    data = last_json(done.stdout)
    assert data["vendor"]["library"] is False and data["ratio_to"] == "peak"
    assert data["peak"]["bound"] == "memory"
    # the CPU profile's 20 GB/s at 5 flops per 8 bytes, below its compute peak
    assert data["peak"]["gflops"] == pytest.approx(20 * 5 / 8)
    assert data["peak"]["documented_gflops"] > data["peak"]["gflops"]
    assert data["ratio"] == pytest.approx(data["best"]["gflops"] / data["peak"]["gflops"])
    shown = peak("--kernel", "softmax", "--catalog", str(catalog), "--size", "32x100",
                 "--trials", "0", "--results", str(tmp_path / "r"))
    assert "bound by memory bandwidth" in shown.stdout, shown.stdout


MATMUL_BT = Path(__file__).parent / "fixtures" / "catalogs" / "matmul_bt"


@pytest.mark.parametrize(("catalog", "kernel", "size", "vendor"), [
    (MATMUL_BT, "matmul_bt", "40x24x56", "numpy matmul with B transposed ("),
    (BMM, "bmm", "2x24x16x8", "numpy ("),
])
def test_a_users_gemm_kernel_is_timed_against_the_blas_call_it_declares(
        tmp_path, catalog, kernel, size, vendor):
    done = peak("--kernel", kernel, "--catalog", str(catalog), "--size", size, "--trials",
                "2", "--json", "--results", str(tmp_path))
    assert done.returncode == 0, done.stderr
    data = last_json(done.stdout)
    assert data["vendor"]["name"].startswith(vendor) and "reference" not in data["vendor"]["name"]
    assert data["ratio_to"] == "vendor" and data["trials"]["by_outcome"]["ok"] >= 1


def test_a_softmax_that_forgets_to_normalise_is_a_wrong_result(tmp_path):
    catalog = edited_softmax(tmp_path, "naive.c", "y[c] /= total", "y[c] /= 1")
    done = peak("--kernel", "softmax", "--catalog", str(catalog), "--size", "32x100",
                "--trials", "1", "--json", "--results", str(tmp_path / "r"))
    data = last_json(done.stdout)
    assert data["trials"]["by_outcome"]["wrong result"] == 1, done.stderr
