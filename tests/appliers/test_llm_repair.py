"""Wrong results go back to the model: the real openai client, the local protocol server,
and the C backend's own compile and validation (backend_result_check)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from peak_tune.appliers.llm import (
    LLMApplier,
    UncompilableError,
    WrongResultError,
    backend_compile_check,
    backend_result_check,
)
from peak_tune.backends import make_backend
from peak_tune.backends.base import Backend
from peak_tune.catalog.resolve import Catalog
from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import KernelContext
from tests.appliers.test_llm import INTERCHANGED, KEY, MODEL, config_for, fenced
from tests.llm_server import LLMServer, reply

pytestmark = pytest.mark.llm

# Compiles and keeps the signature, but skips k = 0: wrong everywhere.
SKIPS_FIRST_K = INTERCHANGED.replace("for (int k = 0; k < K; k++)",
                                     "for (int k = 1; k < K; k++)")
# Right except in the last row when M is odd: only the odd check sizes show it.
DROPS_LAST_ODD_ROW = INTERCHANGED.replace("for (int i = 0; i < M; i++) {",
                                          "for (int i = 0; i < (M & ~1); i++) {")


@pytest.fixture(scope="module")
def backend(catalog: Catalog) -> Iterator[Backend]:
    made = make_backend("c", catalog.device("cpu"))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(scope="module")
def cpu(backend: Backend) -> DeviceProfile:
    return backend.probe()


@pytest.fixture(scope="module")
def interchange(catalog: Catalog) -> Transformation:
    return catalog.transformations["loop-interchange"]


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer(models=(MODEL,)) as running:
        yield running


def checked_applier(server: LLMServer, catalog: Catalog, backend: Backend, folder: Path,
                    repairs: int) -> LLMApplier:
    """An applier that checks children with the C backend, as `peak-tune` wires it."""
    client = OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    return LLMApplier(
        config_for(server, repairs=repairs), client=client,
        compile_check=backend_compile_check(backend, "float32", str(folder)),
        result_check=backend_result_check(backend, catalog.spec("matmul"), "float32",
                                          str(folder)))


def test_the_result_check_passes_a_correct_kernel_and_names_the_mismatch(
    catalog: Catalog, backend: Backend, c_seed: KernelContext, tmp_path: Path,
) -> None:
    check = backend_result_check(backend, catalog.spec("matmul"), "float32", str(tmp_path))
    assert check(c_seed) is None
    summary = check(c_seed.__class__(**{**vars(c_seed), "source": DROPS_LAST_ODD_ROW}))
    assert summary is not None
    first = summary.splitlines()[0]
    # the smallest check size, how many elements, the worst one; then examples
    assert first == ("output C not written (poison left) at 67x53x97: 53 of 3551 elements, "
                     "first C[66,0]")


def test_a_wrong_result_is_fixed_after_the_model_sees_the_mismatch(
    server: LLMServer, catalog: Catalog, backend: Backend, cpu: DeviceProfile,
    c_seed: KernelContext, interchange: Transformation, tmp_path: Path,
) -> None:
    server.script(reply(fenced(SKIPS_FIRST_K)), reply(fenced(INTERCHANGED)))
    applier = checked_applier(server, catalog, backend, tmp_path, repairs=1)
    child = applier.apply(c_seed, interchange, cpu)

    assert child.source == INTERCHANGED
    first, second = server.chat_requests()
    messages = second.body["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2]["content"] == fenced(SKIPS_FIRST_K)
    repair = messages[3]["content"]
    assert "computes wrong results" in repair
    assert "wrong result at 67x53x97:" in repair, repair
    assert "elements off, worst C[" in repair
    assert "largest error:" in repair
    assert repair.count("(expected ") >= 4  # the worst element and the first ones off
    assert [(r.turn, r.outcome) for r in applier.records] == [(0, "wrong_result"), (1, "ok")]
    assert applier.records[0].message.startswith("wrong result at 67x53x97")


def test_compile_errors_and_wrong_results_share_the_repair_budget(
    server: LLMServer, catalog: Catalog, backend: Backend, cpu: DeviceProfile,
    c_seed: KernelContext, interchange: Transformation, tmp_path: Path,
) -> None:
    server.script(reply(fenced(INTERCHANGED.replace("= 0;", "= 0"))),
                  reply(fenced(SKIPS_FIRST_K)), reply(fenced(INTERCHANGED)))
    applier = checked_applier(server, catalog, backend, tmp_path, repairs=1)
    with pytest.raises(WrongResultError, match="still computes wrong results after 1 repair"):
        applier.apply(c_seed, interchange, cpu)
    assert len(server.chat_requests()) == 2  # the third reply was never asked for
    assert [r.outcome for r in applier.records] == ["compile_error", "wrong_result"]

    server.behaviours.clear()
    server.script(reply(fenced(SKIPS_FIRST_K)), reply(fenced(INTERCHANGED.replace("= 0;", "= 0"))))
    with pytest.raises(UncompilableError, match="after 1 repair"):
        applier.apply(c_seed, interchange, cpu, sample=1)
    repair = server.chat_requests()[3].body["messages"][3]["content"]
    assert "computes wrong results" in repair
