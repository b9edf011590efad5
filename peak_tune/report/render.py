"""The report's pictures (matplotlib, drawn off-screen) and the page that holds them."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

from peak_tune.report.data import OUTCOMES, PHASES, StudyReport

__all__ = ["FIGURES", "write_report"]

_COLOURS = {"ok": "#2a9d8f", "invalid": "#bdbdbd", "apply_error": "#9c6ade",
            "compile_error": "#e9c46a", "wrong_result": "#e76f51",
            "runtime_error": "#d62828", "timeout": "#6d597a", "interrupted": "#7f7f7f"}


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        from peak_tune.errors import UserError

        raise UserError("peak-tune report draws with matplotlib: "
                        "pip install 'peak-tune[report]'") from None
    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    return plt


def best_so_far(plt: Any, study: StudyReport) -> Any:
    """The best so far against trials and against time, each trial's speed, the
    vendor's line and the device's documented peak."""
    figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    ok = study.finished
    for ax, x_of, label in ((axes[0], lambda t: t.number, "trial"),
                            (axes[1], lambda t: t.minutes, "minutes since the first trial")):
        xs, best, running = [], [], 0.0
        for t in sorted(study.trials, key=x_of):
            running = max(running, t.gflops)
            xs.append(x_of(t))
            best.append(running)
        ax.scatter([x_of(t) for t in ok], [t.gflops for t in ok], s=10, alpha=0.35,
                   color=_COLOURS["ok"], label="a trial")
        ax.step(xs, best, where="post", color="#264653", label="best so far")
        if study.vendor_gflops:
            ax.axhline(study.vendor_gflops, color="#e76f51", linestyle="--",
                       label=f"vendor ({study.vendor_name or 'baseline'})")
        top = max([*best, study.vendor_gflops, 1e-9])
        if study.peak_gflops and study.peak_gflops <= 3 * top:
            ax.axhline(study.peak_gflops, color="#6d597a", linestyle=":",
                       label="documented peak")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GFLOP/s")
    peak = (f"; documented peak {study.peak_gflops:.0f} GFLOP/s"
            if study.peak_gflops else "")
    figure.suptitle(f"{study.name}: best so far{peak}")
    axes[1].legend(loc="lower right", fontsize=8)
    return figure


def outcomes(plt: Any, study: StudyReport) -> Any:
    """How trials ended, per transformation they hold and per position in the sequence."""
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.5),
                                gridspec_kw={"width_ratios": [3, 2]})
    for ax, key, title in ((axes[0], "transformation", "by transformation"),
                           (axes[1], "position", "by position in the sequence")):
        counts = study.outcomes_by(key)
        labels = list(counts)
        left = [0] * len(labels)
        for outcome in (*OUTCOMES, "interrupted"):
            widths = [counts[label].get(outcome, 0) for label in labels]
            if any(widths):
                ax.barh(labels, widths, left=left, color=_COLOURS.get(outcome, "#999999"),
                        label=outcome.replace("_", " "))
                left = [a + b for a, b in zip(left, widths, strict=True)]
        ax.set_title(title)
        ax.set_xlabel("trials")
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=8)
    if study.trials:
        axes[1].legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    return figure


def steps(plt: Any, study: StudyReport) -> Any:
    """The speed-up along the best sequence, step by step (the PEAK paper's Figure 2)."""
    figure, ax = plt.subplots(figsize=(11, 3.8))
    seed = study.best_steps[0].gflops if study.best_steps else None
    labels = ["seed" if not s.step else f"+ {s.step}" for s in study.best_steps]
    heights = [s.gflops or 0.0 for s in study.best_steps]
    bars = ax.bar(range(len(labels)), heights, color=_COLOURS["ok"])
    for bar, s in zip(bars, study.best_steps, strict=True):
        text = ("not tried" if s.gflops is None
                else f"{s.gflops / seed:.1f}x" if seed else f"{s.gflops:.1f}")
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("GFLOP/s")
    ax.set_title("along the best sequence (x: over the seed)")
    figure.tight_layout()
    return figure


def time_spent(plt: Any, study: StudyReport) -> Any:
    """Where the trials' time went: the sampler, the applier, builds, waiting for the
    device, validating and timing."""
    figure, ax = plt.subplots(figsize=(11, 2.2))
    spent = study.time_spent()
    left = 0.0
    for phase in PHASES:
        ax.barh([""], [spent[phase]], left=left, label=f"{phase} {spent[phase]:.1f} s")
        left += spent[phase]
    ax.set_xlabel("seconds, summed over trials (phases of trials in flight overlap)")
    ax.legend(ncol=len(PHASES), fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 1.45))
    figure.tight_layout()
    return figure


FIGURES: dict[str, Callable[[Any, StudyReport], Any]] = {
    "best": best_so_far, "outcomes": outcomes, "steps": steps, "time": time_spent}


def write_report(studies: list[StudyReport], folder: Path) -> Path:
    """<folder>/report.html (the pictures inside it) and <folder>/<study>-<figure>.png."""
    plt = _pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    sections = []
    for study in studies:
        images = []
        for name, draw in FIGURES.items():
            figure = draw(plt, study)
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", dpi=110)
            plt.close(figure)
            data = buffer.getvalue()
            (folder / f"{study.name}-{name}.png").write_bytes(data)
            images.append((name, base64.b64encode(data).decode()))
        sections.append(_section(study, images))
    page = folder / "report.html"
    page.write_text(_PAGE.format(title=html.escape(", ".join(s.name for s in studies)),
                                 body="\n".join(sections)))
    return page


def _section(study: StudyReport, images: list[tuple[str, str]]) -> str:
    best = study.best
    rows = [("study", study.name),
            ("target", ", ".join(f"{k} {', '.join(v) if isinstance(v, list) else v}"
                                 for k, v in study.identity.items())),
            ("trials", f"{len(study.trials)} ({len(study.finished)} finished)"),
            ("best", f"{best.gflops:.2f} GFLOP/s, trial {best.number}: "
                     f"{' > '.join(best.sequence) or 'seed'}" if best else "no finished trial"),
            ("re-timed", f"{study.confirmed_gflops:.2f} GFLOP/s" if study.confirmed_gflops
             else "not re-timed")]
    if study.vendor_gflops:
        figure, which = ((study.confirmed_gflops, "re-timed best") if study.confirmed_gflops
                         else (best.gflops if best else 0.0, "search's best"))
        ratio = f", the {which} {figure / study.vendor_gflops:.3f}x" if figure else ""
        rows.append(("vendor", f"{study.vendor_gflops:.2f} GFLOP/s ({study.vendor_name})"
                               f"{ratio}"))
    if study.peak_gflops:
        rows.append(("documented peak", f"{study.peak_gflops:.0f} GFLOP/s"))
    if study.llm:
        rows.append(("LLM", f"{study.llm['calls']:.0f} calls, "
                            f"{study.llm['prompt_tokens']:.0f} prompt + "
                            f"{study.llm['completion_tokens']:.0f} completion tokens, "
                            f"${study.llm['cost_usd']:.4f}"))
    table = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
                    for k, v in rows)
    pictures = "".join(f'<figure><img alt="{name}" src="data:image/png;base64,{data}">'
                       f"<figcaption>{html.escape(FIGURES[name].__doc__ or '')}</figcaption>"
                       "</figure>" for name, data in images)
    steps = _llm_table(study)
    return (f"<section><h2>{html.escape(study.name)}</h2><table>{table}</table>{pictures}"
            f"{steps}</section>")


def _counts_text(counts: object) -> str:
    return ", ".join(f"{k} {n}" for k, n in counts.items()) or "-" if isinstance(
        counts, dict) else "-"


def _llm_table(study: StudyReport) -> str:
    """What `peak-tune stats` says of the study's LLM steps: how often each step's reply
    passed, which checks failed, how many were repaired."""
    if not study.llm_steps:
        return ""
    head = ("transformation", "position", "applications", "succeeded", "check failures",
            "repaired")
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in (
            r["transformation"], r["position"], r["applications"], r["succeeded"],
            _counts_text(r["check_failures"]),
            r["repaired"])) + "</tr>"
        for r in study.llm_steps)
    return ("<h3>LLM steps</h3><table><tr>" + "".join(f"<th>{h}</th>" for h in head)
            + f"</tr>{rows}</table>")


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>peak-tune: {title}</title>
<style>
body {{ font-family: sans-serif; margin: 2em auto; max-width: 1250px; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1em; }}
th, td {{ text-align: left; padding: 0.2em 1em 0.2em 0; vertical-align: top; }}
img {{ max-width: 100%; }}
figcaption {{ color: #555; font-size: 0.9em; margin-bottom: 1.5em; }}
</style></head>
<body><h1>peak-tune report</h1>
{body}
</body></html>
"""
