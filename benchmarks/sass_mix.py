"""What a kernel's hot loop executes, read from its cubin on the CPU (no GPU needed).

Builds reference-applier kernels through the CUDA backend's own compile (NVRTC, the
device profile's architecture, the flags a study uses), disassembles each cubin with
cuobjdump (which needs nvdisasm: both come in NVIDIA's pip wheels nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm, or from a CUDA toolkit on PATH), finds the loops (backward branches)
and prints the innermost loop holding the arithmetic the kernel is made of (FFMA for SIMT
fp32, HGMMA for wgmma, HMMA for mma.sync): its instructions, the arithmetic's share of
them, and the shared-memory loads and stores by width. A kernel that issues every cycle
runs at that share of the device's peak, so a change to a step shows here first.

    python3 benchmarks/sass_mix.py --device h100 --dtype float32 \
        --kernel refactor,thread-tiling,tb-tiling,register-staging --point '{"BLOCK_M": 128, ...}'

Unset tuning values take the transformation's defaults.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda_reference_check import ROOT, build  # benchmarks/ is the script's folder

from peak_tune.backends.cuda import CudaBackend
from peak_tune.catalog.loaders import load_device, load_transformations

ARITHMETIC = ("HGMMA", "HMMA", "FFMA")  # the first one a loop holds names its kind
_LINE = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_PREDICATE = re.compile(r"^@!?U?P\w+\s+")


@dataclass(frozen=True)
class Instruction:
    address: int
    opcode: str  # with its modifiers, e.g. LDS.128
    text: str

    @property
    def family(self) -> str:
        return self.opcode.split(".")[0]


@dataclass(frozen=True)
class Loop:
    start: int
    end: int  # the address of its backward branch
    body: tuple[Instruction, ...]

    def count(self, family: str) -> int:
        return sum(1 for i in self.body if i.family == family)

    def widths(self, family: str) -> dict[str, int]:
        """How many `family` instructions of each width (LDS.64, LDS.128, ...)."""
        return dict(collections.Counter(i.opcode for i in self.body if i.family == family))


def parse(sass: str) -> list[Instruction]:
    """cuobjdump -sass's instructions, predicates dropped."""
    found = []
    for line in sass.splitlines():
        match = _LINE.match(line)
        if match:
            text = _PREDICATE.sub("", match.group(2))
            found.append(Instruction(int(match.group(1), 16), text.split()[0], text))
    return found


def loops(instructions: list[Instruction]) -> list[Loop]:
    """Every loop: from a backward branch's target to the branch itself."""
    found = []
    for branch in instructions:
        if branch.family != "BRA":
            continue
        target = re.search(r"0x([0-9a-f]+)", branch.text)
        if target and int(target.group(1), 16) <= branch.address:
            start = int(target.group(1), 16)
            found.append(Loop(start, branch.address, tuple(
                i for i in instructions if start <= i.address <= branch.address)))
    return found


def hot_loop(instructions: list[Instruction]) -> tuple[str, Loop] | None:
    """(the arithmetic, the innermost loop holding it), by the first of ARITHMETIC
    that any loop holds; None for a kernel without loops of arithmetic."""
    every = loops(instructions)
    for family in ARITHMETIC:
        holding = [loop for loop in every if loop.count(family)]
        if holding:
            return family, min(holding, key=lambda loop: len(loop.body))
    return None


def tools_path() -> str | None:
    """A PATH on which cuobjdump and nvdisasm are found (NVIDIA's pip wheels' bin folder
    first, then PATH), or None."""
    folders = [Path(entry) / "nvidia" / "cu13" / "bin" for entry in sys.path if entry]
    path = os.pathsep.join([*(str(f) for f in folders if f.is_dir()),
                            os.environ.get("PATH", "")])
    found = all(shutil.which(tool, path=path) for tool in ("cuobjdump", "nvdisasm"))
    return path if found else None


def disassemble(cubin: Path) -> str:
    path = tools_path()
    if path is None:
        raise SystemExit("needs cuobjdump and nvdisasm: pip install nvidia-cuda-cuobjdump "
                         "nvidia-cuda-nvdisasm (or a CUDA toolkit on PATH)")
    return subprocess.run(["cuobjdump", "-sass", str(cubin)], check=True, capture_output=True,
                          text=True, env={**os.environ, "PATH": path}).stdout


def mix(sequence: tuple[str, ...], point: dict[str, int], device_name: str, dtype: str,
        build_dir: str) -> dict[str, Any]:
    """The hot loop's figures for one kernel at one tuning point."""
    device = load_device(ROOT / "backends" / "devices" / f"{device_name}.toml")
    context = build(sequence, device)
    catalog = load_transformations([ROOT / "transforms"])
    defaults = {k: v for step in sequence for k, v in catalog[step].defaults.items()}
    params = {p.name: point.get(p.name, defaults.get(p.name)) for p in context.params}
    missing = [name for name, value in params.items() if value is None]
    if missing:
        raise SystemExit(f"no value for {', '.join(missing)}: give it in --point")
    artifact = CudaBackend(device).compile(context, params, dtype, build_dir)
    found = hot_loop(parse(disassemble(Path(artifact.path))))
    row: dict[str, Any] = {"sequence": list(sequence), "params": params,
                           "registers": artifact.resources.get("registers")}
    if found is None:
        return {**row, "hot_loop": None}
    family, loop = found
    return {**row, "arithmetic": family, "instructions": len(loop.body),
            "arithmetic_share": round(loop.count(family) / len(loop.body), 3),
            "shared_loads": loop.widths("LDS"), "shared_stores": loop.widths("STS"),
            "global_loads": loop.widths("LDG"), "barriers": loop.count("BAR"),
            "loop": [hex(loop.start), hex(loop.end)]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="h100", help="a profile in backends/devices")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--kernel", action="append", required=True,
                        help="steps after the seed, comma-separated (again for more kernels)")
    parser.add_argument("--point", default="{}", help="tuning values as JSON")
    args = parser.parse_args()
    point = json.loads(args.point)
    with tempfile.TemporaryDirectory(prefix="peak-tune-sass-") as build_dir:
        for kernel in args.kernel:
            row = mix(tuple(kernel.split(",")), point, args.device, args.dtype, build_dir)
            print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
