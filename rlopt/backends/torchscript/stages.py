"""TorchScript's compile stage: the scripted module is the artifact."""

from __future__ import annotations

from rlopt.stages.base import Context, Stage, StageOutput


class TorchScriptArtifact(Stage):
    name, inputs, outputs = "torchscript", ("model.ts",), ("torchscript",)

    def run(self, ctx: Context) -> StageOutput:
        return StageOutput(ctx.artifacts["model.ts"], {"source": "torch.jit.script"})
