"""What a Vulkan device offers compute shaders: its subgroups, 16-bit arithmetic, and the
cooperative-matrix shapes its driver exposes (VK_KHR_cooperative_matrix; with NVIDIA's
VK_NV_cooperative_matrix2 the thread group's own matrices: its features, the flexible
shapes' granularities and thread-group sizes), as JSON.

    python benchmarks/vulkan_features.py [--out FILE]

Run where a study would run (lavapipe in CI, NVIDIA's driver on the H200): the HLSL
backend's wave and cooperative-matrix steps are only worth writing for what this lists.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from peak_tune.backends._vulkan import (  # noqa: E402
    COOPERATIVE_MATRIX_2_FEATURES,
    RawStruct,
    _instance,
    _text,
    _vk,
)

WATCHED = ("VK_KHR_cooperative_matrix", "VK_NV_cooperative_matrix",
           "VK_NV_cooperative_matrix2", "VK_EXT_subgroup_size_control",
           "VK_KHR_shader_float16_int8", "VK_KHR_16bit_storage",
           "VK_KHR_vulkan_memory_model", "VK_KHR_shader_subgroup_extended_types")
COMPONENTS = {0: "float16", 1: "float32", 2: "float64", 3: "int8", 4: "int16", 5: "int32",
              6: "int64", 7: "uint8", 8: "uint16", 9: "uint32", 10: "uint64",
              1000141000: "bfloat16"}
SCOPES = {1: "device", 2: "workgroup", 3: "subgroup", 5: "queue_family"}


def cooperative_shapes(vk: Any, instance: Any, physical: Any) -> list[dict[str, Any]]:
    try:
        query = vk.vkGetInstanceProcAddr(instance,
                                         "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR")
    except Exception:  # the loader knows no such function: no extension anywhere
        return []
    shapes = []
    for item in query(physical):
        shapes.append({"M": item.MSize, "N": item.NSize, "K": item.KSize,
                       "A": COMPONENTS.get(item.AType, item.AType),
                       "B": COMPONENTS.get(item.BType, item.BType),
                       "C": COMPONENTS.get(item.CType, item.CType),
                       "result": COMPONENTS.get(item.ResultType, item.ResultType),
                       "saturating": bool(item.saturatingAccumulation),
                       "scope": SCOPES.get(item.scope, item.scope)})
    return shapes


# VK_NV_cooperative_matrix2's property structs (sType, then 32-bit fields), laid out by hand
FLEXIBLE = (1000593001, ("MGranularity", "NGranularity", "KGranularity", "AType", "BType",
                         "CType", "ResultType", "saturatingAccumulation", "scope",
                         "workgroupInvocations"))
LIMITS = (1000593002, ("cooperativeMatrixWorkgroupScopeMaxWorkgroupSize",
                       "cooperativeMatrixFlexibleDimensionsMaxDimension",
                       "cooperativeMatrixWorkgroupScopeReservedSharedMemory"))


def cooperative_matrix_2(vk: Any, instance: Any, physical: Any) -> dict[str, Any]:
    """The thread group's matrices: features, limits, and the flexible shapes."""
    features = RawStruct(*COOPERATIVE_MATRIX_2_FEATURES)
    vk.vkGetPhysicalDeviceFeatures2(physical, vk.VkPhysicalDeviceFeatures2(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, pNext=features.pointer))
    limits = RawStruct(*LIMITS)
    vk.vkGetPhysicalDeviceProperties2(physical, vk.VkPhysicalDeviceProperties2(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, pNext=limits.pointer))
    found: dict[str, Any] = {
        "features": {n: bool(getattr(features, n)) for n in COOPERATIVE_MATRIX_2_FEATURES[1]},
        "limits": {n: getattr(limits, n) for n in LIMITS[1]}, "flexible": []}
    address = vk.lib.vkGetInstanceProcAddr(
        instance, b"vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV")
    if address == vk.ffi.NULL:
        return found
    query = vk.ffi.cast("VkResult (*)(VkPhysicalDevice, uint32_t *, void *)", address)
    count = vk.ffi.new("uint32_t *")
    query(physical, count, vk.ffi.NULL)
    # the driver fills an array of them: one block of 32-bit words, each item's sType set
    words = 4 + len(FLEXIBLE[1])
    block = vk.ffi.new("uint32_t[]", words * count[0])
    for i in range(count[0]):
        block[i * words] = FLEXIBLE[0]
    query(physical, count, block)
    for i in range(count[0]):
        item = dict(zip(FLEXIBLE[1], block[i * words + 4:(i + 1) * words], strict=True))
        found["flexible"].append({
            "M": item["MGranularity"], "N": item["NGranularity"], "K": item["KGranularity"],
            **{name: COMPONENTS.get(item[field], item[field])
               for name, field in (("A", "AType"), ("B", "BType"), ("C", "CType"),
                                   ("result", "ResultType"))},
            "saturating": bool(item["saturatingAccumulation"]),
            "scope": SCOPES.get(item["scope"], item["scope"]),
            "threads": item["workgroupInvocations"]})
    return found


def describe(vk: Any, instance: Any, physical: Any) -> dict[str, Any]:
    properties = vk.vkGetPhysicalDeviceProperties(physical)
    extensions = {_text(e.extensionName)
                  for e in vk.vkEnumerateDeviceExtensionProperties(physical, None)}
    subgroup = vk.VkPhysicalDeviceSubgroupProperties(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES)
    vk.vkGetPhysicalDeviceProperties2(physical, vk.VkPhysicalDeviceProperties2(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, pNext=subgroup))
    float16 = vk.VkPhysicalDeviceShaderFloat16Int8Features(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES)
    vk.vkGetPhysicalDeviceFeatures2(physical, vk.VkPhysicalDeviceFeatures2(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, pNext=float16))
    operations = {name: bool(subgroup.supportedOperations & getattr(vk, flag))
                  for name, flag in (("basic", "VK_SUBGROUP_FEATURE_BASIC_BIT"),
                                     ("arithmetic", "VK_SUBGROUP_FEATURE_ARITHMETIC_BIT"),
                                     ("ballot", "VK_SUBGROUP_FEATURE_BALLOT_BIT"),
                                     ("shuffle", "VK_SUBGROUP_FEATURE_SHUFFLE_BIT"))}
    found = {"device": _text(properties.deviceName),
             "driver_version": int(properties.driverVersion),
             "api_version": "{}.{}.{}".format(*(vk.VK_VERSION_MAJOR(properties.apiVersion),
                                                vk.VK_VERSION_MINOR(properties.apiVersion),
                                                vk.VK_VERSION_PATCH(properties.apiVersion))),
             "subgroup_size": int(subgroup.subgroupSize),
             "subgroup_operations": operations,
             "shader_float16": bool(float16.shaderFloat16),
             "extensions": {name: name in extensions for name in WATCHED},
             "cooperative_matrix": []}
    if "VK_KHR_cooperative_matrix" in extensions:
        found["cooperative_matrix"] = cooperative_shapes(vk, instance, physical)
    if "VK_NV_cooperative_matrix2" in extensions:
        found["cooperative_matrix_2"] = cooperative_matrix_2(vk, instance, physical)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    vk = _vk()
    instance = _instance()
    try:
        found = [describe(vk, instance, p) for p in vk.vkEnumeratePhysicalDevices(instance)]
    finally:
        vk.vkDestroyInstance(instance, None)
    text = json.dumps(found, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
