"""How many thread-block clusters of the cluster-multicast kernels a Hopper GPU holds at
once (cuOccupancyMaxActiveClusters), beside the blocks per SM of the same kernels without
clusters: a persistent cluster kernel launches SMS // CLUSTER_M clusters, and those that
do not fit wait for the others to finish. Builds the reference applier's kernels with the
CUDA backend (NVRTC), loads them with CuPy and asks the driver; prints a table and writes
JSON to $OUT (or ./results).

    python3 benchmarks/cluster_occupancy.py
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile
from typing import Any

from cuda_reference_check import build, output_folder, this_gpu_profile, values
from provenance import provenance  # benchmarks/ is the script's folder
from wgmma_check import BASE, KERNELS

from peak_tune.backends._cuda_launch import evaluate_launch
from peak_tune.backends.cuda import CudaBackend

ROWS = (("budget tma persistent ", {}), ("cluster tma ", {}),
        ("budget cluster tma persistent ", {}), ("budget cluster4 tma persistent ", {}),
        ("budget cluster tma persistent ", {"BLOCK_M": 256, "BLOCK_N": 128, "WGMMA_N": 128}),
        ("budget cluster tma persistent ", {"NUM_STAGES": 3}),
        ("budget cluster tma persistent ", {"BLOCK_N": 128, "WGMMA_N": 128, "NUM_STAGES": 3}))


class LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint)]


def main() -> int:
    import cupy as cp

    driver = ctypes.CDLL("libcuda.so.1")
    device = this_gpu_profile()
    backend = CudaBackend(device)
    folder = tempfile.mkdtemp(prefix="peak-tune-clusters-")
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    rows: list[dict[str, Any]] = []
    for prefix, override in ROWS:
        context = build(KERNELS[prefix], device)
        params = values(context, {**BASE, **override})
        if "cluster4" in prefix:
            params["CLUSTER_M"] = 4
        artifact = backend.compile(context, params, "float16", folder)
        geometry = evaluate_launch(context.launch, {**params, "M": 4096, "N": 4096,
                                                    "K": 4096, "SMS": sms})
        function = cp.RawModule(path=artifact.path).get_function("matmul")
        function.max_dynamic_shared_size_bytes = geometry.shared_bytes
        config = LaunchConfig(*geometry.grid, *geometry.block, geometry.shared_bytes,
                              None, None, 0)
        clusters = ctypes.c_int(-1)
        status = driver.cuOccupancyMaxActiveClusters(ctypes.byref(clusters),
                                                     ctypes.c_void_p(function.kernel.ptr),
                                                     ctypes.byref(config))
        blocks = ctypes.c_int(-1)
        driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(blocks), ctypes.c_void_p(function.kernel.ptr),
            ctypes.c_int(geometry.threads), ctypes.c_size_t(geometry.shared_bytes))
        cluster = params.get("CLUSTER_M", 1)
        row = {"kernel": prefix.strip(), "params": params, "grid": geometry.grid,
               "shared_bytes": geometry.shared_bytes, "cluster": cluster,
               "clusters_launched": geometry.grid[0] * geometry.grid[1] // cluster,
               "max_active_clusters": clusters.value if status == 0 else None,
               "status": status, "blocks_per_sm": blocks.value}
        rows.append(row)
        print(f"{prefix:34} {params['BLOCK_M']}x{params['BLOCK_N']}x{params['NUM_STAGES']} "
              f"cluster {cluster}: {row['clusters_launched']} launched, "
              f"{row['max_active_clusters']} at once (status {status}), "
              f"{blocks.value} block(s) per SM", flush=True)
    out = {**provenance(), "sms": sms, "rows": rows}
    (output_folder() / "cluster_occupancy.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
