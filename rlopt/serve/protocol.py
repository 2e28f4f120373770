"""The KServe v2 inference protocol's request, as both transports decode it, and its datatypes and parameters.

`InferRequest` is what the HTTP codec (JSON and the binary tensor extension) and the gRPC codec make of a request;
`ServedNetwork.infer` checks it against the network. Parameters are Triton's: `priority` (higher first), `timeout`
(microseconds), `sequence_id` / `sequence_start` / `sequence_end`, and HTTP's `binary_data_output`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable

import numpy as np

from rlopt.serve.errors import invalid

DATATYPES = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
             "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
             "FP32": np.float32, "FP64": np.float64}
NAMES = {np.dtype(dtype): name for name, dtype in DATATYPES.items()}


def datatype_of(dtype: Any) -> str:
    """The protocol's name for a numpy dtype (`FP32` for float32)."""
    return NAMES[np.dtype(dtype)]


def dtype_of(datatype: Any, where: str) -> np.dtype:
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise invalid(where, f"datatype {datatype!r} is not one this server takes; fix: use one of "
                      f"{', '.join(DATATYPES)}", "datatype")
    return np.dtype(DATATYPES[datatype])


def checked_shape(shape: Any, where: str) -> list[int]:
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                      for d in shape):
        raise invalid(where, f"{shape!r} is not a list of dims >= 0; fix: e.g. [1, 8, 768]", "shape")
    return [int(d) for d in shape]


def tensor_from_bytes(data: bytes | memoryview, dtype: np.dtype, shape: list[int], where: str) -> np.ndarray:
    """A tensor from its raw little-endian bytes; the size must be exactly the shape's."""
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise invalid(where, f"{len(data)} bytes, but shape {shape} of {datatype_of(dtype)} needs {expected}; fix: "
                      "send exactly the tensor's bytes", "data")
    return np.frombuffer(data, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)  # a writable copy


def tensor_from_list(data: Any, dtype: np.dtype, shape: list[int], where: str) -> np.ndarray:
    """A tensor from JSON data (flat, row-major, or nested); the element count must be exactly the shape's."""
    if not isinstance(data, list):
        raise invalid(where, f"expected a list of values, got {type(data).__name__}", "data")
    try:
        array = np.array(data)
    except (TypeError, ValueError, OverflowError) as exc:
        raise invalid(where, f"not a list of {datatype_of(dtype)} values ({exc})", "data") from None
    kinds = {"b": "b", "i": "biu", "u": "biu", "f": "biuf"}[dtype.kind]
    if array.size and array.dtype.kind not in kinds:
        raise invalid(where, f"values are not all {datatype_of(dtype)} (found {array.dtype.kind!r}-kind values)",
                      "data")
    if array.size and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:
            raise invalid(where, f"values outside {datatype_of(dtype)}'s range [{info.min}, {info.max}]", "data")
    expected = int(np.prod(shape, dtype=np.int64))
    if array.size != expected:
        raise invalid(where, f"{array.size} values, but shape {shape} holds {expected}; fix: send every value of "
                      "the tensor, row-major", "data")
    return np.ascontiguousarray(array.astype(dtype, copy=False).reshape(shape))


@dataclass
class InputTensor:
    name: str
    datatype: str
    shape: list[int]
    array: np.ndarray


@dataclass
class RequestedOutput:
    name: str
    binary: bool | None = None  # HTTP only: None takes the request's binary_data_output


@dataclass
class InferRequest:
    model: str
    version: str = ""
    id: str = ""
    inputs: list[InputTensor] = field(default_factory=list)
    outputs: list[RequestedOutput] | None = None  # None: every output
    priority: int = 0
    timeout_us: int | None = None
    sequence_id: Hashable | None = None
    sequence_start: bool = False
    sequence_end: bool = False
    binary_output: bool = False


def _integer(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid(where, f"{value!r} is not an integer >= 0", "parameters")
    return int(value)


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise invalid(where, f"{value!r} is not true or false", "parameters")
    return value


def apply_parameters(request: InferRequest, parameters: Any) -> None:
    """Triton's request parameters onto `request`; others are ignored, as Triton ignores unknown ones."""
    if parameters is None:
        return
    if not isinstance(parameters, dict):
        raise invalid("parameters", f"expected an object, got {type(parameters).__name__}", "parameters")
    if "priority" in parameters:
        request.priority = _integer(parameters["priority"], "parameters.priority")
    if "timeout" in parameters:
        request.timeout_us = _integer(parameters["timeout"], "parameters.timeout")
    if "binary_data_output" in parameters:
        request.binary_output = _flag(parameters["binary_data_output"], "parameters.binary_data_output")
    sequence = parameters.get("sequence_id")
    if sequence is not None:
        if isinstance(sequence, bool) or not isinstance(sequence, (int, str)):
            raise invalid("parameters.sequence_id", f"{sequence!r} is neither an integer nor a string", "parameters")
        request.sequence_id = sequence if sequence not in (0, "") else None
    for name in ("sequence_start", "sequence_end"):
        if name in parameters:
            setattr(request, name, _flag(parameters[name], f"parameters.{name}"))


__all__ = ["DATATYPES", "InferRequest", "InputTensor", "RequestedOutput", "apply_parameters", "checked_shape",
           "datatype_of", "dtype_of", "tensor_from_bytes", "tensor_from_list"]
