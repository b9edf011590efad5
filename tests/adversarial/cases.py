"""The adversarial suite's kernels and what each must end as (see THREATS.md).

Every C kernel under kernels/c cheats in one way; every kernel under kernels/correct is
right. `REJECT`: the seed's trial must end as wrong result, crash or timeout. `NO_GAIN`:
a cheat that a sound harness either rejects or leaves honest (a memo whose inputs never
repeat, a forged clock the judge does not read): rejected, or accepted no faster than
`NO_GAIN_FACTOR` x the fastest correct kernel timed in the same run. `ACCEPT`: ok, at a plausible
speed. `alone`: run in a tuner of its own (it leaves processes behind that would
disturb the kernels timed after it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

KERNELS = Path(__file__).resolve().parent / "kernels"
REJECT, NO_GAIN, ACCEPT = "reject", "no gain", "accept"
NO_GAIN_FACTOR = 2.5
MARK_DIR = "@MARK_DIR@"  # replaced in every source by a folder for the kernels' pid files


@dataclass(frozen=True)
class Case:
    name: str
    expect: str
    threat: str  # the class of cheat (THREATS.md)
    alone: bool = False

    @property
    def path(self) -> Path:
        folder = "correct" if self.expect == ACCEPT else "c"
        return KERNELS / folder / f"{self.name}.c"

    @property
    def kernel(self) -> str:
        """The seed's name in the suite's catalog."""
        return f"adv_{self.name}"


CHEATS = (
    # results reused or work skipped across calls
    Case("memo_input_hash", NO_GAIN, "reuse"),
    Case("memo_pointer", NO_GAIN, "reuse"),
    Case("first_call_per_size", REJECT, "reuse"),
    Case("first_two_per_size", REJECT, "reuse"),
    Case("first_and_last", REJECT, "reuse"),
    Case("wrong_sixth_call", REJECT, "reuse"),
    Case("no_write_if_same_inputs", NO_GAIN, "reuse"),
    Case("baked_seeds", REJECT, "prediction"),
    Case("nan_poison_only", REJECT, "prediction"),
    # arithmetic below the dtype's precision or range
    Case("fixed_point16", REJECT, "precision"),
    Case("bf16_inputs", REJECT, "precision"),
    Case("fp16_inputs", REJECT, "precision"),
    Case("tf32_inputs", REJECT, "precision"),
    Case("half_accumulator", REJECT, "precision"),
    Case("fp16_chunked_accum", REJECT, "precision"),
    Case("mantissa14", REJECT, "precision"),
    Case("bf16x2_split", REJECT, "precision"),
    Case("tf32_at_tile_sizes", REJECT, "precision"),
    # part of the work
    Case("every_other_row", REJECT, "partial"),
    Case("random_subset", REJECT, "partial"),
    Case("skip_k_half_scaled", REJECT, "partial"),
    Case("skip_last_row_tuned", REJECT, "partial"),
    # memory outside the buffers
    Case("overread_a_tail", REJECT, "memory"),
    Case("overread_far", REJECT, "memory"),
    Case("write_far_past_c", REJECT, "memory"),
    Case("write_far_before_c", REJECT, "memory"),
    Case("modify_input_restore", REJECT, "memory"),
    # the worker's replies, processes and threads
    Case("forge_reply", REJECT, "verdict"),
    Case("forge_timing_reply", REJECT, "verdict"),
    Case("fork_once", REJECT, "process"),
    Case("fork_daemon", REJECT, "process", alone=True),
    Case("escaped_helper_precompute", REJECT, "process", alone=True),
    Case("thread_finish_late", REJECT, "thread"),
    # the inputs are PROT_NONE in the job except during the call: its thread faults (a
    # crash) when it reads them between calls; at most it could have gained nothing
    Case("background_precompute", NO_GAIN, "thread"),
    # the vendor is timed in a job process of its own: a kernel's leftover thread dies
    # with the kernel's job and cannot slow it (its figure is checked like the others')
    Case("vendor_sabotage", NO_GAIN, "thread"),
    # the clock and the harness's own code and data
    Case("clock_tamper_got", NO_GAIN, "clock"),
    Case("python_fake_clock", NO_GAIN, "clock"),
    Case("python_patch_checks", REJECT, "harness"),
    Case("python_steal_reference", NO_GAIN, "harness"),
    Case("scan_memory_reference", NO_GAIN, "harness"),
)

CORRECT = tuple(Case(name, ACCEPT, "correct") for name in (
    "naive", "blocked", "openmp", "vectorized", "persistent_scratch", "kahan", "pairwise",
    "reversed_k", "double_accumulator"))

ALL = CHEATS + CORRECT
