"""KServe v2 over HTTP: the JSON body and Triton's binary tensor extension, both ways.

A request body is a JSON header, then (binary extension) the raw tensors of the inputs whose
`parameters.binary_data_size` is set, in input order; `Inference-Header-Content-Length` gives the header's length.
A response puts an output in binary when it asks for `binary_data` (or the request for `binary_data_output`), and
then says the header's length in the same header.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from rlopt.serve.errors import InferError, invalid
from rlopt.serve.protocol import (
    InferRequest,
    InputTensor,
    RequestedOutput,
    apply_parameters,
    checked_shape,
    datatype_of,
    dtype_of,
    tensor_from_bytes,
    tensor_from_list,
)

HEADER_LENGTH = "inference-header-content-length"


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid(where, f"expected a JSON object, got {type(value).__name__}", "json")
    return value


def decode_request(body: bytes, header_length: str | None, model: str, version: str) -> InferRequest:
    """The request in `body`; every problem an InferError naming the field."""
    if not body:
        raise invalid("body", "empty; fix: send the inference request as JSON", "body")
    size = len(body)
    if header_length is not None:
        try:
            size = int(header_length)
        except ValueError:
            size = -1
        if not 0 < size <= len(body):
            raise invalid("Inference-Header-Content-Length", f"{header_length!r} is not a length within the body's "
                          f"{len(body)} bytes", "body")
    try:
        document = json.loads(body[:size])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise invalid("body", f"not valid JSON ({exc}); fix: send the request as a JSON object", "json") from None
    header = _object(document, "body")
    request = InferRequest(model=model, version=version)
    if "id" in header:
        if not isinstance(header["id"], str):
            raise invalid("id", f"{header['id']!r} is not a string", "json")
        request.id = header["id"]
    apply_parameters(request, header.get("parameters"))
    inputs = header.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise invalid("inputs", "missing or not a non-empty list of tensors", "json")
    offset = size
    for index, entry in enumerate(inputs):
        tensor, offset = _input(_object(entry, f"inputs[{index}]"), index, body, offset)
        request.inputs.append(tensor)
    if offset != len(body):
        raise invalid("body", f"{len(body) - offset} bytes follow the last binary tensor; fix: make each "
                      "binary_data_size the tensor's byte size", "body")
    outputs = header.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list):
            raise invalid("outputs", "not a list", "json")
        request.outputs = []
        for index, entry in enumerate(outputs):
            entry = _object(entry, f"outputs[{index}]")
            if not isinstance(entry.get("name"), str):
                raise invalid(f"outputs[{index}].name", "missing or not a string", "json")
            parameters = _object(entry.get("parameters") or {}, f"outputs[{index}].parameters")
            binary = parameters.get("binary_data")
            if binary is not None and not isinstance(binary, bool):
                raise invalid(f"outputs[{index}].parameters.binary_data", f"{binary!r} is not true or false", "json")
            request.outputs.append(RequestedOutput(entry["name"], binary))
    return request


def _input(entry: dict[str, Any], index: int, body: bytes, offset: int) -> tuple[InputTensor, int]:
    where = f"inputs[{index}]"
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise invalid(f"{where}.name", "missing or not a string", "json")
    dtype = dtype_of(entry.get("datatype"), f"{where}.datatype")
    shape = checked_shape(entry.get("shape"), f"{where}.shape")
    parameters = _object(entry.get("parameters") or {}, f"{where}.parameters")
    binary_size = parameters.get("binary_data_size")
    if binary_size is not None:
        if isinstance(binary_size, bool) or not isinstance(binary_size, int) or binary_size < 0:
            raise invalid(f"{where}.parameters.binary_data_size", f"{binary_size!r} is not a byte count", "json")
        if offset + binary_size > len(body):
            raise invalid(f"{where}.parameters.binary_data_size", f"{binary_size} bytes, but only "
                          f"{len(body) - offset} follow; fix: send every tensor's bytes", "data")
        array = tensor_from_bytes(memoryview(body)[offset:offset + binary_size], dtype, shape, f"{where}.data")
        return InputTensor(name, entry["datatype"], shape, array), offset + binary_size
    if "data" not in entry:
        raise invalid(f"{where}.data", "missing (and no parameters.binary_data_size)", "data")
    return InputTensor(name, entry["datatype"], shape, tensor_from_list(entry["data"], dtype, shape,
                                                                          f"{where}.data")), offset


def encode_response(request: InferRequest, outputs: list[tuple[str, np.ndarray]]) -> tuple[bytes, int | None]:
    """The response body and, when it carries binary tensors, its JSON header's length."""
    binary_of = {o.name: o.binary for o in request.outputs or []}
    described, tails = [], []
    for name, array in outputs:
        entry: dict[str, Any] = {"name": name, "datatype": datatype_of(array.dtype), "shape": list(array.shape)}
        binary = binary_of.get(name)
        if binary if binary is not None else request.binary_output:
            data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            entry["parameters"] = {"binary_data_size": len(data)}
            tails.append(data)
        else:
            entry["data"] = array.ravel().tolist()
        described.append(entry)
    document: dict[str, Any] = {"model_name": request.model, "model_version": "1", "outputs": described}
    if request.id:
        document["id"] = request.id
    header = json.dumps(document, separators=(",", ":")).encode()
    if not tails:
        return header, None
    return b"".join([header, *tails]), len(header)


def error_body(error: InferError) -> bytes:
    return json.dumps({"error": str(error)}).encode()


__all__ = ["HEADER_LENGTH", "decode_request", "encode_response", "error_body"]
