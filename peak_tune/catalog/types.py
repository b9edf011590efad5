"""Catalog values: natural transformations and device profiles."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from peak_tune.core import ParamDomain, stable_hash

__all__ = ["DTYPES", "TESTED", "DeviceProfile", "Pass", "Transformation"]


# Element types a transformation may name in `dtypes` (what the kernels are written for).
DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True)
class Pass:
    """One pass of a transformation: the English an applier follows for one region.

    region is "device" (kernel code), "launch" (host-side launch / driver code) or
    "macros" (tuning-parameter definitions).
    """

    region: str
    text: str


@dataclass(frozen=True)
class Transformation:
    """A natural transformation (transforms/**/<id>.md).

    `requires`: ids that must have been applied before this one.
    `conflicts`: ids that must not have been applied before this one.
    `params`: tuning parameters it introduces, with their allowed values.
    `constraints`: expressions over parameters (its own and earlier ones) that must hold.
    `defaults`: the value of a parameter when a person applies the transformation by hand
    without giving one (not part of the identity: the tuner never uses it).
    `dtypes`: the element types it applies to (empty: any); a study of another type
    leaves it out of its search space (not part of the identity either).
    `vendors`: the GPU makers whose devices it is for (empty: any), e.g. [amd] for MFMA
    in HIP, which also runs on NVIDIA GPUs; a study of another's device leaves it out.
    """

    id: str
    version: int
    title: str
    kernels: tuple[str, ...]
    backends: tuple[str, ...]
    requires: tuple[str, ...]
    conflicts: tuple[str, ...]
    params: tuple[ParamDomain, ...]
    constraints: tuple[str, ...]
    passes: tuple[Pass, ...]
    summary: str = ""
    path: str = ""
    defaults: Mapping[str, int] = field(default_factory=dict)
    dtypes: tuple[str, ...] = ()
    vendors: tuple[str, ...] = ()

    def default_value(self, name: str) -> tuple[int, bool]:
        """(value, declared): the declared default, else the first allowed value."""
        if name in self.defaults:
            return self.defaults[name], True
        domain = next(p for p in self.params if p.name == name)
        return domain.values[0], False

    def text_hash(self) -> str:
        """Identity of what an applier is asked to do (id, version, every field, the text)."""
        return stable_hash(
            {
                "id": self.id,
                "version": self.version,
                "requires": self.requires,
                "conflicts": self.conflicts,
                "params": [[p.name, list(p.values)] for p in self.params],
                "constraints": self.constraints,
                "passes": [[p.region, p.text] for p in self.passes],
            }
        )

    def applies_to(self, kernel: str, backend: str, dtype: str | None = None,
                   vendor: str | None = None) -> bool:
        """For this kernel and backend, and element type and device maker when given."""
        return (kernel in self.kernels and backend in self.backends
                and (dtype is None or not self.dtypes or dtype in self.dtypes)
                and (vendor is None or not self.vendors or vendor in self.vendors))


# a device profile's `tested`, and what `peak-tune devices` says of it
TESTED = {"hardware": "tuned on the device",
          "compile-only": "built for it, never run on it",
          "none": "profile only, never built or run"}


@dataclass(frozen=True)
class DeviceProfile:
    """Documented facts about a device (backends/devices/<name>.toml)."""

    name: str
    title: str
    backend: str  # the backend this device is driven by: c | cuda | hip | hlsl
    peak_gflops: Mapping[str, float]  # dtype -> documented peak
    memory_bandwidth_gbs: float
    facts: Mapping[str, int | float | str] = field(default_factory=dict)  # for prompts
    tested: str = "none"  # how far peak-tune has gone on this device (TESTED)
    path: str = ""

    @property
    def vendor(self) -> str:
        """The maker: facts.vendor, else from the architecture (sm_: nvidia, gfx: amd),
        else "" (the CPU)."""
        arch = str(self.facts.get("arch", ""))
        inferred = "nvidia" if arch.startswith("sm_") else "amd" if arch.startswith("gfx") else ""
        return str(self.facts.get("vendor", inferred))

    @property
    def wave_size(self) -> int:
        """Lanes that run in lockstep: Vulkan's subgroup size, AMD's wavefront, NVIDIA's
        warp (facts subgroup_size, wave_size or warp_size; 32 where none is given)."""
        for name in ("subgroup_size", "wave_size", "warp_size"):
            value = self.facts.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return 32
