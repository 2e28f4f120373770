"""`InferError`: a request the server refuses, with its HTTP status, gRPC status and metrics reason."""

from __future__ import annotations

GRPC_CODES = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 408: "DEADLINE_EXCEEDED", 413: "RESOURCE_EXHAUSTED",
              415: "INVALID_ARGUMENT", 503: "UNAVAILABLE", 500: "INTERNAL"}


class InferError(Exception):
    """The message names the field at fault (`inputs[0].shape: ...`); the server keeps serving."""

    def __init__(self, message: str, status: int = 400, reason: str = "invalid") -> None:
        super().__init__(message)
        self.status, self.reason = status, reason

    @property
    def grpc_code(self) -> str:
        """The name of the matching `grpc.StatusCode`."""
        return GRPC_CODES.get(self.status, "INVALID_ARGUMENT")


def invalid(field: str, problem: str, reason: str = "invalid") -> InferError:
    return InferError(f"{field}: {problem}", 400, reason)


def not_found(field: str, problem: str) -> InferError:
    return InferError(f"{field}: {problem}", 404, "not_found")


__all__ = ["GRPC_CODES", "InferError", "invalid", "not_found"]
