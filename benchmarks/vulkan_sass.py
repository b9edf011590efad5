"""The machine code NVIDIA's Vulkan driver makes of an HLSL variant, beside the SASS of
the same plan built as CUDA, and the GPU's FMA rate through each API, in one run.

Issue 17's question is why a plan that runs at 0.94x cuBLAS as CUDA runs at 0.70x as
HLSL through Vulkan. The timings cannot say; the instructions can. For each variant:
the CUDA cubin's SASS (cuobjdump), and the Vulkan pipeline's binary, read back from a
VkPipelineCache (vkGetPipelineCacheData) and from the driver's shader disk cache, every
ELF image found in either disassembled with nvdisasm/cuobjdump. The FMA probe times
the same dependent-FMA loop as a compute shader and as a CUDA kernel: equal rates mean
clocks and scheduling are alike and the gap is in the code.

Run it with __GL_SHADER_DISK_CACHE_PATH set to an empty folder (the driver reads it at
load) and the Vulkan loader as benchmarks/device_vulkan.sh sets it up:

    __GL_SHADER_DISK_CACHE_PATH=/tmp/nvc python3 benchmarks/vulkan_sass.py --out $OUT/sass
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from hlsl_variants import VARIANTS, built, matmul, through_vulkan  # noqa: E402

from peak_tune.backends._hlsl_compile import compile_spirv, find_compiler  # noqa: E402
from peak_tune.backends.base import EvalConfig, EvalRequest  # noqa: E402
from peak_tune.backends.cuda import CudaBackend  # noqa: E402
from peak_tune.backends.hlsl import HlslBackend  # noqa: E402
from peak_tune.catalog.loaders import load_device  # noqa: E402
from peak_tune.core import ProblemSize  # noqa: E402

FMA_ITERATIONS = 8192
FMA_CHAINS = 8
FMA_GROUPS = 132 * 32
FMA_THREADS = 256

FMA_HLSL = f"""
struct Params {{ float b; float c; }};
[[vk::push_constant]] ConstantBuffer<Params> params;
[[vk::binding(0)]] RWStructuredBuffer<float> Out;
[numthreads({FMA_THREADS}, 1, 1)]
void main(uint3 id : SV_DispatchThreadID) {{
    float a[{FMA_CHAINS}];
    [unroll] for (int j = 0; j < {FMA_CHAINS}; ++j) a[j] = (float)id.x + j;
    for (int i = 0; i < {FMA_ITERATIONS}; ++i) {{
        [unroll] for (int j = 0; j < {FMA_CHAINS}; ++j) a[j] = a[j] * params.b + params.c;
    }}
    float s = 0;
    [unroll] for (int j = 0; j < {FMA_CHAINS}; ++j) s += a[j];
    Out[id.x] = s;
}}
"""

FMA_CUDA = f"""
extern "C" __global__ void fma_probe(float *out, float b, float c) {{
    const int id = blockIdx.x * blockDim.x + threadIdx.x;
    float a[{FMA_CHAINS}];
#pragma unroll
    for (int j = 0; j < {FMA_CHAINS}; ++j) a[j] = (float)id + j;
    for (int i = 0; i < {FMA_ITERATIONS}; ++i) {{
#pragma unroll
        for (int j = 0; j < {FMA_CHAINS}; ++j) a[j] = a[j] * b + c;
    }}
    float s = 0;
#pragma unroll
    for (int j = 0; j < {FMA_CHAINS}; ++j) s += a[j];
    out[id] = s;
}}
"""

FMA_FLOPS = 2 * FMA_ITERATIONS * FMA_CHAINS * FMA_GROUPS * FMA_THREADS

# the same loop with the chains as named scalars: no array for the driver to promote
_CHAINS = range(FMA_CHAINS)
FMA_HLSL_SCALARS = f"""
struct Params {{ float b; float c; }};
[[vk::push_constant]] ConstantBuffer<Params> params;
[[vk::binding(0)]] RWStructuredBuffer<float> Out;
[numthreads({FMA_THREADS}, 1, 1)]
void main(uint3 id : SV_DispatchThreadID) {{
    {" ".join(f"float a{j} = (float)id.x + {j};" for j in _CHAINS)}
    for (int i = 0; i < {FMA_ITERATIONS}; ++i) {{
        {" ".join(f"a{j} = a{j} * params.b + params.c;" for j in _CHAINS)}
    }}
    Out[id.x] = {" + ".join(f"a{j}" for j in _CHAINS)};
}}
"""


# spirv-opt's -O without redundancy-elimination (65 of 80 s on one lavapipe variant)
_O_PASSES = (
    "--wrap-opkill --eliminate-dead-branches --merge-return --inline-entry-points-exhaustive "
    "--eliminate-dead-functions --eliminate-dead-code-aggressive --private-to-local "
    "--eliminate-local-single-block --eliminate-local-single-store "
    "--eliminate-dead-code-aggressive --scalar-replacement=100 --convert-local-access-chains "
    "--eliminate-local-single-block --eliminate-local-single-store "
    "--eliminate-dead-code-aggressive --ssa-rewrite --eliminate-dead-code-aggressive --ccp "
    "--eliminate-dead-code-aggressive --loop-unroll --eliminate-dead-branches "
    "--combine-access-chains --simplify-instructions --scalar-replacement=100 "
    "--convert-local-access-chains --eliminate-local-single-block "
    "--eliminate-local-single-store --eliminate-dead-code-aggressive --ssa-rewrite "
    "--eliminate-dead-code-aggressive --vector-dce --eliminate-dead-inserts "
    "--eliminate-dead-branches --simplify-instructions --if-conversion "
    "--copy-propagate-arrays --reduce-load-size --eliminate-dead-code-aggressive "
    "--merge-blocks --eliminate-dead-branches --merge-blocks --simplify-instructions")
# which of spirv-opt's work the driver rewards: name -> passes
PASS_SETS = {
    "-O": "-O",
    "-O without redundancy-elimination": _O_PASSES,
    "loop-unroll alone": "--loop-unroll",
    "SSA, no unroll": "--private-to-local --scalar-replacement=100 --ssa-rewrite --ccp "
                      "--simplify-instructions --eliminate-dead-code-aggressive",
    "unroll + SSA": "--loop-unroll --scalar-replacement=100 --ssa-rewrite --ccp "
                    "--simplify-instructions --eliminate-dead-code-aggressive",
}


def optimized(spirv: Path, passes: str = "-O") -> tuple[Path, float]:
    """`spirv` through spirv-opt with `passes`, and the seconds that took."""
    out = spirv.with_suffix(".opt.spv")
    started = time.perf_counter()
    subprocess.run(["spirv-opt", "--target-env=vulkan1.1", *passes.split(), str(spirv),
                    "-o", str(out)], check=True, capture_output=True, timeout=300)
    return out, round(time.perf_counter() - started, 2)


def run(command: list[str], out: Path) -> str:
    """`command`'s output into `out`; its first line of failure otherwise."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    out.write_text(done.stdout + done.stderr)
    return f"rc {done.returncode}, {len(done.stdout.splitlines())} lines"


def elf_images(blob: bytes) -> list[bytes]:
    """Every ELF image in `blob`, each cut at its section-header table's end."""
    found, start = [], blob.find(b"\x7fELF")
    while start >= 0:
        image = blob[start:]
        if len(image) >= 64 and image[4] == 2:  # 64-bit ELF
            shoff = int.from_bytes(image[40:48], "little")
            shentsize = int.from_bytes(image[58:60], "little")
            shnum = int.from_bytes(image[60:62], "little")
            end = shoff + shentsize * shnum
            if 0 < end <= len(image):
                found.append(image[:end])
        start = blob.find(b"\x7fELF", start + 4)
    return found


def disassemble(blob: bytes, stem: str, out: Path) -> dict[str, str]:
    notes: dict[str, str] = {}
    for n, image in enumerate(elf_images(blob)):
        path = out / f"{stem}-{n}.elf"
        path.write_bytes(image)
        notes[path.name] = run(["cuobjdump", "-sass", str(path)], out / f"{path.name}.cuobjdump")
        notes[path.name + " nvdisasm"] = run(["nvdisasm", "-c", str(path)],
                                             out / f"{path.name}.nvdisasm")
    return notes


def pipeline_cache_data(device: Any, spirv: bytes) -> bytes:
    """The driver's VkPipelineCache contents after building `spirv` into a pipeline."""
    vk = device._vk
    cache = vk.vkCreatePipelineCache(device.device, vk.VkPipelineCacheCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO), None)
    buffers = [device.buffer(64) for _ in range(3)]
    pipeline = device.pipeline(spirv, buffers, 12)
    # the same module and layout again, now through the cache
    stage = vk.VkPipelineShaderStageCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
        stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=pipeline.module, pName="main")
    info = vk.VkComputePipelineCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, stage=stage,
        layout=pipeline.layout)
    handle = vk.vkCreateComputePipelines(device.device, cache, 1, [info], None)[0]
    size = vk.ffi.new("size_t *")  # the bindings wrap no vkGetPipelineCacheData: cffi's
    vk.lib.vkGetPipelineCacheData(device.device, cache, size, vk.ffi.NULL)
    data = vk.ffi.new("char[]", size[0])
    vk.lib.vkGetPipelineCacheData(device.device, cache, size, data)
    vk.vkDestroyPipeline(device.device, handle, None)
    vk.vkDestroyPipelineCache(device.device, cache, None)
    device.destroy(pipeline)
    return bytes(vk.ffi.buffer(data, size[0]))


def fma_probe(device: Any, out: Path) -> dict[str, Any]:
    import struct

    import cupy

    found: dict[str, Any] = {"flops": FMA_FLOPS}
    target = device.buffer(FMA_GROUPS * FMA_THREADS * 4)
    push = struct.pack("<ff", 0.999, 0.001)
    for name, source in (("array", FMA_HLSL), ("scalars", FMA_HLSL_SCALARS)):
        spirv_path = out / f"fma-{name}.spv"
        compile_spirv(find_compiler("glslang"), source, {}, spirv_path)
        for how, path in (("", spirv_path), (" spirv-opt", optimized(spirv_path)[0])):
            pipeline = device.pipeline(path.read_bytes(), [target], 8)
            times = [device.dispatch(pipeline, (FMA_GROUPS, 1, 1), push) for _ in range(7)]
            found[f"vulkan {name}{how} ms"] = times
            found[f"vulkan {name}{how} tflops"] = FMA_FLOPS / min(times) / 1e9
            device.destroy(pipeline)
    kernel = cupy.RawKernel(FMA_CUDA, "fma_probe", options=("-arch=sm_90",))
    result = cupy.empty(FMA_GROUPS * FMA_THREADS, dtype=cupy.float32)
    cuda_times = []
    for _ in range(7):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        kernel((FMA_GROUPS,), (FMA_THREADS,), (result, cupy.float32(0.999),
                                                cupy.float32(0.001)))
        stop.record()
        stop.synchronize()
        cuda_times.append(cupy.cuda.get_elapsed_time(start, stop))
    found["cuda_ms"] = cuda_times
    found["cuda_tflops"] = FMA_FLOPS / min(cuda_times) / 1e9
    return found


def timed(backend: Any, artifact: Any, context: Any, params: dict[str, int],
          n: int) -> dict[str, Any]:
    spec = matmul()
    size = ProblemSize.of({"M": n, "N": n, "K": n})
    started = time.perf_counter()
    try:
        got = backend.evaluate(artifact, EvalRequest(spec, context, params, "float32", size,
                                                     spec.check_sizes,
                                                     EvalConfig(timeout_s=300.0)))
    except Exception as exc:  # one variant's failure is a note
        return {"error": f"{type(exc).__name__}: {exc}"[:400]}
    return {"gflops": got.gflops, "samples_ms": list(got.samples_ms),
            "seconds": round(time.perf_counter() - started, 2)}


def timed_pass_sets(hlsl: HlslBackend, artifact: Any, context: Any, params: dict[str, int],
                    n: int) -> dict[str, Any]:
    """The variant's module as the compiler wrote it and through each of PASS_SETS (the
    artifact's file replaced by the optimised module for each evaluation)."""
    found = {"as compiled": timed(hlsl, artifact, context, params, n)}
    original = Path(artifact.path).read_bytes()
    source = Path(artifact.path).with_suffix(".original.spv")
    source.write_bytes(original)
    try:
        for name, passes in PASS_SETS.items():
            try:
                module, seconds = optimized(source, passes)
            except subprocess.SubprocessError as exc:
                found[name] = {"error": f"spirv-opt: {exc}"[:300]}
                continue
            Path(artifact.path).write_bytes(module.read_bytes())
            found[name] = {**timed(hlsl, artifact, context, params, n),
                           "spirv_opt_s": seconds, "module_bytes": module.stat().st_size}
    finally:
        Path(artifact.path).write_bytes(original)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="h200")
    parser.add_argument("--variants", default="cuda winner 64x128 k16,paper 128x128 k32")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--out", default="vulkan_sass")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = load_device(ROOT / "backends" / "devices" / f"{args.device}.toml")
    build = tempfile.mkdtemp(prefix="peak-tune-vulkan-sass-")
    wanted = args.variants.split(",")
    report: dict[str, Any] = {"variants": {}}
    from peak_tune.backends._vulkan import VulkanDevice

    with CudaBackend(gpu) as cuda, HlslBackend(through_vulkan(gpu, "glslang", "off")) as hlsl, \
            VulkanDevice(0, statistics=True) as device:
        vendor_name, vendor = cuda.time_vendor(matmul(), "float32",
                                               ProblemSize.of({"M": args.size, "N": args.size,
                                                               "K": args.size}),
                                               EvalConfig(timeout_s=300.0))
        report["vendor"] = {"name": vendor_name, "gflops": vendor.gflops}
        for label, sequence, values in VARIANTS:
            if label not in wanted:
                continue
            stem = label.replace(" ", "_")
            notes: dict[str, Any] = {}
            for name, backend in (("cuda", cuda), ("hlsl", hlsl)):
                context = built(name, sequence, gpu)
                params = {p.name: values[p.name] for p in context.params}
                (out / f"{stem}.{name}.src").write_text(context.source)
                (out / f"{stem}.{name}.params.json").write_text(json.dumps(params))
                artifact = backend.compile(context, params, "float32", build)
                shutil.copy(artifact.path, out / f"{stem}{Path(artifact.path).suffix}")
                notes[name] = {"resources": dict(artifact.resources)}
                if name == "cuda":
                    notes["cuda"]["timed"] = timed(cuda, artifact, context, params, args.size)
                    notes["cuda"]["sass"] = run(["cuobjdump", "-sass", artifact.path],
                                                out / f"{stem}.cuda.sass")
                    continue
                spirv = Path(artifact.path).read_bytes()
                notes["hlsl"]["timed"] = timed_pass_sets(hlsl, artifact, context, params,
                                                         args.size)
                run(["spirv-dis", artifact.path], out / f"{stem}.spvasm")
                try:
                    blob = pipeline_cache_data(device, spirv)
                    (out / f"{stem}.vkcache").write_bytes(blob)
                    notes["hlsl"]["pipeline_cache_bytes"] = len(blob)
                    notes["hlsl"]["pipeline_cache_elf"] = disassemble(blob, f"{stem}.vkcache",
                                                                      out)
                except Exception as exc:  # a diagnosis: its failure is a note
                    notes["hlsl"]["pipeline_cache_error"] = f"{type(exc).__name__}: {exc}"
            report["variants"][label] = notes
            print(label, json.dumps(notes)[:600], flush=True)
        disk = os.environ.get("__GL_SHADER_DISK_CACHE_PATH")
        if disk:
            time.sleep(1)  # the driver writes its disk cache behind the calls
            for n, path in enumerate(sorted(p for p in Path(disk).rglob("*") if p.is_file())):
                blob = path.read_bytes()
                report.setdefault("disk_cache", {})[str(path)] = {
                    "bytes": len(blob), "elf": disassemble(blob, f"disk{n}", out)}
        try:
            report["fma_probe"] = fma_probe(device, out)
        except Exception as exc:
            report["fma_probe"] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
        print("fma", json.dumps(report["fma_probe"])[:400], flush=True)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
