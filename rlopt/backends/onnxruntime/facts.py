"""What the ONNX Runtime build records (artifact facts of backend `onnxruntime`) and its runner reads back."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rlopt.facts import ArtifactFacts
from rlopt.onnx_session import CPU_PROVIDER

CUDA_PROVIDER = "CUDAExecutionProvider"
SECOND_SESSION_MAX_BYTES = 256 << 20  # a larger graph is not held twice in memory (shape_threads)


class OnnxRuntimeFacts(ArtifactFacts):
    """An ONNX Runtime artifact: which providers the build proved, and how the session is configured."""

    providers: list[str] = Field(default_factory=list, description="exactly the providers the session opens with")
    intra_op_threads: int | None = Field(None, description="intra-op threads (ONNX Runtime's default when absent)")
    allow_spinning: bool | None = Field(
        None, description="False: the pool does not spin between calls (a mixed `auto` route, as compile measured it)")
    shape_threads: dict[str, int] = Field(
        default_factory=dict, description="`auto`: intra-op threads per shape label where they differ from "
                                          "intra_op_threads (0: ONNX Runtime's default pool), each a session of its "
                                          "own (set by `auto`'s route, RoutePlan.options)")
    graph_optimization: str | None = None
    onnxruntime: str | None = Field(None, description="the ONNX Runtime version that proved the session")
    int8: dict[str, Any] | None = Field(None, description="dynamic quantization's report, when int8 was asked for")
    tf32: bool | None = Field(None, description="the CUDA provider's use_tf32 (onnxruntime.tf32; absent: its default)")

    @property
    def session_providers(self) -> list[str]:
        return list(self.providers or [CPU_PROVIDER])

    def route_detail(self, label: str) -> str:
        """Its intra-op threads at `label` ('1 thread', 'N threads', 'pool') and whether the pool spins."""
        threads = self.shape_threads.get(label, self.intra_op_threads or 0)
        text = "1 thread" if threads == 1 else f"{threads} threads" if threads else "pool"
        return text + (", not spinning" if self.allow_spinning is False else "")

    @property
    def provider_options(self) -> dict[str, dict[str, str]]:
        """Per provider, the options the session opens it with: the CUDA provider's use_tf32 as the build chose."""
        if self.tf32 is None or CUDA_PROVIDER not in self.session_providers:
            return {}
        return {CUDA_PROVIDER: {"use_tf32": "1" if self.tf32 else "0"}}


__all__ = ["CPU_PROVIDER", "CUDA_PROVIDER", "SECOND_SESSION_MAX_BYTES", "OnnxRuntimeFacts"]
