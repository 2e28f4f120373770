"""The HTTP/REST side of `rlopt serve`: a Starlette app on the KServe v2 paths (contract section 12).

Reads are bounded by the repository's body limit (413 past it) before any parsing; an infer request's Future is
awaited on the event loop, so a waiting request holds no thread. Every error is `{"error": "..."}` with its status.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

from rlopt.serve.errors import InferError, invalid, not_found
from rlopt.serve.http_codec import HEADER_LENGTH, decode_request, encode_response, error_body
from rlopt.serve.repository import Repository

JSON = "application/json"


def create_app(repository: Repository, is_ready: Callable[[], bool]) -> Any:
    """The ASGI app; `is_ready` turns False once the server is shutting down."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    def reply(document: Any, status: int = 200) -> Response:
        return Response(json.dumps(document, separators=(",", ":")), status, media_type=JSON)

    def failed(error: InferError) -> Response:
        return Response(error_body(error), error.status, media_type=JSON)

    async def live(request: Request) -> Response:
        return reply({"live": True})

    async def ready(request: Request) -> Response:
        return reply({"ready": is_ready()}, 200 if is_ready() else 503)

    async def server_metadata(request: Request) -> Response:
        return reply(repository.server_metadata())

    async def model_metadata(request: Request) -> Response:
        try:
            network = repository.get(request.path_params["model"])
            network.check_version(request.path_params.get("version", ""))
        except InferError as error:
            return failed(error)
        return reply(network.metadata())

    async def model_ready(request: Request) -> Response:
        try:
            network = repository.get(request.path_params["model"])
            network.check_version(request.path_params.get("version", ""))
        except InferError as error:
            return failed(error)
        return reply({"name": network.name, "ready": is_ready()}, 200 if is_ready() else 503)

    async def infer(request: Request) -> Response:
        try:
            network = repository.get(request.path_params["model"])
            body = await _read_body(request, repository.body_limit)
            encoding = request.headers.get("content-encoding", "identity").lower()
            if encoding != "identity":
                raise InferError(f"Content-Encoding: {encoding} is not supported; fix: send the body uncompressed",
                                 415, "body")
            decoded = decode_request(body, request.headers.get(HEADER_LENGTH), network.name,
                                     request.path_params.get("version", ""))
            outputs = await asyncio.wrap_future(network.submit(decoded))
        except InferError as error:
            return failed(error)
        content, header_length = encode_response(decoded, outputs)
        if header_length is None:
            return Response(content, media_type=JSON)
        return Response(content, media_type="application/octet-stream",
                        headers={"Inference-Header-Content-Length": str(header_length)})

    async def unknown(request: Request) -> Response:
        return failed(not_found("path", f"{request.method} {request.url.path} is not an endpoint of this server"))

    model = "/v2/models/{model:str}"
    versioned = model + "/versions/{version:str}"
    routes = [Route("/v2/health/live", live), Route("/v2/health/ready", ready), Route("/v2", server_metadata)]
    for prefix in (model, versioned):
        routes += [Route(prefix, model_metadata), Route(prefix + "/ready", model_ready),
                   Route(prefix + "/infer", infer, methods=["POST"])]
    app = Starlette(routes=routes)
    app.add_route("/{path:path}", unknown, methods=["GET", "POST", "PUT", "DELETE"])
    return app


async def _read_body(request: Any, limit: int) -> bytes:
    """The body, refused with 413 as soon as it passes `limit` bytes (by Content-Length or by what arrives)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            raise invalid("Content-Length", f"{declared!r} is not a byte count", "body") from None
        if length > limit:
            raise InferError(f"body: {length} bytes is over this server's limit of {limit} bytes (set by the largest "
                             "request the compiled profile allows)", 413, "too_large")
    chunks, received = [], 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise InferError(f"body: over this server's limit of {limit} bytes", 413, "too_large")
        chunks.append(chunk)
    return b"".join(chunks)


__all__ = ["create_app"]
