"""A Ray cluster's devices shared among a batch's studies that run at once.

One study on Ray spreads over every device of its kind, but its driver (the sampler, the
builds it asks for) keeps only so many busy: on two H200s one fp32 4096 study was the
limit at the default repeats (issue 21). A batch run with `--parallel N` therefore gives
each Ray study a share of its kind's devices, `ray_workers` of them (the file's, else
the kind's devices over the studies of that kind that can run at once), and starts a
study only where its share is free: each device times one study's kernels at a time,
never two. Ray reserves a GPU per device worker, so studies that fit side by side get
different GPUs.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping

from peak_tune.batch.files import BatchPlan, BatchStudy
from peak_tune.errors import UserError
from peak_tune.executors import choose_executor

__all__ = ["DeviceCounts", "claim", "kind_of", "on_ray", "share_devices", "stop_shared_ray"]

DeviceCounts = Mapping[str, int]  # device profile name -> devices of that kind to share
DeviceCounter = Callable[[BatchStudy], int]  # the devices of a study's kind


def kind_of(study: BatchStudy) -> str:
    """The device profile a study runs on (its batch entry always names one)."""
    return study.config.target.device or ""


def on_ray(study: BatchStudy) -> bool:
    run = study.config.run
    return choose_executor(run.executor, run.ray_address, study.backend) == "ray"


def claim(study: BatchStudy, devices: DeviceCounts) -> int:
    """How many devices of its kind `study` holds while it runs: its share where the
    batch shares that kind, else all of them (one device: one study at a time)."""
    total = devices.get(kind_of(study), 1)
    workers = study.config.run.ray_workers
    return min(workers, total) if workers > 0 and kind_of(study) in devices else total


def share_devices(plan: BatchPlan, parallel: int,
                  count_devices: DeviceCounter | None = None) -> tuple[BatchPlan, dict[str, int]]:
    """The plan with each Ray study's `ray_workers` set to its share, and the devices of
    each shared kind. `count_devices(study) -> int` counts the devices of a study's kind
    (default: the Ray cluster's, Ray started or joined here). Nothing changes where
    studies run one at a time or none is on Ray."""
    shared = [s for s in plan.studies if on_ray(s) and not s.exclusive]
    if parallel <= 1 or not shared:
        return plan, {}
    count = count_devices or _ray_device_count()
    devices: dict[str, int] = {}
    unresolved: set[str] = set()
    for study in shared:
        kind = kind_of(study)
        if kind not in devices:
            try:
                devices[kind] = max(1, int(count(study)))
            except UserError:
                # its target cannot be resolved (e.g. too large for this host's memory):
                # the study claims one device and fails alone, with that line as its reason
                unresolved.add(study.name)
    shared = [s for s in shared if s.name not in unresolved and kind_of(s) in devices]
    studies_of = Counter(kind_of(s) for s in shared)
    names = {s.name for s in shared}
    shares = {kind: max(1, devices[kind] // min(parallel, studies_of[kind]))
              for kind in studies_of}

    def with_share(study: BatchStudy) -> BatchStudy:
        if study.name not in names | unresolved or study.config.run.ray_workers > 0:
            return study
        share = 1 if study.name in unresolved else shares[kind_of(study)]
        config = study.config.with_options(ray_workers=share)
        return dataclasses.replace(study, config=config)

    return dataclasses.replace(plan, studies=tuple(map(with_share, plan.studies))), devices


def _ray_device_count() -> DeviceCounter:
    """Counts devices on the Ray cluster the plan's studies name (a local Ray if none);
    Ray stays up for the studies, which join it rather than start their own."""
    from peak_tune.executors.ray import RaySettings, devices_of_kind, import_ray, init_ray
    from peak_tune.session.target import resolve_target

    ray = import_ray()

    def count(study: BatchStudy) -> int:
        if not ray.is_initialized():
            init_ray(ray, RaySettings(address=study.config.run.ray_address))
        device = resolve_target(study.config).device
        return int(devices_of_kind(ray, study.backend, device))

    return count


def stop_shared_ray(devices: DeviceCounts) -> None:
    """Leave (or stop, if started here) the Ray that share_devices joined."""
    if devices:
        from peak_tune.executors.ray import import_ray

        ray = import_ray()
        if ray.is_initialized():
            ray.shutdown()
