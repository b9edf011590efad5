"""How many waves per SIMD an AMD kernel's resources allow (VGPRs, SGPRs, LDS), as LLVM
computes it: the HIP backend prunes points that cannot run and reports the occupancy of
those that can (peak_tune.backends._hip_amd reads the resources from the code object).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from peak_tune.backends._hip_amd import target_id
from peak_tune.errors import UserError

__all__ = ["occupancy"]

@dataclass(frozen=True)
class SimdLimits:
    """One architecture's occupancy limits, per SIMD unless named per CU."""

    vgprs: int  # VGPRs per lane, arch VGPRs and AGPRs from one file
    vgpr_granule: int  # a wave's VGPRs are allocated in blocks of this many
    max_waves: int
    simds_per_cu: int
    lds_bytes_per_cu: int
    lds_granule_bytes: int
    max_workgroups_per_cu: int  # barriers: a workgroup of one wave needs none


# gfx90a (CDNA2) and gfx940-gfx942 (CDNA3) as LLVM 19 models them in AMDGPUBaseInfo.cpp
# (getTotalNumVGPRs 512 and getVGPRAllocGranule 8 for targets with GFX90A instructions,
# after the CDNA2 ISA's section 3.6.4; getMaxWavesPerEU 8; getEUsPerCU 4;
# getMaxWorkGroupsPerCU: 16 barriers) and as AMDGPUUsage documents them (64 KiB of LDS,
# granted in blocks of 128 dwords: GRANULATED_LDS_SIZE). The tests check occupancy()
# against the figure LLVM prints for real kernels.
_CDNA = SimdLimits(vgprs=512, vgpr_granule=8, max_waves=8, simds_per_cu=4,
                    lds_bytes_per_cu=65536, lds_granule_bytes=512, max_workgroups_per_cu=16)
_LIMITS = {"gfx90a": _CDNA, "gfx940": _CDNA, "gfx941": _CDNA, "gfx942": _CDNA}


def occupancy(resources: Mapping[str, int], arch: str, threads_per_block: int | None = None
              ) -> int:
    """Waves per SIMD that `resources` (kernel_resources) allow on `arch`: the least of
      VGPRs: vgprs / roundup(vgprs, 8), on 512 (8 when vgprs < 8),
      SGPRs: 10, 9, 8 or 7 for up to 80, 88, 100 or more (LLVM's table for GFX8-GFX9),
      LDS:   ceil(workgroups per CU * waves per workgroup / 4 SIMDs), where workgroups per
             CU = min(64 KiB / roundup(lds_bytes, 512), 32 waves / waves per workgroup,
             16 barriers (not for one-wave workgroups)),
    each capped at 8 waves. Workgroups of `threads_per_block` threads, default the
    kernel's bound (max_threads_per_block: 1024 without __launch_bounds__), as LLVM
    assumes. Scratch does not limit it here (LLVM does not count it either)."""
    limits = _LIMITS.get(target_id(arch).group(1))
    if limits is None:
        raise UserError(f"occupancy limits are known for {', '.join(_LIMITS)}, not {arch}")
    by_vgprs = _waves_by_vgprs(resources["vgprs"], limits)
    by_sgprs = _waves_by_sgprs(resources["sgprs"])
    threads = threads_per_block or resources["max_threads_per_block"]
    by_lds = _waves_by_lds(resources["lds_bytes"], threads, resources["wavefront_size"],
                           limits)
    return min(by_vgprs, by_sgprs, by_lds, limits.max_waves)


def _waves_by_vgprs(vgprs: int, limits: SimdLimits) -> int:
    if vgprs < limits.vgpr_granule:
        return limits.max_waves
    allocated = -(-vgprs // limits.vgpr_granule) * limits.vgpr_granule
    return max(limits.vgprs // allocated, 1)


def _waves_by_sgprs(sgprs: int) -> int:
    """LLVM's getOccupancyWithNumSGPRs for GFX8-GFX9 (800 SGPRs per SIMD)."""
    for most, waves in ((80, 10), (88, 9), (100, 8)):
        if sgprs <= most:
            return waves
    return 7


def _waves_by_lds(lds_bytes: int, threads: int, wavefront_size: int, limits: SimdLimits
                  ) -> int:
    waves_per_group = -(-threads // wavefront_size)
    wave_slots = limits.max_waves * limits.simds_per_cu
    groups = wave_slots if waves_per_group == 1 else min(wave_slots // waves_per_group,
                                                         limits.max_workgroups_per_cu)
    if lds_bytes:
        granted = -(-lds_bytes // limits.lds_granule_bytes) * limits.lds_granule_bytes
        groups = min(groups, limits.lds_bytes_per_cu // granted)
    return -(-groups * waves_per_group // limits.simds_per_cu)
