"""What the TensorRT build records (artifact facts of backend `tensorrt`): its plan plus the builder's results."""

from __future__ import annotations

from typing import Any

from rlopt.facts import ArtifactFacts, TensorRTPlanFacts


class TensorRTFacts(TensorRTPlanFacts, ArtifactFacts):
    """A TensorRT engine: the plan it was built from and what the builder reported."""

    tensorrt: str | None = None
    major: int | None = None
    typing: str | None = None
    phases: list[Any] | None = None
    build_seconds: float | None = None
    onnx: str | None = None
    prepared: dict[str, Any] | None = None


__all__ = ["TensorRTFacts"]
