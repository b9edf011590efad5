"""The LLM applier's step checks on their own: a tuning parameter is live when the kernel
preprocessed at two of its values differs (dropped or hard-coded ones are dead, and no
reference variant of any backend has a dead one), and an echoed kernel is no step."""

from __future__ import annotations

import random

import pytest

from peak_tune.appliers.llm import step_check
from peak_tune.appliers.llm.compile_check import local_paths_removed
from peak_tune.appliers.llm.errors import ScopeError
from peak_tune.appliers.llm.regions import merge_reply, split
from peak_tune.appliers.llm.step_check import UnchangedError, dead_parameters, require_change
from peak_tune.appliers.reference import ReferenceApplier
from peak_tune.catalog.resolve import Catalog
from peak_tune.core import KernelContext, ParamDomain
from peak_tune.errors import ApplyError, InvalidPoint

GUARDED = """\
#ifndef UNROLL
#error "UNROLL must be defined"
#endif
#ifndef CHUNK
#error "CHUNK must be defined"
#endif
void matmul(const float *A, const float *B, float *C, int M, int N, int K) {
    #pragma omp parallel for schedule(static, CHUNK)
    for (int i = 0; i < M; i++)
        #pragma unroll UNROLL
        for (int k = 0; k < K; k++) C[i] += A[i * K + k] * B[k];
}
"""
PARAMS = (ParamDomain("UNROLL", (1, 2, 4)), ParamDomain("CHUNK", (1, 8)))


def context(source: str) -> KernelContext:
    return KernelContext(kernel="matmul", backend="c", source=source, entry="matmul",
                         params=PARAMS)


def test_parameters_used_in_pragmas_are_live() -> None:
    assert dead_parameters(context(GUARDED), ["UNROLL", "CHUNK"]) == []


@pytest.mark.parametrize(("edit", "dead"), [
    (lambda s: s.replace("    #pragma omp parallel for schedule(static, CHUNK)\n", ""),
     ["CHUNK"]),  # an earlier step's pragma dropped, its guard kept
    (lambda s: s.replace('#ifndef UNROLL\n#error "UNROLL must be defined"\n#endif',
                         "#define UNROLL 4"), ["UNROLL"]),  # hard-coded
    (lambda s: s.replace("#pragma unroll UNROLL", "#pragma unroll 4"), ["UNROLL"]),
], ids=["dropped-pragma", "hard-coded", "literal-in-pragma"])
def test_dropped_and_hard_coded_parameters_are_dead(edit, dead) -> None:
    assert dead_parameters(context(edit(GUARDED)), ["UNROLL", "CHUNK"]) == dead


def test_without_a_preprocessor_the_text_decides(monkeypatch) -> None:
    monkeypatch.setattr(step_check, "_preprocessor", lambda: None)
    dropped = GUARDED.replace("    #pragma omp parallel for schedule(static, CHUNK)\n", "")
    assert dead_parameters(context(dropped), ["UNROLL", "CHUNK"]) == ["CHUNK"]
    assert dead_parameters(context(GUARDED), ["UNROLL", "CHUNK"]) == []


def test_an_echoed_kernel_is_unchanged_but_a_new_launch_is_a_change() -> None:
    before = context(GUARDED)
    with pytest.raises(UnchangedError, match="loop-interchange was not applied"):
        require_change(before, context(GUARDED.replace("    ", "\t")), "loop-interchange")
    relaunched = KernelContext(kernel="matmul", backend="c", source=GUARDED, entry="matmul",
                               params=PARAMS, launch={"grid_x": "N"})
    require_change(before, relaunched, "tile")


@pytest.mark.parametrize(("backend", "device"), [("c", "cpu"), ("cuda", "h200"),
                                                 ("hip", "mi250"), ("hlsl", "lavapipe")])
def test_no_reference_variant_has_a_dead_parameter(backend: str, device: str) -> None:
    """The check must never refuse a good step: every parameter of random reference
    sequences (the reference applier's own, edited as their texts say) is live."""
    catalog = Catalog.with_user_folders()
    spec, profile, applier = catalog.spec("matmul"), catalog.device(device), ReferenceApplier()
    steps = [t.id for t in catalog.transformations_for("matmul", backend)]
    rng = random.Random(backend)
    for _ in range(4):
        variant = KernelContext(kernel="matmul", backend=backend, source=spec.sources[backend],
                                entry=spec.entry[backend])
        rng.shuffle(steps)
        for tid in steps:
            try:
                variant = applier.apply(variant, catalog.transformation(tid), profile)
            except (ApplyError, InvalidPoint):
                continue  # not legal here, or not in this order
        names = [p.name for p in variant.params]
        assert names, "the sequence applied nothing"
        launched = {n for n in names if any(n in v for v in variant.launch.values())}
        assert dead_parameters(variant, [n for n in names if n not in launched]) == []


def test_compile_logs_go_out_without_this_machines_folders() -> None:
    log = ("$ /usr/bin/gcc -O3 -o /tmp/peak-tune-c-x1/ab12.so /tmp/peak-tune-c-x1/kernel.c\n"
           "/tmp/peak-tune-c-x1/kernel.c:4:5: error: expected ';' (see /home/ann/x.h)")
    assert local_paths_removed(log) == ("$ gcc -O3 -o ab12.so kernel.c\n"
                                        "kernel.c:4:5: error: expected ';' (see x.h)")


MACROS = '#include <omp.h>\n#ifndef CHUNK\n#error "CHUNK must be defined"\n#endif\n\n'
DEVICE = "void f(float *C, int n) {\n    for (int i = 0; i < n; i++) C[i] = 0;\n}\n"


def test_regions_split_at_the_first_line_of_code() -> None:
    assert split(MACROS + DEVICE) == (MACROS, DEVICE)
    assert split("/* a\n   comment */\n#define X \\\n  2\n" + DEVICE).device == DEVICE
    assert split(DEVICE) == ("", DEVICE)


def test_a_pass_gets_its_region_back_and_the_other_is_kept_byte_for_byte() -> None:
    source = MACROS + DEVICE
    edited = DEVICE.replace("= 0;", "= 1;")
    assert merge_reply(source, "device", edited) == MACROS + edited  # the region alone
    assert merge_reply(source, "device", MACROS + edited) == MACROS + edited  # or it all
    more = MACROS + "#define PT_TWO 2\n"
    assert merge_reply(source, "macros", more) == more + DEVICE
    # device code that opens with a directive of its own is still device code
    assert merge_reply(source, "device", "#define Y 1\n" + edited) == \
        MACROS + "#define Y 1\n" + edited


def test_an_edit_outside_the_pass_region_is_refused() -> None:
    source = MACROS + DEVICE
    with pytest.raises(ScopeError, match="the macros pass changed the device code"):
        merge_reply(source, "macros", MACROS + "#define Z 3\n" + DEVICE.replace("0;", "2;"))
    with pytest.raises(ScopeError, match="the device pass changed the macros region"):
        merge_reply(source, "device", MACROS.replace("<omp.h>", "<math.h>") + DEVICE)
