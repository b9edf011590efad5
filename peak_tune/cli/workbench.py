"""`peak-tune apply`, `peak-tune checkpoint ...` and `peak-tune mcp`: one step at a time.

Exit status: 0 done; 1 the variant failed (apply error, compile error, wrong result,
crash, timeout: nothing saved); 2 a problem the user can fix (unknown name, illegal
step, bad value), with one line on stderr and nothing changed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from peak_tune.backends import BACKENDS
from peak_tune.backends.base import EvalConfig
from peak_tune.core import size_of
from peak_tune.errors import ApplyError, UserError
from peak_tune.session.config import ApplierSettings
from peak_tune.workbench.steps import ApplyRequest, Target, Workbench, WorkbenchConfig

__all__ = ["add_parsers", "apply", "checkpoint", "mcp"]


def _params(text: str) -> dict[str, int]:
    """NAME=VALUE[,NAME=VALUE...]"""
    values: dict[str, int] = {}
    for item in filter(None, text.split(",")):
        match = re.fullmatch(r"\s*([A-Z][A-Z0-9_]*)\s*=\s*(-?[0-9]+)\s*", item)
        if not match:
            raise argparse.ArgumentTypeError(f"{item!r}: use NAME=VALUE with an integer value")
        values[match.group(1)] = int(match.group(2))
    return values


def _target_options(p: argparse.ArgumentParser, size: Callable[[str], Any]) -> None:
    p.add_argument("--kernel", help="kernel (default: the starting checkpoint's, else matmul)")
    p.add_argument("--backend", help=f"{', '.join(sorted(BACKENDS))} (default: the starting "
                                     "checkpoint's, else the device's)")
    p.add_argument("--device", help="device profile (default: the checkpoint's, else cpu)")
    p.add_argument("--dtype", help="default: the checkpoint's, else float32")
    p.add_argument("--size", type=size, metavar="N|MxNxK",
                   help="problem size (default: the checkpoint's, else the kernel's default)")


def _bench_options(p: argparse.ArgumentParser, size: Callable[[str], Any]) -> None:
    p.add_argument("--results", default="results", metavar="DIR",
                   help="folder of the cache and the checkpoints (default: results)")
    p.add_argument("--catalog", action="append", default=[], metavar="DIR")
    _target_options(p, size)
    p.add_argument("--applier", choices=("reference", "llm"),
                   help="default llm when OPENAI_MODEL and OPENAI_API_KEY are set")
    p.add_argument("--model", help="the LLM applier's model (default: OPENAI_MODEL)")
    p.add_argument("--temperature", type=float, help="the LLM's sampling temperature")
    p.add_argument("--repairs", type=int,
                   help="repair attempts per LLM step: a reply that fails a step check, "
                        "does not compile or computes wrong results goes back (default 2)")
    p.add_argument("--llm-timeout", type=float, help="seconds per LLM request (default 120)")
    p.add_argument("--llm-config", metavar="FILE",
                   help="LLM settings in TOML (model, base_url, temperature, repairs, ...); "
                        "options given here win")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per evaluation")
    p.add_argument("--repeats", type=int, default=7, help="timed runs per evaluation")
    p.add_argument("-v", "--verbose", action="store_true")


def add_parsers(sub: argparse._SubParsersAction, size: Callable[[str], Any]) -> None:
    p = sub.add_parser("apply", help="apply one transformation, show the diff, time it, "
                                     "checkpoint it")
    p.add_argument("transform", metavar="TRANSFORM")
    _bench_options(p, size)
    p.add_argument("--params", type=_params, action="append", default=[],
                   metavar="NAME=VALUE,...", help="tuning values (default: the parent's, "
                   "then the transformation's declared defaults); repeatable")
    p.add_argument("--from", dest="start", metavar="CHECKPOINT",
                   help="start here: a checkpoint or 'seed' (default: the current one)")
    p.add_argument("--name", help="name of the new checkpoint (default: cpN)")
    p.add_argument("--sample", type=int, default=0,
                   help="ask the applier again under another sample number (LLM: a new answer)")
    p.add_argument("--json", action="store_true",
                   help="print the result as one JSON object on the last line of stdout")
    c = sub.add_parser("checkpoint", help="list, show, diff, compare, evaluate, restore or "
                                          "delete checkpoints")
    actions = c.add_subparsers(dest="action", required=True)
    for name, text, args in (
            ("list", "the checkpoints as a tree; * marks the current one", ()),
            ("show", "sequence, parameters, measurements and source", ("name",)),
            ("diff", "unified diff of two checkpoints' sources ('seed' allowed)", ("a", "b")),
            ("restore", "make it current (the next apply starts there)", ("name",)),
            ("delete", "forget a checkpoint without children", ("name",)),
            ("evaluate", "validate and time again (at another --size or --dtype)", ("name",))):
        a = actions.add_parser(name, help=text)
        for arg in args:
            a.add_argument(arg)
        if name == "evaluate":
            _bench_options(a, size)
        else:
            _store_options(a)
    a = actions.add_parser("compare", help="speeds side by side")
    a.add_argument("names", nargs="+", metavar="NAME")
    _store_options(a)
    _target_options(a, size)
    a.add_argument("--measure", action="store_true",
                   help="evaluate those not measured at the size and dtype asked for")
    a.add_argument("--timeout", type=float, default=60.0)
    a.add_argument("--repeats", type=int, default=7)
    actions.choices["restore"].add_argument(
        "-o", "--output", help="also write its source (values as macros) to this file")
    m = sub.add_parser("mcp", help="a Model Context Protocol server on stdio for AI agents")
    _bench_options(m, size)


def _store_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", default="results", metavar="DIR")
    p.add_argument("--catalog", action="append", default=[], metavar="DIR")
    p.add_argument("-v", "--verbose", action="store_true")


def _llm(args: argparse.Namespace) -> tuple[str | None, dict[str, object]]:
    """(the model, LLMConfig fields): --llm-config's, then the options given."""
    settings: dict[str, object] = {}
    if getattr(args, "llm_config", None):
        from peak_tune.appliers.llm.config import load_llm_settings

        settings = load_llm_settings(Path(args.llm_config))
    model = getattr(args, "model", None) or settings.pop("model", None)
    for field_name, option in (("temperature", "temperature"), ("repairs", "repairs"),
                               ("timeout_s", "llm_timeout")):
        value = getattr(args, option, None)
        if value is not None:
            settings[field_name] = value
    return (str(model) if model else None), settings


def _config(args: argparse.Namespace) -> WorkbenchConfig:
    from peak_tune.appliers import default_applier

    model, llm_settings = _llm(args)
    return WorkbenchConfig(
        results=Path(args.results), catalogs=tuple(args.catalog),
        target=Target(getattr(args, "kernel", None), getattr(args, "backend", None),
                      getattr(args, "device", None), getattr(args, "dtype", None),
                      getattr(args, "size", None)),
        applier=ApplierSettings(
            name=getattr(args, "applier", None) or (
                "llm" if getattr(args, "llm_config", None) else default_applier()),
            model=model, llm_settings=llm_settings),
        eval_config=EvalConfig(timeout_s=getattr(args, "timeout", 60.0),
                               repeats=getattr(args, "repeats", 7)),
    )


def apply(args: argparse.Namespace) -> int:
    from peak_tune.workbench.view import apply_json, apply_text

    given: dict[str, int] = {}
    for group in args.params:
        given.update(group)
    bench = Workbench(_config(args))
    try:
        result = bench.apply(ApplyRequest(args.transform, given, args.start, args.name,
                                          args.sample))
    except ApplyError as exc:
        print(f"peak-tune: apply error: {exc}", file=sys.stderr)
        return 1
    finally:
        bench.close()
    out = sys.stderr if args.json else sys.stdout
    print(result.diff.rstrip("\n") or f"(the source is unchanged by {args.transform})", file=out)
    print(apply_text(result), file=out)
    if args.json:
        print(json.dumps(apply_json(result)))
    return 0 if result.checkpoint else 1


def checkpoint(args: argparse.Namespace) -> int:
    bench = Workbench(_config(args))
    try:
        return int(_ACTIONS[args.action](bench, args))
    finally:
        bench.close()


def _list(bench: Workbench, args: argparse.Namespace) -> int:
    from peak_tune.workbench.view import tree_text

    print(tree_text(bench.store.all(), bench.store.current()))
    return 0


def _show(bench: Workbench, args: argparse.Namespace) -> int:
    from peak_tune.workbench.view import show_text

    c = bench.store.get(args.name)
    print(show_text(c, bench.chain(c), bench.stored_context(c), bench.store.current()))
    return 0


def _diff(bench: Workbench, args: argparse.Namespace) -> int:
    text = bench.diff(args.a, args.b)
    print(text.rstrip("\n") or f"{args.a} and {args.b} have the same source")
    return 0


def _compare(bench: Workbench, args: argparse.Namespace) -> int:
    from peak_tune.workbench.checkpoints import timing_key
    from peak_tune.workbench.view import compare_text

    checkpoints = [bench.store.get(n) for n in args.names]  # every name checked first
    rows = []
    for c in checkpoints:
        size = c.size_label
        if args.size:
            symbols = bench.catalog.spec(c.kernel).size_symbols
            try:
                size = "x".join(str(v) for v in size_of(args.size, symbols).values())
            except ValueError as exc:
                raise UserError(str(exc)) from None
        key = timing_key(args.device or c.device, args.dtype or c.dtype, size)
        if args.measure and c.timing(key) is None:
            measured, _ = bench.evaluate(c.name, Target(dtype=args.dtype, size=args.size,
                                                        device=args.device))
            c = measured or c
        rows.append((c, key))
    print(compare_text(rows))
    return 0


def _evaluate(bench: Workbench, args: argparse.Namespace) -> int:
    from peak_tune.workbench.view import evaluation_text

    _, evaluation = bench.evaluate(args.name, bench.config.target)
    print(evaluation_text(evaluation))
    print(f"compiles   {evaluation.compiles}")
    return 0 if evaluation.outcome.measurement else 1


def _restore(bench: Workbench, args: argparse.Namespace) -> int:
    from peak_tune.workbench.view import kernel_file

    c = bench.store.get(args.name) if args.name != "seed" else None
    if args.output:
        if c is None:
            raise UserError("the seed has no checkpoint file to restore; name a checkpoint")
        Path(args.output).write_text(kernel_file(c, bench.stored_context(c)))
        print(f"wrote {args.output}")
    bench.restore(args.name)
    print(f"current checkpoint: {args.name} (the next `peak-tune apply` starts here)")
    return 0


def _delete(bench: Workbench, args: argparse.Namespace) -> int:
    gone = bench.store.delete(args.name)
    print(f"deleted checkpoint {gone.name} (its variant stays in the cache); current: "
          f"{bench.store.current() or 'seed'}")
    return 0


_ACTIONS: dict[str, Callable[[Workbench, argparse.Namespace], int]] = {
    "list": _list, "show": _show, "diff": _diff, "compare": _compare, "evaluate": _evaluate,
    "restore": _restore, "delete": _delete,
}


def mcp(args: argparse.Namespace) -> int:
    from peak_tune.workbench.mcp_server import serve_stdio

    return serve_stdio(_config(args))
