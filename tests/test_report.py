"""`peak-tune report`: the page and its pictures from the storage alone, opened in a real
headless browser."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.test_cli import last_json, peak

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    results = tmp_path_factory.mktemp("report")
    done = peak("--trials", "12", "--size", "48", "--repeats", "3", "--json",
                "--results", str(results))
    assert done.returncode == 0, done.stderr
    return results, last_json(done.stdout)


def _browser() -> str | None:
    return next((found for name in ("chromium", "chromium-browser", "google-chrome")
                 if (found := shutil.which(name))), None)


def test_the_report_shows_the_study_from_its_storage(study: tuple[Path, dict],
                                                     tmp_path: Path) -> None:
    results, data = study
    shutil.rmtree(results / "cache" / "builds")  # the storage, not the builds, is read
    done = peak("report", "--results", str(results), "-o", str(tmp_path))
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "report.html").read_text()
    name = data["study"]
    assert name in page and page.count('src="data:image/png;base64,') == 4
    assert f"trial {data['best']['trial']}" in page
    assert "<th>vendor</th>" in page
    assert "<th>documented peak</th>" not in page  # the CPU profile documents none
    pictures = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pictures == sorted(f"{name}-{f}.png" for f in ("best", "outcomes", "steps", "time"))


def test_a_study_holds_where_each_trials_time_went(study: tuple[Path, dict]) -> None:
    import optuna

    results, data = study
    trials = optuna.load_study(study_name=data["study"],
                               storage=f"sqlite:///{results}/peak.db").trials
    spent = [t.user_attrs["seconds"] for t in trials]
    assert all(set(s) == {"ask", "apply", "build", "wait", "evaluate", "total"} for s in spent)
    assert any(s["build"] > 0 for s in spent)  # the C backend's builds, timed apart
    assert all(s["evaluate"] > 0 for s in spent if not any(
        t.user_attrs.get("cached") for t in trials))
    assert all(s["total"] >= s["evaluate"] for s in spent)


def test_an_unknown_study_is_one_line(study: tuple[Path, dict], tmp_path: Path) -> None:
    results, _ = study
    done = peak("report", "--results", str(results), "--study", "nope", "-o", str(tmp_path))
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("peak-tune: error: no study 'nope'")


def test_the_page_renders_in_a_headless_browser(study: tuple[Path, dict],
                                                tmp_path: Path) -> None:
    browser = _browser()
    if browser is None:
        pytest.skip("no headless browser (chromium) installed")
    results, _ = study
    assert peak("report", "--results", str(results), "-o", str(tmp_path)).returncode == 0
    shot = tmp_path / "shot.png"
    page = (tmp_path / "report.html").resolve().as_uri()
    rendered = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--window-size=1300,2600", f"--screenshot={shot}", page],
        capture_output=True, text=True, timeout=120)
    assert shot.is_file(), rendered.stderr[-2000:]
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page],
        capture_output=True, text=True, timeout=120).stdout
    assert dom.count("<img") == 4 and "peak-tune report" in dom
    from matplotlib.image import imread

    pixels = imread(shot)[:, :, :3]
    # the pictures drew: far more than the white of an empty page, and their colours
    coloured = (pixels.max(axis=2) - pixels.min(axis=2)) > 0.2
    assert coloured.mean() > 0.01, json.dumps({"coloured": float(coloured.mean())})
