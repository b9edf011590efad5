"""The CLI's smaller commands: show, export, transforms, devices, cache, dashboard; and
apply, checkpoint and mcp (peak_tune.cli.workbench)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import optuna

from peak_tune import __version__
from peak_tune.backends import BACKENDS, element_macros
from peak_tune.catalog.resolve import Catalog
from peak_tune.catalog.types import TESTED
from peak_tune.cli.workbench import apply, checkpoint, mcp
from peak_tune.core import KernelContext
from peak_tune.errors import UserError
from peak_tune.evaluation.cache import Cache
from peak_tune.search.study import SANITIZER_REJECTED
from peak_tune.search.trials import TrialAttrs
from peak_tune.serialize import kernel_header
from peak_tune.study.storage import driver_url, open_storage, results_storage_url

__all__ = ["apply", "cache", "checkpoint", "dashboard", "devices", "export", "llm", "mcp",
           "report", "show", "stats", "transforms"]


def _storage(args: argparse.Namespace) -> str:
    if args.storage:
        return str(args.storage)
    db = Path(args.results) / "peak.db"
    if not db.is_file():
        raise UserError(f"no study database at {db} (run `peak-tune` first, or give --results)")
    return results_storage_url(Path(args.results))


def _load_study(args: argparse.Namespace) -> optuna.Study:
    url = _storage(args)
    storage = open_storage(url)
    summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
    if not summaries:
        raise UserError(f"no study in {url}")
    names = [s.study_name for s in summaries]
    if args.study:
        if args.study not in names:
            raise UserError(f"no study {args.study!r} (studies: {', '.join(names)})")
        name = args.study
    else:  # the most recently started study
        latest = max(summaries, key=lambda s: s.datetime_start or datetime.datetime.min)
        name = latest.study_name
    return optuna.load_study(study_name=name, storage=storage)


def _best(args: argparse.Namespace) -> tuple[optuna.Study, optuna.trial.FrozenTrial,
                                             KernelContext, Cache]:
    study = _load_study(args)
    # as the run ranks them: a trial compute-sanitizer rejected is no best (--sanitize)
    rejected = set(study.user_attrs.get(SANITIZER_REJECTED, []))
    done = [t for t in study.get_trials(deepcopy=False)
            if t.state == optuna.trial.TrialState.COMPLETE and t.values
            and t.number not in rejected]
    if not done:
        raise UserError(f"study {study.study_name!r} has no successful trial yet")
    best = max(done, key=lambda t: t.values[0])
    cache = Cache(Path(args.results) / "cache")
    context = cache.get_context(TrialAttrs.of(best).context_hash)
    if context is None:
        raise UserError(f"the best variant of {study.study_name!r} is not in the cache at "
                        f"{cache.folder}")
    return study, best, context, cache


def show(args: argparse.Namespace) -> int:
    study, best, context, cache = _best(args)
    attrs = TrialAttrs.of(best)
    params = attrs.params
    print(f"study      {study.study_name}  (trial {best.number})")
    print(f"speed      {best.values[0]:.2f} GFLOP/s  {attrs.gflops_by_size}")
    print(f"sequence   {' > '.join(attrs.sequence) or '(seed)'}")
    print(f"parameters {', '.join(f'{k}={v}' for k, v in params.items()) or '-'}")
    print(f"variant    {context.content_hash()}")
    if context.constraints or context.size_constraints:
        print(f"constraints {', '.join(context.constraints + context.size_constraints)}")
    print("lineage")
    for step in cache.lineage(context):
        how = (f"{step.lineage.transform_id} v{step.lineage.transform_version} "
               f"by {step.lineage.applier}" if step.lineage else "seed")
        print(f"  {step.content_hash()[:16]}  {how}")
    print("source")
    print(context.source)
    return 0


def provenance_header(study: optuna.Study, best: optuna.trial.FrozenTrial,
                      context: KernelContext) -> str:
    identity: dict[str, Any] = study.user_attrs.get("identity", {})
    attrs = TrialAttrs.of(best)
    params = attrs.params
    lines = [
        f"Exported by peak-tune {__version__} on {datetime.date.today().isoformat()}",
        f"study {study.study_name}, trial {best.number}, variant {context.content_hash()}",
        f"kernel {identity.get('kernel')} on {identity.get('device')} "
        f"({identity.get('backend')}), dtype {identity.get('dtype')}, "
        f"sizes {', '.join(identity.get('sizes', []))}",
        f"sequence: {' > '.join(attrs.sequence) or '(seed)'}",
        f"measured: {best.values[0]:.2f} GFLOP/s",
    ]
    backend, dtype = str(identity.get("backend", "")), str(identity.get("dtype", ""))
    element = element_macros(backend, dtype) if backend in BACKENDS else {}
    return kernel_header(lines, context, {**element, **params})


def export(args: argparse.Namespace) -> int:
    study, best, context, _ = _best(args)
    text = provenance_header(study, best, context) + "\n" + context.source
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    else:
        print(text, end="")
    return 0


def transforms(args: argparse.Namespace) -> int:
    catalog = Catalog.with_user_folders(args.catalog)
    if args.action == "show":
        if not args.id:
            raise UserError("which transformation? `peak-tune transforms show ID`")
        t = catalog.transformation(args.id)
        print(f"{t.id} (version {t.version}): {t.title}")
        print(f"file       {t.path}")
        print(f"kernels    {', '.join(t.kernels)}; backends {', '.join(t.backends)}; "
              f"element types {', '.join(t.dtypes) or 'any'}")
        print(f"requires   {', '.join(t.requires) or '-'}")
        print(f"conflicts  {', '.join(t.conflicts) or '-'}")
        print("parameters " + (", ".join(f"{p.name} in {list(p.values)}" for p in t.params)
                               or "-"))
        if t.defaults:
            print("defaults   " + ", ".join(f"{k}={v}" for k, v in t.defaults.items()))
        for i, p in enumerate(t.passes, 1):
            print(f"\n## Pass {i} ({p.region})\n{p.text}")
        return 0
    for t in sorted(catalog.transformations.values(), key=lambda t: (t.backends, t.id)):
        if args.backend and args.backend not in t.backends:
            continue
        params = " ".join(p.name for p in t.params)
        print(f"{t.id:<22} {','.join(t.backends):<8} {params:<22} {t.summary or t.title}")
    return 0


def dry_run(args: argparse.Namespace) -> int:
    """Compile-check the space for --device; 1 when a point fails to compile."""
    from peak_tune.backends import make_backend
    from peak_tune.evaluation.dry_run import check_space, print_points

    catalog = Catalog.with_user_folders(args.catalog)
    device = catalog.device(args.device)
    backend_name = args.backend or device.backend
    spec = catalog.spec(args.kernel)
    if args.dtype not in spec.dtypes:
        raise UserError(f"dtype {args.dtype!r} is not offered by {spec.name} "
                        f"(choose from {', '.join(spec.dtypes)})")
    if args.points < 0:
        raise UserError("--points must be zero or more")
    transformations = {t.id: t for t in catalog.transformations_for(
        spec.name, backend_name, args.dtype, device.vendor)}
    backend = make_backend(backend_name, device)
    try:
        points = check_space(backend, device, spec, backend_name, transformations,
                             args.dtype, args.points, args.seed)
    finally:
        backend.close()
    if args.json:
        print(json.dumps({"device": device.name, "backend": backend_name,
                          "dtype": args.dtype, "points": [p.to_json() for p in points]}))
    else:
        print_points(points, device)
    return 1 if any(p.outcome == "compile error" for p in points) else 0


def devices(args: argparse.Namespace) -> int:
    catalog = Catalog.with_user_folders(args.catalog)
    for d in sorted(catalog.devices.values(), key=lambda d: (d.backend, d.name)):
        peaks = ", ".join(f"{k} {v / 1000:g} TFLOP/s" for k, v in d.peak_gflops.items() if v)
        print(f"{d.name:<14} {d.backend:<5} {d.title:<34} {TESTED[d.tested]:<33} "
              f"{peaks or 'peak unknown'}")
    return 0


def cache(args: argparse.Namespace) -> int:
    folder = Path(args.results) / "cache"
    if not folder.is_dir():
        raise UserError(f"no cache at {folder}")
    stats = Cache(folder).stats()
    if args.json:
        print(json.dumps(stats))
        return 0
    print(f"cache {stats['folder']}")
    for kind in ("contexts", "applications", "evaluations", "builds"):
        print(f"  {kind:<13} {stats[kind]['entries']:>7} entries "
              f"{stats[kind]['bytes'] / 1e6:>9.2f} MB")
    return 0


def dashboard(args: argparse.Namespace) -> int:
    storage = _storage(args)
    beside = Path(sys.executable).parent / "optuna-dashboard"  # this environment's copy
    binary = str(beside) if beside.is_file() else shutil.which("optuna-dashboard")
    if binary is None:
        raise UserError("optuna-dashboard is not installed: pip install 'peak-tune[dashboard]'")
    print(f"optuna-dashboard on http://127.0.0.1:{args.port} for {storage} (Ctrl-C stops it)",
          flush=True)
    # the dashboard takes this process's place, so that a signal to it (a terminal's
    # Ctrl-C, a service manager's SIGTERM) stops the server, not a parent that leaves it
    os.execv(binary, [binary, driver_url(storage), "--host", "127.0.0.1", "--port",
                      str(args.port)])


def report(args: argparse.Namespace) -> int:
    """`peak-tune report`: report.html and its PNG files (peak_tune.report)."""
    from peak_tune.report.data import read_study
    from peak_tune.report.render import write_report

    storage = open_storage(_storage(args))
    names = [s.study_name for s in optuna.get_all_study_summaries(storage, False)]
    if not names:
        raise UserError("no study in the storage")
    if args.all:
        chosen = names
    elif args.study:
        missing = [n for n in args.study if n not in names]
        if missing:
            raise UserError(f"no study {missing[0]!r} (studies: {', '.join(names)})")
        chosen = list(args.study)
    else:
        chosen = [_load_study(argparse.Namespace(**{**vars(args), "study": None})).study_name]
    cache = Path(args.results) / "cache"
    studies = [read_study(storage, name, cache, tuple(args.catalog)) for name in chosen]
    page = write_report(studies, Path(args.output or Path(args.results) / "report"))
    print(f"wrote {page} ({len(studies)} {'study' if len(studies) == 1 else 'studies'})")
    return 0


def llm(args: argparse.Namespace) -> int:
    """`peak-tune llm check`: does the endpoint answer, list models, round-trip a prompt."""
    from peak_tune.appliers.llm import LLMConfig, check_endpoint

    report = check_endpoint(LLMConfig.from_env(args.model))
    for message in report.messages:
        print(message)
    return 0 if report.ok else 2


def stats(args: argparse.Namespace) -> int:
    """`peak-tune stats`: LLM success per transformation, model and position; tokens and
    dollars per transformation and per study."""
    from peak_tune.appliers.llm.stats import read_records, summarize, write_csv

    records = read_records(Path(args.results) / "cache")
    if args.study:
        records = [r for r in records if r.study == args.study]
    rows = summarize(records)
    if not rows:
        which = f" for study {args.study!r}" if args.study else ""
        raise UserError(f"no LLM calls recorded under {args.results}{which} (run with "
                        "--applier llm)")
    _print_stats_table(rows)
    _print_spend(records)
    if args.csv:
        write_csv(rows, Path(args.csv))
        print(f"wrote {args.csv}")
    return 0


def _print_stats_table(rows: list[dict[str, Any]]) -> None:
    from peak_tune.appliers.llm.stats import dollars

    print(f"{'transformation':<22} {'model':<18} {'pos':>3} {'apps':>5} {'ok %':>6} "
          f"{'calls/ok':>8} {'tokens':>9} {'cost':>10}  failures; checks failed (repaired)")
    for r in rows:
        per = f"{r['mean_calls_to_success']:.2f}" if r["mean_calls_to_success"] else "-"
        tokens = r["prompt_tokens"] + r["completion_tokens"]
        failures = ", ".join(f"{k} {v}" for k, v in r["failures"].items()) or "-"
        checks = ", ".join(f"{k} {v}" for k, v in r["check_failures"].items()) or "-"
        print(f"{r['transformation']:<22} {r['model']:<18} {r['position']:>3} "
              f"{r['applications']:>5} {100 * r['success_rate']:>6.1f} {per:>8} {tokens:>9} "
              f"{dollars(r['cost_usd']):>10}  {failures}; {checks} ({r['repaired']})")


def _print_spend(records: list[Any]) -> None:
    """Calls, tokens and dollars per transformation, per study and in all."""
    from peak_tune.appliers.llm.stats import dollars, totals, totals_by

    def line(label: str, t: dict[str, Any]) -> str:
        return (f"  {label:<40} {t['calls']:>6} calls {t['prompt_tokens']:>10} in "
                f"{t['completion_tokens']:>9} out {dollars(t['cost_usd']):>10}")

    for title, field in (("per transformation", "transform_id"), ("per study", "study")):
        print(title)
        for name, t in totals_by(records, field).items():
            print(line(name or "(not recorded)", t))
    print(line("all", totals(records)).replace("  all", "all  ", 1))
