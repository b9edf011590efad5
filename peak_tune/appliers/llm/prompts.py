"""The chat messages of one pass, following the PEAK paper: a system message with the
contract, a user message with the pass's text (device facts filled in), the current
region and the tuning parameters. Changing any text here bumps PROMPT_VERSION, which is
part of the applier's identity and so of every application cache key."""

from __future__ import annotations

import dataclasses
import json
import re

from peak_tune.catalog.types import DeviceProfile, Pass, Transformation
from peak_tune.core import KernelContext, ParamDomain
from peak_tune.errors import ApplyError

from .regions import first_code_line, split

__all__ = [
    "LAUNCH_KEYS",
    "PROMPT_VERSION",
    "SHADER_LAUNCH_KEYS",
    "launch_keys",
    "fill_placeholders",
    "step_repair_message",
    "pass_messages",
    "repair_message",
    "wrong_result_message",
]

# 2: wrong results go back to the model for repair. The HIP and HLSL tables below came
# with their backends: no such prompt was asked before them, so C and CUDA keys stay as
# they were. 3: each reply is checked against its step (changed, one block, not cut off,
# every parameter live) and one that fails goes back to the model with what was wrong,
# so an earlier version's accepted children are not this one's. 4: the prompt says how
# the kernel is built (compiler, flags, macros) and at which sizes it is checked.
PROMPT_VERSION = 5
LAUNCH_KEYS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "shared_bytes")
# An HLSL shader's thread group is its own [numthreads] (group_x, group_y, group_z in the
# expressions): its launch is the grid of groups alone.
SHADER_LAUNCH_KEYS = ("grid_x", "grid_y", "grid_z")
_REQUIRED = ("grid_x and block_x are required; missing extents are 1 and missing "
             "shared_bytes (dynamic shared memory in bytes) is 0. Expressions may also use "
             "SMS, the running device's multiprocessor count.")
_SHADER_REQUIRED = ("grid_x is required; missing extents are 1. The thread group is the "
                    "shader's [numthreads(...)]: expressions may also use its extents "
                    "group_x, group_y and group_z.")
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
passes with -D at compile time, as DTYPE (the element type) is. Introduce each new one \
with a guard (#ifndef NAME / #error "NAME must be defined" / #endif). Never choose their \
values: never #define them to a number and never replace them by numbers. Keep every \
parameter already in the kernel in use as the earlier steps used it: the tuner checks \
that each one still changes the code.
3. Keep the entry point `{entry}` with exactly its current signature (name, return \
type, parameter types and names), unless the step itself asks for a qualifier.
4. The kernel must stay correct for every problem size, including sizes that are not \
multiples of any tile.
5. Reply with the part of the source the message asks for (one region: the macros or \
the device code) in one fenced code block and nothing else."""

_LAUNCH_RULES = """\
You are a GPU performance engineer. You carry out one step of a kernel optimisation, \
described in plain English, on the launch geometry of one {backend} kernel.
Rules:
1. The launch geometry is a JSON object mapping some of the keys {keys} to integer \
expressions written as strings. {required}
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


# The same steps on an HLSL compute shader (the paper's table for its HLSL backend).
_HLSL_VOCABULARY = "\n".join((
    "The step is written in CUDA's words; this kernel is an HLSL compute shader for "
    "Vulkan. Translate as you go:",
    "| CUDA | HLSL |",
    "| --- | --- |",
    "| blockIdx, threadIdx | SV_GroupID, SV_GroupThreadID (SV_GroupIndex: the linear "
    "thread index) |",
    "| blockDim, gridDim | the thread-grid macros; the sizes (there is no grid size) |",
    "| the block of threads, block_x / block_y | the thread group, "
    "[numthreads(x, y, 1)] on the entry point, at most {max_threads_per_group} threads |",
    "| __shared__ DTYPE s[N] | groupshared DTYPE s[N] (a fixed size, at most "
    "{groupshared_kib} KiB; no dynamic shared memory: shared_bytes does not exist) |",
    "| pointers into A, B, C or a shared tile | indices into the buffers and into the "
    "groupshared array |",
    "| __syncthreads() | GroupMemoryBarrierWithGroupSync() |",
    "| #pragma unroll | [unroll] before the loop |",
    "| static_assert(cond, msg) | #if !(cond) / #error msg / #endif |",
    "| uint4 / float4 loads of 16 bytes | a StructuredBuffer<float4> (half4 for half) "
    "view of the same binding |",
    "| __device__ __forceinline__ functions | plain functions (all are inlined); `in` "
    "and `out` are keywords |",
    "| a warp of 32 threads, __shfl_sync | a wave of WaveGetLaneCount() lanes, "
    "WaveReadLaneAt |",
    "The sizes are push constants (sizes.M, sizes.N, sizes.K); A, B and C are the "
    "structured buffers at bindings 0, 1 and 2. Never use CUDA, PTX or tensor cores."))
_VOCABULARY = {"hip": _HIP_VOCABULARY, "hlsl": _HLSL_VOCABULARY}


# The GPU steps' device facts in CUDA's words, for a Vulkan device: its own limits where
# Vulkan has them, else said to be undocumented (a GPU driven through Vulkan publishes
# no register file or multiprocessor count).
_SHADER_FACTS = {"max_threads_per_block": "max_threads_per_group",
                 "shared_memory_per_block_kib": "groupshared_kib",
                 "shared_memory_per_sm_kib": "groupshared_kib"}
_UNDOCUMENTED = ("sms", "registers_per_sm", "max_registers_per_thread", "l2_mib")


def shader_device(device: DeviceProfile) -> DeviceProfile:
    """`device` with the CUDA-named facts the GPU steps' texts use, for an HLSL kernel."""
    facts = dict(device.facts)
    for cuda_name, vulkan_name in _SHADER_FACTS.items():
        if cuda_name not in facts and vulkan_name in facts:
            facts[cuda_name] = facts[vulkan_name]
    facts.setdefault("warp_size", device.wave_size)  # the subgroup: see warp-tiling
    for name in _UNDOCUMENTED:
        facts.setdefault(name, "(not documented for this device)")
    return dataclasses.replace(device, facts=facts)


def launch_keys(backend: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the keys a launch reply may have, those it must have) for `backend`."""
    if backend == "hlsl":
        return SHADER_LAUNCH_KEYS, ("grid_x",)
    return LAUNCH_KEYS, ("grid_x", "block_x")


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
    build_notes: str = "",
) -> list[dict[str, str]]:
    """The system and user messages asking for pass `index` (from 0); `build_notes`:
    how the candidate is built and checked (appliers.wiring.build_notes)."""
    if context.backend == "hlsl":
        device = shader_device(device)
    if step.region == "launch":
        shader = context.backend == "hlsl"
        system = _LAUNCH_RULES.format(
            backend=context.backend, keys=", ".join(launch_keys(context.backend)[0]),
            required=_SHADER_REQUIRED if shader else _REQUIRED, sizes=", ".join(sizes))
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
        *([fill_placeholders(_VOCABULARY[context.backend], device), ""]
          if context.backend in _VOCABULARY else []),
        "## Tuning parameters already in the kernel (values chosen by the tuner)",
        _params_line(tuple(p for p in context.params
                           if p.introduced_by != transformation.id)),
        "",
        "## Tuning parameters this transformation introduces",
        _params_line(transformation.params),
        "",
        *(["## How the kernel is built and checked", build_notes, ""] if build_notes else []),
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
        lines += ["", _region_request(context.source, step.region)]
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(lines)}]


def _region_request(source: str, region: str) -> str:
    """What a code pass asks back: its region alone (see regions.py)."""
    start = first_code_line(source)
    if region == "macros":
        now = "" if split(source).macros.strip() else ", empty now"
        return (f"Reply with the macros region alone (the preprocessor lines above the "
                f"code{now}), edited as the step says, in one fenced code block and nothing "
                f"else; the device code from `{start}` on stays as it is.")
    if not split(source).macros.strip():
        return "Reply with the whole edited kernel source in one fenced code block and " \
               "nothing else."
    return (f"Reply with the device code alone, from `{start}` on, edited as the step says, "
            "in one fenced code block and nothing else; the macros above it stay as they "
            "are.")


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


def step_repair_message(problem: str) -> dict[str, str]:
    """The follow-up for a reply that does not do what the step says (see step_check)."""
    return {
        "role": "user",
        "content": f"The reply cannot be accepted: {problem.strip()}. Apply the step as "
                   "described, keeping everything the earlier steps did. Reply with the "
                   "whole result in one fenced code block and nothing else.",
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
