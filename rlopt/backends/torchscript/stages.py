"""TorchScript's compile stage: the scripted module is the artifact."""

from __future__ import annotations

from typing import Any

from rlopt.backends.torchscript.facts import TorchScriptFacts
from rlopt.stages.base import Context, Stage, StageOutput


class TorchScriptArtifact(Stage):
    name, inputs, outputs, facts_model = "torchscript", ("model.ts",), ("torchscript",), TorchScriptFacts

    def run(self, ctx: Context) -> StageOutput:
        return StageOutput(ctx.artifacts["model.ts"], TorchScriptFacts(source="torch.jit.script"))

    def artifact_identity(self, ctx: Context, out: StageOutput) -> Any:
        """torch.jit.save writes other bytes for the same module: the scripted graph and weights identify it."""
        return ctx.keys["module"]
