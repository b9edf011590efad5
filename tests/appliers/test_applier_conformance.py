"""What every registered applier must do (peak_tune.appliers.APPLIERS): an applier added
to the registry gets these tests by being registered.

The contract is the Applier protocol's: a child that records the step and its parent,
declares the step's parameters as macros, differs from its parent, computes the kernel
(built and validated by the real C backend), composes with the steps before it, and
repeats for the same (parent, step, sample); a step that cannot apply is an InvalidPoint
or an ApplyError, never the parent passed off as changed.

The LLM applier runs through the real openai client against a local server that answers
like an honest model (the reference applier's edit of the step it is asked for), so what
is tested is the applier's own handling of a reply: parsing, checks, parameters, lineage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from peak_tune.appliers import APPLIERS, make_applier
from peak_tune.appliers.base import Applier
from peak_tune.appliers.llm.compile_check import sample_point
from peak_tune.appliers.reference import ReferenceApplier
from peak_tune.backends.base import EvalConfig, EvalRequest
from peak_tune.backends.c import CBackend
from peak_tune.catalog.resolve import Catalog
from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import KernelContext, KernelSpec, ProblemSize
from peak_tune.errors import ApplyError, InvalidPoint
from peak_tune.evaluation.pipeline import seed_context

ROOT = Path(__file__).resolve().parents[2]
SIZE = ProblemSize.of({"M": 70, "N": 58, "K": 66})
# legal in this order on the C backend; each step's text asks for a different edit
SEQUENCE = ("cache-blocking", "block-interchange", "openmp-parallel", "unroll-k")


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.with_user_folders()


@pytest.fixture(scope="module")
def spec(catalog: Catalog) -> KernelSpec:
    return catalog.spec("matmul")


@pytest.fixture(scope="module")
def backend(catalog: Catalog) -> Iterator[CBackend]:
    with CBackend(catalog.device("cpu")) as driver:
        yield driver


@pytest.fixture(scope="module")
def cpu(backend: CBackend) -> DeviceProfile:
    """This host as a session sees it: the profile's detected facts filled in."""
    return backend.probe()


def _honest_llm() -> Iterator[Applier]:
    """The LLM applier against a local server whose every reply is the reference
    applier's edit of the prompt's kernel by the prompt's step."""
    from openai import OpenAI

    from peak_tune.appliers.llm import LLMApplier, LLMConfig
    from peak_tune.appliers.llm.regions import split
    from tests.llm_server import LLMServer, reply

    class HonestModel(LLMApplier):
        """Scripts the server's reply for each step just before the real call. The
        reference applier continues from its own variants: each LLM child is mapped to
        the reference variant whose code the server sent."""

        shadows: dict[str, KernelContext] = {}

        def apply(self, context: KernelContext, transformation: Transformation,
                  device: DeviceProfile, sample: int = 0) -> KernelContext:
            parent = self.shadows.get(context.content_hash(), context)
            try:
                edited = ReferenceApplier().apply(parent, transformation, device)
            except InvalidPoint:
                edited = parent  # what a model does with a step it cannot make
            # each pass is answered with its region of the edited code (split as the
            # applier splits it), or the whole code where the parent has no macros yet;
            # a pass of the launch is none of C's
            parts = split(edited.source)
            whole = not split(context.source).macros.strip()
            answers = [parts.macros if p.region == "macros" else
                       edited.source if whole else parts.device for p in transformation.passes]
            server.script(*[reply(f"```c\n{code}```") for code in answers * 2])  # a repair
            child = super().apply(context, transformation, device, sample)
            self.shadows[child.content_hash()] = edited
            return child

    with LLMServer(models=("test-model",)) as server:
        config = LLMConfig(model="test-model", base_url=server.url + "/v1", max_retries=0,
                           backoff_s=0.01, timeout_s=10.0, repairs=1)
        yield HonestModel(config, client=OpenAI(base_url=server.url + "/v1",
                                                api_key="sk-test", max_retries=0))


HARNESSES: dict[str, Callable[[], Iterator[Applier]]] = {"llm": _honest_llm}


@pytest.fixture(params=sorted(APPLIERS))
def applier(request: pytest.FixtureRequest) -> Iterator[Applier]:
    name = request.param
    if name == "llm":
        pytest.importorskip("openai")
    harness = HARNESSES.get(name)
    if harness is None:
        yield make_applier(name)
    else:
        yield from harness()


def _validates(backend: CBackend, spec: KernelSpec, child: KernelContext,
               folder: Path) -> None:
    """The real C backend builds the child at its first legal point and validates it
    (the spec's check sizes and SIZE); raises what it finds."""
    point = sample_point(child)
    artifact = backend.compile(child, point, "float32", str(folder))
    backend.evaluate(artifact, EvalRequest(spec, child, point, "float32", SIZE,
                                           spec.check_sizes, EvalConfig(repeats=2)))


def test_identity_names_the_applier_and_its_version(applier: Applier) -> None:
    identity = applier.identity
    assert identity == applier.identity and "/" in identity
    assert identity.split("/")[0] in APPLIERS


def test_a_step_records_itself_and_its_parent_and_declares_its_parameters(
    applier: Applier, catalog: Catalog, spec: KernelSpec, cpu: DeviceProfile,
) -> None:
    seed = seed_context(spec, "c")
    step = catalog.transformations["cache-blocking"]
    child = applier.apply(seed, step, cpu)
    assert child.source != seed.source and child.applied == ("cache-blocking",)
    assert child.lineage is not None and child.lineage.parent_hash == seed.content_hash()
    assert (child.lineage.transform_id, child.lineage.applier) == (step.id, applier.identity)
    assert {p.name for p in step.params} <= {p.name for p in child.params}
    assert all(p.introduced_by == step.id for p in child.params)


def test_a_sequence_composes_and_every_child_computes_the_kernel(
    applier: Applier, catalog: Catalog, spec: KernelSpec, cpu: DeviceProfile,
    backend: CBackend, tmp_path: Path,
) -> None:
    context = seed_context(spec, "c")
    sources = {context.source}
    for tid in SEQUENCE:
        context = applier.apply(context, catalog.transformations[tid], cpu)
        assert context.source not in sources, f"{tid} changed nothing"
        sources.add(context.source)
        _validates(backend, spec, context, tmp_path)
    assert context.applied == SEQUENCE


def test_the_same_step_on_the_same_parent_gives_the_same_child(
    applier: Applier, catalog: Catalog, spec: KernelSpec, cpu: DeviceProfile,
) -> None:
    seed = seed_context(spec, "c")
    step = catalog.transformations["openmp-parallel"]
    first, again = applier.apply(seed, step, cpu), applier.apply(seed, step, cpu)
    assert first.content_hash() == again.content_hash()


def test_a_step_that_cannot_apply_is_an_error_never_the_parent_passed_off(
    applier: Applier, catalog: Catalog, spec: KernelSpec, cpu: DeviceProfile,
) -> None:
    """pack-a packs the blocks of cache-blocking: on the naive seed there are none."""
    with pytest.raises((InvalidPoint, ApplyError)):
        applier.apply(seed_context(spec, "c"), catalog.transformations["pack-a"], cpu)
