"""`peak-tune --applier llm` end to end: the real openai client, a local server speaking
the protocol, the real C backend and study."""

from __future__ import annotations

import csv
import importlib.util
import json
import socket
from pathlib import Path

import optuna
import pytest

from tests.appliers.test_llm import INTERCHANGED, KEY, fenced
from tests.llm_server import LLMServer, reply
from tests.test_cli import SMALL, last_json, peak

pytestmark = pytest.mark.llm


def endpoint(url: str) -> dict[str, str]:
    return {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": KEY, "OPENAI_MODEL": "test-model"}


def chat_calls(server: LLMServer) -> int:
    return sum(r.path.endswith("/chat/completions") for r in server.received)


def test_llm_applier_tunes_and_a_repeat_makes_no_call(tmp_path: Path) -> None:
    args = ["--sequence", "loop-interchange", "--trials", "3", *SMALL, "--json",
            "--results", str(tmp_path)]
    with LLMServer() as server:
        server.script(reply(fenced(INTERCHANGED)))
        done = peak(*args, env=endpoint(server.url + "/v1"))
        assert done.returncode == 0, done.stderr
        data = last_json(done.stdout)
        assert data["best"]["sequence"] == ["loop-interchange"]
        assert data["trials"]["complete"] == 3
        assert chat_calls(server) == 1  # one application serves every tuning point
        [asked] = server.chat_requests()
        prompt = asked.body["messages"][-1]["content"]
        # the model is told how its kernel is built and where it is checked
        assert "## How the kernel is built and checked" in prompt
        assert "-O3 -march=native -fopenmp" in prompt and "-DDTYPE=float" in prompt
        assert "67x53x97, 257x293x331" in prompt and "A @ B" in prompt
        again = peak(*args, env=endpoint(server.url + "/v1"))
        assert again.returncode == 0, again.stderr
        assert chat_calls(server) == 1  # the repeat comes from the cache
        repeat = last_json(again.stdout)
        assert repeat["cache"]["compiles"] == 0 and repeat["cache"]["misses"] == 0
        assert repeat["best"]["params"] == data["best"]["params"]
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def test_stats_report_success_per_transformation_and_position(tmp_path: Path) -> None:
    with LLMServer() as server:
        refusal = reply("I would rather not write code.")
        server.script(reply(fenced(INTERCHANGED)), refusal, refusal)  # asked again once
        for sequence in ("loop-interchange", "unroll-k"):
            done = peak("--sequence", sequence, "--trials", "2", *SMALL, "--results",
                        str(tmp_path), "--repairs", "1", env=endpoint(server.url + "/v1"))
            assert done.returncode == 0, done.stderr
    table = tmp_path / "stats.csv"
    shown = peak("stats", "--results", str(tmp_path), "--csv", str(table))
    assert shown.returncode == 0, shown.stderr
    rows = {r["transformation"]: r for r in csv.DictReader(table.open())}
    assert rows["loop-interchange"]["success_rate"] == "1.0"
    assert rows["loop-interchange"]["position"] == "0"
    assert rows["unroll-k"]["success_rate"] == "0.0"
    assert json.loads(rows["unroll-k"]["failures"]) == {"no_code": 1}  # one application
    assert json.loads(rows["unroll-k"]["check_failures"]) == {"no_code": 2}  # both replies
    assert rows["unroll-k"]["repaired"] == rows["loop-interchange"]["repaired"] == "0"
    assert "no_code 2 (0)" in shown.stdout
    # the report of the unroll-k study shows the same, for a person
    if importlib.util.find_spec("matplotlib") is not None:
        pictured = peak("report", "--results", str(tmp_path), "-o", str(tmp_path / "page"))
        assert pictured.returncode == 0, pictured.stderr
        page = (tmp_path / "page" / "report.html").read_text()
        assert "<h3>LLM steps</h3>" in page
        assert "<td>unroll-k</td><td>0</td><td>1</td><td>0</td><td>no_code 2</td>" in page


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_unreachable_endpoint_stops_with_one_line_and_keeps_the_study(tmp_path: Path) -> None:
    first = peak("--trials", "2", *SMALL, "--json", "--results", str(tmp_path), "--study", "s",
                 "--applier", "reference")
    assert first.returncode == 0, first.stderr
    url = f"http://127.0.0.1:{closed_port()}/v1"
    done = peak("--sequence", "loop-interchange", "--trials", "2", *SMALL, "--results",
                str(tmp_path), env=endpoint(url), timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/peak.db")
    assert len(study.trials) == 2
    assert KEY not in done.stderr


def test_llm_check_reports_on_the_endpoint() -> None:
    with LLMServer() as server:
        server.script(reply("pong"))
        done = peak("llm", "check", env=endpoint(server.url + "/v1"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "test-model" in done.stdout
    down = peak("llm", "check", env=endpoint(f"http://127.0.0.1:{closed_port()}/v1"))
    assert down.returncode == 2
    assert "cannot connect" in down.stdout
    assert KEY not in down.stdout + down.stderr


def test_a_study_config_file_sets_the_endpoint_model_and_settings(tmp_path: Path) -> None:
    with LLMServer(models=("file-model",)) as server:
        server.script(reply(fenced(INTERCHANGED)))
        config = tmp_path / "llm.toml"
        config.write_text(f'model = "file-model"\nbase_url = "{server.url}/v1"\n'
                          "temperature = 0.7\nrepairs = 1\n")
        done = peak("--llm-config", str(config), "--sequence", "loop-interchange",
                    "--trials", "2", *SMALL, "--json", "--results", str(tmp_path / "r"),
                    env={"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
        assert done.returncode == 0, done.stderr
        (request,) = server.chat_requests()
    assert request.body["model"] == "file-model"
    assert request.body["temperature"] == 0.7
    assert last_json(done.stdout)["best"]["sequence"] == ["loop-interchange"]


@pytest.mark.parametrize(("text", "message"), [
    ('model = "m"\napi_key = "sk-in-a-file"\n', "API keys do not go in files"),
    ('model = "m"\ntemprature = 0.1\n', "unknown LLM setting(s) temprature"),
    ('model = "m"\ntemperature = \n', "not valid TOML"),
])
def test_a_bad_study_config_file_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "llm.toml"
    config.write_text(text)
    done = peak("--llm-config", str(config), "--trials", "1", *SMALL,
                "--results", str(tmp_path / "r"), env={"OPENAI_API_KEY": KEY})
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and message in done.stderr
    assert "sk-in-a-file" not in done.stderr


def test_apply_takes_the_llm_settings_and_an_echoed_reply_is_no_step(tmp_path: Path) -> None:
    """`apply` reads --llm-config and --repairs / --temperature as `tune` does; a reply
    that sends the kernel back unchanged is told so and, unrepaired, ends in one line
    with no checkpoint saved."""
    seed = (Path(__file__).resolve().parents[1] / "seeds" / "matmul" / "naive.c").read_text()
    with LLMServer(models=("file-model",)) as server:
        config = tmp_path / "llm.toml"
        config.write_text(f'model = "file-model"\nbase_url = "{server.url}/v1"\n')
        server.script(reply(fenced(seed)), reply(fenced(seed)))
        done = peak("apply", "loop-interchange", "--llm-config", str(config), "--repairs",
                    "1", "--temperature", "0.4", "--results", str(tmp_path / "r"),
                    env={"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
        assert done.returncode != 0
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "loop-interchange was not applied" in done.stderr
        first, second = server.chat_requests()  # the file's endpoint, one repair
        assert first.body["model"] == "file-model" and first.body["temperature"] == 0.4
        assert "cannot be accepted" in second.body["messages"][-1]["content"]
        assert not (tmp_path / "r" / "checkpoints.json").exists()
        again = peak("apply", "loop-interchange", "--llm-config", str(config),
                     "--temperature", "0.4", "--results", str(tmp_path / "r"),
                     env={"OPENAI_API_KEY": KEY})  # the same application: from the cache
        assert again.returncode != 0 and len(server.chat_requests()) == 2  # no new call
        assert "cached answer of sample 0: --sample 1 asks the applier afresh" in again.stderr

        server.script(reply(fenced(INTERCHANGED)))
        done = peak("apply", "loop-interchange", "--llm-config", str(config), "--sample",
                    "1", "--temperature", "0.4", "--results", str(tmp_path / "r"), "--json",
                    env={"OPENAI_API_KEY": KEY})
        assert done.returncode == 0, done.stderr
        assert "cp1" in (tmp_path / "r" / "checkpoints.json").read_text()
        llm = last_json(done.stdout)["llm"]
        assert (llm["calls"], llm["repairs"], llm["prompt_tokens"]) == (1, 0, 100)
