"""Vulkan compute from Python (the `vulkan` package's cffi bindings), for the HLSL backend.

One `VulkanDevice` is one physical device and a logical device with one compute queue:
storage buffers in device-local memory (mapped directly where that memory is also host
visible, as on lavapipe and on integrated GPUs; written and read through a staging buffer
otherwise), compute pipelines from SPIR-V with their buffers bound at set 0, bindings
0..n-1, and the sizes as push constants, and dispatches timed by timestamp queries
around them on the GPU's own clock.

The bindings keep pointers into Python objects handed to them: every create-info and
the strings in it are kept referenced until the call returns (the entry point's name
for as long as the pipeline lives), or creation fails at random with VkErrorUnknown.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Buffer", "ComputePipeline", "VulkanDevice", "VulkanUnavailable", "devices"]

_API_VERSION = (1, 2, 0)  # SPIR-V 1.5 (Slang's modules), the Vulkan memory model
_COOPERATIVE_MATRIX = "VK_KHR_cooperative_matrix"
_EXECUTABLE_PROPERTIES = "VK_KHR_pipeline_executable_properties"  # the compiler's statistics
_ENTRY = "main"
# Cooperative matrices of a whole thread group (larger shapes, the driver stages the
# tiles), NVIDIA's since 2024: newer than the `vulkan` bindings' headers, so its feature
# struct is laid out here (RawStruct)
_COOPERATIVE_MATRIX_2 = "VK_NV_cooperative_matrix2"
COOPERATIVE_MATRIX_2_FEATURES = (
    1000593000,  # VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_FEATURES_NV
    ("cooperativeMatrixWorkgroupScope", "cooperativeMatrixFlexibleDimensions",
     "cooperativeMatrixReductions", "cooperativeMatrixConversions",
     "cooperativeMatrixPerElementOperations", "cooperativeMatrixTensorAddressing",
     "cooperativeMatrixBlockLoads"))
COOPERATIVE_MATRIX_2_USED = ("cooperativeMatrixWorkgroupScope",
                             "cooperativeMatrixFlexibleDimensions",
                             "cooperativeMatrixTensorAddressing")


class VulkanUnavailable(RuntimeError):
    """No Vulkan loader, no driver, or no device with a compute queue."""


def _vk() -> Any:
    try:
        import vulkan
    except (ImportError, OSError) as exc:  # OSError: the package without libvulkan.so.1
        raise VulkanUnavailable(f"the vulkan package cannot be loaded: {exc}") from exc
    return vulkan


class RawStruct:
    """A Vulkan struct that the bindings do not declare: sType, pNext, then 32-bit fields
    (VkBool32, uint32_t, enums), read and written by name."""

    def __init__(self, stype: int, fields: tuple[str, ...], after: Any = None,
                 **values: int) -> None:
        ffi = _vk().ffi
        self._fields = fields
        self.memory = ffi.new("uint32_t[]", 4 + len(fields))  # sType, padding, pNext
        self.memory[0] = stype
        self._after = after  # kept alive while this struct points at it
        self.pointer: Any = ffi.cast("void *", self.memory)
        ffi.cast("void **", self.memory + 2)[0] = (
            ffi.NULL if after is None else after.pointer if isinstance(after, RawStruct)
            else ffi.cast("void *", ffi.addressof(after)))
        for name, value in values.items():
            self.memory[4 + fields.index(name)] = value

    def __getattr__(self, name: str) -> int:
        fields = self.__dict__.get("_fields", ())
        if name not in fields:
            raise AttributeError(name)
        return int(self.memory[4 + fields.index(name)])


def pointer(struct: Any) -> Any:
    """What a bindings' pNext takes: a RawStruct's memory, or the struct itself (None)."""
    return struct.pointer if isinstance(struct, RawStruct) else struct


def _text(value: Any) -> str:
    """A name the bindings give as str, bytes or a char array."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(_vk().ffi.string(value).decode(errors="replace"))


def _instance() -> Any:
    vk = _vk()
    app = vk.VkApplicationInfo(sType=vk.VK_STRUCTURE_TYPE_APPLICATION_INFO,
                               pApplicationName="peak-tune", applicationVersion=1,
                               pEngineName="peak-tune", engineVersion=1,
                               apiVersion=vk.VK_MAKE_VERSION(*_API_VERSION))
    info = vk.VkInstanceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                                   pApplicationInfo=app)
    try:
        return vk.vkCreateInstance(info, None)
    except Exception as exc:  # VkErrorIncompatibleDriver: no driver at all
        raise VulkanUnavailable(f"no Vulkan driver: {type(exc).__name__}") from exc


def devices() -> list[str]:
    """The names of the Vulkan devices this machine shows, in the loader's order."""
    vk = _vk()
    instance = _instance()
    try:
        return [_text(vk.vkGetPhysicalDeviceProperties(p).deviceName)
                for p in vk.vkEnumeratePhysicalDevices(instance)]
    finally:
        vk.vkDestroyInstance(instance, None)


@dataclass
class Buffer:
    """A storage buffer of `nbytes` in device-local memory."""

    handle: Any
    memory: Any
    nbytes: int
    mapped: Any = None  # the memory, mapped, where it is host visible


@dataclass
class ComputePipeline:
    handle: Any
    layout: Any
    set_layout: Any
    descriptor_pool: Any
    descriptor_set: Any
    module: Any
    push_bytes: int
    keep: list[Any] = field(default_factory=list)  # what the driver may still point into


class VulkanDevice:
    """Device `index` of the loader's list, with one compute queue (see the module)."""

    def __init__(self, index: int = 0, statistics: bool = False) -> None:
        """`statistics`: pipelines keep the driver compiler's statistics (registers, local
        memory, ...) where the device offers VK_KHR_pipeline_executable_properties; see
        `statistics()`."""
        vk = self._vk = _vk()
        self._want_statistics = statistics
        self.instance = _instance()
        physicals = vk.vkEnumeratePhysicalDevices(self.instance)
        if index >= len(physicals):
            vk.vkDestroyInstance(self.instance, None)
            raise VulkanUnavailable(f"no Vulkan device {index} (this machine shows "
                                    f"{len(physicals)})")
        self.physical = physicals[index]
        properties = vk.vkGetPhysicalDeviceProperties(self.physical)
        limits = properties.limits
        self.name = _text(properties.deviceName)
        self.driver_version = int(properties.driverVersion)
        self.timestamp_period_ns = float(limits.timestampPeriod)
        self.max_invocations = int(limits.maxComputeWorkGroupInvocations)
        self.max_group_size = tuple(int(limits.maxComputeWorkGroupSize[i]) for i in range(3))
        self.max_shared_bytes = int(limits.maxComputeSharedMemorySize)
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
        found = [i for i, f in enumerate(families)
                 if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT and f.timestampValidBits]
        if not found:
            vk.vkDestroyInstance(self.instance, None)
            raise VulkanUnavailable(f"{self.name} has no compute queue with timestamps")
        self.family = found[0]
        priorities = [1.0]
        queue = vk.VkDeviceQueueCreateInfo(sType=vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                           queueFamilyIndex=self.family, queueCount=1,
                                           pQueuePriorities=priorities)
        # robust buffer access: a shader's reads and writes past its buffers stay inside
        # them (on lavapipe the shader runs in this process: it must not reach the rest);
        # 16-bit storage: fp16 buffers (half in HLSL), where the device has it; fp16
        # arithmetic, the Vulkan memory model and cooperative matrices (tensor cores) for
        # the shaders Slang builds, where the device has them
        extensions = {_text(e.extensionName) for e in
                      vk.vkEnumerateDeviceExtensionProperties(self.physical, None)}
        chain = self._optional_features(extensions)
        supported = vk.VkPhysicalDeviceFeatures2(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, pNext=pointer(chain[0][1]))
        vk.vkGetPhysicalDeviceFeatures2(self.physical, supported)
        self.robust = bool(supported.features.robustBufferAccess)
        # PEAK_TUNE_VULKAN_UNBOUNDED=1 (benchmarks/hlsl_variants.py) measures what robust
        # access costs: the device is made without it, and stray writes are not contained
        robust_on = self.robust and os.environ.get("PEAK_TUNE_VULKAN_UNBOUNDED") != "1"
        on = {(kind, name): bool(getattr(values, name))
              for kind, values, fields in chain for name in fields}
        self.storage16 = on[("storage16", "storageBuffer16BitAccess")]
        self.cooperative_matrix = on.get(("cooperative", "cooperativeMatrix"), False)
        # a thread group's matrices: workgroup scope, at the flexible shapes it needs
        self.workgroup_matrix = self.cooperative_matrix and all(
            on.get(("cooperative2", name), False) for name in
            ("cooperativeMatrixWorkgroupScope", "cooperativeMatrixFlexibleDimensions"))
        # cooperative matrices loaded and stored through tensor layouts (SPV_NV_tensor_addressing)
        self.tensor_addressing = self.cooperative_matrix and on.get(
            ("cooperative2", "cooperativeMatrixTensorAddressing"), False)
        self.statistics_on = on.get(("executable", "pipelineExecutableInfo"), False)
        wanted = self._optional_features(extensions, on)
        features = vk.VkPhysicalDeviceFeatures2(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, pNext=pointer(wanted[0][1]),
            features=vk.VkPhysicalDeviceFeatures(
                robustBufferAccess=vk.VK_TRUE if robust_on else vk.VK_FALSE))
        enabled = [name for name, used in ((_COOPERATIVE_MATRIX, self.cooperative_matrix),
                                           (_COOPERATIVE_MATRIX_2, self.workgroup_matrix
                                            or self.tensor_addressing),
                                           (_EXECUTABLE_PROPERTIES, self.statistics_on))
                   if used]
        info = vk.VkDeviceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                                     pNext=features, queueCreateInfoCount=1,
                                     pQueueCreateInfos=[queue],
                                     enabledExtensionCount=len(enabled),
                                     ppEnabledExtensionNames=enabled)
        self.device = vk.vkCreateDevice(self.physical, info, None)
        self.queue = vk.vkGetDeviceQueue(self.device, self.family, 0)
        self._memory = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        pool = vk.VkCommandPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, queueFamilyIndex=self.family,
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT)
        self.command_pool = vk.vkCreateCommandPool(self.device, pool, None)
        allocate = vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
            commandPool=self.command_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
            commandBufferCount=1)
        self.commands = vk.vkAllocateCommandBuffers(self.device, allocate)[0]
        self.fence = vk.vkCreateFence(
            self.device, vk.VkFenceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO),
            None)
        self.queries = vk.vkCreateQueryPool(self.device, vk.VkQueryPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
            queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=2), None)
        self._buffers: list[Buffer] = []
        self._stage: Buffer | None = None  # see _staging
        self._pipelines: list[ComputePipeline] = []

    def _optional_features(self, extensions: set[str],
                           on: dict[tuple[str, str], bool] | None = None
                           ) -> list[tuple[str, Any, tuple[str, ...]]]:
        """The feature structs chained after VkPhysicalDeviceFeatures2, first first:
        (kind, struct, its fields); all off to query them, else `on`'s values."""
        vk = self._vk
        # (kind, the bindings' struct or a RawStruct's (sType, fields), its sType, fields)
        kinds: list[tuple[str, Any, str, tuple[str, ...]]] = [
            ("storage16", "VkPhysicalDevice16BitStorageFeatures",
             "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES",
             ("storageBuffer16BitAccess", "uniformAndStorageBuffer16BitAccess")),
            ("float16", "VkPhysicalDeviceShaderFloat16Int8Features",
             "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES",
             ("shaderFloat16",)),
            ("memory_model", "VkPhysicalDeviceVulkanMemoryModelFeatures",
             "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES",
             ("vulkanMemoryModel", "vulkanMemoryModelDeviceScope"))]
        if _COOPERATIVE_MATRIX in extensions:
            kinds.append(("cooperative", "VkPhysicalDeviceCooperativeMatrixFeaturesKHR",
                          "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR",
                          ("cooperativeMatrix",)))
        if _COOPERATIVE_MATRIX in extensions and _COOPERATIVE_MATRIX_2 in extensions:
            # the thread group's matrices and their loads through tensor layouts: only the
            # features their shaders use are enabled (the others, asked for, stay off)
            kinds.append(("cooperative2", COOPERATIVE_MATRIX_2_FEATURES, "",
                          COOPERATIVE_MATRIX_2_USED))
        if self._want_statistics and _EXECUTABLE_PROPERTIES in extensions:
            kinds.append(("executable",
                          "VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR",
                          "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_"
                          "FEATURES_KHR", ("pipelineExecutableInfo",)))
        chain: list[tuple[str, Any, tuple[str, ...]]] = []
        after: Any = None
        for kind, struct, stype, names in reversed(kinds):  # built from the tail
            values = {n: vk.VK_TRUE if on and on.get((kind, n)) else vk.VK_FALSE
                      for n in names}
            if isinstance(struct, tuple):  # (sType, fields): one the bindings lack
                stype_value, fields = struct
                after = RawStruct(stype_value, fields, after, **values)
            else:
                after = getattr(vk, struct)(sType=getattr(vk, stype), pNext=pointer(after),
                                            **values)
            chain.insert(0, (kind, after, names))
        return chain

    # ------------------------------------------------------------ memory

    def _memory_type(self, bits: int, wanted: int) -> int:
        for i in range(self._memory.memoryTypeCount):
            flags = self._memory.memoryTypes[i].propertyFlags
            if bits & (1 << i) and flags & wanted == wanted:
                return i
        return -1

    def _allocate(self, nbytes: int, usage: int, prefer: list[int]) -> tuple[Any, Any, int]:
        vk = self._vk
        handle = vk.vkCreateBuffer(self.device, vk.VkBufferCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, size=nbytes, usage=usage,
            sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        needs = vk.vkGetBufferMemoryRequirements(self.device, handle)
        for flags in prefer:
            kind = self._memory_type(needs.memoryTypeBits, flags)
            if kind >= 0:
                break
        else:
            vk.vkDestroyBuffer(self.device, handle, None)
            raise VulkanUnavailable(f"{self.name} has no memory type for a storage buffer")
        memory = vk.vkAllocateMemory(self.device, vk.VkMemoryAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, allocationSize=needs.size,
            memoryTypeIndex=kind), None)
        vk.vkBindBufferMemory(self.device, handle, memory, 0)
        return handle, memory, int(self._memory.memoryTypes[kind].propertyFlags)

    def buffer(self, nbytes: int) -> Buffer:
        """A storage buffer in device-local memory (host visible too where there is)."""
        vk = self._vk
        usage = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
                 | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
        visible = (vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
                   | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)
        local = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
        # the first device-local type: a discrete GPU's VRAM (not mapped: staged), or on
        # lavapipe and integrated GPUs memory the host sees too (mapped directly); never
        # a GPU's small host-visible BAR window before its VRAM
        handle, memory, flags = self._allocate(nbytes, usage, [local])
        buffer = Buffer(handle, memory, nbytes)
        if flags & visible == visible:
            buffer.mapped = vk.vkMapMemory(self.device, memory, 0, nbytes, 0)
        self._buffers.append(buffer)
        return buffer

    def write(self, buffer: Buffer, data: np.ndarray) -> None:
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if buffer.mapped is not None:
            np.frombuffer(buffer.mapped, np.uint8, raw.size)[:] = raw
            return
        staging = self._staging(raw.size)
        np.frombuffer(staging.mapped, np.uint8, raw.size)[:] = raw
        self._copy(staging, buffer, raw.size)

    def read(self, buffer: Buffer, dtype: Any, count: int) -> np.ndarray:
        nbytes = np.dtype(dtype).itemsize * count
        if buffer.mapped is not None:
            return np.frombuffer(buffer.mapped, np.uint8, nbytes).copy().view(dtype)
        staging = self._staging(nbytes)
        self._copy(buffer, staging, nbytes)
        return np.frombuffer(staging.mapped, np.uint8, nbytes).copy().view(dtype)

    def _staging(self, nbytes: int) -> Buffer:
        """The host-visible buffer that copies go through, kept between them (allocating
        and mapping 64 MiB took longer than copying it) and grown when too small."""
        if self._stage is not None and self._stage.nbytes >= nbytes:
            return self._stage
        if self._stage is not None:
            self.free(self._stage)
        vk = self._vk
        usage = vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
        visible = (vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
                   | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)
        handle, memory, _ = self._allocate(nbytes, usage, [visible])
        self._stage = Buffer(handle, memory, nbytes, vk.vkMapMemory(self.device, memory, 0,
                                                                     nbytes, 0))
        self._buffers.append(self._stage)
        return self._stage

    def _copy(self, source: Buffer, target: Buffer, nbytes: int) -> None:
        vk = self._vk
        self._begin()
        vk.vkCmdCopyBuffer(self.commands, source.handle, target.handle, 1,
                           [vk.VkBufferCopy(srcOffset=0, dstOffset=0, size=nbytes)])
        self._submit_and_wait()

    def free(self, buffer: Buffer) -> None:
        vk = self._vk
        if buffer.mapped is not None:
            vk.vkUnmapMemory(self.device, buffer.memory)
        vk.vkDestroyBuffer(self.device, buffer.handle, None)
        vk.vkFreeMemory(self.device, buffer.memory, None)
        if buffer in self._buffers:
            self._buffers.remove(buffer)
        if buffer is self._stage:
            self._stage = None

    # ------------------------------------------------------------ pipelines

    def pipeline(self, spirv: bytes, buffers: list[Buffer], push_bytes: int) -> ComputePipeline:
        """A compute pipeline for `spirv` (entry "main"), `buffers` bound at set 0,
        bindings 0..n-1, and `push_bytes` of push constants."""
        vk = self._vk
        code = bytes(spirv)  # the bindings point into it: kept with the pipeline
        module = vk.vkCreateShaderModule(self.device, vk.VkShaderModuleCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, codeSize=len(code),
            pCode=code), None)
        bindings = [vk.VkDescriptorSetLayoutBinding(
            binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=1,
            stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT) for i in range(len(buffers))]
        set_layout = vk.vkCreateDescriptorSetLayout(self.device, vk.VkDescriptorSetLayoutCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
            bindingCount=len(bindings), pBindings=bindings), None)
        ranges = [vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0,
                                         size=push_bytes)] if push_bytes else []
        layout = vk.vkCreatePipelineLayout(self.device, vk.VkPipelineLayoutCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, setLayoutCount=1,
            pSetLayouts=[set_layout], pushConstantRangeCount=len(ranges),
            pPushConstantRanges=ranges or None), None)
        entry = _ENTRY
        stage = vk.VkPipelineShaderStageCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
            stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module, pName=entry)
        flags = vk.VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR if self.statistics_on else 0
        info = vk.VkComputePipelineCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, stage=stage, layout=layout,
            flags=flags)
        handle = vk.vkCreateComputePipelines(self.device, None, 1, [info], None)[0]
        sizes = [vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                         descriptorCount=len(buffers))]
        pool = vk.vkCreateDescriptorPool(self.device, vk.VkDescriptorPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, maxSets=1,
            poolSizeCount=1, pPoolSizes=sizes), None)
        descriptor_set = vk.vkAllocateDescriptorSets(self.device, vk.VkDescriptorSetAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, descriptorPool=pool,
            descriptorSetCount=1, pSetLayouts=[set_layout]))[0]
        writes = [vk.VkWriteDescriptorSet(
            sType=vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, dstSet=descriptor_set,
            dstBinding=i, dstArrayElement=0, descriptorCount=1,
            descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=b.handle, offset=0, range=b.nbytes)])
            for i, b in enumerate(buffers)]
        vk.vkUpdateDescriptorSets(self.device, len(writes), writes, 0, None)
        found = ComputePipeline(handle, layout, set_layout, pool, descriptor_set, module,
                                push_bytes, [code, entry, stage, info])
        self._pipelines.append(found)
        return found

    def statistics(self, pipeline: ComputePipeline) -> dict[str, float]:
        """The driver compiler's statistics of the pipeline's compute shader by name (on
        NVIDIA e.g. its register count and local memory size); {} where the device was not
        made with `statistics` or does not offer them."""
        if not self.statistics_on:
            return {}
        vk = self._vk
        read = vk.vkGetDeviceProcAddr(self.device, "vkGetPipelineExecutableStatisticsKHR")
        found = read(self.device, vk.VkPipelineExecutableInfoKHR(
            sType=vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR, pipeline=pipeline.handle,
            executableIndex=0))
        formats = {vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: "b32",
                   vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: "i64",
                   vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: "u64",
                   vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: "f64"}
        return {_text(stat.name): float(getattr(stat.value, formats[stat.format]))
                for stat in found if stat.format in formats}

    def destroy(self, pipeline: ComputePipeline) -> None:
        vk = self._vk
        vk.vkDestroyPipeline(self.device, pipeline.handle, None)
        vk.vkDestroyDescriptorPool(self.device, pipeline.descriptor_pool, None)
        vk.vkDestroyPipelineLayout(self.device, pipeline.layout, None)
        vk.vkDestroyDescriptorSetLayout(self.device, pipeline.set_layout, None)
        vk.vkDestroyShaderModule(self.device, pipeline.module, None)
        if pipeline in self._pipelines:
            self._pipelines.remove(pipeline)

    # ------------------------------------------------------------ running

    def dispatch(self, pipeline: ComputePipeline, groups: tuple[int, int, int],
                 push: bytes = b"", flush: Buffer | None = None, flush_value: int = 0) -> float:
        """One dispatch of `groups` thread groups, waited for; its duration in ms by the
        device's timestamps. `flush`: a buffer larger than the device's caches, filled
        before the dispatch (after a barrier) so that no input is left in them."""
        vk = self._vk
        self._begin()
        if flush is not None:
            vk.vkCmdFillBuffer(self.commands, flush.handle, 0, flush.nbytes, flush_value)
            self._barrier(vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                          vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk.VK_ACCESS_SHADER_READ_BIT)
        vk.vkCmdResetQueryPool(self.commands, self.queries, 0, 2)
        vk.vkCmdBindPipeline(self.commands, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.handle)
        vk.vkCmdBindDescriptorSets(self.commands, vk.VK_PIPELINE_BIND_POINT_COMPUTE,
                                   pipeline.layout, 0, 1, [pipeline.descriptor_set], 0, None)
        if push:
            values = vk.ffi.new("char[]", push)
            vk.vkCmdPushConstants(self.commands, pipeline.layout,
                                  vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(push), values)
        # the first stamp once every earlier command has completed (BOTTOM_OF_PIPE): at
        # TOP_OF_PIPE it is taken as soon as the flush has started, and the time the fill
        # still needs (about 20 us for 64 MiB on an H200) would count as the shader's
        vk.vkCmdWriteTimestamp(self.commands, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT,
                               self.queries, 0)
        vk.vkCmdDispatch(self.commands, *groups)
        vk.vkCmdWriteTimestamp(self.commands, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT,
                               self.queries, 1)
        self._submit_and_wait()
        stamps = vk.ffi.new("uint64_t[2]")
        vk.vkGetQueryPoolResults(self.device, self.queries, 0, 2, 16, stamps, 8,
                                 vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
        return (int(stamps[1]) - int(stamps[0])) * self.timestamp_period_ns / 1e6

    def _begin(self) -> None:
        """A command buffer that first sees what the host and earlier submissions wrote
        (submissions in order on one queue are not ordered in memory by themselves)."""
        vk = self._vk
        vk.vkResetCommandBuffer(self.commands, 0)
        vk.vkBeginCommandBuffer(self.commands, vk.VkCommandBufferBeginInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
            flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
        self._barrier(vk.VK_PIPELINE_STAGE_HOST_BIT | vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
                      vk.VK_ACCESS_HOST_WRITE_BIT | vk.VK_ACCESS_MEMORY_WRITE_BIT,
                      vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
                      vk.VK_ACCESS_MEMORY_READ_BIT | vk.VK_ACCESS_MEMORY_WRITE_BIT)

    def _barrier(self, source_stage: int, source_access: int, target_stage: int,
                 target_access: int) -> None:
        vk = self._vk
        barrier = vk.VkMemoryBarrier(sType=vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                     srcAccessMask=source_access, dstAccessMask=target_access)
        vk.vkCmdPipelineBarrier(self.commands, source_stage, target_stage, 0, 1, [barrier],
                                0, None, 0, None)

    def _submit_and_wait(self, timeout_ns: int = 600 * 10**9) -> None:
        """End the command buffer with its writes made visible to the host (a GPU's
        caches written back: mapped memory is read from the device's memory), submit it,
        wait for it."""
        vk = self._vk
        self._barrier(vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, vk.VK_ACCESS_MEMORY_WRITE_BIT,
                      vk.VK_PIPELINE_STAGE_HOST_BIT, vk.VK_ACCESS_HOST_READ_BIT)
        vk.vkEndCommandBuffer(self.commands)
        vk.vkResetFences(self.device, 1, [self.fence])
        vk.vkQueueSubmit(self.queue, 1, [vk.VkSubmitInfo(
            sType=vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, commandBufferCount=1,
            pCommandBuffers=[self.commands])], self.fence)
        vk.vkWaitForFences(self.device, 1, [self.fence], vk.VK_TRUE, timeout_ns)

    def close(self) -> None:
        vk = self._vk
        if self.device is None:
            return
        vk.vkDeviceWaitIdle(self.device)
        for pipeline in list(self._pipelines):
            self.destroy(pipeline)
        for buffer in list(self._buffers):
            self.free(buffer)
        vk.vkDestroyQueryPool(self.device, self.queries, None)
        vk.vkDestroyFence(self.device, self.fence, None)
        vk.vkDestroyCommandPool(self.device, self.command_pool, None)
        vk.vkDestroyDevice(self.device, None)
        vk.vkDestroyInstance(self.instance, None)
        self.device = None

    def __enter__(self) -> VulkanDevice:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


