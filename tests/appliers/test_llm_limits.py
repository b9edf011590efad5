"""The LLM client's caps, prices and budgets through the real openai client against the
local protocol server: Retry-After, requests per minute, requests in flight, cost."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from peak_tune.appliers.llm import BudgetExhausted
from peak_tune.appliers.llm.prices import load_prices
from peak_tune.catalog.resolve import Catalog
from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import KernelContext
from peak_tune.errors import BudgetReached, UserError
from tests.appliers.test_llm import INTERCHANGED, MODEL, applier_for, fenced
from tests.llm_server import LLMServer, error, reply, slow

pytestmark = pytest.mark.llm

PRICES = '[models."test-model"]\ninput = 2.0\noutput = 8.0\n'


@pytest.fixture(scope="module")
def loop(catalog: Catalog) -> Transformation:
    return catalog.transformations["loop-interchange"]


@pytest.fixture(scope="module")
def cpu() -> DeviceProfile:
    return DeviceProfile(name="cpu", title="test CPU", backend="c", peak_gflops={},
                         memory_bandwidth_gbs=0.0, facts={"cores": 2})


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer(models=(MODEL,)) as running:
        yield running


@pytest.fixture
def prices(tmp_path: Path) -> str:
    path = tmp_path / "prices.toml"
    path.write_text(PRICES)
    return str(path)


def test_429_then_success_waits_as_long_as_retry_after_asks(
    server: LLMServer, c_seed: KernelContext, loop: Transformation, cpu: DeviceProfile,
    prices: str,
) -> None:
    server.script(error(429, retry_after_s=0.6), reply(fenced(INTERCHANGED), 1000, 500))
    applier = applier_for(server, max_retries=2, backoff_s=0.01, prices_file=prices)
    child = applier.apply(c_seed, loop, cpu)
    assert child.source == INTERCHANGED
    first, second = server.chat_requests()
    assert second.at - first.at >= 0.55  # not the 0.01 s backoff
    assert [(r.outcome, r.cost_usd) for r in applier.records] == [
        ("rate_limited", 0.0), ("ok", pytest.approx((1000 * 2.0 + 500 * 8.0) / 1e6))]


def test_requests_per_minute_spaces_the_requests(
    server: LLMServer, c_seed: KernelContext, loop: Transformation, cpu: DeviceProfile,
) -> None:
    server.script(*[reply(fenced(INTERCHANGED))] * 3)
    applier = applier_for(server, requests_per_minute=150)  # one start per 0.4 s
    for sample in range(3):
        applier.apply(c_seed, loop, cpu, sample)
    times = [r.at for r in server.chat_requests()]
    assert len(times) == 3
    assert min(b - a for a, b in zip(times, times[1:], strict=False)) >= 0.37


def test_concurrency_caps_the_requests_in_flight(
    server: LLMServer, c_seed: KernelContext, loop: Transformation, cpu: DeviceProfile,
) -> None:
    server.script(*[slow(0.4, fenced(INTERCHANGED))] * 6)
    applier = applier_for(server, concurrency=2)
    threads = [threading.Thread(target=applier.apply, args=(c_seed, loop, cpu, sample))
               for sample in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(server.chat_requests()) == 6
    assert [r.outcome for r in applier.records] == ["ok"] * 6
    assert server.max_in_flight == 2


def test_cost_is_usage_times_the_price_table(
    server: LLMServer, c_seed: KernelContext, loop: Transformation, cpu: DeviceProfile,
    prices: str,
) -> None:
    server.script(reply(fenced(INTERCHANGED), 1200, 300), reply("no code", 800, 100))
    applier = applier_for(server, prices_file=prices, repairs=0)
    applier.apply(c_seed, loop, cpu)
    with pytest.raises(Exception, match="no fenced code block"):
        applier.apply(c_seed, loop, cpu, sample=1)
    expected = [(1200 * 2.0 + 300 * 8.0) / 1e6, (800 * 2.0 + 100 * 8.0) / 1e6]
    assert [r.cost_usd for r in applier.records] == pytest.approx(expected)
    usage = applier.usage()["loop-interchange"]
    assert (usage.calls, usage.total_tokens) == (2, 2400)
    assert usage.cost_usd == pytest.approx(sum(expected))


def test_a_model_without_a_price_has_an_unknown_cost(
    server: LLMServer, c_seed: KernelContext, loop: Transformation, cpu: DeviceProfile,
) -> None:
    server.script(reply(fenced(INTERCHANGED)))
    applier = applier_for(server)
    applier.apply(c_seed, loop, cpu)
    assert applier.records[0].cost_usd is None
    assert applier.usage()["loop-interchange"].cost_usd is None
    with pytest.raises(UserError, match="--max-cost needs the price of model 'test-model'"):
        applier_for(server, max_cost_usd=1.0)


def test_the_cost_budget_stops_the_next_call(
    server: LLMServer, c_seed: KernelContext, loop: Transformation, cpu: DeviceProfile,
    prices: str,
) -> None:
    server.script(reply(fenced(INTERCHANGED), 2000, 500), reply(fenced(INTERCHANGED)))
    applier = applier_for(server, prices_file=prices, max_cost_usd=0.005)
    applier.apply(c_seed, loop, cpu)  # $0.008: the call that crosses the budget completes
    assert not applier.budget_left()
    with pytest.raises(BudgetExhausted, match=r"cost budget of \$0.005 exhausted") as caught:
        applier.apply(c_seed, loop, cpu, sample=1)
    assert isinstance(caught.value, BudgetReached)
    assert len(server.chat_requests()) == 1


def test_price_tables_extend_override_and_fail_clearly(tmp_path: Path) -> None:
    builtin = load_prices()
    assert builtin["gpt-4o-mini"].input_per_mtok > 0
    own = tmp_path / "own.toml"
    own.write_text('[models."gpt-4o-mini"]\ninput = 0\noutput = 0\n' + PRICES)
    table = load_prices(str(own))
    assert table["gpt-4o-mini"].cost_usd(10**6, 10**6) == 0.0
    assert table["test-model"].cost_usd(10**6, 10**6) == 10.0
    assert "o4-mini" in table  # the built-in entries stay
    own.write_text('[models."m"]\ninput = 1\n')
    with pytest.raises(UserError, match=r"models.'m' needs exactly `input` and `output`"):
        load_prices(str(own))
    own.write_text('[models."m"]\ninput = -1\noutput = 1\n')
    with pytest.raises(UserError, match="not a non-negative number"):
        load_prices(str(own))
    own.write_text("models = [")
    with pytest.raises(UserError, match="not valid TOML"):
        load_prices(str(own))
    with pytest.raises(UserError, match="does not exist"):
        load_prices(str(tmp_path / "missing.toml"))


def test_a_call_in_flight_when_the_study_stops_is_journaled_as_interrupted_once(
    server: LLMServer, c_seed: KernelContext, loop: Transformation, cpu: DeviceProfile,
) -> None:
    from peak_tune.appliers.llm import EndpointError

    server.script(slow(1.5, fenced(INTERCHANGED)))
    applier = applier_for(server)
    failed: list[BaseException] = []

    def apply() -> None:
        try:
            applier.apply(c_seed, loop, cpu)
        except BaseException as exc:  # noqa: BLE001  # what the thread ended with
            failed.append(exc)

    thread = threading.Thread(target=apply)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.chat_requests() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert applier.abandon_in_flight() == 1  # the study stops with the call unanswered
    thread.join(timeout=30)
    assert [r.outcome for r in applier.records] == ["interrupted"]  # not again when it lands
    assert isinstance(failed[0], EndpointError) and "stopped" in str(failed[0])
    assert applier.abandon_in_flight() == 0
