"""The chat messages of one pass, following the PEAK paper: a system message with the
contract, a user message with the pass's text (device facts filled in), the current
region and the tuning parameters. Changing any text here bumps PROMPT_VERSION, which is
part of the applier's identity and so of every application cache key."""

from __future__ import annotations

import json
import re

from peak_tune.catalog.types import DeviceProfile, Pass, Transformation
from peak_tune.core import KernelContext, ParamDomain
from peak_tune.errors import ApplyError

__all__ = [
    "LAUNCH_KEYS",
    "PROMPT_VERSION",
    "fill_placeholders",
    "pass_messages",
    "repair_message",
    "wrong_result_message",
]

# 2: wrong results go back to the model for repair. The HIP table below came with the
# HIP backend: no HIP prompt was asked before it, so C and CUDA keys stay as they were.
PROMPT_VERSION = 2
LAUNCH_KEYS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "shared_bytes")
REGION_NAMES = {"device": "device code", "macros": "macros", "launch": "launch geometry"}
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_MAX_ERROR_CHARS = 4000

_CODE_RULES = """\
You are a GPU and CPU performance engineer. You carry out one step of a kernel \
optimisation, described in plain English, on one {backend} kernel.
Rules:
1. Apply exactly the edit the step describes and nothing else: no other optimisations, \
no renaming, no reformatting of code the step does not touch.
2. Tuning parameters are preprocessor macros whose values an autotuner chooses and \
passes with -D at compile time. Introduce each new one with a guard \
(#ifndef NAME / #error "NAME must be defined" / #endif). Never choose their values: \
never #define them to a number and never replace them by numbers.
3. Keep the entry point `{entry}` with exactly its current signature (name, return \
type, parameter types and names), unless the step itself asks for a qualifier.
4. The kernel must stay correct for every problem size, including sizes that are not \
multiples of any tile.
5. Reply with the whole edited kernel source in one fenced code block and nothing else."""

_LAUNCH_RULES = """\
You are a GPU performance engineer. You carry out one step of a kernel optimisation, \
described in plain English, on the launch geometry of one {backend} kernel.
Rules:
1. The launch geometry is a JSON object mapping some of the keys {keys} to integer \
expressions written as strings. grid_x and block_x are required; missing extents are 1 \
and missing shared_bytes (dynamic shared memory in bytes) is 0.
2. Expressions may use the problem sizes {sizes}, the tuning parameters, integers, \
+ - * // % and the functions ceil_div, min and max. Never choose values for tuning \
parameters.
3. Apply exactly the change the step describes and keep the rest.
4. Reply with the whole new launch geometry in one fenced ```json code block and \
nothing else."""


# Transformations for CUDA and HIP are written once, in CUDA's words; a HIP kernel gets
# this table with the step (the PEAK paper's translation for its HIP backend).
_HIP_VOCABULARY = "\n".join((
    "The step is written in CUDA's words; this kernel is HIP. Translate as you go:",
    "| CUDA | HIP |",
    "| --- | --- |",
    "| threadIdx, blockIdx, blockDim, gridDim, __syncthreads(), atomicAdd | the same |",
    "| a warp of 32 threads | a wavefront of {warp_size} lanes on this device "
    "(PT_WARP_SIZE where the kernel defines it, else warpSize) |",
    "| __shfl_sync(mask, v, l), __shfl_down_sync, __shfl_xor_sync "
    "| __shfl(v, l), __shfl_down(v, d), __shfl_xor(v, m) (no mask) |",
    "| shared memory (__shared__) | LDS (__shared__ too), "
    "{shared_memory_per_block_kib} KiB per workgroup here |",
    "| streaming multiprocessor (SM) | compute unit (CU); {sms} on this device |",
    "| __launch_bounds__(threads, minBlocks) | __launch_bounds__(threads) "
    "(a second argument means waves per execution unit) |",
    "| #include <cuda_fp16.h>, __half | #include <hip/hip_fp16.h>, __half |",
    "| __nanosleep, __ldcg, __trap "
    "| PT_PAUSE(), PT_LOAD_L2(p), PT_TRAP() where the kernel defines them |",
    "Never use PTX (asm), cp.async, ldmatrix, mma.sync, wgmma or TMA: "
    "they do not exist in HIP."))


def fill_placeholders(text: str, device: DeviceProfile,
                      params: frozenset[str] = frozenset()) -> str:
    """`text` with every {fact} replaced by the device profile's value and every {PARAM}
    (a tuning parameter in `params`) by its bare name; ApplyError for a placeholder that
    is neither, or a fact the profile has not measured ("detect")."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in params:
            return name
        found = device.facts.get(name)
        if found is None or found == "detect":
            raise ApplyError(f"device profile {device.name!r} has no value for the "
                             f"placeholder {{{name}}}")
        return str(found)

    return _PLACEHOLDER.sub(value, text)


def pass_messages(
    context: KernelContext,
    transformation: Transformation,
    step: Pass,
    index: int,
    device: DeviceProfile,
    sizes: tuple[str, ...],
) -> list[dict[str, str]]:
    """The system and user messages asking for pass `index` (from 0)."""
    if step.region == "launch":
        system = _LAUNCH_RULES.format(backend=context.backend, keys=", ".join(LAUNCH_KEYS),
                                      sizes=", ".join(sizes))
    else:
        system = _CODE_RULES.format(backend=context.backend, entry=context.entry)
    lines = [
        f"Backend: {context.backend}. Device: {device.title}.",
        f"Transformation: {transformation.title} (pass {index + 1} of "
        f"{len(transformation.passes)}, region: {REGION_NAMES.get(step.region, step.region)}).",
        "",
        "## The step",
        fill_placeholders(step.text.strip(), device, frozenset(
            p.name for p in context.params + transformation.params)),
        "",
        *([fill_placeholders(_HIP_VOCABULARY, device), ""] if context.backend == "hip" else []),
        "## Tuning parameters already in the kernel (values chosen by the tuner)",
        _params_line(context.params),
        "",
        "## Tuning parameters this transformation introduces",
        _params_line(transformation.params),
        "",
        "## Current kernel source",
        f"```{_fence_language(context.backend)}",
        context.source.rstrip(),
        "```",
    ]
    if step.region == "launch":
        lines += ["", "## Current launch geometry", "```json",
                  json.dumps(dict(context.launch), indent=1), "```",
                  "", "Reply with the whole new launch geometry in one fenced ```json block."]
    else:
        lines += ["", "Reply with the whole edited kernel source in one fenced code block "
                      "and nothing else."]
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(lines)}]


def repair_message(error: str) -> dict[str, str]:
    """The follow-up asking the model to fix code that failed to compile."""
    text = error.strip()
    if len(text) > _MAX_ERROR_CHARS:
        text = text[:_MAX_ERROR_CHARS] + "\n... (truncated)"
    return {
        "role": "user",
        "content": f"The code failed to compile:\n```\n{text}\n```\nFix it. Reply with the "
                   "whole corrected result in one fenced code block and nothing else.",
    }


def wrong_result_message(summary: str) -> dict[str, str]:
    """The follow-up asking the model to fix code that compiles but computes wrong
    results; `summary` is the validator's report (size, elements off, examples)."""
    text = summary.strip()
    if len(text) > _MAX_ERROR_CHARS:
        text = text[:_MAX_ERROR_CHARS] + "\n... (truncated)"
    return {
        "role": "user",
        "content": "The code compiles but computes wrong results. The tuner ran it on random "
                   "inputs and compared the output with a float64 reference:\n"
                   f"```\n{text}\n```\nFind the bug and fix it, keeping the step's "
                   "optimisation. Reply with the whole corrected "
                   "result in one fenced code block and nothing else.",
    }


def _params_line(params: tuple[ParamDomain, ...]) -> str:
    if not params:
        return "none"
    return "; ".join(f"{p.name} (one of {', '.join(map(str, p.values))})" for p in params)


def _fence_language(backend: str) -> str:
    return {"c": "c", "cuda": "cuda", "hip": "cpp", "hlsl": "hlsl"}.get(backend, "")
