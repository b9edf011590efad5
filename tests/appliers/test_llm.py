"""The LLM applier through the real openai client against a local server (tests/llm_server)."""

from __future__ import annotations

import json
import logging
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from peak_tune.appliers import make_applier
from peak_tune.appliers.llm import (
    PROMPT_VERSION,
    BadLaunchError,
    DeadParameterError,
    EndpointError,
    LLMApplier,
    LLMConfig,
    MissingParameterError,
    NoCodeError,
    ScopeError,
    UnchangedError,
    UncompilableError,
    backend_compile_check,
    check_endpoint,
)
from peak_tune.appliers.llm.compile_check import sample_point
from peak_tune.appliers.llm.parse import entry_signature
from peak_tune.appliers.llm.regions import split
from peak_tune.appliers.reference import ReferenceApplier
from peak_tune.backends import make_backend
from peak_tune.catalog.resolve import Catalog
from peak_tune.catalog.types import DeviceProfile, Pass, Transformation
from peak_tune.core import KernelContext, ParamDomain
from peak_tune.errors import ApplyError, UserError
from peak_tune.evaluation.cache import Cache, application_key
from tests.llm_server import LLMServer, error, reply, slow, truncated

pytestmark = pytest.mark.llm

KEY = "sk-test-4f9c2b7e1d0a8c6e5f3b"
SEED_C = (Path(__file__).resolve().parents[2] / "seeds" / "matmul" / "naive.c").read_text()
MODEL = "test-model"

INTERCHANGED = """\
void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) C[i * N + j] = 0;
        for (int k = 0; k < K; k++)
            for (int j = 0; j < N; j++) C[i * N + j] += A[i * K + k] * B[k * N + j];
    }
}
"""

BLOCKED = """\
#ifndef MC
#error "MC must be defined"
#endif
#ifndef NC
#error "NC must be defined"
#endif
#ifndef KC
#error "KC must be defined"
#endif
static inline int pt_min(int a, int b) { return a < b ? a : b; }

void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    for (int ib = 0; ib < M; ib += MC) {
        const int ie = pt_min(ib + MC, M);
        for (int jb = 0; jb < N; jb += NC) {
            const int je = pt_min(jb + NC, N);
            for (int kb = 0; kb < K; kb += KC) {
                const int ke = pt_min(kb + KC, K);
                const int first = kb == 0;
                for (int i = ib; i < ie; i++)
                    for (int j = jb; j < je; j++) {
                        DTYPE acc = 0;
                        for (int k = kb; k < ke; k++) acc += A[i * K + k] * B[k * N + j];
                        C[i * N + j] = first ? acc : C[i * N + j] + acc;
                    }
            }
        }
    }
}
"""


def fenced(code: str, language: str = "c") -> str:
    return f"```{language}\n{code}```"


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def cpu() -> DeviceProfile:
    return DeviceProfile(name="cpu", title="test CPU", backend="c", peak_gflops={},
                         memory_bandwidth_gbs=0.0,
                         facts={"vector_bits": 256, "cores": 2, "l1d_kib": 48, "l2_kib": 2048})


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer(models=(MODEL, "other-model")) as running:
        yield running


def config_for(server: LLMServer, **settings: object) -> LLMConfig:
    values: dict[str, object] = {"max_retries": 2, "backoff_s": 0.01, "timeout_s": 10.0,
                                 "repairs": 1}
    values.update(settings)
    return LLMConfig(model=MODEL, base_url=server.url + "/v1", **values)  # type: ignore[arg-type]


def applier_for(server: LLMServer, compile_check: Callable[[KernelContext], str | None]
                | None = None, **settings: object) -> LLMApplier:
    client = OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    return LLMApplier(config_for(server, **settings), compile_check=compile_check,
                      client=client)


def gcc_syntax_check(folder: Path) -> Callable[[KernelContext], str | None]:
    """The compiler's errors for a C variant (each parameter at its first value)."""
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("gcc is not installed")

    def check(context: KernelContext) -> str | None:
        path = folder / f"{context.content_hash()[:16]}.c"
        path.write_text(context.source)
        defines = [f"-D{p.name}={p.values[0]}" for p in context.params]
        done = subprocess.run([cc, "-fsyntax-only", "-DDTYPE=float", *defines, str(path)],
                              capture_output=True, text=True, timeout=60)
        return done.stderr if done.returncode else None

    return check


# ------------------------------------------------------------------ applying


def test_applies_loop_interchange_and_the_child_computes_matmul(
    server: LLMServer, catalog: Catalog, c_seed: KernelContext, cpu: DeviceProfile,
    compiler: Callable[..., Callable[..., None]], check: Callable[..., None],
) -> None:
    server.script(reply("Here it is:\n" + fenced(INTERCHANGED), 1200, 300))
    applier = applier_for(server)
    child = applier.apply(c_seed, catalog.transformations["loop-interchange"], cpu)

    assert child.source == INTERCHANGED
    assert child.applied == ("loop-interchange",)
    assert child.lineage is not None
    assert child.lineage.parent_hash == c_seed.content_hash()
    assert child.lineage.applier == applier.identity == f"llm/{MODEL}@t0.2/p{PROMPT_VERSION}"
    check(compiler(child.source, {}))  # the edited kernel really computes C = A x B

    (request,) = server.chat_requests()
    messages = request.body["messages"]
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "#ifndef" in messages[0]["content"] and "one fenced code block" in messages[0]["content"]
    assert c_seed.source.strip() in messages[1]["content"]
    assert "Swap the two loops" in messages[1]["content"]
    assert request.body["model"] == MODEL and request.body["temperature"] == 0.2
    (record,) = applier.records
    assert (record.outcome, record.prompt_tokens, record.completion_tokens) == ("ok", 1200, 300)
    assert applier.usage()["loop-interchange"].total_tokens == 1500


def test_device_facts_fill_placeholders_and_params_are_declared(
    server: LLMServer, catalog: Catalog, c_seed: KernelContext, cpu: DeviceProfile,
) -> None:
    server.script(reply(fenced(BLOCKED)))
    blocking = catalog.transformations["cache-blocking"]
    child = applier_for(server).apply(c_seed, blocking, cpu)

    assert [p.name for p in child.params] == ["MC", "NC", "KC"]
    assert all(p.introduced_by == "cache-blocking" for p in child.params)
    prompt = server.chat_requests()[0].body["messages"][1]["content"]
    assert "L2 (2048 KiB)" in prompt and "{l2_kib}" not in prompt
    assert "MC (one of 32, 48" in prompt


def test_missing_device_fact_is_an_error_not_a_blank(
    server: LLMServer, catalog: Catalog, c_seed: KernelContext,
) -> None:
    bare = DeviceProfile(name="bare", title="no facts", backend="c", peak_gflops={},
                         memory_bandwidth_gbs=0.0)
    with pytest.raises(ApplyError, match=r"no value for the placeholder \{l2_kib\}"):
        applier_for(server).apply(c_seed, catalog.transformations["cache-blocking"], bare)
    assert server.chat_requests() == []


def test_compile_error_is_repaired_with_the_real_compiler(
    server: LLMServer, catalog: Catalog, c_seed: KernelContext, cpu: DeviceProfile,
    tmp_path: Path,
) -> None:
    broken = BLOCKED.replace("pt_min(kb + KC, K);", "pt_min(kb + KC, K)")
    server.script(reply(fenced(broken)), reply(fenced(BLOCKED)))
    applier = applier_for(server, gcc_syntax_check(tmp_path), repairs=2)
    child = applier.apply(c_seed, catalog.transformations["cache-blocking"], cpu)

    assert child.source == BLOCKED
    first, second = server.chat_requests()
    repair = second.body["messages"]
    assert [m["role"] for m in repair] == ["system", "user", "assistant", "user"]
    assert repair[2]["content"] == fenced(broken)
    assert "failed to compile" in repair[3]["content"] and "error" in repair[3]["content"]
    assert [(r.turn, r.outcome) for r in applier.records] == [(0, "compile_error"), (1, "ok")]


def test_code_that_never_compiles_fails_after_the_repairs(
    server: LLMServer, catalog: Catalog, c_seed: KernelContext, cpu: DeviceProfile,
    tmp_path: Path,
) -> None:
    broken = fenced(INTERCHANGED.replace("= 0;", "= 0"))
    server.script(reply(broken), reply(broken))
    applier = applier_for(server, gcc_syntax_check(tmp_path), repairs=1)
    with pytest.raises(UncompilableError, match="still fails to compile after 1 repair"):
        applier.apply(c_seed, catalog.transformations["loop-interchange"], cpu)
    assert len(server.chat_requests()) == 2
    assert [r.outcome for r in applier.records] == ["compile_error", "compile_error"]


def test_backend_compile_check_repairs_with_the_c_backend(
    server: LLMServer, catalog: Catalog, c_seed: KernelContext, cpu: DeviceProfile,
    tmp_path: Path,
) -> None:
    backend = make_backend("c", catalog.device("cpu"))
    try:
        compile_check = backend_compile_check(backend, "float32", str(tmp_path))
        assert compile_check(c_seed) is None
        server.script(reply(fenced(BLOCKED.replace("ib += MC)", "ib += MC"))),
                      reply(fenced(BLOCKED)))
        applier = applier_for(server, compile_check, repairs=1)
        child = applier.apply(c_seed, catalog.transformations["cache-blocking"], cpu)
    finally:
        backend.close()
    assert child.source == BLOCKED
    repair = server.chat_requests()[1].body["messages"][3]["content"]
    assert "error" in repair and "ib += MC" in repair  # the compiler's own log
    assert str(tmp_path) not in repair and "/tmp/" not in repair  # no local folder
    assert applier.records[0].message.startswith("line ")  # the error, not the command
    assert "expected" in applier.records[0].message


def test_sample_point_meets_the_constraints() -> None:
    context = KernelContext(
        kernel="k", backend="c", source="", entry="k",
        params=(ParamDomain("MR", (4, 8)), ParamDomain("MC", (4, 6, 16))),
        constraints=("MC % MR == 0", "MC > MR"),
    )
    assert sample_point(context) == {"MR": 4, "MC": 16}
    assert sample_point(KernelContext(kernel="k", backend="c", source="", entry="k")) == {}


# ------------------------------------------------------------------ reply failures


@pytest.mark.parametrize(
    ("content", "error_type", "message"),
    [
        ("I would swap the loops, then zero C first.", NoCodeError, "no fenced code block"),
        (fenced(INTERCHANGED) + "\nand\n" + fenced(INTERCHANGED), NoCodeError, "2 fenced"),
        (fenced(INTERCHANGED.replace("int K)", "int K, int lda)")), ScopeError,
         "signature changed"),
        (fenced(INTERCHANGED.replace("void matmul(", "void matmul_v2(")), ScopeError,
         "no longer defines"),
        (fenced(SEED_C), UnchangedError, "kernel as it was given: loop-interchange was not"),
    ],
    ids=["no-code", "two-blocks", "signature", "renamed", "echoed"],
)
def test_a_reply_that_does_not_do_the_step_goes_back_and_then_fails_typed(
    server: LLMServer, catalog: Catalog, c_seed: KernelContext, cpu: DeviceProfile,
    content: str, error_type: type[Exception], message: str,
) -> None:
    assert c_seed.source == SEED_C
    server.script(reply(content), reply(content))
    applier = applier_for(server)  # one repair
    with pytest.raises(error_type, match=message) as caught:
        applier.apply(c_seed, catalog.transformations["loop-interchange"], cpu)
    assert "after 1 repair" in str(caught.value)
    first, second = server.chat_requests()  # the model was told, once
    repair = second.body["messages"][-1]["content"]
    assert repair.startswith("The reply cannot be accepted: ") and message.split(":")[0] in repair
    assert [r.outcome for r in applier.records][0] in ("no_code", "scope", "unchanged")


def test_two_blocks_then_one_is_accepted_after_the_repair(
    server: LLMServer, catalog: Catalog, c_seed: KernelContext, cpu: DeviceProfile,
) -> None:
    server.script(reply(fenced(INTERCHANGED) + "\nor\n" + fenced(INTERCHANGED)),
                  reply(fenced(INTERCHANGED)))
    applier = applier_for(server)
    child = applier.apply(c_seed, catalog.transformations["loop-interchange"], cpu)
    assert child.source == INTERCHANGED
    assert [(r.turn, r.outcome) for r in applier.records] == [(0, "no_code"), (1, "ok")]


def test_a_reply_cut_off_at_the_token_limit_is_asked_again(
    server: LLMServer, catalog: Catalog, c_seed: KernelContext, cpu: DeviceProfile,
) -> None:
    half = fenced(INTERCHANGED)[: len(fenced(INTERCHANGED)) // 2]
    server.script(truncated(half + "\n```"), reply(fenced(INTERCHANGED)))
    applier = applier_for(server)
    child = applier.apply(c_seed, catalog.transformations["loop-interchange"], cpu)
    assert child.source == INTERCHANGED
    repair = server.chat_requests()[1].body["messages"][-1]["content"]
    assert "cut off at the endpoint's token limit" in repair
    assert [r.outcome for r in applier.records] == ["truncated", "ok"]


def test_a_declared_parameter_missing_from_the_code(
    server: LLMServer, catalog: Catalog, c_seed: KernelContext, cpu: DeviceProfile,
) -> None:
    without_kc = BLOCKED.replace("KC", "64")
    server.script(reply(fenced(without_kc)), reply(fenced(without_kc)))
    applier = applier_for(server)
    with pytest.raises(MissingParameterError, match="KC never appear.*after 1 repair"):
        applier.apply(c_seed, catalog.transformations["cache-blocking"], cpu)
    assert [r.outcome for r in applier.records] == ["missing_param", "missing_param"]


def test_a_hard_coded_parameter_is_dead_and_the_repair_restores_it(
    server: LLMServer, catalog: Catalog, c_seed: KernelContext, cpu: DeviceProfile,
) -> None:
    hard_coded = BLOCKED.replace('#ifndef KC\n#error "KC must be defined"\n#endif',
                                 "#define KC 64")
    assert hard_coded != BLOCKED
    server.script(reply(fenced(hard_coded)), reply(fenced(BLOCKED)))
    applier = applier_for(server)
    child = applier.apply(c_seed, catalog.transformations["cache-blocking"], cpu)
    assert child.source == BLOCKED
    repair = server.chat_requests()[1].body["messages"][-1]["content"]
    assert "tuning parameter(s) KC no longer change the code" in repair
    assert [r.outcome for r in applier.records] == ["dead_param", "ok"]


def test_a_reply_that_drops_an_earlier_steps_pragma_is_not_accepted(
    server: LLMServer, catalog: Catalog, c_seed: KernelContext, cpu: DeviceProfile,
) -> None:
    """The OpenMP step's pragma goes, its OMP_CHUNK guard stays: the parameter is dead,
    and the study would have labelled a serial kernel '... > openmp-parallel'."""
    parallel = ReferenceApplier().apply(c_seed, catalog.transformations["openmp-parallel"],
                                        cpu)
    kept = parallel.source.replace("DTYPE acc = 0;", "DTYPE acc = (DTYPE)0;")
    dropped = kept.replace("    #pragma omp parallel for schedule(static, OMP_CHUNK)\n", "")
    assert "OMP_CHUNK" in dropped and dropped != kept
    server.script(reply(fenced(dropped)), reply(fenced(dropped)))
    applier = applier_for(server)
    with pytest.raises(DeadParameterError, match="OMP_CHUNK no longer change"):
        applier.apply(parallel, catalog.transformations["loop-interchange"], cpu)
    server.behaviours.clear()
    server.script(reply(fenced(kept)))
    child = applier.apply(parallel, catalog.transformations["loop-interchange"], cpu, sample=1)
    assert "schedule(static, OMP_CHUNK)" in child.source


def test_signature_check_allows_restrict_and_launch_bounds() -> None:
    plain = entry_signature('extern "C" __global__ void f(const float *A, int n) {', "f")
    bounded = entry_signature(
        'extern "C" __global__ void __launch_bounds__(256, 2)\n'
        "f(const float * __restrict__ A,\n   int n)\n{", "f")
    assert plain == bounded == 'extern "C" __global__ void f(const float *A, int n)'
    assert entry_signature("void f(float *A) {", "f") != entry_signature("void f(double *A) {", "f")


# ------------------------------------------------------------------ launch passes


def _cuda_pair() -> tuple[KernelContext, Transformation]:
    source = ('extern "C" __global__ void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, '
              "int M, int N, int K) {\n  /* BM */\n}\n")
    seed = KernelContext(kernel="matmul", backend="cuda", source=source, entry="matmul",
                         launch={"grid_x": "ceil_div(N, 16)", "block_x": "16"})
    step = Transformation(
        id="tile", version=1, title="Tile", kernels=("matmul",), backends=("cuda",),
        requires=(), conflicts=(), params=(ParamDomain("BM", (32, 64)),), constraints=(),
        passes=(Pass("device", "Use {BM} rows per block ({warp_size} lanes a warp)."),
                Pass("launch", "One block per BM x BM tile.")),
    )
    return seed, step


def test_launch_pass_returns_validated_expressions(server: LLMServer) -> None:
    seed, step = _cuda_pair()
    h200 = DeviceProfile(name="h200", title="H200", backend="cuda", peak_gflops={},
                         memory_bandwidth_gbs=0.0, facts={"warp_size": 32})
    launch = {"grid_x": "ceil_div(N, BM)", "grid_y": "ceil_div(M, BM)", "block_x": "BM"}
    server.script(reply(fenced(seed.source, "cuda")),
                  reply(fenced(json.dumps(launch), "json")),
                  reply(fenced(seed.source, "cuda")),
                  reply(fenced(json.dumps({"grid_x": "N / TILE", "block_x": "BM"}), "json")),
                  reply(fenced(json.dumps({"grid_x": "N / TILE", "block_x": "BM"}), "json")))
    applier = applier_for(server)  # one repair: the bad launch is sent back once
    child = applier.apply(seed, step, h200)
    assert dict(child.launch) == launch
    assert "Use BM rows per block (32 lanes a warp)." in server.chat_requests()[0].body[
        "messages"][1]["content"]
    assert '"grid_x": "ceil_div(N, 16)"' in server.chat_requests()[1].body["messages"][1][
        "content"]
    with pytest.raises(BadLaunchError, match=r"unknown name\(s\) \['TILE'\]"):
        applier.apply(seed, step, h200, sample=1)


# ------------------------------------------------------------------ transport


def test_429_and_500_are_retried_with_every_attempt_recorded(
    server: LLMServer, catalog: Catalog, c_seed: KernelContext, cpu: DeviceProfile,
) -> None:
    server.script(error(429), error(500), reply(fenced(INTERCHANGED)))
    applier = applier_for(server, max_retries=2)
    applier.apply(c_seed, catalog.transformations["loop-interchange"], cpu)
    assert len(server.chat_requests()) == 3
    assert [(r.attempt, r.outcome) for r in applier.records] == [
        (1, "rate_limited"), (2, "server_error"), (3, "ok")]


def test_500_three_times_exhausts_the_retries(
    server: LLMServer, catalog: Catalog, c_seed: KernelContext, cpu: DeviceProfile,
) -> None:
    server.script(error(500), error(500), error(500))
    applier = applier_for(server, max_retries=2)
    with pytest.raises(EndpointError, match="failed 3 time") as caught:
        applier.apply(c_seed, catalog.transformations["loop-interchange"], cpu)
    assert f"the endpoint {server.url}/v1 failed" in str(caught.value)  # which one
    assert len(server.chat_requests()) == 3
    assert [r.outcome for r in applier.records] == ["server_error"] * 3


def test_4xx_is_not_retried(
    server: LLMServer, catalog: Catalog, c_seed: KernelContext, cpu: DeviceProfile,
) -> None:
    server.script(error(400), reply(fenced(INTERCHANGED)))
    with pytest.raises(EndpointError, match="refused"):
        applier_for(server).apply(c_seed, catalog.transformations["loop-interchange"], cpu)
    assert len(server.chat_requests()) == 1


def test_a_slow_reply_times_out_and_is_retried(
    server: LLMServer, catalog: Catalog, c_seed: KernelContext, cpu: DeviceProfile,
) -> None:
    server.script(slow(2.0), reply(fenced(INTERCHANGED)))
    applier = applier_for(server, timeout_s=0.3, max_retries=1)
    applier.apply(c_seed, catalog.transformations["loop-interchange"], cpu)
    assert [r.outcome for r in applier.records] == ["timeout", "ok"]
    server.script(slow(2.0))
    stubborn = applier_for(server, timeout_s=0.3, max_retries=0)
    with pytest.raises(EndpointError, match="APITimeoutError"):
        stubborn.apply(c_seed, catalog.transformations["loop-interchange"], cpu)


def test_token_budget_stops_the_next_call(
    server: LLMServer, catalog: Catalog, c_seed: KernelContext, cpu: DeviceProfile,
) -> None:
    server.script(reply(fenced(INTERCHANGED), 900, 200))
    applier = applier_for(server, max_tokens_total=1000)
    applier.apply(c_seed, catalog.transformations["loop-interchange"], cpu)
    with pytest.raises(EndpointError, match="token budget of 1000 exhausted"):
        applier.apply(c_seed, catalog.transformations["loop-interchange"], cpu, sample=1)
    assert len(server.chat_requests()) == 1


# ------------------------------------------------------------------ secrets and config


def test_the_key_only_travels_in_the_authorization_header(
    server: LLMServer, catalog: Catalog, c_seed: KernelContext, cpu: DeviceProfile,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
    caplog.set_level(logging.DEBUG)  # every logger: ours, openai, httpx
    config = LLMConfig.from_env(MODEL, max_retries=1, backoff_s=0.0, repairs=0)
    applier = LLMApplier(config)  # builds its own client, reading the key now
    server.script(error(429), reply(fenced(INTERCHANGED)), reply("no code"))
    loop = catalog.transformations["loop-interchange"]
    child = applier.apply(c_seed, loop, cpu)
    with pytest.raises(NoCodeError):
        applier.apply(c_seed, loop, cpu, sample=1)
    cache = Cache(tmp_path / "cache")
    key = application_key(c_seed.content_hash(), loop.id, loop.version, loop.text_hash(),
                          applier.identity, 0)
    cache.put_application(key, {"child": cache.put_context(child)})

    cached = "".join(p.read_text() for p in (tmp_path / "cache").rglob("*") if p.is_file())
    for text in (repr(config), str(config), applier.identity, repr(applier.records),
                 repr(applier.usage()), repr(child), caplog.text, cached):
        assert KEY not in text
    assert caplog.text  # the applier did log
    requests = server.chat_requests()
    assert len(requests) == 3
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in requests)
    assert all(KEY not in json.dumps(r.body) for r in requests)


def test_config_from_env_and_its_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "https://user:secret@llm.example/v1?token=abc")
    monkeypatch.setenv("OPENAI_MODEL", "m1")
    config = LLMConfig.from_env(temperature=0.0)
    assert config.model == "m1" and config.temperature == 0.0
    assert "secret" not in repr(config) and "abc" not in repr(config)
    assert "llm.example/v1" in repr(config)
    with pytest.raises(UserError, match="unknown LLM setting"):
        LLMConfig.from_env("m", temprature=0.1)
    with pytest.raises(UserError, match="repairs"):
        LLMConfig(model="m", repairs=-1)
    monkeypatch.delenv("OPENAI_MODEL")
    with pytest.raises(UserError, match="model name"):
        LLMConfig.from_env()
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(UserError, match="OPENAI_API_KEY is not set"):
        LLMConfig(model="m").api_key()


def test_registry_builds_the_llm_applier(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_MODEL", "reg-model")
    applier = make_applier("llm")
    assert applier.identity == f"llm/reg-model@t0.2/p{PROMPT_VERSION}"


# ------------------------------------------------------------------ check_endpoint


def test_check_endpoint_against_the_server(
    server: LLMServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server.script(reply("ok"))
    report = check_endpoint(config_for(server))
    assert report.ok and report.models_ok and report.model_listed
    assert report.messages[0] == f"models: 2 listed, {MODEL} among them"
    assert report.messages[1].startswith("completion: 'ok' in ")
    assert KEY not in repr(report)


def test_check_endpoint_against_a_closed_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    report = check_endpoint(LLMConfig(model=MODEL, base_url=f"http://127.0.0.1:{port}/v1"))
    assert not report.ok and not report.models_ok
    assert report.messages == (
        f"models: cannot connect to http://127.0.0.1:{port}/v1 (ConnectError)",
        f"completion: cannot connect to http://127.0.0.1:{port}/v1 (ConnectError)",
    )


# ------------------------------------------------------------------ HLSL


def test_an_hlsl_step_gets_the_shader_vocabulary_and_a_grid_only_launch(
    server: LLMServer, catalog: Catalog, tmp_path: Path,
) -> None:
    """tb-tiling on the HLSL seed: the passes carry the CUDA-to-HLSL table with the
    device's limits filled in, a reply that does not compile goes back to glslang's
    log, and the launch is the grid alone (block_x is refused; group_x may be used)."""
    from peak_tune.appliers.reference import ReferenceApplier
    from tests.backends.test_hlsl_toolchain import COMPILERS_HERE

    if not COMPILERS_HERE:
        pytest.skip("no HLSL compiler on PATH")
    lavapipe = catalog.device("lavapipe")
    seed = KernelContext(kernel="matmul", backend="hlsl", entry="main",
                         source=(Path(__file__).parents[2] / "seeds/matmul/naive.hlsl")
                         .read_text(),
                         launch={"grid_x": "ceil_div(N, group_x)",
                                 "grid_y": "ceil_div(M, group_y)"})
    reference = ReferenceApplier()
    refactored = reference.apply(seed, catalog.transformation("refactor"), lavapipe)
    tiled = reference.apply(refactored, catalog.transformation("tb-tiling"), lavapipe)
    grid = {"grid_x": "ceil_div(N, group_x)", "grid_y": "ceil_div(M, BLOCK_M)"}  # group_x: BLOCK_N
    macros = split(tiled.source).macros  # pass 1 asks for the macros region alone
    server.script(reply(fenced(macros, "hlsl")),
                  reply(fenced(tiled.source.replace("GroupMemoryBarrierWithGroupSync();",
                                                    "__syncthreads();", 1), "hlsl")),
                  reply(fenced(tiled.source, "hlsl")),
                  reply(fenced(json.dumps(grid), "json")),
                  reply(fenced(macros, "hlsl")), reply(fenced(tiled.source, "hlsl")),
                  reply(fenced(json.dumps({**grid, "block_x": "BLOCK_N"}), "json")),
                  reply(fenced(json.dumps({**grid, "block_x": "BLOCK_N"}), "json")))
    backend = make_backend("hlsl", lavapipe)
    try:
        applier = applier_for(server, backend_compile_check(backend, "float32",
                                                            str(tmp_path)), repairs=1)
        child = applier.apply(refactored, catalog.transformation("tb-tiling"), lavapipe)
        with pytest.raises(BadLaunchError, match=r"unknown launch key\(s\) \['block_x'\]"):
            applier.apply(refactored, catalog.transformation("tb-tiling"), lavapipe, sample=1)
    finally:
        backend.close()
    assert child.source == tiled.source and dict(child.launch) == grid
    asked = [r.body["messages"] for r in server.chat_requests()]
    first = asked[0][1]["content"]
    assert "Reply with the macros region alone" in first
    assert "Reply with the device code alone, from `" in asked[1][1]["content"]
    assert "this kernel is an HLSL compute shader for Vulkan" in first
    assert "at most 1024 threads" in first and "at most 32 KiB" in first  # lavapipe's
    assert "__syncthreads" in asked[2][3]["content"]  # glslang's own log, for the repair
    launch_rules = asked[3][0]["content"]
    assert "grid_x is required" in launch_rules and "[numthreads(...)]" in launch_rules
    assert "block_x" not in launch_rules
