"""What a Vulkan device offers compute shaders: its subgroups, 16-bit arithmetic, and the
cooperative-matrix shapes its driver exposes (VK_KHR_cooperative_matrix), as JSON.

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

from peak_tune.backends._vulkan import _instance, _text, _vk  # noqa: E402

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
