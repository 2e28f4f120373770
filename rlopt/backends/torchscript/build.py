"""The TorchScript artifact is the script stage's own output: nothing more to build."""

from __future__ import annotations

from pathlib import Path

from rlopt.stages.base import StageOutput


def build_torchscript(scripted: Path) -> StageOutput:
    return StageOutput(scripted, {"source": "torch.jit.script"})
