"""What the TorchScript build records (artifact facts of backend `torchscript`)."""

from __future__ import annotations

from pydantic import Field

from rlopt.facts import ArtifactFacts


class TorchScriptFacts(ArtifactFacts):
    source: str | None = None
    device: str | None = Field(None, description="cuda: built, verified and run on the GPU (recipe torchscript.device)")
    cuda_graphs: bool | None = Field(None, description="on cuda: one CUDA graph per named shape")
    graph_shapes: dict[str, dict[str, list[int]]] = Field(
        default_factory=dict, description="on cuda: the named shapes (point -> input -> dims) captured as graphs")
    input_dtypes: dict[str, str] = Field(default_factory=dict, description="on cuda: the inputs' dtypes")

    @property
    def on_cuda(self) -> bool:
        return self.device == "cuda"


__all__ = ["TorchScriptFacts"]
