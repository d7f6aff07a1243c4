"""A Vulkan device from a Vulkan Profiles JSON file (schema profiles-0.8): what `vulkaninfo --json`
writes for a local GPU and the format in which the public Vulkan hardware database offers its
device reports. Only the properties ggml-vulkan's memory and placement rules read are taken (see
VulkanDevice); a file that is not such a profile, or lacks one of them, is one line naming it.

    read_profile(path) -> VulkanDevice

The profile's capability blocks are merged in file order: each holds `extensions`, `features` and
`properties`, keyed by the Vulkan structure names (VkPhysicalDeviceProperties, ...Vulkan11Properties,
...Maintenance3Properties, ...). A property may live in a core structure (Vulkan11/12/13) or in its
extension's own one; either is read, as the driver fills both.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any, Optional

from .vulkan import VulkanDevice

MAX_PROFILE_BYTES = 64 * 1024 * 1024       # vulkaninfo writes well under 1 MiB per device


class BadProfile(ValueError):
    """A profile file that cannot describe the device (one line, naming the file and the property)."""


def read_profile(path: str) -> VulkanDevice:
    """The device a profile file describes. A file read before and unchanged since (same size and
    modification time) is not parsed again: the command validates its --device specs before planning
    with them, and fit plans a model many times."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise BadProfile(f"{path}: {e.strerror or e}") from None
    return _read_profile(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_profile(path: str, size: int, mtime_ns: int) -> VulkanDevice:
    """read_profile of the file as it was at (size, mtime_ns); the device is immutable (frozen), so
    callers may share it."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_PROFILE_BYTES + 1)
    except OSError as e:
        raise BadProfile(f"{path}: {e.strerror or e}") from None
    if len(raw) > MAX_PROFILE_BYTES:
        raise BadProfile(f"{path}: more than {MAX_PROFILE_BYTES // 2**20} MiB: not a Vulkan profile")
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadProfile(f"{path}: not valid JSON ({e})") from None
    return device_from_profile(doc, path)


def _capability_blocks(doc: Any, path: str) -> list[dict]:
    caps = doc.get("capabilities") if isinstance(doc, dict) else None
    if not isinstance(caps, dict) or not caps:
        raise BadProfile(f"{path}: no 'capabilities' object: not a Vulkan profile (vulkaninfo --json writes one)")
    blocks = [b for b in caps.values() if isinstance(b, dict)]
    if not blocks:
        raise BadProfile(f"{path}: 'capabilities' holds no capability block")
    return blocks


class _Caps:
    """The merged extensions, features and properties of a profile's capability blocks."""

    def __init__(self, blocks: list[dict], path: str) -> None:
        self.path = path
        self.extensions: set[str] = set()
        self.features: dict[str, dict] = {}
        self.properties: dict[str, dict] = {}
        for b in blocks:
            ext = b.get("extensions", {})
            if isinstance(ext, dict):
                self.extensions |= set(ext)
            for key, into in (("features", self.features), ("properties", self.properties)):
                for name, value in (b.get(key) or {}).items():
                    if isinstance(value, dict):
                        into.setdefault(name, {}).update(value)

    @staticmethod
    def _find(where: dict[str, dict], places: tuple[tuple[str, str], ...]) -> Optional[Any]:
        for struct, field in places:
            if field in where.get(struct, {}):
                return where[struct][field]
        return None

    def prop(self, *places: tuple[str, str], kind: type = int) -> Any:
        """The first of these (structure, field) properties the profile holds."""
        value = self._find(self.properties, places)
        where = ".".join(places[0])
        if value is None:
            raise BadProfile(f"{self.path}: the profile lacks {where}, which ggml-vulkan's rules read")
        if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise BadProfile(f"{self.path}: {where} is {value!r}, not a non-negative integer")
        if kind is list and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise BadProfile(f"{self.path}: {where} is {value!r}, not a list of flag names")
        return value

    def has_prop(self, *places: tuple[str, str]) -> bool:
        return self._find(self.properties, places) is not None

    def feature(self, *places: tuple[str, str]) -> bool:
        value = self._find(self.features, places)
        if value is None:
            raise BadProfile(f"{self.path}: the profile lacks the feature {'.'.join(places[0])}, which ggml-vulkan reads")
        return bool(value)


def _limit(caps: _Caps, field: str) -> int:
    limits = caps.properties.get("VkPhysicalDeviceProperties", {}).get("limits")
    if not isinstance(limits, dict) or field not in limits:
        raise BadProfile(f"{caps.path}: the profile lacks VkPhysicalDeviceProperties.limits.{field}, which "
                         f"ggml-vulkan's rules read")
    value = limits[field]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BadProfile(f"{caps.path}: VkPhysicalDeviceProperties.limits.{field} is {value!r}, not a positive integer")
    return value


V11, V13 = "VkPhysicalDeviceVulkan11Properties", "VkPhysicalDeviceVulkan13Properties"
V12F, V13F = "VkPhysicalDeviceVulkan12Features", "VkPhysicalDeviceVulkan13Features"


def device_from_profile(doc: Any, path: str) -> VulkanDevice:
    """ggml_vk_get_device (ggml-vulkan.cpp:3990-4530) reading the profile instead of the driver."""
    caps = _Caps(_capability_blocks(doc, path), path)
    ext = caps.extensions
    core = caps.properties.get("VkPhysicalDeviceProperties")
    if not isinstance(core, dict) or not isinstance(core.get("deviceType"), str):
        raise BadProfile(f"{path}: the profile lacks VkPhysicalDeviceProperties.deviceType")
    sub = "VkPhysicalDeviceSubgroupProperties"
    subgroup_size = caps.prop((V11, "subgroupSize"), (sub, "subgroupSize"))
    stages = caps.prop((V11, "subgroupSupportedStages"), (sub, "supportedStages"), kind=list)
    ops = caps.prop((V11, "subgroupSupportedOperations"), (sub, "supportedOperations"), kind=list)
    compute = "VK_SHADER_STAGE_COMPUTE_BIT" in stages
    size_control = "VK_EXT_subgroup_size_control" in ext
    sc, sc13, sc_f = "VkPhysicalDeviceSubgroupSizeControlProperties", V13, "VkPhysicalDeviceSubgroupSizeControlFeatures"
    return VulkanDevice(
        name=str(core.get("deviceName", "Vulkan device")),
        vendor_id=caps.prop(("VkPhysicalDeviceProperties", "vendorID")),
        integrated=core["deviceType"] == "VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU",
        min_storage_buffer_offset_alignment=_limit(caps, "minStorageBufferOffsetAlignment"),
        min_memory_map_alignment=_limit(caps, "minMemoryMapAlignment"),
        max_storage_buffer_range=_limit(caps, "maxStorageBufferRange"),
        max_compute_shared_memory_size=_limit(caps, "maxComputeSharedMemorySize"),
        max_compute_work_group_invocations=_limit(caps, "maxComputeWorkGroupInvocations"),
        max_memory_allocation_size=caps.prop(("VkPhysicalDeviceMaintenance3Properties", "maxMemoryAllocationSize"),
                                             (V11, "maxMemoryAllocationSize")),
        max_buffer_size=caps.prop(("VkPhysicalDeviceMaintenance4Properties", "maxBufferSize"), (V13, "maxBufferSize"))
        if "VK_KHR_maintenance4" in ext else None,
        subgroup_size=subgroup_size,
        subgroup_min_size=caps.prop((sc, "minSubgroupSize"), (sc13, "minSubgroupSize")) if size_control
        else subgroup_size,
        subgroup_size_control=size_control and caps.feature((sc_f, "subgroupSizeControl"), (V13F, "subgroupSizeControl"))
        and "VK_SHADER_STAGE_COMPUTE_BIT" in caps.prop((sc, "requiredSubgroupSizeStages"),
                                                       (sc13, "requiredSubgroupSizeStages"), kind=list),
        subgroup_ops=frozenset(op.removeprefix("VK_SUBGROUP_FEATURE_").removesuffix("_BIT") for op in ops)
        if compute else frozenset(),
        compute_full_subgroups=size_control and caps.feature((sc_f, "computeFullSubgroups"),
                                                             (V13F, "computeFullSubgroups")),
        fp16="VK_KHR_16bit_storage" in ext and "VK_KHR_shader_float16_int8" in ext
        and caps.feature((V12F, "shaderFloat16"), ("VkPhysicalDeviceShaderFloat16Int8Features", "shaderFloat16")),
        shader_int64=caps.feature(("VkPhysicalDeviceFeatures", "shaderInt64")),
        buffer_device_address=caps.feature((V12F, "bufferDeviceAddress"),
                                           ("VkPhysicalDeviceBufferDeviceAddressFeatures", "bufferDeviceAddress")),
        vulkan_memory_model=caps.feature((V12F, "vulkanMemoryModel"),
                                         ("VkPhysicalDeviceVulkanMemoryModelFeatures", "vulkanMemoryModel")),
        shader_64bit_indexing="VK_EXT_shader_64bit_indexing" in ext,
        cooperative_matrix="VK_KHR_cooperative_matrix" in ext,
        cooperative_matrix2="VK_NV_cooperative_matrix2" in ext,
    )
