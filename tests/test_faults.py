"""Faults of the machine, not of the kernel: a full disk, a killed or starved compiler, a
database that is not one, folders deleted under a running tuner. Each is reproduced for
real (a small tmpfs where this machine lets root mount one, a real gcc killed or limited)
and must end in one line, lose no stored trial, and leave nothing cached as the kernel's.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from peak_tune.backends._compiler import run_compiler
from peak_tune.backends.c import COMPILE_TIMEOUT_S, FLAGS
from peak_tune.core import Outcome, Status
from peak_tune.errors import (
    COMPILER_KILLED,
    DISK_FULL,
    FILE_SIZE_LIMIT,
    OUT_OF_MEMORY,
    BuildOverBudget,
    CompileError,
    EnvironmentFault,
)
from peak_tune.evaluation.cache import Cache

SMALL = ["--size", "64", "--repeats", "3"]
TRIAL_LINE = re.compile(r"^\[\s*\d+/\d+\] trial (\d+)\b")


def peak(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "peak_tune.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "peak_tune.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stored_trials(url: str) -> list[optuna.trial.FrozenTrial]:
    try:
        summaries = optuna.get_all_study_summaries(url)
    except Exception:  # not created yet
        return []
    if not summaries:
        return []
    return optuna.load_study(study_name=summaries[0].study_name, storage=url).trials


def wait_for_trials(url: str, proc: subprocess.Popen[str], count: int) -> None:
    deadline = time.monotonic() + 180
    while len(stored_trials(url)) < count:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the run stored too few trials"
        time.sleep(0.5)


def told(trials: list[optuna.trial.FrozenTrial]) -> list[int]:
    """The trials that ran to their end (not those the run stopped in)."""
    return [t.number for t in trials if t.user_attrs.get("status") != "interrupted"]


def shown_trials(stderr: str) -> list[int]:
    return [int(m.group(1)) for line in stderr.splitlines() if (m := TRIAL_LINE.match(line))]


def one_error_line(stderr: str) -> str:
    """The one line the run ended with; no traceback, nothing else said."""
    assert "Traceback" not in stderr, stderr
    said = [line for line in stderr.splitlines() if line.startswith("peak-tune:")]
    assert len(said) == 1, stderr
    assert stderr.strip().splitlines()[-1] == said[0]
    return said[0]


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs: a real filesystem to fill up."""
    folder = tmp_path / "small-disk"
    folder.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a full disk needs a tmpfs, and mounting one needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(reason=f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(disk: Path, leave_bytes: int = 0) -> None:
    """Fill `disk` until at most `leave_bytes` are free (none: until a write fails)."""
    stat = os.statvfs(disk)
    free = stat.f_bavail * stat.f_frsize
    fd = os.open(disk / f"filler-{time.monotonic_ns()}", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"\0" * max(0, free - leave_bytes))
        while not leave_bytes:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


# ----------------------------------------------------------------------- a full disk

@pytest.mark.slow
def test_a_full_disk_under_the_storage_stops_with_one_line_and_every_shown_trial_stored(
        tmpfs: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmpfs}/peak.db"
    proc = start("--trials", "300", *SMALL, "--results", str(tmp_path / "r"),
                 "--storage", url)
    wait_for_trials(url, proc, 3)
    fill(tmpfs)
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 1, stderr
    line = one_error_line(stderr)
    assert line.startswith("peak-tune: disk full: ") and str(tmpfs) in line
    stored = stored_trials(url)
    assert len(stored) >= 3
    assert shown_trials(stderr) == [t.number for t in stored], stderr  # shown is stored


@pytest.mark.slow
def test_a_full_disk_under_the_builds_stops_the_run_and_caches_no_compile_error(
        tmpfs: Path, tmp_path: Path) -> None:
    results, url = tmpfs / "r", f"sqlite:///{tmp_path}/peak.db"
    proc = start("--trials", "300", *SMALL, "--results", str(results), "--storage", url)
    wait_for_trials(url, proc, 2)
    fill(tmpfs)
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 1, stderr
    assert one_error_line(stderr).startswith("peak-tune: disk full: ")
    stored = stored_trials(url)
    assert shown_trials(stderr) == told(stored)
    assert "compile_error" not in {t.user_attrs.get("status") for t in stored}
    cached = [p.read_text() for p in (results / "cache" / "evaluations").rglob("*.json")]
    assert not [text for text in cached if "space" in text.lower()]


def test_a_linker_out_of_space_is_disk_full_not_the_kernels_compile_error(
        tmpfs: Path) -> None:
    source = tmpfs / "kernel.c"
    source.write_text(Path("seeds/matmul/naive.c").read_text())
    fill(tmpfs, leave_bytes=4096)  # the source is written; the library does not fit
    command = [shutil.which("gcc") or "gcc", *FLAGS, "-DDTYPE=float", "-o",
               str(tmpfs / "kernel.so"), str(source)]
    with pytest.raises(EnvironmentFault) as caught:
        run_compiler(command, hang_limit_s=COMPILE_TIMEOUT_S)
    assert caught.value.kind == DISK_FULL
    assert "No space left on device" in str(caught.value)


def test_a_cache_entry_on_a_full_disk_is_disk_full_and_the_cache_stays_readable(
        tmpfs: Path) -> None:
    cache = Cache(tmpfs / "cache")
    cache.put_evaluation("a" * 64, Outcome(Status.OK, message="kept"))
    fill(tmpfs)
    with pytest.raises(EnvironmentFault, match="disk full: writing the cache entry"):
        cache.put_evaluation("b" * 64, Outcome(Status.COMPILE_ERROR, message="x" * 10000))
    assert cache.get_evaluation("b" * 64) is None  # no half-written entry
    kept = cache.get_evaluation("a" * 64)
    assert kept is not None and kept.message == "kept"


# ------------------------------------------------------------------ the compiler

def heavy_source(folder: Path, lines: int = 2500) -> Path:
    """C that keeps cc1 busy for seconds at -O3."""
    body = [f"  s += a[{i % 97}] * {i}.0f + s * a[{i * 7 % 89}];" for i in range(lines)]
    path = folder / f"heavy-{time.monotonic_ns()}.c"
    path.write_text("float f(float *a) {\n  float s = 0;\n" + "\n".join(body)
                    + "\n  return s;\n}\n")
    return path


def processes_naming(text: str) -> list[int]:
    """Processes whose command line names `text` (the compiler's children)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_text():
                found.append(int(entry.name))
        except OSError:
            pass
    return [pid for pid in found if pid != os.getpid()]


def end_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def gcc(*words: str) -> list[str]:
    return [shutil.which("gcc") or "gcc", "-O3", "-fPIC", "-shared", *words]


def test_a_build_past_its_time_limit_is_ended_with_its_whole_process_tree(
        tmp_path: Path) -> None:
    source = heavy_source(tmp_path, lines=10000)  # cc1 would run for a minute
    try:
        with pytest.raises(BuildOverBudget):
            run_compiler(gcc("-o", str(tmp_path / "heavy.so"), str(source)),
                         time_limit_s=2.0, hang_limit_s=COMPILE_TIMEOUT_S)
        deadline = time.monotonic() + 5
        while processes_naming(str(source)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_naming(str(source)) == []  # no cc1 left running
    finally:
        end_all(processes_naming(str(source)))


def test_a_compiler_killed_from_outside_is_the_machines_fault(tmp_path: Path) -> None:
    source = heavy_source(tmp_path)
    caught: list[BaseException] = []

    def build() -> None:
        try:
            run_compiler(gcc("-o", str(tmp_path / "heavy.so"), str(source)),
                         hang_limit_s=COMPILE_TIMEOUT_S)
        except BaseException as exc:  # noqa: BLE001 - looked at below
            caught.append(exc)

    builder = threading.Thread(target=build)
    builder.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            cc1 = [pid for pid in processes_naming(str(source))
                   if Path(f"/proc/{pid}/comm").read_text().strip() == "cc1"]
            if cc1:
                time.sleep(0.3)
                end_all(cc1)  # as the out-of-memory killer does
                break
            time.sleep(0.05)
        builder.join(timeout=60)
    finally:
        end_all(processes_naming(str(source)))
    assert len(caught) == 1 and isinstance(caught[0], EnvironmentFault), caught
    assert caught[0].kind == COMPILER_KILLED
    assert not isinstance(caught[0], CompileError)


def test_a_compiler_out_of_memory_is_the_machines_fault(tmp_path: Path) -> None:
    source = heavy_source(tmp_path)
    limited = ["sh", "-c", 'ulimit -v 80000 && exec "$0" "$@"',  # 80 MB: cc1 starts, then
               *gcc("-o", str(tmp_path / "heavy.so"), str(source))]
    with pytest.raises(EnvironmentFault) as caught:
        run_compiler(limited, hang_limit_s=COMPILE_TIMEOUT_S)
    assert caught.value.kind == OUT_OF_MEMORY
    own = tmp_path / "k.c"  # a kernel's own words that read like a fault stay its own
    own.write_text("#error virtual memory exhausted: No space left on device\n")
    with pytest.raises(CompileError) as kernels:
        run_compiler(gcc("-o", str(tmp_path / "k.so"), str(own)),
                     hang_limit_s=COMPILE_TIMEOUT_S)
    assert not isinstance(kernels.value, EnvironmentFault)


def test_a_build_over_the_file_size_limit_is_the_machines_fault(tmp_path: Path) -> None:
    source = heavy_source(tmp_path, lines=400)
    limited = ["sh", "-c", 'ulimit -f 8 && exec "$0" "$@"',  # 8 blocks: 4-8 KiB
               *gcc("-o", str(tmp_path / "heavy.so"), str(source))]
    with pytest.raises(EnvironmentFault) as caught:
        run_compiler(limited, hang_limit_s=COMPILE_TIMEOUT_S)
    assert caught.value.kind == FILE_SIZE_LIMIT


# ---------------------------------------------------------------- the database

def test_a_study_database_that_is_not_one_is_one_line_and_left_as_it_was(
        tmp_path: Path) -> None:
    for content in (b"", b"notes, not a database\n"):
        db = tmp_path / "peak.db"
        db.write_bytes(content)
        os.utime(db, (time.time() - 60, time.time() - 60))  # not one being created now
        for command in (["--trials", "1", *SMALL], ["show"]):
            done = peak(*command, "--results", str(tmp_path))
            assert done.returncode == 2, done.stderr
            assert str(db) in one_error_line(done.stderr)
            assert db.read_bytes() == content


@pytest.mark.slow
def test_a_database_deleted_mid_run_stops_with_one_line(tmp_path: Path) -> None:
    db = tmp_path / "peak.db"
    proc = start("--trials", "300", *SMALL, "--results", str(tmp_path))
    wait_for_trials(f"sqlite:///{db}", proc, 3)
    db.unlink()
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode != 0, stderr
    line = one_error_line(stderr)
    assert str(db) in line and "deleted" in line


@pytest.mark.slow
def test_deleting_the_cache_mid_run_is_no_crash_and_loses_no_trial(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/peak.db"
    proc = start("--trials", "300", *SMALL, "--results", str(tmp_path))
    wait_for_trials(url, proc, 2)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and proc.poll() is None:
        shutil.rmtree(tmp_path / "cache", ignore_errors=True)
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    stored = stored_trials(url)
    assert shown_trials(stderr) == told(stored)
    assert len(stored) >= 4
    assert "compile_error" not in {t.user_attrs.get("status") for t in stored}, [
        t.user_attrs.get("message") for t in stored if "message" in t.user_attrs]  # no blame


def test_a_folder_deleted_while_it_is_made_is_made_again(tmp_path: Path, monkeypatch) -> None:
    """The race CI once hit: pathlib's mkdir found the cache's folder there (EEXIST), a
    user's rm -r removed it before pathlib saw a directory, and mkdir raised
    FileExistsError for a folder that no longer existed, ending the run. The write now
    makes the folder again; a file in the folder's place still fails."""
    from peak_tune.atomic_files import write_atomically

    folder = tmp_path / "cache" / "builds"
    real_mkdir = Path.mkdir
    raced: list[Path] = []

    def mkdir_racing(self: Path, *args: object, **kwargs: object) -> None:
        if self == folder and not raced:
            raced.append(self)  # as if made by another thread, then deleted at once
            raise FileExistsError(17, "File exists", str(self))
        real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir_racing)
    write_atomically(folder / "log.txt", "built")
    assert raced and (folder / "log.txt").read_text() == "built"
    monkeypatch.setattr(Path, "mkdir", real_mkdir)
    (tmp_path / "taken").write_text("a file where a folder should be")
    with pytest.raises(Exception, match="taken"):
        write_atomically(tmp_path / "taken" / "x.txt", "x")
