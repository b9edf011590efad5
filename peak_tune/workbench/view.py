"""Text and JSON forms of the workbench's results, shared by the CLI and the MCP server."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from peak_tune import __version__
from peak_tune.backends import element_macros
from peak_tune.core import KernelContext
from peak_tune.serialize import kernel_header
from peak_tune.workbench.checkpoints import SEED, Checkpoint, Timing
from peak_tune.workbench.steps import ApplyResult, Evaluation

__all__ = ["apply_json", "apply_text", "checkpoint_json", "compare_text", "evaluation_text",
           "kernel_file", "show_text", "timing_text", "tree_text"]


def _params(values: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items()) or "-"


def timing_text(timing: Timing | None) -> str:
    """One line: the variant's speed, the vendor's, and the ratio (or why it failed)."""
    if timing is None:
        return "not measured"
    if timing.status != "ok":
        return f"{timing.status.replace('_', ' ')}: {timing.message}"
    ratio = f" = {timing.ratio:.3f}x vendor" if timing.ratio is not None else ""
    return (f"{timing.gflops:.2f} GFLOP/s (median {timing.median_ms:.4f} ms, spread "
            f"{100 * timing.spread:.1f}%); {timing.vendor or 'vendor'} "
            f"{timing.vendor_gflops:.2f} GFLOP/s{ratio}")


def evaluation_text(evaluation: Evaluation) -> str:
    cached = " (cached)" if evaluation.outcome.cached else ""
    where = f"{evaluation.dtype} {evaluation.size.label()} on {evaluation.device}"
    return f"measured   {where}{cached}: {timing_text(evaluation.timing())}"


def apply_text(result: ApplyResult) -> str:
    """What `peak-tune apply` prints after the diff."""
    sources = result.param_sources
    lines = [
        f"applied    {result.transformation} to {result.parent}"
        + (" (cached: no applier call)" if result.applied_from_cache else ""),
        "parameters " + (", ".join(f"{k}={v} ({sources[k]})" for k, v in result.params.items())
                         or "-"),
    ]
    if result.defaults_used:
        lines.append(f"defaults   used for {', '.join(result.defaults_used)} "
                     "(give --params NAME=VALUE to choose)")
    if result.llm:
        from peak_tune.appliers.llm.stats import dollars

        use = result.llm
        lines.append(f"llm        {use['calls']} call(s), {use['repairs']} repair(s), "
                     f"{use['prompt_tokens'] + use['completion_tokens']} tokens, "
                     f"{dollars(use['cost_usd'])}")
    lines.append(evaluation_text(result.evaluation))
    lines.append(f"compiles   {result.evaluation.compiles}")
    if result.checkpoint is None:
        lines.append("checkpoint none: the variant failed, nothing was saved")
    else:
        again = " (the same step as before; now current)" if result.reused else " (now current)"
        lines.append(f"checkpoint {result.checkpoint.name}{again}")
    return "\n".join(lines)


def apply_json(result: ApplyResult) -> dict[str, Any]:
    timing = result.evaluation.timing()
    return {
        "parent": result.parent,
        "transformation": result.transformation,
        "checkpoint": result.checkpoint.name if result.checkpoint else None,
        "reused": result.reused,
        "status": timing.status,
        "message": timing.message,
        "gflops": timing.gflops,
        "vendor": {"name": timing.vendor, "gflops": timing.vendor_gflops},
        "ratio": timing.ratio,
        "params": dict(result.params),
        "defaults_used": result.defaults_used,
        "context_hash": result.context_hash,
        "size": result.evaluation.size.label(),
        "dtype": result.evaluation.dtype,
        "cache": {"application_hit": result.applied_from_cache,
                  "evaluation_hit": result.evaluation.outcome.cached,
                  "compiles": result.evaluation.compiles},
        "llm": dict(result.llm) if result.llm else None,
        "diff": result.diff,
    }


def checkpoint_json(checkpoint: Checkpoint, current: str | None = None) -> dict[str, Any]:
    data = checkpoint.to_json()
    data["current"] = checkpoint.name == current
    data["timings"] = {k: {**vars(t), "ratio": t.ratio} for k, t in checkpoint.timings.items()}
    return data


def tree_text(checkpoints: Sequence[Checkpoint], current: str | None) -> str:
    """The checkpoints as a tree under each seed; `*` marks the current one."""
    if not checkpoints:
        return "no checkpoints yet (make one with `peak-tune apply TRANSFORM`)"
    kids: dict[str, list[Checkpoint]] = {}
    for c in checkpoints:
        kids.setdefault(c.parent, []).append(c)
    lines: list[str] = []
    roots = kids.get(SEED, [])
    for kernel, backend in dict.fromkeys((c.kernel, c.backend) for c in roots):
        marker = " *" if current is None else ""
        lines.append(f"{SEED} ({kernel}, {backend}){marker}")
        group = [c for c in roots if (c.kernel, c.backend) == (kernel, backend)]
        _branch(group, kids, "", current, lines)
    width = max(len(line.split("\t")[0]) for line in lines)
    return "\n".join(line.split("\t")[0].ljust(width) + " " + line.split("\t")[1]
                     if "\t" in line else line for line in lines)


def _branch(group: list[Checkpoint], kids: Mapping[str, list[Checkpoint]], indent: str,
            current: str | None, lines: list[str]) -> None:
    """One line per checkpoint: the tree part, a tab, the details (aligned later)."""
    for i, c in enumerate(group):
        last = i == len(group) - 1
        mark = "*" if c.name == current else " "
        timing = c.timing()
        speed = (f"{timing.gflops:9.2f} GFLOP/s {timing.ratio or 0:6.3f}x"
                 if timing and timing.status == "ok" else f"{'-':>24}")
        lines.append(f"{indent}{'└── ' if last else '├── '}{c.name} {mark}\t"
                     f"{c.transformation:<18} {speed}  {c.dtype} {c.size_label}  "
                     f"{_params(c.params)}")
        _branch(kids.get(c.name, []), kids, indent + ("    " if last else "│   "), current,
                lines)


def show_text(checkpoint: Checkpoint, chain: Sequence[Checkpoint], context: KernelContext,
              current: str | None) -> str:
    lines = [
        f"checkpoint {checkpoint.name}" + (" (current)" if checkpoint.name == current else ""),
        f"parent     {checkpoint.parent}",
        f"path       {' > '.join([SEED, *(c.name for c in chain)])}",
        f"sequence   {' > '.join(context.applied) or '(seed)'}",
        f"made by    {checkpoint.transformation} v{checkpoint.transform_version} with "
        f"{checkpoint.applier}" + (f" (sample {checkpoint.sample})" if checkpoint.sample else "")
        + f", {checkpoint.created}",
        f"parameters {_params(checkpoint.params)}"
        + (f" (defaults: {', '.join(checkpoint.defaults_used)})"
           if checkpoint.defaults_used else ""),
        f"target     {checkpoint.kernel} on {checkpoint.device} ({checkpoint.backend})",
        f"variant    {checkpoint.context_hash}",
    ]
    if context.constraints or context.size_constraints:
        lines.append(f"constraints {', '.join(context.constraints + context.size_constraints)}")
    for key, timing in checkpoint.timings.items():
        lines.append(f"measured   {key}: {timing_text(timing)}")
    lines += ["source", context.source.rstrip("\n")]
    return "\n".join(lines)


def compare_text(rows: Sequence[tuple[Checkpoint, str]]) -> str:
    """Side by side, each at the measurement key given with it: speed, vendor, ratio and
    speed-up over the first one."""
    table = [("checkpoint", "parent", "step", "measured at", "GFLOP/s", "vendor", "ratio",
              "vs first", "parameters")]
    base = rows[0][0].timing(rows[0][1]) if rows else None
    for c, key in rows:
        t = c.timing(key)
        if t is None or t.status != "ok":
            speed = t.status.replace("_", " ") if t else "not measured"
            table.append((c.name, c.parent, c.transformation, key, speed, "-", "-", "-",
                          _params(c.params)))
            continue
        speedup = f"{t.gflops / base.gflops:.2f}x" if base and base.gflops else "-"
        ratio = f"{t.ratio:.3f}x" if t.ratio is not None else "-"
        table.append((c.name, c.parent, c.transformation, key, f"{t.gflops:.2f}",
                      f"{t.vendor_gflops:.2f}", ratio, speedup, _params(c.params)))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]) - 1)]
    return "\n".join("  ".join([*(v.ljust(w) for v, w in zip(r, widths, strict=False)), r[-1]])
                     for r in table)


def kernel_file(checkpoint: Checkpoint, context: KernelContext) -> str:
    """The checkpoint's source with a provenance header and its values as macros."""
    timing = checkpoint.timing()
    lines = [
        f"Restored by peak-tune {__version__} from checkpoint {checkpoint.name}",
        f"variant {checkpoint.context_hash}",
        f"kernel {checkpoint.kernel} on {checkpoint.device} ({checkpoint.backend})",
        f"sequence: {' > '.join(context.applied) or '(seed)'}",
        f"measured {checkpoint.key}: {timing_text(timing)}",
    ]
    element = element_macros(checkpoint.backend, checkpoint.dtype)
    return kernel_header(lines, context, {**element, **checkpoint.params}) + "\n" + context.source
