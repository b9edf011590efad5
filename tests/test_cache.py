"""The content-addressed cache: keys follow content, writes are atomic, copies replay."""

import shutil
from dataclasses import replace

from peak_tune.core import KernelContext, Lineage, Measurement, Outcome, ParamDomain, Status
from peak_tune.evaluation.cache import Cache, application_key, evaluation_key


def context(source: str = "void f(void) {}", parent: str = "") -> KernelContext:
    lineage = Lineage(parent, "demo", 1, "texthash", "reference/1") if parent else None
    return KernelContext(kernel="matmul", backend="c", source=source, entry="f",
                         params=(ParamDomain("MC", (32, 64), "demo"),), applied=("demo",),
                         lineage=lineage)


def key(ctx: KernelContext, **over) -> str:
    args = dict(params={"MC": 32}, size={"M": 8, "N": 8, "K": 8}, dtype="float32",
                fingerprint={"compiler": "gcc 12"}, spec_identity="spec")
    args.update(over)
    return evaluation_key(ctx, **args)


def test_context_round_trip_and_lineage(tmp_path):
    cache = Cache(tmp_path)
    seed = KernelContext(kernel="matmul", backend="c", source="seed", entry="f")
    child = context(parent=cache.put_context(seed))
    digest = cache.put_context(child)
    assert cache.get_context(digest) == child
    assert [c.source for c in cache.lineage(child)] == ["seed", child.source]


def test_evaluation_keys_change_with_everything_that_matters():
    base = key(context())
    assert key(context("void f(void) { }")) != base  # edited kernel
    assert key(context(), params={"MC": 64}) != base
    assert key(context(), size={"M": 16, "N": 8, "K": 8}) != base
    assert key(context(), dtype="float64") != base
    assert key(context(), fingerprint={"compiler": "gcc 13"}) != base
    assert key(context(), spec_identity="other") != base
    assert key(context()) == base


def test_a_variant_that_runs_the_same_kernel_shares_its_evaluation():
    """Another order of commuting steps: same source, launch and sizes, other lineage and
    applier state. Its timing would be the same kernel's; its launch or sizes would not."""
    one = context(parent="p1")
    other = replace(one, applied=("demo", "other"), state={"plan": 2},
                    lineage=Lineage("p2", "other", 1, "texthash", "reference/1"))
    assert other.content_hash() != one.content_hash() and key(other) == key(one)
    assert key(replace(one, launch={"grid_x": "M"})) != key(one)
    assert key(replace(one, size_constraints=("M % 8 == 0",))) != key(one)


def test_application_key_covers_text_and_applier():
    base = application_key("p", "t", 1, "h", "reference/1", 0)
    assert application_key("p", "t", 1, "h2", "reference/1", 0) != base
    assert application_key("p", "t", 2, "h", "reference/1", 0) != base
    assert application_key("p", "t", 1, "h", "llm/x", 0) != base
    assert application_key("p", "t", 1, "h", "reference/1", 1) != base


def test_hits_misses_and_replay_from_a_copy(tmp_path):
    cache = Cache(tmp_path / "a")
    k = key(context())
    assert cache.get_evaluation(k) is None
    outcome = Outcome(Status.OK, Measurement((1.0, 2.0, 3.0), 2e9))
    cache.put_evaluation(k, outcome)
    got = cache.get_evaluation(k)
    assert got is not None and got.cached and got.measurement == outcome.measurement
    assert (cache.counters.hits, cache.counters.misses) == (1, 1)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    copy = Cache(tmp_path / "b")
    replayed = copy.get_evaluation(k)
    assert replayed is not None and replayed.gflops == outcome.gflops
    assert copy.stats()["evaluations"]["entries"] == 1


def test_damaged_entry_is_a_miss_and_no_temp_files_remain(tmp_path):
    cache = Cache(tmp_path)
    k = key(context())
    cache.put_evaluation(k, Outcome(Status.WRONG_RESULT, message="wrong"))
    path = next((tmp_path / "evaluations").rglob("*.json"))
    path.write_text("{not json")
    assert cache.get_evaluation(k) is None
    assert not list(tmp_path.rglob(".tmp-*"))
