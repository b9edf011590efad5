"""The `peak-tune` command. `peak-tune [options]` is `peak-tune tune [options]`.

Problems a user can fix print one line and exit with status 2; Ctrl-C keeps the
finished trials, prints the summary and exits with status 130; a spent LLM budget
(--max-tokens-total, --max-cost) prints one line and the summary and exits with status 3.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from peak_tune.appliers import default_applier
from peak_tune.backends import BACKENDS
from peak_tune.backends.base import (
    BUILD_BUDGET,
    BUILD_BUDGET_AFTER,
    BUILD_BUDGET_FLOOR_S,
    EvalConfig,
)
from peak_tune.cli.stop import StopRequest
from peak_tune.core import check_size_text
from peak_tune.errors import (
    OUT_OF_MEMORY,
    BudgetReached,
    EnvironmentFault,
    EvaluationError,
    KernelTimeout,
    UserError,
    environment_fault,
)
from peak_tune.search.ask_ahead import (
    ASK_AHEAD,
    ASK_AHEAD_MIN_CORES,
    MAX_SAMPLER_PROCESSES,
    SAMPLER_CORES,
)
from peak_tune.session.config import (
    CHOICES,
    ApplierSettings,
    RunSettings,
    SearchSettings,
    TargetSettings,
)

if TYPE_CHECKING:
    from peak_tune.session.config import TuneConfig
    from peak_tune.session.tune import TuneSession

__all__ = ["main"]

_COMMANDS = ("tune", "show", "export", "transforms", "devices", "cache", "dashboard", "llm",
             "stats", "apply", "checkpoint", "mcp", "batch", "dry-run", "report")


def _size(text: str) -> str:
    """A size's text, checked for its form here; its names against the kernel's later."""
    try:
        return check_size_text(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise argparse.ArgumentTypeError(f"{text!r}: use a number, 0 or more")
    return value


def _common(parser: argparse.ArgumentParser,
            study_help: str | None = "study to resume or create (default: a new one per run)"
            ) -> None:
    parser.add_argument("--results", default="results", metavar="DIR",
                        help="folder for the study database and the cache (default: results)")
    parser.add_argument("--catalog", action="append", default=[], metavar="DIR",
                        help="extra catalog folder (transforms/, seeds/, devices/); repeatable")
    if study_help is not None:
        parser.add_argument("--study", help=study_help)
    parser.add_argument("--storage", help="Optuna storage URL (default: SQLite in --results)")


def _tune_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="search transformation sequences and parameters (default)")
    _common(p)
    p.add_argument("--trials", type=int, default=100,
                   help="trials the study should hold in all (default 100): a study "
                        "resumed with --study runs only those it lacks, so the same command "
                        "finishes a stopped run; 0 runs none")
    p.add_argument("--kernel", default=TargetSettings.kernel)
    p.add_argument("--backend", help=f"{', '.join(sorted(BACKENDS))} (default: the "
                                     "device's; the cpu device's is c)")
    p.add_argument("--device", help="device profile (see `peak-tune devices`); default cpu")
    p.add_argument("--dtype", default=TargetSettings.dtype)
    p.add_argument("--size", action="append", type=_size, default=[], metavar="SIZE",
                   help="problem size; repeatable (default: the kernel's default size)")
    p.add_argument("--applier", choices=CHOICES["applier"],
                   help="reference (offline) or llm (an OpenAI-compatible endpoint); default "
                        "llm when OPENAI_MODEL and OPENAI_API_KEY are set, else reference")
    p.add_argument("--model", help="the LLM applier's model (default: OPENAI_MODEL)")
    p.add_argument("--temperature", type=float, help="LLM sampling temperature")
    _llm_options(p)
    p.add_argument("--sampler", default=SearchSettings.sampler, choices=CHOICES["sampler"])
    p.add_argument("--encoding", default=SearchSettings.encoding, choices=CHOICES["encoding"],
                   help=f"how a trial encodes a sequence (default {SearchSettings.encoding})")
    p.add_argument("--warm-start", metavar="STUDY[,STUDY]",
                   help="a new study's first trials: the best of these studies (same storage "
                        "and kernel; e.g. a smaller size, another device, or another "
                        "backend's study, whose steps this backend lacks are left out)")
    p.add_argument("--warm-start-top", type=int, default=SearchSettings.warm_start_top,
                   metavar="N", help="trials taken from each --warm-start study (default "
                                     f"{SearchSettings.warm_start_top})")
    p.add_argument("--no-branch-start", dest="branch_start", action="store_false",
                   help="do not start a new study with a few trials per branch of the "
                        "catalog's conflicts (e.g. SIMT tiles vs tensor cores)")
    p.add_argument("--polish", type=float, default=SearchSettings.polish, metavar="SHARE",
                   help="share of trials spent on neighbours of the best so far (one "
                        "tuning value moved a step); 0 turns it off (default "
                        f"{SearchSettings.polish:g})")
    p.add_argument("--tell-order", default=SearchSettings.tell_order, choices=CHOICES["tell_order"],
                   help="tell Optuna trials in the order asked (a seeded run repeats "
                        "itself) or as they finish (no wait behind one slow build); "
                        "default auto: finished where builds run ahead of the timings "
                        "(Ray, GPU backends), asked otherwise (the C backend)")
    p.add_argument("--ask-ahead", type=int, default=SearchSettings.ask_ahead, metavar="N",
                   help="draws a sampler process of its own keeps ready, so that the "
                        "driver's thread never runs TPE; 0 samples in the driver; "
                        f"default: {ASK_AHEAD} where trials are told as they finish, "
                        f"the sampler is tpe and the machine has {ASK_AHEAD_MIN_CORES} "
                        "cores or more, else 0")
    p.add_argument("--sampler-processes", type=int, default=SearchSettings.sampler_processes,
                   metavar="N", help="sampler processes drawing ahead at once, each "
                   "learning every trial and seeing the others' draws as running (for a "
                   "device that finishes trials faster than one process draws them); "
                   f"default: one per {SAMPLER_CORES} cores, at most "
                   f"{MAX_SAMPLER_PROCESSES}")
    p.add_argument("--illegal", default=SearchSettings.illegal, choices=CHOICES["illegal"],
                   help=f"what to do with an illegal sequence pick (default "
                        f"{SearchSettings.illegal})")
    p.add_argument("--sequence", help="tune only the parameters of this sequence: ID,ID,...")
    p.add_argument("--transforms", help="search only these transformations: ID,ID,...")
    p.add_argument("--replay", metavar="FILE",
                   help="answer evaluations from a recording instead of running kernels")
    p.add_argument("--step-values", action="store_true",
                   help="also time each prefix of a sequence (Optuna intermediate values)")
    p.add_argument("--seed", type=int, default=SearchSettings.seed,
                   help=f"sampler seed (default {SearchSettings.seed}): a run with the same "
                        "seed repeats the same search, and the cache makes the repeat free")
    p.add_argument("--timeout", type=float, default=EvalConfig.timeout_s,
                   help="seconds per evaluation")
    p.add_argument("--repeats", type=int, default=EvalConfig.repeats,
                   help="timed runs per evaluation")
    p.add_argument("--compile-workers", type=int, default=RunSettings.compile_workers,
                   metavar="N",
                   help="variants built in parallel while one is timed (default: 1 for the "
                        "C backend, one per core for GPU backends)")
    p.add_argument("--in-flight", type=int, default=RunSettings.in_flight, metavar="N",
                   help="trials between asking the sampler and telling it (default 0: "
                        "twice the builds at once, so the compilers stay fed)")
    p.add_argument("--build-budget", type=_non_negative, default=RunSettings.build_budget,
                   metavar="B",
                   help="stop a build that runs past B times the median build of the run so "
                        f"far and prune its point (default {BUILD_BUDGET:g}; 0: never; from "
                        f"build {BUILD_BUDGET_AFTER} on, never before {BUILD_BUDGET_FLOOR_S:g} s)")
    p.add_argument("--apply-workers", type=int, default=ApplierSettings.workers, metavar="N",
                   help="transformations applied at once (default: 1 for the reference "
                        "applier, --llm-concurrency for the LLM one)")
    p.add_argument("--executor", default=RunSettings.executor, choices=CHOICES["executor"],
                   help="where evaluations run: local (this process) or ray (one worker per "
                        "device, on this machine or a cluster); auto picks ray with more than "
                        "one GPU or with --ray-address")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="join this Ray cluster (e.g. ray://head:10001 or auto)")
    p.add_argument("--ray-workers", type=int, default=RunSettings.ray_workers, metavar="N",
                   help="device workers on Ray (default: one per GPU; the C backend: one "
                        "per node)")
    p.add_argument("--sanitize", action="store_true",
                   help="run compute-sanitizer (memcheck, racecheck) on the winners (cuda)")
    p.add_argument("--profile", action="store_true",
                   help="profile the best variant with Nsight Compute (cuda): key metrics, "
                        "and all of them under <results>/profiles/")
    p.add_argument("--json", action="store_true",
                   help="print the summary as one JSON object on the last line of stdout")
    p.add_argument("-v", "--verbose", action="store_true")


def _llm_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repairs", type=int,
                   help="repair attempts per LLM step: a compile error or a wrong result "
                        "goes back to the model (default 2)")
    p.add_argument("--samples", type=int, default=ApplierSettings.samples, metavar="N",
                   help="independent LLM applications per step; the first that compiles "
                        "and validates is used, later ones are asked only on failure")
    p.add_argument("--max-tokens-total", type=int,
                   help="stop the run (exit 3) once the LLM calls used this many tokens "
                        "(this run's, or the study's with --budget-scope study)")
    p.add_argument("--max-cost", type=float, metavar="USD",
                   help="stop the run (exit 3) once the LLM calls cost this many dollars "
                        "(the model needs a price)")
    p.add_argument("--budget-scope", choices=CHOICES["budget_scope"],
                   default=ApplierSettings.budget_scope,
                   help="what the budgets count: this run's calls (default), or the "
                        "study's in every run so far (from the journal in the cache)")
    p.add_argument("--llm-prices", metavar="FILE",
                   help="TOML price table extending the built-in one (USD per million tokens)")
    p.add_argument("--llm-concurrency", type=int, help="LLM requests in flight at once "
                   "(default 4)")
    p.add_argument("--llm-config", metavar="FILE",
                   help="LLM settings for this study in TOML (model, base_url, temperature, "
                        "repairs, ...); options given here win")
    p.add_argument("--llm-rpm", type=float, help="LLM requests started per minute at most")
    p.add_argument("--llm-timeout", type=float, help="seconds per LLM request (default 120)")


def _batch_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("batch", help="run many studies from a TOML file (kernels x devices x "
                                     "dtypes x sizes) into one storage")
    p.add_argument("file", metavar="FILE.toml")
    p.add_argument("--results", metavar="DIR",
                   help="folder for the storage and the cache (default: the file's, else "
                        "results)")
    p.add_argument("--storage", help="Optuna storage URL for every study, e.g. "
                                     "postgresql://user@host/db (default: the file's, else "
                                     "SQLite in --results)")
    p.add_argument("--parallel", type=int, default=1, metavar="N",
                   help="studies at once (default 1); studies on one device never overlap "
                        "(on Ray each takes a share of its kind's devices) and C-backend "
                        "studies (timed on this CPU) always run alone")
    p.add_argument("--json", action="store_true",
                   help="print every study's summary as one JSON object on the last line")
    p.add_argument("-v", "--verbose", action="store_true")


class _OneLineParser(argparse.ArgumentParser):
    """A mistaken argument is one line naming it, not the usage before it (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="peak-tune",
        description="Tune kernels by searching sequences of natural-language transformations.",
    )
    sub = parser.add_subparsers(dest="command")
    _tune_parser(sub)
    for name, text in (("show", "the best variant: source, sequence, parameters, lineage"),
                       ("export", "write the best kernel to a file with a provenance header")):
        p = sub.add_parser(name, help=text)
        _common(p, "the study to read (default: the one started last in the storage)")
        if name == "export":
            p.add_argument("-o", "--output", help="file to write (default: stdout)")
    p = sub.add_parser("transforms", help="list or show natural transformations")
    p.add_argument("action", choices=("list", "show"))
    p.add_argument("id", nargs="?")
    p.add_argument("--catalog", action="append", default=[], metavar="DIR")
    p.add_argument("--backend", help="only those for this backend")
    p = sub.add_parser("dry-run", help="compile-check a study's space for a device (no GPU "
                                        "needed): resources and pruning per point")
    p.add_argument("--device", required=True)
    p.add_argument("--backend", help="default: the device's")
    p.add_argument("--kernel", default=TargetSettings.kernel)
    p.add_argument("--dtype", default=TargetSettings.dtype)
    p.add_argument("--points", type=int, default=50,
                   help="random sequences beyond each transformation's own variant")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--catalog", action="append", default=[], metavar="DIR")
    p = sub.add_parser("devices", help="list device profiles")
    p.add_argument("--catalog", action="append", default=[], metavar="DIR")
    p = sub.add_parser("cache", help="cache statistics")
    p.add_argument("action", choices=("stats",))
    p.add_argument("--results", default="results", metavar="DIR")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("llm", help="check the LLM endpoint (OPENAI_BASE_URL, OPENAI_API_KEY)")
    p.add_argument("action", choices=("check",))
    p.add_argument("--model", help="model to try (default: OPENAI_MODEL)")
    p = sub.add_parser("stats", help="LLM success per transformation, model and position; "
                                      "tokens and cost")
    p.add_argument("--results", default="results", metavar="DIR")
    p.add_argument("--study", help="only the calls of this study")
    p.add_argument("--csv", metavar="FILE", help="also write the table as CSV")
    _batch_parser(sub)
    p = sub.add_parser("report", help="an HTML page and PNG files of studies: the best so "
                                      "far, outcomes per transformation, the best sequence "
                                      "step by step, where the time went")
    _common(p, None)
    p.add_argument("--study", action="append", default=[], metavar="NAME",
                   help="a study to show; repeatable (default: the one started last)")
    p.add_argument("--all", action="store_true", help="every study of the storage")
    p.add_argument("-o", "--output", metavar="DIR",
                   help="folder for report.html and the PNG files (default: <results>/report)")
    p = sub.add_parser("dashboard", help="open optuna-dashboard on the results' storage")
    _common(p, None)  # the dashboard shows every study of the storage
    p.add_argument("--port", type=int, default=8080)
    from peak_tune.cli.workbench import add_parsers

    add_parsers(sub, _size)
    return parser


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _tune_config(args: argparse.Namespace) -> TuneConfig:
    from peak_tune.session.config import TuneConfig

    if args.trials < 0:
        raise UserError("--trials must be zero or more")
    if args.repeats < 1:
        raise UserError(f"--repeats must be 1 or more (timed runs per evaluation), not "
                        f"{args.repeats}")
    if not 0 < args.timeout < math.inf:
        raise UserError(f"--timeout must be a number of seconds above 0, not {args.timeout:g}")
    llm_file: dict[str, object] = {}
    if args.llm_config:
        from peak_tune.appliers.llm.config import load_llm_settings

        llm_file = load_llm_settings(Path(args.llm_config))
    return TuneConfig.of(
        kernel=args.kernel, backend=args.backend, device=args.device, dtype=args.dtype,
        sizes=tuple(args.size),
        applier=args.applier or ("llm" if args.llm_config else default_applier()),
        model=args.model or _text(llm_file.pop("model", None)),
        llm_settings={**llm_file, **_llm_settings(args)}, samples=args.samples,
        sampler=args.sampler, seed=args.seed,
        study=args.study, results=Path(args.results), storage=args.storage,
        catalogs=tuple(args.catalog), encoding=args.encoding, illegal=args.illegal,
        sequence=tuple(s for s in (args.sequence or "").split(",") if s),
        only=tuple(s for s in (args.transforms or "").split(",") if s),
        replay=Path(args.replay) if args.replay else None,
        branch_start=args.branch_start,
        polish=args.polish,
        tell_order=args.tell_order,
        ask_ahead=args.ask_ahead, sampler_processes=args.sampler_processes,
        step_values=args.step_values, compile_workers=args.compile_workers,
        build_budget=args.build_budget, in_flight=args.in_flight,
        apply_workers=args.apply_workers, executor=args.executor,
        ray_address=args.ray_address, ray_workers=args.ray_workers,
        eval_config=EvalConfig(timeout_s=args.timeout, repeats=args.repeats),
        budget_scope=args.budget_scope,
        warm_start=tuple(s for s in (args.warm_start or "").split(",") if s),
        warm_start_top=args.warm_start_top,
    )


def _tune(args: argparse.Namespace) -> int:
    from peak_tune.session.progress import ProgressView, print_summary, summary
    from peak_tune.session.tune import open_session

    config = _tune_config(args)
    started = time.perf_counter()
    session = open_session(config)
    try:
        for option in ("sanitize", "profile"):
            if getattr(args, option):
                session.backend_tool(option)
    except UserError:
        session.close()
        raise
    stop = StopRequest()
    interrupted, budget = False, ""
    held = session.searcher.finished_trials()
    to_run = max(0, args.trials - held)
    if held and args.trials:
        print(f"peak-tune: study {session.study.study_name!r} holds {held} finished trials; "
              + (f"running {to_run} more for --trials {args.trials}" if to_run else
                 f"--trials {args.trials} asks for no more (raise it to run more)"),
              file=sys.stderr)
    progress = ProgressView(to_run, live=sys.stderr.isatty() and not args.json)
    session.subscribe(progress)
    try:
        with stop.on_ctrl_c():
            _measure_vendor(session, args.timeout)
            session.run(to_run, should_stop=stop.requested)  # and a spent LLM budget
            if args.sanitize and not stop.requested():
                for line in session.sanitize_best():
                    print(f"peak-tune: sanitizer: {line}", file=sys.stderr)
            if args.profile and not stop.requested():
                print(f"peak-tune: ncu: {session.profile_best()}", file=sys.stderr)
        interrupted = stop.requested()
        # the session's BudgetSpent event, where the budget cut the trials short
        budget = session.ledger.budget_spent if progress.done < to_run else ""
    except KeyboardInterrupt:
        interrupted = True
    except BudgetReached as exc:
        budget = str(exc)
    finally:
        progress.close()
        session.close()
    data = summary(session, time.perf_counter() - started)
    if interrupted:
        print("peak-tune: interrupted; finished trials are kept", file=sys.stderr)
    elif budget:
        spent = data.get("llm", {})
        print(f"peak-tune: LLM budget reached: {budget} (this run: {spent.get('tokens', 0)} "
              f"tokens, {_dollars(spent.get('cost_usd'))}); finished trials are kept; resume "
              f"with --study {session.study.study_name}", file=sys.stderr)
    print_summary(data, to_stderr=args.json)
    if args.json:
        print(json.dumps(data))
    return 130 if interrupted else 3 if budget else 0


def _measure_vendor(session: TuneSession, timeout_s: float) -> None:
    """The vendor baseline, before any trial; its failure is one line (a trial's failure
    is the trial's outcome, the vendor's stops the run)."""
    try:
        session.measure_vendor()
    except KernelTimeout as exc:
        raise UserError(f"the vendor baseline did not finish within --timeout {timeout_s:g} s "
                        f"({exc}): give a longer --timeout") from exc
    except EvaluationError as exc:
        raise UserError(f"timing the vendor baseline failed: {exc}") from exc


def _dollars(cost: float | None) -> str:
    return "cost unknown" if cost is None else f"${cost:.4f}"


def _llm_settings(args: argparse.Namespace) -> dict[str, object]:
    """The LLM options the user gave, as LLMConfig fields."""
    given = (("temperature", args.temperature), ("repairs", args.repairs),
             ("max_tokens_total", args.max_tokens_total), ("max_cost_usd", args.max_cost),
             ("prices_file", args.llm_prices), ("concurrency", args.llm_concurrency),
             ("requests_per_minute", args.llm_rpm), ("timeout_s", args.llm_timeout))
    return {k: v for k, v in given if v is not None}


def _batch(args: argparse.Namespace) -> int:
    from peak_tune.batch.devices import share_devices, stop_shared_ray
    from peak_tune.batch.files import load_batch
    from peak_tune.batch.run import BatchRun
    from peak_tune.batch.view import BatchView, batch_json, print_batch_summary

    if args.parallel < 1:
        raise UserError("--parallel must be 1 or more")
    plan = load_batch(Path(args.file), Path(args.results) if args.results else None,
                      args.storage, default_applier())
    started = time.perf_counter()
    plan, devices = share_devices(plan, args.parallel)  # Ray studies: a share each
    stop = StopRequest()
    batch = BatchRun(plan, should_stop=stop.requested, parallel=args.parallel,
                     devices=devices)
    if args.parallel > 1 and sum(s.exclusive for s in plan.studies) > 1:
        print("peak-tune: C-backend studies run one at a time: timing several at once on "
              "this CPU would disturb every measurement", file=sys.stderr)
    try:
        with stop.on_ctrl_c(), BatchView(batch) as view:
            batch.changed = view.changed
            batch.run()
    finally:
        stop_shared_ray(devices)
    if batch.interrupted:
        print("peak-tune: interrupted; every study keeps its finished trials and resumes "
              "when the batch runs again", file=sys.stderr)
    print_batch_summary(batch, to_stderr=args.json)
    if args.json:
        print(json.dumps(batch_json(batch, time.perf_counter() - started)))
    return 130 if batch.interrupted else 1 if batch.failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in _COMMANDS and argv[0] not in ("-h", "--help")):
        argv.insert(0, "tune")
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        if args.command == "tune":
            return _tune(args)
        if args.command == "batch":
            return _batch(args)
        from peak_tune.cli import commands

        return int(getattr(commands, args.command.replace("-", "_"))(args))
    except UserError as exc:
        print(f"peak-tune: error: {exc}", file=sys.stderr)
        return 2
    except EnvironmentFault as exc:  # "disk full: ...": every trial stored is kept
        print(f"peak-tune: {exc}", file=sys.stderr)
        return 1
    except MemoryError:
        print(f"peak-tune: {OUT_OF_MEMORY}: this process could not allocate memory; "
              "finished trials are kept", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `peak-tune ... | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a write of a part that does not say so itself
        where = f"writing {exc.filename}" if exc.filename else "writing a file"
        fault = environment_fault(exc, where)
        if fault is None:
            raise
        print(f"peak-tune: {fault}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
