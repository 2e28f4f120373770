"""The recipe's `torchscript` section (contract section 11): where the torchscript backend builds, verifies and runs."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator


class TorchScriptConfig(BaseModel):
    """cpu (default) or cuda; on cuda, CUDA graphs unless `cuda_graphs: false`."""

    model_config = ConfigDict(extra="forbid")

    device: Literal["cpu", "cuda"] = "cpu"
    # on cuda: one CUDA graph per named shape, replayed for exact shapes (None: true on cuda)
    cuda_graphs: bool | None = None

    @model_validator(mode="after")
    def _graphs_need_cuda(self) -> TorchScriptConfig:
        if self.cuda_graphs and self.device != "cuda":
            raise ValueError("cuda_graphs needs device: cuda; fix: set device: cuda or drop cuda_graphs")
        return self

    @property
    def graphs(self) -> bool:
        return self.device == "cuda" and self.cuda_graphs is not False
