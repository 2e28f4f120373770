"""TorchScript's compile stage: the scripted module is the artifact; on CUDA (recipe `torchscript.device`), gated on a
GPU and a CUDA build of torch first, with the named shapes its runner captures as CUDA graphs."""

from __future__ import annotations

from typing import Any

from rlopt.backends.torchscript.facts import TorchScriptFacts
from rlopt.stages.base import Context, Stage, StageOutput

NOT_APPLIED = "precision int8 not applied: TorchScript on CUDA runs int8 networks in fp32"


class TorchScriptArtifact(Stage):
    name, inputs, outputs, facts_model = "torchscript", ("model.ts",), ("torchscript",), TorchScriptFacts
    helpers = ("rlopt.backends.torchscript.cuda.gate",)

    def config(self, ctx: Context) -> Any:
        return ctx.recipe.torchscript.model_dump(mode="json")

    def run(self, ctx: Context) -> StageOutput:
        config = ctx.recipe.torchscript
        facts = TorchScriptFacts(source="torch.jit.script")
        if config.device == "cuda":
            facts = facts.updated(**cuda_facts(ctx, config.graphs))
        return StageOutput(ctx.artifacts["model.ts"], facts)

    def artifact_identity(self, ctx: Context, out: StageOutput) -> Any:
        """torch.jit.save writes other bytes for the same module: the scripted graph and weights identify it."""
        return ctx.keys["module"]


def cuda_facts(ctx: Context, graphs: bool) -> dict[str, Any]:
    """What the CUDA runner needs and the manifest shows; BackendUnavailable (a skip) without a GPU and CUDA torch."""
    from rlopt.backends.torchscript.cuda import gate
    from rlopt.errors import BackendUnavailable
    from rlopt.machine import gpu_identity

    reason = gate.unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(reason)
    precision = ctx.spec.precision if ctx.spec.precision in ("fp16", "bf16") else "fp32"
    facts: dict[str, Any] = {"device": "cuda", "cuda_graphs": graphs, "precision_built": precision,
                             "input_dtypes": {name: spec.dtype for name, spec in ctx.spec.inputs.items()},
                             "graph_shapes": ctx.spec.points() if graphs else {}, "gpu": gpu_identity()}
    if ctx.spec.precision == "int8":
        facts["notice"] = NOT_APPLIED
    return facts
