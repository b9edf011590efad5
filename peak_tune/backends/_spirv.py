"""What a compute shader's SPIR-V says about its resources, read from the module itself.

The HLSL backend prunes a point before it is dispatched when its thread group or its
groupshared memory passes the device's limits; both are in the SPIR-V: the entry's
LocalSize execution mode (or LocalSizeId, pointing at constants) and the Workgroup
storage-class variables, whose sizes follow from their types. The capabilities the
module declares (Float16, GroupNonUniform*, CooperativeMatrixKHR, ...) say which device
features it needs; its push-constant block and constant buffers, how it takes the sizes
(glslang puts a global struct that is not a ConstantBuffer<T> in a constant buffer at
binding 0, over the first storage buffer). Only what these need is decoded.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["SpirvError", "SpirvResources", "read_resources"]

_MAGIC = 0x07230203
# opcodes
_OP_CAPABILITY = 17
_OP_EXECUTION_MODE = 16
_OP_EXECUTION_MODE_ID = 331
_OP_TYPE_BOOL = 20
_OP_TYPE_INT = 21
_OP_TYPE_FLOAT = 22
_OP_TYPE_VECTOR = 23
_OP_TYPE_MATRIX = 24
_OP_TYPE_ARRAY = 28
_OP_TYPE_STRUCT = 30
_OP_TYPE_POINTER = 32
_OP_CONSTANT = 43
_OP_SPEC_CONSTANT = 50
_OP_VARIABLE = 59
_OP_DECORATE = 71
_OP_TYPE_COOPERATIVE_MATRIX = 4456  # OpTypeCooperativeMatrixKHR
# operands
_MODE_LOCAL_SIZE = 17
_MODE_LOCAL_SIZE_ID = 38
_STORAGE_UNIFORM = 2
_STORAGE_WORKGROUP = 4
_STORAGE_PUSH_CONSTANT = 9
_SCOPE_WORKGROUP = 2  # a cooperative matrix of the whole thread group (NV's coopmat2)
_DECORATION_BLOCK = 2  # a uniform (constant) buffer's struct; BufferBlock (3): storage
_CAPABILITIES = {9: "Float16", 22: "Int16", 39: "Int8", 61: "GroupNonUniform",
                 62: "GroupNonUniformVote", 63: "GroupNonUniformArithmetic",
                 64: "GroupNonUniformBallot", 65: "GroupNonUniformShuffle",
                 66: "GroupNonUniformShuffleRelative", 68: "GroupNonUniformQuad",
                 4433: "StorageBuffer16BitAccess", 4434: "UniformAndStorageBuffer16BitAccess",
                 5345: "VulkanMemoryModel", 6022: "CooperativeMatrixKHR",
                 5433: "CooperativeMatrixTensorAddressingNV", 5439: "TensorAddressingNV"}


class SpirvError(ValueError):
    """Not a SPIR-V module, or one whose sizes this reader cannot follow."""


@dataclass(frozen=True)
class SpirvResources:
    local_size: tuple[int, int, int]  # threads per group, x y z
    shared_bytes: int  # groupshared (Workgroup) variables, summed
    capabilities: tuple[str, ...]  # the named ones the module declares
    push_constant_bytes: int = 0  # the push-constant block's size
    uniform_buffers: int = 0  # constant buffers (cbuffer, a global struct) it reads
    # cooperative matrices of workgroup scope: a device needs VK_NV_cooperative_matrix2's
    # cooperativeMatrixWorkgroupScope (no SPIR-V capability says so)
    workgroup_matrices: bool = False

    @property
    def threads(self) -> int:
        x, y, z = self.local_size
        return x * y * z


def read_resources(module: bytes) -> SpirvResources:
    words = _words(module)
    types: dict[int, tuple[int, list[int]]] = {}  # id -> (opcode, operands)
    constants: dict[int, int] = {}
    pointers: dict[int, tuple[int, int]] = {}  # pointer type id -> (storage class, pointee)
    shared: list[int] = []  # pointee types of Workgroup variables
    pushed: list[int] = []  # ... of PushConstant variables
    uniform: list[int] = []  # ... of Uniform variables
    blocks: set[int] = set()  # struct types decorated Block
    local: tuple[int, int, int] | None = None
    local_ids: list[int] = []
    capabilities: list[str] = []
    matrix_scopes: list[int] = []  # the scope operands (ids) of cooperative-matrix types
    for opcode, operands in _instructions(words):
        if opcode == _OP_CAPABILITY and operands:
            name = _CAPABILITIES.get(operands[0])
            if name:
                capabilities.append(name)
        elif opcode == _OP_EXECUTION_MODE and len(operands) >= 5 and \
                operands[1] == _MODE_LOCAL_SIZE:
            local = (operands[2], operands[3], operands[4])
        elif opcode == _OP_EXECUTION_MODE_ID and len(operands) >= 5 and \
                operands[1] == _MODE_LOCAL_SIZE_ID:
            local_ids = operands[2:5]
        elif opcode in (_OP_TYPE_BOOL, _OP_TYPE_INT, _OP_TYPE_FLOAT, _OP_TYPE_VECTOR,
                        _OP_TYPE_MATRIX, _OP_TYPE_ARRAY, _OP_TYPE_STRUCT):
            types[operands[0]] = (opcode, operands[1:])
        elif opcode == _OP_TYPE_COOPERATIVE_MATRIX and len(operands) >= 3:
            matrix_scopes.append(operands[2])
        elif opcode == _OP_TYPE_POINTER and len(operands) >= 3:
            pointers[operands[0]] = (operands[1], operands[2])
        elif opcode in (_OP_CONSTANT, _OP_SPEC_CONSTANT) and len(operands) >= 3:
            constants[operands[1]] = operands[2]  # the low word: sizes fit in 32 bits
        elif opcode == _OP_DECORATE and len(operands) >= 2 and \
                operands[1] == _DECORATION_BLOCK:
            blocks.add(operands[0])
        elif opcode == _OP_VARIABLE and len(operands) >= 3 and operands[2] in (
                _STORAGE_WORKGROUP, _STORAGE_PUSH_CONSTANT, _STORAGE_UNIFORM):
            storage, pointee = pointers.get(operands[0], (-1, -1))
            if storage != operands[2]:
                raise SpirvError(f"variable %{operands[1]} of unknown type")
            {_STORAGE_WORKGROUP: shared, _STORAGE_PUSH_CONSTANT: pushed,
             _STORAGE_UNIFORM: uniform}[storage].append(pointee)
    if local is None and local_ids:
        try:
            local = (constants[local_ids[0]], constants[local_ids[1]],
                     constants[local_ids[2]])
        except KeyError:
            raise SpirvError("LocalSizeId names a value that is no constant") from None
    if local is None:
        raise SpirvError("no LocalSize execution mode: not a compute shader")
    size = sum(_type_bytes(t, types, constants) for t in shared)
    push = sum(_type_bytes(t, types, constants) for t in pushed)
    return SpirvResources(local, size, tuple(dict.fromkeys(capabilities)), push,
                          sum(1 for t in uniform if t in blocks),
                          any(constants.get(s) == _SCOPE_WORKGROUP for s in matrix_scopes))


def _words(module: bytes) -> tuple[int, ...]:
    if len(module) < 20 or len(module) % 4:
        raise SpirvError(f"{len(module)} bytes is no SPIR-V module")
    order = "<" if struct.unpack_from("<I", module)[0] == _MAGIC else ">"
    words = struct.unpack(f"{order}{len(module) // 4}I", module)
    if words[0] != _MAGIC:
        raise SpirvError("no SPIR-V magic number")
    return words


def _instructions(words: tuple[int, ...]) -> list[tuple[int, list[int]]]:
    found = []
    at = 5  # after the header
    while at < len(words):
        count, opcode = words[at] >> 16, words[at] & 0xFFFF
        if count == 0 or at + count > len(words):
            raise SpirvError(f"a malformed instruction at word {at}")
        found.append((opcode, list(words[at + 1:at + count])))
        at += count
    return found


def _type_bytes(type_id: int, types: dict[int, tuple[int, list[int]]],
                constants: dict[int, int]) -> int:
    """Bytes of a type as laid out in groupshared memory (arrays of scalars, vectors,
    matrices and structs, tightly: what the device allots is at least this)."""
    if type_id not in types:
        raise SpirvError(f"type %{type_id} is not one a groupshared size can follow")
    opcode, operands = types[type_id]
    if opcode == _OP_TYPE_BOOL:
        return 4
    if opcode in (_OP_TYPE_INT, _OP_TYPE_FLOAT):
        return operands[0] // 8
    if opcode in (_OP_TYPE_VECTOR, _OP_TYPE_MATRIX):
        return operands[1] * _type_bytes(operands[0], types, constants)
    if opcode == _OP_TYPE_ARRAY:
        if operands[1] not in constants:
            raise SpirvError(f"array %{type_id} has a length that is no constant")
        return constants[operands[1]] * _type_bytes(operands[0], types, constants)
    return sum(_type_bytes(member, types, constants) for member in operands)  # struct
