"""The gRPC side of `rlopt serve`: KServe v2's GRPCInferenceService, with the message and service stubs that ship
inside tritonclient (`tritonclient.grpc.service_pb2`, `service_pb2_grpc`), so tritonclient.grpc works unchanged.

Health, readiness, server and model metadata, and ModelInfer are served; every other method (model loading
among them: no client names a directory) answers UNIMPLEMENTED, as the generated base class does. A refused
request aborts with the status matching its HTTP code (`InferError.grpc_code`).
"""

from __future__ import annotations

from typing import Any, Callable

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
from rlopt.serve.repository import Repository

CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
            "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents"}


def _parameters(parameters: Any) -> dict[str, Any]:
    """A protobuf map of InferParameter as plain values (each holds one of its oneof fields)."""
    plain = {}
    for key, parameter in parameters.items():
        which = parameter.WhichOneof("parameter_choice")
        plain[key] = getattr(parameter, which) if which else None
    return plain


def decode_request(message: Any) -> InferRequest:
    """A ModelInferRequest as the protocol's request; raw_input_contents pair with inputs in order."""
    request = InferRequest(model=message.model_name, version=message.model_version, id=message.id)
    apply_parameters(request, _parameters(message.parameters))
    raw = list(message.raw_input_contents)
    if raw and len(raw) != len(message.inputs):
        raise invalid("raw_input_contents", f"{len(raw)} raw tensors for {len(message.inputs)} inputs; fix: send one "
                      "per input, or none", "data")
    if not message.inputs:
        raise invalid("inputs", "no input tensors", "input")
    for index, tensor in enumerate(message.inputs):
        where = f"inputs[{index}]"
        if not tensor.name:
            raise invalid(f"{where}.name", "missing", "input")
        dtype = dtype_of(tensor.datatype, f"{where}.datatype")
        shape = checked_shape(list(tensor.shape), f"{where}.shape")
        if raw:
            array = tensor_from_bytes(raw[index], dtype, shape, f"raw_input_contents[{index}]")
        else:
            field = CONTENTS.get(tensor.datatype)
            values = list(getattr(tensor.contents, field)) if field else []
            array = tensor_from_list(values, dtype, shape, f"{where}.contents")
        request.inputs.append(InputTensor(tensor.name, tensor.datatype, shape, array))
    if message.outputs:
        request.outputs = [RequestedOutput(output.name) for output in message.outputs]
    return request


def servicer(repository: Repository, is_ready: Callable[[], bool]) -> Any:
    """The GRPCInferenceService implementation over `repository`."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    def abort(context: Any, error: InferError) -> None:
        context.abort(getattr(grpc.StatusCode, error.grpc_code), str(error))

    def refuse_repository(context: Any) -> None:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "this server loads no model a client names: it serves the "
                      "MODEL_DIR given to 'rlopt serve'")

    class Service(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
        def ServerLive(self, request: Any, context: Any) -> Any:
            return pb.ServerLiveResponse(live=True)

        def ServerReady(self, request: Any, context: Any) -> Any:
            return pb.ServerReadyResponse(ready=is_ready())

        def ServerMetadata(self, request: Any, context: Any) -> Any:
            return pb.ServerMetadataResponse(**repository.server_metadata())

        def ModelReady(self, request: Any, context: Any) -> Any:
            try:
                repository.get(request.name).check_version(request.version)
            except InferError:
                return pb.ModelReadyResponse(ready=False)
            return pb.ModelReadyResponse(ready=is_ready())

        def ModelMetadata(self, request: Any, context: Any) -> Any:
            try:
                network = repository.get(request.name)
                network.check_version(request.version)
            except InferError as error:
                abort(context, error)
            meta = network.metadata()
            tensors = {side: [pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta[side]]
                       for side in ("inputs", "outputs")}
            return pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"],
                                            **tensors)

        def RepositoryIndex(self, request: Any, context: Any) -> Any:
            refuse_repository(context)

        def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
            refuse_repository(context)

        def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
            refuse_repository(context)

        def ModelInfer(self, request: Any, context: Any) -> Any:
            try:
                network = repository.get(request.model_name)
                decoded = decode_request(request)
                outputs = network.submit(decoded).result()
            except InferError as error:
                abort(context, error)
            response = pb.ModelInferResponse(model_name=network.name, model_version="1", id=decoded.id)
            for name, array in outputs:
                response.outputs.add(name=name, datatype=datatype_of(array.dtype), shape=list(array.shape))
                response.raw_output_contents.append(
                    np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
            return response

    return Service()


def start_grpc(repository: Repository, is_ready: Callable[[], bool], host: str, port: int, workers: int
               ) -> tuple[Any, int]:
    """A started grpc.server on host:port (0: any free port) and the port it bound."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    limit = repository.body_limit
    server = grpc.server(ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlopt-grpc"),
                         options=[("grpc.max_receive_message_length", limit),
                                  ("grpc.max_send_message_length", limit)])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer(repository, is_ready), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind gRPC to {host}:{port}")
    server.start()
    return server, bound


__all__ = ["decode_request", "servicer", "start_grpc"]
