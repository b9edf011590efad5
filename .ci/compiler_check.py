"""CI: does a compiler library (DXC's or Slang's) build the HLSL variants on this
machine, each within a minute? `python .ci/compiler_check.py dxc|slang`

The libraries come from third-party packages, and on one CI machine DXC's never
returned from builds that take 0.1 s elsewhere (each test then waited out the 300 s hang
limit). This builds what the HLSL tests build first (the seed at several group sizes, in
fp32 and fp16, the groupshared fixture, the cooperative-matrix one for Slang, and each
reference step with what it requires) and, for a build that outlives a minute, reports
where the compiler's process is (every thread's kernel wait channel and system call,
and gdb's backtraces when gdb is here), kills it and stops. Exit 0 when every build
came back, 2 when one hung or failed: CI then runs the tests without that library and
prints this report after them. Any other exit (a traceback: the check itself is broken)
stops CI.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tests.appliers.test_reference_hlsl as hlsl_tests  # noqa: E402
from peak_tune.appliers.reference.hlsl_matmul import HLSL_STEPS  # noqa: E402
from peak_tune.backends._hlsl_compile import find_compiler  # noqa: E402
from peak_tune.errors import BackendUnavailable  # noqa: E402

BUILD_LIMIT_S = 60.0
LIBRARY_FAILED = 2  # the exit that tells CI to run the tests without this library
SEED = (ROOT / "seeds" / "matmul" / "naive.hlsl").read_text()
TILED = (ROOT / "tests" / "fixtures" / "hlsl" / "tiled.hlsl").read_text()
COOPMAT = (ROOT / "tests" / "fixtures" / "hlsl" / "coopmat_fp16.slang").read_text()


def cases(compiler: str) -> list[tuple[str, str, dict[str, str | int], bool]]:
    """(name, source, defines, 16-bit types) for each build."""
    from peak_tune.catalog.resolve import Catalog
    found: list[tuple[str, str, dict[str, str | int], bool]] = [
        ("seed 8x4", SEED, {"BLOCK_X": 8, "BLOCK_Y": 4}, False),
        ("seed 32x4 half", SEED, {"DTYPE": "half", "BLOCK_X": 32, "BLOCK_Y": 4}, True),
        ("seed 64x32", SEED, {"BLOCK_X": 64, "BLOCK_Y": 32}, False),
        ("tiled 8", TILED, {"TILE": 8}, False)]
    if compiler == "slang":
        found.append(("cooperative matrices", COOPMAT, {"WAVE": 32}, True))
    catalog = Catalog.with_user_folders()
    lavapipe, h200 = catalog.device("lavapipe"), catalog.device("h200")
    for step in HLSL_STEPS:
        # cooperative-matrix (and the steps after it) is fp16 Slang for a device that
        # offers the matrices
        coopmat = step in hlsl_tests.COOPMAT_STEPS
        if coopmat and compiler != "slang":
            continue
        device = h200 if coopmat else lavapipe
        if step == "workgroup-matrix":  # offered where a profile names coopmat2's scope
            device = dataclasses.replace(h200, facts={
                **h200.facts, "workgroup_matrix": "VK_NV_cooperative_matrix2"})
        context = hlsl_tests.applied(catalog, device, hlsl_tests.with_requirements(catalog, step))
        defines: dict[str, str | int] = {"DTYPE": "half" if coopmat else "float",
                                         "ACC": "float", "PT_WAVE_SIZE": device.wave_size,
                                         **hlsl_tests.params_of(context)}
        if coopmat:
            names = {p.name for p in context.params}
            defines.update({k: v for k, v in hlsl_tests.COOPMAT_PARAMS.items() if k in names})
        found.append((step, context.source, defines, coopmat))
    return found


def where_it_is(pid: int) -> str:
    """Each thread's wait channel, system call and kernel stack; gdb's backtraces."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        parts = []
        for name in ("comm", "wchan", "syscall", "stat", "stack"):
            try:
                parts.append(f"{name}: {(task / name).read_text().strip()}")
            except OSError as exc:
                parts.append(f"{name}: ({exc.strerror})")
        lines.append(f"thread {task.name}:\n  " + "\n  ".join(parts))
    gdb = shutil.which("gdb")
    if gdb is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "gdb"], capture_output=True,
                       timeout=300, check=False)
        gdb = shutil.which("gdb")
    if gdb is not None:
        traced = subprocess.run([gdb, "-p", str(pid), "-batch", "-ex",
                                 "thread apply all bt 40"], capture_output=True, text=True,
                                timeout=120, check=False)
        lines.append("gdb:\n" + traced.stdout[-12000:] + traced.stderr[-2000:])
    else:
        lines.append("gdb: not installed")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    try:
        compiler = find_compiler(argv[0] if argv else "dxc")
    except BackendUnavailable as exc:  # the library does not load here
        print(f"no {argv[0] if argv else 'dxc'} here: {exc}")
        return LIBRARY_FAILED
    print(f"{compiler.name} check: {compiler.label} at {compiler.path}")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="peak-tune-dxc-check-") as folder:
        for index, (name, source, defines, sixteen_bit) in enumerate(cases(compiler.name)):
            suffix = ".slang" if compiler.name == "slang" else ".hlsl"
            shader, built = Path(folder) / f"{index}{suffix}", Path(folder) / f"{index}.spv"
            shader.write_text(source)
            command = compiler.command(shader, built, defines, sixteen_bit)
            started = time.monotonic()
            process = subprocess.Popen(command, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True,
                                       env={**os.environ, "LC_ALL": "C"},
                                       start_new_session=True)
            try:
                log, _ = process.communicate(timeout=BUILD_LIMIT_S)
            except subprocess.TimeoutExpired:
                print(f"{name}: no answer after {BUILD_LIMIT_S:g} s: {' '.join(command)}")
                print(where_it_is(process.pid))
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
                return LIBRARY_FAILED  # one hung build says it; more would only cost CI minutes
            took = time.monotonic() - started
            verdict = "ok" if process.returncode == 0 and built.is_file() else "FAILED"
            failed += verdict != "ok"
            print(f"{name}: {verdict} in {took:.2f} s (exit {process.returncode})"
                  + (f"\n{log[-2000:]}" if verdict != "ok" else ""))
    return LIBRARY_FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
